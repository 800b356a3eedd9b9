"""Unit tests for transformer_lib.rundir (chapters 9 and 16): the names of a run directory's files, and checking,
writing and reading a run directory, each refusal a library error that names the file."""

import hashlib
import json
import os

import pytest
import torch

import transformer_lib.cli
import transformer_lib.cli_finetune
import transformer_lib.rundir
import transformer_lib.training
from transformer_lib.checkpoint import save_checkpoint
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.gpt import GPT
from transformer_lib.optim import AdamW
from transformer_lib.rundir import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    RUN_FILE,
    RUN_FORMAT,
    TOKENIZER_FILE,
    check_run_dir,
    read_json,
    read_run,
    read_text,
    write_json,
    write_run,
)

TEXT = "To be, or not to be: that is the question.\n" * 20


def test_run_directory_names_are_defined_once():
    for name in ("CHECKPOINT_FILE", "METRICS_FILE", "TOKENIZER_FILE", "RUN_FILE", "RUN_FORMAT"):
        assert name in transformer_lib.rundir.__all__
        for module in (transformer_lib.cli, transformer_lib.cli_finetune, transformer_lib.training):
            assert name not in module.__all__
    for name in ("CHECKPOINT_FILE", "METRICS_FILE"):  # the trainer writes these two
        assert getattr(transformer_lib.training, name) is getattr(transformer_lib.rundir, name)
    for name in ("CHECKPOINT_FILE", "METRICS_FILE", "TOKENIZER_FILE", "RUN_FILE"):
        for module in (transformer_lib.cli, transformer_lib.cli_finetune):
            assert getattr(module, name) is getattr(transformer_lib.rundir, name)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as the command line writes it, with a fresh tiny model's checkpoint at step 2 of 4."""
    out = tmp_path / "run"
    tokenizer = CharTokenizer.from_text(TEXT)
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    _, sha = read_text(tmp_path / "text.txt")
    write_run(out, tokenizer, tmp_path / "text.txt", sha, len(TEXT))
    config = GPTConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size)
    model = GPT(config)
    save_checkpoint(out / CHECKPOINT_FILE, model=model, optimizer=AdamW(model.parameters()), step=2,
                    model_config=config, train_config=TrainConfig(max_steps=4, warmup_steps=1),
                    generator=torch.Generator().manual_seed(0))
    return out


def test_json_round_trip_and_refusals(tmp_path):
    write_json(tmp_path / "a.json", {"x": [1, 2.5, "é"]})
    assert read_json(tmp_path / "a.json") == {"x": [1, 2.5, "é"]}
    with pytest.raises(FileNotFoundError, match="no such file: .*missing.json"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="list.json must hold a JSON object, got list"):
        read_json(tmp_path / "list.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*bad.json as JSON"):
        read_json(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cannot read .* as JSON"):  # a directory
        read_json(tmp_path)


def test_read_text_returns_the_text_and_the_digest_of_its_bytes(tmp_path):
    (tmp_path / "t.txt").write_bytes("déjà vu".encode())
    assert read_text(tmp_path / "t.txt") == ("déjà vu", hashlib.sha256("déjà vu".encode()).hexdigest())
    with pytest.raises(FileNotFoundError, match="no such file: .*nothing.txt"):
        read_text(tmp_path / "nothing.txt")
    with pytest.raises(IsADirectoryError, match="is a directory, not a text file"):
        read_text(tmp_path)
    (tmp_path / "l1.txt").write_bytes("déjà".encode("latin-1"))
    with pytest.raises(ValueError, match=r"l1.txt is not UTF-8 text \(byte 0xe9 at offset 1\)"):
        read_text(tmp_path / "l1.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        read_text(tmp_path / "empty.txt")


def test_write_run_writes_the_tokenizer_and_the_run_file(run_dir, tmp_path):
    assert CharTokenizer.load(run_dir / TOKENIZER_FILE).chars == CharTokenizer.from_text(TEXT).chars
    run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    assert run == {"format": RUN_FORMAT, "data": os.fspath((tmp_path / "text.txt").resolve()),
                   "data_sha256": hashlib.sha256(TEXT.encode()).hexdigest(), "characters": len(TEXT)}


def test_check_run_dir(tmp_path, run_dir):
    assert check_run_dir(tmp_path / "new" / "deeper", resume=False) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    assert check_run_dir(run_dir, resume=True) == run_dir
    with pytest.raises(FileExistsError, match=f"already holds a run \\({CHECKPOINT_FILE}, {TOKENIZER_FILE}, {RUN_FILE}\\)"):
        check_run_dir(run_dir, resume=False)
    with pytest.raises(FileNotFoundError, match=f"holds no checkpoint \\({CHECKPOINT_FILE}\\)"):
        check_run_dir(tmp_path / "empty", resume=True)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(NotADirectoryError, match="f.txt exists and is not a directory"):
        check_run_dir(tmp_path / "f.txt", resume=False)
    with pytest.raises(NotADirectoryError, match="cannot create .*f.txt/run: .*f.txt is a file"):
        check_run_dir(tmp_path / "f.txt" / "run", resume=False)
    assert METRICS_FILE not in os.listdir(run_dir)  # a run may hold any of the four files; this one has three


def test_read_run_verifies_every_file(run_dir):
    stored = read_run(run_dir)
    assert stored.checkpoint["step"] == 2 < stored.train_config.max_steps and stored.run is None
    assert stored.model_config.vocab_size == stored.tokenizer.vocab_size and stored.train_config.max_steps == 4
    resumed = read_run(run_dir, resume=True)
    assert resumed.run["format"] == RUN_FORMAT
    CharTokenizer("ab").save(run_dir / TOKENIZER_FILE)
    with pytest.raises(ValueError, match=f"{TOKENIZER_FILE} has 2 characters, the model of .*{CHECKPOINT_FILE}"):
        read_run(run_dir)
    (run_dir / TOKENIZER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=TOKENIZER_FILE):
        read_run(run_dir)


def test_read_run_refuses_a_missing_run(tmp_path, run_dir):
    with pytest.raises(FileNotFoundError, match="no such directory: .*nowhere"):
        read_run(tmp_path / "nowhere")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(NotADirectoryError, match=f"f.txt is a file, not a run directory holding {CHECKPOINT_FILE}"):
        read_run(tmp_path / "f.txt")
    (tmp_path / "d" / CHECKPOINT_FILE).mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=f"{CHECKPOINT_FILE} is a directory, not a checkpoint file"):
        read_run(tmp_path / "d")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"empty holds no {CHECKPOINT_FILE}"):
        read_run(tmp_path / "empty")
    (run_dir / RUN_FILE).unlink()
    read_run(run_dir)  # generating needs no run file
    with pytest.raises(FileNotFoundError, match=RUN_FILE):
        read_run(run_dir, resume=True)
    write_json(run_dir / RUN_FILE, {"format": "something/1"})
    with pytest.raises(ValueError, match=f"{RUN_FILE} is not a run file"):
        read_run(run_dir, resume=True)
