"""Unit tests for transformer_lib._checks (the utilities appendix, book/00_utilities.md): the checks added for issue 11 (dtype/device of
a module's input, devices of this machine, files to write)."""

import sys

import pytest
import torch

from transformer_lib._checks import check_device, check_like, check_memory, check_path, format_bytes


def test_check_like_accepts_the_reference_dtype_and_device():
    w = torch.zeros(3, 3)
    x = torch.ones(2, 3)
    assert check_like("f", "x", x, w) is x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_check_like_refuses_another_floating_dtype(dtype):
    with pytest.raises(TypeError, match=rf"f: x must have dtype float32 \(that of the module's parameters\), "
                                        rf"got x.dtype={dtype}; convert it with x.to\(torch.float32\) or the module"):
        check_like("f", "x", torch.ones(2, 3, dtype=dtype), torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_check_like_refuses_integers_even_under_autocast(dtype):
    x = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(TypeError, match=rf"f: x must have dtype float32 .*got x.dtype={dtype}"):
        check_like("f", "x", x, torch.zeros(3))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="f: x must have dtype"):
        check_like("f", "x", x, torch.zeros(3))


def test_check_like_accepts_another_float_dtype_under_autocast():
    x = torch.ones(2, 3, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert check_like("f", "x", x, torch.zeros(3)) is x


def test_check_like_refuses_another_device_and_non_tensors():
    with pytest.raises(ValueError, match=r"f: x must be on the device of the weights, cpu, got x.device=meta"):
        check_like("f", "x", torch.ones(2, device="meta"), torch.zeros(2), what="the weights")
    with pytest.raises(TypeError, match="f: x must be a tensor, got list"):
        check_like("f", "x", [1.0, 2.0], torch.zeros(2))


def test_check_device_available():
    assert check_device("f", "device", "cpu", available=True) == torch.device("cpu")
    assert check_device("f", "device", "meta", available=True) == torch.device("meta")
    assert check_device("f", "device", "cuda:7") == torch.device("cuda:7")  # only the name is checked
    if torch.cuda.device_count() < 8:
        with pytest.raises(ValueError, match=r"f: device must be a device of this machine, got device='cuda:7'"):
            check_device("f", "device", "cuda:7", available=True)
    with pytest.raises(ValueError, match="f: device must name a device such as 'cpu' or 'cuda', got device='banana'"):
        check_device("f", "device", "banana", available=True)
    with pytest.raises(TypeError, match="f: device must be a str or torch.device, got int"):
        check_device("f", "device", 0)


def test_check_path_output(tmp_path):
    assert check_path("f", "path", tmp_path / "new.json", kind="output") == tmp_path / "new.json"
    with pytest.raises(IsADirectoryError, match="f: path must be a file, got the directory"):
        check_path("f", "path", tmp_path, kind="output")
    with pytest.raises(FileNotFoundError, match="f: path: no such directory: .*missing"):
        check_path("f", "path", tmp_path / "missing" / "new.json", kind="output")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="f: path: .*file is a file, not the directory"):
        check_path("f", "path", tmp_path / "file" / "new.json", kind="output")


def test_check_path_outdir(tmp_path):
    # a directory to write into: existing or not, nested or not, but never a file or below one
    for p in (tmp_path, tmp_path / "new", tmp_path / "new" / "deeper"):
        assert check_path("f", "out", p, kind="outdir") == p
    assert not (tmp_path / "new").exists()  # checking creates nothing
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="f: out must be a directory, got the file .*file"):
        check_path("f", "out", tmp_path / "file", kind="outdir")
    with pytest.raises(NotADirectoryError, match="f: out .*file/a/b cannot be created: .*file is a file"):
        check_path("f", "out", tmp_path / "file" / "a" / "b", kind="outdir")


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 3 * 2**30 // 2, 2**60)] == [
        "0 bytes", "1,023 bytes", "1.0 KiB", "1.5 GiB", "1,024.0 PiB"]


def test_check_memory_refuses_what_cannot_fit_and_allows_what_can():
    check_memory("f", "a small tensor", 1024)  # the CPU, by default
    check_memory("f", "a small tensor", 1024, "cpu")
    with pytest.raises(ValueError, match=r"f: 2 x 10\*\*18 numbers would need 1,776.4 PiB, more than the "
                                         r".* of memory of the device cpu"):
        check_memory("f", "2 x 10**18 numbers", 2 * 10**18, torch.device("cpu"))
    check_memory("f", "shapes only", 2 * 10**18, "meta")  # no memory to run out of: never refused


def _calls_into_checks(fn) -> int:
    """How many times code outside ``_checks.py`` calls into it while ``fn()`` runs."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        caller = frame.f_back
        if (event == "call" and frame.f_code.co_filename.endswith("_checks.py") and caller is not None
                and not caller.f_code.co_filename.endswith("_checks.py")):
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_a_model_forward_checks_its_input_at_the_edge_only():
    """Validation happens where the ids enter, not again in every layer (issue 21): at most 3 calls per forward."""
    from transformer_lib import GPT, GPTConfig
    from transformer_lib.config import LlamaConfig
    from transformer_lib.llama import Llama

    torch.manual_seed(0)
    idx = torch.randint(0, 50, (2, 16))
    gpt = GPT(GPTConfig(n_layer=4, n_head=2, n_embd=32, block_size=16, vocab_size=50))
    llama = Llama(LlamaConfig(vocab_size=50, n_embd=32, n_layer=4, n_head=4, n_kv_head=2, n_inner=64, block_size=16))
    for model in (gpt, llama):
        assert 1 <= _calls_into_checks(lambda: model(idx, targets=idx)) <= 3, type(model).__name__
