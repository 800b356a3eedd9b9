"""Unit tests for transformer_lib.checkpoint (chapter 9): the round trip, the checksums, the refusal of
corrupt, foreign or misfitting files, and the argument checks."""

import numpy as np
import pytest
import torch

from transformer_lib.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.gpt import GPT
from transformer_lib.optim import AdamW, weight_decay_groups
from transformer_lib.utils import state_sha256, tensor_sha256

TINY = GPTConfig.from_preset("tiny")


def small_config(**kw) -> TrainConfig:
    base = dict(max_steps=12, warmup_steps=2, batch_size=4, eval_interval=4, eval_iters=2,
                checkpoint_interval=4, device="cpu")
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------- checkpoints
def _save(path, step=3, metrics=None):
    model = GPT(TINY)
    opt = AdamW(weight_decay_groups(model, 0.1))
    save_checkpoint(path, model=model, optimizer=opt, step=step, model_config=TINY,
                    train_config=small_config(), generator=torch.Generator().manual_seed(5), metrics=metrics)
    return model, opt


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "ckpt.pt"
    model, _ = _save(path, metrics={"history": [{"step": 0, "loss": 4.0, "lr": 1e-4}]})
    other = GPT(TINY)
    g = torch.Generator()
    ckpt = load_checkpoint(path, model=other, optimizer=AdamW(weight_decay_groups(other, 0.1)), generator=g)
    assert ckpt["format"] == CHECKPOINT_FORMAT and ckpt["step"] == 3
    assert GPTConfig.from_dict(ckpt["model_config"]) == TINY
    assert TrainConfig.from_dict(ckpt["train_config"]) == small_config()
    assert ckpt["metrics"]["history"][0]["loss"] == 4.0
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), other.state_dict().values()))
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(5).get_state())


def test_checkpoint_restores_global_rng(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.manual_seed(42)
    _save(path)
    expected = torch.rand(3)
    torch.manual_seed(7)
    load_checkpoint(path, generator=torch.Generator())
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    _save(path, step=1)
    before = path.read_bytes()

    def failing_save(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        _save(path, step=2)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert load_checkpoint(path)["step"] == 1


def test_checkpoint_rejects_corrupt_file(tmp_path):
    path = tmp_path / "bad.pt"
    path.write_bytes(bytes(range(256)) * 3)
    with pytest.raises(ValueError, match="bad.pt is not a transformer_lib checkpoint or corrupt"):
        load_checkpoint(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="bad.pt is empty"):
        load_checkpoint(path)


def test_checkpoint_records_its_checksums(tmp_path):
    path = tmp_path / "ckpt.pt"
    model, _ = _save(path)
    raw = torch.load(path, weights_only=True)
    assert raw["model_sha256"] == {k: tensor_sha256(v) for k, v in model.state_dict().items()}
    assert raw["sha256"] == state_sha256({k: v for k, v in raw.items() if k != "sha256"})


def _resave(path, change):
    """Load the checkpoint's dict, ``change(d)`` it, and save it with torch.save (no new checksum)."""
    d = torch.load(path, weights_only=True)
    change(d)
    torch.save(d, path)


def test_a_changed_weight_is_refused_naming_the_file_and_tensor(tmp_path):
    path = tmp_path / "ckpt.pt"
    _save(path)
    _resave(path, lambda d: d["model"]["wpe.weight"].view(torch.int32)[3, 4].bitwise_xor_(1))  # one bit
    with pytest.raises(ValueError, match=r"ckpt.pt was modified or corrupted after it was written: checksum "
                                         r"mismatch .*differ from what was written: \['wpe.weight'\]"):
        load_checkpoint(path)


def test_a_changed_step_or_metric_is_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    for change in (lambda d: d.update(step=4), lambda d: d["metrics"].update(elapsed=1.0),
                   lambda d: d["rng"]["python"]["state"].__setitem__(5, 0), lambda d: d.update(extra=1)):
        _save(path)
        _resave(path, change)
        with pytest.raises(ValueError, match="checksum mismatch"):
            load_checkpoint(path)


def test_a_checkpoint_without_checksum_is_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    _save(path)
    _resave(path, lambda d: d.pop("sha256"))
    with pytest.raises(ValueError, match="ckpt.pt has no checksum"):
        load_checkpoint(path)


def _resave_valid(path, change):
    """As _resave, with a new checksum: a file that verifies but whose content is wrong."""
    d = torch.load(path, weights_only=True)
    change(d)
    d.pop("sha256")
    d["sha256"] = state_sha256(d)
    torch.save(d, path)


@pytest.mark.parametrize("change,match", [
    (lambda d: d.pop("model"), r"lacks the entries \['model'\]"),
    (lambda d: d.update(step="3"), "'step' must be an int >= 0, got '3'"),
    (lambda d: d.update(step=-1), "'step' must be an int >= 0"),
    (lambda d: d["model"].update({"wpe.weight": [1.0]}), "'model' must map parameter names to tensors"),
    (lambda d: d.update(optimizer=[]), "'optimizer' must be an optimizer state dict"),
    (lambda d: d["model_config"].update(n_head=3), "'model_config' is not a valid GPTConfig: .*n_embd"),
    (lambda d: d["train_config"].pop("lr") and d["train_config"].update(learning_rate=1.0),
     "'train_config' is not a valid TrainConfig: .*learning_rate"),
    (lambda d: d["rng"].pop("generator"), "'rng' does not hold valid random states: KeyError"),
    (lambda d: d["rng"].update(generator=torch.zeros(3, dtype=torch.uint8)), "'rng' does not hold valid random"),
    (lambda d: d["rng"]["numpy"].update(keys=[1, 2]), "'rng' does not hold valid random states"),
    (lambda d: d.update(metrics=[]), "'metrics' must be a dict"),
    (lambda d: d["metrics"].update(history={}), "'metrics' must be a dict, with a list 'history'"),
])
def test_invalid_entries_are_refused_naming_the_file_and_key(tmp_path, change, match):
    path = tmp_path / "ckpt.pt"
    _save(path, metrics={"history": []})
    _resave_valid(path, change)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    with pytest.raises(ValueError, match=f"load_checkpoint: .*ckpt.pt is not a valid checkpoint: .*{match}"):
        load_checkpoint(path, generator=torch.Generator())
    assert torch.equal(torch.rand(2), expected)  # the global RNG untouched


def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path):
    path = tmp_path / "ckpt.pt"
    _save(path)
    other = GPT(GPTConfig.from_preset("tiny", n_embd=16))
    opt = AdamW(weight_decay_groups(other, 0.1))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"model state in .*ckpt.pt does not fit the model: .*'wpe.weight': "
                                         r"\(\(16, 32\), \(16, 16\)\)"):
        load_checkpoint(path, model=other, optimizer=opt)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    fewer = GPT(GPTConfig.from_preset("tiny", n_layer=1))
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \[.*'blocks.1.attn"):
        load_checkpoint(path, model=fewer)
    same = GPT(TINY)
    with pytest.raises(ValueError, match="optimizer state in .*ckpt.pt does not fit the optimizer"):
        load_checkpoint(path, model=same, optimizer=AdamW(same.parameters()))  # one group, not two


def test_save_checkpoint_turns_numpy_scalars_into_numbers(tmp_path):
    path = tmp_path / "ckpt.pt"
    _save(path, metrics={"loss": np.float32(1.5), "n": np.int64(3), "t": torch.tensor(2.0),
                         "history": [{"ok": np.bool_(True)}], "pair": (np.float64(0.5), "a")})
    m = load_checkpoint(path)["metrics"]
    assert m == {"loss": 1.5, "n": 3, "t": 2.0, "history": [{"ok": True}], "pair": (0.5, "a")}
    assert [type(m[k]) for k in ("loss", "n", "t")] == [float, int, float]


@pytest.mark.parametrize("metrics,where", [
    ({"curve": np.zeros(3)}, r"metrics\['curve'\]"),
    ({"history": [{"loss": torch.ones(2)}]}, r"metrics\['history'\]\[0\]\['loss'\]"),
    ({"by_step": {1: 2.0}}, r"metrics\['by_step'\]"),
    ({"f": print}, r"metrics\['f'\]"),
])
def test_save_checkpoint_refuses_metrics_it_could_not_read_back(tmp_path, metrics, where):
    with pytest.raises(TypeError, match=f"save_checkpoint: {where} must be a plain value"):
        _save(tmp_path / "ckpt.pt", metrics=metrics)
    assert not list(tmp_path.iterdir())


def test_checkpoint_rejects_foreign_files(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(GPT(TINY).state_dict(), path)
    with pytest.raises(ValueError, match="found no format marker"):
        load_checkpoint(path)
    torch.save({"format": "other/1"}, path)
    with pytest.raises(ValueError, match="found format 'other/1'"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="load_checkpoint: path.*missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(IsADirectoryError, match="path"):
        load_checkpoint(tmp_path)


class _Payload:
    """A custom class: weights_only loading must refuse to construct it."""


def test_checkpoint_weights_only_refuses_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "payload": _Payload()}, path)
    with pytest.raises(ValueError, match="objects other than tensors"):
        load_checkpoint(path)


def test_save_checkpoint_errors(tmp_path, tiny_model, tiny_config):
    kw = dict(model=tiny_model, optimizer=AdamW(tiny_model.parameters()), step=0, model_config=tiny_config,
              train_config=small_config(), generator=torch.Generator())
    for name, bad, exc in [("train_config", {}, TypeError), ("model_config", tiny_config.to_dict(), TypeError),
                           ("generator", None, TypeError), ("metrics", [1], TypeError),
                           ("step", -1, ValueError), ("step", 1.0, TypeError)]:
        with pytest.raises(exc, match=f"save_checkpoint: {name}"):
            save_checkpoint(tmp_path / "c.pt", **{**kw, name: bad})
    with pytest.raises(TypeError, match="save_checkpoint: path"):
        save_checkpoint(None, **kw)
    with pytest.raises(FileNotFoundError, match="save_checkpoint: path: no such directory: .*missing"):
        save_checkpoint(tmp_path / "missing" / "c.pt", **kw)  # the folder is named, not a temporary file
    with pytest.raises(IsADirectoryError, match="save_checkpoint: path must be a file"):
        save_checkpoint(tmp_path, **kw)
    assert not list(tmp_path.iterdir())  # nothing written


def test_load_checkpoint_argument_errors(tmp_path):
    _save(tmp_path / "ckpt.pt")
    with pytest.raises(TypeError, match="load_checkpoint: generator"):
        load_checkpoint(tmp_path / "ckpt.pt", generator=1337)
    with pytest.raises(TypeError, match="load_checkpoint: model"):
        load_checkpoint(tmp_path / "ckpt.pt", model={})

