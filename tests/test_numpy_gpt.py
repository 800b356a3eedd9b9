"""Unit tests for transformer_lib.numpy_gpt (chapter 8): the NumPy GPT against PyTorch's GPT and autograd,
finite differences, and AdamWNumpy / clip_grad_norm_np against their PyTorch counterparts."""

import math

import numpy as np
import pytest
import torch

from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.numpy_gpt import (
    AdamWNumpy,
    clip_grad_norm_np,
    gpt_backward,
    gpt_forward,
    gpt_init_params,
    gpt_loss_and_grads,
    gpt_param_shapes,
    params_from_torch,
    params_to_torch,
)
from transformer_lib.optim import clip_grad_norm_, weight_decay_groups

TOL = 1e-12  # relative error allowed against autograd in float64 (observed: about 1e-15)
# the "tiny" preset as it is (biases, exact GELU) and in GPT-2's variant (no biases, tanh GELU)
VARIANTS = pytest.mark.parametrize(
    "overrides", [{}, {"bias": False, "activation": "gelu_tanh"}], ids=["bias-gelu", "nobias-tanh"]
)


def rel_err(ours: np.ndarray, ref) -> float:
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ref.shape, ours.dtype, ref.dtype)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------- the whole GPT
@VARIANTS
def test_gpt_grads_match_autograd(rng, overrides):
    config = GPTConfig.from_preset("tiny", **overrides)
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


def test_gpt_grads_match_finite_differences(rng, tiny_config):
    params = gpt_init_params(tiny_config, seed=1, dtype=np.float64)
    for a in params.values():
        a += 0.05 * rng.standard_normal(a.shape)
    idx, tg = rng.integers(0, 65, (2, 8)), rng.integers(0, 65, (2, 8))
    _, grads = gpt_loss_and_grads(params, idx, tg, tiny_config)
    h = 1e-5
    for name in ("wte.weight", "blocks.0.attn.in_proj.weight", "blocks.1.ln2.bias"):
        i = np.unravel_index(np.abs(grads[name]).argmax(), grads[name].shape)
        old = params[name][i]
        params[name][i] = old + h
        plus = gpt_loss_and_grads(params, idx, tg, tiny_config)[0]
        params[name][i] = old - h
        minus = gpt_loss_and_grads(params, idx, tg, tiny_config)[0]
        params[name][i] = old
        assert abs((plus - minus) / (2 * h) - grads[name][i]) <= 1e-6 * abs(grads[name][i]), name


def test_gpt_float32_dtypes(rng, tiny_config):
    params = gpt_init_params(tiny_config, dtype=np.float32)
    idx = rng.integers(0, 65, (2, 16))
    logits, cache = gpt_forward(params, idx, tiny_config)
    grads = gpt_backward(np.ones_like(logits), cache)
    assert logits.shape == (2, 16, 65) and logits.dtype == np.float32
    assert all(grads[n].dtype == np.float32 and grads[n].shape == p.shape for n, p in params.items())


@VARIANTS
def test_param_shapes_and_init_match_gpt(overrides):
    config = GPTConfig.from_preset("tiny", **overrides)
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


def test_params_round_trip_is_exact_and_copies(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config).double()
    params = params_from_torch(model)
    other = params_to_torch(params, GPT(tiny_config).double())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))
    back = params_from_torch(other, np.float32)
    assert all(back[n].dtype == np.float32 and np.allclose(back[n], params[n], atol=1e-7) for n in params)
    params["wte.weight"][:] = 0.0
    assert model.wte.weight.abs().sum() > 0 and other.lm_head.weight.abs().sum() > 0


# ---------------------------------------------------------------- optimizer and clipping
def test_adamw_numpy_matches_torch_adamw(rng, tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config).double()
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
    ref = clip_grad_norm_(tensors, 0.5)
    assert abs(norm - ref.item()) <= 1e-12 * ref.item()
    assert all(np.abs(g - t.grad.numpy()).max() <= 1e-15 for g, t in zip(grads.values(), tensors))
    unclipped = {"a": np.full(4, 0.1)}
    clip_grad_norm_np(unclipped, 10.0)
    assert np.array_equal(unclipped["a"], np.full(4, 0.1))


# ---------------------------------------------------------------- bad input
def test_gpt_forward_refuses_what_it_does_not_implement(tiny_config):
    params = gpt_init_params(tiny_config, dtype=np.float64)
    idx = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="gpt_forward: config.activation .*got config.activation='relu'"):
        gpt_forward(params, idx, GPTConfig.from_preset("tiny", activation="relu"))
    with pytest.raises(ValueError, match="gpt_forward: config.dropout must be 0.0"):
        gpt_forward(params, idx, GPTConfig.from_preset("tiny", dropout=0.1))
    with pytest.raises(TypeError, match="gpt_forward: config must be a GPTConfig"):
        gpt_forward(params, idx, {"n_layer": 2})


def test_gpt_bad_params_and_idx(tiny_config):
    params = gpt_init_params(tiny_config, dtype=np.float64)
    idx = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match=r"params .*unexpected \['lm_head.weight'\]; the output layer is tied"):
        gpt_forward({**params, "lm_head.weight": params["wte.weight"]}, idx, tiny_config)
    with pytest.raises(ValueError, match=r"gpt_forward: idx .*block_size=16, got idx.shape=\(1, 17\)"):
        gpt_forward(params, np.zeros((1, 17), dtype=np.int64), tiny_config)
    with pytest.raises(ValueError, match="gpt_forward: idx must be 2-D"):
        gpt_forward(params, np.zeros(4, dtype=np.int64), tiny_config)
    with pytest.raises(ValueError, match="ids must hold ids in"):
        gpt_forward(params, np.full((1, 4), 65), tiny_config)
    with pytest.raises(TypeError, match=r"params\['wpe.weight'\].dtype=float32"):
        gpt_forward({**params, "wpe.weight": params["wpe.weight"].astype(np.float32)}, idx, tiny_config)
    with pytest.raises(ValueError, match=r"params\['ln_f.weight'\] must have shape \(32,\)"):
        gpt_forward({**params, "ln_f.weight": np.ones(31)}, idx, tiny_config)
    with pytest.raises(ValueError, match="params_to_torch: params must match config"):
        params_to_torch(params, GPT(GPTConfig.from_preset("tiny", bias=False)))
    with pytest.raises(TypeError, match="params_from_torch: model must be a transformer_lib.gpt.GPT"):
        params_from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="gpt_init_params: dtype"):
        gpt_init_params(tiny_config, dtype=np.int64)
    with pytest.raises(ValueError, match="targets"):
        gpt_loss_and_grads(params, idx, np.zeros((1, 5), dtype=np.int64), tiny_config)


def test_optimizer_bad_arguments():
    params = {"w": np.ones((2, 2))}
    with pytest.raises(ValueError, match="AdamWNumpy: lr .*got lr=-1"):
        AdamWNumpy(params, lr=-1)
    with pytest.raises(ValueError, match=r"AdamWNumpy: betas\[1\]"):
        AdamWNumpy(params, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="AdamWNumpy: betas"):
        AdamWNumpy(params, betas=0.9)
    with pytest.raises(TypeError, match=r"AdamWNumpy: params\['w'\] must have dtype"):
        AdamWNumpy({"w": np.ones(2, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"AdamWNumpy.step: grads\['w'\] must have shape \(2, 2\)"):
        AdamWNumpy(params).step({"w": np.ones(2)})
    with pytest.raises(ValueError, match="AdamWNumpy.step: grads must be a dict with the keys of params"):
        AdamWNumpy(params).step({"v": np.ones((2, 2))})
    with pytest.raises(ValueError, match="clip_grad_norm_np: max_norm"):
        clip_grad_norm_np({"w": np.ones(2)}, 0.0)
    with pytest.raises(TypeError, match=r"clip_grad_norm_np: grads\['w'\]"):
        clip_grad_norm_np({"w": [1.0, 2.0]}, 1.0)
