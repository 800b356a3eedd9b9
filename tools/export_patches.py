"""How `tools/export.py` applies a later chapter's patches to the code of an earlier chapter's module.

A patch (`@add_to_class`, `@replaces`, `NAME[key] = value`; see the docstring of `tools/export.py`)
is found in a cell by :class:`Patch`, then written into the text of the module that defines its
target: a method into the class body, fields into a dataclass, a function in place of another, an
item into a dict display, with parameters and docstring entries merged.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

LINE_LENGTH = 120  # the longest line the generated code gets where this tool wraps it


class ExportError(Exception):
    """A chapter breaks an export convention; the message names the file."""


ADD_TO_CLASS = "add_to_class"
REPLACES = "replaces"
AFTER_RE = re.compile(r"^\s*#\|\s*after\s+(.+?)\s*$")
SECTION_ORDER = ["Args", "Attributes", "Returns", "Yields", "Raises", "Example", "Examples", "Note", "Notes"]


def decorator_name(deco: ast.expr) -> str | None:
    func = deco.func if isinstance(deco, ast.Call) else deco
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def target_name(expr: ast.expr, where: str) -> str:
    """``Cls`` or ``module.Cls`` -> ``"Cls"``."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    raise ExportError(f"{where}: the target of a patch must be a name, got `{ast.unparse(expr)}`")


def docstring_of(node) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def start_line(node: ast.stmt) -> int:
    """The first line of a statement, its decorators included (1-based)."""
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


def comments_above(lines: list[str], first: int) -> tuple[int, list[str], str | None]:
    """The comment lines directly above line ``first`` (1-based): (their first line, the comments
    without ``#| after`` directives, the ``#| after`` target or None)."""
    top = first
    while top > 1 and lines[top - 2].strip().startswith("#"):
        top -= 1
    comments, after = [], None
    for line in lines[top - 1 : first - 1]:
        m = AFTER_RE.match(line)
        if m:
            after = m.group(1).strip().strip("'\"")
        else:
            comments.append(line)
    return top, comments, after


def string_continuation_lines(code: str, tree: ast.AST) -> set[int]:
    """Lines (1-based) inside one multi-line string token that is not a docstring: re-indenting them
    would change the string's value. (The pieces of an implicitly concatenated string, one per line,
    are separate tokens and move with the code.)"""
    docstrings = {d.lineno for n in ast.walk(tree) if (d := docstring_of(n)) is not None}
    fstring_start, fstring_end = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
    inside: set[int] = set()
    opened = []  # start rows of the f-strings open (Python >= 3.12 splits an f-string into tokens)
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == fstring_start:
            opened.append(tok.start[0])
            continue
        if tok.type == fstring_end:
            first = opened.pop()
        elif tok.type == tokenize.STRING and not opened:
            first = tok.start[0]
        else:
            continue
        if tok.end[0] > first and first not in docstrings:
            inside.update(range(first + 1, tok.end[0] + 1))
    return inside


def reindent(lines: list[str], first_line: int, by: int, keep: set[int]) -> list[str]:
    """Shift ``lines`` (numbered from ``first_line``) right by ``by`` columns (left if negative),
    leaving blank lines blank and the lines in ``keep`` as they are."""
    out = []
    for i, line in enumerate(lines, first_line):
        if not line.strip() or i in keep:
            out.append(line if line.strip() else "")
        elif by >= 0:
            out.append(" " * by + line)
        else:
            if line[: -by].strip():
                raise ExportError(f"cannot dedent the line {line!r}")
            out.append(line[-by:])
    return out


class Patch:
    """A later chapter's addition to code an earlier cell defined, found by the name of its target.

    kind: ``"method"`` (``@add_to_class(C)`` on a function; mode ``"add"``, ``"replace"`` or
    ``"extend"``), ``"fields"`` (``@add_to_class(C)`` on a class), ``"function"``
    (``@replaces(f)``) or ``"item"`` (``NAME[key] = value`` on a dict an earlier chapter defined).
    ``cell`` is the `Cell` of `tools/export.py` that holds the patch.
    """

    def __init__(self, kind: str, target: str, node: ast.stmt, cell, mode: str = "add"):
        self.kind, self.target, self.node, self.cell, self.mode = kind, target, node, cell, mode
        self.top, self.comments, self.after = comments_above(cell.lines, start_line(node))

    @property
    def where(self) -> str:
        return f"{self.cell.where}, line {self.node.lineno} of the cell"

    def used_names(self) -> set[str]:
        """The names the patch's code reads (its own decorator left out)."""
        own = [d for d in getattr(self.node, "decorator_list", []) if decorator_name(d) in (ADD_TO_CLASS, REPLACES)]
        skip = {id(n) for d in own for n in ast.walk(d)}
        return {n.id for n in ast.walk(self.node) if isinstance(n, ast.Name) and id(n) not in skip}

    def source(self, indent: int) -> list[str]:
        """The comments, the decorators other than the patch's own, and the statement, at ``indent``."""
        node, lines = self.node, self.cell.lines
        skip = set()
        for deco in getattr(node, "decorator_list", []):
            if decorator_name(deco) in (ADD_TO_CLASS, REPLACES):
                skip.update(range(deco.lineno, deco.end_lineno + 1))
        first = start_line(node)
        body = [(i, lines[i - 1]) for i in range(first, node.end_lineno + 1) if i not in skip]
        out = reindent(self.comments, 0, indent - node.col_offset, set())
        for i, line in body:
            out += reindent([line], i, indent - node.col_offset, self.cell.keep)
        return out


# ---------------------------------------------------------------------------------------------
# Applying patches to the text of a module


def _members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    members = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = node
        elif isinstance(node, ast.Assign):
            members.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
    return members


def _returns(func: ast.FunctionDef) -> bool:
    """Whether ``func`` itself (not a function nested in it) has a ``return`` with a value."""
    stack = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False


class ModuleText:
    """The body of a generated module (its code after the import block) as lines, edited by patches."""

    def __init__(self, name: str, code: str):
        self.name = name
        self.lines = code.split("\n") if code else []

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def tree(self) -> ast.Module:
        return ast.parse(self.text)

    def top(self, name: str, kinds: tuple) -> ast.stmt | None:
        for node in self.tree().body:
            if isinstance(node, kinds) and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == name:
                    return node
            elif isinstance(node, kinds) and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return node
        return None

    def insert(self, after: int, new: list[str], blank: int = 0) -> None:
        """Insert ``new`` after line ``after`` (1-based), preceded by ``blank`` blank lines."""
        self.lines[after:after] = [""] * blank + new

    def replace(self, first: int, last: int, new: list[str]) -> None:
        self.lines[first - 1 : last] = new


def _docstring_parts(doc: ast.Expr) -> tuple[list[str], dict[str, list[list[str]]]]:
    """A docstring as its preamble lines and its Google-style sections: {name: [entry lines, ...]},
    each entry's lines relative to the section's header."""
    raw = doc.value.value.split("\n")
    lines = [raw[0].strip()] + [line[doc.col_offset:] if not line[: doc.col_offset].strip() else line.strip()
                                for line in raw[1:]]
    while lines and not lines[-1].strip():
        lines.pop()
    preamble: list[str] = []
    sections: dict[str, list[list[str]]] = {}
    current = None
    for line in lines:
        header = re.match(r"^([A-Z][A-Za-z ]*):\s*$", line)
        if header and header.group(1) in SECTION_ORDER:
            current = sections.setdefault(header.group(1), [])
        elif current is None:
            preamble.append(line)
        elif line.startswith("    ") and not line.startswith("     ") and line.strip():
            current.append([line[4:]])
        elif current and line.strip():
            current[-1].append(line[4:] if line.startswith("    ") else line.strip())
    while preamble and not preamble[-1].strip():
        preamble.pop()
    return preamble, sections


def _entry_name(line: str) -> str:
    m = re.match(r"^\*{0,2}([A-Za-z_][\w.]*)", line)
    return m.group(1) if m else ""


def merge_docstring(module: ModuleText, doc: ast.Expr, addition: ast.Expr, anchors: dict[str, str | None],
                    where: str) -> None:
    """Merge the docstring ``addition`` into the docstring ``doc`` of ``module``: its preamble goes
    at the end of the target's preamble, each entry of a section to the same-named section (made if
    missing), after the entry named ``anchors[entry]`` if there is one, else at the section's end."""
    preamble, sections = _docstring_parts(addition)
    lines = module.lines
    indent = " " * doc.col_offset
    first, last = doc.lineno, doc.end_lineno
    raw = lines[first - 1 : last]
    if not raw[0].lstrip().startswith('"""') or not raw[-1].rstrip().endswith('"""'):
        raise ExportError(f"{where}: can only merge into a docstring in triple double quotes")
    if len(raw) == 1:  # a one-line docstring becomes a block
        raw = [raw[0].rstrip()[:-3], indent + '"""']
    elif raw[-1].strip() != '"""':
        raw = raw[:-1] + [raw[-1].rstrip()[:-3], indent + '"""']
    doc_lines = raw

    def header_at(i: int) -> str | None:
        m = re.match(rf"^{indent}([A-Z][A-Za-z ]*):\s*$", doc_lines[i])
        return m.group(1) if m and m.group(1) in SECTION_ORDER else None

    def sections_now() -> list[tuple[str, int]]:
        return [(h, i) for i in range(1, len(doc_lines)) if (h := header_at(i))]

    def section_end(start: int) -> int:
        """Index after the last non-blank line of the section whose header is at ``start``."""
        i = start + 1
        while i < len(doc_lines) - 1 and not header_at(i) and (
                not doc_lines[i].strip() or doc_lines[i].startswith(indent + " ")):
            i += 1
        while doc_lines[i - 1].strip() == "" and i - 1 > start:
            i -= 1
        return i

    for name, entries in sections.items():
        found = dict(sections_now())
        if name not in found:  # a new section, before the first one that follows it in SECTION_ORDER
            later = [i for h, i in sections_now() if SECTION_ORDER.index(h) > SECTION_ORDER.index(name)]
            if later:
                doc_lines[later[0]:later[0]] = [indent + name + ":", ""]
            else:
                at = len(doc_lines) - 1
                doc_lines[at:at] = ([""] if doc_lines[at - 1].strip() else []) + [indent + name + ":"]
            found = dict(sections_now())
        for entry in entries:
            start = found[name]
            end = section_end(start)
            anchor = anchors.get(_entry_name(entry[0]))
            if anchor:
                for i in range(start + 1, end):
                    if doc_lines[i].startswith(indent + "    " + anchor) and \
                            _entry_name(doc_lines[i].strip()) == anchor:
                        end = i + 1
                        while end < len(doc_lines) and doc_lines[end].startswith(indent + "     "):
                            end += 1
                        break
            doc_lines[end:end] = [(indent + "    " + line) if line.strip() else "" for line in entry]
            found = dict(sections_now())
    if preamble:
        heads = sections_now()
        at = heads[0][1] if heads else len(doc_lines) - 1
        while doc_lines[at - 1].strip() == "" and at - 1 > 0:
            at -= 1
        block = [""] + [(indent + line) if line.strip() else "" for line in preamble]
        doc_lines[at:at] = block
    module.replace(first, last, doc_lines)


def _param_text(arg: ast.arg, default: ast.expr | None, source: str) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += ": " + ast.get_source_segment(source, arg.annotation)
    if default is not None:
        text += (" = " if arg.annotation is not None else "=") + ast.get_source_segment(source, default)
    return text


def _add_parameters(module: ModuleText, func: ast.FunctionDef, params: list[str], where: str) -> None:
    """Add keyword-only parameters (their source text) to the signature of ``func`` in ``module``."""
    a = func.args
    header_end = func.body[0].lineno - 1
    while not module.lines[header_end - 1].rstrip().endswith(":"):
        header_end -= 1  # comments between the signature and the body
    header = "\n".join(module.lines[func.lineno - 1 : header_end])
    tokens = list(tokenize.generate_tokens(io.StringIO(header + "\n    pass\n").readline))
    depth, opened, close, stars, prev = 0, False, None, None, None
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
            opened = True
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
            if opened and depth == 0:
                close = tok
                break
        elif tok.type == tokenize.OP and tok.string == "**" and depth == 1:
            stars = tok
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and depth >= 1:
            prev = tok
    if close is None:
        raise ExportError(f"{where}: cannot find the parameter list of `{func.name}`")
    star = [] if (a.vararg or a.kwonlyargs) else ["*"]
    new = star + params
    base = func.lineno - 1  # tokens count lines from 1 at the def line
    if stars is not None:  # before **kwargs
        row, col = base + stars.start[0], stars.start[1]
        line = module.lines[row - 1]
        module.lines[row - 1] = line[:col] + ", ".join(new) + ", " + line[col:]
        return
    if prev.string == "," and prev.start[0] < close.start[0]:  # one parameter a line, a trailing comma
        row = base + prev.start[0]
        indent = re.match(r"^\s*", module.lines[row - 1]).group(0)
        module.insert(row, [f"{indent}{p}," for p in new])
        return
    row, col = base + prev.end[0], prev.end[1]
    line = module.lines[row - 1]
    joined = line[:col] + ", " + ", ".join(new) + line[col:]
    if len(joined) <= LINE_LENGTH:
        module.lines[row - 1] = joined
    else:  # continue on the next line, aligned after the opening parenthesis
        open_col = module.lines[func.lineno - 1].index("(") + 1
        module.lines[row - 1] = line[:col] + ","
        module.insert(row, [" " * open_col + ", ".join(new) + line[col:]])


def apply_method_patch(module: ModuleText, patch: Patch) -> None:
    cls = module.top(patch.target, (ast.ClassDef,))
    node: ast.FunctionDef = patch.node
    members = _members(cls)
    body_indent = cls.body[0].col_offset
    existing = members.get(node.name)
    where = patch.where
    if patch.mode == "add":
        if existing is not None:
            raise ExportError(f"{where}: `{patch.target}` already has `{node.name}`; "
                              "mark the patch `@add_to_class(..., replace=True)` or `extend=True`")
        anchor = cls.body[-1]
        if patch.after:
            if patch.after not in members:
                raise ExportError(f"{where}: `#| after {patch.after}`: `{patch.target}` has no `{patch.after}`")
            anchor = members[patch.after]
        module.insert(anchor.end_lineno, patch.source(body_indent), blank=1)
        return
    if not isinstance(existing, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ExportError(f"{where}: `{patch.target}` has no method `{node.name}` to {patch.mode}")
    if patch.mode == "replace":
        old_doc, new_doc = docstring_of(existing), docstring_of(node)
        merge = old_doc is not None and new_doc is not None and not _docstring_parts(new_doc)[0]
        old_text = module.lines[old_doc.lineno - 1 : old_doc.end_lineno] if merge else []
        old_names = {x.arg for x in existing.args.posonlyargs + existing.args.args + existing.args.kwonlyargs}
        module.replace(start_line(existing), existing.end_lineno, patch.source(body_indent))
        if merge:  # a docstring of sections only adds them to the replaced method's docstring
            doc = docstring_of(_members(module.top(patch.target, (ast.ClassDef,)))[node.name])
            module.replace(doc.lineno, doc.end_lineno, old_text)
            anchors, previous = {}, None
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                if arg.arg not in old_names:
                    anchors[arg.arg] = previous
                previous = arg.arg
            doc = docstring_of(_members(module.top(patch.target, (ast.ClassDef,)))[node.name])
            merge_docstring(module, doc, new_doc, anchors, where)
        return
    # extend: the method's body, then the patch's; new keyword-only parameters join the signature
    a = node.args
    if a.posonlyargs or [x.arg for x in a.args] != ["self"] or node.decorator_list[1:] or \
            any(decorator_name(d) != ADD_TO_CLASS for d in node.decorator_list):
        raise ExportError(f"{where}: an extension is a plain method `def {node.name}(self, *args, <new "
                          "keyword-only parameters>, **kwargs)`")
    if _returns(existing):
        raise ExportError(f"{where}: `{patch.target}.{node.name}` returns a value; "
                          "an extension could not run after it; replace it instead")
    source = "\n".join(patch.cell.lines)
    old_names = {x.arg for x in existing.args.posonlyargs + existing.args.args + existing.args.kwonlyargs}
    params, anchors, previous = [], {}, (existing.args.kwonlyargs or existing.args.args)[-1].arg
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if arg.arg in old_names:
            raise ExportError(f"{where}: `{patch.target}.{node.name}` already has the parameter `{arg.arg}`")
        params.append(_param_text(arg, default, source))
        anchors[arg.arg], previous = previous, arg.arg
    body = node.body
    doc = docstring_of(node)
    if doc is not None:
        body = body[1:]
    old_top = {ast.dump(s) for s in existing.body}
    while body and ast.dump(body[0]) in old_top:  # repeated set-up lines, e.g. `where = "GPTConfig"`
        body = body[1:]
    if body:
        first = comments_above(patch.cell.lines, start_line(body[0]))[0]
        lines = patch.cell.lines[first - 1 : node.end_lineno]
        new = reindent(lines, first, existing.body[0].col_offset - body[0].col_offset, patch.cell.keep)
        module.insert(existing.end_lineno, new)
    if params:
        _add_parameters(module, existing, params, where)
    if doc is not None:
        cls = module.top(patch.target, (ast.ClassDef,))
        method = _members(cls)[node.name]
        target_doc = docstring_of(method)
        if target_doc is None and node.name == "__init__":
            target_doc = docstring_of(cls)  # the class documents its constructor
        if target_doc is None:
            module.insert(method.body[0].lineno - 1, reindent(patch.cell.lines[doc.lineno - 1 : doc.end_lineno],
                          doc.lineno, method.body[0].col_offset - doc.col_offset, set()))
        else:
            merge_docstring(module, target_doc, doc, anchors, where)


def apply_fields_patch(module: ModuleText, patch: Patch) -> None:
    cls = module.top(patch.target, (ast.ClassDef,))
    where, node = patch.where, patch.node
    if node.bases or node.keywords or node.decorator_list[1:]:
        raise ExportError(f"{where}: a class that adds fields has no bases and no other decorators")
    anchors: dict[str, str | None] = {}
    previous: str | None = None
    items = node.body[1:] if docstring_of(node) is not None else node.body
    for item in items:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            raise ExportError(f"{where}: a class that adds fields holds a docstring and annotated fields; "
                              "add methods with `@add_to_class` on a function")
        cls = module.top(patch.target, (ast.ClassDef,))
        members = _members(cls)
        name = item.target.id
        if name in members:
            raise ExportError(f"{where}: `{patch.target}` already has `{name}`")
        top, comments, after = comments_above(patch.cell.lines, item.lineno)
        if after is None and previous is None:
            fields = [n for n in cls.body if isinstance(n, ast.AnnAssign)]
            after = fields[-1].target.id if fields else None
        elif after is None:
            after = previous
        if after is not None and after not in members:
            raise ExportError(f"{where}: `#| after {after}`: `{patch.target}` has no `{after}`")
        anchor_line = members[after].end_lineno if after else (docstring_of(cls) or cls.body[0]).end_lineno
        lines = comments + patch.cell.lines[item.lineno - 1 : item.end_lineno]
        module.insert(anchor_line, reindent(lines, top, cls.body[0].col_offset - item.col_offset, patch.cell.keep))
        anchors[name], previous = after, name
    doc = docstring_of(node)
    if doc is not None:
        cls = module.top(patch.target, (ast.ClassDef,))
        target_doc = docstring_of(cls)
        if target_doc is None:
            raise ExportError(f"{where}: `{patch.target}` has no docstring to add to")
        merge_docstring(module, target_doc, doc, anchors, where)


def apply_function_patch(module: ModuleText, patch: Patch) -> None:
    old = module.top(patch.target, (ast.FunctionDef, ast.AsyncFunctionDef))
    module.replace(start_line(old), old.end_lineno, patch.source(0))


def apply_item_patch(module: ModuleText, patch: Patch) -> None:
    """``NAME[key] = value`` becomes the item ``key: value`` of the dict display that defines NAME."""
    where, node = patch.where, patch.node
    assign = module.top(patch.target, (ast.Assign, ast.AnnAssign))
    display = assign.value
    if not isinstance(display, ast.Dict) or not display.keys or display.end_lineno == display.keys[-1].lineno \
            or module.lines[display.end_lineno - 1].strip() != "}":
        raise ExportError(f"{where}: `{patch.target}` must be a dict display with one item a line and the "
                          "closing brace on a line of its own")
    key = node.targets[0].slice.value
    keys = [k.value if isinstance(k, ast.Constant) else None for k in display.keys]
    if key in keys:
        raise ExportError(f"{where}: `{patch.target}` already has the key {key!r}; an item is never replaced")
    indent = display.keys[0].col_offset
    at = display.end_lineno - 1
    if patch.after is not None:
        if patch.after not in keys:
            raise ExportError(f"{where}: `#| after {patch.after}`: `{patch.target}` has no key {patch.after!r}")
        at = display.values[keys.index(patch.after)].end_lineno
    source = "\n".join(patch.cell.lines)
    value_lines = ast.get_source_segment(source, node.value, padded=False).split("\n")
    value = value_lines[:1] + reindent(value_lines[1:], node.value.lineno + 1, indent, patch.cell.keep)
    key_text = ast.get_source_segment(source, node.targets[0].slice)
    entry = reindent(patch.comments, 0, indent, set()) + [" " * indent + f"{key_text}: {value[0]}"] + value[1:]
    entry[-1] += ","
    module.insert(at, entry)


APPLY = {"method": apply_method_patch, "fields": apply_fields_patch, "function": apply_function_patch,
         "item": apply_item_patch}
