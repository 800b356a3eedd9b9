"""Tests for transformer_lib.interpret (Chapter 14: looking inside)."""

import math

import numpy as np
import pytest
import torch

from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.interpret import Trace, attention_entropy, logit_lens, pca, trace
from transformer_lib.multihead import merge_heads, split_heads


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(GPTConfig.from_preset("tiny"))
    # Larger query and key weights than GPT-2's initialisation, so that attention is far from
    # uniform and a wrong mask or a wrong head order would show in the comparisons.
    with torch.no_grad():
        for block in m.blocks:
            block.attn.in_proj.weight.mul_(8.0)
    return m.eval()


@pytest.fixture(scope="module")
def idx(model):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (3, model.config.block_size), generator=g)


def test_trace_shapes_and_dtypes(model, idx):
    c = model.config
    tr = trace(model, idx)
    assert isinstance(tr, Trace)
    B, T = idx.shape
    assert tr.hidden.shape == (c.n_layer + 1, B, T, c.n_embd)
    assert tr.hidden_mid.shape == (c.n_layer, B, T, c.n_embd)
    assert tr.attn.shape == (c.n_layer, B, c.n_head, T, T)
    assert tr.logits.shape == (B, T, c.vocab_size)
    for t in (tr.hidden, tr.hidden_mid, tr.attn, tr.logits):
        assert t.dtype == torch.float32
        assert not t.requires_grad


def test_trace_reproduces_model_logits(model, idx):
    """The hooks only watch: the traced forward pass is the model's, bit for bit."""
    tr = trace(model, idx)
    with torch.no_grad():
        ref, _ = model(idx)
        head = model.lm_head(model.ln_f(tr.hidden[-1]))
    assert torch.equal(tr.logits, ref)
    assert torch.equal(head, ref)


def test_trace_removes_its_hooks(model, idx):
    modules = [m for block in model.blocks for m in (block, block.ln2, block.attn)]
    trace(model, idx)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)
    with pytest.raises(ValueError, match="idx"):  # GPT.forward refuses the ids; the hooks still go
        trace(model, torch.tensor([[0, 65]]))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


def test_trace_weights_are_the_ones_the_attention_used(model, idx):
    """Weights @ values through out_proj reproduce the attention's fused output."""
    tr = trace(model, idx)
    c = model.config
    with torch.no_grad():
        for l, block in enumerate(model.blocks):
            h = block.ln1(tr.hidden[l])
            v = split_heads(block.attn.in_proj(h)[..., 2 * c.n_embd:], c.n_head)
            out = block.attn.out_proj(merge_heads(tr.attn[l] @ v))
            fused, _ = block.attn(h, is_causal=True)
            torch.testing.assert_close(out, fused, atol=1e-5, rtol=0)
            torch.testing.assert_close(tr.hidden_mid[l], tr.hidden[l] + fused, atol=1e-5, rtol=0)


def test_trace_hidden_matches_blocks(model, idx):
    """hidden[l] is the output of block l run through the block's own forward."""
    tr = trace(model, idx)
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(idx.size(1))
        torch.testing.assert_close(tr.hidden[0], x, atol=0, rtol=0)
        for l, block in enumerate(model.blocks):
            x = block(x, is_causal=True)
            torch.testing.assert_close(tr.hidden[l + 1], x, atol=1e-5, rtol=0)


def test_trace_attention_rows_sum_to_one_and_causal(model, idx):
    tr = trace(model, idx)
    T = idx.size(1)
    torch.testing.assert_close(tr.attn.sum(-1), torch.ones(tr.attn.shape[:-1]), atol=1e-6, rtol=0)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert (tr.attn[..., future] == 0).all()
    assert (tr.attn[..., ~future] > 0).all()  # every allowed key gets some weight


def test_trace_attention_matches_hand_softmax(model, idx):
    tr = trace(model, idx)
    c = model.config
    B, T = idx.shape
    d = c.n_embd // c.n_head
    with torch.no_grad():
        for l, block in enumerate(model.blocks):
            h = block.ln1(tr.hidden[l])
            q, k, _ = block.attn.in_proj(h).split(c.n_embd, dim=-1)
            q, k = (t.view(B, T, c.n_head, d).transpose(1, 2) for t in (q, k))
            scores = q @ k.transpose(-1, -2) / math.sqrt(d)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            torch.testing.assert_close(tr.attn[l], scores.softmax(-1), atol=1e-6, rtol=0)


def test_trace_restores_training_mode(model, idx):
    model.train()
    try:
        trace(model, idx)
        assert model.training
        with pytest.raises(TypeError, match="idx"):
            trace(model, idx.int())
        assert model.training  # also after an error
    finally:
        model.eval()
    trace(model, idx)
    assert not model.training


def test_trace_shorter_sequence(model):
    tr = trace(model, torch.tensor([[1, 2, 3]]))
    assert tr.attn.shape[-2:] == (3, 3)
    assert tr.attn[..., 0, 0].eq(1).all()  # the first query can only see itself


def test_trace_bad_inputs(model, idx):
    with pytest.raises(TypeError, match="trace: model must be a transformer_lib CausalLM"):
        trace(torch.nn.Linear(2, 2), idx)
    # idx is checked once, by GPT.forward
    with pytest.raises(TypeError, match="idx"):
        trace(model, idx.int())
    with pytest.raises(TypeError, match="idx"):
        trace(model, [[1, 2]])
    with pytest.raises(ValueError, match="idx"):
        trace(model, idx[0])
    with pytest.raises(ValueError, match="idx"):  # T=17 > block_size=16
        trace(model, torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="idx"):
        trace(model, torch.tensor([[0, 65]]))
    with pytest.raises(ValueError, match="idx"):
        trace(model, torch.tensor([[-1, 3]]))


def test_entropy_exact_cases():
    one_hot = torch.tensor([0.0, 0.0, 1.0, 0.0])
    uniform = torch.full((5,), 0.2)
    half = torch.tensor([0.5, 0.5, 0.0])
    assert attention_entropy(one_hot[None]).item() == 0.0
    assert attention_entropy(uniform[None]).item() == pytest.approx(math.log(5), abs=1e-6)
    assert attention_entropy(half[None]).item() == pytest.approx(math.log(2), abs=1e-7)
    # causal uniform attention: row t spreads over t + 1 keys, entropy ln(t + 1)
    T = 6
    w = torch.tril(torch.ones(T, T, dtype=torch.float64))
    w = w / w.sum(-1, keepdim=True)
    torch.testing.assert_close(attention_entropy(w), torch.log(torch.arange(1, T + 1, dtype=torch.float64)))


def test_entropy_matches_categorical_and_shape(model, idx):
    tr = trace(model, idx)
    ours = attention_entropy(tr.attn)
    assert ours.shape == tr.attn.shape[:-1]
    assert ours.dtype == torch.float32
    ref = torch.distributions.Categorical(probs=tr.attn).entropy()
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert attention_entropy(tr.attn.double()).dtype == torch.float64


def test_entropy_bad_inputs():
    with pytest.raises(TypeError, match="attention_entropy: weights must be a floating-point tensor.*int64"):
        attention_entropy(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="attention_entropy: weights must be a tensor.*ndarray"):
        attention_entropy(np.ones((2, 2)) / 2)
    with pytest.raises(ValueError, match=r"attention_entropy: weights must have shape \(..., L, S\).*\(4,\)"):
        attention_entropy(torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="attention_entropy: weights must be non-negative.*-1"):
        attention_entropy(torch.tensor([[2.0, -1.0]]))
    with pytest.raises(ValueError, match="attention_entropy: weights must be non-negative"):
        attention_entropy(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="attention_entropy: each row of weights must sum to 1.*3"):
        attention_entropy(torch.tensor([[0.5, 0.5], [1.0, 2.0]]))


def test_logit_lens_last_layer_equals_logits(model, idx):
    tr = trace(model, idx)
    lens = logit_lens(model, tr.hidden)
    c = model.config
    assert lens.shape == (c.n_layer + 1, *idx.shape, c.vocab_size)
    torch.testing.assert_close(lens[-1], tr.logits, atol=0, rtol=0)
    with torch.no_grad():
        ref, _ = model(idx)
    torch.testing.assert_close(lens[-1], ref, atol=1e-5, rtol=0)
    assert not lens.requires_grad


def test_logit_lens_bad_inputs(model):
    with pytest.raises(TypeError, match="logit_lens: model must be a transformer_lib CausalLM"):
        logit_lens("gpt", torch.zeros(2, 32))
    with pytest.raises(TypeError, match="logit_lens: hidden must be a floating-point tensor.*int64"):
        logit_lens(model, torch.zeros(2, 32, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logit_lens: hidden must have shape \(..., n_embd=32\).*\(2, 31\)"):
        logit_lens(model, torch.zeros(2, 31))


def test_pca_matches_eigh():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 8)) @ rng.normal(size=(8, 8)) + 3.0
    proj, comp, ratio = pca(torch.from_numpy(x), 4)
    assert proj.shape == (50, 4) and comp.shape == (4, 8) and ratio.shape == (4,)
    assert proj.dtype == comp.dtype == ratio.dtype == torch.float64
    xc = x - x.mean(0)
    evals, evecs = np.linalg.eigh(np.cov(x, rowvar=False))
    evals, evecs = evals[::-1], evecs[:, ::-1]
    np.testing.assert_allclose(ratio.numpy(), evals[:4] / evals.sum(), atol=1e-12)
    ref = evecs[:, :4].T
    ref = ref * np.sign((ref * comp.numpy()).sum(1, keepdims=True))  # align the signs
    np.testing.assert_allclose(comp.numpy(), ref, atol=1e-10)
    np.testing.assert_allclose(proj.numpy(), xc @ ref.T, atol=1e-10)
    np.testing.assert_allclose(comp.numpy() @ comp.numpy().T, np.eye(4), atol=1e-12)


def test_pca_sign_convention_and_full_rank():
    torch.manual_seed(0)
    x = torch.randn(10, 3)
    proj, comp, ratio = pca(x, 3)
    largest = comp.gather(1, comp.abs().argmax(1, keepdim=True))
    assert (largest > 0).all()
    torch.testing.assert_close(ratio.sum(), torch.tensor(1.0), atol=1e-6, rtol=0)
    assert (ratio[:-1] >= ratio[1:]).all()
    # the full rotation keeps every distance between samples
    torch.testing.assert_close(torch.cdist(proj, proj), torch.cdist(x, x), atol=1e-5, rtol=0)
    # -x gives the same directions with the same signs, and negated coordinates
    proj2, comp2, _ = pca(-x, 3)
    torch.testing.assert_close(comp2, comp, atol=1e-6, rtol=0)
    torch.testing.assert_close(proj2, -proj, atol=1e-5, rtol=0)


def test_pca_bad_inputs():
    x = torch.randn(5, 3)
    with pytest.raises(TypeError, match="pca: x must be a floating-point tensor.*int64"):
        pca(torch.ones(5, 3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match=r"pca: x must be 2-D.*\(5,\)"):
        pca(torch.randn(5), 1)
    with pytest.raises(ValueError, match=r"pca: x must have shape \(N, D\) with N >= 2.*\(1, 3\)"):
        pca(torch.randn(1, 3), 1)
    with pytest.raises(TypeError, match="pca: k must be an int.*float"):
        pca(x, 2.0)
    with pytest.raises(TypeError, match="pca: k must be an int.*bool"):
        pca(x, True)
    with pytest.raises(ValueError, match=r"pca: k must be an int in \[1, 3\], got k=4"):
        pca(x, 4)
    with pytest.raises(ValueError, match=r"pca: k must be .*got k=0"):
        pca(x, 0)
    with pytest.raises(ValueError, match="pca: x has no variance"):
        pca(torch.ones(4, 3), 1)


def test_trace_of_the_shipped_model():
    """On the book's trained model: the trace is the model's forward pass, and the previous-character
    head that Chapter 14 finds is there (over 0.8 of its weight on the previous character)."""
    from transformer_lib.pretrained import load_book_model

    model, tok = load_book_model()
    line = "GREMIO:\nGood morrow, neighbour Baptista.\n\nBAPTISTA:\nGood morrow,"
    assert len(line) == model.config.block_size
    idx = torch.tensor([tok.encode(line)])
    tr = trace(model, idx)
    with torch.no_grad():
        ref, _ = model(idx)
    assert torch.equal(tr.logits, ref)
    torch.testing.assert_close(tr.attn.sum(-1), torch.ones_like(tr.attn.sum(-1)), atol=1e-5, rtol=0)
    prev = tr.attn.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))  # (n_layer, n_head)
    layer, head = divmod(int(prev.argmax()), model.config.n_head)
    assert layer == 0 and prev[layer, head] > 0.8, prev
    entropy = attention_entropy(tr.attn[layer, :, head])
    assert entropy.mean() < 0.5  # e^H close to one key


@pytest.mark.parametrize("options", [dict(position="rope"), dict(position="rope", qk_norm=True)])
def test_trace_weights_are_the_models_own_with_rope_and_qk_norm(options, idx):
    """With rotary positions and QK-norm, the recorded weights times the values, through out_proj, are the
    attention branch the block added to the stream (hidden_mid - hidden, in eval mode)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.from_preset("tiny", **options))
    tr = trace(m, idx)
    c = m.config
    with torch.no_grad():
        for l, block in enumerate(m.blocks):
            v = split_heads(block.attn.in_proj(block.ln1(tr.hidden[l]))[..., 2 * c.n_embd:], c.n_head)
            branch = block.attn.out_proj(merge_heads(tr.attn[l] @ v))
            torch.testing.assert_close(branch, tr.hidden_mid[l] - tr.hidden[l], atol=1e-5, rtol=0)


def test_trace_hidden_mid_is_what_ln2_reads(model, idx):
    """hidden_mid (the block's input plus the attention's output) is the stream ln2 sees, bit for bit."""
    seen = []
    handles = [block.ln2.register_forward_pre_hook(lambda ln2, args: seen.append(args[0])) for block in model.blocks]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(trace(model, idx).hidden_mid, torch.stack(seen))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_trace_of_a_llama_matches_hugging_face(kind):
    """A Llama (shared key-value heads; Qwen3 also QK-norm) traced by hooks, against transformers' own
    attention weights and hidden states (eager attention, output_attentions/output_hidden_states)."""
    transformers = pytest.importorskip("transformers")
    from transformer_lib.llama import Llama

    torch.manual_seed(0)
    common = dict(vocab_size=61, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32)
    if kind == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attn_implementation="eager"))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=8, attn_implementation="eager"))
    with torch.no_grad():  # larger weights than the initialisation, so that attention is far from uniform
        for name, p in hf.named_parameters():
            if "norm" not in name:
                p.mul_(6.0)
    hf.eval()
    ours = Llama.from_hf(hf)
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))
    tr = trace(ours, idx)
    with torch.no_grad():
        out = hf(idx, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(tr.attn, torch.stack(out.attentions), atol=1e-5, rtol=0)
    # transformers' last hidden state has the final norm applied; the others are the residual stream
    torch.testing.assert_close(tr.hidden[:-1], torch.stack(out.hidden_states[:-1]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tr.logits, out.logits, atol=1e-4, rtol=1e-5)
    assert torch.equal(logit_lens(ours, tr.hidden[-1]), tr.logits)
    seen = []
    handles = [b.mlp_norm.register_forward_pre_hook(lambda norm, args: seen.append(args[0])) for b in ours.blocks]
    try:
        with torch.no_grad():
            ours(idx)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(tr.hidden_mid, torch.stack(seen))
