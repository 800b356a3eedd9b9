"""Unit tests for transformer_lib.moe (chapter 18): the sparse MoE layer, its gating, capacity and
load-balancing loss, against Hugging Face's Qwen3-MoE and against dense references."""

import math
import warnings

import pytest
import torch

from transformer_lib.embeddings import rope_inv_freq
from transformer_lib.moe import (
    SparseMoE,
    expert_capacity,
    load_balancing_loss,
    moe_from_hf,
    top_k_gating,
)

ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = list(ATOL)
C, D_FF, E, K = 32, 24, 8, 2


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def dense_reference(moe: SparseMoE, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Every expert on every token, weighted by a dense (N, E) gate matrix (zero outside the top k)."""
    xs = x.reshape(-1, moe.d_model)
    probs = torch.softmax(moe.router(xs), dim=-1)
    gates, experts = probs.topk(moe.top_k, dim=-1)
    if moe.norm_topk_prob:
        gates = gates / gates.sum(-1, keepdim=True)
    if keep is not None:
        gates = gates * keep
    G = torch.zeros(len(xs), moe.n_experts, dtype=x.dtype).scatter(1, experts, gates)
    return sum(G[:, e, None] * moe.experts[e](xs) for e in range(moe.n_experts)).view_as(x)


def keep_loop(experts: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """First choices of all tokens (in token order), then second choices, take free slots."""
    used, keep = [0] * n_experts, torch.zeros(experts.shape, dtype=torch.bool)
    for rank in range(experts.size(1)):
        for t in range(experts.size(0)):
            e = int(experts[t, rank])
            keep[t, rank], used[e] = used[e] < capacity, used[e] + 1
    return keep


# ---------------------------------------------------------------- gating and the layer


@pytest.mark.parametrize("norm", [False, True])
def test_top_k_gating_is_softmax_then_topk(norm):
    logits = randn(20, E)
    gates, experts = top_k_gating(logits, 3, norm_topk_prob=norm)
    p = torch.softmax(logits, -1)
    ref_g, ref_e = p.topk(3, -1)
    if norm:
        ref_g = ref_g / ref_g.sum(-1, keepdim=True)
        assert torch.allclose(gates.sum(-1), torch.ones(20, dtype=torch.float64), atol=1e-12)
    assert torch.equal(experts, ref_e)
    assert torch.allclose(gates, ref_g, atol=1e-12, rtol=0)
    assert gates.dtype == logits.dtype


def test_top_k_gating_softmax_in_float32_for_bfloat16():
    logits = randn(6, E, dtype=torch.float32) * 4
    gates, experts = top_k_gating(logits.bfloat16(), 2)
    assert gates.dtype == torch.bfloat16
    ref = torch.softmax(logits.bfloat16().float(), -1).topk(2, -1)
    assert torch.equal(experts, ref.indices)
    assert torch.equal(gates, ref.values.bfloat16())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
def test_sparse_moe_equals_dense_reference(dtype, norm):
    torch.manual_seed(0)
    moe = SparseMoE(C, D_FF, E, K, norm_topk_prob=norm).to(dtype)
    x = randn(3, 5, C, dtype=dtype)
    with torch.no_grad():
        diff = (moe(x) - dense_reference(moe, x)).abs().max().item()
    assert diff < ATOL[dtype]
    assert moe.router_logits.shape == (15, E) and moe.n_dropped == 0


def test_sparse_moe_backward_reaches_router_and_experts():
    torch.manual_seed(0)
    moe = SparseMoE(C, D_FF, E, K)
    x = randn(2, 6, C, dtype=torch.float32)
    (moe(x).square().sum() + load_balancing_loss(moe.router_logits, K)).backward()
    assert moe.router.weight.grad.abs().sum() > 0
    grads = [ex.down_proj.weight.grad for ex in moe.experts]
    used = [i for i, g in enumerate(grads) if g is not None and g.abs().sum() > 0]
    assert len(used) >= K


# ---------------------------------------------------------------- Hugging Face


def _hf():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    return transformers, modeling_qwen3_moe


def hf_block(norm, dtype, seed=0):
    transformers, mod = _hf()
    cfg = transformers.Qwen3MoeConfig(hidden_size=C, moe_intermediate_size=D_FF, num_experts=E,
                                      num_experts_per_tok=K, norm_topk_prob=norm)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    block = mod.Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    return block.to(dtype).eval()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
def test_from_hf_equals_qwen3_moe_block(dtype, norm):
    block = hf_block(norm, dtype)
    ours = SparseMoE.from_hf(block)
    x = randn(3, 10, C, dtype=dtype, seed=1)
    with torch.no_grad():
        y_hf, y = block(x), ours(x)
        logits_hf = block.gate(x.view(-1, C))[0]
    assert (y - y_hf).abs().max().item() < ATOL[dtype]
    assert (ours.router_logits - logits_hf).abs().max().item() < ATOL[dtype]
    assert ours.top_k == K and ours.norm_topk_prob is norm and ours.router_dtype == torch.float32


def test_from_hf_rejects_other_modules():
    with pytest.raises(TypeError, match="block must be a transformers Qwen3MoeSparseMoeBlock"):
        SparseMoE.from_hf(torch.nn.Linear(3, 3))


def test_load_balancing_loss_equals_hf():
    _, mod = _hf()
    g = torch.Generator().manual_seed(2)
    layers = tuple(torch.randn(24, E, generator=g) * s for s in (1.0, 3.0))
    mask = torch.rand(4, 6, generator=g) > 0.3
    for logits, m in ((layers[:1], None), (layers, None), (layers, mask), (layers, mask.long())):
        ours = load_balancing_loss(logits, K, attention_mask=m)
        theirs = mod.load_balancing_loss_func(logits, E, K, m)
        assert abs(ours.item() - theirs.item()) < 1e-6
    assert torch.equal(load_balancing_loss(layers[0], K), load_balancing_loss((layers[0],), K))


def hf_model(dtype=torch.float32, **extra):
    transformers, _ = _hf()
    torch.manual_seed(1)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=53, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=6, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=32, tie_word_embeddings=False, **extra)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn_like(p)) if "norm" in name else p.mul_(5.0)
    if dtype == torch.float64:
        model.set_experts_implementation("eager")
    return model.to(dtype).eval()


def hf_rms_rope_in_float64(model, inv_freq):
    """HF's RMSNorm and rotary embedding compute in float32 whatever the dtype; make them float64."""
    import types

    def rms_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        angles = position_ids[..., None].double() * inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = types.MethodType(rms_forward, m)
        if type(m).__name__.endswith("RotaryEmbedding"):
            m.forward = types.MethodType(rope_forward, m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_from_hf_equals_qwen3_moe_for_causal_lm(dtype):
    hf = hf_model(dtype)
    ours = moe_from_hf(hf)
    if dtype == torch.float64:
        c = ours.config
        hf_rms_rope_in_float64(hf, rope_inv_freq(c.d_head, c.rope_theta, c.rope_scaling))
    idx = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = hf(idx, output_router_logits=True)
        logits = ours(idx)[0]
    assert all(isinstance(b.mlp, SparseMoE) for b in ours.blocks) and not ours.training
    assert (logits - out.logits).abs().max().item() < ATOL[dtype]
    aux = load_balancing_loss([b.mlp.router_logits for b in ours.blocks], 2)
    assert abs(aux.item() - out.aux_loss.item()) < 1e-6
    for ours_logits, hf_logits in zip((b.mlp.router_logits for b in ours.blocks), out.router_logits):
        assert (ours_logits - hf_logits).abs().max().item() < ATOL[dtype]


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(mlp_only_layers=[0]), r"moe_from_hf: mlp_only_layers must be \[\]"),
        (dict(decoder_sparse_step=2), r"moe_from_hf: decoder_sparse_step must be 1 .*got decoder_sparse_step=2"),
        (dict(use_sliding_window=True, sliding_window=8), r"use_sliding_window"),
    ],
)
def test_moe_from_hf_refuses_unsupported_configurations(extra, match):
    with pytest.raises(ValueError, match=match):
        moe_from_hf(hf_model(**extra))


def test_moe_from_hf_rejects_other_models():
    with pytest.raises(TypeError, match="model must be a transformers Qwen3MoeForCausalLM, got Linear"):
        moe_from_hf(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- the load-balancing loss


def test_load_balancing_loss_bounds():
    # balanced: each token's top 2 spread evenly, probabilities uniform-ish -> exactly k when P is uniform
    n = 8 * 4
    uniform = torch.zeros(n, E, dtype=torch.float64)
    uniform_loss = load_balancing_loss(uniform + 1e-9 * torch.arange(E), K)  # uniform P, ties broken the same way
    # f_e = 1 for experts 6 and 7 (the tie-break), P_e = 1 / E: E * (2 / E) = 2 = k
    assert abs(uniform_loss.item() - K) < 1e-6
    # a balanced hard router: token t prefers experts t % E and (t + 1) % E with probability ~1/2 each
    logits = torch.full((n, E), -30.0, dtype=torch.float64)
    for t in range(n):
        logits[t, t % E] = logits[t, (t + 1) % E] = 0.0
    assert abs(load_balancing_loss(logits, K).item() - K) < 1e-9
    # collapsed: every token to experts 0 and 1 with probability 1/2 each -> E
    collapsed = torch.full((n, E), -30.0, dtype=torch.float64)
    collapsed[:, :2] = 0.0
    assert abs(load_balancing_loss(collapsed, K).item() - E) < 1e-9


def test_load_balancing_loss_has_gradient():
    logits = randn(16, E).requires_grad_()
    load_balancing_loss(logits, K).backward()
    assert logits.grad.abs().sum() > 0


# ---------------------------------------------------------------- capacity


def test_expert_capacity():
    assert expert_capacity(6, 4, 2, 1.0) == 3
    assert expert_capacity(10, 3, 1, 1.0) == 4
    assert expert_capacity(512, 8, 2, 1.25) == 160
    assert expert_capacity(0, 8, 2, 1.25) == 0


def test_capacity_first_choices_before_second():
    probs = torch.tensor([[.50, .30, .15, .05], [.10, .60, .05, .25], [.45, .05, .40, .10],
                          [.20, .10, .15, .55], [.55, .05, .30, .10], [.35, .40, .10, .15]])
    moe = SparseMoE(4, 3, 4, 2, capacity_factor=1.0).double()
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(4))
    x = probs.log().double().view(1, 6, 4)            # router logits = log probs: the router's softmax is probs
    with torch.no_grad():
        y = moe(x)
    # expert 0 is full with the first choices of tokens 0, 2, 4; the second choices of 3 and 5 are dropped
    keep = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 0]], dtype=torch.bool)
    assert moe.n_dropped == 2
    assert torch.allclose(y, dense_reference(moe, x, keep), atol=1e-12, rtol=0)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25, 2.0])
def test_capacity_drops_exactly_the_assignments_beyond_capacity(factor):
    torch.manual_seed(3)
    moe = SparseMoE(16, 12, E, K, capacity_factor=factor).double()
    x = randn(4, 16, 16) + 2.0                         # an offset: an unbalanced router
    with torch.no_grad():
        y = moe(x)
        _, experts = torch.softmax(moe.router(x.view(-1, 16)), -1).topk(K, -1)
        keep = keep_loop(experts, E, expert_capacity(64, E, K, factor))
        ref = dense_reference(moe, x, keep)
    assert moe.n_dropped == int((~keep).sum())
    assert torch.allclose(y, ref, atol=1e-12, rtol=0)


def test_token_beyond_capacity_passes_through_the_residual():
    moe = SparseMoE(16, 24, 4, 1, capacity_factor=1.0)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2, 0] = 10.0                 # every token chooses expert 2
    x = randn(1, 8, 16, dtype=torch.float32)
    x[..., 0] = 1.0
    with torch.no_grad():
        out = moe(x)
    cap = expert_capacity(8, 4, 1, 1.0)
    assert cap == 2 and moe.n_dropped == 6
    assert out[0, :cap].abs().sum() > 0
    assert torch.equal(out[0, cap:], torch.zeros(6, 16))
    assert torch.equal((x + out)[0, cap:], x[0, cap:])


def test_large_capacity_changes_nothing():
    torch.manual_seed(4)
    a = SparseMoE(16, 12, E, K)
    b = SparseMoE(16, 12, E, K, capacity_factor=E / K)   # room for every token in every expert
    b.load_state_dict(a.state_dict())
    x = randn(2, 9, 16, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
    assert b.n_dropped == 0


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(top_k=9), ValueError, r"top_k must be <= n_experts=8, got top_k=9"),
        (dict(top_k=0), ValueError, r"top_k must be an int >= 1"),
        (dict(d_model=0), ValueError, r"d_model must be an int >= 1, got d_model=0"),
        (dict(d_ff=-3), ValueError, r"d_ff must be an int >= 1, got d_ff=-3"),
        (dict(n_experts=0), ValueError, r"n_experts must be an int >= 1"),
        (dict(d_model=4.0), TypeError, r"d_model must be an int"),
        (dict(capacity_factor=0.0), ValueError, r"capacity_factor must be a finite number > 0"),
        (dict(norm_topk_prob=1), TypeError, r"norm_topk_prob must be a bool"),
        (dict(router_dtype=torch.int32), TypeError, r"router's dtype must be None or a floating torch.dtype"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    args = dict(d_model=C, d_ff=D_FF, n_experts=E, top_k=K) | kwargs
    with pytest.raises(error, match=match):
        SparseMoE(**args)


def test_bad_gating_and_loss_inputs():
    with pytest.raises(ValueError, match=r"top_k_gating: top_k must be <= the number of experts"):
        top_k_gating(torch.randn(4, 3), 4)
    with pytest.raises(ValueError, match=r"top_k_gating: router_logits must be 2-D"):
        top_k_gating(torch.randn(2, 4, 3), 2)
    with pytest.raises(TypeError, match=r"router_logits must be a floating-point tensor"):
        top_k_gating(torch.ones(4, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"load_balancing_loss: top_k must be an int in \[1, 3\], got top_k=4"):
        load_balancing_loss(torch.randn(4, 3), 4)
    with pytest.raises(ValueError, match="at least one"):
        load_balancing_loss([], 2)
    with pytest.raises(ValueError, match=r"router_logits\[1\] must have shape \(4, 3\)"):
        load_balancing_loss([torch.randn(4, 3), torch.randn(5, 3)], 2)
    with pytest.raises(ValueError, match=r"attention_mask must have B \* T = N = 4 entries"):
        load_balancing_loss(torch.randn(4, 3), 2, attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match=r"expert_capacity: capacity_factor must be a finite number > 0"):
        expert_capacity(10, 4, 2, -1.0)
    with pytest.raises(ValueError, match=r"expert_capacity: top_k must be an int in \[1, 4\]"):
        expert_capacity(10, 4, 5, 1.0)
