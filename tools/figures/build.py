"""Draw the book's diagrams: ``python tools/figures/build.py [NAME ...]``.

``intro.py`` (the front page) and each ``chNN_*.py`` module beside this file define ``FIGURES = {name: draw}``; every figure is
written to ``book/figures/<name>.svg`` (the website) and ``book/figures/<name>.png`` (embedded in
the paired notebooks by ``tools/export.py``, for Colab). Deterministic: the same matplotlib draws
the same bytes, and ``tests/test_figures.py`` checks that the committed files are current.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "book" / "figures"
PNG_DPI = 144

sys.path.insert(0, str(HERE))
import matplotlib.pyplot as plt  # noqa: E402


def figures() -> dict:
    """Every registered figure: name -> draw function, in chapter order."""
    found: dict = {}
    for path in [HERE / "intro.py", *sorted(HERE.glob("ch[0-9][0-9]_*.py"))]:  # the front page's, then each chapter's
        module = importlib.import_module(path.stem)
        for name, draw in module.FIGURES.items():
            if name in found:
                raise SystemExit(f"{path.name}: the figure name {name!r} is used twice")
            found[name] = draw
    return found


def write(name: str, draw, out: Path = OUT) -> list[Path]:
    """Draw one figure and save its SVG and PNG into ``out``; return the two paths."""
    fig = draw()
    out.mkdir(parents=True, exist_ok=True)
    svg, png = out / f"{name}.svg", out / f"{name}.png"
    fig.savefig(svg, format="svg", facecolor="white", metadata={"Date": None, "Creator": None})
    fig.savefig(png, format="png", dpi=PNG_DPI, facecolor="white", metadata={"Software": None})
    plt.close(fig)
    return [svg, png]


def main(argv: list[str]) -> int:
    registry = figures()
    names = argv or list(registry)
    unknown = [n for n in names if n not in registry]
    if unknown:
        print(f"unknown figures: {', '.join(unknown)}; known: {', '.join(registry)}", file=sys.stderr)
        return 2
    for name in names:
        for path in write(name, registry[name]):
            print(path.relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
