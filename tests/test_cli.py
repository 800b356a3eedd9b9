"""Tests of the command line (chapter 16): `python -m transformer_lib train`, in-process and as a process."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import transformer_lib
import transformer_lib.cli
import transformer_lib.training
from transformer_lib.cli import EXIT_INTERRUPTED, EXIT_USAGE, TRAIN_FLAGS, TRAIN_PRESET, build_parser, main
from transformer_lib.config import GPTConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.gpt import GPT
from transformer_lib.training import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    RUN_FILE,
    RUN_FORMAT,
    TOKENIZER_FILE,
    TrainConfig,
    load_checkpoint,
)

# A small text with a fixed vocabulary: 4000 characters, so the tiny preset's block of 16 fits easily.
TEXT = "".join(f"To be, or not to be ({i % 17}): that is the question!\n" for i in range(80))[:4000]
# On the CPU even on a GPU machine: exact resume checks need deterministic kernels.
FAST = ["--preset", "tiny", "--warmup-steps", "2", "--eval-interval", "4", "--no-progress", "--batch-size", "4",
        "--device", "cpu"]


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "transformer_lib", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


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


def test_cli_names_are_not_reexported_from_the_package():
    assert not hasattr(transformer_lib, "main") and not hasattr(transformer_lib, "build_parser")
    assert "main" not in transformer_lib.__all__


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


def test_run_directory_names_come_from_training():
    for name in ("CHECKPOINT_FILE", "METRICS_FILE", "TOKENIZER_FILE", "RUN_FILE", "RUN_FORMAT"):
        assert getattr(transformer_lib.cli, name) is getattr(transformer_lib.training, name)
        assert name not in transformer_lib.cli.__all__  # defined once, in transformer_lib.training


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
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "b", "--precision", "half")
    assert status == 2 and "--precision" in err and "invalid choice" in err


def test_defaults_are_the_preset(tmp_path, data_file, monkeypatch):
    class Captured(Exception):
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


# ---------------------------------------------------------------- interruption and resume
def _interrupt_at(monkeypatch, step: int, signals: int = 1):
    """Send SIGINT to this process `signals` times during training step `step` (counted from 1).

    The signal is raised from inside ``clip_grad_norm_``, which the loop calls once per step, between
    the backward pass and the optimizer update: the worst moment for an abrupt stop.
    """
    real = transformer_lib.training.clip_grad_norm_
    calls = []

    def clip_grad_norm_(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            for _ in range(signals):
                signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformer_lib.training, "clip_grad_norm_", clip_grad_norm_)


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
    strip = [{k: v for k, v in json.loads(line).items() if k != "elapsed"}
             for d in ("straight", "cut") for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
    assert strip[: len(strip) // 2] == strip[len(strip) // 2:]  # the same evaluations, once each


def test_second_sigint_aborts_and_keeps_the_last_checkpoint(tmp_path, data_file, capsys, monkeypatch):
    _interrupt_at(monkeypatch, step=7, signals=2)  # the second signal raises KeyboardInterrupt
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path, "--max-steps", 12, *FAST)
    assert status == EXIT_INTERRUPTED and err.count("\n") == 1 and "aborted by a second Ctrl-C" in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 4  # the last periodic checkpoint, intact
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigint_to_a_running_process(tmp_path, data_file):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "transformer_lib", "train", "--data", str(data_file),
                             "--out", str(out), "--max-steps", "100000", *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "ckpt.pt").exists():  # the first checkpoint: training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err.count("\n") == 1 and "Traceback" not in err
    step = load_checkpoint(out / "ckpt.pt")["step"]
    assert f"interrupted after step {step} of 100000" in err and str(out / "ckpt.pt") in err


def test_resume_of_a_finished_run_does_nothing(finished_run, data_file, capsys):
    before = (finished_run / "ckpt.pt").read_bytes()
    status, out, _ = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--resume")
    assert status == 0 and "complete (4 of 4 steps)" in out
    assert (finished_run / "ckpt.pt").read_bytes() == before


# ---------------------------------------------------------------- bad input: one line, status 2
def _assert_one_line_error(status, err, *needles):
    assert status == EXIT_USAGE, err
    assert err.count("\n") == 1 and err.startswith("transformer_lib"), err
    assert "Traceback" not in err and ": error: " in err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("make,needles", [
    (lambda d: d / "missing.txt", ["--data", "no such file", "missing.txt"]),
    (lambda d: d, ["--data", "is a directory"]),
    (lambda d: (d / "e.txt", (d / "e.txt").write_text(""))[0], ["--data", "is empty"]),
    (lambda d: (d / "b.txt", (d / "b.txt").write_bytes(b"abc\xff\xfe"))[0], ["--data", "not UTF-8", "0xff"]),
    (lambda d: (d / "s.txt", (d / "s.txt").write_text("short text"))[0], ["--data", "10 characters", "block_size=16"]),
])
def test_bad_data_file(tmp_path, capsys, make, needles):
    status, _, err = run_main(capsys, "train", "--data", make(tmp_path), "--out", tmp_path / "run", "--preset", "tiny")
    _assert_one_line_error(status, err, *needles)
    assert not (tmp_path / "run").exists()  # nothing written before every check has passed


@pytest.mark.parametrize("args,needles", [
    (["--preset", "huge"], ["--preset", "invalid choice", "huge"]),
    (["--preset", "tiny", "--max-steps", "abc"], ["--max-steps", "invalid int value"]),
    (["--preset", "tiny", "--max-steps", "0"], ["max_steps", "max_steps=0"]),
    (["--preset", "tiny", "--max-steps", "30"], ["warmup_steps must be < max_steps"]),
    (["--preset", "tiny", "--lr", "-1"], ["lr", "lr=-1"]),
    (["--preset", "tiny", "--seed", "-5"], ["seed", "seed=-5"]),
    (["--preset", "tiny", "--device", "gpu7"], ["--device", "gpu7"]),
    (["--preset", "tiny", "--config", "x.json"], ["not allowed with argument"]),
])
def test_bad_flags(tmp_path, data_file, capsys, args, needles):
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run", *args)
    _assert_one_line_error(status, err, *needles)


@pytest.mark.parametrize("content,needles", [
    ("{not json", ["--config", "cannot read", "as JSON"]),
    ("[1, 2]", ["--config", "must hold a JSON object"]),
    ('{"n_head": 3, "n_embd": 32}', ["--config", "n_embd must be divisible by n_head"]),
    ('{"n_layers": 2}', ["--config", "unknown keys", "n_layers"]),
    ('{"vocab_size": 100}', ["--config", "vocab_size=100", "distinct characters"]),
])
def test_bad_config_file(tmp_path, data_file, capsys, content, needles):
    config = tmp_path / "model.json"
    config.write_text(content)
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run", "--config", config)
    _assert_one_line_error(status, err, *needles)


def test_missing_config_file(tmp_path, data_file, capsys):
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "run",
                              "--config", tmp_path / "nope.json")
    _assert_one_line_error(status, err, "--config", "no such file")


def test_out_is_a_file(tmp_path, data_file, capsys):
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", data_file, "--preset", "tiny")
    _assert_one_line_error(status, err, "--out", "not a directory")


def test_existing_run_without_resume(finished_run, data_file, capsys):
    before = (finished_run / "ckpt.pt").read_bytes()
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--preset", "tiny")
    _assert_one_line_error(status, err, "already holds a run", "--resume")
    assert (finished_run / "ckpt.pt").read_bytes() == before


def test_resume_without_checkpoint(tmp_path, data_file, capsys):
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path / "empty", "--resume")
    _assert_one_line_error(status, err, "--resume", "holds no checkpoint")


@pytest.mark.subprocess
def test_resume_from_corrupt_checkpoint_in_a_process(tmp_path, data_file):
    (tmp_path / "ckpt.pt").write_bytes(b"\x00garbage" * 50)
    result = cli("train", "--data", data_file, "--out", tmp_path, "--resume")
    _assert_one_line_error(result.returncode, result.stderr, "--resume", "not a transformer_lib checkpoint or corrupt")


def test_resume_from_foreign_checkpoint(tmp_path, data_file, capsys):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "ckpt.pt")
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", tmp_path, "--resume")
    _assert_one_line_error(status, err, "--resume", "not a transformer_lib checkpoint", "no format marker")


def test_resume_with_other_data(finished_run, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text(TEXT[::-1], encoding="utf-8")  # the same characters, another text
    status, _, err = run_main(capsys, "train", "--data", other, "--out", finished_run, "--resume")
    _assert_one_line_error(status, err, "--resume", "not the text the run", "was trained on")


def test_resume_with_a_tampered_tokenizer(finished_run, data_file, capsys):
    CharTokenizer("ab").save(finished_run / TOKENIZER_FILE)
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--resume")
    _assert_one_line_error(status, err, "--resume", "tokenizer.json", "do not match")


@pytest.mark.parametrize("args,needles", [
    (["--lr", "0.1"], ["--lr 0.1", "the run has lr=0.004"]),
    (["--max-steps", "8"], ["--max-steps 8", "max_steps=4"]),
    (["--preset", "baby"], ["model differs", "n_layer=4"]),
    (["--precision", "bfloat16"], ["--precision 'bfloat16'", "the run has precision='float32'"]),
])
def test_resume_with_changed_settings(finished_run, data_file, capsys, args, needles):
    status, _, err = run_main(capsys, "train", "--data", data_file, "--out", finished_run, "--resume", *args)
    _assert_one_line_error(status, err, "--resume", *needles)


def test_usage_errors_are_one_line(capsys):
    status, _, err = run_main(capsys)
    _assert_one_line_error(status, err, "required: COMMAND")
    status, _, err = run_main(capsys, "train", "--data", "x")
    _assert_one_line_error(status, err, "required: --out")
    status, _, err = run_main(capsys, "fly")
    _assert_one_line_error(status, err, "invalid choice", "fly")


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


@pytest.mark.parametrize("args,needles", [
    (["--prompt", "To be", "--temperature", "-1"], ["--temperature", "--temperature=-1"]),
    (["--prompt", "To be", "--temperature", "nan"], ["--temperature", "--temperature=nan"]),
    (["--prompt", "To be", "--top-k", "0"], ["--top-k", "--top-k=0"]),
    (["--prompt", "To be", "--top-p", "1.5"], ["--top-p", "--top-p=1.5"]),
    (["--prompt", "To be", "--top-p", "0"], ["--top-p", "(0, 1]"]),
    (["--prompt", "To be", "--max-new-tokens", "-3"], ["--max-new-tokens", "--max-new-tokens=-3"]),
    (["--prompt", "To be", "--device", "gpu7"], ["--device", "gpu7"]),
    (["--prompt", ""], ["--prompt"]),
    (["--prompt", "Zebra \u00e9"], ["--prompt", "Z"]),
])
def test_generate_bad_arguments(finished_run, capsys, args, needles):
    status, out, err = run_main(capsys, "generate", "--checkpoint", finished_run, *GEN, *args)
    _assert_one_line_error(status, err, *needles)
    assert out == ""


def test_generate_missing_checkpoint(tmp_path, capsys):
    status, _, err = run_main(capsys, "generate", "--checkpoint", tmp_path / "nowhere", "--prompt", "To")
    _assert_one_line_error(status, err, "--checkpoint", "no such directory")
    (tmp_path / "empty").mkdir()
    status, _, err = run_main(capsys, "generate", "--checkpoint", tmp_path / "empty", "--prompt", "To")
    _assert_one_line_error(status, err, "--checkpoint", "ckpt.pt")


def test_generate_corrupt_checkpoint_or_tokenizer(finished_run, capsys):
    (finished_run / "tokenizer.json").write_text("{}")
    status, _, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To")
    _assert_one_line_error(status, err, "--checkpoint", "tokenizer")
    (finished_run / "ckpt.pt").write_bytes(b"\x00" * 64)
    status, _, err = run_main(capsys, "generate", "--checkpoint", finished_run, "--prompt", "To")
    _assert_one_line_error(status, err, "--checkpoint")


@pytest.mark.subprocess
def test_generate_bad_input_in_a_process(finished_run):
    result = cli("generate", "--checkpoint", finished_run, "--prompt", "To be", "--top-p", "2")
    assert result.returncode == EXIT_USAGE and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and "--top-p" in result.stderr
