"""The library and the Colab notebooks are generated from the chapters: check that they agree."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_export(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "export.py"), *args],
        capture_output=True,
        text=True,
        cwd=root,
    )


def test_generated_files_match_the_chapters():
    result = run_export(ROOT, "--check")
    assert result.returncode == 0, (
        "transformer_lib, book/api.md or a paired notebook differs from what the chapters generate; "
        "run `python tools/export.py`.\n" + result.stderr
    )


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the parts of the repository the exporter reads and writes."""
    for name in ["book", "tools", "transformer_lib"]:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ["_config.yml", "pyproject.toml"]:
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def first_chapter_with_exports(root: Path) -> Path:
    for path in sorted((root / "book").glob("[0-9][0-9]_*.md")):
        if "#| export" in path.read_text(encoding="utf-8"):
            return path
    raise AssertionError("no chapter has an export cell")


def test_editing_an_exported_cell_fails_the_check_until_regenerated(repo_copy: Path):
    chapter = first_chapter_with_exports(repo_copy)
    text = chapter.read_text(encoding="utf-8")
    edited = text.replace("#| export\n", "#| export\nEDITED_IN_TEST = 1\n", 1)
    chapter.write_text(edited, encoding="utf-8")

    stale = run_export(repo_copy, "--check")
    assert stale.returncode == 1
    module = re.search(r"#\|\s*default_exp\s+(\w+)", text).group(1)
    assert f"transformer_lib/{module}.py" in stale.stderr
    assert chapter.with_suffix(".ipynb").name in stale.stderr

    assert run_export(repo_copy).returncode == 0
    assert run_export(repo_copy, "--check").returncode == 0
    generated = (repo_copy / "transformer_lib" / f"{module}.py").read_text(encoding="utf-8")
    assert "EDITED_IN_TEST = 1" in generated
    assert '"EDITED_IN_TEST"' in generated  # in the module's __all__
    # not re-exported at the top level: that needs an `#| api` line
    assert "EDITED_IN_TEST" not in (repo_copy / "transformer_lib" / "__init__.py").read_text()


def test_regenerating_is_byte_stable(repo_copy: Path):
    notebooks = sorted((repo_copy / "book").glob("[0-9][0-9]_*.ipynb"))
    assert notebooks, "every chapter has a paired notebook"
    before = {p: p.read_bytes() for p in notebooks}
    assert run_export(repo_copy).returncode == 0
    assert {p: p.read_bytes() for p in notebooks} == before


def test_generated_module_names_its_chapter():
    chapter = first_chapter_with_exports(ROOT)
    module = re.search(r"#\|\s*default_exp\s+(\w+)", chapter.read_text()).group(1)
    head = (ROOT / "transformer_lib" / f"{module}.py").read_text(encoding="utf-8").splitlines()[:2]
    assert f"book/{chapter.name}" in head[0]
    assert "do not edit" in head[0]


def test_fork_url_is_propagated_to_every_install_cell(repo_copy: Path):
    config = repo_copy / "_config.yml"
    text = config.read_text(encoding="utf-8")
    url = re.search(r"^  url: (\S+)$", text, re.MULTILINE).group(1)
    config.write_text(text.replace(url, "https://github.com/someone/fork"), encoding="utf-8")

    assert run_export(repo_copy, "--check").returncode == 1
    assert run_export(repo_copy).returncode == 0
    for chapter in (repo_copy / "book").glob("[0-9][0-9]_*.md"):
        assert "git+https://github.com/someone/fork@main" in chapter.read_text(encoding="utf-8")
    for notebook in (repo_copy / "book").glob("[0-9][0-9]_*.ipynb"):
        assert "git+https://github.com/someone/fork@main" in notebook.read_text(encoding="utf-8")


def test_export_cell_without_a_module_is_an_error(repo_copy: Path):
    chapter = first_chapter_with_exports(repo_copy)
    text = chapter.read_text(encoding="utf-8")
    chapter.write_text(re.sub(r"#\|\s*default_exp\s+\w+\n", "", text), encoding="utf-8")
    result = run_export(repo_copy, "--check")
    assert result.returncode == 2
    assert chapter.name in result.stderr and "default_exp" in result.stderr


def test_a_removed_chapter_leaves_no_stale_module(repo_copy: Path):
    texts = {c: c.read_text() for c in sorted((repo_copy / "book").glob("[0-9][0-9]_*.md"))}

    def own_module(chapter):  # its default module, if no other chapter exports a cell to it
        found = re.search(r"#\|\s*default_exp\s+(\w+)", texts[chapter])  # a chapter may export nothing
        pattern = rf"#\|\s*(default_exp|export)\s+{found.group(1)}\s*$" if found else None
        if found and not any(re.search(pattern, t, re.MULTILINE) for c, t in texts.items() if c != chapter):
            return found.group(1)

    last = [c for c in texts if own_module(c)][-1]
    module = own_module(last)
    last.unlink()
    result = run_export(repo_copy, "--check")
    assert result.returncode == 1
    assert f"transformer_lib/{module}.py" in result.stderr
    assert run_export(repo_copy).returncode == 0
    assert not (repo_copy / "transformer_lib" / f"{module}.py").exists()
    assert not last.with_suffix(".ipynb").exists()


def cli_chapter(root: Path) -> Path:
    for path in sorted((root / "book").glob("[0-9][0-9]_*.md")):
        if re.search(r"#\|\s*default_exp\s+cli\s*$", path.read_text(encoding="utf-8"), re.MULTILINE):
            return path
    raise AssertionError("no chapter exports the module cli")


def test_cli_chapter_generates_dunder_main_and_is_not_reexported():
    chapter = cli_chapter(ROOT)
    main_py = (ROOT / "transformer_lib" / "__main__.py").read_text(encoding="utf-8")
    head = main_py.splitlines()[0]
    assert head.startswith("# AUTOGENERATED by tools/export.py") and f"book/{chapter.name}" in head
    assert "from transformer_lib.cli import main" in main_py and "raise SystemExit(main())" in main_py
    init = (ROOT / "transformer_lib" / "__init__.py").read_text(encoding="utf-8")
    assert "transformer_lib.cli" not in init and '"main"' not in init
    assert "transformer_lib.cli" in (ROOT / "book" / "api.md").read_text(encoding="utf-8")


def test_dunder_main_is_checked_and_removed_with_its_chapter(repo_copy: Path):
    main_py = repo_copy / "transformer_lib" / "__main__.py"
    main_py.write_text(main_py.read_text(encoding="utf-8") + "# edited by hand\n", encoding="utf-8")
    stale = run_export(repo_copy, "--check")
    assert stale.returncode == 1 and "transformer_lib/__main__.py" in stale.stderr
    assert run_export(repo_copy).returncode == 0
    assert "edited by hand" not in main_py.read_text(encoding="utf-8")

    cli_chapter(repo_copy).unlink()
    removed = run_export(repo_copy, "--check")
    assert removed.returncode == 1
    assert "transformer_lib/__main__.py" in removed.stderr and "transformer_lib/cli.py" in removed.stderr
    assert run_export(repo_copy).returncode == 0
    assert not main_py.exists() and not (repo_copy / "transformer_lib" / "cli.py").exists()
    assert run_export(repo_copy, "--check").returncode == 0


def add_cell(chapter: Path, source: str) -> None:
    """Append a code cell to a chapter."""
    text = chapter.read_text(encoding="utf-8").rstrip("\n")
    chapter.write_text(text + "\n\n```{code-cell} ipython3\n" + source + "\n```\n", encoding="utf-8")


def test_a_cell_can_export_to_another_module_which_names_both_chapters(repo_copy: Path):
    chapters = sorted((repo_copy / "book").glob("[0-9][0-9]_*.md"))
    add_cell(chapters[0], "#| export extra_mod\nFIRST_PART = 1")
    add_cell(chapters[1], "#| export extra_mod\nSECOND_PART = 2")
    assert run_export(repo_copy).returncode == 0
    module = (repo_copy / "transformer_lib" / "extra_mod.py").read_text(encoding="utf-8")
    header = module.splitlines()[0]
    assert f"book/{chapters[0].name}" in header and f"book/{chapters[1].name}" in header
    assert module.index("FIRST_PART = 1") < module.index("SECOND_PART = 2")
    assert '"FIRST_PART"' in module and '"SECOND_PART"' in module


def test_imports_of_a_later_chapter_join_the_top_of_the_module(repo_copy: Path):
    chapters = sorted((repo_copy / "book").glob("[0-9][0-9]_*.md"))
    add_cell(chapters[0], "#| export extra_mod\nimport math\n\nFIRST = math.pi")
    add_cell(chapters[1], "#| export extra_mod\nimport math\nimport json\n\nSECOND = json.dumps(1)")
    assert run_export(repo_copy).returncode == 0
    module = (repo_copy / "transformer_lib" / "extra_mod.py").read_text(encoding="utf-8")
    assert module.count("import math") == 1 and module.index("import json") < module.index("FIRST =")
    assert "import json\nimport math\n\nFIRST = math.pi" in module  # merged and sorted, as isort would


def test_merged_imports_are_grouped_sorted_and_wrapped():
    import ast

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from export import import_block
    finally:
        sys.path.remove(str(ROOT / "tools"))
    nodes = ast.parse("from transformer_lib.config import GPTConfig, MAX_STEPS, gpt_param_count\nimport torch\n"
                      "from torch import Tensor\nimport os\nfrom collections.abc import Sequence\nimport os\n").body
    assert import_block(nodes) == (
        "import os\nfrom collections.abc import Sequence\n\nimport torch\nfrom torch import Tensor\n\n"
        "from transformer_lib.config import MAX_STEPS, GPTConfig, gpt_param_count")
    long = import_block(ast.parse("from transformer_lib._checks import " + ", ".join(f"check_{i}" for i in range(20))).body)
    assert long.startswith("from transformer_lib._checks import (\n    check_0,") and long.endswith(",\n)")
    assert all(len(line) <= 120 for line in long.splitlines())


def test_api_line_curates_the_top_level(repo_copy: Path):
    chapter = first_chapter_with_exports(repo_copy)
    add_cell(chapter, "#| export\n#| api Kept\nclass Kept:\n    pass\n\n\nclass Left:\n    pass")
    assert run_export(repo_copy).returncode == 0
    init = (repo_copy / "transformer_lib" / "__init__.py").read_text(encoding="utf-8")
    assert '"Kept"' in init and "Left" not in init

    add_cell(chapter, "#| export\n#| api Missing\nPRESENT = 1")
    result = run_export(repo_copy, "--check")
    assert result.returncode == 2 and "Missing" in result.stderr and chapter.name in result.stderr


def test_top_level_is_curated_and_versioned():
    import transformer_lib

    assert len(transformer_lib.__all__) <= 50
    assert all(hasattr(transformer_lib, n) for n in transformer_lib.__all__)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{transformer_lib.__version__}"' in pyproject
    assert (ROOT / "transformer_lib" / "py.typed").is_file()


def test_no_import_cycles_and_no_function_local_imports():
    """Modules import each other at the top only, never each other's private names, and the graph of those
    imports has no cycle."""
    import ast

    modules = {p.stem: p for p in (ROOT / "transformer_lib").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lib."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "transformer_lib":
                deps.update(a.name for a in node.names if a.name in modules)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lib."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert node.module == f"transformer_lib.{name}" or not private, (
                    f"{path.name} imports the private {private} of {node.module}: give a shared helper a public name")
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local = [n for n in ast.walk(func) if isinstance(n, ast.ImportFrom)
                         and (n.module or "").startswith("transformer_lib")]
                assert not local, f"{path.name}:{func.name} imports transformer_lib inside a function"
        graph[name] = deps - {name}

    def visit(node: str, stack: list[str]) -> None:
        assert node not in stack, "import cycle: " + " -> ".join(stack + [node])
        for dep in graph.get(node, ()):
            visit(dep, stack + [node])

    for name in graph:
        visit(name, [])
