"""Tests of transformer_lib.shipping: ONNX export and the ONNX Runtime runner (Chapter 15).

The safetensors files of ``save_pretrained``/``from_pretrained`` are tested in test_serialization.py.
The tests that export or run a graph need the optional packages of ``transformer_lib[onnx]`` and
skip without them (the ``onnx_packages`` fixture).
"""

import hashlib
import json
import shutil
import sys

import pytest
import torch

from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.shipping import CHECKSUM_SUFFIX, OnnxGPT, export_onnx


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


@pytest.fixture(scope="module")
def onnx_packages():
    """onnx, with onnxscript and onnxruntime present; skips the test without them."""
    reason = "onnx, onnxscript and onnxruntime are not installed (pip install 'transformer_lib[onnx]')"
    onnx = pytest.importorskip("onnx", reason=reason)
    pytest.importorskip("onnxscript", reason=reason)
    pytest.importorskip("onnxruntime", reason=reason)
    return onnx


@pytest.fixture(scope="module")
def dynamic_export(onnx_packages, tmp_path_factory):
    model = make_model(seed=3)
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    export_onnx(model, path)
    return model, path


def test_export_onnx_rejects_bad_arguments(tmp_path):
    model, path = make_model(), tmp_path / "m.onnx"
    with pytest.raises(FileNotFoundError, match="export_onnx: path: no such directory: .*missing"):
        export_onnx(model, tmp_path / "missing" / "m.onnx")
    with pytest.raises(IsADirectoryError, match="export_onnx: path must be a file"):
        export_onnx(model, tmp_path)
    with pytest.raises(TypeError, match="model"):
        export_onnx(torch.nn.Linear(2, 2), path)
    with pytest.raises(ValueError, match="batch_size"):
        export_onnx(model, path, batch_size=1)
    with pytest.raises(ValueError, match=r"seq_len.*\[2, 16\].*seq_len=17"):
        export_onnx(model, path, seq_len=17)
    with pytest.raises(ValueError, match="opset"):
        export_onnx(model, path, opset=17)
    with pytest.raises(TypeError, match="dynamic"):
        export_onnx(model, path, dynamic=1)
    with pytest.raises(TypeError, match="path"):
        export_onnx(model, None)
    assert not path.exists()


def test_missing_onnx_packages_name_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install 'transformer_lib\[onnx\]'"):
        export_onnx(make_model(), tmp_path / "m.onnx")
    with pytest.raises(ImportError, match=r"transformer_lib\[onnx\]"):
        OnnxGPT(tmp_path / "m.onnx")


@pytest.mark.slow  # exporting takes seconds
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


@pytest.mark.slow  # exporting takes seconds
def test_onnx_file_declares_dynamic_axes_and_config(onnx_packages, dynamic_export):
    onnx = onnx_packages
    model, path = dynamic_export
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    (inp,), (out,) = proto.graph.input, proto.graph.output  # one output: the None loss is left out

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    assert (inp.name, dims(inp), inp.type.tensor_type.elem_type) == ("idx", ["batch", "seq"], onnx.TensorProto.INT64)
    assert (out.name, dims(out), out.type.tensor_type.elem_type) == ("logits", ["batch", "seq", 65], onnx.TensorProto.FLOAT)
    assert proto.opset_import[0].version == 18
    assert all(len(n.metadata_props) == 0 for n in proto.graph.node)  # no stack traces or local paths
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["transformer_lib.config"]) == model.config.to_dict()
    assert OnnxGPT(path).input_shape == ("batch", "seq")
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.onnx", "tiny.onnx.sha256"]  # no temporary file
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (path.parent / "tiny.onnx.sha256").read_text() == f"{digest}  tiny.onnx\n"  # sha256sum's format


@pytest.mark.slow  # exporting takes seconds
def test_onnx_file_changed_after_export_is_refused(dynamic_export, tmp_path):
    _, exported = dynamic_export
    path = tmp_path / "tiny.onnx"
    shutil.copy(exported, path)
    shutil.copy(exported.with_name("tiny.onnx.sha256"), tmp_path / "tiny.onnx.sha256")
    raw = path.read_bytes()
    middle = len(raw) // 2
    noise = bytes(torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).tolist())
    path.write_bytes(raw[:middle] + noise + raw[middle + 64:])
    with pytest.raises(ValueError, match="OnnxGPT: .*tiny.onnx was modified or corrupted after it was exported: "
                                         "checksum mismatch"):
        OnnxGPT(path)
    path.write_bytes(raw)
    assert OnnxGPT(path).config.vocab_size == 65


@pytest.mark.slow  # exporting takes seconds
def test_onnx_runner_validates_inputs(dynamic_export):
    runner = OnnxGPT(dynamic_export[1])
    with pytest.raises(ValueError, match=r"idx.*block_size=16.*\(1, 17\)"):
        runner(ids(1, 17))
    with pytest.raises(ValueError, match="idx.*65"):
        runner(torch.full((1, 4), 65))
    with pytest.raises(ValueError, match="idx.*-1"):
        runner(torch.full((1, 4), -1))
    with pytest.raises(TypeError, match="idx.*int64"):
        runner(ids(1, 4).int())
    with pytest.raises(ValueError, match="idx.*2-D"):
        runner(ids(1, 4)[0])
    with pytest.raises(TypeError, match="num_threads"):
        OnnxGPT(dynamic_export[1], num_threads=1.5)
    with pytest.raises(ValueError, match="num_threads"):
        OnnxGPT(dynamic_export[1], num_threads=0)


@pytest.mark.slow  # exporting takes seconds
def test_fixed_shape_export_in_eval_mode_restores_training_mode(onnx_packages, tmp_path):
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
    with pytest.raises(ValueError, match=r"idx.*fixed shape \(1, 8\).*\(2, 8\)"):
        runner(ids(2, 8))


def identity_model(onnx, path):
    """A valid ONNX file that export_onnx did not write (one Identity node), without a checksum file."""
    helper, TensorProto = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_onnx_runner_rejects_other_files(onnx_packages, tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        OnnxGPT(tmp_path / "none.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ValueError, match="ONNX Runtime cannot load"):
        OnnxGPT(junk, verify=False)
    other = identity_model(onnx_packages, tmp_path / "other.onnx")
    with pytest.raises(ValueError, match="was not written by export_onnx"):
        OnnxGPT(other, verify=False)


def test_onnx_runner_verifies_the_checksum_before_loading(onnx_packages, tmp_path):
    path = identity_model(onnx_packages, tmp_path / "m.onnx")
    sums = tmp_path / ("m.onnx" + CHECKSUM_SUFFIX)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(FileNotFoundError, match=r"OnnxGPT: .*m.onnx has no checksum file m.onnx.sha256 .*"
                                                "sha256=.*verify=False"):
        OnnxGPT(path)
    for good in (f"{digest}  m.onnx\n", f"{digest.upper()} *m.onnx\n", digest):  # what sha256sum writes, or less
        sums.write_text(good)
        with pytest.raises(ValueError, match="was not written by export_onnx"):  # verified, then loaded
            OnnxGPT(path)
    with pytest.raises(ValueError, match="was not written by export_onnx"):
        OnnxGPT(path, sha256=digest)
    sums.write_text("0" * 64 + "  m.onnx\n")
    with pytest.raises(ValueError, match=r"m.onnx was modified or corrupted after it was exported: checksum "
                                         r"mismatch \(expected 0000000000000000... from m.onnx.sha256"):
        OnnxGPT(path)
    with pytest.raises(ValueError, match="checksum mismatch .*from sha256"):
        OnnxGPT(path, sha256="f" * 64)
    for bad in ("", "not a checksum  m.onnx", "\xff" * 70):
        sums.write_text(bad, encoding="latin-1")
        with pytest.raises(ValueError, match="m.onnx.sha256"):
            OnnxGPT(path)
    sums.unlink()
    sums.mkdir()
    with pytest.raises((OSError, ValueError), match="m.onnx.sha256"):
        OnnxGPT(path)
    with pytest.raises(ValueError, match="OnnxGPT: sha256 must be 64 hex digits"):
        OnnxGPT(path, sha256="abc")
    with pytest.raises(ValueError, match="OnnxGPT: sha256 .* verify=False"):
        OnnxGPT(path, sha256=digest, verify=False)
    with pytest.raises(TypeError, match="OnnxGPT: verify"):
        OnnxGPT(path, verify="no")


def test_a_llama_exports_and_runs_in_onnx_runtime(tmp_path, onnx_packages):
    from transformer_lib.config import LlamaConfig
    from transformer_lib.llama import Llama

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=65, n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64,
                              block_size=16, qk_norm=True)).eval()
    path = tmp_path / "llama.onnx"
    export_onnx(model, path)
    runner = OnnxGPT(path)
    assert runner.config == model.config  # read back as a LlamaConfig, from the recorded model_type
    for seq in (16, 5, 1):  # the exported graph takes any length up to block_size
        x = ids(2, seq)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), model(x)[0], rtol=1e-4, atol=1e-5)  # float32 kernels differ
