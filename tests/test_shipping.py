"""Tests of transformer_lib.shipping: safetensors save/load and ONNX export (Chapter 15)."""

import importlib.util
import json
import os
import pickle
import struct

import pytest
import safetensors.torch
import torch

from transformer_lib import shipping
from transformer_lib.model import GPT, GPTConfig
from transformer_lib.shipping import (
    CONFIG_NAME,
    SAFETENSORS_FORMAT,
    WEIGHTS_NAME,
    OnnxGPT,
    export_onnx,
    load_pretrained,
    read_safetensors_header,
    save_pretrained,
)

HAVE_ONNX = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript", "onnxruntime"))
needs_onnx = pytest.mark.skipif(
    not HAVE_ONNX, reason="onnx, onnxscript and onnxruntime are not installed (pip install 'transformer_lib[onnx]')"
)


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


@pytest.fixture
def saved(tmp_path):
    model = make_model()
    save_pretrained(model, tmp_path / "m")
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


# --- safetensors round trip -------------------------------------------------------------------


def test_round_trip_is_exact(saved):
    model, directory = saved
    assert sorted(p.name for p in directory.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    loaded = load_pretrained(directory)
    assert isinstance(loaded, GPT) and not loaded.training
    assert loaded.config == model.config
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert theirs[k].dtype == ours[k].dtype and torch.equal(theirs[k], ours[k]), k
    x = ids(3, 16)
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])


def test_loading_leaves_the_global_rng_alone(saved):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_pretrained(saved[1])
    assert torch.equal(torch.rand(3), expected)


def test_tied_weights_stored_once_and_restored_tied(saved):
    model, directory = saved
    header = read_safetensors_header(directory / WEIGHTS_NAME)
    assert "wte.weight" in header and "lm_head.weight" not in header
    assert json.loads(header["__metadata__"]["tied"]) == {"lm_head.weight": "wte.weight"}
    loaded = load_pretrained(directory)
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
    assert read_safetensors_header(directory / WEIGHTS_NAME) == by_hand


def test_metadata_is_recorded(tmp_path):
    model = make_model()
    save_pretrained(model, tmp_path, metadata={"step": "200"})
    meta = read_safetensors_header(tmp_path / WEIGHTS_NAME)["__metadata__"]
    assert meta["step"] == "200" and meta["format"] == SAFETENSORS_FORMAT and meta["dtype"] == "float32"
    assert json.loads(meta["config"]) == model.config.to_dict()


def test_bfloat16_round_trip(tmp_path):
    model = make_model().to(torch.bfloat16)
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.wte.weight.dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_either_name_of_the_tied_pair_may_be_stored(tmp_path):
    model = make_model()
    tensors = stored_tensors(model)
    tensors["lm_head.weight"] = tensors.pop("wte.weight")
    loaded = load_pretrained(write_raw(tmp_path / "d", tensors))
    assert loaded.lm_head.weight is loaded.wte.weight
    assert torch.equal(loaded.wte.weight, model.wte.weight)


def test_tied_pair_stored_twice_with_different_values_is_refused(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["lm_head.weight"] = tensors["wte.weight"] + 1.0
    with pytest.raises(ValueError, match="'wte.weight' and 'lm_head.weight' are one tied tensor"):
        load_pretrained(write_raw(tmp_path / "d", tensors))


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

    monkeypatch.setattr(shipping.os, "fdopen", lambda fd, *a, **k: HalfThenFail(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="No space left"):
        save_pretrained(make_model(seed=1), directory)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # no temporary file left
    assert torch.equal(load_pretrained(directory).wte.weight, model.wte.weight)


def test_failed_rename_leaves_no_temporary_file(saved, monkeypatch):
    _, directory = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}

    def fail(*args):
        raise OSError("rename failed")

    monkeypatch.setattr(shipping.os, "replace", fail)
    with pytest.raises(OSError, match="rename failed"):
        save_pretrained(make_model(seed=1), directory)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


# --- bad input to save_pretrained -------------------------------------------------------------


def test_save_pretrained_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="model must be a GPT"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(TypeError, match="metadata must be a mapping of str to str"):
        save_pretrained(make_model(), tmp_path, metadata={"step": 200})
    with pytest.raises(ValueError, match=r"metadata must not use the reserved keys \['config'\]"):
        save_pretrained(make_model(), tmp_path, metadata={"config": "{}"})
    assert list(tmp_path.iterdir()) == []


# --- bad files --------------------------------------------------------------------------------


def test_missing_directory_and_files(saved, tmp_path):
    _, directory = saved
    with pytest.raises(FileNotFoundError, match="no directory"):
        load_pretrained(tmp_path / "nowhere")
    (directory / CONFIG_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_pretrained(directory)
    (directory / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        load_pretrained(directory)
    with pytest.raises(FileNotFoundError, match="read_safetensors_header: no file"):
        read_safetensors_header(directory / WEIGHTS_NAME)


def test_truncated_file(saved):
    _, directory = saved
    path = directory / WEIGHTS_NAME
    raw = path.read_bytes()
    path.write_bytes(raw[:-4])
    with pytest.raises(ValueError, match=r"load_pretrained: .* describes \d+ bytes of tensor data but the file holds"):
        load_pretrained(directory)
    path.write_bytes(raw[:100])  # cut inside the header
    with pytest.raises(ValueError, match="header length of .* bytes, but the file has 100 bytes"):
        load_pretrained(directory)
    path.write_bytes(raw[:5])
    with pytest.raises(ValueError, match="fewer than the 8 of the header length"):
        load_pretrained(directory)


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
    with pytest.raises(ValueError, match="starts like a Python pickle"):
        load_pretrained(directory)
    torch.save(model.state_dict(), path)
    with pytest.raises(ValueError, match="starts like a zip archive, as torch.save writes"):
        load_pretrained(directory)
    assert ran == []


def test_header_that_is_not_json(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    with pytest.raises(ValueError, match="is not UTF-8 JSON"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ValueError, match="header is a JSON list, not an object"):
        read_safetensors_header(path)


def test_header_whose_offsets_disagree(tmp_path):
    path = tmp_path / "x.safetensors"
    header = json.dumps({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(20))
    with pytest.raises(ValueError, match=r"tensor 'a' has dtype F32 and shape \[2, 3\] \(24 bytes\)"):
        read_safetensors_header(path)
    header = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    with pytest.raises(ValueError, match="tensor 'b' starts at byte 8 of the data, expected 4"):
        read_safetensors_header(path)


def test_wrong_shape_names_the_tensor(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["wpe.weight"] = torch.zeros(8, 32)
    with pytest.raises(ValueError, match=r"tensor 'wpe.weight' .* has shape \(8, 32\), the configuration expects \(16, 32\)"):
        load_pretrained(write_raw(tmp_path / "d", tensors))


def test_wrong_dtype_names_the_tensor(tmp_path):
    tensors = stored_tensors(make_model())
    tensors["ln_f.bias"] = tensors["ln_f.bias"].half()
    with pytest.raises(ValueError, match="tensor 'ln_f.bias' .* has dtype F16, expected torch.float32"):
        load_pretrained(write_raw(tmp_path / "d", tensors))


def test_missing_and_unexpected_tensors(tmp_path):
    tensors = stored_tensors(make_model())
    del tensors["blocks.1.mlp.fc2.bias"]
    tensors["extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"missing \['blocks.1.mlp.fc2.bias'\], unexpected \['extra.weight'\]"):
        load_pretrained(write_raw(tmp_path / "d", tensors))
    del tensors["extra.weight"], tensors["wte.weight"]
    tensors["blocks.1.mlp.fc2.bias"] = torch.zeros(32)
    with pytest.raises(ValueError, match=r"missing \['wte.weight or lm_head.weight'\]"):
        load_pretrained(write_raw(tmp_path / "e", tensors))


def test_foreign_config(saved):
    _, directory = saved
    hf_style = {"model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}
    (directory / CONFIG_NAME).write_text(json.dumps(hf_style))
    with pytest.raises(ValueError, match=r"config.json is not a valid GPT configuration: .*unknown keys"):
        load_pretrained(directory)
    (directory / CONFIG_NAME).write_text("not json")
    with pytest.raises(ValueError, match="config.json is not a valid GPT configuration"):
        load_pretrained(directory)
    GPTConfig.from_preset("tiny", n_layer=1).to_json(directory / CONFIG_NAME)
    with pytest.raises(ValueError, match="config.json and model.safetensors .* come from different models"):
        load_pretrained(directory)


def test_bad_device(saved):
    with pytest.raises(ValueError, match="device must name a torch device"):
        load_pretrained(saved[1], device="gpu0")


# --- ONNX -------------------------------------------------------------------------------------


def test_export_onnx_rejects_bad_arguments(tmp_path):
    model, path = make_model(), tmp_path / "m.onnx"
    with pytest.raises(TypeError, match="model must be a GPT"):
        export_onnx(torch.nn.Linear(2, 2), path)
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        export_onnx(model, path, batch_size=1)
    with pytest.raises(ValueError, match=r"seq_len must be in \[2, block_size=16\], got seq_len=17"):
        export_onnx(model, path, seq_len=17)
    with pytest.raises(ValueError, match="opset must be >= 18"):
        export_onnx(model, path, opset=17)
    with pytest.raises(TypeError, match="dynamic must be a bool"):
        export_onnx(model, path, dynamic=1)
    assert not path.exists()


def test_missing_onnx_packages_name_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install 'transformer_lib\[onnx\]'"):
        export_onnx(make_model(), tmp_path / "m.onnx")
    with pytest.raises(ImportError, match=r"transformer_lib\[onnx\]"):
        OnnxGPT(tmp_path / "m.onnx")


@pytest.fixture(scope="module")
def dynamic_export(tmp_path_factory):
    model = make_model(seed=3)
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    export_onnx(model, path)
    return model, path


@needs_onnx
def test_onnx_matches_pytorch_at_two_shapes(dynamic_export):
    model, path = dynamic_export
    runner = OnnxGPT(path)
    for shape in [(1, 16), (3, 5)]:
        x = ids(*shape, seed=sum(shape))
        got = runner(x)
        with torch.no_grad():
            want = model(x)[0]
        assert got.shape == (*shape, 65) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)  # float32, other kernels


@needs_onnx
def test_onnx_file_declares_dynamic_axes_and_config(dynamic_export):
    import onnx

    model, path = dynamic_export
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    (inp,), (out,) = proto.graph.input, proto.graph.output

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert (inp.name, dims(inp), inp.type.tensor_type.elem_type) == ("idx", ["batch", "seq"], onnx.TensorProto.INT64)
    assert (out.name, dims(out), out.type.tensor_type.elem_type) == ("logits", ["batch", "seq", 65], onnx.TensorProto.FLOAT)
    assert proto.opset_import[0].version == 18
    assert all(len(n.metadata_props) == 0 for n in proto.graph.node)  # no stack traces or local paths
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["transformer_lib.config"]) == model.config.to_dict()
    assert OnnxGPT(path).input_shape == ("batch", "seq")


@needs_onnx
def test_onnx_runner_validates_inputs(dynamic_export):
    runner = OnnxGPT(dynamic_export[1])
    with pytest.raises(ValueError, match="idx has T=17 positions but block_size=16"):
        runner(ids(1, 17))
    with pytest.raises(ValueError, match="idx holds the id 65, outside"):
        runner(torch.full((1, 4), 65))
    with pytest.raises(TypeError, match="idx must be an int64 tensor"):
        runner(ids(1, 4).int())
    with pytest.raises(ValueError, match=r"idx must have shape \(B, T\)"):
        runner(ids(1, 4)[0])


@needs_onnx
def test_fixed_shape_export_in_eval_mode_restores_training_mode(tmp_path):
    model = make_model(seed=4, dropout=0.2).train()
    path = tmp_path / "fixed.onnx"
    export_onnx(model, path, batch_size=1, seq_len=8, dynamic=False)
    assert model.training  # the mode is restored
    runner = OnnxGPT(path)
    assert runner.input_shape == (1, 8)
    x = ids(1, 8)
    with torch.no_grad():
        want = model.eval()(x)[0]  # no dropout in the export
    torch.testing.assert_close(runner(x), want, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match=r"fixed input shape \(1, 8\), got idx.shape=\(2, 8\)"):
        runner(ids(2, 8))


@needs_onnx
def test_onnx_runner_rejects_other_files(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    with pytest.raises(FileNotFoundError, match="no file"):
        OnnxGPT(tmp_path / "none.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ValueError, match="ONNX Runtime cannot load"):
        OnnxGPT(junk)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    other = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), other)
    with pytest.raises(ValueError, match="was not written by export_onnx"):
        OnnxGPT(other)
