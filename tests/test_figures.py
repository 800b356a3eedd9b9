"""The book's diagrams: drawn from their source, present for the website and the notebooks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "book" / "figures"
BUILD = ROOT / "tools" / "figures" / "build.py"
FIGURE_RE = re.compile(r"^```\{figure\}[ \t]+figures/([\w.-]+)\.svg", re.MULTILINE)


def referenced() -> dict[str, list[str]]:
    """Figure name -> the chapters that show it."""
    found: dict[str, list[str]] = {}
    for chapter in [ROOT / "book" / "intro.md", *sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))]:
        for name in FIGURE_RE.findall(chapter.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(chapter.name)
    return found


def registered() -> list[str]:
    sys.path.insert(0, str(BUILD.parent))
    try:
        import build
        return list(build.figures())
    finally:
        sys.path.remove(str(BUILD.parent))


def test_every_figure_a_chapter_shows_is_drawn_by_the_build_script():
    names = set(registered())
    missing = {n: chs for n, chs in referenced().items() if n not in names}
    assert not missing, f"chapters show figures that tools/figures/build.py does not draw: {missing}"


def test_every_drawn_figure_is_shown_somewhere():
    unused = set(registered()) - set(referenced())
    assert not unused, f"figures drawn but shown in no chapter: {sorted(unused)}"


def test_committed_files_are_the_ones_the_source_draws(tmp_path):
    """Redraw every figure; the committed SVG and PNG must be byte-identical (the source is the truth)."""
    script = (
        "import sys; sys.path.insert(0, %r); import build\n"
        "from pathlib import Path\n"
        "for name, draw in build.figures().items(): build.write(name, draw, Path(%r))\n"
    ) % (str(BUILD.parent), str(tmp_path))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)
    drawn = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in FIGURES.iterdir() if p.suffix in {".svg", ".png"})
    assert drawn == committed, "book/figures/ holds other files than the source draws; run tools/figures/build.py"
    stale = [n for n in drawn if (tmp_path / n).read_bytes() != (FIGURES / n).read_bytes()]
    assert not stale, f"stale figures (run python tools/figures/build.py): {stale}"


@pytest.mark.parametrize("name", sorted(referenced()))
def test_the_notebook_embeds_the_png(name):
    """Colab shows neither relative paths nor attachments: the paired notebook inlines the PNG."""
    import base64
    data = base64.b64encode((FIGURES / f"{name}.png").read_bytes()).decode("ascii")
    for chapter in [c for c in referenced()[name] if c != "intro.md"]:  # the front page has no notebook
        ipynb = (ROOT / "book" / chapter).with_suffix(".ipynb").read_text(encoding="utf-8")
        assert f"data:image/png;base64,{data}" in ipynb, f"{chapter}'s notebook does not embed {name}.png"


def test_two_figures_in_one_markdown_cell_are_both_inlined():
    """The figure pattern stops at each block's end, so a second figure in the same cell is found too."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import export
    finally:
        sys.path.remove(str(ROOT / "tools"))
    names = sorted(referenced())[:2]
    if len(names) < 2:
        pytest.skip("fewer than two figures in the book")
    cell = "\n\n".join(
        f"```{{figure}} figures/{n}.svg\n:name: fig-{n}\n:alt: {n} alt\n\nCaption of {n}.\n```" for n in names
    )
    out = export.FIGURE_RE.sub(lambda m: export.inline_figure(m, "test"), cell)
    assert out.count("data:image/png;base64,") == 2, out[:200]
    for n in names:
        assert f"![{n} alt](data:image/png;base64," in out and f"*Caption of {n}.*" in out


def test_every_chapter_shows_at_least_one_diagram():
    chapters = sorted(p.name for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))
    shown = {ch for chs in referenced().values() for ch in chs}
    missing = [ch for ch in chapters if ch not in shown]
    assert not missing, f"chapters without a diagram: {missing}"
    assert len(referenced()) >= 20, f"the book shows {len(referenced())} diagrams; it promises at least 20"
