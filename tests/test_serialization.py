"""Tests of transformer_lib.serialization: safetensors + config.json, saved and loaded (Chapter 15).

The reader path is ``model.save_pretrained(directory)`` / ``GPT.from_pretrained(directory)``, which
call ``save_pretrained`` and ``load_pretrained_state``; both are tested here.
"""

import json
import os
import pickle
import struct

import pytest
import safetensors
import safetensors.torch
import torch

from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.serialization import (
    CONFIG_NAME,
    SAFETENSORS_FORMAT,
    WEIGHTS_NAME,
    load_pretrained_state,
    save_pretrained,
)
from transformer_lib.utils import state_sha256, tensor_sha256


def make_model(seed: int = 0, **overrides) -> GPT:
    """A tiny GPT whose every parameter, layer norms included, holds distinct random values."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_preset("tiny", **overrides))
    with torch.no_grad():
        for p in model.parameters():  # the tied matrix is yielded once
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def ids(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 65, (batch, seq), generator=torch.Generator().manual_seed(seed))


def read_header(path) -> dict:
    """The JSON header of a safetensors file, parsed by hand (8-byte length, then JSON)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


@pytest.fixture
def saved(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path / "m")
    return model, tmp_path / "m"


def write_raw(directory, tensors, config=None, metadata=None):
    """A model directory written without save_pretrained (like a file from another tool)."""
    directory.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors, directory / WEIGHTS_NAME, metadata=metadata)
    (config or GPTConfig.from_preset("tiny")).to_json(directory / CONFIG_NAME)
    return directory


def stored_tensors(model):
    state = model.state_dict()
    return {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}


# --- round trip -------------------------------------------------------------------------------


def test_round_trip_is_exact(saved):
    model, directory = saved
    assert sorted(p.name for p in directory.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    loaded = GPT.from_pretrained(directory)
    assert isinstance(loaded, GPT) and not loaded.training
    assert loaded.config == model.config
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert theirs[k].dtype == ours[k].dtype and torch.equal(theirs[k], ours[k]), k
    x = ids(3, 16)
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])


def test_load_pretrained_state_is_ready_for_load_state_dict(saved):
    model, directory = saved
    config, state = load_pretrained_state(directory)
    assert config == model.config
    assert state.keys() == model.state_dict().keys()
    assert state["lm_head.weight"] is state["wte.weight"]  # the tied entry restored, one tensor
    assert all(t.device.type == "cpu" for t in state.values())
    fresh = GPT(config)
    fresh.load_state_dict(state, strict=True)
    assert fresh.lm_head.weight is fresh.wte.weight
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_any_header_length_loads(tmp_path, monkeypatch):
    """The first byte of a valid file is the low byte of its header length, 0x80 included (a
    pickle's first byte): whatever the metadata's length, the file loads."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # 600 writes; their durability is not the point here
    model = make_model()
    state = model.state_dict()
    first_bytes = set()
    for n in range(300):
        save_pretrained(model, tmp_path, metadata={"note": "x" * n})
        first_bytes.add((tmp_path / WEIGHTS_NAME).read_bytes()[0])
        _, loaded = load_pretrained_state(tmp_path)
        assert torch.equal(loaded["ln_f.weight"], state["ln_f.weight"]), n
    assert 0x80 in first_bytes


def test_from_pretrained_leaves_the_global_rng_alone(saved):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    GPT.from_pretrained(saved[1])
    assert torch.equal(torch.rand(3), expected)


def test_tied_weights_stored_once_and_restored_tied(saved):
    model, directory = saved
    header = read_header(directory / WEIGHTS_NAME)
    assert "wte.weight" in header and "lm_head.weight" not in header
    assert json.loads(header["__metadata__"]["tied"]) == {"lm_head.weight": "wte.weight"}
    loaded = GPT.from_pretrained(directory)
    assert loaded.lm_head.weight is loaded.wte.weight
    with torch.no_grad():
        loaded.wte.weight[0, 0] += 1.0
    assert loaded.lm_head.weight[0, 0] == loaded.wte.weight[0, 0]


def test_file_size_is_parameters_plus_header(saved):
    model, directory = saved
    raw = (directory / WEIGHTS_NAME).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    by_hand = json.loads(raw[8:8 + n])
    n_params = sum(p.numel() for p in model.parameters())
    assert len(raw) == 8 + n + 4 * n_params
    with safetensors.safe_open(directory / WEIGHTS_NAME, framework="pt") as f:  # the library agrees
        assert f.metadata() == by_hand.pop("__metadata__")
        assert sorted(f.keys()) == sorted(by_hand)
        for k, info in by_hand.items():
            assert f.get_slice(k).get_shape() == info["shape"] and f.get_slice(k).get_dtype() == info["dtype"]


def test_metadata_is_recorded(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path, metadata={"step": "200"})
    meta = read_header(tmp_path / WEIGHTS_NAME)["__metadata__"]
    assert meta["step"] == "200" and meta["format"] == SAFETENSORS_FORMAT and meta["dtype"] == "float32"
    assert json.loads(meta["config"]) == {"model_type": "gpt", **model.config.to_dict()}


def test_checksums_cover_every_stored_tensor_and_the_metadata(saved):
    model, directory = saved
    meta = read_header(directory / WEIGHTS_NAME)["__metadata__"]
    sums = json.loads(meta.pop("sha256"))
    state = model.state_dict()
    assert sums.pop("__metadata__") == state_sha256(meta)
    assert sums == {k: tensor_sha256(v) for k, v in state.items() if k != "lm_head.weight"}


def rewrite(directory, change_tensors=None, change_metadata=None):
    """Rewrite the weights file with the safetensors library, after changing its tensors or metadata."""
    path = directory / WEIGHTS_NAME
    tensors = safetensors.torch.load_file(path)
    with safetensors.safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    if change_tensors:
        change_tensors(tensors)
    if change_metadata:
        change_metadata(metadata)
    safetensors.torch.save_file(tensors, path, metadata=metadata)


@pytest.mark.parametrize("change_tensors,problem", [
    (lambda t: t["wpe.weight"].view(torch.int32)[2, 3].bitwise_xor_(1), r"the tensors \['wpe.weight'\]"),
    (lambda t: t.update({"wpe.weight": t["wpe.weight"].double()}), r"the tensors \['wpe.weight'\]"),
    (lambda t: t.update({"wpe.weight": t["wpe.weight"].reshape(32, 16).contiguous()}), "wpe.weight"),
    (lambda t: t.pop("ln_f.bias"), r"the set of tensors \(missing \['ln_f.bias'\], unexpected \[\]\)"),
    (lambda t: t.update({"extra": torch.zeros(2)}), r"unexpected \['extra'\]"),
])
def test_changed_tensors_are_refused_naming_the_file(saved, change_tensors, problem):
    _, directory = saved
    rewrite(directory, change_tensors=change_tensors)
    with pytest.raises(ValueError, match=f"load_pretrained_state: .*{WEIGHTS_NAME} was modified or corrupted "
                                         f"after it was written: checksum mismatch in .*{problem}"):
        load_pretrained_state(directory)
    with pytest.raises(ValueError, match="checksum mismatch"):  # GPT.from_pretrained goes through it
        GPT.from_pretrained(directory)


@pytest.mark.parametrize("change_metadata", [
    lambda m: m.update(trained_steps="201"),
    lambda m: m.update(tied="{}"),
    lambda m: m.update(dtype="bfloat16"),
    lambda m: m.update(note="added"),
    lambda m: m.update(format="transformer_lib.gpt/2"),
])
def test_changed_metadata_is_refused(tmp_path, change_metadata):
    make_model().save_pretrained(tmp_path, metadata={"trained_steps": "200"})
    rewrite(tmp_path, change_metadata=change_metadata)
    with pytest.raises(ValueError, match="was modified or corrupted after it was written: checksum mismatch in "
                                         "the metadata"):
        load_pretrained_state(tmp_path)


def test_our_marker_without_checksums_is_refused_and_other_files_load_unverified(saved):
    model, directory = saved
    rewrite(directory, change_metadata=lambda m: m.pop("sha256"))
    with pytest.raises(ValueError, match=f"{WEIGHTS_NAME} carries the format marker '{SAFETENSORS_FORMAT}' but "
                                         "no checksums"):
        load_pretrained_state(directory)
    # a file from another tool (Hugging Face writes {"format": "pt"}) has nothing to verify against
    write_raw(directory, stored_tensors(model), metadata={"format": "pt"})
    _, state = load_pretrained_state(directory)
    assert torch.equal(state["wte.weight"], model.wte.weight)
    sums = {k: tensor_sha256(v) for k, v in stored_tensors(model).items()}
    write_raw(directory, stored_tensors(model), metadata={"sha256": json.dumps(sums)})  # without __metadata__
    with pytest.raises(ValueError, match="checksum mismatch in the metadata"):
        load_pretrained_state(directory)
    write_raw(directory, stored_tensors(model), metadata={"sha256": "[1, 2]"})
    with pytest.raises(ValueError, match=f"{WEIGHTS_NAME} is corrupt: its metadata entry 'sha256' is not"):
        load_pretrained_state(directory)


def test_bfloat16_round_trip(tmp_path):
    model = make_model().to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    _, state = load_pretrained_state(tmp_path)
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    loaded = GPT.from_pretrained(tmp_path)
    assert loaded.wte.weight.dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_either_name_of_the_tied_pair_may_be_stored(tmp_path):
    model = make_model()
    tensors = stored_tensors(model)
    tensors["lm_head.weight"] = tensors.pop("wte.weight")
    loaded = GPT.from_pretrained(write_raw(tmp_path / "d", tensors))
    assert loaded.lm_head.weight is loaded.wte.weight
    assert torch.equal(loaded.wte.weight, model.wte.weight)


def test_tied_pair_stored_twice_with_different_values_is_refused(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["lm_head.weight"] = tensors["wte.weight"] + 1.0
    with pytest.raises(ValueError, match="'wte.weight' and 'lm_head.weight' are one tied tensor"):
        load_pretrained_state(write_raw(tmp_path / "d", tensors))


# --- atomic writes ----------------------------------------------------------------------------


def test_failed_write_leaves_previous_files_intact(saved, monkeypatch):
    model, directory = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    real_fdopen = os.fdopen

    class HalfThenFail:
        """Writes half of the bytes, then fails as a full disk would."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
            return False

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: HalfThenFail(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="No space left"):
        make_model(seed=1).save_pretrained(directory)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # no temporary file left
    assert torch.equal(GPT.from_pretrained(directory).wte.weight, model.wte.weight)


def test_failed_rename_leaves_no_temporary_file(saved, monkeypatch):
    _, directory = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}

    def fail(*args):
        raise OSError("rename failed")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="rename failed"):
        make_model(seed=1).save_pretrained(directory)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


# --- bad input to save_pretrained -------------------------------------------------------------


def test_save_pretrained_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="model"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(TypeError, match="metadata"):
        make_model().save_pretrained(tmp_path, metadata={"step": 200})
    with pytest.raises(ValueError, match=r"metadata.*\['config'\]"):
        make_model().save_pretrained(tmp_path, metadata={"config": "{}"})
    with pytest.raises(TypeError, match="directory"):
        save_pretrained(make_model(), 3)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="save_pretrained: directory must be a directory, got the file .*a_file"):
        make_model().save_pretrained(tmp_path / "a_file")
    with pytest.raises(NotADirectoryError, match="save_pretrained: directory .*a_file/run cannot be created"):
        make_model().save_pretrained(tmp_path / "a_file" / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


def test_save_pretrained_creates_missing_folders(tmp_path):
    make_model().save_pretrained(tmp_path / "a" / "b")
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]


# --- bad files --------------------------------------------------------------------------------


def test_missing_directory_and_files(saved, tmp_path):
    _, directory = saved
    with pytest.raises(FileNotFoundError, match="directory"):
        load_pretrained_state(tmp_path / "nowhere")
    with pytest.raises(NotADirectoryError, match="directory"):
        load_pretrained_state(directory / CONFIG_NAME)
    (directory / CONFIG_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_pretrained_state(directory)
    (directory / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        load_pretrained_state(directory)


def test_empty_random_and_directory_weights(saved):
    _, directory = saved
    path = directory / WEIGHTS_NAME
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"load_pretrained_state: .*{WEIGHTS_NAME} is empty"):
        load_pretrained_state(directory)
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")  # a header length of a terabyte
    with pytest.raises(ValueError, match=f"{WEIGHTS_NAME} is not a valid safetensors file"):
        load_pretrained_state(directory)
    path.unlink()
    path.mkdir()
    with pytest.raises(IsADirectoryError, match=f"load_pretrained_state: .*{WEIGHTS_NAME} must be a file"):
        GPT.from_pretrained(directory)


def test_config_json_not_utf8_or_a_directory(saved):
    _, directory = saved
    path = directory / CONFIG_NAME
    path.write_bytes(b'{"n_layer": 2, "\xff": 1}')
    with pytest.raises(ValueError, match=f"load_pretrained_state: .*{CONFIG_NAME} is not a valid model "
                                         "configuration: .*utf-8"):
        GPT.from_pretrained(directory)
    path.unlink()
    path.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{CONFIG_NAME} must be a file, got a directory"):
        load_pretrained_state(directory)


def test_truncated_file(saved):
    _, directory = saved
    path = directory / WEIGHTS_NAME
    raw = path.read_bytes()
    for cut in (raw[:-4], raw[:100], raw[:5]):  # in the tensor data, in the header, in the length
        path.write_bytes(cut)
        with pytest.raises(ValueError, match=r"load_pretrained_state: .* is not a valid safetensors file"):
            load_pretrained_state(directory)


ran = []


def _record_call(message):
    ran.append(message)


class _Payload:
    def __reduce__(self):
        return (_record_call, ("code from the file ran",))


def test_pickle_files_are_refused_and_never_unpickled(saved):
    model, directory = saved
    path = directory / WEIGHTS_NAME
    path.write_bytes(pickle.dumps({"payload": _Payload()}, protocol=4))
    with pytest.raises(ValueError, match="not a valid safetensors file.*it is a Python pickle"):
        load_pretrained_state(directory)
    with pytest.raises(ValueError, match="a Python pickle"):
        GPT.from_pretrained(directory)
    torch.save({"payload": _Payload(), **model.state_dict()}, path)
    with pytest.raises(ValueError, match="not a valid safetensors file.*zip archive, as torch.save writes"):
        load_pretrained_state(directory)
    path.write_bytes(pickle.dumps({"payload": _Payload()}, protocol=0))  # protocol 0 has no marker byte
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        load_pretrained_state(directory)
    assert ran == []


def test_header_that_is_not_json_or_whose_offsets_disagree(saved):
    _, directory = saved
    path = directory / WEIGHTS_NAME
    path.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    with pytest.raises(ValueError, match="not a valid safetensors file.*UTF-8"):
        load_pretrained_state(directory)
    path.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ValueError, match="not a valid safetensors file.*JSON"):
        load_pretrained_state(directory)
    header = json.dumps({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(20))
    with pytest.raises(ValueError, match="not a valid safetensors file.*offset"):
        load_pretrained_state(directory)
    header = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    with pytest.raises(ValueError, match="not a valid safetensors file.*offset for tensor `b`"):
        load_pretrained_state(directory)


def test_wrong_shape_names_the_tensor(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["wpe.weight"] = torch.zeros(8, 32)
    # a file from another tool (no checksums): GPT.load_state_dict names the tensor
    with pytest.raises((RuntimeError, ValueError), match=r"wpe.weight"):
        GPT.from_pretrained(write_raw(tmp_path / "d", tensors))


def test_mixed_dtypes_name_the_tensor(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["ln_f.bias"] = tensors["ln_f.bias"].half()
    with pytest.raises(ValueError, match=r"one dtype, 'float32'.*'ln_f.bias': 'float16'"):
        load_pretrained_state(write_raw(tmp_path / "d", tensors))
    tensors = {k: v.long() for k, v in stored_tensors(make_model()).items()}
    with pytest.raises(ValueError, match="not a floating dtype"):
        load_pretrained_state(write_raw(tmp_path / "e", tensors))


def test_missing_and_unexpected_tensors(tmp_path):
    tensors = stored_tensors(make_model())
    del tensors["blocks.1.mlp.fc2.bias"]
    tensors["extra.weight"] = torch.zeros(2)
    with pytest.raises((RuntimeError, ValueError), match=r"(?s)(?=.*extra\.weight)(?=.*blocks\.1\.mlp\.fc2\.bias)"):
        GPT.from_pretrained(write_raw(tmp_path / "d", tensors))


def test_foreign_config(saved):
    _, directory = saved
    hf_style = {"model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
    (directory / CONFIG_NAME).write_text(json.dumps(hf_style))
    with pytest.raises(ValueError, match=r"config.json is not a valid model configuration: model_type must be one of \['gpt'\], got model_type='gpt2'"):
        load_pretrained_state(directory)
    (directory / CONFIG_NAME).write_text("not json")
    with pytest.raises(ValueError, match="config.json is not a valid model configuration"):
        load_pretrained_state(directory)
    GPTConfig.from_preset("tiny", n_layer=1).to_json(directory / CONFIG_NAME)
    with pytest.raises(ValueError, match="config.json and .*model.safetensors come from different models"):
        load_pretrained_state(directory)


def test_save_is_reproducible_with_sorted_metadata(tmp_path):
    """The safetensors library orders the metadata by a hash map that changes from call to call;
    save_pretrained sorts it, so saving the same model again gives the same bytes."""
    model = make_model()
    files = []
    for i in range(4):
        save_pretrained(model, tmp_path / str(i), metadata={k: k.upper() for k in "zyxwvu"})
        files.append((tmp_path / str(i) / WEIGHTS_NAME).read_bytes())
    assert all(f == files[0] for f in files[1:])
    (n,) = struct.unpack("<Q", files[0][:8])
    assert n % 8 == 0
    metadata = json.loads(files[0][8:8 + n])["__metadata__"]
    assert list(metadata) == sorted(metadata) and metadata["z"] == "Z"
    with safetensors.safe_open(tmp_path / "0" / WEIGHTS_NAME, framework="pt") as f:
        assert f.metadata() == metadata
