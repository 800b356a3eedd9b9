"""tools/portability.py: chapters and tests run under a matrix of numeric paths, failing cells reported."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "portability.py"
spec = importlib.util.spec_from_file_location("portability", TOOL)
portability = sys.modules["portability"] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
spec.loader.exec_module(portability)

# Cell 0 checks that the run got the path it asked for; cell 1 fails for one seed only.
PROBE_CELLS = [
    "import os, torch\n"
    "assert torch.backends.cpu.get_cpu_capability().lower() == os.environ['ATEN_CPU_CAPABILITY']\n"
    "assert torch.get_num_threads() == int(os.environ['OMP_NUM_THREADS'])",
    "assert os.environ['BOOK_SEED'] != '1', 'a claim that seed 1 breaks'",
]


def write_probe(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in PROBE_CELLS]
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.subprocess
def test_each_run_gets_its_path_and_a_failing_cell_is_reported(tmp_path):
    probe = write_probe(tmp_path / "probe.ipynb")
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, str(TOOL), str(probe), "--kernels", "native,default", "--threads", "1",
                          "--seeds", "0,1", "--jobs", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr  # seed 1 fails
    outcomes = json.loads(out.read_text())["outcomes"]
    assert len(outcomes) == 4  # {native, default} x 1 thread x {seed 0, seed 1}
    for o in outcomes:
        failed = [node.split("::")[-1] for node, why in o["results"].items() if why not in ("passed", "skipped")]
        assert len(o["results"]) == 2 and failed == (["Cell 1"] if o["path"].endswith("seed=1") else []), o
    assert "FAIL Cell 1" in run.stdout and "a claim that seed 1 breaks" in run.stdout
    assert "default/1t/seed=0" in run.stdout and "*/1t/seed=0" in run.stdout  # the native column is marked


def test_a_kernel_set_the_cpu_lacks_is_not_run():
    run, missing, native = portability.kernel_paths(["native", "default", "no-such-set"])
    assert run[0] == native and "default" in run and missing == ["no-such-set"]


def test_a_chapter_source_stands_for_its_notebook():
    targets = portability.resolve_targets(["book/01_text_to_tensors.md", "tests/test_checks.py::test_x"], False)
    assert targets == {"book/01_text_to_tensors.ipynb": ["book/01_text_to_tensors.ipynb"],
                       "tests/test_checks.py": ["tests/test_checks.py::test_x"]}
    with pytest.raises(SystemExit, match="no such file"):
        portability.resolve_targets(["book/99_missing.md"], False)


def test_the_line_that_names_the_failure_is_reported():
    log = "cell source\nTraceback (most recent call last):\n  File x\nE   AssertionError: (2568, 1.7687)\nmore"
    assert portability.first_line(log) == "AssertionError: (2568, 1.7687)"
    assert portability.first_line("#x1B[31mAssertionError#x1B[39m: seed 1") == "AssertionError: seed 1"  # nbval's colours
    assert portability.first_line("") == "failed"
