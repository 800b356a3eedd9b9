"""Unit tests for transformer_lib.backprop (chapter 8): every layer's backward pass against PyTorch autograd."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.backprop import (
    _normal_tail,
    attention_backward,
    attention_forward,
    block_backward,
    block_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    mha_backward,
    mha_forward,
)
from transformer_lib.block import TransformerBlock
from transformer_lib.multihead import MultiHeadAttention

TOL = 1e-12  # relative error allowed against autograd in float64 (observed: about 1e-15)


def rel_err(ours: np.ndarray, ref) -> float:
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ref.shape, ours.dtype, ref.dtype)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def leaf(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, requires_grad=True)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------- layers vs autograd (float64)
@pytest.mark.parametrize("shape", [(7,), (2, 5, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_autograd(rng, shape, bias):
    x, w = rng.standard_normal(shape), rng.standard_normal((3, 7))
    b = rng.standard_normal(3) if bias else None
    G = rng.standard_normal((*shape[:-1], 3))
    y, cache = linear_forward(x, w, b)
    dx, dw, db = linear_backward(G, cache)
    xt, wt = leaf(x), leaf(w)
    bt = leaf(b) if bias else None
    F.linear(xt, wt, bt).backward(torch.from_numpy(G))
    assert y.shape == (*shape[:-1], 3) and y.dtype == np.float64
    assert max(rel_err(dx, xt.grad), rel_err(dw, wt.grad)) <= TOL
    assert (db is None) if not bias else rel_err(db, bt.grad) <= TOL


def test_embedding_matches_autograd(rng):
    ids = rng.integers(0, 8, (3, 7))  # repeats; rows 8 and 9 unused
    w, G = rng.standard_normal((10, 4)), rng.standard_normal((3, 7, 4))
    y, cache = embedding_forward(ids, w)
    dw = embedding_backward(G, cache)
    wt = leaf(w)
    F.embedding(torch.from_numpy(ids), wt).backward(torch.from_numpy(G))
    assert np.array_equal(y, w[ids]) and rel_err(dw, wt.grad) <= TOL and not dw[8:].any()


@pytest.mark.parametrize("shape", [(9, 11), (2, 5, 11)])
def test_cross_entropy_matches_autograd(rng, shape):
    z = 4 * rng.standard_normal(shape)
    t = rng.integers(0, shape[-1], shape[:-1])
    loss, cache = cross_entropy_forward(z, t)
    dz = cross_entropy_backward(cache)
    zt = leaf(z)
    ref = F.cross_entropy(zt.reshape(-1, shape[-1]), torch.from_numpy(t).reshape(-1))
    ref.backward()
    assert isinstance(loss, float) and abs(loss - ref.item()) <= 1e-12
    assert rel_err(dz, zt.grad) <= TOL
    assert np.array_equal(cross_entropy_backward(cache), dz)  # the cache is not consumed


@pytest.mark.parametrize("is_causal,L,S", [(False, 5, 7), (True, 6, 6)])
def test_attention_matches_autograd(rng, is_causal, L, S):
    q, k, v = rng.standard_normal((2, 3, L, 4)), rng.standard_normal((2, 3, S, 4)), rng.standard_normal((2, 3, S, 5))
    G = rng.standard_normal((2, 3, L, 5))
    out, cache = attention_forward(q, k, v, is_causal=is_causal)
    grads = attention_backward(G, cache)
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=is_causal)
    ref.backward(torch.from_numpy(G))
    assert rel_err(out, ref) <= TOL
    assert max(rel_err(a, b.grad) for a, b in zip(grads, (qt, kt, vt))) <= TOL


@pytest.mark.parametrize("bias", [True, False])
def test_mha_matches_autograd(rng, bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, bias=bias).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_()
    params = {n: p.detach().numpy().copy() for n, p in mha.named_parameters()}
    x, G = rng.standard_normal((2, 6, 16)), rng.standard_normal((2, 6, 16))
    y, cache = mha_forward(x, params, 4)
    dx, grads = mha_backward(G, cache)
    xt = leaf(x)
    ref, _ = mha(xt, is_causal=True)
    ref.backward(torch.from_numpy(G))
    assert grads.keys() == params.keys()
    errors = [rel_err(y, ref), rel_err(dx, xt.grad)] + [rel_err(grads[n], p.grad) for n, p in mha.named_parameters()]
    assert max(errors) <= TOL


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_autograd(rng, bias):
    # rows of variance 1e-6 to 9: where the variance is below eps, eps changes the output by a large factor
    x = np.array([1e-3, 3e-3, 1e-2, 1.0, 3.0]).reshape(5, 1) * (rng.standard_normal((2, 5, 8)) + 2)
    w = rng.standard_normal(8)
    b = rng.standard_normal(8) if bias else None
    G = rng.standard_normal((2, 5, 8))
    y, cache = layer_norm_forward(x, w, b, eps=1e-5)
    dx, dw, db = layer_norm_backward(G, cache)
    xt, wt = leaf(x), leaf(w)
    bt = leaf(b) if bias else None
    ref = F.layer_norm(xt, (8,), wt, bt, eps=1e-5)
    ref.backward(torch.from_numpy(G))
    assert max(rel_err(y, ref), rel_err(dx, xt.grad), rel_err(dw, wt.grad)) <= TOL
    assert (db is None) if not bias else rel_err(db, bt.grad) <= TOL
    # the same check fails an implementation that forgets eps (a tiny eps stands in for none)
    y0, cache0 = layer_norm_forward(x, w, b, eps=1e-300)
    assert max(rel_err(y0, ref), rel_err(layer_norm_backward(G, cache0)[0], xt.grad)) > 1e-2


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_autograd(rng, approximate):
    x = np.concatenate([3 * rng.standard_normal(500), np.linspace(-12, 12, 1001)])
    G = rng.standard_normal(x.shape)
    y, cache = gelu_forward(x, approximate)
    dx = gelu_backward(G, cache)
    xt = leaf(x)
    ref = F.gelu(xt, approximate=approximate)
    ref.backward(torch.from_numpy(G))
    assert rel_err(y, ref) <= TOL and rel_err(dx, xt.grad) <= TOL


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_float32_values_and_dtype(rng, approximate):
    x = (3 * rng.standard_normal((4, 50))).astype(np.float32)
    y, cache = gelu_forward(x, approximate)
    dx = gelu_backward(np.ones_like(x), cache)
    ref = F.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    assert y.dtype == np.float32 and dx.dtype == np.float32
    assert np.abs(y - ref).max() <= 2e-6  # a few float32 ulp of values up to about 10


# the exponential's relative error grows like x^2 / 2 times the dtype's epsilon (50 * 1.2e-7 at |x| = 10)
@pytest.mark.parametrize("dtype,atol,rtol_exp", [(np.float64, 1e-15, 1e-13), (np.float32, 3e-7, 2e-5)])
def test_normal_tail_vs_math_erfc(dtype, atol, rtol_exp):
    x = np.linspace(-10, 10, 4001).astype(dtype)  # both float64 branches (series and continued fraction)
    exact = np.array([0.5 * math.erfc(abs(float(v)) / math.sqrt(2)) for v in x])
    tail, e = _normal_tail(x)
    assert tail.dtype == dtype and e.dtype == dtype and np.abs(tail - exact).max() <= atol
    assert np.allclose(e, np.exp(-x.astype(np.float64) ** 2 / 2), rtol=rtol_exp, atol=0)


@pytest.mark.parametrize("bias,activation", [(True, "gelu"), (False, "gelu_tanh")])
def test_block_matches_autograd(rng, bias, activation):
    torch.manual_seed(0)
    blk = TransformerBlock(16, 4, activation=activation, bias=bias).double()
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(0.1 * torch.randn_like(p))
    params = {n: p.detach().numpy().copy() for n, p in blk.named_parameters()}
    x, G = rng.standard_normal((2, 6, 16)), rng.standard_normal((2, 6, 16))
    y, cache = block_forward(x, params, n_head=4, activation=activation)
    dx, grads = block_backward(G, cache)
    xt = leaf(x)
    blk(xt, is_causal=True).backward(torch.from_numpy(G))
    assert grads.keys() == params.keys()
    assert max([rel_err(dx, xt.grad)] + [rel_err(grads[n], p.grad) for n, p in blk.named_parameters()]) <= TOL


# ---------------------------------------------------------------- bad input: the forward functions check
def test_linear_forward_bad_arguments(rng):
    x, w = rng.standard_normal((2, 7)), rng.standard_normal((3, 5))
    with pytest.raises(ValueError, match=r"linear_forward: x .*x\.shape=\(2, 7\) and weight\.shape=\(3, 5\)"):
        linear_forward(x, w)
    with pytest.raises(TypeError, match="linear_forward: x must have dtype"):
        linear_forward(x.astype(np.int64), w)
    with pytest.raises(TypeError, match=r"weight must have dtype float32, got weight\.dtype=float64"):
        linear_forward(x[:, :5].astype(np.float32), w)  # NumPy would promote silently
    with pytest.raises(ValueError, match="bias"):
        linear_forward(x[:, :5], w, np.ones(4))
    with pytest.raises(TypeError, match="weight must be a NumPy array"):
        linear_forward(x, [[1.0] * 7])


def test_embedding_and_cross_entropy_bad_ids(rng):
    with pytest.raises(ValueError, match=r"embedding_forward: ids must hold ids in \[0, 10\), got the id 12"):
        embedding_forward(np.array([1, 12]), rng.standard_normal((10, 4)))
    with pytest.raises(TypeError, match="embedding_forward: ids must be an integer array"):
        embedding_forward(np.array([1.0]), rng.standard_normal((10, 4)))
    with pytest.raises(ValueError, match="cross_entropy_forward: targets"):
        cross_entropy_forward(rng.standard_normal((2, 5, 9)), np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="targets .*got the id -1"):
        cross_entropy_forward(rng.standard_normal((2, 9)), np.array([0, -1]))
    with pytest.raises(TypeError, match="targets must be a NumPy array"):
        cross_entropy_forward(rng.standard_normal((2, 9)), [0, 1])


def test_attention_and_mha_bad_arguments(rng):
    q = rng.standard_normal((2, 4, 8))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        attention_forward(q, q, q, is_causal=1)
    with pytest.raises(ValueError, match=r"attention_forward: q, k and v .*k\.shape=\(2, 4, 6\)"):
        attention_forward(q, q[..., :6], q)
    with pytest.raises(TypeError, match="attention_forward: k must have dtype float64"):
        attention_forward(q, q.astype(np.float32), q)
    with pytest.raises(ValueError, match="mha_forward: n_head"):
        mha_forward(q, {"in_proj.weight": np.ones((24, 8)), "out_proj.weight": np.ones((8, 8))}, 3)
    with pytest.raises(TypeError, match="mha_forward: n_head must be an int"):
        mha_forward(q, {"in_proj.weight": np.ones((24, 8)), "out_proj.weight": np.ones((8, 8))}, 2.0)
    with pytest.raises(ValueError, match=r"mha_forward: params must hold \['out_proj.weight'\]"):
        mha_forward(q, {"in_proj.weight": np.ones((24, 8))}, 2)
    with pytest.raises(ValueError, match=r"params\['in_proj.weight'\] must have shape"):
        mha_forward(q, {"in_proj.weight": np.ones((8, 8)), "out_proj.weight": np.ones((8, 8))}, 2)


def test_layer_norm_gelu_block_bad_arguments(rng):
    x = rng.standard_normal((2, 4, 8))
    with pytest.raises(ValueError, match="layer_norm_forward: eps"):
        layer_norm_forward(x, np.ones(8), eps=0.0)
    with pytest.raises(ValueError, match=r"layer_norm_forward: weight must have shape .*weight\.shape=\(7,\)"):
        layer_norm_forward(x, np.ones(7))
    with pytest.raises(ValueError, match="gelu_forward: approximate .*got approximate='sigmoid'"):
        gelu_forward(np.ones(3), "sigmoid")
    with pytest.raises(ValueError, match="block_forward: activation .*got activation='relu'"):
        block_forward(np.ones((1, 4, 32)), {}, n_head=2, activation="relu")
    with pytest.raises(ValueError, match=r"block_forward: params must hold \['ln1.weight'"):
        block_forward(np.ones((1, 4, 32)), {}, n_head=2)
    with pytest.raises(ValueError, match=r"block_forward: x must be 3-D"):
        block_forward(np.ones((4, 32)), {}, n_head=2)
