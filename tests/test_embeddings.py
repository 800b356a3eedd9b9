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
        ((10, 7), {}, ValueError, r"d_model must be even \(the dimensions come in \(sin, cos\) pairs\), got d_model=7"),
        ((10, 0), {}, ValueError, "d_model .*d_model=0"),
        ((0, 8), {}, ValueError, "num_positions .*num_positions=0"),
        ((10.0, 8), {}, TypeError, "num_positions must be an int"),
        ((True, 8), {}, TypeError, "num_positions must be an int"),
        ((10, "8"), {}, TypeError, "d_model must be an int"),
        ((10, 8), {"base": 0.0}, ValueError, "base .*base=0.0"),
        ((10, 8), {"base": float("inf")}, ValueError, "base .*base=inf"),
        ((10, 8), {"base": "1e4"}, TypeError, "base must be a number"),
        ((10, 8), {"dtype": torch.int64}, ValueError, "dtype .*torch.int64"),
    ],
)
def test_sinusoidal_positions_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match="sinusoidal_positions: " + match):
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
    with pytest.raises(ValueError, match="SinusoidalPositionalEncoding: dtype .*torch.int32"):
        SinusoidalPositionalEncoding(4, 2, dtype=torch.int32)
    assert "max_len=32, d_model=8, base=500" in repr(module)


def test_sinusoidal_module_gradient_flows_to_x():
    module = SinusoidalPositionalEncoding(8, 4)
    x = torch.randn(2, 8, 4, requires_grad=True)
    module(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((0, 8), {}, ValueError, "SinusoidalPositionalEncoding: max_len .*max_len=0"),
        ((10, 5), {}, ValueError, "SinusoidalPositionalEncoding: d_model must be even"),
        ((10, 8), {"base": -1.0}, ValueError, "SinusoidalPositionalEncoding: base .*base=-1.0"),
        ((10.5, 8), {}, TypeError, "SinusoidalPositionalEncoding: max_len must be an int"),
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


@pytest.mark.parametrize("seq_len, offset", [(80, 0), (10, 60), (1, 64)])
def test_learned_positions_beyond_max_len_have_no_vector(seq_len, offset):
    # The forward pass checks nothing (the model checks the length at its entry); the lookup fails.
    wpe = LearnedPositionalEmbedding(64, 8)
    with pytest.raises(IndexError):
        wpe(seq_len, offset=offset)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: LearnedPositionalEmbedding(0, 8), ValueError, "LearnedPositionalEmbedding: max_len .*max_len=0"),
        (lambda: LearnedPositionalEmbedding(8, 0), ValueError, "LearnedPositionalEmbedding: d_model .*d_model=0"),
        (lambda: LearnedPositionalEmbedding(8.0, 4), TypeError, "LearnedPositionalEmbedding: max_len must be an int"),
        (lambda: LearnedPositionalEmbedding.from_pretrained(torch.zeros(3)), ValueError,
         r"LearnedPositionalEmbedding.from_pretrained: embeddings must be 2-D, got embeddings.shape=\(3,\)"),
        (lambda: LearnedPositionalEmbedding.from_pretrained(torch.zeros(3, 2, dtype=torch.long)), TypeError,
         "LearnedPositionalEmbedding.from_pretrained: embeddings .*int64"),
        (lambda: LearnedPositionalEmbedding.from_pretrained(np.zeros((3, 2))), TypeError,
         "LearnedPositionalEmbedding.from_pretrained: embeddings must be a tensor, got ndarray"),
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


class _Positions(nn.Module):
    """Token embeddings plus learned and sinusoidal positions, then RoPE on the result: the hot path."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 8)
        self.wpe = LearnedPositionalEmbedding(16, 8)
        self.pe = SinusoidalPositionalEncoding(16, 8)
        cos, sin = rope_angles(16, 8)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx):
        T = idx.size(1)
        h = self.pe(self.wte(idx) + self.wpe(T))
        return apply_rope(h, self.cos[:T], self.sin[:T])


def test_forward_passes_are_traceable_by_torch_export():
    # The forwards check nothing, so torch.export traces them with a dynamic sequence length.
    torch.manual_seed(0)
    model = _Positions().eval()
    idx = torch.randint(0, 11, (2, 5))
    T = torch.export.Dim("T", min=2, max=16)
    exported = torch.export.export(model, (idx,), dynamic_shapes=({1: T},))
    for length in (3, 5, 16):
        x = torch.randint(0, 11, (2, length))
        torch.testing.assert_close(exported.module()(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((10, 7), {}, ValueError, r"head_dim must be even \(RoPE rotates pairs of dimensions\), got head_dim=7"),
        ((10, 0), {}, ValueError, "head_dim .*head_dim=0"),
        ((0, 8), {}, ValueError, "seq_len .*seq_len=0"),
        ((10, 8), {"offset": -3}, ValueError, "offset .*offset=-3"),
        ((10, 8), {"offset": 2.0}, TypeError, "offset must be an int"),
        ((10, 8), {"base": -5}, ValueError, "base .*base=-5"),
        ((10, 8), {"dtype": torch.bool}, ValueError, "dtype .*torch.bool"),
        (("10", 8), {}, TypeError, "seq_len must be an int"),
    ],
)
def test_rope_angles_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match="rope_angles: " + match):
        rope_angles(*args, **kwargs)
