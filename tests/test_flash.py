"""Unit tests for transformer_lib.flash (chapter 19): tiled attention against PyTorch's SDPA and autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lib
from transformer_lib.flash import flash_attention, key_tiles, visible_band

# float64: only the order of the roundings differs (2^-53 each, on O(1) numbers). float32: 2^-24 per
# rounding over sums of up to ~100 terms in two different orders gives a few 1e-7; 1e-5 leaves a margin
# but not room for a wrong formula (which moves outputs by 1e-2 or more).
ATOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def make_qkv(Tq, Tk, dtype=torch.float64, *, B=2, h=3, d=16, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, h, Tq, d), (B, h, Tk, d), (B, h, Tk, dv)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def band_mask(Tq, Tk, is_causal, window):
    i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None, :]
    mask = torch.ones(Tq, Tk, dtype=torch.bool)
    if is_causal:
        mask &= j <= i
    if window is not None:
        mask &= (j > i - window) & ((j <= i) if is_causal else (j < i + window))
    return mask


def reference(q, k, v, is_causal, window):
    """SDPA with an explicit bool mask, and torch.logsumexp of the scaled, masked scores."""
    mask = band_mask(q.size(-2), k.size(-2), is_causal, window)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), s.masked_fill(~mask, -math.inf).logsumexp(-1)


def outputs_and_grads(fn, q, k, v, seed=1):
    """(o, lse with -inf rows zeroed, dq, dk, dv, rows that see a key) of a random weighting of o and lse."""
    o, lse = fn()
    g = torch.Generator().manual_seed(seed)
    w_o = torch.randn(o.shape, generator=g, dtype=o.dtype)
    w_lse = torch.randn(lse.shape, generator=g, dtype=o.dtype)
    seen = lse.isfinite()
    lse = lse.where(seen, 0.0)
    grads = torch.autograd.grad((o * w_o).sum() + (lse * w_lse).sum(), (q, k, v))
    return (o, lse, *grads), seen


CASES = [  # is_causal, T_q, T_k, block_size_q, block_size_k, window
    (False, 45, 70, 16, 16, None),   # T_q != T_k, neither a multiple of the tile
    (False, 33, 21, 8, 5, None),     # T_q > T_k, tiles of different sizes
    (True, 45, 45, 16, 16, None),
    (True, 70, 70, 32, 8, None),
    (True, 20, 40, 8, 8, None),      # causal, T_q < T_k (aligned top-left, as SDPA)
    (True, 70, 70, 16, 16, 9),       # sliding window
    (True, 40, 20, 8, 8, 5),         # causal window with T_q > T_k: rows that see no key
    (False, 45, 30, 8, 5, 7),        # symmetric window, T_q > T_k: rows that see no key
    (True, 17, 17, 1, 1, 1),         # one-by-one tiles, each query sees itself only
]


@pytest.mark.parametrize("dtype", list(ATOL))
@pytest.mark.parametrize("is_causal, Tq, Tk, bq, bk, window", CASES)
def test_matches_sdpa_outputs_lse_and_grads(dtype, is_causal, Tq, Tk, bq, bk, window):
    q, k, v = make_qkv(Tq, Tk, dtype)
    ours, seen = outputs_and_grads(lambda: flash_attention(q, k, v, is_causal=is_causal, window=window,
                                                           block_size_q=bq, block_size_k=bk, return_lse=True), q, k, v)
    ref, seen_ref = outputs_and_grads(lambda: reference(q, k, v, is_causal, window), q, k, v)
    assert torch.equal(seen, seen_ref)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), ours, ref):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL[dtype], msg=lambda m, name=name: f"{name}: {m}")


def test_default_call_equals_sdpa_and_is_top_level():
    assert transformer_lib.flash_attention is flash_attention
    q, k, v = make_qkv(300, 300, torch.float32, B=1, h=2, d=64, dv=64)
    for is_causal in (False, True):
        out = flash_attention(q, k, v, is_causal=is_causal)
        assert out.shape == (1, 2, 300, 64)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
                                   rtol=0, atol=1e-5)


def test_scale_argument_matches_sdpa():
    q, k, v = make_qkv(19, 23)
    ours = flash_attention(q, k, v, scale=0.3, block_size_q=4, block_size_k=6)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, scale=0.3), rtol=0, atol=1e-12)


def test_empty_rows_give_zero_output_and_minus_inf_lse():
    q, k, v = make_qkv(12, 4)
    o, lse = flash_attention(q, k, v, is_causal=True, window=2, block_size_q=4, block_size_k=4, return_lse=True)
    # query i sees keys i - 1 and i; rows 5.. see none of the 4 keys
    assert torch.equal(o[:, :, 5:], torch.zeros_like(o[:, :, 5:]))
    assert torch.isneginf(lse[:, :, 5:]).all() and lse[:, :, :5].isfinite().all()


def test_gradcheck_float64():
    q, k, v = make_qkv(7, 9, B=1, h=2, d=4, dv=3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, block_size_q=3, block_size_k=4, return_lse=True), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, is_causal=True, window=3, block_size_q=2, block_size_k=3,
                                        return_lse=True), (q, k[:, :, :7], v[:, :, :7]))


def test_backward_saves_no_score_matrix():
    q, k, v = make_qkv(64, 64, torch.float32, B=1, h=2, d=8, dv=8)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        flash_attention(q, k, v, is_causal=True, block_size_q=16, block_size_k=16)
    assert sorted(saved) == sorted([(1, 2, 64, 8)] * 4 + [(1, 2, 64)]), saved  # q, k, v, o and lse


@pytest.mark.parametrize("T, b, window, visited, masked", [
    (1024, 128, None, 36, 8),       # n (n + 1) / 2 of n^2 = 64 tiles; the diagonal needs a mask
    (1000, 128, None, 36, 8),       # a partial last tile changes nothing
    (1000, 128, 256, 21, 14),       # window: tiles i - 2, i - 1, i per query tile
    (16384, 128, 512, 630, 252),    # five per query tile (fewer for the first four); 128 diagonal + 124 band-edge masked
])
def test_causal_tiles_above_the_diagonal_and_outside_the_window_are_skipped(T, b, window, visited, masked):
    band = visible_band(True, window)
    tiles = [mask for q0 in range(0, T, b) for _, _, mask in key_tiles(q0, min(q0 + b, T), T, b, band)]
    assert len(tiles) == visited and sum(m is not None for m in tiles) == masked


def test_key_tiles_masks_agree_with_the_band():
    band = visible_band(True, 5)
    full = band_mask(23, 23, True, 5)
    rebuilt = torch.zeros(23, 23, dtype=torch.bool)
    for q0 in range(0, 23, 4):
        q1 = min(q0 + 4, 23)
        for k0, k1, mask in key_tiles(q0, q1, 23, 3, band):
            rebuilt[q0:q1, k0:k1] = True if mask is None else mask
    assert torch.equal(rebuilt, full)


# ---------------------------------------------------------------- bad inputs


def test_wrong_ndim_names_the_argument():
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"flash_attention: q must be 4-D, got q.shape=\(2, 5, 8\)"):
        flash_attention(x, x, x)


@pytest.mark.parametrize("name, shapes, pattern", [
    ("k", [(2, 3, 5, 8), (2, 4, 5, 8), (2, 3, 5, 8)], r"k must have shape \(2, 3, \*, 8\), got k.shape=\(2, 4, 5, 8\)"),
    ("k", [(2, 3, 5, 8), (2, 3, 5, 4), (2, 3, 5, 8)], r"k must have shape \(2, 3, \*, 8\), got k.shape=\(2, 3, 5, 4\)"),
    ("v", [(2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 5, 8)], r"v must have shape \(2, 3, 6, \*\), got v.shape=\(2, 3, 5, 8\)"),
    ("v", [(2, 3, 5, 8), (2, 3, 5, 8), (1, 3, 5, 8)], r"v must have shape \(2, 3, 5, \*\), got v.shape=\(1, 3, 5, 8\)"),
    ("k", [(2, 3, 5, 8), (3, 5, 8), (2, 3, 5, 8)], r"k must be 4-D, got k.shape=\(3, 5, 8\)"),
])
def test_mismatched_shapes_name_the_argument(name, shapes, pattern):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match="flash_attention: " + pattern):
        flash_attention(q, k, v)


def test_non_float_and_mixed_dtypes_are_type_errors():
    x = torch.ones(1, 1, 4, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"flash_attention: q must be a floating-point tensor, got q.dtype=torch.int64"):
        flash_attention(x, x, x)
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(TypeError, match=r"flash_attention: v must have dtype float32, got v.dtype=torch.float64"):
        flash_attention(q, q, q.double())
    with pytest.raises(TypeError, match=r"flash_attention: k must be a tensor, got list"):
        flash_attention(q, [[1.0]], q)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(block_size_q=0), ValueError, r"block_size_q must be an int >= 1, got block_size_q=0"),
    (dict(block_size_k=-4), ValueError, r"block_size_k must be an int >= 1, got block_size_k=-4"),
    (dict(block_size_k=2.0), TypeError, r"block_size_k must be an int"),
    (dict(window=0), ValueError, r"window must be an int >= 1, got window=0"),
    (dict(scale=0.0), ValueError, r"scale must be a finite number > 0, got scale=0.0"),
    (dict(is_causal=1), TypeError, r"is_causal must be a bool"),
])
def test_bad_options_name_the_argument(kwargs, error, pattern):
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(error, match="flash_attention: " + pattern):
        flash_attention(q, q, q, **kwargs)
