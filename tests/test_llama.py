"""Unit tests for transformer_lib.llama (chapter 17), against Hugging Face transformers' Llama and Qwen3.

Every model is small, with random weights built offline by transformers; no test touches the network.
"""

import json
import os

import pytest
import torch

import transformer_lib
from transformer_lib.block import SwiGLU
from transformer_lib.embeddings import (
    apply_rope,
    apply_rope_half,
    interleaved_to_half,
    rope_angles,
    rope_cos_sin,
    rope_inv_freq,
)
from transformer_lib.config import LlamaConfig
from transformer_lib.generation import KVCache
from transformer_lib.llama import (
    GroupedQueryAttention,
    Llama,
    hf_in_float64,
    hf_llama_key_map,
    llama_config_from_hf,
    load_hf_llama_state_dict,
)

transformers = pytest.importorskip("transformers")

LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)


def hf_model(kind, dtype=torch.float32, **extra):
    """A small random HF model; weights enlarged so that a wrong computation shows."""
    torch.manual_seed(1)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, num_attention_heads=8, num_key_value_heads=extra.pop("kv", 2),
                                       rms_norm_eps=1e-5, tie_word_embeddings=extra.pop("tie", False), **extra)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                       rms_norm_eps=1e-6, tie_word_embeddings=extra.pop("tie", True), **extra)
        model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.05 * torch.randn_like(p))   # gains near 1
            else:
                p.mul_(5.0)
    return model.to(dtype).eval()


CASES = [
    ("llama", {}),
    ("llama", dict(tie=True, attention_bias=True)),
    ("llama", dict(kv=1)),                       # multi-query
    ("llama", dict(kv=8)),                       # multi-head
    ("llama", dict(rope_parameters=LLAMA3)),
    ("qwen3", {}),
    ("qwen3", dict(tie=False)),
]
IDS = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind,extra", CASES)
def test_logits_equal_hf_float32(kind, extra):
    hf = hf_model(kind, **dict(extra))
    ours = Llama.from_hf(hf)
    with torch.no_grad():
        diff = (ours(IDS)[0] - hf(IDS).logits).abs().max().item()
    assert diff < 1e-5


@pytest.mark.parametrize("kind,extra", CASES)
def test_logits_equal_hf_float64(kind, extra):
    hf = hf_model(kind, torch.float64, **dict(extra))
    ours = Llama.from_hf(hf)
    assert ours.tok_emb.weight.dtype == torch.float64
    c = ours.config
    hf_in_float64(hf, rope_inv_freq(c.d_head, c.rope_theta, c.rope_scaling))
    with torch.no_grad():
        diff = (ours(IDS)[0] - hf(IDS).logits).abs().max().item()
    assert diff < 1e-12


@pytest.mark.parametrize("kind,extra", [CASES[0], CASES[4], CASES[5]])
def test_cached_greedy_equals_hf_recompute(kind, extra):
    hf = hf_model(kind, **dict(extra))
    ours = Llama.from_hf(hf)
    prompt = IDS[:, :5]
    out = ours.generate(prompt, 30, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(30):
            seq = torch.cat([seq, hf(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    assert torch.equal(ours.generate(prompt, 30, temperature=0, use_cache=False), out)


def test_cache_matches_full_forward_with_multi_token_chunks():
    ours = Llama.from_hf(hf_model("qwen3", torch.float64))
    full = ours(IDS)[0]
    cache = ours.new_kv_cache(2, 40)
    parts = [ours(IDS[:, a:b], kv_cache=cache)[0] for a, b in ((0, 7), (7, 8), (8, 23), (23, 40))]
    assert (torch.cat(parts, 1) - full).abs().max().item() < 1e-12
    assert cache.length == 40 and cache.k.shape == (2, 2, 2, 40, 24)


def test_generate_past_block_size_and_sampling_reproducible():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64, block_size=12))
    prompt = torch.randint(0, 50, (2, 5))
    greedy = model.generate(prompt, 20, temperature=0)
    assert greedy.shape == (2, 25) and torch.equal(greedy, model.generate(prompt, 20, temperature=0, use_cache=False))
    a = model.generate(prompt, 10, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 10, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(a[:, :5], prompt)


def test_structure_for_swapping_the_mlp():
    model = Llama(LlamaConfig(vocab_size=50, n_embd=32, n_layer=3, n_head=4, n_kv_head=1, n_inner=64, block_size=16))
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == 3
    for block in model.blocks:
        assert {"attn_norm", "attn", "mlp_norm", "mlp"} <= dict(block.named_children()).keys()
        assert isinstance(block.mlp, SwiGLU)
    assert model.lm_head.weight is model.tok_emb.weight
    model.blocks[1].mlp = torch.nn.Identity()  # any (B, T, d) -> (B, T, d) module fits
    logits, loss = model(torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6)))
    assert logits.shape == (2, 6, 50) and loss.ndim == 0


def test_projections_have_hugging_face_names():
    """peft-style target_modules and the weight map match on the projections' own names."""
    model = Llama.from_hf(hf_model("qwen3"))
    leaves = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
    for theirs, ours in hf_llama_key_map(model.config).items():
        if "_proj." in theirs:
            assert theirs.split(".")[-2:] == ours.split(".")[-2:], (theirs, ours)


SMALL = dict(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64)


def test_rope_tables_are_buffers_rounded_once_to_the_model_dtype():
    model = Llama(LlamaConfig(**SMALL, block_size=24))
    assert not any(k.startswith("rope_") for k in model.state_dict())
    for dtype in (torch.float64, torch.bfloat16, torch.float32):  # float64 must not be float32's rounding, cast up
        model.to(dtype)
        cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), 0, 24, dtype=dtype)
        assert model.rope_cos.dtype == dtype and torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)


def test_context_longer_than_the_rope_tables(monkeypatch):
    torch.manual_seed(0)
    full = Llama(LlamaConfig(**SMALL, block_size=24)).double()
    monkeypatch.setattr("transformer_lib.llama._ROPE_TABLE_POSITIONS", 8)
    short = Llama(LlamaConfig(**SMALL, block_size=24)).double()
    short.load_state_dict(full.state_dict())
    assert full.rope_cos.shape == (24, 4) and short.rope_cos.shape == (8, 4)
    idx = torch.randint(0, 50, (2, 20))
    expected = full(idx)[0]
    assert torch.equal(short(idx)[0], expected)
    cache = short.new_kv_cache(2, 24)  # chunks inside the tables, across their end, and past it
    parts = [short(idx[:, a:b], kv_cache=cache)[0] for a, b in ((0, 5), (5, 11), (11, 12), (12, 20))]
    assert (torch.cat(parts, 1) - expected).abs().max().item() < 1e-12


def test_huge_block_size_allocates_only_the_first_positions():
    model = Llama(LlamaConfig(**SMALL, block_size=10**12))
    assert model.rope_cos.shape == (65536, 4) and model.rope_cos.dtype == torch.float32
    logits, _ = model(torch.randint(0, 50, (1, 5)))
    assert logits.shape == (1, 5, 50)


def test_top_level_names():
    assert transformer_lib.Llama is Llama and transformer_lib.LlamaConfig is LlamaConfig
    assert "Llama" in transformer_lib.__all__ and "LlamaConfig" in transformer_lib.__all__


def test_rope_conventions_and_conversion():
    d, T = 16, 9
    cos, sin = rope_angles(T, d, dtype=torch.float64)
    x = torch.randn(3, T, d, dtype=torch.float64)
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    assert torch.allclose(apply_rope(x, cos, sin)[..., perm], apply_rope_half(x[..., perm], cos, sin), atol=1e-14)
    w = torch.randn(2 * d, 5)
    assert torch.equal(interleaved_to_half(w, 2), w.view(2, d, 5)[:, perm].reshape(2 * d, 5))
    with pytest.raises(ValueError, match="n_heads"):
        interleaved_to_half(torch.randn(18, 4), 2)  # heads of width 9: odd


def test_llama3_frequencies_against_hf():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
    cfg = transformers.LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_parameters={**scaling, "rope_theta": 500000.0})
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg)
    ours = rope_inv_freq(64, 500000.0, LlamaConfig(rope_scaling=scaling).rope_scaling)
    assert ((ours - theirs.double()) / ours).abs().max() < 1e-6
    cos, sin = rope_cos_sin(ours, 5, 3, dtype=torch.float64)
    assert cos.shape == (3, 32) and torch.allclose(cos[0], torch.cos(5 * ours))


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_embd=100, n_head=3), "n_head must divide n_embd"),
    (dict(n_head=8, n_kv_head=3, n_embd=64), "n_kv_head must divide n_head"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling\\['rope_type'\\]"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
    (dict(head_dim=7), "head_dim must be even"),
    (dict(n_layer=0), "n_layer"),
    (dict(norm_eps=0.0), "norm_eps"),
])
def test_bad_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**kwargs)


def test_config_types_and_json_round_trip(tmp_path):
    with pytest.raises(TypeError, match="qk_norm"):
        LlamaConfig(qk_norm=1)
    with pytest.raises(TypeError, match="rope_scaling"):
        LlamaConfig(rope_scaling="llama3")
    cfg = LlamaConfig(vocab_size=50, n_embd=48, n_head=4, n_kv_head=2, head_dim=16, qk_norm=True,
                      rope_scaling=dict(type="llama3", factor=8, low_freq_factor=1, high_freq_factor=4,
                                        original_max_position_embeddings=64))
    assert cfg.d_head == 16 and cfg.rope_scaling["rope_type"] == "llama3"
    cfg.to_json(tmp_path / "c.json")
    assert LlamaConfig.from_json(tmp_path / "c.json") == cfg


@pytest.mark.parametrize("kind,extra,field", [
    ("qwen3", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "use_sliding_window"),
    ("llama", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0)), "rope_scaling"),
    ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)), "rope_scaling"),
    ("llama", dict(mlp_bias=True), "mlp_bias"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
])
def test_from_hf_refuses_what_it_cannot_compute(kind, extra, field):
    with pytest.raises(ValueError, match=field):
        Llama.from_hf(hf_model(kind, **dict(extra)))


def test_from_hf_wrong_class_and_config_dict():
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        Llama.from_hf(torch.nn.Linear(2, 2))
    hf = hf_model("qwen3")
    d = json.loads(hf.config.to_json_string())
    assert llama_config_from_hf(d) == Llama.from_hf(hf).config
    with pytest.raises(ValueError, match="model_type"):
        llama_config_from_hf({**d, "model_type": "mistral"})


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_from_hf_takes_a_state_dict_with_its_config(kind):
    hf = hf_model(kind, dtype=torch.float64)
    from_model = Llama.from_hf(hf)
    from_state = Llama.from_hf(hf.state_dict(), from_model.config)
    assert from_state.tok_emb.weight.dtype == torch.float64 and not from_state.training
    assert all(torch.equal(a, b) for a, b in zip(from_model.state_dict().values(), from_state.state_dict().values()))
    with pytest.raises(TypeError, match="Llama.from_hf: config is required with a state dict"):
        Llama.from_hf(hf.state_dict())
    with pytest.raises(TypeError, match="Llama.from_hf: model must be a LlamaForCausalLM or a Qwen3ForCausalLM or its state dict, got str"):
        Llama.from_hf("SmolLM2")


def test_state_dict_errors():
    hf = hf_model("llama")
    model = Llama.from_hf(hf)
    state = dict(hf.state_dict())
    state.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="missing.*up_proj"):
        load_hf_llama_state_dict(model, state)
    state = dict(hf.state_dict())
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="model.norm.weight has shape"):
        load_hf_llama_state_dict(model, state)
    assert set(hf_llama_key_map(model.config)) == set(hf.state_dict())


@pytest.mark.parametrize("bad,error,match", [
    (torch.zeros(2, 3), TypeError, "int64"),
    (torch.zeros(2, 3, 4, dtype=torch.long), ValueError, "2-D"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, "empty"),
    (torch.zeros(1, 17, dtype=torch.long), ValueError, "block_size=16"),
    (torch.full((1, 3), 50), ValueError, "vocab_size=50"),
])
def test_bad_inputs(bad, error, match):
    model = Llama(LlamaConfig(vocab_size=50, n_embd=32, n_layer=1, n_head=4, n_kv_head=2, n_inner=64, block_size=16))
    with pytest.raises(error, match=match):
        model(bad)


def test_bad_generate_and_cache_arguments():
    model = Llama(LlamaConfig(vocab_size=50, n_embd=32, n_layer=1, n_head=4, n_kv_head=2, n_inner=64, block_size=16))
    idx = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(idx, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(idx, 2, top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(idx, -1)
    cache = model.new_kv_cache(1, 16)
    model(torch.zeros(1, 10, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache holds 10 positions and idx adds T=7"):
        model(torch.zeros(1, 7, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="one cache per block"):
        model(idx, kv_cache=KVCache(2, 1, 2, 8, 16))


def test_gqa_module_against_repeated_heads():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(32, 8, 2, 8).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0), 0, 6, dtype=torch.float64)
    q = apply_rope_half(attn.q_proj(x).view(2, 6, 8, 8).transpose(1, 2), cos, sin)
    k = apply_rope_half(attn.k_proj(x).view(2, 6, 2, 8).transpose(1, 2), cos, sin).repeat_interleave(4, 1)
    v = attn.v_proj(x).view(2, 6, 2, 8).transpose(1, 2).repeat_interleave(4, 1)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = attn.o_proj(y.transpose(1, 2).reshape(2, 6, 64))
    assert (attn(x, cos, sin)[0] - ref).abs().max().item() < 1e-13


def test_hf_in_float64_refuses_what_it_cannot_patch():
    with pytest.raises(TypeError, match="inv_freq must have dtype float64"):
        hf_in_float64(hf_model("llama", torch.float64), rope_inv_freq(8, 10000.0).float())
    with pytest.raises(ValueError, match="RMSNorm and RotaryEmbedding"):
        hf_in_float64(torch.nn.Linear(2, 2), rope_inv_freq(8, 10000.0))
    with pytest.raises(TypeError, match="nn.Module"):
        hf_in_float64({"not": "a model"}, rope_inv_freq(8, 10000.0))
