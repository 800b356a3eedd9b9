#!/usr/bin/env python
"""Export `transformer_lib` and the Colab notebooks from the book's chapters.

The chapters (`book/NN_name.md`, jupytext MyST notebooks) are the source of truth:

- A chapter names its default module with a line `#| default_exp <module>` in a code cell.
- A code cell whose first line is `#| export` is copied, in order, into
  `transformer_lib/<module>.py`; `#| export <other>` (as in nbdev) sends that one cell
  to `transformer_lib/<other>.py` instead. A module may gather cells from several
  chapters, in reading order; its header names every chapter it comes from.
- Public names (top level, no leading underscore) become the module's `__all__`.
- Each module's docstring says what it holds: a line `#| module_doc <sentence>` in a code cell of
  the chapter (by convention its setup cell, next to `#| default_exp`) describes the chapter's
  default module, and an exported cell that opens with a docstring says what it adds; the
  module's docstring joins these in reading order (at least one is required, and a module's
  first cell does not have both). A list of the chapters the module comes from follows.
- Imports: the imports a cell opens with (after its docstring) are gathered, from every cell of the
  module, into one import block at the top, merged and sorted as isort does (standard library,
  third party, `transformer_lib`; `import x` before `from x import y`; the names of one `from`
  import merged). Imports of the module itself and of names it defines are dropped.
- The top level of the package is curated: a line `#| api` right below the export line
  re-exports every public name of that cell from `transformer_lib/__init__.py`, and
  `#| api A B` only the names listed. Everything else stays importable from its module.
- `__version__` is the version in `pyproject.toml`.
- The chapter that exports `cli` also gets `transformer_lib/__main__.py`, so that
  `python -m transformer_lib` runs `transformer_lib.cli.main`.
- `book/api.md`, the API reference page, gets one `automodule` section per module.
- Each chapter gets a paired `book/NN_name.ipynb` for Colab. Like
  `jupytext --update`, an existing notebook keeps its cell ids, so regenerating
  an unchanged chapter rewrites identical bytes.
- A figure (a MyST ```` ```{figure} figures/NAME.svg ```` block, drawn by
  `tools/figures/build.py`) shows on the website as the SVG; in the paired notebook it
  becomes a Markdown image of `book/figures/NAME.png` inlined as a `data:` URI, since Colab
  shows neither relative image paths, nor cell attachments, nor SVGs served from the repository.
- Each chapter's first code cell installs the library from the repository that
  `_config.yml` names; a fork changes the URL there and this script rewrites the
  install line in every chapter.

A later chapter adds to what an earlier one defined from its own cells, where the idea is taught,
so that an early chapter never shows a later feature and the library still has one implementation
of everything (after d2l's `add_to_class` and fastcore's `@patch`). Each such *patch* is code that
also runs in the chapter's notebook (the decorators are in `transformer_lib.utils`, from the utilities appendix `book/00_utilities.md`); the
exporter finds its target by name, in whichever module defines it, and writes the code there
(`tools/export_patches.py`):

- `@add_to_class(Cls)` on a function: the function, without the decorator, becomes a method of
  the class `Cls`, appended to the class body (or after the member a line `#| after NAME` right
  above it names). Adding a method the class already has is an error: `replace=True` replaces
  the existing method in place (a replacement whose docstring holds only sections, `Args:` and
  the like, keeps the replaced method's docstring and adds its entries to it, each new parameter
  after the one before it in the signature), `extend=True` appends the function's body to it. An extension is
  `def name(self, *args, <new keyword-only parameters>, **kwargs)`: its new parameters join the
  method's signature, its docstring merges into the method's (an `__init__` without one: into
  the class docstring), and its body's opening lines that repeat a line of the method's body
  (`where = "GPTConfig"`) are dropped, so that it can run on its own in the notebook. The method
  must not return a value (the extension could not run after it).
- `@add_to_class(Cls)` on a class: its annotated assignments become fields of the dataclass `Cls`,
  after its last field or after the field a line `#| after NAME` above names (the next fields
  follow the previous one); its docstring merges into the class docstring, each `Args:` entry
  after the entry of the field before it. Validation of the new fields is an extension of
  `__post_init__`. In the notebook the decorator only checks that the class has the fields.
- `@replaces(f)` on a function: it replaces the top-level function `f`, in place, in the module
  that defines it (and in the notebook it takes `f`'s place in `f`'s module).
- `NAME[key] = value` at the top level of a cell, where `NAME` is a dict display another
  chapter defines: the item `key: value` joins the display, at its end or after the key a line
  `#| after key` names. An existing key is an error.
- Comment lines directly above a patch travel with it. A patch cell's imports go to every module
  that receives code from it, those whose names that code uses (never the decorators'). Docstring
  merging follows Google-style sections (`Args:`, `Returns:`, `Raises:` ...): entries join the
  section of the same name (made if missing), text before any section joins the preamble.
- Nothing is replaced silently: besides the errors above, a function or class defined twice at
  the top level of one module is an error that names `@replaces`.

A chapter cell and what the exporter makes of it:

    #| export                                     # a cell of chapter 21
    from transformer_lib.multihead import MultiHeadAttention
    from transformer_lib.utils import add_to_class

    @add_to_class(MultiHeadAttention, extend=True)
    def __init__(self, *args, qk_norm: bool = False, **kwargs):
        \"\"\"Args:
            qk_norm: RMS-normalise each query and key head before the scores.
        \"\"\"
        where = "MultiHeadAttention"
        self.qk_norm = check_bool(where, "qk_norm", qk_norm)

  gives, in `transformer_lib/multihead.py`, `qk_norm: ...` as the last entry of the class
  docstring's `Args:`, `def __init__(self, d_model: int, n_head: int, *, dropout: float = 0.0,
  bias: bool = True, qk_norm: bool = False):`, and `self.qk_norm = check_bool(where, "qk_norm",
  qk_norm)` as the last line of chapter 4's `__init__`.

Usage:
    python tools/export.py           # write everything
    python tools/export.py --check   # exit 1, naming the files, if anything on disk differs
"""

from __future__ import annotations

import argparse
import ast
import base64
import re
import sys
import textwrap
from pathlib import Path

import jupytext
import yaml
from jupytext.combine import combine_inputs_with_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, also when loaded from elsewhere
from export_patches import (  # noqa: E402
    ADD_TO_CLASS, APPLY, LINE_LENGTH, REPLACES, ExportError, ModuleText, Patch, decorator_name, docstring_of,
    string_continuation_lines, target_name,
)

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PACKAGE = ROOT / "transformer_lib"
CHAPTER_GLOB = "[0-9][0-9]_*.md"
SOURCE_FORMAT = {"extension": ".md", "format_name": "myst"}

EXPORT_RE = re.compile(r"^#\|\s*export(?:\s+([A-Za-z_][A-Za-z0-9_]*))?\s*$")
API_RE = re.compile(r"^#\|\s*api(?:\s+(.*?))?\s*$")
VERSION_RE = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)
DEFAULT_EXP_RE = re.compile(r"^#\|\s*default_exp\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)
MODULE_DOC_RE = re.compile(r"^#\|\s*module_doc\s+(.+?)\s*$", re.MULTILINE)
DOC_WIDTH = 100  # the width a module's one-line `#| module_doc` is wrapped to
INSTALL_RE = re.compile(r"git\+https?://[^\s\"'@]+(?:@[^\s\"'#]+)?")

FIGURE_RE = re.compile(
    r"^```\{figure\}[ \t]+(?P<path>figures/[\w.-]+)\.svg[ \t]*\n(?P<options>(?::[\w-]+:[^\n]*\n)*)\n?"
    r"(?P<caption>.*?)\n?^```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
FIGURE_ALT_RE = re.compile(r"^:alt:[ \t]*([^\n]*)$", re.MULTILINE)

GENERATED_MARK = "# AUTOGENERATED by tools/export.py"
MODULE_HEADER = (
    GENERATED_MARK + " from {chapter}: do not edit this file.\n"
    "# Edit the chapter's `#| export` cells, then run `python tools/export.py`.\n"
)
MODULES_HEADER = (
    GENERATED_MARK + " from {chapters}: do not edit this file.\n"
    "# Edit the chapters' `#| export` cells, then run `python tools/export.py`.\n"
)

# The module of the command line: `python -m transformer_lib` runs its `main()`. Its names
# (`main`, `build_parser`, ...) are not re-exported: `transformer_lib.main` would read oddly.
CLI_MODULE = "cli"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def repository() -> tuple[str, str]:
    """The repository URL and branch, from `_config.yml` (the one place they live)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    if not repo.get("url") or not repo.get("branch"):
        raise ExportError("_config.yml: `repository.url` and `repository.branch` must both be set")
    return repo["url"].rstrip("/"), repo["branch"]


def chapter_title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ExportError("no level-1 heading")


def public_names(code: str, where: str) -> list[str]:
    """Top-level functions, classes and assigned names without a leading underscore."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise ExportError(f"{where}: exported code does not parse: {err}") from err
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in dict.fromkeys(names) if not n.startswith("_")]


# ---------------------------------------------------------------------------------------------
# Imports: records, hoisting, one sorted block per module

# An import as a record: (module, name, asname); name is None for ``import module [as asname]``.
ImportRecord = tuple[str, "str | None", "str | None"]


def import_records(nodes: list[ast.stmt], where: str) -> list[ImportRecord]:
    records: list[ImportRecord] = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise ExportError(f"{where}: relative imports are not supported in exported cells")
            records += [(node.module, a.name, a.asname) for a in node.names]
        else:
            records += [(a.name, None, a.asname) for a in node.names]
    return records


def bound_name(record: ImportRecord) -> str:
    module, name, asname = record
    return asname or name or module.split(".")[0]


def used_names(code: str) -> set[str]:
    """Every name the code reads (the root of ``a.b.c`` is ``a``)."""
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def _import_section(module: str) -> int:
    root = module.split(".")[0]
    if root == "__future__":
        return 0
    if root in sys.stdlib_module_names:
        return 1
    return 3 if root == PACKAGE.name else 2


def _name_key(name: str) -> tuple[int, str]:
    """isort's ``order_by_type``: CONSTANTS, then Classes, then functions and modules."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def render_imports(records: list[ImportRecord]) -> str:
    """One import block, as isort lays it out: sections (future, standard library, third party, this
    package) separated by a blank line; in each, ``import x`` lines, then ``from x import ...`` lines,
    by module; the names of a ``from`` import merged into one statement, wrapped at LINE_LENGTH."""
    sections: dict[int, list[str]] = {}
    straight = sorted({r for r in records if r[1] is None}, key=lambda r: (r[0].lower(), r[2] or ""))
    froms: dict[str, set[tuple[str, str | None]]] = {}
    for module, name, asname in records:
        if name is not None:
            froms.setdefault(module, set()).add((name, asname))
    for module, _, asname in straight:
        line = f"import {module}" + (f" as {asname}" if asname else "")
        sections.setdefault(_import_section(module), []).append(line)
    for module in sorted(froms, key=str.lower):
        names = [n + (f" as {a}" if a else "") for n, a in sorted(froms[module], key=lambda x: _name_key(x[0]))]
        line = f"from {module} import {', '.join(names)}"
        if len(line) > LINE_LENGTH:
            rows, row = [], "   "
            for n in names:
                if len(row) + len(n) + 2 > LINE_LENGTH:
                    rows.append(row)
                    row = "   "
                row += f" {n},"
            line = f"from {module} import (\n" + "\n".join(rows + [row]) + "\n)"
        sections.setdefault(_import_section(module), []).append(line)
    return "\n\n".join("\n".join(sections[k]) for k in sorted(sections))


# ---------------------------------------------------------------------------------------------
# Cells

class Cell:
    """One exported code cell: its module, its imports, its code and the names it gives the package's top level.

    Patches (see the module docstring) are taken out of the code; the rest goes to the cell's module.
    """

    def __init__(self, source: str, default_module: str | None, where: str, local_names: frozenset = frozenset()):
        lines = source.split("\n")
        self.where, self.local_names = where, local_names
        module = EXPORT_RE.match(lines[0]).group(1) or default_module
        api: list[str] | None = None
        body = lines[1:]
        if body and API_RE.match(body[0]):
            listed = API_RE.match(body[0]).group(1)
            api = listed.replace(",", " ").split() if listed else []
            body = body[1:]
        self.module = module
        code = "\n".join(body).strip("\n")
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            raise ExportError(f"{where}: exported code does not parse: {err}") from err
        self.lines = code.split("\n")
        self.keep = string_continuation_lines(code, tree)
        self.docstring: str | None = None
        first = 0
        if (doc := docstring_of(tree)) is not None:
            self.docstring = doc.value.value.strip()
            first = doc.end_lineno
        self.import_nodes = []
        for node in tree.body:
            if node.lineno <= first:
                continue
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                break
            self.import_nodes.append(node)
        self.imports = import_records(self.import_nodes, where)
        self.patches = [p for node in tree.body if (p := self._patch(node)) is not None]
        drop = set(range(1, first + 1))
        for node in self.import_nodes:
            drop.update(range(node.lineno, node.end_lineno + 1))
        for p in self.patches:
            drop.update(range(p.top, p.node.end_lineno + 1))
        kept = [line for i, line in enumerate(self.lines, 1) if i not in drop]
        self.code = re.sub(r"\n{4,}", "\n\n\n", "\n".join(kept)).strip("\n")
        if self.code and module is None:
            raise ExportError(f"{where}: has `#| export` cells but no `#| default_exp <module>` line")
        self.names = public_names(self.code, where)
        if api is None:
            self.api: list[str] = []
        elif not api:
            self.api = list(self.names)
        else:
            unknown = [n for n in api if n not in self.names]
            if unknown:
                raise ExportError(f"{where}: `#| api` names {unknown}, which the cell does not define")
            self.api = api

    def _patch(self, node: ast.stmt) -> Patch | None:
        """The patch that a top-level statement is, if it is one."""
        for deco in getattr(node, "decorator_list", []):
            name = decorator_name(deco)
            if name not in (ADD_TO_CLASS, REPLACES):
                continue
            if not isinstance(deco, ast.Call) or len(deco.args) != 1:
                raise ExportError(f"{self.where}: `@{name}` takes one positional argument, the "
                                  f"{'class' if name == ADD_TO_CLASS else 'function'}")
            target = target_name(deco.args[0], self.where)
            options = {}
            for kw in deco.keywords:
                if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
                    raise ExportError(f"{self.where}: `@{name}(..., {kw.arg}=...)` must be True or False")
                options[kw.arg] = kw.value.value
            if name == REPLACES:
                if options or not isinstance(node, ast.FunctionDef):
                    raise ExportError(f"{self.where}: `@replaces(f)` goes on a function, without options")
                if node.name != target:
                    raise ExportError(f"{self.where}: `@replaces({target})` is on a function named "
                                      f"`{node.name}`; the replacement must keep the name")
                return Patch("function", target, node, self)
            unknown = set(options) - {"replace", "extend"}
            if unknown:
                raise ExportError(f"{self.where}: `@add_to_class` takes replace=True or extend=True, got {unknown}")
            if isinstance(node, ast.ClassDef):
                if options:
                    raise ExportError(f"{self.where}: `@add_to_class` on a class adds fields; replace/extend "
                                      "apply to methods")
                return Patch("fields", target, node, self)
            if options.get("replace") and options.get("extend"):
                raise ExportError(f"{self.where}: `@add_to_class` takes replace=True or extend=True, not both")
            mode = "replace" if options.get("replace") else "extend" if options.get("extend") else "add"
            return Patch("method", target, node, self, mode)
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)
                and isinstance(node.targets[0].value, ast.Name) and isinstance(node.targets[0].slice, ast.Constant)):
            name = node.targets[0].value.id
            if name not in self.local_names:  # a dict of an earlier chapter; this chapter's own stays code
                return Patch("item", name, node, self)
        return None


def top_level_names(code: str) -> set[str]:
    """The names a piece of code binds at its top level."""
    names = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


class Chapter:
    """One chapter: its notebook, its default module and its exported cells."""

    def __init__(self, path: Path, index: int = 0):
        self.path, self.index = path, index
        self.text = path.read_text(encoding="utf-8")
        self.nb = jupytext.reads(self.text, fmt=SOURCE_FORMAT)
        where = rel(path)
        try:
            self.title = chapter_title(self.nb)
        except ExportError as err:
            raise ExportError(f"{where}: {err}") from None
        code_cells = [c for c in self.nb.cells if c.cell_type == "code"]
        modules = [m for c in code_cells for m in DEFAULT_EXP_RE.findall(c.source)]
        if len(set(modules)) > 1:
            raise ExportError(f"{where}: more than one `#| default_exp` ({', '.join(modules)})")
        self.module = modules[0] if modules else None
        docs = [d for c in code_cells for d in MODULE_DOC_RE.findall(c.source)]
        if len(docs) > 1 or (docs and self.module is None):
            raise ExportError(f"{where}: `#| module_doc` describes the chapter's one `#| default_exp` module; "
                              f"found {len(docs)} such lines and default module {self.module}")
        self.module_doc = docs[0] if docs else None
        exported = [c.source for c in code_cells if EXPORT_RE.match(c.source.split("\n", 1)[0])]
        local: set[str] = set()
        for source in exported:
            try:
                local |= top_level_names("\n".join(source.split("\n")[1:]))
            except SyntaxError as err:
                raise ExportError(f"{where}: exported code does not parse: {err}") from err
        self.cells = [Cell(source, self.module, where, frozenset(local)) for source in exported]
        if not code_cells or not INSTALL_RE.search(code_cells[0].source):
            raise ExportError(
                f"{where}: the first code cell must install transformer_lib when it is not "
                "importable (`pip install ... git+<repository>@<branch>`); copy it from another chapter"
            )

    def with_install_url(self, url: str, branch: str) -> str:
        """The chapter's text with its install line pointing at `url@branch`."""
        return INSTALL_RE.sub(f"git+{url}@{branch}", self.text, count=1)

    def notebook_source(self, text: str) -> str:
        """The paired .ipynb, keeping the cell ids of the one on disk (`jupytext --update`)."""
        nb = jupytext.reads(text, fmt=SOURCE_FORMAT)
        ipynb = self.path.with_suffix(".ipynb")
        if ipynb.exists():
            nb = combine_inputs_with_outputs(nb, jupytext.read(ipynb), fmt=SOURCE_FORMAT)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = FIGURE_RE.sub(lambda m: inline_figure(m, rel(self.path)), cell.source)
        return jupytext.writes(nb, fmt="ipynb")


def inline_figure(match: re.Match, where: str) -> str:
    """A figure block as Markdown for a notebook: its PNG as a data URI, then its caption."""
    png = BOOK / f"{match['path']}.png"
    if not png.is_file():
        raise ExportError(f"{where}: {match['path']}.svg has no PNG copy {rel(png)}; run tools/figures/build.py")
    alt = FIGURE_ALT_RE.search(match["options"])
    alt_text = alt[1].strip() if alt else match["path"]
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    caption = " ".join(match["caption"].split())
    return f"![{alt_text}](data:image/png;base64,{data})" + (f"\n\n*{caption}*" if caption else "")


def short_title(chapter: Chapter) -> str:
    return re.sub(r"^[0-9]+[.]\s*", "", chapter.title)  # "1. From text to tensors" -> "From ..."


class Module:
    """One module of the package: the cells exported to it, from one chapter or several, and the
    patches of later chapters applied to its code."""

    def __init__(self, name: str):
        self.name = name
        self.parts: list[tuple[Chapter, Cell]] = []
        self.patched_by: list[Chapter] = []
        self.imports: list[ImportRecord] = []
        self.doc: str | None = None
        self.body: ModuleText | None = None

    @property
    def chapters(self) -> list[Chapter]:
        every = dict.fromkeys([ch for ch, _ in self.parts] + self.patched_by)
        return sorted(every, key=lambda ch: ch.index)

    @property
    def names(self) -> list[str]:
        return public_names(self.body.text, f"transformer_lib/{self.name}.py")

    @property
    def api(self) -> list[str]:
        return list(dict.fromkeys(n for _, cell in self.parts for n in cell.api))

    def assemble(self) -> None:
        """The module's code before patches, and the imports its own cells bring."""
        where = f"transformer_lib/{self.name}.py"
        first = self.parts[0][1]
        docs = [ch.module_doc for ch in dict.fromkeys(ch for ch, _ in self.parts)
                if ch.module_doc and ch.module == self.name]
        if first.docstring and docs:
            raise ExportError(f"{where}: described twice, by `#| module_doc` and by its first cell's docstring")
        # what each cell adds, said by the docstring it opens with, joins in reading order
        summaries = ["\n".join(textwrap.wrap(d, DOC_WIDTH)) for d in docs[:1]]
        summaries += [cell.docstring for _, cell in self.parts if cell.docstring]
        if not summaries:
            raise ExportError(
                f"{where}: no docstring; say what the module holds with a line `#| module_doc <sentence>` in "
                f"a code cell of {rel(self.parts[0][0].path)}, or open an exported cell with a docstring")
        self.doc = "\n\n".join(summaries)
        self.body = ModuleText(self.name, "\n\n\n".join(cell.code for _, cell in self.parts if cell.code))
        for _, cell in self.parts:
            if cell.patches:  # a cell that also patches other modules brings only what its own code uses
                used = used_names(cell.code) if cell.code else set()
                self.imports += [r for r in cell.imports if bound_name(r) in used]
            else:
                self.imports += cell.imports

    def source(self) -> str:
        chapters = self.chapters
        paths = [rel(ch.path) for ch in chapters]
        if len(chapters) == 1:
            header = MODULE_HEADER.format(chapter=paths[0])
            origin = f"Exported from the chapter `{paths[0]}`."
        else:
            header = MODULES_HEADER.format(chapters=", ".join(paths))
            origin = "Exported from the chapters\n\n" + "\n".join(
                f"- `{p}` ({short_title(ch)})" for p, ch in zip(paths, chapters))
        doc = f'"""{self.doc}\n\n{origin}\n"""\n\n'
        code = self.body.text
        defined = top_level_names(code)
        own = f"{PACKAGE.name}.{self.name}"
        records = [r for r in dict.fromkeys(self.imports)
                   if r[0] != own and not (r[1] is not None and r[0] == PACKAGE.name and r[1] == self.name)
                   and bound_name(r) not in defined]
        future = [r for r in records if r[0] == "__future__"]
        imports = render_imports([r for r in records if r[0] != "__future__"])
        names = "".join(f'    "{n}",\n' for n in self.names)
        out = header + doc
        if future:
            out += render_imports(future) + "\n\n"
        out += f"__all__ = [\n{names}]\n\n"
        if imports:  # then two blank lines before a def or class, one before anything else (as isort)
            opener = next((line for line in code.split("\n") if line.strip() and not line.startswith("#")), "")
            out += imports + ("\n\n\n" if re.match(r"(def|class|async def|@)\b|@", opener) else "\n\n")
        return out + code.strip("\n") + "\n"

    def check_duplicates(self) -> None:
        seen: dict[str, int] = {}
        for node in ast.parse(self.body.text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    raise ExportError(
                        f"transformer_lib/{self.name}.py: `{node.name}` is defined twice (lines {seen[node.name]} "
                        f"and {node.lineno} of its code); a later chapter that means to replace it marks the new "
                        f"one `@replaces({node.name})` (a method: `@add_to_class(Cls, replace=True)`)")
                seen[node.name] = node.lineno


def main_source(chapter: Chapter) -> str:
    """`transformer_lib/__main__.py`, the entry point of `python -m transformer_lib`."""
    return (
        MODULE_HEADER.format(chapter=rel(chapter.path))
        + f'"""``python -m transformer_lib``: the command line of the chapter `{rel(chapter.path)}`."""\n\n'
        + f"from transformer_lib.{CLI_MODULE} import main\n\n"
        + 'if __name__ == "__main__":\n'
        + "    raise SystemExit(main())\n"
    )


def package_version() -> str:
    match = VERSION_RE.search((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    if match is None:
        raise ExportError('pyproject.toml: no `version = "..."` line')
    return match.group(1)


def init_source(modules: list[Module]) -> str:
    lines = [
        GENERATED_MARK + " from the chapters in book/: do not edit this file.",
        "# Edit the chapters' `#| export` cells, then run `python tools/export.py`.",
        '"""transformer_lib: the transformer built, chapter by chapter, in *Transformers from Scratch*.',
        "",
        "The names here are the production path: configurations, models, tokenizers, data, training,",
        "generation, saving and loading. The teaching re-implementations (a NumPy softmax, a hand-written",
        "AdamW, the NumPy GPT) stay importable from their modules, e.g. ``transformer_lib.attention.softmax``.",
        '"""',
        "",
    ]
    every: list[str] = []
    for module in modules:
        if module.api:
            lines.append(f"from transformer_lib.{module.name} import (")
            lines += [f"    {n}," for n in module.api]
            lines.append(")")
            every += module.api
    lines += ["", f'__version__ = "{package_version()}"', ""]
    lines += ["__all__ = ["] + [f'    "{n}",' for n in every] + ["]", ""]
    return "\n".join(lines)


def api_source(modules: list[Module]) -> str:
    parts = [
        "<!-- " + GENERATED_MARK + " from the chapters' docstrings: do not edit this file. -->",
        "",
        "# API reference",
        "",
        "The names marked *top level* below are importable from the package itself, for example",
        "`from transformer_lib import GPT`; every other name from its module, for example",
        "`from transformer_lib.attention import softmax`. Each module is generated from the chapters",
        "named under its heading, which derive and check what it contains.",
        "",
    ]
    for module in modules:
        if not module.names or module.name.startswith("_"):
            continue
        links = ", ".join(f"[{ch.title}]({ch.path.name})" for ch in module.chapters)
        source = f"From {'the chapter' if len(module.chapters) == 1 else 'the chapters'} {links}."
        if module.api:
            source += " Top level: " + ", ".join(f"`{n}`" for n in module.api) + "."
        if module.name == CLI_MODULE:
            source += (
                " Run it as `python -m transformer_lib`; import its names from the module,"
                f" e.g. `from transformer_lib.{CLI_MODULE} import main`."
            )
        parts += [
            f"## `transformer_lib.{module.name}`",
            "",
            source,
            "",
            # autodoc emits reStructuredText, so the directive must sit in an eval-rst block.
            f"```{{eval-rst}}\n.. automodule:: transformer_lib.{module.name}\n   :members:\n```",
            "",
        ]
    return "\n".join(parts)


def collect_modules(chapters: list[Chapter]) -> list[Module]:
    """The package's modules in order of first appearance, each with its cells in reading order and
    the patches of every chapter applied, in reading order."""
    modules: dict[str, Module] = {}
    patches: list[tuple[Chapter, Patch]] = []
    for ch in chapters:
        for cell in ch.cells:
            if cell.code or not cell.patches:
                modules.setdefault(cell.module, Module(cell.module)).parts.append((ch, cell))
            patches += [(ch, p) for p in cell.patches]
    for module in modules.values():
        module.assemble()
    kinds = {"method": (ast.ClassDef,), "fields": (ast.ClassDef,), "function": (ast.FunctionDef, ast.AsyncFunctionDef),
             "item": (ast.Assign, ast.AnnAssign)}
    for ch, patch in patches:
        homes = [m for m in modules.values() if m.body.top(patch.target, kinds[patch.kind]) is not None]
        what = {"method": "class", "fields": "class", "function": "function", "item": "dict"}[patch.kind]
        if len(homes) != 1:
            found = f"in {', '.join(m.name for m in homes)}" if homes else "in no module"
            raise ExportError(f"{patch.where}: the {what} `{patch.target}` is defined {found}; a patch needs "
                              "exactly one module that defines its target")
        home = homes[0]
        APPLY[patch.kind](home.body, patch)
        home.patched_by.append(ch)
        used = patch.used_names()
        home.imports += [r for r in patch.cell.imports if bound_name(r) in used]
    seen: dict[str, str] = {}
    for module in modules.values():
        module.check_duplicates()
        if module.name == CLI_MODULE and module.api:
            raise ExportError(f"`{CLI_MODULE}` is the command line; its names are not re-exported (`#| api`)")
        for n in module.api:
            if n in seen:
                raise ExportError(f"`{n}` is re-exported by both `{seen[n]}` and `{module.name}`")
            seen[n] = module.name
    return list(modules.values())


def planned_outputs() -> dict[Path, str]:
    """Every file the export writes, with the exact text it should hold."""
    url, branch = repository()
    chapters = [Chapter(p, i) for i, p in enumerate(sorted(BOOK.glob(CHAPTER_GLOB)))]
    if not chapters:
        raise ExportError(f"no chapters matching book/{CHAPTER_GLOB}")
    modules = collect_modules(chapters)

    out: dict[Path, str] = {}
    for ch in chapters:
        text = ch.with_install_url(url, branch)
        if text != ch.text:  # only a changed install URL rewrites a chapter (never a stale copy of it)
            out[ch.path] = text
        out[ch.path.with_suffix(".ipynb")] = ch.notebook_source(text)
    for module in modules:
        out[PACKAGE / f"{module.name}.py"] = module.source()
        if module.name == CLI_MODULE:
            out[PACKAGE / "__main__.py"] = main_source(module.chapters[0])
    out[PACKAGE / "__init__.py"] = init_source(modules)
    out[BOOK / "api.md"] = api_source(modules)
    return out


def stale_files(planned: dict[Path, str]) -> list[Path]:
    """Generated files that no chapter produces any more."""
    stale = [
        p
        for p in PACKAGE.glob("*.py")
        if p not in planned and p.read_text(encoding="utf-8").startswith(GENERATED_MARK)
    ]
    stale += [p for p in BOOK.glob("[0-9][0-9]_*.ipynb") if p not in planned]
    return sorted(stale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file differs")
    args = parser.parse_args(argv)
    try:
        planned = planned_outputs()
    except ExportError as err:
        print(f"export: {err}", file=sys.stderr)
        return 2

    differ = [
        p for p, text in planned.items() if not p.exists() or p.read_text(encoding="utf-8") != text
    ]
    stale = stale_files(planned)
    if args.check:
        if differ or stale:
            print("export --check: these files differ from what the chapters generate:", file=sys.stderr)
            for p in differ:
                print(f"  {rel(p)}" + ("" if p.exists() else " (missing)"), file=sys.stderr)
            for p in stale:
                print(f"  {rel(p)} (generated, but no chapter produces it any more)", file=sys.stderr)
            print("Run `python tools/export.py` and commit the result.", file=sys.stderr)
            return 1
        print(f"export --check: {len(planned)} generated files are up to date")
        return 0

    for p in differ:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(planned[p], encoding="utf-8", newline="\n")
        print(f"wrote   {rel(p)}")
    for p in stale:
        p.unlink()
        print(f"removed {rel(p)}")
    if not differ and not stale:
        print(f"export: {len(planned)} generated files already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
