"""Unit tests for transformer_lib.backprop (chapter 8): every backward pass against PyTorch autograd."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.backprop import (
    AdamWNumpy,
    _normal_tail,
    attention_backward,
    attention_forward,
    block_backward,
    block_forward,
    clip_grad_norm_np,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    gpt_backward,
    gpt_forward,
    gpt_init_params,
    gpt_loss_and_grads,
    gpt_param_shapes,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    mha_backward,
    mha_forward,
    params_from_torch,
    params_to_torch,
)
from transformer_lib.block import TransformerBlock
from transformer_lib.model import GPT, GPTConfig
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.training import clip_grad_norm, weight_decay_groups

TOL = 1e-6  # relative error required in float64 (the agreement is about 1e-15)
TINY = GPTConfig.from_preset("tiny")
TINY_NO_BIAS = GPTConfig.from_preset("tiny", bias=False, activation="gelu_tanh")


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
    assert max([rel_err(y, ref), rel_err(dx, xt.grad)] + [rel_err(grads[n], p.grad) for n, p in mha.named_parameters()]) <= TOL


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_autograd(rng, bias):
    x = 3 * rng.standard_normal((2, 5, 8)) + 2
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


# ---------------------------------------------------------------- the whole GPT
@pytest.mark.parametrize("config", [TINY, TINY_NO_BIAS])
def test_gpt_grads_match_autograd(rng, config):
    torch.manual_seed(0)
    model = GPT(config).double()
    params = params_from_torch(model)
    idx, tg = rng.integers(0, 65, (3, 12)), rng.integers(0, 65, (3, 12))  # T < block_size: wpe rows 12.. get 0
    loss, grads = gpt_loss_and_grads(params, idx, tg, config)
    _, ref = model(torch.from_numpy(idx), torch.from_numpy(tg))
    ref.backward()
    assert list(grads) == list(params) == [n for n, _ in model.named_parameters()]
    assert abs(loss - ref.item()) <= 1e-12
    assert max(rel_err(grads[n], p.grad) for n, p in model.named_parameters()) <= TOL
    assert not grads["wpe.weight"][12:].any()


def test_gpt_grads_match_finite_differences(rng):
    params = gpt_init_params(TINY, seed=1, dtype=np.float64)
    for a in params.values():
        a += 0.05 * rng.standard_normal(a.shape)
    idx, tg = rng.integers(0, 65, (2, 8)), rng.integers(0, 65, (2, 8))
    _, grads = gpt_loss_and_grads(params, idx, tg, TINY)
    h = 1e-5
    for name in ("wte.weight", "blocks.0.attn.in_proj.weight", "blocks.1.ln2.bias"):
        i = np.unravel_index(np.abs(grads[name]).argmax(), grads[name].shape)
        old = params[name][i]
        params[name][i] = old + h
        plus = gpt_loss_and_grads(params, idx, tg, TINY)[0]
        params[name][i] = old - h
        minus = gpt_loss_and_grads(params, idx, tg, TINY)[0]
        params[name][i] = old
        assert abs((plus - minus) / (2 * h) - grads[name][i]) <= 1e-6 * abs(grads[name][i]), name


def test_gpt_float32_dtypes(rng):
    params = gpt_init_params(TINY, dtype=np.float32)
    idx = rng.integers(0, 65, (2, 16))
    logits, cache = gpt_forward(params, idx, TINY)
    grads = gpt_backward(np.ones_like(logits), cache)
    assert logits.shape == (2, 16, 65) and logits.dtype == np.float32
    assert all(grads[n].dtype == np.float32 and grads[n].shape == p.shape for n, p in params.items())


@pytest.mark.parametrize("config", [TINY, TINY_NO_BIAS])
def test_param_shapes_and_init_match_gpt(config):
    model = GPT(config)
    shapes = gpt_param_shapes(config)
    assert shapes == {n: tuple(p.shape) for n, p in model.named_parameters()}
    params = gpt_init_params(config, seed=0, dtype=np.float64)
    assert {n: a.shape for n, a in params.items()} == shapes
    assert np.array_equal(gpt_init_params(config, seed=0, dtype=np.float64)["wte.weight"], params["wte.weight"])
    assert np.array_equal(params["blocks.0.ln1.weight"], np.ones(config.n_embd))
    big = gpt_init_params(GPTConfig.from_preset("baby"), seed=0, dtype=np.float64)
    assert abs(big["blocks.0.mlp.fc1.weight"].std() - 0.02) < 0.001
    assert abs(big["blocks.0.mlp.fc2.weight"].std() - 0.02 / math.sqrt(8)) < 0.0005


def test_params_round_trip_is_exact_and_copies():
    torch.manual_seed(0)
    model = GPT(TINY).double()
    params = params_from_torch(model)
    other = params_to_torch(params, GPT(TINY).double())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))
    back = params_from_torch(other, np.float32)
    assert all(back[n].dtype == np.float32 and np.allclose(back[n], params[n], atol=1e-7) for n in params)
    params["wte.weight"][:] = 0.0
    assert model.wte.weight.abs().sum() > 0 and other.lm_head.weight.abs().sum() > 0


# ---------------------------------------------------------------- optimizer and clipping
def test_adamw_numpy_matches_torch_adamw(rng):
    torch.manual_seed(0)
    model = GPT(TINY).double()
    params = params_from_torch(model)
    ours = AdamWNumpy(params, lr=3e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=3e-2, betas=(0.9, 0.95), eps=1e-8)
    for step in range(15):
        grads = {n: rng.standard_normal(p.shape) for n, p in params.items()}
        for n, p in model.named_parameters():
            p.grad = torch.from_numpy(grads[n].copy())
        ours.lr = ref.param_groups[0]["lr"] = ref.param_groups[1]["lr"] = 3e-2 / (step + 1)
        ours.step(grads)
        ref.step()
        assert max(np.abs(params[n] - p.detach().numpy()).max() for n, p in model.named_parameters()) <= 1e-12
    assert ours.t == 15


def test_clip_grad_norm_np_matches_torch(rng):
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    tensors = [torch.zeros(3, 4, dtype=torch.float64, requires_grad=True),
               torch.zeros(5, dtype=torch.float64, requires_grad=True)]
    for t, g in zip(tensors, grads.values()):
        t.grad = torch.from_numpy(g.copy())
    norm = clip_grad_norm_np(grads, 0.5)
    ref = clip_grad_norm(tensors, 0.5)
    assert abs(norm - ref.item()) <= 1e-12 * ref.item()
    assert all(np.abs(g - t.grad.numpy()).max() <= 1e-15 for g, t in zip(grads.values(), tensors))
    unclipped = {"a": np.full(4, 0.1)}
    clip_grad_norm_np(unclipped, 10.0)
    assert np.array_equal(unclipped["a"], np.full(4, 0.1))


# ---------------------------------------------------------------- bad input
def test_bad_shapes_and_dtypes_name_the_argument(rng):
    x, w = rng.standard_normal((2, 7)), rng.standard_normal((3, 5))
    with pytest.raises(ValueError, match=r"x\.shape=\(2, 7\) and weight\.shape=\(3, 5\)"):
        linear_forward(x, w)
    with pytest.raises(TypeError, match="x must have dtype float32 or float64"):
        linear_forward(x.astype(np.int64), w)
    with pytest.raises(TypeError, match=r"x\.dtype=float32, weight\.dtype=float64"):
        linear_forward(x[:, :5].astype(np.float32), w)
    _, cache = linear_forward(x[:, :5], w)
    with pytest.raises(ValueError, match="dy must have the forward output's shape"):
        linear_backward(np.ones((2, 4)), cache)
    with pytest.raises(ValueError, match="ids holds the id 12"):
        embedding_forward(np.array([1, 12]), rng.standard_normal((10, 4)))
    with pytest.raises(TypeError, match="ids must be an integer"):
        embedding_forward(np.array([1.0]), rng.standard_normal((10, 4)))
    with pytest.raises(ValueError, match="targets must have the shape of logits"):
        cross_entropy_forward(rng.standard_normal((2, 5, 9)), np.zeros(10, dtype=np.int64))
    q = rng.standard_normal((2, 4, 8))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        attention_forward(q, q, q, is_causal=1)
    with pytest.raises(ValueError, match=r"k\.shape=\(2, 4, 6\)"):
        attention_forward(q, q[..., :6], q)
    with pytest.raises(ValueError, match="eps must be > 0"):
        layer_norm_forward(q, np.ones(8), eps=0.0)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        layer_norm_forward(q, np.ones(7))
    with pytest.raises(ValueError, match="n_head must be >= 1 and divide"):
        mha_forward(q, {"in_proj.weight": np.ones((24, 8)), "out_proj.weight": np.ones((8, 8))}, 3)


def test_unsupported_activation_and_dropout():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got approximate='sigmoid'"):
        gelu_forward(np.ones(3), "sigmoid")
    params = gpt_init_params(TINY, dtype=np.float64)
    idx = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="config.activation must be 'gelu' or 'gelu_tanh'.*got config.activation='relu'"):
        gpt_forward(params, idx, GPTConfig.from_preset("tiny", activation="relu"))
    with pytest.raises(ValueError, match="activation must be 'gelu' or 'gelu_tanh'"):
        block_forward(np.ones((1, 4, 32)), {}, n_head=2, activation="relu")
    with pytest.raises(ValueError, match="config.dropout must be 0.0"):
        gpt_forward(params, idx, GPTConfig.from_preset("tiny", dropout=0.1))


def test_gpt_bad_params_and_idx():
    params = gpt_init_params(TINY, dtype=np.float64)
    with pytest.raises(ValueError, match="unexpected \\['lm_head.weight'\\]; the output layer is tied"):
        gpt_forward({**params, "lm_head.weight": params["wte.weight"]}, np.zeros((1, 4), dtype=np.int64), TINY)
    with pytest.raises(ValueError, match=r"idx must be a \(B, T\) array with 1 <= T <= block_size=16, got idx.shape=\(1, 17\)"):
        gpt_forward(params, np.zeros((1, 17), dtype=np.int64), TINY)
    with pytest.raises(TypeError, match="params\\['wpe.weight'\\].dtype=float32"):
        gpt_forward({**params, "wpe.weight": params["wpe.weight"].astype(np.float32)}, np.zeros((1, 4), dtype=np.int64), TINY)
    with pytest.raises(ValueError, match="params\\['ln_f.weight'\\] must have shape \\(32,\\)"):
        gpt_forward({**params, "ln_f.weight": np.ones(31)}, np.zeros((1, 4), dtype=np.int64), TINY)
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        gpt_forward(params, np.zeros((1, 4), dtype=np.int64), {"n_layer": 2})
    with pytest.raises(ValueError, match="params does not match config"):
        params_to_torch(params, GPT(TINY_NO_BIAS))
    with pytest.raises(TypeError, match="model must be a transformer_lib.model.GPT"):
        params_from_torch(torch.nn.Linear(2, 2))


def test_optimizer_bad_arguments():
    params = {"w": np.ones((2, 2))}
    with pytest.raises(ValueError, match="lr must be a number >= 0, got lr=-1"):
        AdamWNumpy(params, lr=-1)
    with pytest.raises(ValueError, match="betas must be two numbers"):
        AdamWNumpy(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"grads\['w'\] must have shape \(2, 2\)"):
        AdamWNumpy(params).step({"w": np.ones(2)})
    with pytest.raises(ValueError, match="max_norm must be a number > 0"):
        clip_grad_norm_np({"w": np.ones(2)}, 0.0)
