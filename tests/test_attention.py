"""Unit tests for transformer_lib.attention (chapter 2), against PyTorch's built-ins and autograd."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import (
    attention_weights,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_np,
    softmax,
    softmax_np,
)

# float32: eps 1.2e-7 and SDPA orders its arithmetic differently, so a few ulp of O(1) outputs.
ATOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = list(ATOL)


def make_qkv(L, S, dtype=torch.float64, *, batch=(2, 3), E=8, Ev=6, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(*batch, L, E), (*batch, S, E), (*batch, S, Ev)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def assert_close_to_sdpa(q, k, v, **kwargs):
    ours = scaled_dot_product_attention(q, k, v, **kwargs)
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert ours.shape == ref.shape
    assert ours.dtype == ref.dtype == q.dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL[q.dtype])
    return ours


def mask_with_empty_rows():
    """(B, 1, 5, 5) bool: padding of keys and queries (lengths 5, 3) & causal; rows (1, 3), (1, 4) empty."""
    pad = padding_mask([5, 3])
    return pad[:, None, :, None] & pad[:, None, None, :] & causal_mask(5)


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_torch_softmax_on_large_magnitudes(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g, dtype=torch.float64) * torch.logspace(0, 5, 6, dtype=torch.float64)[:, None]
    x = x.to(dtype)
    ours = softmax(x, dim=-1)
    assert ours.shape == x.shape and ours.dtype == dtype
    torch.testing.assert_close(ours, torch.softmax(x, dim=-1), rtol=0, atol=ATOL[dtype])


def test_softmax_other_dim_and_gradient_match_torch():
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 4, 5, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((softmax(x, dim=1) * upstream).sum(), x)
    (g_ref,) = torch.autograd.grad((torch.softmax(x, dim=1) * upstream).sum(), x)
    torch.testing.assert_close(softmax(x, dim=1), torch.softmax(x, dim=1), rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-12)


def test_softmax_does_not_call_torch_softmax(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("softmax must be written from scratch")

    monkeypatch.setattr(torch, "softmax", forbidden)
    monkeypatch.setattr(torch.Tensor, "softmax", forbidden)
    monkeypatch.setattr(F, "softmax", forbidden)
    x = torch.randn(2, 3)
    softmax(x)
    attention_weights(x, x)
    scaled_dot_product_attention(x, x, x)


def test_softmax_all_minus_inf_row_is_nan_like_torch():
    x = torch.tensor([[0.0, 1.0, float("-inf")], [float("-inf")] * 3])
    ours = softmax(x)
    ref = torch.softmax(x, dim=-1)
    assert torch.isnan(ours[1]).all() and torch.isnan(ref[1]).all()
    torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_np_matches_torch_and_keeps_dtype(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 10)) * np.logspace(0, 5, 6)[:, None]).astype(dtype)
    ours = softmax_np(x, axis=-1)
    assert ours.shape == x.shape and ours.dtype == dtype
    atol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(ours, torch.softmax(torch.from_numpy(x), dim=-1).numpy(), rtol=0, atol=atol)


def test_softmax_np_is_stable_where_naive_overflows():
    z = np.array([1000.0, 1001.0, 1002.0])
    np.testing.assert_allclose(softmax_np(z), softmax_np(z - 1000.0), rtol=0, atol=1e-15)
    np.testing.assert_allclose(softmax_np(-z), softmax_np(-z + 1000.0), rtol=0, atol=1e-15)
    assert np.isfinite(softmax_np(z)).all()


def test_softmax_np_axis_and_nan_row():
    x = np.random.default_rng(1).standard_normal((3, 4))
    np.testing.assert_allclose(softmax_np(x, axis=0).sum(axis=0), 1.0, rtol=0, atol=1e-12)
    out = softmax_np(np.array([[0.0, 0.0], [-np.inf, -np.inf]]))
    np.testing.assert_array_equal(out[0], [0.5, 0.5])
    assert np.isnan(out[1]).all()


@pytest.mark.parametrize(
    "fn, x, kwargs, error, match",
    [
        (softmax, [1.0, 2.0], {}, TypeError, "x must be a tensor, got list"),
        (softmax, torch.tensor([1, 2]), {}, TypeError, "x .*int64"),
        (softmax, torch.tensor(1.0), {}, ValueError, "x must have at least one dimension"),
        (softmax, torch.zeros(2, 3), {"dim": 2}, ValueError, r"dim .*\[-2, 1\].*dim=2"),
        (softmax, torch.zeros(2, 3), {"dim": 1.0}, TypeError, "dim must be an int"),
        (softmax_np, torch.zeros(3), {}, TypeError, "x must be a NumPy array, got Tensor"),
        (softmax_np, np.arange(3), {}, TypeError, "x .*int64"),
        (softmax_np, np.zeros(()), {}, ValueError, "x must have at least one dimension"),
        (softmax_np, np.zeros((2, 3)), {"axis": -3}, ValueError, r"axis .*\[-2, 1\].*axis=-3"),
        (softmax_np, np.zeros((2, 3)), {"axis": None}, TypeError, "axis must be an int"),
    ],
)
def test_softmax_bad_input(fn, x, kwargs, error, match):
    with pytest.raises(error, match=f"{fn.__name__}: {match}"):
        fn(x, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_empty_to_zero_gives_zero_rows_and_finite_gradients(dtype):
    x = torch.tensor([[0.0, 1.0, float("-inf")], [float("-inf")] * 3], dtype=dtype, requires_grad=True)
    out = softmax(x, empty_to_zero=True)
    assert torch.equal(out[1], torch.zeros(3, dtype=dtype))
    torch.testing.assert_close(out[0], torch.softmax(x[0], dim=-1), rtol=0, atol=ATOL[dtype])
    (grad,) = torch.autograd.grad(out[0, 0] + out[1].sum(), x)
    assert torch.isfinite(grad).all()
    out_np = softmax_np(x.detach().numpy(), empty_to_zero=True)
    np.testing.assert_array_equal(out_np[1], np.zeros(3))
    np.testing.assert_allclose(out_np[0], out[0].detach().numpy(), rtol=0, atol=ATOL[dtype])


# ---------------------------------------------------------------- mask builders


def test_causal_mask_values_dtype_and_shape():
    m = causal_mask(3, 5)
    assert m.dtype == torch.bool and m.shape == (3, 5) and m.device.type == "cpu"
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)
    assert torch.equal(causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert causal_mask(0).shape == (0, 0)


def test_causal_mask_is_the_mask_of_is_causal_for_L_greater_than_S():
    q, k, v = make_qkv(7, 4)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ours = scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(7, 4))
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


def test_padding_mask_values_and_inputs():
    expected = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    for lengths in ([3, 4, 0], (3, 4, 0), torch.tensor([3, 4, 0]), np.array([3, 4, 0]), torch.tensor([3, 4, 0], dtype=torch.int32)):
        m = padding_mask(lengths)
        assert m.dtype == torch.bool and m.shape == (3, 4)
        assert torch.equal(m, expected)
    assert torch.equal(padding_mask([1, 2], max_len=4), torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool))
    assert padding_mask([]).shape == (0, 0)


def test_mask_builders_place_tensors_on_the_requested_device():
    meta = torch.device("meta")
    assert causal_mask(3, device=meta).device == meta
    assert causal_mask(3, device="cpu").device.type == "cpu"
    assert padding_mask([1, 2], device="cpu").device.type == "cpu"
    assert padding_mask(torch.tensor([1, 2])).device.type == "cpu"


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: causal_mask(-1), ValueError, "causal_mask: size_q .*size_q=-1"),
        (lambda: causal_mask(3, -2), ValueError, "causal_mask: size_k .*size_k=-2"),
        (lambda: causal_mask(3.0), TypeError, "causal_mask: size_q must be an int"),
        (lambda: causal_mask(True), TypeError, "causal_mask: size_q must be an int"),
        (lambda: padding_mask([3, 5], max_len=4), ValueError, r"padding_mask: .*max_len=4, got lengths=\[3, 5\]"),
        (lambda: padding_mask([3, -1]), ValueError, r"padding_mask: lengths must be >= 0, got lengths=\[3, -1\]"),
        (lambda: padding_mask([3, 1], max_len=-1), ValueError, "padding_mask: max_len .*max_len=-1"),
        (lambda: padding_mask([3, 1.5]), TypeError, r"padding_mask: lengths\[1\] must be an int"),
        (lambda: padding_mask(torch.tensor([[1, 2]])), ValueError, r"padding_mask: lengths must be 1-D, got lengths.shape=\(1, 2\)"),
        (lambda: padding_mask(torch.tensor([1.0, 2.0])), TypeError, "padding_mask: lengths .*float32"),
        (lambda: padding_mask(3), TypeError, "padding_mask: lengths must be a sequence of ints or a 1-D integer tensor, got int"),
    ],
)
def test_mask_builders_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- attention against SDPA


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_mask_self_attention(dtype):
    q, k, v = make_qkv(5, 5, dtype)
    out = assert_close_to_sdpa(q, k, v)
    assert out.shape == (2, 3, 5, 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_L_not_equal_S(dtype):
    q, k, v = make_qkv(5, 7, dtype)
    assert assert_close_to_sdpa(q, k, v).shape == (2, 3, 5, 6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(5, 5), (5, 7), (7, 5), (1, 4)])
def test_is_causal(dtype, L, S):
    q, k, v = make_qkv(L, S, dtype)
    assert_close_to_sdpa(q, k, v, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bool_mask_padding_and_causal_broadcast_to_heads(dtype):
    q, k, v = make_qkv(5, 5, dtype)
    mask = padding_mask([5, 3])[:, None, None, :] & causal_mask(5)  # (B, 1, L, S)
    assert_close_to_sdpa(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_float_mask_with_minus_inf(dtype):
    q, k, v = make_qkv(5, 7, dtype)
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(5, 7, generator=g, dtype=dtype)
    bias[torch.rand(5, 7, generator=g) < 0.3] = float("-inf")
    bias[0, 0] = 0.0  # keep at least one key for row 0
    assert_close_to_sdpa(q, k, v, attn_mask=bias)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_are_zero_like_sdpa(dtype):
    q, k, v = make_qkv(5, 5, dtype)
    mask = mask_with_empty_rows()
    out = assert_close_to_sdpa(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1, :, 3:], torch.zeros_like(out[1, :, 3:]))
    # The same with a float mask whose row is all -inf.
    bias = torch.zeros(5, 5, dtype=dtype)
    bias[2] = float("-inf")
    out = assert_close_to_sdpa(q, k, v, attn_mask=bias)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_extra_batch_dims_and_no_batch_dims(dtype):
    q, k, v = make_qkv(4, 6, dtype, batch=(2, 3, 2))
    mask = torch.rand(3, 1, 4, 6, generator=torch.Generator().manual_seed(3)) < 0.7
    assert assert_close_to_sdpa(q, k, v, attn_mask=mask).shape == (2, 3, 2, 4, 6)
    q, k, v = make_qkv(4, 6, dtype, batch=())
    assert assert_close_to_sdpa(q, k, v, is_causal=True).shape == (4, 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_argument(dtype):
    q, k, v = make_qkv(5, 7, dtype)
    assert_close_to_sdpa(q, k, v, scale=0.3)
    # scale=1/sqrt(E) is the default, and scale=c equals pre-scaling q by c*sqrt(E).
    default = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(8)), default, rtol=0, atol=0)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, scale=0.3),
        scaled_dot_product_attention(q * 0.3 * math.sqrt(8), k, v),
        rtol=0,
        atol=ATOL[dtype],
    )


def test_float_mask_is_cast_to_the_dtype_of_q():
    q, k, v = make_qkv(5, 5, torch.float32)
    bias = torch.randn(5, 5, dtype=torch.float64)
    out = scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert out.dtype == torch.float32
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.float())
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


def test_gradients_match_sdpa_with_empty_rows():
    q, k, v = make_qkv(5, 5, torch.float64, requires_grad=True)
    mask = mask_with_empty_rows()
    upstream = torch.randn(2, 3, 5, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ours = torch.autograd.grad((scaled_dot_product_attention(q, k, v, attn_mask=mask) * upstream).sum(), (q, k, v))
    ref = torch.autograd.grad((F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * upstream).sum(), (q, k, v))
    for a, b in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_gradients_pass_finite_difference_gradcheck():
    q, k, v = make_qkv(3, 4, torch.float64, batch=(2,), E=3, Ev=2, requires_grad=True)
    mask = padding_mask([4, 2])[:, None, :] & causal_mask(3, 4)
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_weights_shape_rows_and_agreement(dtype):
    q, k, v = make_qkv(5, 7, dtype)
    w = attention_weights(q, k, is_causal=True)
    assert w.shape == (2, 3, 5, 7) and w.dtype == dtype
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=dtype), rtol=0, atol=ATOL[dtype])
    assert torch.equal(w[..., ~causal_mask(5, 7)], torch.zeros_like(w[..., ~causal_mask(5, 7)]))
    ref = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal_mask(5, 7), float("-inf")), dim=-1)
    torch.testing.assert_close(w, ref, rtol=0, atol=ATOL[dtype])
    torch.testing.assert_close(w @ v, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=ATOL[dtype])


def test_attention_weights_fully_masked_rows_are_zero():
    q, k, _ = make_qkv(5, 5)
    w = attention_weights(q, k, attn_mask=mask_with_empty_rows())
    assert torch.equal(w[1, :, 3:], torch.zeros(3, 2, 5, dtype=torch.float64))
    torch.testing.assert_close(w[1, :, :3].sum(-1), torch.ones(3, 3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_dropout_zero_is_exact_and_positive_dropout_changes_output():
    q, k, v = make_qkv(5, 7)
    torch.manual_seed(0)
    exact = scaled_dot_product_attention(q, k, v)
    assert torch.equal(scaled_dot_product_attention(q, k, v, dropout_p=0.0), exact)
    torch.manual_seed(0)
    dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(dropped, exact)
    assert torch.equal(scaled_dot_product_attention(q, k, v, dropout_p=1.0), torch.zeros_like(exact))


def test_dropout_is_unbiased():
    # Dropout rescales the kept weights by 1 / (1 - p): the mean over many draws approaches the exact output.
    q, k, v = make_qkv(4, 6, batch=())
    exact = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    mean = torch.stack([scaled_dot_product_attention(q, k, v, dropout_p=0.3) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, exact, rtol=0, atol=0.05)


def test_dropout_draws_the_same_mask_as_sdpa_on_cpu():
    # SDPA's CPU math path applies F.dropout to the weights, so equal seeds give equal outputs.
    q, k, v = make_qkv(5, 7)
    torch.manual_seed(7)
    ours = scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.manual_seed(7)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- NumPy version


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"is_causal": True},
        {"attn_mask": "bool"},
        {"attn_mask": "float"},
        {"scale": 0.25},
    ],
    ids=["no-mask", "causal", "bool-mask", "float-mask", "scale"],
)
def test_numpy_version_matches_sdpa_float64(kwargs):
    q, k, v = make_qkv(5, 5)
    if kwargs.get("attn_mask") == "bool":
        kwargs = {"attn_mask": mask_with_empty_rows()}
    elif kwargs.get("attn_mask") == "float":
        bias = torch.randn(5, 5, dtype=torch.float64)
        bias[1] = float("-inf")
        bias[3, :2] = float("-inf")
        kwargs = {"attn_mask": bias}
    np_kwargs = {key: (val.numpy() if isinstance(val, torch.Tensor) else val) for key, val in kwargs.items()}
    ours = scaled_dot_product_attention_np(q.numpy(), k.numpy(), v.numpy(), **np_kwargs)
    ref = F.scaled_dot_product_attention(q, k, v, **kwargs).numpy()
    assert ours.shape == ref.shape and ours.dtype == np.float64
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_numpy_version_float32_keeps_dtype_and_matches_torch_version():
    q, k, v = make_qkv(5, 7, torch.float32)
    ours = scaled_dot_product_attention_np(q.numpy(), k.numpy(), v.numpy(), is_causal=True)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, scaled_dot_product_attention(q, k, v, is_causal=True).numpy(), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- bad input: every message names the argument


def cast(x, dtype: str):
    """``x`` (torch tensor or NumPy array) converted to the dtype named ``dtype``."""
    return x.to(getattr(torch, dtype)) if isinstance(x, torch.Tensor) else x.astype(dtype)


# Each case builds bad arguments from valid torch tensors q (2, 5, 8), k (2, 7, 8), v (2, 7, 6) and a
# converter ``to`` into the backend's array type; ``wrong`` is an array of the other backend.
# In the expected messages, {array} is the backend's array type and {wrong} the other one's class name.
ATTENTION_ERROR_CASES = {
    "E differs": (lambda q, k, v, to, wrong: ((q, k[..., :4], v), {}), ValueError,
                  r"q and k must have the same last dimension .*q.shape=\(2, 5, 8\) and k.shape=\(2, 7, 4\)"),
    "S differs": (lambda q, k, v, to, wrong: ((q, k, v[:, :6]), {}), ValueError,
                  r"k and v must have the same number of keys .*k.shape=\(2, 7, 8\) and v.shape=\(2, 6, 6\)"),
    "batch differs": (lambda q, k, v, to, wrong: ((q[0], k, v), {}), ValueError,
                      r"q, k, v must have the same leading \(batch\) dimensions, got q.shape=\(5, 8\) and k.shape=\(2, 7, 8\)"),
    "rank < 2": (lambda q, k, v, to, wrong: ((q[0, 0], k, v), {}), ValueError,
                 r"q must have at least 2 dimensions .*q.shape=\(8,\)"),
    "mixed dtypes": (lambda q, k, v, to, wrong: ((q, k, cast(v, "float32")), {}), TypeError,
                     "q, k, v must have the same dtype, got q.dtype=.*float64, k.dtype=.*float64, v.dtype=.*float32"),
    "integer q": (lambda q, k, v, to, wrong: ((cast(q, "int64"), k, v), {}), TypeError,
                  "q must have a floating dtype, got q.dtype=.*int64"),
    "k of the other backend": (lambda q, k, v, to, wrong: ((q, wrong, v), {}), TypeError, "k must be a {array}, got {wrong}"),
    "integer mask": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(torch.ones(5, 7, dtype=torch.long))}), TypeError,
                     r"attn_mask must have dtype bool .* got attn_mask.dtype=.*int64"),
    "mask shape": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(torch.ones(5, 6, dtype=torch.bool))}), ValueError,
                   r"attn_mask must broadcast to the scores' shape \(\.\.\., L, S\) = \(2, 5, 7\), got attn_mask.shape=\(5, 6\)"),
    "mask enlarges": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(torch.ones(3, 2, 5, 7, dtype=torch.bool))}), ValueError,
                      r"attn_mask must broadcast to the scores' shape .* got attn_mask.shape=\(3, 2, 5, 7\)"),
    "mask and is_causal": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(causal_mask(5, 7)), "is_causal": True}), ValueError,
                           "attn_mask and is_causal=True are mutually exclusive"),
    "mask of the other backend": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": wrong}), TypeError,
                                  "attn_mask must be a {array}, got {wrong}"),
    "is_causal not bool": (lambda q, k, v, to, wrong: ((q, k, v), {"is_causal": 1}), TypeError, "is_causal must be a bool"),
    "scale zero": (lambda q, k, v, to, wrong: ((q, k, v), {"scale": 0.0}), ValueError, "scale .*scale=0.0"),
    "scale infinite": (lambda q, k, v, to, wrong: ((q, k, v), {"scale": float("inf")}), ValueError, "scale .*scale=inf"),
    "scale not number": (lambda q, k, v, to, wrong: ((q, k, v), {"scale": "1"}), TypeError, "scale must be a number"),
    "E is zero": (lambda q, k, v, to, wrong: ((q[..., :0], k[..., :0], v), {}), ValueError,
                  r"q must not be empty, got q.shape=\(2, 5, 0\)"),
    "no keys": (lambda q, k, v, to, wrong: ((q, k[:, :0], v[:, :0]), {}), ValueError,
                r"k must not be empty, got k.shape=\(2, 0, 8\)"),
    "no queries": (lambda q, k, v, to, wrong: ((q[:, :0], k, v), {}), ValueError, r"q must not be empty"),
    "empty batch": (lambda q, k, v, to, wrong: ((q[:0], k[:0], v[:0]), {}), ValueError, r"q must not be empty"),
    "+inf in float mask": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(inf_at(5, 7, (3, 2), float("inf")))}),
                           ValueError, r"attn_mask must hold finite numbers or -inf .* got inf at index \(3, 2\)"),
    "NaN in float mask": (lambda q, k, v, to, wrong: ((q, k, v), {"attn_mask": to(inf_at(5, 7, (0, 6), float("nan")))}),
                          ValueError, r"attn_mask must hold finite numbers or -inf .* got nan at index \(0, 6\)"),
}


def test_attention_refuses_tensors_on_different_devices():
    q, k, v = make_qkv(5, 7)
    for fn in (scaled_dot_product_attention, lambda q, k, v, **kw: attention_weights(q, k, **kw)):
        with pytest.raises(ValueError, match=r"must be on the same device, got q.device=cpu, k.device=meta"):
            fn(q, k.to("meta"), v)
        with pytest.raises(ValueError, match=r"attn_mask must be on the device of q, cpu, got attn_mask.device=meta"):
            fn(q, k, v, attn_mask=torch.ones(5, 7, dtype=torch.bool, device="meta"))


def inf_at(rows: int, cols: int, index: tuple[int, int], value: float) -> torch.Tensor:
    """A float64 (rows, cols) additive mask of zeros with ``value`` at ``index``."""
    mask = torch.zeros(rows, cols, dtype=torch.float64)
    mask[index] = value
    return mask

BACKENDS = {
    "torch": (scaled_dot_product_attention, lambda t: t, np.zeros((5, 7)), "tensor", "ndarray"),
    "numpy": (scaled_dot_product_attention_np, lambda t: t.numpy(), torch.zeros(5, 7), "NumPy array", "Tensor"),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("case", list(ATTENTION_ERROR_CASES))
def test_attention_bad_input_messages(backend, case):
    fn, to, wrong, array, wrong_name = BACKENDS[backend]
    build, error, match = ATTENTION_ERROR_CASES[case]
    q, k, v = (to(x) for x in make_qkv(5, 7, batch=(2,)))
    args, kwargs = build(q, k, v, to, wrong)
    match = match.replace("{array}", array).replace("{wrong}", wrong_name)
    with pytest.raises(error, match=f"{fn.__name__}: {match}"):
        fn(*args, **kwargs)


def test_attention_weights_bad_input_names_its_function():
    q, k, _ = make_qkv(5, 7)
    with pytest.raises(ValueError, match=r"attention_weights: q and k must have the same last dimension"):
        attention_weights(q, k[..., :3])
    with pytest.raises(ValueError, match="attention_weights: attn_mask and is_causal=True are mutually exclusive"):
        attention_weights(q, k, attn_mask=causal_mask(5, 7), is_causal=True)


@pytest.mark.parametrize(
    "dropout_p, error, match",
    [(-0.1, ValueError, r"dropout_p .*\[0, 1\], got dropout_p=-0.1"), (1.5, ValueError, r"dropout_p .*\[0, 1\], got dropout_p=1.5"), ("0.1", TypeError, "dropout_p must be a number")],
)
def test_dropout_p_bad_input(dropout_p, error, match):
    q, k, v = make_qkv(5, 7)
    with pytest.raises(error, match="scaled_dot_product_attention: " + match):
        scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


# ---------------------------------------------------------------- causality: a future input changes no earlier output


def largest_change_before(attend, *, T=7, C=8, seed=0):
    """Self-attention of a random (2, T, C) batch through ``attend(q, k, v)`` (fixed random projections).

    Change the input at each position t in turn (another token) and return the largest change of an
    output at a position < t. A causal function returns 0 up to rounding; a leak from the future
    shows at 1e-3 or more.
    """
    g = torch.Generator().manual_seed(seed)
    w_q, w_k, w_v = (torch.randn(C, n, generator=g, dtype=torch.float64) / C**0.5 for n in (4, 4, 5))
    x = torch.randn(2, T, C, generator=g, dtype=torch.float64)
    y = attend(x @ w_q, x @ w_k, x @ w_v)
    worst = 0.0
    for t in range(1, T):
        changed = x.clone()
        changed[:, t] = torch.randn(2, C, generator=g, dtype=torch.float64)
        y_changed = attend(changed @ w_q, changed @ w_k, changed @ w_v)
        worst = max(worst, (y_changed[:, :t] - y[:, :t]).abs().max().item())
    return worst


def _numpy(fn):
    return lambda q, k, v: torch.from_numpy(fn(q.numpy(), k.numpy(), v.numpy()))


CAUSAL_ATTENTION = {
    "scaled_dot_product_attention(is_causal=True)": lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True),
    "scaled_dot_product_attention(causal_mask)": lambda q, k, v: scaled_dot_product_attention(
        q, k, v, attn_mask=causal_mask(q.size(-2))
    ),
    "scaled_dot_product_attention(float causal mask)": lambda q, k, v: scaled_dot_product_attention(
        q, k, v, attn_mask=torch.zeros(q.size(-2), q.size(-2), dtype=q.dtype).masked_fill(~causal_mask(q.size(-2)), float("-inf"))
    ),
    "attention_weights(is_causal=True)": lambda q, k, v: attention_weights(q, k, is_causal=True),
    "scaled_dot_product_attention_np(is_causal=True)": _numpy(
        lambda q, k, v: scaled_dot_product_attention_np(q, k, v, is_causal=True)
    ),
}


@pytest.mark.parametrize("name", list(CAUSAL_ATTENTION))
def test_causal_attention_ignores_future_inputs(name):
    assert largest_change_before(CAUSAL_ATTENTION[name]) <= 1e-12


def _softmax_over_the_wrong_axis(q, k, v):
    scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~causal_mask(q.size(-2)), float("-inf"))
    return softmax(scores, dim=-2) @ v  # normalises each column, over the queries


MISTAKES = {
    "softmax over the queries (wrong axis)": _softmax_over_the_wrong_axis,
    "upper triangle (wrong triangle)": lambda q, k, v: scaled_dot_product_attention(
        q, k, v, attn_mask=causal_mask(q.size(-2)).T
    ),
    "no mask": scaled_dot_product_attention,
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_causality_test_catches_the_classic_mistakes(name):
    # The test of the tests: each mistaken version lets a future input change an earlier output.
    assert largest_change_before(MISTAKES[name]) > 1e-3
