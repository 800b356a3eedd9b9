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
    """The first chapter with a default module and a cell exported to it."""
    for path in sorted((root / "book").glob("[0-9][0-9]_*.md")):
        text = path.read_text(encoding="utf-8")
        if "#| default_exp" in text and "#| export\n" in text:
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
    # the chapters that extend the command line (the appendix's finetune, in cli_finetune) go too
    for path in (repo_copy / "book").glob("[0-9][0-9]_*.md"):
        if re.search(r"^#\|\s*export\s+cli(_\w+)?\s*$", path.read_text(encoding="utf-8"), re.MULTILINE):
            path.unlink()
    removed = run_export(repo_copy, "--check")
    assert removed.returncode == 1
    assert "transformer_lib/__main__.py" in removed.stderr and "transformer_lib/cli.py" in removed.stderr
    assert run_export(repo_copy).returncode == 0
    assert not main_py.exists()
    assert not any((repo_copy / "transformer_lib" / f"{m}.py").exists() for m in ("cli", "cli_common", "cli_finetune"))
    assert run_export(repo_copy, "--check").returncode == 0


def add_cell(chapter: Path, source: str) -> None:
    """Append a code cell to a chapter."""
    text = chapter.read_text(encoding="utf-8").rstrip("\n")
    chapter.write_text(text + "\n\n```{code-cell} ipython3\n" + source + "\n```\n", encoding="utf-8")


def test_a_cell_can_export_to_another_module_which_names_both_chapters(repo_copy: Path):
    chapters = sorted((repo_copy / "book").glob("[0-9][0-9]_*.md"))
    add_cell(chapters[0], '#| export extra_mod\n"""Parts for a test (a module says what it holds)."""\nFIRST_PART = 1')
    add_cell(chapters[1], "#| export extra_mod\nSECOND_PART = 2")
    assert run_export(repo_copy).returncode == 0
    module = (repo_copy / "transformer_lib" / "extra_mod.py").read_text(encoding="utf-8")
    header = module.splitlines()[0]
    assert f"book/{chapters[0].name}" in header and f"book/{chapters[1].name}" in header
    assert module.index("FIRST_PART = 1") < module.index("SECOND_PART = 2")
    assert '"FIRST_PART"' in module and '"SECOND_PART"' in module


def test_imports_of_a_later_chapter_join_the_top_of_the_module(repo_copy: Path):
    chapters = sorted((repo_copy / "book").glob("[0-9][0-9]_*.md"))
    add_cell(chapters[0], '#| export extra_mod\n"""Parts for a test."""\nimport math\n\nFIRST = math.pi')
    add_cell(chapters[1], "#| export extra_mod\nimport math\nimport json\n\nSECOND = json.dumps(1)")
    assert run_export(repo_copy).returncode == 0
    module = (repo_copy / "transformer_lib" / "extra_mod.py").read_text(encoding="utf-8")
    assert module.count("import math") == 1 and module.index("import json") < module.index("FIRST =")
    assert "import json\nimport math\n\nFIRST = math.pi" in module  # merged and sorted, as isort would


def test_merged_imports_are_grouped_sorted_and_wrapped():
    import ast

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from export import import_records, render_imports
    finally:
        sys.path.remove(str(ROOT / "tools"))

    def block(source: str) -> str:
        return render_imports(import_records(ast.parse(source).body, "test"))

    assert block("from transformer_lib.config import GPTConfig, MAX_STEPS, gpt_param_count\nimport torch\n"
                 "from torch import Tensor\nimport os\nfrom collections.abc import Sequence\nimport os\n") == (
        "import os\nfrom collections.abc import Sequence\n\nimport torch\nfrom torch import Tensor\n\n"
        "from transformer_lib.config import MAX_STEPS, GPTConfig, gpt_param_count")
    long = block("from transformer_lib._checks import " + ", ".join(f"check_{i}" for i in range(20)))
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


# ---------------------------------------------------------------- later chapters add to earlier code
# These tests run the exporter in-process on a small book of their own: a few chapters in a temporary
# directory, so that each convention is checked on code written for it.

import importlib.util
import textwrap


@pytest.fixture
def exporter(tmp_path: Path, monkeypatch):
    """tools/export.py, loaded as a module whose repository root is an empty temporary directory."""
    spec = importlib.util.spec_from_file_location("export_under_test", ROOT / "tools" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "book").mkdir()
    (tmp_path / "transformer_lib").mkdir()
    (tmp_path / "_config.yml").write_text("repository:\n  url: https://github.com/x/y\n  branch: main\n")
    (tmp_path / "pyproject.toml").write_text('version = "0.0.1"\n')
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "BOOK", tmp_path / "book")
    monkeypatch.setattr(module, "PACKAGE", tmp_path / "transformer_lib")
    return module


def write_chapter(root: Path, name: str, module: str | None, *cells: str, doc: str = "Things for a test.") -> Path:
    """A chapter `book/<name>.md` with a setup cell and the given code cells."""
    setup = "# pip install git+https://github.com/x/y@main\n"
    if module:
        setup = f"#| default_exp {module}\n#| module_doc {doc}\n" + setup
    parts = ["---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n---\n",
             f"# {name}\n", "```{code-cell} ipython3\n" + setup + "```\n"]
    parts += ["```{code-cell} ipython3\n" + textwrap.dedent(c).strip("\n") + "\n```\n" for c in cells]
    path = root / "book" / f"{name}.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def generated(exporter, module: str) -> str:
    return exporter.planned_outputs()[exporter.PACKAGE / f"{module}.py"]


def export_error(exporter) -> str:
    with pytest.raises(exporter.ExportError) as err:
        exporter.planned_outputs()
    return str(err.value)


def load(source: str) -> dict:
    """Run a generated module (standard-library imports only) and return its namespace."""
    namespace: dict = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace


BASE_CLASS = '''
    #| export
    import dataclasses


    @dataclasses.dataclass(frozen=True)
    class Config:
        """A configuration.

        Args:
            width: how wide (>= 1).
            depth: how deep (>= 1).

        Raises:
            ValueError: if a field is out of range.
        """

        width: int = 4
        depth: int = 2

        def __post_init__(self):
            where = "Config"
            for name in ("width", "depth"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{where}: {name} must be >= 1")

        def area(self) -> int:
            return self.width * self.depth


    class Layer:
        """A layer.

        Args:
            size: its size.
        """

        def __init__(self, size: int, *, scale: float = 1.0):
            where = "Layer"
            self.size = size
            self.scale = scale

        def describe(self) -> str:
            """What the layer is."""
            return f"size={self.size}"


    def make(config: Config) -> Layer:
        """A layer for ``config``."""
        return Layer(config.width)


    PRESETS = {
        "small": dict(width=2),
        "large": dict(width=8),
    }
'''


def test_add_to_class_appends_a_method_to_the_class_of_another_chapter(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        from base import Layer
        from transformer_lib.utils import add_to_class


        # the volume, for a test
        @add_to_class(Layer)
        def volume(self) -> float:
            """The size times the scale."""
            return self.size * self.scale
    ''')
    out = generated(exporter, "base")
    assert "add_to_class" not in out and "from base import" not in out
    assert "\n    # the volume, for a test\n    def volume(self) -> float:\n" in out
    assert out.index("def describe") < out.index("def volume") < out.index("def make")
    assert '"volume"' not in out  # a method, not a name of the module
    assert "book/02_later.md" in out.splitlines()[0]  # the module names the chapter that added to it
    assert load(out)["Layer"](3, scale=2.0).volume() == 6.0


def test_a_patch_moves_its_string_pieces_but_not_the_inside_of_a_multiline_string(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        from base import Layer
        from transformer_lib.utils import add_to_class


        @add_to_class(Layer)
        def message(self) -> str:
            """Two strings."""
            joined = ("a"
                      "b")
            block = """x
        y"""
            return joined + block
    ''')
    out = generated(exporter, "base")
    assert '\n        joined = ("a"\n                  "b")\n' in out  # the second piece moved with the code
    assert '"""x\ny"""' in out  # the inside of the string did not
    assert load(out)["Layer"](3).message() == "abx\ny"


def test_add_to_class_refuses_to_replace_silently_and_replace_true_replaces_in_place(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    later = write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Layer)
        def describe(self) -> str:
            return f"size={self.size}, scale={self.scale}"
    ''')
    message = export_error(exporter)
    assert "02_later.md" in message and "already has `describe`" in message and "replace=True" in message

    later.write_text(later.read_text().replace("@add_to_class(Layer)", "@add_to_class(Layer, replace=True)"))
    out = generated(exporter, "base")
    assert out.count("def describe") == 1 and out.index("def describe") < out.index("def make")
    assert load(out)["Layer"](3).describe() == "size=3, scale=1.0"

    later.write_text(later.read_text().replace("def describe", "def explain"))
    assert "has no method `explain` to replace" in export_error(exporter)


def test_a_replacement_documented_by_sections_only_keeps_the_replaced_docstring(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Layer, replace=True)
        def describe(self, *, verbose: bool = False) -> str:
            """Args:
                verbose: also give the scale.
            """
            return f"size={self.size}" + (f", scale={self.scale}" if verbose else "")
    ''')
    out = generated(exporter, "base")
    assert '"""What the layer is.\n\n        Args:\n            verbose: also give the scale.\n        """' in out
    layer = load(out)["Layer"](3)
    assert layer.describe() == "size=3" and layer.describe(verbose=True) == "size=3, scale=1.0"


def test_extend_adds_a_parameter_its_check_and_its_documentation(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Layer, extend=True)
        def __init__(self, *args, norm: bool = False, **kwargs):
            """Args:
                norm: normalise the output.
            """
            where = "Layer"
            if not isinstance(norm, bool):
                raise TypeError(f"{where}: norm must be a bool")
            self.norm = norm
    ''')
    out = generated(exporter, "base")
    assert "def __init__(self, size: int, *, scale: float = 1.0, norm: bool = False):" in out
    assert out.count('where = "Layer"') == 1  # the repeated set-up line is dropped
    assert "        size: its size.\n        norm: normalise the output.\n" in out  # the class's Args
    Layer = load(out)["Layer"]
    assert Layer(2).norm is False and Layer(2, norm=True).norm is True
    with pytest.raises(TypeError, match="Layer: norm must be a bool"):
        Layer(2, norm=1)


def test_a_method_that_returns_cannot_be_extended(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Layer, extend=True)
        def describe(self, *args, **kwargs):
            print("more")
    ''')
    assert "returns a value" in export_error(exporter)


def test_fields_go_where_after_says_with_their_docs_and_validation(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Config)
        class Config:
            """Args:
                ratio: a ratio in (0, 1].
            """

            #| after width
            ratio: float = 0.5


        @add_to_class(Config)
        class Config:
            """Args:
                name: a label.
            """

            name: str = "x"


        @add_to_class(Config, extend=True)
        def __post_init__(self):
            where = "Config"
            if not 0 < self.ratio <= 1:
                raise ValueError(f"{where}: ratio must be in (0, 1], got {self.ratio}")
    ''')
    out = generated(exporter, "base")
    Config = load(out)["Config"]
    assert [f.name for f in __import__("dataclasses").fields(Config)] == ["width", "ratio", "depth", "name"]
    assert Config().ratio == 0.5
    with pytest.raises(ValueError, match=r"Config: ratio must be in \(0, 1\], got 2"):
        Config(ratio=2)
    with pytest.raises(ValueError, match="Config: width must be >= 1"):  # the earlier checks still run
        Config(width=0)
    doc = Config.__doc__
    assert doc.index("width:") < doc.index("ratio:") < doc.index("depth:") < doc.index("name:") < doc.index("Raises:")
    assert "#| after" not in out


def test_replaces_swaps_a_function_in_place_and_an_unmarked_duplicate_is_an_error(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    later = write_chapter(tmp_path, "02_later", "later", '''
        #| export
        import math

        from base import Config, Layer, make
        from transformer_lib.utils import replaces


        @replaces(make)
        def make(config: Config) -> Layer:
            """A layer for ``config``, scaled by the square root of its depth."""
            return Layer(config.width, scale=math.sqrt(config.depth))
    ''')
    out = generated(exporter, "base")
    assert out.count("def make(") == 1 and out.index("class Layer") < out.index("def make(") < out.index("PRESETS = {")
    assert "\nimport dataclasses\nimport math\n" in out  # the patch's import joined the block, sorted
    assert "replaces" not in out
    ns = load(out)
    assert ns["make"](ns["Config"](depth=4)).scale == 2.0
    assert exporter.PACKAGE / "later.py" not in exporter.planned_outputs()  # nothing else went to `later`

    later.write_text(later.read_text().replace("@replaces(make)\n", "").replace("#| export\n", "#| export base\n"))
    message = export_error(exporter)
    assert "`make` is defined twice" in message and "@replaces(make)" in message


def test_an_item_joins_the_dict_of_an_earlier_chapter(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    later = write_chapter(tmp_path, "02_later", None, '''
        #| export
        from base import PRESETS

        #| after small
        # a medium one
        PRESETS["medium"] = dict(
            width=4,
            depth=3,
        )
    ''')
    out = generated(exporter, "base")
    assert '    "small": dict(width=2),\n    # a medium one\n    "medium": dict(\n        width=4,\n' in out
    assert list(load(out)["PRESETS"]) == ["small", "medium", "large"]

    later.write_text(later.read_text().replace('PRESETS["medium"]', 'PRESETS["large"]'))
    assert "already has the key 'large'" in export_error(exporter)


def test_a_chapters_own_dict_item_stays_code(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS, '''
        #| export
        PRESETS["tiny"] = dict(width=1)
    ''')
    out = generated(exporter, "base")
    assert 'PRESETS["tiny"] = dict(width=1)' in out and list(load(out)["PRESETS"])[-1] == "tiny"


def test_a_patch_needs_exactly_one_module_that_defines_its_target(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", BASE_CLASS)
    write_chapter(tmp_path, "02_later", None, '''
        #| export
        @add_to_class(Missing)
        def f(self):
            pass
    ''')
    assert "`Missing` is defined in no module" in export_error(exporter)


def test_imports_are_one_sorted_block_and_the_module_doc_is_the_docstring(exporter, tmp_path):
    write_chapter(tmp_path, "01_base", "base", '''
        #| export
        import sys
        from transformer_lib.other import Thing, CONSTANT, helper
        import torch
        import os

        X = 1
    ''', '''
        #| export
        import json
        from collections.abc import Mapping
        from transformer_lib.other import another
        import numpy as np

        Y = 2
    ''', doc="The things of the test: X and Y.")
    out = generated(exporter, "base")
    block = out[out.index("]\n\n") + 3 : out.index("X = 1")].strip()
    assert block == (
        "import json\nimport os\nimport sys\nfrom collections.abc import Mapping\n\n"
        "import numpy as np\nimport torch\n\n"
        "from transformer_lib.other import CONSTANT, Thing, another, helper"
    )
    assert out.split("\n")[2] == '"""The things of the test: X and Y.'


def test_a_module_without_a_docstring_is_an_error(exporter, tmp_path):
    path = write_chapter(tmp_path, "01_base", "base", "#| export\nX = 1")
    path.write_text(path.read_text().replace("#| module_doc Things for a test.\n", ""))
    message = export_error(exporter)
    assert "transformer_lib/base.py: no docstring" in message and "#| module_doc" in message


def test_add_to_class_and_replaces_at_run_time():
    """In a notebook the decorators change the class and the module, as the exporter does in the library."""
    import dataclasses
    import types

    from transformer_lib.utils import add_to_class, replaces

    class Layer:
        def __init__(self, size, *, scale=1.0):
            self.size, self.scale = size, scale

    @add_to_class(Layer, extend=True)
    def __init__(self, *args, norm: bool = False, **kwargs):
        self.norm = norm

    @add_to_class(Layer)
    def volume(self):
        return self.size * self.scale

    layer = Layer(3, scale=2.0, norm=True)
    assert (layer.size, layer.scale, layer.norm, layer.volume()) == (3, 2.0, True, 6.0)
    assert Layer(1).norm is False

    module = types.ModuleType("fake_module")
    exec("def make(x):\n    return x\n\ndef twice(x):\n    return 2 * make(x)\n", module.__dict__)
    __import__("sys").modules["fake_module"] = module
    try:
        @replaces(module.make)
        def make(x):
            return x + 1

        assert module.twice(1) == 4  # the module's own code calls the new version
    finally:
        del __import__("sys").modules["fake_module"]

    @dataclasses.dataclass
    class Config:
        width: int = 4

    @add_to_class(Config)
    class Config:  # noqa: F811 - the fields the exporter writes into the dataclass; here they are checked
        width: int = 4

    with pytest.raises(TypeError, match="has no field depth"):
        @add_to_class(Config)
        class Extra:
            depth: int = 2


def test_generated_modules_use_no_undefined_names():
    """A patch cell that forgets an import would leave a name undefined in the module it goes to."""
    pyflakes = pytest.importorskip("pyflakes.api")
    from pyflakes.messages import UndefinedName
    from pyflakes.reporter import Reporter

    class Collect(Reporter):
        def __init__(self):
            self.found = []

        def flake(self, message):
            if isinstance(message, UndefinedName):
                self.found.append(str(message))

        def unexpectedError(self, filename, msg):
            self.found.append(f"{filename}: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.found.append(f"{filename}:{lineno}: {msg}")

    reporter = Collect()
    for path in sorted((ROOT / "transformer_lib").glob("*.py")):
        pyflakes.check(path.read_text(encoding="utf-8"), str(path), reporter)
    assert not reporter.found, reporter.found
