"""Unit tests for transformer_lib.embeddings (chapter 3), against loop formulas, complex arithmetic and nn.Embedding."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from transformer_lib.embeddings import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    apply_rope,
    rope_angles,
    sinusoidal_positions,
)

META = torch.device("meta")


def sinusoidal_loop(T, d, base=10000.0):
    """The formula of Vaswani et al. one entry at a time, in float64."""
    pe = np.zeros((T, d))
    for p in range(T):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            pe[p, 2 * i] = math.sin(angle)
            pe[p, 2 * i + 1] = math.cos(angle)
    return torch.from_numpy(pe)


def rope_complex(x, positions, base=10000.0):
    """Reference RoPE: view_as_complex(x) * exp(1j * position * theta), computed in float64."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * theta
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


# ---------------------------------------------------------------- sinusoidal_positions


@pytest.mark.parametrize("T, d, base", [(1, 2, 10000.0), (50, 16, 10000.0), (37, 6, 100.0), (20, 10, 2.5)])
def test_sinusoidal_positions_matches_loop_formula(T, d, base):
    ours64 = sinusoidal_positions(T, d, base=base, dtype=torch.float64)
    ref = sinusoidal_loop(T, d, base)
    assert ours64.shape == (T, d) and ours64.dtype == torch.float64
    torch.testing.assert_close(ours64, ref, rtol=0, atol=1e-12)
    ours32 = sinusoidal_positions(T, d, base=base)
    assert ours32.dtype == torch.float32
    # float32 is the float64 table rounded once: half an ulp of numbers <= 1.
    torch.testing.assert_close(ours32.double(), ref, rtol=0, atol=1e-7)


def test_sinusoidal_positions_matches_annotated_transformer_recipe():
    T, d = 200, 32
    position = torch.arange(0, T, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    ref = torch.zeros(T, d, dtype=torch.float64)
    ref[:, 0::2] = torch.sin(position * div_term)
    ref[:, 1::2] = torch.cos(position * div_term)
    torch.testing.assert_close(sinusoidal_positions(T, d, dtype=torch.float64), ref, rtol=0, atol=1e-12)


def test_sinusoidal_positions_first_rows_and_norm():
    pe = sinusoidal_positions(100, 12, dtype=torch.float64)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 6, dtype=torch.float64))
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-15)  # pair 0 has frequency 1
    torch.testing.assert_close(pe.norm(dim=1), torch.full((100,), math.sqrt(6), dtype=torch.float64), rtol=0, atol=1e-12)


def test_sinusoidal_shift_is_a_rotation_and_dot_depends_on_offset_only():
    T, d, k = 120, 16, 7
    pe = sinusoidal_positions(T, d, dtype=torch.float64)
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.stack([torch.stack([c[i], s[i]]), torch.stack([-s[i], c[i]])])
    torch.testing.assert_close(pe[:-k] @ M.T, pe[k:], rtol=0, atol=1e-12)
    dots = (pe[:-k] * pe[k:]).sum(-1)
    torch.testing.assert_close(dots, torch.cos(k * omega).sum().expand(T - k), rtol=0, atol=1e-12)


def test_sinusoidal_positions_device_and_precision_of_late_positions():
    assert sinusoidal_positions(4, 8, device=META).device == META
    assert sinusoidal_positions(4, 8, device="cpu").device.type == "cpu"
    # Angles are computed in float64: late positions stay accurate to float32 rounding.
    far = sinusoidal_positions(20_000, 8)[-1].double()
    p = 19_999
    ref = torch.tensor([f(p * 10000.0 ** (-2 * i / 8)) for i in range(4) for f in (math.sin, math.cos)], dtype=torch.float64)
    torch.testing.assert_close(far, ref, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((10, 7), {}, ValueError, r"sinusoidal_positions: d_model must be even \(the dimensions come in \(sin, cos\) pairs\), got d_model=7"),
        ((10, 0), {}, ValueError, "sinusoidal_positions: d_model must be >= 2, got d_model=0"),
        ((0, 8), {}, ValueError, "sinusoidal_positions: num_positions must be >= 1, got num_positions=0"),
        ((10.0, 8), {}, TypeError, "sinusoidal_positions: num_positions must be an int, got float"),
        ((True, 8), {}, TypeError, "num_positions must be an int, got bool"),
        ((10, "8"), {}, TypeError, "d_model must be an int, got str"),
        ((10, 8), {"base": 0.0}, ValueError, "base must be a positive finite number, got base=0.0"),
        ((10, 8), {"base": float("inf")}, ValueError, "base must be a positive finite number, got base=inf"),
        ((10, 8), {"base": "1e4"}, TypeError, "base must be a number, got str"),
        ((10, 8), {"dtype": torch.int64}, TypeError, "dtype must be a floating torch.dtype, got dtype=torch.int64"),
    ],
)
def test_sinusoidal_positions_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_positions(*args, **kwargs)


def test_sinusoidal_positions_accepts_numpy_ints():
    assert sinusoidal_positions(np.int64(5), np.int32(4)).shape == (5, 4)


# ---------------------------------------------------------------- SinusoidalPositionalEncoding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sinusoidal_module_adds_the_table(dtype):
    module = SinusoidalPositionalEncoding(64, 16, dtype=dtype)
    x = torch.randn(3, 20, 16, dtype=dtype)
    out = module(x)
    assert out.shape == x.shape and out.dtype == dtype
    ref = x + sinusoidal_loop(20, 16).to(dtype)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)


def test_sinusoidal_module_unbatched_and_extra_leading_dims():
    module = SinusoidalPositionalEncoding(10, 4)
    x = torch.zeros(10, 4)
    assert torch.equal(module(x), sinusoidal_positions(10, 4))
    y = torch.zeros(2, 3, 5, 4)
    assert torch.equal(module(y), sinusoidal_positions(5, 4).expand(2, 3, 5, 4))


def test_sinusoidal_module_buffer_is_not_persistent_and_follows_to():
    module = SinusoidalPositionalEncoding(32, 8, base=500.0)
    assert list(module.state_dict()) == [] and list(module.parameters()) == []
    assert torch.equal(module.pe, sinusoidal_positions(32, 8, base=500.0))
    module.to(torch.float64)
    assert module.pe.dtype == torch.float64
    assert module(torch.zeros(1, 4, 8)).dtype == torch.float32  # output follows x, not the buffer
    module.to(META)
    assert module.pe.device == META
    assert SinusoidalPositionalEncoding(4, 2, device=META).pe.device == META
    with pytest.raises(TypeError, match="SinusoidalPositionalEncoding: dtype must be a floating torch.dtype, got dtype=torch.int32"):
        SinusoidalPositionalEncoding(4, 2, dtype=torch.int32)
    assert "max_len=32, d_model=8, base=500" in repr(module)


def test_sinusoidal_module_gradient_flows_to_x():
    module = SinusoidalPositionalEncoding(8, 4)
    x = torch.randn(2, 8, 4, requires_grad=True)
    module(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.zeros(2, 300, 16), ValueError, r"SinusoidalPositionalEncoding: x has sequence length T=300, which exceeds max_len=256 \(x.shape=\(2, 300, 16\)\)"),
        (torch.zeros(2, 10, 12), ValueError, r"x must have shape \(B, T, d_model\) with d_model=16, got x.shape=\(2, 10, 12\)"),
        (torch.zeros(16), ValueError, r"x must have shape \(B, T, d_model\) with d_model=16, got x.shape=\(16,\)"),
        (torch.zeros(2, 10, 16, dtype=torch.long), TypeError, "x must be a floating tensor .* got dtype torch.int64"),
        (np.zeros((2, 10, 16)), TypeError, "x must be a floating tensor .* got ndarray"),
    ],
)
def test_sinusoidal_module_bad_input(x, error, match):
    module = SinusoidalPositionalEncoding(256, 16)
    with pytest.raises(error, match=match):
        module(x)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((0, 8), {}, ValueError, "SinusoidalPositionalEncoding: max_len must be >= 1, got max_len=0"),
        ((10, 5), {}, ValueError, "SinusoidalPositionalEncoding: d_model must be even"),
        ((10, 8), {"base": -1.0}, ValueError, "SinusoidalPositionalEncoding: base must be a positive finite number"),
        ((10.5, 8), {}, TypeError, "SinusoidalPositionalEncoding: max_len must be an int, got float"),
    ],
)
def test_sinusoidal_module_bad_constructor_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        SinusoidalPositionalEncoding(*args, **kwargs)


# ---------------------------------------------------------------- LearnedPositionalEmbedding


def test_learned_is_an_nn_embedding_with_a_weight_parameter():
    torch.manual_seed(0)
    wpe = LearnedPositionalEmbedding(16, 6)
    assert isinstance(wpe, nn.Embedding)
    assert [name for name, _ in wpe.named_parameters()] == ["weight"]
    assert list(wpe.state_dict()) == ["weight"]
    assert wpe.weight.shape == (16, 6) and wpe.max_len == 16 and wpe.d_model == 6
    assert wpe.weight.dtype == torch.get_default_dtype()


def test_learned_forward_equals_nn_embedding_on_positions():
    wpe = LearnedPositionalEmbedding(32, 8)
    ref = nn.Embedding(32, 8)
    ref.load_state_dict(wpe.state_dict())
    assert torch.equal(wpe(32), ref(torch.arange(32)))
    assert torch.equal(wpe(5), wpe.weight[:5])
    assert torch.equal(wpe(4, offset=28), ref(torch.arange(28, 32)))
    assert torch.equal(wpe(1, offset=17), wpe.weight[17:18])
    assert wpe(7, offset=3).shape == (7, 8)


def test_learned_offset_gives_the_rows_of_the_full_sequence():
    wpe = LearnedPositionalEmbedding(20, 4)
    full = wpe(20)
    for t in range(20):
        assert torch.equal(wpe(1, offset=t), full[t : t + 1])


def test_learned_broadcasts_over_the_batch_and_loads_gpt2_style_state_dict():
    wte = nn.Embedding(11, 6)
    wpe = LearnedPositionalEmbedding(10, 6)
    table = torch.randn(10, 6)
    wpe.load_state_dict({"weight": table})
    idx = torch.randint(0, 11, (3, 7))
    h = wte(idx) + wpe(7)
    assert h.shape == (3, 7, 6)
    assert torch.equal(h[2, 4], wte.weight[idx[2, 4]] + table[4])


def test_learned_gradient_touches_only_the_rows_used():
    wpe = LearnedPositionalEmbedding(12, 3, dtype=torch.float64)
    upstream = torch.randn(4, 3, dtype=torch.float64)
    (wpe(4, offset=5) * upstream).sum().backward()
    expected = torch.zeros(12, 3, dtype=torch.float64)
    expected[5:9] = upstream
    assert torch.equal(wpe.weight.grad, expected)


def test_learned_device_dtype_and_from_pretrained():
    assert LearnedPositionalEmbedding(4, 2, device=META).weight.device == META
    assert LearnedPositionalEmbedding(4, 2, dtype=torch.float64)(3).dtype == torch.float64
    table = torch.randn(9, 5, dtype=torch.float64)
    frozen = LearnedPositionalEmbedding.from_pretrained(table)
    assert isinstance(frozen, LearnedPositionalEmbedding)
    assert torch.equal(frozen(9), table) and not frozen.weight.requires_grad
    assert frozen.weight.data_ptr() != table.data_ptr()  # a copy
    assert LearnedPositionalEmbedding.from_pretrained(table, freeze=False).weight.requires_grad


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m: m(80), ValueError, r"LearnedPositionalEmbedding: positions 0\.\.79 \(offset=0, seq_len=80\) exceed max_len=64"),
        (lambda m: m(10, offset=60), ValueError, r"positions 60\.\.69 \(offset=60, seq_len=10\) exceed max_len=64.*at most 4 positions"),
        (lambda m: m(1, offset=64), ValueError, r"positions 64\.\.64 \(offset=64, seq_len=1\) exceed max_len=64"),
        (lambda m: m(0), ValueError, "LearnedPositionalEmbedding: seq_len must be >= 1, got seq_len=0"),
        (lambda m: m(3, offset=-1), ValueError, "LearnedPositionalEmbedding: offset must be >= 0, got offset=-1"),
        (lambda m: m(torch.arange(3)), TypeError, "LearnedPositionalEmbedding: seq_len must be an int, got Tensor"),
        (lambda m: m(3, offset=1.0), TypeError, "offset must be an int, got float"),
    ],
)
def test_learned_bad_input(call, error, match):
    wpe = LearnedPositionalEmbedding(64, 8)
    with pytest.raises(error, match=match):
        call(wpe)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: LearnedPositionalEmbedding(0, 8), ValueError, "LearnedPositionalEmbedding: max_len must be >= 1, got max_len=0"),
        (lambda: LearnedPositionalEmbedding(8, 0), ValueError, "d_model must be >= 1, got d_model=0"),
        (lambda: LearnedPositionalEmbedding(8.0, 4), TypeError, "max_len must be an int, got float"),
        (lambda: LearnedPositionalEmbedding.from_pretrained(torch.zeros(3)), ValueError, r"embeddings must be 2-D \(max_len, d_model\), got embeddings.shape=\(3,\)"),
        (lambda: LearnedPositionalEmbedding.from_pretrained(np.zeros((3, 2))), TypeError, "embeddings must be a floating tensor, got ndarray"),
    ],
)
def test_learned_bad_constructor_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- rope_angles and apply_rope


def test_rope_angles_values_shapes_and_dtypes():
    cos, sin = rope_angles(9, 12, base=500.0, dtype=torch.float64)
    assert cos.shape == sin.shape == (9, 6) and cos.dtype == sin.dtype == torch.float64
    angle = torch.tensor([[p * 500.0 ** (-2 * i / 12) for i in range(6)] for p in range(9)], dtype=torch.float64)
    torch.testing.assert_close(cos, torch.cos(angle), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, torch.sin(angle), rtol=0, atol=1e-12)
    cos32, sin32 = rope_angles(9, 12, base=500.0)
    assert cos32.dtype == sin32.dtype == torch.float32
    torch.testing.assert_close(cos32.double(), cos, rtol=0, atol=1e-7)
    assert rope_angles(3, 4, device=META)[0].device == META


def test_rope_angles_offset_gives_rows_of_the_full_table():
    cos, sin = rope_angles(50, 16)
    cos_o, sin_o = rope_angles(7, 16, offset=30)
    assert torch.equal(cos_o, cos[30:37]) and torch.equal(sin_o, sin[30:37])


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_apply_rope_matches_complex_multiplication(dtype, atol):
    x = torch.randn(2, 3, 11, 16, dtype=dtype)
    cos, sin = rope_angles(11, 16, dtype=dtype)
    ours = apply_rope(x, cos, sin)
    assert ours.shape == x.shape and ours.dtype == dtype
    torch.testing.assert_close(ours.double(), rope_complex(x, torch.arange(11)), rtol=0, atol=atol)


def test_apply_rope_with_offset_matches_complex_multiplication_at_those_positions():
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    cos, sin = rope_angles(3, 8, offset=100, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, cos, sin), rope_complex(x, torch.arange(100, 103)), rtol=0, atol=1e-12)


def test_apply_rope_keeps_the_dtype_of_x():
    cos, sin = rope_angles(5, 8)  # float32
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(2, 5, 8).to(dtype)
        assert apply_rope(x, cos, sin).dtype == dtype
    x = torch.randn(2, 5, 8)
    cos64, sin64 = rope_angles(5, 8, dtype=torch.float64)
    assert apply_rope(x, cos64, sin64).dtype == torch.float32


def test_apply_rope_relative_position_property():
    T, d = 96, 32
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(d, dtype=torch.float64, generator=g), torch.randn(d, dtype=torch.float64, generator=g)
    cos, sin = rope_angles(T, d, dtype=torch.float64)
    S = apply_rope(q.expand(T, d), cos, sin) @ apply_rope(k.expand(T, d), cos, sin).T  # S[m, n]
    for offset in range(-(T - 1), T):
        diag = S.diagonal(-offset)  # entries with m - n = offset
        assert (diag.max() - diag.min()).item() <= 1e-12, offset
    # and it really depends on the offset: +2 and -2 differ
    assert abs(S[5, 3].item() - S[3, 5].item()) > 1e-3


def test_apply_rope_preserves_norms_and_is_identity_at_position_zero():
    x = torch.randn(3, 10, 8, dtype=torch.float64)
    cos, sin = rope_angles(10, 8, dtype=torch.float64)
    out = apply_rope(x, cos, sin)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=0, atol=1e-12)
    assert torch.equal(out[:, 0], x[:, 0])


def test_apply_rope_gradcheck():
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_angles(4, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, cos, sin), (x,))


@pytest.mark.parametrize(
    "x_shape, cos_shape, sin_shape, error, match",
    [
        ((2, 5, 8), (6, 4), (6, 4), ValueError, r"apply_rope: cos must have shape \(T, head_dim // 2\) = \(5, 4\) for x.shape=\(2, 5, 8\), got cos.shape=\(6, 4\)"),
        ((2, 5, 8), (5, 3), (5, 3), ValueError, r"cos must have shape \(T, head_dim // 2\) = \(5, 4\) .* got cos.shape=\(5, 3\)"),
        ((2, 5, 8), (5, 4), (5, 5), ValueError, r"sin must have shape \(T, head_dim // 2\) = \(5, 4\) .* got sin.shape=\(5, 5\)"),
        ((2, 5, 8), (1, 5, 4), (1, 5, 4), ValueError, r"cos must have shape .* got cos.shape=\(1, 5, 4\)"),
        ((2, 5, 7), (5, 3), (5, 3), ValueError, r"apply_rope: x must have shape \(\.\.\., T, head_dim\) with head_dim even, got x.shape=\(2, 5, 7\)"),
        ((8,), (1, 4), (1, 4), ValueError, r"x must have shape \(\.\.\., T, head_dim\) with head_dim even, got x.shape=\(8,\)"),
    ],
)
def test_apply_rope_bad_shapes(x_shape, cos_shape, sin_shape, error, match):
    with pytest.raises(error, match=match):
        apply_rope(torch.zeros(x_shape), torch.zeros(cos_shape), torch.zeros(sin_shape))


@pytest.mark.parametrize(
    "x, cos, error, match",
    [
        (torch.zeros(5, 8, dtype=torch.long), torch.zeros(5, 4), TypeError, "apply_rope: x must be a floating tensor, got dtype torch.int64"),
        (np.zeros((5, 8)), torch.zeros(5, 4), TypeError, "apply_rope: x must be a floating tensor, got ndarray"),
        (torch.zeros(5, 8), [[1.0] * 4] * 5, TypeError, "apply_rope: cos must be a floating tensor, got list"),
    ],
)
def test_apply_rope_bad_types(x, cos, error, match):
    with pytest.raises(error, match=match):
        apply_rope(x, cos, torch.zeros(5, 4))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((10, 7), {}, ValueError, r"rope_angles: head_dim must be even \(RoPE rotates pairs of dimensions\), got head_dim=7"),
        ((0, 8), {}, ValueError, "rope_angles: seq_len must be >= 1, got seq_len=0"),
        ((10, 8), {"offset": -3}, ValueError, "rope_angles: offset must be >= 0, got offset=-3"),
        ((10, 8), {"offset": 2.0}, TypeError, "rope_angles: offset must be an int, got float"),
        ((10, 8), {"base": -5}, ValueError, "rope_angles: base must be a positive finite number, got base=-5"),
        ((10, 8), {"dtype": torch.bool}, TypeError, "rope_angles: dtype must be a floating torch.dtype, got dtype=torch.bool"),
        (("10", 8), {}, TypeError, "rope_angles: seq_len must be an int, got str"),
    ],
)
def test_rope_angles_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rope_angles(*args, **kwargs)
