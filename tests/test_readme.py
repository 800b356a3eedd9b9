"""The README's commands and example are what CI runs and what works."""

import math
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(python3 -m venv [^\n]+)\n```", readme)
    assert len(commands) == 2, "the README gives two set-up commands: build the book, run the tests"
    for command in commands:
        assert command in ci.splitlines()


@pytest.mark.skipif(not os.environ.get("TRANSFORMER_LIB_DATA"), reason="needs the offline corpus")
def test_readme_library_example_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert namespace["x"].shape == namespace["y"].shape == (12, 64)
    assert namespace["logits"].shape == (12, 64, 65)
    assert abs(namespace["loss"].item() - math.log(65)) < 0.1
