"""Tests of the command line (chapter 16): `python -m transformer_lib train|generate`, in-process and as a process.

The bad invocations are one table (``CASES``): each row is an argv, a setup that prepares files, the
exit status (2 bad arguments, 1 a failed run) and a fragment that the single stderr line must hold.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

import transformer_lib
import transformer_lib.cli
import transformer_lib.rundir
import transformer_lib.training
from transformer_lib.cli import TRAIN_FLAGS, TRAIN_PRESET, build_parser, main
from transformer_lib.cli_common import DEBUG_ENV, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CLIError, UsageError
from transformer_lib.checkpoint import load_checkpoint
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.data import CharTokenizer, train_val_split
from transformer_lib.evaluate import evaluate_split
from transformer_lib.gpt import GPT
from transformer_lib.rundir import CHECKPOINT_FILE, METRICS_FILE, RUN_FILE, RUN_FORMAT, TOKENIZER_FILE

# A small text with a fixed vocabulary: 4000 characters, so the tiny preset's block of 16 fits easily.
TEXT = "".join(f"To be, or not to be ({i % 17}): that is the question!\n" for i in range(80))[:4000]
# On the CPU even on a GPU machine: exact resume checks need deterministic kernels.
FAST = ["--preset", "tiny", "--warmup-steps", "2", "--eval-interval", "4", "--no-progress", "--batch-size", "4",
        "--device", "cpu"]


# Generous limits for processes, which a loaded machine starts and runs slowly; the tests wait on
# events (a file, a line of output), never on a fixed sleep.
PROCESS_TIMEOUT = 300
# The prefix of a command started with SIGINT ignored, as a shell script starts `cmd &` (no job
# control): the ignored disposition survives exec, and Python then installs no handler of its own.
SIGINT_IGNORED = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


@pytest.fixture(params=["default", "ignored"])
def sigint_at_start(request):
    """The test runs with SIGINT as a terminal starts a command (Python's handler) and as a script's
    `cmd &` starts it (ignored); the yielded value is the prefix that starts a process so."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler if request.param == "default"
                             else signal.SIG_IGN)
    yield [] if request.param == "default" else SIGINT_IGNORED
    signal.signal(signal.SIGINT, previous)


def cli(*args, timeout=PROCESS_TIMEOUT, **kwargs):
    return subprocess.run([sys.executable, "-m", "transformer_lib", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def run_main(capsys, *args) -> tuple[int, str, str]:
    status = main([*map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def data_file(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def _finished_run_template(tmp_path_factory) -> tuple[Path, Path]:
    """One small trained run per module (4 steps of the tiny preset), copied by the tests that need one."""
    root = tmp_path_factory.mktemp("template")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(root / "text.txt"), "--out", str(root / "run"), "--max-steps", "4", *FAST]) == 0
    return root / "text.txt", root / "run"


@pytest.fixture
def finished_run(_finished_run_template, tmp_path, data_file, capsys) -> Path:
    """A copy of a finished 4-step run on ``data_file``'s text (its run.json names the template's copy)."""
    out = tmp_path / "run"
    shutil.copytree(_finished_run_template[1], out)
    capsys.readouterr()
    return out


def _assert_one_line_error(status, err, *needles, expected=EXIT_USAGE, out=""):
    """Exit status ``expected``, exactly one non-empty line on stderr naming ``needles``, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == expected, (status, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("transformer_lib") and ": error: " in lines[0], err
    assert "Traceback" not in err and "Traceback" not in out, err
    for needle in needles:
        assert needle in lines[0], (needle, err)


# ---------------------------------------------------------------- help and entry point
@pytest.mark.subprocess
def test_help_through_python_dash_m():
    result = cli("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: transformer_lib")
    assert "train" in result.stdout and result.stderr == ""


def test_train_help_in_process(capsys):
    status, out, _ = run_main(capsys, "train", "--help")
    assert status == 0
    for flag in ("--data", "--out", "--preset", "--config", "--max-steps", "--resume", "--device"):
        assert flag in out


def test_help_documents_exit_statuses_and_debugging(capsys):
    for command in ([], ["train"], ["generate"]):
        status, out, _ = run_main(capsys, *command, "--help")
        text = " ".join(out.split())
        assert status == 0 and "Exit status: 0 done, 1 the run failed" in text and "2 bad arguments" in text
        assert f"{DEBUG_ENV}=1" in text


def test_cli_names_are_not_reexported_from_the_package():
    assert not hasattr(transformer_lib, "main") and not hasattr(transformer_lib, "build_parser")
    assert "main" not in transformer_lib.__all__


def test_error_classes_carry_their_status():
    assert CLIError("x").status == EXIT_FAILURE == 1
    assert UsageError("x").status == EXIT_USAGE == 2 and issubclass(UsageError, CLIError)


def test_parser_defaults_are_chapter_10s_recipe(capsys):
    args = build_parser().parse_args(["train", "--data", "x", "--out", "y"])
    assert args.max_steps is None and args.lr is None and args.preset is None  # None: "not given"
    assert TRAIN_PRESET == "shakespeare-baby"  # one source of the numbers: TrainConfig's preset
    defaults = TrainConfig.from_preset(TRAIN_PRESET)
    assert (defaults.lr, defaults.min_lr, defaults.batch_size, defaults.warmup_steps) == (4e-3, 4e-5, 12, 50)
    assert set(TRAIN_FLAGS) <= set(defaults.to_dict())
    assert main(["train", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"peak learning rate (default: {defaults.lr:g})" in help_text
    assert f"optimizer steps (default: {defaults.max_steps})" in help_text


# ---------------------------------------------------------------- a successful run
@pytest.mark.subprocess
def test_train_writes_a_self_contained_run_directory(tmp_path, data_file):
    out = tmp_path / "run"
    result = cli("train", "--data", data_file, "--out", out, "--max-steps", 8, *FAST)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([CHECKPOINT_FILE, METRICS_FILE, RUN_FILE, TOKENIZER_FILE])
    records = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 4, 8]
    last = records[-1]
    assert f"train loss {last['train_loss']:.4f}" in result.stdout and f"val loss {last['val_loss']:.4f}" in result.stdout
    assert "8 of 8 steps in float32:" in result.stdout  # the precision it trained in
    assert str(out) in result.stdout and "Traceback" not in result.stderr
    ckpt = load_checkpoint(out / CHECKPOINT_FILE)
    tok = CharTokenizer.load(out / TOKENIZER_FILE)
    assert tok.chars == CharTokenizer.from_text(TEXT).chars
    assert ckpt["step"] == 8 and ckpt["model_config"]["vocab_size"] == tok.vocab_size
    stored = TrainConfig.from_dict(ckpt["train_config"])
    flags = dict(batch_size=4, warmup_steps=2, eval_interval=4, checkpoint_interval=4, max_steps=8)
    assert stored == TrainConfig.from_preset(TRAIN_PRESET, **flags)  # the preset with the flags given
    run = json.loads((out / RUN_FILE).read_text())
    assert run["format"] == RUN_FORMAT
    assert run["data"] == str(data_file.resolve()) and len(run["data_sha256"]) == 64


def test_precision_flag_reaches_the_train_config(tmp_path, data_file, capsys):
    out = tmp_path / "run"
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", out, "--max-steps", 4, *FAST,
                              "--precision", "bfloat16")
    assert status == 0, err
    assert load_checkpoint(out / "ckpt.pt")["train_config"]["precision"] == "bfloat16"


def test_defaults_are_the_preset(tmp_path, data_file, monkeypatch):
    class Captured(BaseException):  # not an Exception: main's last resort must let it through
        pass

    def train(model, train_data, val_data, config, **kwargs):  # record the configuration, train nothing
        raise Captured(config)

    monkeypatch.setattr(transformer_lib.cli, "train", train)
    with pytest.raises(Captured) as caught:
        main(["train", "--data", str(data_file), "--out", str(tmp_path / "run"), "--device", "cpu"])
    assert caught.value.args[0] == TrainConfig.from_preset(TRAIN_PRESET)


def test_config_file_sets_the_model(tmp_path, data_file, capsys):
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8}))
    args = ["train", "--data", data_file, "--out", tmp_path / "run", "--config", config, "--max-steps", 3,
            "--warmup-steps", 1, "--no-progress"]
    status, _, err = run_main(capsys, *args)
    assert status == 0, err
    stored = load_checkpoint(tmp_path / "run" / "ckpt.pt")["model_config"]
    assert (stored["n_layer"], stored["n_embd"], stored["block_size"]) == (1, 16, 8)
    assert stored["vocab_size"] == len(set(TEXT))


@pytest.mark.slow
@pytest.mark.subprocess
def test_train_under_torchrun_matches_one_process_with_the_global_batch(tmp_path, data_file, capsys):
    """Chapter 16's claim: the command runs unchanged under torchrun (2 gloo processes on the CPU).

    2 processes x --batch-size 4 against 1 process x --batch-size 8, 4 steps of the tiny GPT without
    biases: weights to atol 1e-6 and losses to 1e-5, as tests/test_training.py's DDP test argues (its
    docstring gives the tolerance and why the biases are left out). Only rank 0 prints and writes.
    """
    config = tmp_path / "model.json"
    fields = GPTConfig.from_preset("tiny", bias=False).to_dict()
    config.write_text(json.dumps({k: v for k, v in fields.items() if k != "vocab_size"}))
    args = ["train", "--data", data_file, "--config", config, "--max-steps", 4, *FAST[2:]]  # FAST[:2]: --preset
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={port}", "-m", "transformer_lib", *map(str, args), "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("4 of 4 steps in float32:") == 1, ddp.stdout  # rank 0 alone reports
    status, _, err = run_main(capsys, *args, "--batch-size", 8, "--out", tmp_path / "one")
    assert status == 0, err
    files = sorted([CHECKPOINT_FILE, METRICS_FILE, RUN_FILE, TOKENIZER_FILE])
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == files
    assert [json.loads(line)["step"] for line in (tmp_path / "ddp" / METRICS_FILE).read_text().splitlines()] == [0, 4]
    ckpt, single = load_checkpoint(tmp_path / "ddp" / CHECKPOINT_FILE), load_checkpoint(tmp_path / "one" / CHECKPOINT_FILE)
    assert ckpt["step"] == single["step"] == 4 and ckpt["model"].keys() == single["model"].keys()
    for name, value in single["model"].items():
        torch.testing.assert_close(ckpt["model"][name], value, atol=1e-6, rtol=0, msg=name)
    losses = [torch.tensor([h["loss"] for h in c["metrics"]["history"]]) for c in (ckpt, single)]
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- interruption and resume
def _interrupt_at(monkeypatch, step: int, signals: int = 1):
    """Send SIGINT to this process `signals` times during training step `step` (counted from 1).

    The signal is raised from inside ``torch.nn.utils.clip_grad_norm_``, which the loop calls once per
    step, between the backward pass and the optimizer update: the worst moment for an abrupt stop.
    """
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def clip_grad_norm_(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            for _ in range(signals):
                signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


@pytest.mark.slow
def test_sigint_then_resume_equals_uninterrupted(tmp_path, data_file, capsys, monkeypatch):
    common = ["--data", data_file, "--max-steps", 12, *FAST]
    status, _, err = run_main(capsys, "train", *common, "--out", tmp_path / "straight")
    assert status == 0, err
    before = signal.getsignal(signal.SIGINT)
    _interrupt_at(monkeypatch, step=6)  # training finishes step 6, then stops
    status, out, err = run_main(capsys, "train", *common, "--out", tmp_path / "cut")
    monkeypatch.undo()
    assert status == EXIT_INTERRUPTED and out == ""
    assert err.count("\n") == 1 and "interrupted after step 6 of 12" in err and "--resume" in err
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored
    assert load_checkpoint(tmp_path / "cut" / "ckpt.pt")["step"] == 6
    status, _, err = run_main(capsys, "train", *common, "--out", tmp_path / "cut", "--resume")
    assert status == 0, err
    a, b = load_checkpoint(tmp_path / "straight" / "ckpt.pt"), load_checkpoint(tmp_path / "cut" / "ckpt.pt")
    assert a["step"] == b["step"] == 12
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert [h["loss"] for h in a["metrics"]["history"]] == [h["loss"] for h in b["metrics"]["history"]]
    clock = ("elapsed", "train_time", "setup_time")
    strip = [{k: v for k, v in json.loads(line).items() if k not in clock}
             for d in ("straight", "cut") for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    assert strip[: len(strip) // 2] == strip[len(strip) // 2:]  # the same evaluations, once each


def test_second_sigint_aborts_and_keeps_the_last_checkpoint(tmp_path, data_file, capsys, monkeypatch,
                                                            sigint_at_start):
    before = signal.getsignal(signal.SIGINT)
    _interrupt_at(monkeypatch, step=7, signals=2)  # the second signal raises KeyboardInterrupt
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path, "--max-steps", 12, *FAST)
    assert signal.getsignal(signal.SIGINT) == before  # ignored stays ignored once main returns
    assert status == EXIT_INTERRUPTED and err.count("\n") == 1 and "aborted by a second Ctrl-C" in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 4  # the last periodic checkpoint, intact
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_to_a_running_process(tmp_path, data_file, sigint_at_start, signum):
    """Ctrl-C (SIGINT) and docker stop or a scheduler (SIGTERM) both stop at a step boundary with a
    checkpoint; the status is 128 + the signal's number: 130 and 143."""
    out = tmp_path / "run"
    proc = subprocess.Popen([*sigint_at_start, sys.executable, "-m", "transformer_lib", "train", "--data",
                             str(data_file), "--out", str(out), "--max-steps", "100000", *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while not (out / "ckpt.pt").exists():  # the first checkpoint: training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum == (EXIT_INTERRUPTED if signum == signal.SIGINT else 143), err
    assert err.count("\n") == 1 and "Traceback" not in err
    step = load_checkpoint(out / "ckpt.pt")["step"]
    assert f"interrupted after step {step} of 100000" in err and str(out / "ckpt.pt") in err


def test_resume_of_a_finished_run_does_nothing(finished_run, data_file, capsys):
    before = (finished_run / "ckpt.pt").read_bytes()
    status, out, _ = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--resume")
    assert status == 0 and "complete, 4 of 4 steps" in out
    assert (finished_run / "ckpt.pt").read_bytes() == before


# ---------------------------------------------------------------- generate
GEN = ["--max-new-tokens", "40", "--device", "cpu"]


def test_generate_prints_prompt_and_continuation(finished_run, capsys):
    status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To be", *GEN)
    assert status == 0, err
    assert out.startswith("To be") and out.endswith("\n")
    completion = out[len("To be"):-1]
    assert len(completion) == 40 and set(completion) <= set(TEXT)


@pytest.mark.slow
@pytest.mark.subprocess
def test_generate_same_seed_same_text_in_processes(finished_run):
    runs = [cli("generate", "--checkpoint", finished_run, "--prompt", "To", *GEN, "--seed", seed)
            for seed in (3, 3, 4)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout != runs[2].stdout


def test_generate_streams_the_tokens_of_generate(finished_run, capsys):
    """The streamed text is the text GPT.generate returns for the same seed."""
    checkpoint = load_checkpoint(finished_run / CHECKPOINT_FILE)
    model = GPT(GPTConfig.from_dict(checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    tok = CharTokenizer(json.loads((finished_run / TOKENIZER_FILE).read_text())["chars"])
    idx = torch.tensor([tok.encode("To be")])
    expected = tok.decode(model.generate(idx, 40, temperature=0.7, top_k=5,
                                         generator=torch.Generator().manual_seed(11))[0].tolist())
    status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To be", *GEN,
                                "--temperature", "0.7", "--top-k", "5", "--seed", "11")
    assert status == 0, err
    assert out == expected + "\n"


def test_generate_greedy_is_deterministic_across_seeds(finished_run, capsys):
    outs = [run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "T", *GEN,
                     "--temperature", "0", "--seed", seed)[1] for seed in ("1", "2")]
    assert outs[0] == outs[1]


def test_generate_tiny_temperature_is_greedy(finished_run, capsys):
    """A tiny positive temperature works (and, with logits far apart, picks what greedy decoding picks)."""
    greedy = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To", *GEN, "--temperature", "0")
    for temperature in ("1e-300", "5e-324"):
        status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To", *GEN,
                                    "--temperature", temperature)
        assert status == 0, err
        assert out == greedy[1]


# ---------------------------------------------------------------- bad invocations: one table
class Case(NamedTuple):
    argv: list[str]  # "{tmp}", "{data}" (TEXT) and "{run}" (a copy of a finished run) are filled in
    status: int  # 2 bad arguments, 1 a failed run
    fragment: str  # the flag or the file the one stderr line must name
    setup: Callable[[Path], None] | None = None  # prepares files under tmp (after the run is copied)
    in_process: bool = True  # False: only as a real process (`python -m transformer_lib`)


NEW = "{tmp}/new"  # the run directory of a fresh run, which no failing case may create
TRAIN = ["train", "--data", "{data}", "--out", NEW, "--max-steps", "3", "--warmup-steps", "1", "--batch-size", "2",
         "--no-progress", "--device", "cpu"]
TINY = [*TRAIN, "--preset", "tiny"]
CONFIG = [*TRAIN, "--config", "{tmp}/c.json"]
RESUME = ["train", "--data", "{data}", "--out", "{run}", "--resume", "--no-progress", "--device", "cpu"]
GENERATE = ["generate", "--checkpoint", "{run}", "--prompt", "To be", "--max-new-tokens", "5", "--device", "cpu"]
EVALUATE = ["evaluate", "--checkpoint", "{run}", "--data", "{data}", "--device", "cpu"]


def write(name: str, content: str | bytes):
    def setup(tmp: Path):
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return setup


def mkdir(name: str):
    return lambda tmp: (tmp / name).mkdir(parents=True, exist_ok=True)


def remove(name: str):
    return lambda tmp: (tmp / name).unlink()


def ckpt_bytes(change: Callable[[bytes], bytes]):
    """Replace the run's ckpt.pt by ``change(its bytes)``."""
    def setup(tmp: Path):
        path = tmp / "run" / CHECKPOINT_FILE
        path.write_bytes(change(path.read_bytes()))
    return setup


def flip_middle(raw: bytes) -> bytes:
    i = len(raw) // 2  # inside the tensors' data, the bulk of the file
    return raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]


def ckpt_edit(change: Callable[[dict], None]):
    """Load the run's ckpt.pt as a plain dict (weights_only), change it in place, save it back."""
    def setup(tmp: Path):
        path = tmp / "run" / CHECKPOINT_FILE
        checkpoint = torch.load(path, weights_only=True)
        change(checkpoint)
        torch.save(checkpoint, path)
    return setup


def reshaped(checkpoint: dict) -> None:
    name = next(iter(checkpoint["model"]))
    checkpoint["model"][name] = torch.zeros(3, 3)


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def pickle_payload(tmp: Path):
    torch.save({"format": "x", "model": Payload()}, tmp / "run" / CHECKPOINT_FILE)


def unwritable(tmp: Path):
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)


AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
GIANT = json.dumps({"n_layer": 2, "n_head": 2, "n_embd": 2**20, "block_size": 16})  # ~2.6e13 parameters

CASES = {
    # parsing: status 2
    "no command": Case([], 2, "COMMAND"),
    "unknown command": Case(["fly"], 2, "fly"),
    "train without --out": Case(["train", "--data", "{data}"], 2, "--out"),
    "generate without --prompt": Case(["generate", "--checkpoint", "{run}"], 2, "--prompt"),
    "unknown flag": Case([*TINY, "--frobnicate"], 2, "--frobnicate"),
    "unknown preset": Case([*TRAIN, "--preset", "huge"], 2, "--preset"),
    "--preset and --config": Case([*TINY, "--config", "{tmp}/c.json"], 2, "--config"),
    "unknown precision": Case([*TINY, "--precision", "half"], 2, "--precision"),
    # numeric flags of train: status 2
    "--max-steps abc": Case([*TINY, "--max-steps", "abc"], 2, "--max-steps"),
    "--max-steps 1e3": Case([*TINY, "--max-steps", "1e3"], 2, "--max-steps"),
    "--max-steps 0": Case([*TINY, "--max-steps", "0"], 2, "--max-steps"),
    "--max-steps 2**63": Case([*TINY, "--max-steps", str(2**63)], 2, "--max-steps"),
    "--max-steps 10**30": Case([*TINY, "--max-steps", str(10**30)], 2, "--max-steps"),
    "--batch-size 0": Case([*TINY, "--batch-size", "0"], 2, "--batch-size"),
    "--batch-size -4": Case([*TINY, "--batch-size", "-4"], 2, "--batch-size"),
    "--batch-size 2**63": Case([*TINY, "--batch-size", str(2**63)], 2, "--batch-size"),
    "--lr 0": Case([*TINY, "--lr", "0"], 2, "--lr"),
    "--lr -1": Case([*TINY, "--lr", "-1"], 2, "--lr"),
    "--lr inf": Case([*TINY, "--lr", "inf"], 2, "--lr"),
    "--lr nan": Case([*TINY, "--lr", "nan"], 2, "--lr"),
    "--lr abc": Case([*TINY, "--lr", "abc"], 2, "--lr"),
    "--warmup-steps -1": Case([*TINY, "--warmup-steps", "-1"], 2, "--warmup-steps"),
    "--warmup-steps 2**63": Case([*TINY, "--warmup-steps", str(2**63)], 2, "--warmup-steps"),
    "--warmup-steps >= --max-steps": Case([*TINY, "--warmup-steps", "30", "--max-steps", "20"], 2, "--warmup-steps"),
    "--max-steps below the default warm-up": Case(["train", "--data", "{data}", "--out", NEW, "--max-steps", "10"],
                                                  2, "(the default)"),
    "--eval-interval 0": Case([*TINY, "--eval-interval", "0"], 2, "--eval-interval"),
    "--eval-interval 2**63": Case([*TINY, "--eval-interval", str(2**63)], 2, "--eval-interval"),
    "--seed -5": Case([*TINY, "--seed", "-5"], 2, "--seed"),
    "--seed 2**63": Case([*TINY, "--seed", str(2**63)], 2, "--seed"),
    "--seed 10**30": Case([*TINY, "--seed", str(10**30)], 2, "--seed"),
    "--time-budget 0": Case([*TINY, "--time-budget", "0"], 2, "--time-budget"),
    "--time-budget -1": Case([*TINY, "--time-budget", "-1"], 2, "--time-budget"),
    "--time-budget nan": Case([*TINY, "--time-budget", "nan"], 2, "--time-budget"),
    "--time-budget inf": Case([*TINY, "--time-budget", "inf"], 2, "--time-budget"),
    "--time-budget abc": Case([*TINY, "--time-budget", "abc"], 2, "--time-budget"),
    "--device banana": Case([*TINY, "--device", "banana"], 2, "--device"),
    "--device meta": Case([*TINY, "--device", "meta"], 2, "--device"),
    "--device ''": Case([*TINY, "--device", ""], 2, "--device"),
    "--device cuda:-1": Case([*TINY, "--device", "cuda:-1"], 2, "--device"),
    "--device cuda:99 (absent)": Case([*TINY, "--device", "cuda:99"], 1, "cuda:99"),
    # --data: status 1
    "--data missing": Case([*TINY, "--data", "{tmp}/missing.txt"], 1, "missing.txt"),
    "--data a directory": Case([*TINY, "--data", "{tmp}"], 1, "is a directory"),
    "--data not UTF-8": Case([*TINY, "--data", "{tmp}/b.txt"], 1, "b.txt", write("b.txt", b"abc\xff\xfe")),
    "--data empty": Case([*TINY, "--data", "{tmp}/e.txt"], 1, "e.txt", write("e.txt", "")),
    "--data too short": Case([*TINY, "--data", "{tmp}/s.txt"], 1, "s.txt", write("s.txt", "short text")),
    # --config: status 1 (the file is wrong)
    "--config missing": Case(CONFIG, 1, "c.json"),
    "--config a directory": Case(CONFIG, 1, "c.json", mkdir("c.json")),
    "--config not UTF-8": Case(CONFIG, 1, "c.json", write("c.json", b'{"n_layer": "\xff"}')),
    "--config not JSON": Case(CONFIG, 1, "c.json", write("c.json", "{not json")),
    "--config a list": Case(CONFIG, 1, "c.json", write("c.json", "[1, 2]")),
    "--config n_head does not divide": Case(CONFIG, 1, "n_embd", write("c.json", '{"n_head": 3, "n_embd": 32}')),
    "--config unknown key": Case(CONFIG, 1, "n_layers", write("c.json", '{"n_layers": 2}')),
    "--config n_layer -1": Case(CONFIG, 1, "n_layer", write("c.json", '{"n_layer": -1}')),
    "--config other vocab_size": Case(CONFIG, 1, "vocab_size", write("c.json", '{"vocab_size": 100}')),
    "--config context longer than the text": Case(CONFIG, 1, "--data",
                                                  write("c.json", '{"n_layer": 1, "n_head": 1, "n_embd": 8, '
                                                                  '"block_size": 4096}')),
    "--config too large for memory": Case(CONFIG, 1, "memory", write("c.json", GIANT)),
    # --out: status 1, or 2 for a run that exists
    "--out a file": Case([*TINY, "--out", "{tmp}/f.txt"], 1, "f.txt", write("f.txt", "x")),
    "--out under a file": Case([*TINY, "--out", "{tmp}/f.txt/run"], 1, "f.txt", write("f.txt", "x")),
    "--out unwritable": pytest.param(Case([*TINY, "--out", "{tmp}/ro/run"], 1, "ro", unwritable), marks=AS_ROOT),
    "--out holds a run": Case([*TINY, "--out", "{run}"], 2, "--resume"),
    # --resume: the run's files (1), or flags that contradict the run (2)
    "--resume without a checkpoint": Case([*RESUME, "--out", "{tmp}/empty"], 1, "holds no checkpoint",
                                          mkdir("empty")),
    "--resume random bytes": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_bytes(lambda raw: os.urandom(len(raw)))),
    "--resume truncated": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_bytes(lambda raw: raw[: len(raw) // 2])),
    "--resume flipped byte": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_bytes(flip_middle)),
    "--resume without model": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.pop("model"))),
    "--resume without generator state": Case(RESUME, 1, CHECKPOINT_FILE,
                                             ckpt_edit(lambda c: c["rng"].pop("generator"))),
    "--resume without optimizer": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.pop("optimizer"))),
    "--resume string step": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.update(step="4"))),
    "--resume mis-shaped weight": Case(RESUME, 1, CHECKPOINT_FILE, ckpt_edit(reshaped)),
    "--resume without run.json": Case(RESUME, 1, RUN_FILE, remove(f"run/{RUN_FILE}")),
    "--resume foreign tokenizer": Case(RESUME, 1, TOKENIZER_FILE,
                                       lambda tmp: CharTokenizer("ab").save(tmp / "run" / TOKENIZER_FILE)),
    "--resume other text": Case([*RESUME, "--data", "{tmp}/o.txt"], 2, "--data", write("o.txt", TEXT[::-1])),
    "--resume other --lr": Case([*RESUME, "--lr", "0.1"], 2, "--lr"),
    "--resume other --max-steps": Case([*RESUME, "--max-steps", "8"], 2, "--max-steps"),
    "--resume other --preset": Case([*RESUME, "--preset", "baby"], 2, "model differs"),
    "--resume other --precision": Case([*RESUME, "--precision", "bfloat16"], 2, "--precision"),
    "--resume other --time-budget": Case([*RESUME, "--time-budget", "5"], 2, "--time-budget"),
    # sampling flags of generate: status 2
    "--max-new-tokens -3": Case([*GENERATE, "--max-new-tokens", "-3"], 2, "--max-new-tokens"),
    "--max-new-tokens abc": Case([*GENERATE, "--max-new-tokens", "abc"], 2, "--max-new-tokens"),
    "--max-new-tokens 2**63": Case([*GENERATE, "--max-new-tokens", str(2**63)], 2, "--max-new-tokens"),
    "--max-new-tokens 10**13 (80 TB)": Case([*GENERATE, "--max-new-tokens", str(10**13)], 1, "--max-new-tokens"),
    "--temperature -1": Case([*GENERATE, "--temperature", "-1"], 2, "--temperature"),
    "--temperature nan": Case([*GENERATE, "--temperature", "nan"], 2, "--temperature"),
    "--temperature inf": Case([*GENERATE, "--temperature", "inf"], 2, "--temperature"),
    "--top-k 0": Case([*GENERATE, "--top-k", "0"], 2, "--top-k"),
    "--top-k -1": Case([*GENERATE, "--top-k", "-1"], 2, "--top-k"),
    "--top-k 2**63": Case([*GENERATE, "--top-k", str(2**63)], 2, "--top-k"),
    "--top-p 0": Case([*GENERATE, "--top-p", "0"], 2, "--top-p"),
    "--top-p 1.5": Case([*GENERATE, "--top-p", "1.5"], 2, "--top-p"),
    "--top-p nan": Case([*GENERATE, "--top-p", "nan"], 2, "--top-p"),
    "generate --seed -1": Case([*GENERATE, "--seed", "-1"], 2, "--seed"),
    "generate --seed 2**64": Case([*GENERATE, "--seed", str(2**64)], 2, "--seed"),
    "empty --prompt": Case([*GENERATE, "--prompt", ""], 2, "--prompt"),
    "--prompt outside the vocabulary": Case([*GENERATE, "--prompt", "Zebra \u00e9"], 2, "--prompt"),
    "generate --device meta": Case([*GENERATE, "--device", "meta"], 2, "--device"),
    "generate --device banana": Case([*GENERATE, "--device", "banana"], 2, "--device"),
    "generate --device cuda:99 (absent)": Case([*GENERATE, "--device", "cuda:99"], 1, "cuda:99"),
    # --checkpoint: status 1
    "--checkpoint missing": Case([*GENERATE, "--checkpoint", "{tmp}/nowhere"], 1, "nowhere"),
    "--checkpoint a file": Case([*GENERATE, "--checkpoint", "{tmp}/f.txt"], 1, "f.txt", write("f.txt", "x")),
    "--checkpoint without ckpt.pt": Case([*GENERATE, "--checkpoint", "{tmp}/empty"], 1, CHECKPOINT_FILE,
                                         mkdir("empty")),
    "ckpt.pt a directory": Case([*GENERATE, "--checkpoint", "{tmp}/d"], 1, CHECKPOINT_FILE, mkdir("d/ckpt.pt")),
    "ckpt.pt zero bytes": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_bytes(lambda raw: b"")),
    "ckpt.pt random bytes": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_bytes(lambda raw: os.urandom(len(raw)))),
    "ckpt.pt truncated": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_bytes(lambda raw: raw[: len(raw) // 2])),
    "ckpt.pt flipped byte": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_bytes(flip_middle)),
    "ckpt.pt pickle payload": Case(GENERATE, 1, CHECKPOINT_FILE, pickle_payload),
    "ckpt.pt without model": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.pop("model"))),
    "ckpt.pt without model_config": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.pop("model_config"))),
    "ckpt.pt mis-shaped weight": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_edit(reshaped)),
    "ckpt.pt string step": Case(GENERATE, 1, CHECKPOINT_FILE, ckpt_edit(lambda c: c.update(step="4"))),
    "ckpt.pt invalid model_config": Case(GENERATE, 1, CHECKPOINT_FILE,
                                         ckpt_edit(lambda c: c["model_config"].update(n_head=3))),
    "tokenizer.json missing": Case(GENERATE, 1, TOKENIZER_FILE, remove(f"run/{TOKENIZER_FILE}")),
    "tokenizer.json not JSON": Case(GENERATE, 1, TOKENIZER_FILE, write(f"run/{TOKENIZER_FILE}", "{")),
    "tokenizer.json not UTF-8": Case(GENERATE, 1, TOKENIZER_FILE, write(f"run/{TOKENIZER_FILE}", b"\xff\xfe")),
    "tokenizer.json empty object": Case(GENERATE, 1, TOKENIZER_FILE, write(f"run/{TOKENIZER_FILE}", "{}")),
    "tokenizer.json of another model": Case(GENERATE, 1, TOKENIZER_FILE,
                                            lambda tmp: CharTokenizer("ab").save(tmp / "run" / TOKENIZER_FILE)),
    # evaluate: its own flags, its --data, and the run directory it shares with generate
    "evaluate without --data": Case(["evaluate", "--checkpoint", "{run}"], 2, "--data"),
    "evaluate --batch-size 0": Case([*EVALUATE, "--batch-size", "0"], 2, "--batch-size"),
    "evaluate --batch-size 2**63": Case([*EVALUATE, "--batch-size", str(2**63)], 2, "--batch-size"),
    "evaluate --device banana": Case([*EVALUATE, "--device", "banana"], 2, "--device"),
    "evaluate --data missing": Case([*EVALUATE[:3], "--data", "{tmp}/missing.txt"], 1, "missing.txt"),
    "evaluate --data not UTF-8": Case([*EVALUATE[:3], "--data", "{tmp}/l1.txt"], 1, "UTF-8",
                                      write("l1.txt", "d\u00e9j\u00e0 vu".encode("latin-1"))),
    "evaluate --data unknown characters": Case([*EVALUATE[:3], "--data", "{tmp}/fr.txt"], 1, "--data",
                                               write("fr.txt", "\u00e7a " * 40)),
    "evaluate --data too short": Case([*EVALUATE[:3], "--data", "{tmp}/short.txt"], 1, "at least 20",
                                      write("short.txt", "To be")),
    "evaluate --checkpoint missing": Case([*EVALUATE, "--checkpoint", "{tmp}/nowhere"], 1, "nowhere"),
    "evaluate ckpt.pt flipped byte": Case(EVALUATE, 1, CHECKPOINT_FILE, ckpt_bytes(flip_middle)),
}
# A handful also run as real processes: no traceback escapes at the interpreter level either.
IN_A_PROCESS = ["--data missing", "--seed 2**63", "--device meta", "--out under a file", "ckpt.pt without model",
                "ckpt.pt truncated", "--max-new-tokens 10**13 (80 TB)", "--temperature inf"]


def _case(name: str) -> Case:
    case = CASES[name]
    return case.values[0] if hasattr(case, "values") else case


def _prepare(case: Case, tmp: Path, template: Path) -> list[str]:
    """Write the text, copy the finished run, run the case's setup; return the argv with paths filled in."""
    (tmp / "text.txt").write_text(TEXT, encoding="utf-8")
    shutil.copytree(template, tmp / "run")
    if case.setup is not None:
        case.setup(tmp)
    fill = {"{tmp}": str(tmp), "{data}": str(tmp / "text.txt"), "{run}": str(tmp / "run")}
    argv = []
    for arg in case.argv:
        for key, value in fill.items():
            arg = arg.replace(key, value)
        argv.append(arg)
    return argv


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_invocation_in_process(case, tmp_path, _finished_run_template, capsys):
    argv = _prepare(case, tmp_path, _finished_run_template[1])
    capsys.readouterr()
    status, out, err = run_main(capsys, *argv)
    _assert_one_line_error(status, err, case.fragment, expected=case.status, out=out)
    assert not (tmp_path / "new").exists()  # nothing written before every check has passed
    if case.argv[:1] in (["generate"], ["evaluate"]):
        assert out == ""  # the checks come before anything is printed


@pytest.mark.subprocess
@pytest.mark.parametrize("name", IN_A_PROCESS)
def test_bad_invocation_in_a_process(name, tmp_path, _finished_run_template):
    case = _case(name)
    argv = _prepare(case, tmp_path, _finished_run_template[1])
    result = cli(*argv)
    _assert_one_line_error(result.returncode, result.stderr, case.fragment, expected=case.status, out=result.stdout)


def test_the_table_covers_every_flag():
    commands = build_parser()._subparsers._group_actions[0].choices
    flags = {a.option_strings[-1] for name, p in commands.items() if name != "finetune"  # tests/test_cli_finetune.py
             for a in p._actions if a.option_strings and a.option_strings[-1] not in ("--help", "--no-progress",
                                                                                        "--resume")}
    tested = {arg for case in map(_case, CASES) for arg in case.argv if arg.startswith("--")}
    assert flags <= tested, flags - tested
    assert len(CASES) >= 50 and {c.status for c in map(_case, CASES)} == {1, 2}


def test_evaluate_prints_the_loss_of_the_whole_validation_split(finished_run, data_file, capsys):
    status, out, err = run_main(capsys, *[a.replace("{run}", str(finished_run)).replace("{data}", str(data_file))
                                          for a in EVALUATE])
    assert status == 0 and err == "", err
    name, value = out.split()
    checkpoint = load_checkpoint(finished_run / CHECKPOINT_FILE)
    model = GPT(GPTConfig.from_dict(checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    ids = torch.tensor(CharTokenizer.from_text(TEXT).encode(TEXT))
    expected = evaluate_split(model, train_val_split(ids, 0.1)[1], block_size=model.config.block_size)
    assert name == "val_loss" and value == f"{expected:.4f}", (out, expected)
    # the batch size changes the speed, not the number
    status, out_one, _ = run_main(capsys, "evaluate", "--checkpoint", finished_run, "--data", data_file,
                                  "--device", "cpu", "--batch-size", "1")
    assert status == 0 and out_one == out


# ---------------------------------------------------------------- what the checks cannot foresee
def _edited_checkpoint(monkeypatch, change):
    """Make the run directory's load_checkpoint return the real checkpoint changed by ``change`` (no checksum to pass)."""
    real = transformer_lib.rundir.load_checkpoint

    def load_checkpoint(path, **kwargs):
        checkpoint = real(path, **kwargs)
        change(checkpoint)
        return checkpoint

    monkeypatch.setattr(transformer_lib.rundir, "load_checkpoint", load_checkpoint)


@pytest.mark.parametrize("change,needles", [
    # load_checkpoint validates the entries; what it cannot know without a model is whether the
    # weights fit the configuration stored beside them
    (lambda c: c["model_config"].update(n_layer=5), ["missing", "blocks.2"]),
    (reshaped, ["must be a floating-point tensor of shape"]),
    (lambda c: c["model"].update({"extra.weight": torch.zeros(2)}), ["unexpected 'extra.weight'"]),
    (lambda c: c["model"].update({k: v.long() for k, v in list(c["model"].items())[:1]}), ["floating-point"]),
])
def test_weights_that_do_not_fit_their_config_are_refused_by_generate(finished_run, capsys, monkeypatch, change,
                                                                      needles):
    """A checkpoint whose weights do not fit its model_config (after load_checkpoint) is one line, status 1."""
    _edited_checkpoint(monkeypatch, change)
    status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To", *GEN)
    _assert_one_line_error(status, err, "--checkpoint", CHECKPOINT_FILE, *needles, expected=EXIT_FAILURE, out=out)


@pytest.mark.parametrize("change,needles", [
    (lambda c: c.update(step=99), ["step=99", "max_steps=4"]),
    # passes every check of the command, and fails inside the trainer: the line says where
    (lambda c: (c.update(step=2), c["optimizer"].update(state={0: {"exp_avg": torch.zeros(1)}})),
     ["training the run in", "Error"]),
])
def test_incomplete_checkpoints_are_refused_by_resume(finished_run, data_file, capsys, monkeypatch, change, needles):
    _edited_checkpoint(monkeypatch, change)
    # the trainer reads the checkpoint with its own load_checkpoint; make it read the same edited one
    monkeypatch.setattr(transformer_lib.training, "load_checkpoint", transformer_lib.rundir.load_checkpoint)
    status, out, err = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--resume",
                                "--no-progress", "--device", "cpu")
    _assert_one_line_error(status, err, "--resume" if "Error" not in needles else "train", *needles,
                           expected=EXIT_FAILURE, out=out)


def test_an_unexpected_exception_is_one_line_with_status_1(tmp_path, data_file, capsys, monkeypatch):
    def train(*args, **kwargs):
        raise RuntimeError("boom\nsecond line of the message")

    monkeypatch.setattr(transformer_lib.cli, "train", train)
    argv = ["train", "--data", data_file, "--out", tmp_path / "run", *FAST, "--max-steps", 4]
    status, out, err = run_main(capsys, *argv)
    _assert_one_line_error(status, err, "training the run in", "RuntimeError: boom", expected=EXIT_FAILURE, out=out)
    assert "second line" not in err
    monkeypatch.setenv(DEBUG_ENV, "1")  # the traceback, for a developer, only when asked for
    status, _, err = run_main(capsys, *argv[:4], tmp_path / "run2", *argv[5:])
    assert status == EXIT_FAILURE and "Traceback" in err and "RuntimeError: boom" in err.splitlines()[-1]


def test_an_exception_outside_any_stage_is_still_one_line(tmp_path, data_file, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(transformer_lib.cli, "_read_text", broken)
    status, out, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run", *FAST)
    _assert_one_line_error(status, err, "unexpected failure: TypeError: a bug", expected=EXIT_FAILURE, out=out)


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 TiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 8e13 bytes"),
                                   MemoryError()])
def test_out_of_memory_says_so(tmp_path, data_file, capsys, monkeypatch, error):
    def train(*args, **kwargs):
        raise error

    monkeypatch.setattr(transformer_lib.cli, "train", train)
    status, out, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run", *FAST)
    _assert_one_line_error(status, err, "out of memory", type(error).__name__, expected=EXIT_FAILURE, out=out)


def test_generates_own_budget_check_is_reported_under_the_flag(finished_run, capsys, monkeypatch):
    def generate(*args, **kwargs):
        raise ValueError("generate: max_new_tokens=40 needs more memory than there is")

    monkeypatch.setattr(transformer_lib.cli, "generate", generate)
    status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To", *GEN)
    _assert_one_line_error(status, err, "--max-new-tokens 40", "max_new_tokens=40", expected=EXIT_FAILURE, out=out)


@pytest.mark.parametrize("target", ["load_checkpoint", "generate", "_read_text"])
def test_ctrl_c_while_loading_or_generating_is_130_and_one_line(finished_run, data_file, capsys, monkeypatch,
                                                                 target):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    module = transformer_lib.rundir if target == "load_checkpoint" else transformer_lib.cli
    monkeypatch.setattr(module, target, interrupted)
    if target == "_read_text":
        argv = ["train", "--data", data_file, "--out", finished_run.parent / "new", *FAST]
    else:
        argv = ["generate", "--checkpoint", finished_run, "--prompt", "To", *GEN]
    status, out, err = run_main(capsys, *argv)
    _assert_one_line_error(status, err, "interrupted", expected=EXIT_INTERRUPTED, out=out)


@pytest.mark.subprocess
def test_ctrl_c_during_generation_in_a_process(finished_run, sigint_at_start):
    proc = subprocess.Popen([*sigint_at_start, sys.executable, "-m", "transformer_lib", "generate", "--checkpoint",
                             str(finished_run), "--prompt", "To", "--max-new-tokens", str(10**8), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(20)  # generation is under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    finally:
        proc.kill()
    _assert_one_line_error(proc.returncode, err.decode(), "interrupted", expected=EXIT_INTERRUPTED)


@pytest.mark.subprocess
def test_a_closed_pipe_ends_generate_with_one_line(finished_run):
    proc = subprocess.Popen([sys.executable, "-m", "transformer_lib", "generate", "--checkpoint", str(finished_run),
                             "--prompt", "To", "--max-new-tokens", str(10**8), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(20)
        proc.stdout.close()  # as `| head -c 20` does
        err = proc.stderr.read().decode()
        proc.wait(timeout=PROCESS_TIMEOUT)
    finally:
        proc.kill()
    _assert_one_line_error(proc.returncode, err, "broken pipe", expected=EXIT_FAILURE)
    assert "Exception ignored" not in err


def test_out_in_a_directory_without_write_permission(tmp_path, data_file, capsys, monkeypatch):
    """As root every directory is writable, so the permission is simulated here (the table has the real case)."""
    real = os.access
    monkeypatch.setattr(transformer_lib.cli.os, "access", lambda path, mode: False if Path(path) == tmp_path else
                        real(path, mode))
    status, out, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run", *FAST)
    _assert_one_line_error(status, err, "--out", "permission denied", str(tmp_path), expected=EXIT_FAILURE, out=out)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- a time budget (Chapter 21)
BUDGET = ["--warmup-steps", "2", "--eval-interval", "1000000", "--no-progress", "--batch-size", "4", "--device", "cpu"]


def test_time_budget_run_then_evaluate_then_resume(tmp_path, data_file, capsys):
    out = tmp_path / "run"
    # a million steps of the tiny model would take hours: the budget of 1 s is what ends the run
    status, stdout, err = run_main(capsys, "train", "--data", data_file, "--out", out, "--preset", "tiny",
                                   "--max-steps", 10**6, "--time-budget", 1, *BUDGET)
    assert status == 0, err
    checkpoint = load_checkpoint(out / CHECKPOINT_FILE)
    steps = checkpoint["step"]
    assert 0 < steps < 10**6 and checkpoint["metrics"]["train_time"] >= 1.0
    assert TrainConfig.from_dict(checkpoint["train_config"]).time_budget == 1.0
    assert stdout.startswith(f"{steps} steps in the time budget of 1 s ("), stdout
    last = json.loads((out / METRICS_FILE).read_text().splitlines()[-1])
    assert last["step"] == steps and f"val loss {last['val_loss']:.4f}" in stdout
    assert f"after {last['setup_time']:.1f} s of set-up outside it)" in stdout, stdout
    assert "interrupted" not in err and "--resume" not in err

    status, stdout, err = run_main(capsys, "evaluate", "--checkpoint", out, "--data", data_file, "--device", "cpu")
    assert status == 0 and err == "", err
    lines = stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("val_loss "), stdout
    value = float(lines[0].split()[1])
    assert 0 < value < 10, value  # a cross-entropy in nats over a vocabulary of a few dozen characters

    before = (out / CHECKPOINT_FILE).read_bytes()
    status, stdout, err = run_main(capsys, "train", "--data", data_file, "--out", out, "--resume", "--no-progress",
                                   "--device", "cpu")
    assert status == 0, err
    assert "complete" in stdout and "nothing to do" in stdout, stdout
    assert (out / CHECKPOINT_FILE).read_bytes() == before  # no further step


@pytest.mark.slow
def test_speedrun_preset_trains_its_recipe_for_the_time_budget(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT * 4, encoding="utf-8")  # room for a longer context than the tiny preset's
    out = tmp_path / "run"
    status, stdout, err = run_main(capsys, "train", "--data", data, "--out", out, "--preset", "speedrun",
                                   "--time-budget", 2, "--eval-interval", 10**6, "--no-progress", "--device", "cpu")
    assert status == 0, err
    assert "in the time budget of 2 s" in stdout, stdout
    checkpoint = load_checkpoint(out / CHECKPOINT_FILE)
    assert checkpoint["metrics"]["train_time"] >= 2.0
    stored = TrainConfig.from_dict(checkpoint["train_config"])
    # the speedrun model takes the speedrun training recipe, with the flags given
    assert stored == TrainConfig.from_preset("speedrun", time_budget=2.0, eval_interval=10**6,
                                             checkpoint_interval=10**6, device="cpu")
    assert stored.optimizer == "muon" and stored.compile
    setup = json.loads((out / METRICS_FILE).read_text().splitlines()[-1])["setup_time"]
    assert setup > 0.0  # the compilation (and the precision probe), outside the budget
