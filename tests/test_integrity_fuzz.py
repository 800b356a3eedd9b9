"""Integrity fuzz: a changed byte in a saved checkpoint, model or ONNX file is refused, or changes nothing.

Files are written as the library writes them (``train`` writes the checkpoint, as the command line
does; ``save_pretrained`` the safetensors weights and ``config.json``; ``export_onnx`` the ONNX file
and its checksum file). Then one byte at a time is changed (``xor 0xFF``, every bit, and ``xor
0x01``, the lowest bit) and the file loaded again. Every outcome must be one of two:

- refused: a ``ValueError`` or ``OSError`` whose message names the file;
- identical: everything loaded is bit for bit what was saved (every tensor ``torch.equal`` with
  the same dtype and shape, every other value equal), e.g. a change in a field the zip reader ignores.

"different" (loaded, with other values) and any other exception fail the test. Run with ``-s`` to
see the counts. The saved model and its configuration are tried at every byte; the checkpoint,
whose loading goes through PyTorch's unpickler (about 15 ms per try), at a deterministic sample of
offsets (every byte in the slow test would take half an hour; the slow test takes a denser sample).
"""

import collections
import math
import os
import random
import re
import shutil
import struct

import numpy as np
import pytest
import torch

from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.serialization import CONFIG_NAME, WEIGHTS_NAME, load_pretrained_state
from transformer_lib.checkpoint import load_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.rundir import CHECKPOINT_FILE
from transformer_lib.training import train

# The smallest GPT there is, so that the files are small and every byte can be tried.
MICRO = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=8, dropout=0.0, bias=True)


def same(a, b) -> bool:
    """``a`` and ``b`` equal bit for bit: tensors of one dtype and shape with equal values, equal containers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def classify(load, path, reference) -> str:
    """Load ``path``; "refused" (with the file named in the message), "identical" or "different"."""
    try:
        got = load()
    except (ValueError, OSError) as err:
        assert os.fspath(path) in str(err), f"the message does not name {path}: {err}"
        return "refused"
    return "identical" if same(reference, got) else "different"


def fuzz(path, load, reference, offsets, xors=(0xFF,)) -> collections.Counter:
    """Change one byte of ``path`` at each offset with each xor, load, classify; the file is restored after."""
    raw = path.read_bytes()
    counts = collections.Counter()
    try:
        for xor in xors:
            for offset in offsets:
                changed = bytearray(raw)
                changed[offset] ^= xor
                path.write_bytes(changed)
                outcome = classify(load, path, reference)
                assert outcome != "different", f"{path.name}: byte {offset} xor {xor:#x} loaded different values"
                counts[outcome] += 1
    finally:
        path.write_bytes(raw)
    return counts


def report(what: str, counts: collections.Counter) -> None:
    print(f"\n{what}: refused {counts['refused']}, identical {counts['identical']}, different {counts['different']}")


# --- the files ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory written by ``train`` after 2 steps, as the command line writes it."""
    directory = tmp_path_factory.mktemp("run")
    random.seed(0)  # the checkpoint stores the global random states: seeded, the file's layout is fixed
    np.random.seed(0)
    torch.manual_seed(0)
    data = torch.arange(200) % MICRO.vocab_size
    config = TrainConfig(max_steps=2, warmup_steps=1, batch_size=2, eval_interval=2, eval_iters=1,
                         checkpoint_interval=2)
    train(GPT(MICRO), data, data, config, out_dir=directory, progress=False)
    return directory


@pytest.fixture
def checkpoint(run_dir, tmp_path):
    """A private copy of the checkpoint and what it loads as."""
    path = tmp_path / CHECKPOINT_FILE
    shutil.copy(run_dir / CHECKPOINT_FILE, path)
    return path, load_checkpoint(path)


@pytest.fixture
def saved_model(tmp_path):
    """A directory written by ``save_pretrained`` and what it loads as: ``(config, state)``."""
    torch.manual_seed(0)
    GPT(MICRO).save_pretrained(tmp_path / "model", metadata={"trained_steps": "2"})
    return tmp_path / "model", load_pretrained_state(tmp_path / "model")


def sample(n: int, stride: int) -> list[int]:
    """Every ``stride``-th offset of ``n`` (from an offset that varies with the stride), plus the first
    64 bytes (the zip's first local header) and the last 22 (its end-of-central-directory record)."""
    return sorted(set(range(stride // 3, n, stride)) | set(range(min(64, n))) | set(range(max(0, n - 22), n)))


# --- single-byte changes ----------------------------------------------------------------------------


def test_checkpoint_single_byte_changes_are_refused_or_harmless(checkpoint):
    path, reference = checkpoint
    counts = fuzz(path, lambda: load_checkpoint(path), reference, sample(path.stat().st_size, 401))
    report(f"checkpoint ({path.stat().st_size} bytes, sampled)", counts)
    assert counts["different"] == 0 and counts["refused"] > 100


@pytest.mark.slow
def test_checkpoint_single_byte_changes_dense(checkpoint):
    path, reference = checkpoint
    n = path.stat().st_size
    counts = fuzz(path, lambda: load_checkpoint(path), reference, sample(n, 47))
    counts += fuzz(path, lambda: load_checkpoint(path), reference, sample(n, 101), xors=(0x01,))
    report(f"checkpoint ({n} bytes, every 47th byte xor 0xFF, every 101st xor 0x01)", counts)
    assert counts["different"] == 0


def test_saved_model_single_byte_changes_are_refused_or_harmless(saved_model):
    directory, reference = saved_model
    load = lambda: load_pretrained_state(directory)  # noqa: E731
    weights, config = directory / WEIGHTS_NAME, directory / CONFIG_NAME
    (n,) = struct.unpack("<Q", weights.read_bytes()[:8])  # the length of the JSON header
    offsets = sorted(set(range(64)) | set(range(0, weights.stat().st_size, 3)))
    counts = fuzz(weights, load, reference, offsets)
    report(f"{WEIGHTS_NAME} ({weights.stat().st_size} bytes, header of {n}: every 3rd byte, xor 0xFF)", counts)
    assert counts["different"] == 0 and counts["refused"] > 1000
    counts = fuzz(config, load, reference, range(config.stat().st_size))
    report(f"{CONFIG_NAME} ({config.stat().st_size} bytes, every byte xor 0xFF)", counts)
    assert counts["different"] == 0 and counts["refused"] > 100


@pytest.mark.slow
@pytest.mark.parametrize("name", [WEIGHTS_NAME, CONFIG_NAME])
def test_saved_model_every_byte_both_ways(saved_model, name):
    directory, reference = saved_model
    path = directory / name
    counts = fuzz(path, lambda: load_pretrained_state(directory), reference, range(path.stat().st_size),
                  xors=(0xFF, 0x01))
    report(f"{name} ({path.stat().st_size} bytes, every byte xor 0xFF and xor 0x01)", counts)
    assert counts["different"] == 0


# --- truncations, empty files, random bytes, directories --------------------------------------------


def cut_lengths(n: int) -> list[int]:
    return sorted({0, 1, 4, 7, 8, 9, 16, 64, 100, n // 3, n // 2, n - 100, n - 22, n - 8, n - 1} - {n})


def test_truncated_checkpoints_are_refused(checkpoint):
    path, _ = checkpoint
    raw = path.read_bytes()
    for length in cut_lengths(len(raw)):
        path.write_bytes(raw[:length])
        with pytest.raises(ValueError, match=f"load_checkpoint: {re.escape(str(path))}"):
            load_checkpoint(path)


def test_truncated_models_are_refused_or_harmless(saved_model):
    directory, reference = saved_model
    counts = collections.Counter()
    for name in (WEIGHTS_NAME, CONFIG_NAME):
        path = directory / name
        raw = path.read_bytes()
        for length in cut_lengths(len(raw)):
            path.write_bytes(raw[:length])
            counts[classify(lambda: load_pretrained_state(directory), path, reference)] += 1
        path.write_bytes(raw)
    report("truncated model files", counts)
    assert counts["different"] == 0 and counts["identical"] <= 1  # config.json without its final newline


def test_empty_random_and_directory_in_place_of_the_checkpoint(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{re.escape(str(path))} is empty"):
        load_checkpoint(path)
    g = torch.Generator().manual_seed(0)
    for size in (1, 8, 100, 4096, 100_000):
        for start in (b"", b"PK\x03\x04", b"\x80\x02"):  # random, a zip's magic, a pickle's
            path.write_bytes(start + bytes(torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8).tolist()))
            with pytest.raises(ValueError, match=f"load_checkpoint: {re.escape(str(path))}"):
                load_checkpoint(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(IsADirectoryError, match=f"load_checkpoint: path must be a file, got the directory {re.escape(str(path))}"):
        load_checkpoint(path)


def test_empty_random_and_directory_in_place_of_the_model_files(saved_model):
    directory, _ = saved_model
    g = torch.Generator().manual_seed(0)
    for name in (WEIGHTS_NAME, CONFIG_NAME):
        path = directory / name
        raw = path.read_bytes()
        path.write_bytes(b"")
        with pytest.raises(ValueError, match=f"load_pretrained_state: {re.escape(str(path))}"):
            load_pretrained_state(directory)
        for size in (1, 8, 100, 4096):
            path.write_bytes(bytes(torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8).tolist()))
            with pytest.raises(ValueError, match=f"load_pretrained_state: {re.escape(str(path))}"):
                load_pretrained_state(directory)
        path.unlink()
        path.mkdir()
        with pytest.raises(IsADirectoryError, match=f"load_pretrained_state: {re.escape(str(path))} must be a file"):
            load_pretrained_state(directory)
        with pytest.raises(IsADirectoryError, match=f"{re.escape(str(path))} must be a file"):
            GPT.from_pretrained(directory)
        path.rmdir()
        path.write_bytes(raw)
    assert load_pretrained_state(directory)[0] == MICRO


# --- ONNX ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_onnx_file_changed_in_the_middle_is_refused(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from transformer_lib.shipping import OnnxGPT, export_onnx

    torch.manual_seed(0)
    path = tmp_path / "micro.onnx"
    export_onnx(GPT(MICRO).eval(), path)
    raw = path.read_bytes()
    OnnxGPT(path)  # verifies and loads
    g = torch.Generator().manual_seed(0)
    middle = len(raw) // 2
    counts = collections.Counter()
    changes = [raw[:middle] + bytes(torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8).tolist())
               + raw[middle + 64:]]
    changes += [raw[:k] + bytes([raw[k] ^ 0xFF]) + raw[k + 1:] for k in range(0, len(raw), max(1, len(raw) // 40))]
    changes += [raw[:-1], raw[: len(raw) // 2], b""]
    for data in changes:
        path.write_bytes(data)
        with pytest.raises(ValueError, match=f"OnnxGPT: {re.escape(str(path))} was modified or corrupted"):
            OnnxGPT(path)
        counts["refused"] += 1
    report(f"ONNX file ({len(raw)} bytes: 64 random bytes in the middle, {len(changes) - 4} single bytes, "
           "3 truncations)", counts)
