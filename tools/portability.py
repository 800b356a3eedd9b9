#!/usr/bin/env python
"""Run chapters and tests under several numeric paths and report every cell or test that fails.

A trained model's numbers depend on the kernels that compute them: PyTorch dispatches its
elementwise, reduction and softmax kernels to the widest instruction set the CPU has (AVX-512,
AVX2 or none), and the number of threads changes the order of its reductions. A claim that holds
on one path only (a training run at the edge of stability, a wall-clock ratio) fails on a reader's
machine. This tool runs the same targets under a matrix of paths:

- kernels: ``ATEN_CPU_CAPABILITY`` (``native``, the CPU's own set, named explicitly, ``default``,
  ``avx2``, ``avx512``); a set the CPU lacks is reported as unavailable instead of being run;
- threads: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``;
- seeds: ``BOOK_SEED``, which the chapters whose experiments depend on the draw read for them;
- any other environment variable, with ``--env NAME=v1,v2``.

Each run is ``python -m pytest`` on one target file (a chapter's ``.md`` stands for its paired
``.ipynb``, which nbval executes), with the path in the environment. The report is a table, one
row per target and one column per path, each entry ``ok`` or the failing cells and the run's
seconds, and below it the first line of every failure.

Usage:
    python tools/portability.py book/09_training_toolkit.md book/11_seq2seq.md
    python tools/portability.py --book --threads 2,1 --jobs 2 --json portability.json
    python tools/portability.py tests/test_cli.py -k "sigint or ctrl_c" --busy 2 --repeat 3

Exit status: 0 when every run passed, 1 when a cell or test failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
SEED_ENV = "BOOK_SEED"
KERNEL_ENV = "ATEN_CPU_CAPABILITY"
THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Terminal colour codes in nbval's tracebacks, as the escape character or as JUnit XML writes it.
ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")


@dataclass(frozen=True)
class NumericPath:
    """One numeric path: the environment variables a run sets, and a short label for the table."""

    label: str
    env: tuple[tuple[str, str], ...]


@dataclass
class Outcome:
    """What one run of one target file under one path gave."""

    target: str
    path: str
    repeat: int
    seconds: float
    status: int
    # node id -> "passed" | "skipped" | first line of the failure
    results: dict[str, str] = field(default_factory=dict)

    @property
    def column(self) -> str:
        return self.path + (f" #{self.repeat + 1}" if self.repeat else "")

    @property
    def failures(self) -> dict[str, str]:
        return {node: why for node, why in self.results.items() if why not in ("passed", "skipped")}


def capability(kernels: str | None) -> str:
    """The kernel set PyTorch dispatches to in a process started with ``ATEN_CPU_CAPABILITY=kernels``."""
    env = {} if kernels is None else {KERNEL_ENV: kernels}
    base = {k: v for k, v in os.environ.items() if k != KERNEL_ENV}
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env={**base, **env}, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().lower()


def kernel_paths(requested: list[str]) -> tuple[list[str], list[str], str]:
    """The kernel sets to run (lower case, ``native`` resolved), those this CPU lacks, and the native one.

    ``auto`` stands for the issue's matrix: native, ``default`` and the other of avx2/avx512 where the
    CPU has it. A requested set is run only if a process started with it reports that set: asking
    for AVX-512 on an AVX2 CPU silently gives AVX2, which would repeat the native column.
    """
    native = capability(None)
    if requested == ["auto"]:
        requested = ["native", "default"] + [k for k in ("avx2", "avx512") if k != native]
    run, missing = [], []
    for name in requested:
        name = native if name == "native" else name.lower()
        if name in run or name in missing:
            continue
        (run if capability(name) == name else missing).append(name)
    return run, missing, native


def build_paths(kernels: list[str], native: str, threads: list[str], extra: dict[str, list[str]]) -> list[NumericPath]:
    """Every combination of kernel set, thread count and extra variable, as labelled environments."""
    names = list(extra)
    paths = []
    for kernel, thread, *values in itertools.product(kernels, threads, *(extra[n] for n in names)):
        env = [(KERNEL_ENV, kernel)] + [(t, thread) for t in THREAD_ENVS] + list(zip(names, values))
        label = "/".join([kernel + ("*" if kernel == native else ""), f"{thread}t"]
                         + [f"{'seed' if n == SEED_ENV else n}={v}" for n, v in zip(names, values)])
        paths.append(NumericPath(label, tuple(env)))
    return paths


def resolve_targets(targets: list[str], book: bool) -> dict[str, list[str]]:
    """Target file -> the node ids to run in it; a chapter's ``.md`` becomes its paired ``.ipynb``."""
    out: dict[str, list[str]] = {}
    if book:
        for chapter in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
            out.setdefault(os.path.relpath(chapter, ROOT), [])
    for target in targets:
        file, sep, rest = target.partition("::")
        path = Path(file)
        if path.suffix == ".md" and path.parent.name == "book":
            path = path.with_suffix(".ipynb")
        if not (ROOT / path).exists():
            raise SystemExit(f"portability.py: error: target {target!r}: no such file or folder {path}")
        nodes = out.setdefault(str(path), [])
        if sep and (not nodes or nodes[0] != str(path)):
            nodes.append(str(path) + sep + rest)
        elif not sep:
            nodes[:] = [str(path)]  # the whole file
    if not out:
        raise SystemExit("portability.py: error: no targets: name chapters or tests, or give --book")
    return {file: nodes or [file] for file, nodes in out.items()}


def first_line(text: str) -> str:
    """The line of a failure that says what went wrong: the last ``...Error: ...`` line, else the first line."""
    text = ANSI.sub("", text or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt", "Exit")) and " " not in head.strip("E> "):
            return line.lstrip("E> ")[:200]
    return lines[0][:200] if lines else "failed"


def read_junit(path: Path) -> dict[str, str]:
    """node id -> "passed" / "skipped" / the failure's first line, from pytest's JUnit XML."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = f"{case.get('file') or case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = first_line(child.text or child.get("message", ""))
                break
            if child.tag == "skipped":
                outcome = "skipped"
        results[node] = outcome
    return results


class Processes:
    """The runs under way, each in its own session, so that an interrupted tool leaves none behind."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.closed = False

    def start(self, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        with self.lock:
            if self.closed:
                raise RuntimeError("stopping")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            self.running.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.running.discard(proc)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # pytest and the notebook kernels it started
        except ProcessLookupError:
            pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for proc in self.running:
                self.kill(proc)


def run_one(processes: Processes, target: str, nodes: list[str], path: NumericPath, repeat: int,
            pytest_args: list[str], timeout: float) -> Outcome:
    """``python -m pytest NODES`` with the path's environment; what each cell or test gave."""
    # BOOK_NBVAL_CACHE=0: these runs' outputs are not the website's (book/conftest.py would cache them).
    env = {**os.environ, **dict(path.env), "BOOK_NBVAL_CACHE": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
               f"--rootdir={ROOT}", f"--junitxml={xml}", "-o", "junit_family=xunit1", *pytest_args, *nodes]
        start = time.perf_counter()
        proc = processes.start(cmd, env)
        try:
            log, _ = proc.communicate(timeout=timeout)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            processes.kill(proc)
            log, _ = proc.communicate()
            status, log = -1, f"TimeoutError: no result after {timeout:g} s\n{log}"
        finally:
            processes.done(proc)
        seconds = time.perf_counter() - start
        results = read_junit(xml) if xml.exists() else {}
    if status not in (0, 1) and not any(r not in ("passed", "skipped") for r in results.values()):
        results["(run)"] = f"pytest exit status {status}: {first_line(log)}"
    return Outcome(target, path.label, repeat, seconds, status, results)


class Busy:
    """``n`` CPU-bound processes beside the runs, as a loaded machine has (``--busy``)."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
            proc.wait()


def report(outcomes: list[Outcome], targets: list[str], missing: list[str], native: str) -> str:
    """The table (rows: target files, columns: paths) and the failures under it, as Markdown.

    An entry is ``ok`` (every cell or test passed or was skipped), ``FAIL`` with the failing cells
    or tests, or ``ERROR`` when the run gave no result, then the run's wall time in seconds.
    """
    columns = list(dict.fromkeys(o.column for o in outcomes))
    table: dict[tuple[str, str], str] = {}
    for o in outcomes:
        failed = [node.split("::", 1)[-1] for node in o.failures if node != "(run)"]
        verdict = ("ERROR" if "(run)" in o.results or not o.results else
                   f"FAIL {', '.join(failed)}" if failed else f"ok ({len(o.results)})")
        table[o.target, o.column] = f"{verdict}, {o.seconds:.0f} s"
    lines = [f"Native kernel set: {native} (marked *)."
             + (f" Not on this CPU, not run: {', '.join(missing)}." if missing else ""), "",
             "| target | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {t} | " + " | ".join(table.get((t, c), "") for c in columns) + " |" for t in targets]
    failures = [f"- {o.column}: {node}: {why}" for o in outcomes for node, why in o.failures.items()]
    return "\n".join(lines + (["", "Failures:", *failures] if failures else []))


def parse_env(values: list[str]) -> dict[str, list[str]]:
    out = {}
    for item in values:
        name, sep, rest = item.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"portability.py: error: --env expects NAME=v1,v2,..., got {item!r}")
        out[name] = rest.split(",")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*",
                        help="chapters (book/NN_name.md or .ipynb), test files or folders, or node ids")
    parser.add_argument("--book", action="store_true", help="every chapter of the book")
    parser.add_argument("--kernels", default="auto",
                        help="comma-separated ATEN_CPU_CAPABILITY values, 'native' for the CPU's own set; "
                             "'auto' (default): native, default, and avx2 or avx512 where the CPU has it")
    parser.add_argument("--threads", default="2", help="comma-separated thread counts (default: 2)")
    parser.add_argument("--seeds", default="", help=f"comma-separated values of {SEED_ENV} (chapters that take one)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=v1,v2",
                        help="another environment variable to vary (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="run each path this many times (default: 1)")
    parser.add_argument("--busy", type=int, default=0,
                        help="keep this many CPU-bound processes running beside the runs (default: 0)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default: 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run of one target (default: 1800)")
    parser.add_argument("-k", dest="keyword", help="passed to pytest: run only tests matching this expression")
    parser.add_argument("--json", type=Path, help="also write every outcome to this file")
    args = parser.parse_args(argv)

    for name in ("repeat", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.busy < 0:
        parser.error(f"--busy must be 0 or more, got {args.busy}")
    threads = [t.strip() for t in args.threads.split(",") if t.strip()]
    if not threads or not all(t.isdigit() and int(t) > 0 for t in threads):
        parser.error(f"--threads expects positive integers separated by commas, got {args.threads!r}")
    targets = resolve_targets(args.targets, args.book)
    extra = parse_env(args.env)
    if args.seeds:
        extra[SEED_ENV] = [s.strip() for s in args.seeds.split(",")]
    kernels, missing, native = kernel_paths([k.strip() for k in args.kernels.split(",") if k.strip()])
    if not kernels:
        parser.error(f"--kernels {args.kernels}: none of these kernel sets runs on this CPU (native: {native})")
    stale = subprocess.run([sys.executable, str(ROOT / "tools" / "export.py"), "--check"], cwd=ROOT,
                           capture_output=True, text=True)
    if stale.returncode != 0:
        print("portability.py: warning: the notebooks or the package differ from the chapters; "
              "run python tools/export.py first:\n" + stale.stderr.strip(), file=sys.stderr)
    paths = build_paths(kernels, native, threads, extra)
    pytest_args = ["-k", args.keyword] if args.keyword else []
    jobs = [(t, p, r) for r in range(args.repeat) for p in paths for t in targets]
    print(f"{len(jobs)} run(s): {len(targets)} target(s) x {len(paths)} path(s) x {args.repeat}, "
          f"{args.jobs} at a time" + (f", beside {args.busy} busy process(es)" if args.busy else ""),
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the runs
    processes, outcomes = Processes(), []
    try:
        with Busy(args.busy), concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_one, processes, t, targets[t], p, r, pytest_args, args.timeout)
                       for t, p, r in jobs]
            for future in concurrent.futures.as_completed(futures):
                o = future.result()
                outcomes.append(o)
                print(f"  {o.target} {o.column}: {len(o.failures)} failed of {len(o.results)} in {o.seconds:.0f} s",
                      file=sys.stderr, flush=True)
    finally:
        processes.close()
    print(report(outcomes, list(targets), missing, native))
    if args.json:
        args.json.write_text(json.dumps({"native": native, "missing": missing, "targets": targets,
                                         "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    return 0 if all(not o.failures and o.status == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
