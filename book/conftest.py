"""The test command runs the chapters on another numeric path than the website build.

PyTorch computes its elementwise, reduction and softmax kernels with the widest instruction set the
CPU has (AVX-512, AVX2, ...), so a trained model's numbers differ in their last digits from one
machine to the next, and a claim that holds on one kernel path only fails on a reader's machine.
The website build executes every chapter with the CPU's own kernels; under pytest, nbval starts
each chapter's kernel with ``ATEN_CPU_CAPABILITY=default``, the portable kernels every CPU has.
A claim tied to one path then fails CI wherever CI runs. Set ``ATEN_CPU_CAPABILITY`` yourself to
run the chapters on another path; ``tools/portability.py`` runs a whole matrix of them.
"""

import os
import tempfile

import pytest

KERNELS_ENV = "ATEN_CPU_CAPABILITY"
CHAPTER_KERNELS = "default"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start a chapter's kernel (nbval does it when the chapter's first cell is set up) on the portable kernels,
    with torch.compile's cache in a folder of that kernel set's own (``INDUCTOR_CACHE_ENV``)."""
    if item.path.suffix != ".ipynb":
        yield
        return
    ours = {} if KERNELS_ENV in os.environ else {KERNELS_ENV: CHAPTER_KERNELS}
    # Only a cache folder the user set before the run is kept: torch.compile in this process (a unit test)
    # sets TORCHINDUCTOR_CACHE_DIR to its default folder for its workers, which would send the chapters there.
    if _state.get("user_inductor") is None:
        ours[INDUCTOR_CACHE_ENV] = inductor_cache_dir(ours.get(KERNELS_ENV, os.environ.get(KERNELS_ENV)))
    before = {name: os.environ.get(name) for name in ours}
    os.environ.update(ours)
    try:
        yield
    finally:
        for name, value in before.items():  # the kernel has started; the process gets its variables back
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


# torch.compile's C++ kernels follow ATEN_CPU_CAPABILITY (scalar code under "default"), but PyTorch 2.13's
# compile cache (TORCHINDUCTOR_CACHE_DIR, by default one folder per user) does not key on it: a chapter
# compiled here would leave scalar kernels that a later run on the CPU's own kernels loads, and runs slower
# (measured: 178 steps in 20 s of the speedrun against 257 with a cache of its own). Each kernel set keeps
# its own folder.
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir(kernels: str) -> str:
    """The compile cache folder of chapters run with ``ATEN_CPU_CAPABILITY=kernels``."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_aten_{kernels}")


# --------------------------------------------------------------------------------------------------
# The website build reuses this run. When every cell of a chapter passed, the executed notebook goes
# into Jupyter Book's execution cache (jupyter-cache, `_build/.jupyter_cache`), keyed as myst-nb keys
# it: an md5 over the code cells' sources and metadata and the kernelspec of the chapter's `.md` as
# the website build reads it. `_config.yml` executes with `execute_notebooks: cache`, so the next
# `jupyter-book build` in this checkout finds the chapter ("Using cached notebook") instead of
# executing it again; a chapter whose code changed since, or that failed here, is executed as before.
# --------------------------------------------------------------------------------------------------

import time  # noqa: E402
from pathlib import Path  # noqa: E402

BOOK_DIR = Path(__file__).absolute().parent
ROOT = BOOK_DIR.parent
CACHE_ENV = "BOOK_NBVAL_CACHE"  # "0": never write the website's cache (tools/portability.py sets it)
SEED_ENV = "BOOK_SEED"  # another seed than the page's: its outputs are not the page's

_state = {"checked": False, "cache_path": None, "reason": None, "book_config": None}


def pytest_configure(config):
    """Note, before any kernel starts, whether this run's outputs may stand for the website's."""
    _state["user_kernels"] = KERNELS_ENV in os.environ
    _state["user_seed"] = SEED_ENV in os.environ
    _state["user_inductor"] = os.environ.get(INDUCTOR_CACHE_ENV)


def website_cache_path(root=ROOT):
    """The jupyter-cache folder the website build uses, or None when it does not execute with `cache`."""
    import yaml

    config_file = Path(root) / "_config.yml"
    if not config_file.is_file():
        return None
    execute = (yaml.safe_load(config_file.read_text(encoding="utf8")) or {}).get("execute") or {}
    if execute.get("execute_notebooks") != "cache":
        return None
    # myst-nb's default: next to the HTML output folder (`_build/html`), see myst_nb/sphinx_ext.py.
    return (Path(root) / execute["cache"]) if execute.get("cache") else Path(root) / "_build" / ".jupyter_cache"


def _cache_path():
    """The cache to write, or None (and why not) for this run; decided once per session."""
    if not _state["checked"]:
        _state["checked"] = True
        try:
            import jupyter_cache  # noqa: F401
            import jupyter_book  # noqa: F401
            import myst_nb  # noqa: F401
        except ImportError:
            _state["reason"] = "jupyter-cache, myst-nb or jupyter-book is not installed"
        else:
            if os.environ.get(CACHE_ENV) == "0":
                _state["reason"] = f"{CACHE_ENV}=0"
            elif _state.get("user_kernels") or _state.get("user_seed"):
                _state["reason"] = f"{KERNELS_ENV} or {SEED_ENV} set: not the outputs the page shows"
            else:
                _state["cache_path"] = website_cache_path()
    return _state["cache_path"]


def book_reader_configs(root=ROOT):
    """myst-nb's and myst-parser's configurations as `jupyter-book build` passes them to Sphinx."""
    from jupyter_book.config import get_final_config
    from myst_nb.core.config import NbParserConfig
    from myst_parser.config.main import MdParserConfig

    sphinx_config, _ = get_final_config(
        user_yaml=Path(root) / "_config.yml",
        cli_config={"latex_individualpages": False},  # what the `build` command passes
        sourcedir=Path(root),
    )
    md_values = {
        name: sphinx_config[f"myst_{name}"]
        for name, _, field in MdParserConfig().as_triple()
        if "sphinx" not in field.metadata.get("omit", []) and f"myst_{name}" in sphinx_config
    }
    nb_values = {
        name: sphinx_config[f"nb_{name}"]
        for name, _, field in NbParserConfig().as_triple()
        if not field.metadata.get("sphinx_exclude") and f"nb_{name}" in sphinx_config
    }
    return MdParserConfig(**md_values), NbParserConfig(**nb_values)


def read_as_website(md_path, configs=None):
    """The chapter's notebook exactly as the website build reads it (myst_nb/sphinx_.py: parse)."""
    import re

    from myst_nb.core.read import create_nb_reader

    md_path = Path(md_path).absolute()
    md_config, nb_config = configs or book_reader_configs(md_path.parent.parent)
    text = md_path.read_text(encoding="utf8")
    reader = create_nb_reader(str(md_path), md_config, nb_config, text)
    if reader is None:
        return None
    notebook = reader.read(text)
    kernel_name = notebook.metadata.get("kernelspec", {}).get("name", None)
    if kernel_name is not None and nb_config.kernel_rgx_aliases:
        for rgx, alias in nb_config.kernel_rgx_aliases.items():
            if re.fullmatch(rgx, kernel_name):
                notebook.metadata["kernelspec"]["name"] = alias
                break
    return notebook


def _tags(cell):
    return list(cell.get("metadata", {}).get("tags", []))


def cells_mismatch(website_nb, tested_nb):
    """Why the code cells nbval ran are not those the website executes, or None when they are.

    The sources must be the same in the same order, and so must the tags (``raises-exception``
    decides whether an error passes in both runners). A cell the website would not execute
    (``skip-execution``) also rules the chapter out: nbval ran it, so later outputs may differ.
    """
    website = [c for c in website_nb.cells if c.cell_type == "code"]
    tested = [c for c in tested_nb.cells if c.cell_type == "code"]
    if len(website) != len(tested):
        return f"{len(website)} code cells in the .md, {len(tested)} in the notebook"
    for i, (a, b) in enumerate(zip(website, tested)):
        if a.source != b.source:
            return f"code cell {i} differs"
        if _tags(a) != _tags(b):
            return f"code cell {i}'s tags differ"
        if "skip-execution" in _tags(a):
            return f"code cell {i} is tagged skip-execution"
    return None


def outputs_from_messages(messages, display_map=None):
    """A cell's outputs from its iopub messages, as nbclient builds them (nbclient/client.py: output).

    One output per stream message, as nbclient keeps them (nbval's own ``test_outputs`` merges all
    streams of a name, which reorders them); ``clear_output`` and display updates are applied.
    Returns (outputs, ok); ok is False for messages nbclient would turn into something else (widgets).
    """
    from nbformat.v4 import output_from_msg

    outs, clear_next, ok = [], False, True
    display_map = {} if display_map is None else display_map
    for msg in messages:
        msg_type, content = msg["msg_type"], msg["content"]
        transient = content.get("transient")
        display_id = transient.get("display_id") if transient else None
        if msg_type in ("status", "execute_input", "execute_reply"):
            continue
        if msg_type.startswith("comm"):
            ok = False  # a widget: nbclient records its state in the notebook's metadata
            continue
        if msg_type == "clear_output":
            if content.get("wait"):
                clear_next = True
            else:
                outs[:] = []
            continue
        if msg_type == "update_display_data":
            for out in display_map.get(display_id, []):
                out["data"], out["metadata"] = content["data"], content["metadata"]
            continue
        try:
            out = output_from_msg(msg)
        except ValueError:
            continue  # nbclient logs "unhandled iopub msg" and drops it
        if clear_next:
            outs[:] = []
            clear_next = False
        if display_id and msg_type in ("display_data", "execute_result"):
            display_map.setdefault(display_id, []).append(out)
        outs.append(out)
    return outs, ok


def notebook_for_cache(website_nb, cell_outputs, language_info=None):
    """The website's notebook with each code cell's outputs and execution count, as nbclient leaves it."""
    import copy

    nb = copy.deepcopy(website_nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == len(cell_outputs), "one list of outputs per code cell"
    for count, (cell, outputs) in enumerate(zip(code, cell_outputs), start=1):
        cell.outputs = outputs
        cell.execution_count = count
    if language_info:
        nb.metadata["language_info"] = language_info
    return nb


class _ChapterRecorder:
    """Records the iopub messages of each cell nbval runs in one chapter's kernel."""

    def __init__(self, nbfile, cache_path, md_path):
        self.nbfile, self.cache_path, self.md_path = nbfile, cache_path, md_path
        self.n_code = sum(c.cell_type == "code" for c in nbfile.nb.cells)
        self.outputs, self.display_map = [], {}
        self.broken, self.ok, self.seconds = False, True, 0.0
        self.msg_id, self.messages = None, []
        kernel = nbfile.kernel
        get_message = nbfile.get_kernel_message

        def execute_cell_input(cell_input, allow_stdin=None):
            # As Jupyter and the website build run a cell: into the history, so that execution
            # counts (and "Cell In[n]" in tracebacks) go 1, 2, 3 ... as in an executed notebook.
            self.msg_id = kernel.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin,
                                            stop_on_error=False)
            return self.msg_id

        def get_kernel_message(timeout=None, stream="iopub"):
            msg = get_message(timeout=timeout, stream=stream)
            if stream == "iopub" and self.msg_id and msg["parent_header"].get("msg_id") == self.msg_id:
                self.messages.append(msg)
            return msg

        kernel.execute_cell_input = execute_cell_input
        nbfile.get_kernel_message = get_kernel_message

    def cell_done(self, item, passed, seconds):
        """Keep a passed cell's outputs; returns True when the whole chapter has now passed."""
        if self.broken or not passed or item.cell_num != len(self.outputs):
            self.broken = True
            return False
        outs, ok = outputs_from_messages(self.messages, self.display_map)
        self.ok &= ok
        self.outputs.append(outs)
        self.seconds += seconds
        self.msg_id, self.messages = None, []
        return len(self.outputs) == self.n_code

    def language_info(self):
        """The kernel's language_info, as nbclient copies it into the notebook's metadata."""
        reply = self.nbfile.kernel.kc.kernel_info(reply=True, timeout=10)
        return reply["content"].get("language_info")

    def store(self):
        """Write the chapter into the website's cache; returns why not, or None."""
        if not self.ok:
            return "it displays widgets"
        from jupyter_cache import get_cache
        from jupyter_cache.base import CacheBundleIn

        if _state["book_config"] is None:
            _state["book_config"] = book_reader_configs(ROOT)
        website_nb = read_as_website(self.md_path, _state["book_config"])
        if website_nb is None:
            return f"{self.md_path.name} is not a MyST notebook"
        why = cells_mismatch(website_nb, self.nbfile.nb)
        if why:
            return f"{why} between {self.md_path.name} and the notebook (run tools/export.py)"
        nb = notebook_for_cache(website_nb, self.outputs, self.language_info())
        cache = get_cache(str(self.cache_path))
        cache.cache_notebook_bundle(
            CacheBundleIn(nb, str(self.md_path), data={"execution_seconds": self.seconds}),
            check_validity=False,
            overwrite=True,
        )
        return None


def _recorder(item):
    """The recorder of the item's chapter, or None if this cell is not one to record."""
    nbfile = item.parent
    rec = getattr(nbfile, "_website_cache_recorder", None)
    if rec is not None:
        return rec
    if item.path.suffix != ".ipynb" or not hasattr(item, "cell_num") or getattr(nbfile, "kernel", None) is None:
        return None
    if item.path.absolute().parent != BOOK_DIR or getattr(nbfile, "_website_cache_off", False):
        return None
    md_path = item.path.with_suffix(".md").absolute()
    cache_path = _cache_path()
    if cache_path is None or not md_path.is_file():
        nbfile._website_cache_off = True
        return None
    rec = nbfile._website_cache_recorder = _ChapterRecorder(nbfile, cache_path, md_path)
    return rec


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Record each chapter cell's outputs; after the last cell of a chapter that passed, cache it."""
    rec = _recorder(item)
    start = time.perf_counter()
    outcome = yield
    if rec is None:
        return
    try:
        if rec.cell_done(item, outcome.excinfo is None, time.perf_counter() - start):
            why = rec.store()
            if why:
                item.warn(pytest.PytestWarning(f"not cached for the website build: {why}"))
    except Exception as exc:  # the cache is an optimisation: never fail a test over it
        item.warn(pytest.PytestWarning(f"not cached for the website build: {exc!r}"))
