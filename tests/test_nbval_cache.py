"""The website build reuses the test command's chapter runs (book/conftest.py writes them into
Jupyter Book's cache). A change that breaks the match between what nbval runs and what the website
reads would silently double CI's time; these tests fail instead."""

import html
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("jupyter_cache")
pytest.importorskip("myst_nb")
pytest.importorskip("jupyter_book")


def load_plugin():
    """book/conftest.py as a plain module (pytest loads it as a plugin only when it collects book/)."""
    spec = importlib.util.spec_from_file_location("book_conftest_for_tests", ROOT / "book" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plugin = load_plugin()


def chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf8"))
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [f for f in files if (ROOT / f).with_suffix(".ipynb").is_file()]


def hashkey(nb):
    """jupyter-cache's key, as myst-nb matches a page against the cache."""
    from jupyter_cache.cache.main import JupyterCacheBase

    with tempfile.TemporaryDirectory() as tmp:
        return JupyterCacheBase(tmp).create_hashed_notebook(nb)[1]


def test_website_build_uses_the_cache():
    assert plugin.website_cache_path(ROOT) == ROOT / "_build" / ".jupyter_cache"


def test_cells_get_the_website_builds_time_limit():
    """A cell the build would stop at its timeout must fail the test run too, since the build reuses it."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf8")
    addopts = re.search(r'^addopts = "([^"]*)"', pyproject, re.M).group(1)  # (tomllib is 3.11+)
    timeout = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))["execute"]["timeout"]
    assert f"--nbval-cell-timeout={timeout}" in addopts.split()


@pytest.fixture(scope="module")
def configs():
    return plugin.book_reader_configs(ROOT)


@pytest.mark.parametrize("chapter", chapters())
def test_chapter_runs_are_reused_by_the_website(chapter, configs):
    """The notebook nbval runs has the code cells of the page, so its run matches the page's key."""
    website_nb = plugin.read_as_website(ROOT / f"{chapter}.md", configs)
    assert website_nb is not None, "the website reads the chapter as a MyST notebook"
    tested_nb = nbformat.read(ROOT / f"{chapter}.ipynb", as_version=4)
    assert plugin.cells_mismatch(website_nb, tested_nb) is None
    n_code = sum(c.cell_type == "code" for c in website_nb.cells)
    outputs = [[nbformat.v4.new_output("stream", name="stdout", text=f"{i}\n")] for i in range(n_code)]
    cached = plugin.notebook_for_cache(website_nb, outputs, {"name": "python", "pygments_lexer": "ipython3"})
    assert hashkey(cached) == hashkey(website_nb)


def test_a_changed_cell_is_not_reused(configs):
    website_nb = plugin.read_as_website(ROOT / "book" / "02_attention.md", configs)
    tested_nb = nbformat.read(ROOT / "book" / "02_attention.ipynb", as_version=4)
    code = [c for c in tested_nb.cells if c.cell_type == "code"]
    code[3].source += "\n"
    assert plugin.cells_mismatch(website_nb, tested_nb) == "code cell 3 differs"
    code[3].source = code[3].source[:-1]
    code[3].metadata["tags"] = ["raises-exception"]
    assert plugin.cells_mismatch(website_nb, tested_nb) == "code cell 3's tags differ"


def msg(msg_type, **content):
    return {"msg_type": msg_type, "content": content, "header": {"msg_type": msg_type}, "parent_header": {}}


def test_outputs_as_nbclient_builds_them():
    """One output per stream message (not nbval's merged streams), clear_output(wait) and display updates."""
    outs, ok = plugin.outputs_from_messages([
        msg("status", execution_state="busy"),
        msg("execute_input", code="", execution_count=3),
        msg("stream", name="stdout", text="a\n"),
        msg("display_data", data={"text/plain": "x"}, metadata={"k": 1}, transient={"display_id": "d"}),
        msg("stream", name="stdout", text="b\n"),
        msg("update_display_data", data={"text/plain": "y"}, metadata={}, transient={"display_id": "d"}),
        msg("execute_result", data={"text/plain": "3"}, metadata={}, execution_count=3),
        msg("status", execution_state="idle"),
    ])
    assert ok
    assert [o.output_type for o in outs] == ["stream", "display_data", "stream", "execute_result"]
    assert [o.get("text") for o in outs if o.output_type == "stream"] == ["a\n", "b\n"]
    assert outs[1].data == {"text/plain": "y"} and outs[3].execution_count == 3
    outs, ok = plugin.outputs_from_messages([
        msg("stream", name="stdout", text="old"),
        msg("clear_output", wait=True),
        msg("stream", name="stdout", text="new"),
        msg("comm_open", comm_id="c", target_name="jupyter.widget", data={}),
    ])
    assert [o.text for o in outs] == ["new"] and not ok


TINY_HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""

TINY_CACHED = TINY_HEADER + """
# Tiny

The answer is {glue:}`answer`.

```{code-cell} ipython3
import base64
from IPython.display import Image, display
from myst_nb import glue
print("printed by the tiny chapter")
display(Image(data=base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")))
glue("answer", 6 * 7, display=False)
```

```{code-cell} ipython3
:tags: [raises-exception]

raise ValueError("shown as the page's error output")
```
"""

# Fails under nbval (book/conftest.py starts chapters with ATEN_CPU_CAPABILITY=default) and passes in
# the website build: a chapter that failed its test run must be executed by the build.
TINY_FAILED = TINY_HEADER + """
# Failed under test

```{code-cell} ipython3
import os
import re
print("executed by the website build")
assert os.environ.get("ATEN_CPU_CAPABILITY") != "default"
```
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_test_run_then_website_build(tmp_path):
    """End to end: nbval runs two tiny chapters; the build reuses the one that passed, runs the other."""
    import jupytext

    (tmp_path / "book").mkdir()
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
    tiny_config = {"title": "Tiny", "only_build_toc_files": True, "execute": config["execute"],
                   "parse": config["parse"], "sphinx": {"config": {"exclude_patterns": ["_build", ".*", "**/.*",
                                                                                      "book/*.ipynb"]}}}
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(tiny_config), encoding="utf8")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                       "  - file: book/cached\n  - file: book/failed\n", encoding="utf8")
    (tmp_path / "book" / "intro.md").write_text("# Intro\n", encoding="utf8")
    (tmp_path / "book" / "conftest.py").write_text((ROOT / "book" / "conftest.py").read_text(encoding="utf8"))
    for name, text in [("cached", TINY_CACHED), ("failed", TINY_FAILED)]:
        (tmp_path / "book" / f"{name}.md").write_text(text, encoding="utf8")
        jupytext.write(jupytext.reads(text, fmt="md:myst"), tmp_path / "book" / f"{name}.ipynb")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "BOOK_SEED", "BOOK_NBVAL_CACHE")}

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                            "book/cached.ipynb", "book/failed.ipynb"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 2 passed" in tests.stdout, tests.stdout + tests.stderr
    assert "not cached" not in tests.stdout, tests.stdout

    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    build = subprocess.run([str(jupyter_book), "build", ".", "-W", "--keep-going"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    assert "cached.md: Using cached notebook" in log, log
    assert "failed.md: Executed notebook" in log, log
    page = (tmp_path / "_build" / "html" / "book" / "cached.html").read_text(encoding="utf8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "printed by the tiny chapter" in text
    assert "ValueError: shown as the page's error output" in text
    assert "Cell In[2], line 1" in text  # the traceback, numbered as Jupyter numbers cells
    assert re.search(r'<img alt="[^"]*" src="../_images/\w+\.png"', page)  # the figure
    assert "The answer is 42." in text  # the glued value
    failed = (tmp_path / "_build" / "html" / "book" / "failed.html").read_text(encoding="utf8")
    assert "executed by the website build" in failed


@pytest.mark.parametrize("preset", [None, "avx2"], ids=["conftest's kernels", "the caller's kernels"])
def test_a_chapter_kernel_gets_a_compile_cache_of_its_kernel_set(monkeypatch, preset):
    # torch.compile's cache does not key on ATEN_CPU_CAPABILITY: scalar kernels compiled under "default" must not
    # be found by a later run on the CPU's own kernels.
    monkeypatch.delenv(plugin.INDUCTOR_CACHE_ENV, raising=False)
    if preset is None:
        monkeypatch.delenv(plugin.KERNELS_ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.KERNELS_ENV, preset)
    kernels = preset or plugin.CHAPTER_KERNELS
    hook = plugin.pytest_runtest_setup(type("Item", (), {"path": Path("book/01_x.ipynb")})())
    next(hook)  # the chapter's kernel starts here
    assert os.environ[plugin.KERNELS_ENV] == kernels
    assert os.environ[plugin.INDUCTOR_CACHE_ENV] == plugin.inductor_cache_dir(kernels)
    with pytest.raises(StopIteration):
        next(hook)
    assert plugin.INDUCTOR_CACHE_ENV not in os.environ and os.environ.get(plugin.KERNELS_ENV) == preset
    assert len({plugin.inductor_cache_dir(k) for k in ("default", "avx2", "avx512")}) == 3


def test_a_compile_in_the_test_process_does_not_send_chapters_to_its_cache(monkeypatch):
    # torch.compile in the pytest process (a unit test) sets TORCHINDUCTOR_CACHE_DIR to its default folder; a
    # chapter run later in the session must still get its kernel set's folder (in CI it got the default one,
    # found vectorised code compiled there on the CPU's own kernels, and failed to compile under "default").
    monkeypatch.setitem(plugin._state, "user_inductor", None)
    monkeypatch.delenv(plugin.KERNELS_ENV, raising=False)
    monkeypatch.setenv(plugin.INDUCTOR_CACHE_ENV, "/tmp/torchinductor_default_of_this_process")
    hook = plugin.pytest_runtest_setup(type("Item", (), {"path": Path("book/01_x.ipynb")})())
    next(hook)
    assert os.environ[plugin.INDUCTOR_CACHE_ENV] == plugin.inductor_cache_dir(plugin.CHAPTER_KERNELS)
    with pytest.raises(StopIteration):
        next(hook)
    assert os.environ[plugin.INDUCTOR_CACHE_ENV] == "/tmp/torchinductor_default_of_this_process"
