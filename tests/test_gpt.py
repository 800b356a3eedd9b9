"""Unit tests for transformer_lib.gpt (chapter 6): GPT against a GPT assembled from PyTorch's modules."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer_lib.generation as generation
from transformer_lib.block import TransformerBlock
from transformer_lib.config import GPTConfig
from transformer_lib.gpt import GPT

# float32: logits after several blocks, each rounding; float64: a few hundred ulp at most.
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = list(ATOL)
TINY = GPTConfig.from_preset("tiny")

TORCH_NAMES = {
    "ln1.weight": "norm1.weight", "ln1.bias": "norm1.bias",
    "attn.in_proj.weight": "self_attn.in_proj_weight", "attn.in_proj.bias": "self_attn.in_proj_bias",
    "attn.out_proj.weight": "self_attn.out_proj.weight", "attn.out_proj.bias": "self_attn.out_proj.bias",
    "ln2.weight": "norm2.weight", "ln2.bias": "norm2.bias",
    "mlp.fc1.weight": "linear1.weight", "mlp.fc1.bias": "linear1.bias",
    "mlp.fc2.weight": "linear2.weight", "mlp.fc2.bias": "linear2.bias",
}


class TorchGPT(nn.Module):
    """The GPT assembled from PyTorch's modules: the independent reference."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        act = {"gelu": "gelu", "relu": "relu", "gelu_tanh": nn.GELU(approximate="tanh")}[c.activation]
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        layer = nn.TransformerEncoderLayer(c.n_embd, c.n_head, 4 * c.n_embd, dropout=0.0, activation=act,
                                           layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=True,
                                           bias=c.bias)
        self.encoder = nn.TransformerEncoder(layer, c.n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
        return self.lm_head(self.ln_f(self.encoder(x, mask=mask, is_causal=True)))


def torch_reference(model: GPT) -> TorchGPT:
    p = next(model.parameters())
    ref = TorchGPT(model.config).to(p.dtype)
    state = {}
    for name, t in model.state_dict().items():
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            name = f"encoder.layers.{i}.{TORCH_NAMES[rest]}"
        state[name] = t
    ref.load_state_dict(state, strict=True)
    return ref.eval()


def randomised_gpt(config, dtype=torch.float32, seed=0):
    """A GPT in eval mode with random layer-norm gains and biases (so that copying them is tested)."""
    torch.manual_seed(seed)
    model = GPT(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "ln" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return model.to(dtype).eval()


def ids(shape, vocab, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- GPT


def test_gpt_structure_and_weight_tying():
    model = GPT(TINY)
    assert isinstance(model.wte, nn.Embedding) and model.wte.weight.shape == (65, 32)
    assert model.wpe.weight.shape == (16, 32)
    assert len(model.blocks) == 2 and all(isinstance(b, TransformerBlock) and b.norm_first for b in model.blocks)
    assert model.blocks[0].mlp.d_ff == 4 * 32
    assert model.lm_head.bias is None
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    with torch.no_grad():
        model.wte.weight[3, 0] = 7.0
    assert model.lm_head.weight[3, 0] == 7.0


def test_gpt_refuses_a_configuration_that_cannot_fit_before_allocating():
    huge = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=10**12, vocab_size=50)  # 3.2e13 positions' weights
    with pytest.raises(ValueError, match=r"GPT: the parameters of GPTConfig\(n_layer=1, n_embd=32, "
                                         r"block_size=1000000000000, vocab_size=50\) would need .*TiB, more than"):
        GPT(huge)
    with torch.device("meta"):  # shapes without data: nothing to allocate, so nothing is refused
        assert GPT(huge).wpe.weight.shape == (10**12, 32)


def test_gpt_rejects_a_non_config():
    with pytest.raises(TypeError, match="GPT: config must be a GPTConfig, got config=dict"):
        GPT({"n_layer": 2})


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_forward_shapes_and_loss(bias):
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=bias)
    model = GPT(config)
    idx, targets = ids((3, 5), 11), ids((3, 5), 11, seed=1)
    logits, loss = model(idx)
    assert logits.shape == (3, 5, 11) and logits.dtype == torch.float32 and loss is None
    logits2, loss = model(idx, targets)
    assert torch.equal(logits, logits2) and loss.shape == ()
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)), rtol=0, atol=0)


def test_gpt_loss_ignores_targets_minus_1(tiny_model, token_ids):
    targets = ids(token_ids.shape, 65, seed=1)
    masked = targets.clone()
    masked[0, 5:] = -1
    masked[1, :2] = -1
    keep = masked != -1
    with torch.no_grad():
        logits, loss = tiny_model(token_ids, masked)
    expected = F.cross_entropy(logits[keep], targets[keep])  # the mean over the other positions only
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"GPT.forward: targets must hold at least one id that is not -1, "
                                         r"got every target -1 \(ignored\).*average over nothing"):
        tiny_model(token_ids, torch.full_like(targets, -1))  # a mean over no positions would be NaN
    one = torch.full_like(targets, -1)
    one[1, 3] = targets[1, 3]
    with torch.no_grad():
        logits, loss = tiny_model(token_ids, one)  # a single target is enough
    torch.testing.assert_close(loss, F.cross_entropy(logits[1, 3], targets[1, 3]), rtol=0, atol=1e-6)


def test_gpt_init_statistics():
    torch.manual_seed(0)
    config = GPTConfig(n_layer=8, n_head=4, n_embd=128, block_size=32, vocab_size=300)
    model = GPT(config)
    resid_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        if name.endswith(("attn.out_proj.weight", "mlp.fc2.weight")):
            expected = resid_std
        elif name.startswith("ln") or ".ln" in name:
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name
            continue
        elif name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
            continue
        else:
            expected = 0.02
        # the sample std of n normal draws has relative standard error about 1 / sqrt(2 n)
        assert abs(p.std().item() / expected - 1) < 6 / math.sqrt(2 * p.numel()), (name, p.std().item())
        assert abs(p.mean().item()) < 6 * expected / math.sqrt(p.numel()), name


def test_gpt_loss_at_init_is_about_ln_vocab():
    torch.manual_seed(0)
    config = GPTConfig.from_preset("baby")
    model = GPT(config)
    with torch.no_grad():
        _, loss = model(ids((8, 64), 65), ids((8, 64), 65, seed=1))
    predicted = math.log(65) + (0.02 * math.sqrt(config.n_embd)) ** 2 / 2
    assert abs(loss.item() - predicted) < 0.03


def test_gpt_is_causal_exactly():
    torch.manual_seed(0)
    model = randomised_gpt(TINY)
    idx = ids((2, 16), 65)
    for t in (0, 7, 15):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 65
        with torch.no_grad():
            a, b = model(idx)[0], model(changed)[0]
        assert torch.equal(a[:, :t], b[:, :t])
        assert not torch.equal(a[:, t], b[:, t])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "config",
    [TINY, GPTConfig(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=50, bias=False, activation="gelu_tanh"),
     GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=5, activation="relu", layer_norm_eps=1e-3)],
    ids=["tiny", "no-bias-tanh", "relu-eps"],
)
def test_gpt_matches_pytorch_modules(dtype, config):
    model = randomised_gpt(config, dtype)
    ref = torch_reference(model)
    idx = ids((3, config.block_size), config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], ref(idx), rtol=0, atol=ATOL[dtype])
        torch.testing.assert_close(model(idx[:, :3])[0], ref(idx[:, :3]), rtol=0, atol=ATOL[dtype])


def test_gpt_gradients_match_pytorch_modules():
    model = randomised_gpt(TINY, torch.float64)
    ref = torch_reference(model)
    idx, targets = ids((2, 10), 65), ids((2, 10), 65, seed=1)
    _, loss = model(idx, targets)
    loss_ref = F.cross_entropy(ref(idx).flatten(0, 1), targets.flatten())
    loss.backward()
    loss_ref.backward()
    torch.testing.assert_close(model.wte.weight.grad, ref.wte.weight.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.blocks[0].attn.in_proj.weight.grad,
                               ref.encoder.layers[0].self_attn.in_proj_weight.grad, rtol=0, atol=1e-12)


def test_gpt_dropout_only_in_training():
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.5)
    model = GPT(config)
    idx = ids((2, 8), 11)
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])
    model.train()
    torch.manual_seed(0)
    a = model(idx)[0]
    torch.manual_seed(1)
    assert not torch.equal(a, model(idx)[0])


def test_gpt_forward_errors(tiny_model, token_ids):
    model, good = tiny_model, token_ids
    with pytest.raises(TypeError, match="GPT.forward: idx must be a tensor, got list"):
        model([[1, 2]])
    with pytest.raises(TypeError, match="GPT.forward: idx must have dtype int64, got idx.dtype=torch.int32"):
        model(good.int())
    with pytest.raises(TypeError, match="idx.dtype=torch.float32"):
        model(good.float())
    with pytest.raises(ValueError, match=r"GPT.forward: idx must be 2-D, got idx.shape=\(8,\)"):
        model(good[0])
    with pytest.raises(ValueError, match=r"GPT.forward: idx must have at most block_size=16 positions, got idx.shape=\(1, 17\)"):
        model(ids((1, 17), 65))
    with pytest.raises(ValueError, match=r"GPT.forward: idx must not be empty, got idx.shape=\(2, 0\)"):
        model(good[:, :0])
    with pytest.raises(ValueError, match=r"GPT.forward: idx must hold ids in \[0, vocab_size=65\), got the id 65"):
        model(torch.tensor([[1, 65]]))
    with pytest.raises(ValueError, match=r"GPT.forward: idx must hold ids .*got the id -1"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"GPT.forward: targets must have shape \(2, 8\), got targets.shape=\(2, 3\)"):
        model(good, good[:, :3])
    with pytest.raises(TypeError, match="GPT.forward: targets must have dtype int64"):
        model(good, good.float())
    with pytest.raises(ValueError, match=r"GPT.forward: idx must not be empty, got idx.shape=\(0, 8\)"):
        model(good[:0])  # an empty batch
    with pytest.raises(ValueError, match="GPT.forward: idx must be on the model's device cpu, got idx.device=meta"):
        model(good.to("meta"))
    with pytest.raises(ValueError, match="GPT.forward: targets must be on the device of idx, cpu, got targets.device=meta"):
        model(good, good.to("meta"))


@pytest.mark.parametrize("bad", [65, -2, -100])
def test_gpt_forward_rejects_targets_outside_minus_1_to_vocab(tiny_model, token_ids, bad):
    targets = token_ids.clone()
    targets[1, 3] = bad
    with pytest.raises(ValueError, match=rf"GPT.forward: targets must hold ids in \[0, vocab_size=65\) or -1 \(ignored\), got the id {bad}"):
        tiny_model(token_ids, targets)


@pytest.mark.slow
def test_gpt_is_traceable_by_torch_export(tiny_model, token_ids):
    targets = ids(token_ids.shape, 65, seed=1)
    targets[:, :2] = -1
    exported = torch.export.export(tiny_model, (token_ids, targets))  # the id checks are skipped while tracing
    with torch.no_grad():
        logits, loss = tiny_model(token_ids, targets)
        logits_e, loss_e = exported.module()(token_ids, targets)
    torch.testing.assert_close(logits_e, logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss_e, loss, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_gpt_torch_compile_gives_the_same_logits(tiny_model, token_ids):
    compiled = torch.compile(tiny_model)
    with torch.no_grad():
        expected = tiny_model(token_ids)[0]
        torch.testing.assert_close(compiled(token_ids)[0], expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="idx must hold ids"):  # the eager checks still run outside compile
        tiny_model(torch.tensor([[65]]))


# ---------------------------------------------------------------- kv_cache and generate (chapter 12)


class _LayerCache:
    def __init__(self):
        self.k = self.v = None
        self.length = 0

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length = self.k.size(2)
        return self.k, self.v


class ListCache(list):
    """A cache with the protocol of GPT.forward: one layer cache per block and an int ``length``."""

    def __init__(self, n_layer):
        super().__init__(_LayerCache() for _ in range(n_layer))

    @property
    def length(self):
        return self[0].length


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt_forward_with_kv_cache_in_pieces_equals_the_whole(dtype):
    model = randomised_gpt(TINY, dtype)
    idx = ids((2, TINY.block_size), 65)
    cache = ListCache(TINY.n_layer)
    with torch.no_grad():
        whole = model(idx)[0]
        for a, b in ((0, 5), (5, 6), (6, 9), (9, 10), (10, 16)):
            logits, _ = model(idx[:, a:b], kv_cache=cache)
            torch.testing.assert_close(logits, whole[:, a:b], rtol=0, atol=ATOL[dtype])
            assert cache.length == b
    # Without the cache, the same tokens would sit at positions 0.. and give other logits.
    with torch.no_grad():
        assert (model(idx[:, 10:16])[0] - whole[:, 10:16]).abs().max() > 1e-3


def test_gpt_forward_with_kv_cache_returns_the_loss_of_the_new_positions():
    model = randomised_gpt(TINY)
    idx, targets = ids((2, 12), 65), ids((2, 12), 65, seed=1)
    cache = ListCache(TINY.n_layer)
    with torch.no_grad():
        model(idx[:, :8], kv_cache=cache)
        logits, loss = model(idx[:, 8:], targets[:, 8:], kv_cache=cache)
        expected = F.cross_entropy(model(idx)[0][:, 8:].flatten(0, 1), targets[:, 8:].flatten())
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)


def test_gpt_forward_kv_cache_errors():
    model = GPT(TINY)
    cache = ListCache(TINY.n_layer)
    with torch.no_grad():
        model(ids((1, 10), 65), kv_cache=cache)
    with pytest.raises(ValueError, match=r"GPT.forward: kv_cache holds 10 positions and idx adds T=7, 17 in all, but block_size=16"):
        model(ids((1, 7), 65), kv_cache=cache)
    with pytest.raises(ValueError, match=r"GPT.forward: kv_cache must hold one cache per block \(2\), got 3"):
        model(ids((1, 2), 65), kv_cache=ListCache(3))
    with pytest.raises(TypeError, match="GPT.forward: kv_cache must hold one layer cache per block and have an int attribute length, got kv_cache=list"):
        model(ids((1, 2), 65), kv_cache=[_LayerCache(), _LayerCache()])


def test_gpt_generate_method_keeps_the_training_mode_and_returns_a_normal_tensor():
    model = GPT(TINY).train()
    idx = ids((2, 3), 65)
    out = model.generate(idx, 20, temperature=0)
    assert model.training
    assert out.shape == (2, 23) and out.dtype == torch.int64 and torch.equal(out[:, :3], idx)
    assert not torch.is_inference(out)
    model.eval()
    with torch.no_grad():  # greedy: each new token is the argmax of the logits of the last 16 tokens
        for n in (3, 16, 22):
            assert out[:, n].tolist() == model(out[:, max(0, n - 16):n])[0][:, -1].argmax(-1).tolist()
    assert not model.training


def test_gpt_generate_forwards_every_argument_to_generation(tiny_model, monkeypatch):
    columns = []
    idx = ids((2, 3), 65)
    out = tiny_model.generate(idx, 5, temperature=0.7, top_k=10, top_p=0.9, use_cache=False,
                              generator=torch.Generator().manual_seed(3), callback=columns.append)
    assert out.shape == (2, 8) and len(columns) == 5 and all(c.shape == (2, 1) for c in columns)
    assert torch.equal(torch.cat(columns, dim=1), out[:, 3:])
    seen = {}
    monkeypatch.setattr(generation, "generate", lambda model, *args, **kwargs: seen.update(model=model, args=args, **kwargs))
    tiny_model.generate(idx, 4, 0.5, 3, 0.8, False, None, print)
    assert seen == dict(model=tiny_model, args=(idx, 4), temperature=0.5, top_k=3, top_p=0.8, use_cache=False,
                        generator=None, callback=print)


def test_num_params_counts_tied_weight_once(tiny_model):
    total = sum(p.numel() for p in tiny_model.parameters())
    assert tiny_model.num_params(non_embedding=False) == total
    assert tiny_model.num_params() == total - 16 * 32
    assert sum(t.numel() for t in tiny_model.state_dict().values()) == total + 65 * 32


# ---------------------------------------------------------------- save_pretrained / from_pretrained


@pytest.mark.parametrize("dtype", DTYPES)
def test_save_pretrained_then_from_pretrained_reproduces_the_logits_exactly(tmp_path, dtype, token_ids):
    model = randomised_gpt(TINY, dtype)
    model.save_pretrained(tmp_path / "tiny", metadata={"step": "7"})
    rng = torch.get_rng_state()
    back = GPT.from_pretrained(tmp_path / "tiny")
    assert torch.equal(torch.get_rng_state(), rng)  # building the model did not consume random numbers
    assert isinstance(back, GPT) and back.config == TINY and not back.training
    assert back.lm_head.weight is back.wte.weight and back.wte.weight.dtype == dtype
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(back(token_ids)[0], model(token_ids)[0])
    assert torch.equal(GPT.from_pretrained(str(tmp_path / "tiny"))(token_ids)[0], back(token_ids)[0])  # str works too


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"GPT.from_pretrained: name_or_dir must be one of 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' or a directory .*got name_or_dir='gpt3'"):
        GPT.from_pretrained("gpt3")
    with pytest.raises(FileNotFoundError, match="name_or_dir"):
        GPT.from_pretrained(tmp_path / "missing")
    with pytest.raises(TypeError, match="GPT.from_pretrained: name_or_dir must be a str or os.PathLike, got int"):
        GPT.from_pretrained(3)
    with pytest.raises(ValueError, match="GPT.from_pretrained: device must name a device"):
        GPT.from_pretrained(tmp_path, device="gpu7")
    with pytest.raises(ValueError, match="GPT.from_pretrained: device must name a device .*got device='banana'"):
        GPT.from_pretrained("gpt2", device="banana")  # refused before anything is read
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GPT.from_pretrained: device must be a device of this machine, got device='cuda'"):
            GPT.from_pretrained("gpt2", device="cuda")


# ---------------------------------------------------------------- Chapter 21's options: RoPE, QK-norm, ReLU^2,
# soft-capped logits, zero-initialised branches and an untied head

from transformer_lib.block import FeedForward  # noqa: E402
from transformer_lib.embeddings import rope_angles  # noqa: E402
from transformer_lib.llama import GroupedQueryAttention  # noqa: E402
from transformer_lib.multihead import MultiHeadAttention  # noqa: E402

ROPE = GPTConfig.from_preset("tiny", position="rope")  # head width 16: even


def _random_mha(d_model, n_head, qk_norm=False, seed=0):
    """A float64 MultiHeadAttention with random weights and biases (biases are zero at init)."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, n_head, qk_norm=qk_norm).double().eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    return mha


def _complex_rope(x, angles):
    """RoPE as complex products: the pair (x[2i], x[2i + 1]) is x[2i] + 1j x[2i + 1], times exp(1j angles[t, i])."""
    z = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())  # (B, h, T, hd / 2)
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_multihead_attention_with_rope_equals_a_hand_written_reference():
    B, T, C, h = 2, 7, 24, 3
    hd = C // h
    mha = _random_mha(C, h)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cos, sin = rope_angles(T, hd, dtype=torch.float64)
    # the angles themselves, p * 10000 ** (-2i / hd), for an independent rotation by complex numbers
    inv_freq = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, hd / 2)
    q, k, v = F.linear(x, mha.in_proj.weight, mha.in_proj.bias).split(C, dim=-1)
    q, k, v = (t.view(B, T, h, hd).transpose(1, 2) for t in (q, k, v))  # (B, h, T, hd)
    q, k = _complex_rope(q, angles), _complex_rope(k, angles)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = F.linear(y.transpose(1, 2).reshape(B, T, C), mha.out_proj.weight, mha.out_proj.bias)
    with torch.no_grad():
        out, _ = mha(x, is_causal=True, rope=(cos, sin))
        plain, _ = mha(x, is_causal=True)
    # float64: the same few products and sums in another order, a few ulp of values of order 1
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert (out - plain).abs().max() > 1e-3  # the rotation did change the attention
    # the first position's angle is 0: its query and key are not rotated, and it attends only to itself
    torch.testing.assert_close(out[:, 0], plain[:, 0], rtol=0, atol=1e-12)


def test_multihead_attention_qk_norm_equals_grouped_query_attention_with_qk_norm():
    B, T, C, h = 2, 6, 24, 3
    hd = C // h
    mha = _random_mha(C, h, qk_norm=True)
    # eps = float64's machine epsilon: what F.rms_norm uses without an eps, as MultiHeadAttention calls it
    gqa = GroupedQueryAttention(C, h, h, hd, qk_norm=True, bias=True, eps=torch.finfo(torch.float64).eps).double()
    with torch.no_grad():
        for i, proj in enumerate((gqa.q_proj, gqa.k_proj, gqa.v_proj)):  # in_proj rows: q, then k, then v
            proj.weight.copy_(mha.in_proj.weight[i * C:(i + 1) * C])
            proj.bias.copy_(mha.in_proj.bias[i * C:(i + 1) * C])
        gqa.o_proj.weight.copy_(mha.out_proj.weight)
        gqa.o_proj.bias.copy_(mha.out_proj.bias)
    assert torch.equal(gqa.q_norm.weight, torch.ones(hd, dtype=torch.float64))  # gains 1: a plain RMS norm
    x = 3 * torch.randn(B, T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cos, sin = torch.ones(T, hd // 2, dtype=torch.float64), torch.zeros(T, hd // 2, dtype=torch.float64)
    with torch.no_grad():
        expected = gqa(x, cos, sin)[0]  # cos 1, sin 0: its RoPE is the identity
        out, _ = mha(x, is_causal=True)
        mha.qk_norm = False
        without, _ = mha(x, is_causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)  # float64, a few ulp
    assert (out - without).abs().max() > 1e-3  # the normalisation matters for these inputs


def test_feed_forward_relu2_is_relu_squared():
    torch.manual_seed(0)
    ff = FeedForward(12, 40, activation="relu2").double()
    x = torch.randn(3, 5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    hidden = x @ ff.fc1.weight.T + ff.fc1.bias
    expected = torch.where(hidden > 0, hidden, 0.0) ** 2 @ ff.fc2.weight.T + ff.fc2.bias
    with torch.no_grad():
        out = ff(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)  # float64, a few ulp
    relu = FeedForward(12, 40, activation="relu").double()
    relu.load_state_dict(ff.state_dict())
    with torch.no_grad():
        assert (relu(x) - out).abs().max() > 1e-3  # squaring is not ReLU
    model = GPT(GPTConfig.from_preset("tiny", activation="relu2"))
    assert all(b.mlp.activation == "relu2" for b in model.blocks)


def test_logit_softcap_is_cap_tanh_of_the_raw_logits():
    model = randomised_gpt(TINY, torch.float64)
    idx, targets = ids((2, 12), 65), ids((2, 12), 65, seed=1)
    with torch.no_grad():
        raw = model(idx)[0]
    cap = 0.5 * raw.abs().max().item()  # small enough that tanh bends the largest logits
    capped_model = randomised_gpt(GPTConfig.from_preset("tiny", logit_softcap=cap), torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(capped_model.state_dict().values(), model.state_dict().values()))
    with torch.no_grad():
        logits, loss = capped_model(idx, targets)
    expected = cap * torch.tanh(raw / cap)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)  # float64: tanh and a product, a few ulp
    assert logits.abs().max() < cap  # tanh is bounded by 1
    assert (logits - raw).abs().max() > 0.1 * cap  # the cap did bend the logits
    torch.testing.assert_close(loss, F.cross_entropy(expected.flatten(0, 1), targets.flatten()), rtol=0, atol=1e-12)


def test_zero_init_blocks_start_as_the_identity():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", zero_init=True)).eval()
    for block in model.blocks:
        assert torch.equal(block.attn.out_proj.weight, torch.zeros(32, 32))
        assert torch.equal(block.mlp.fc2.weight, torch.zeros(32, 128))
        assert block.attn.in_proj.weight.abs().max() > 0 and block.mlp.fc1.weight.abs().max() > 0
    idx = ids((2, 10), 65)
    with torch.no_grad():
        logits = model(idx)[0]
        expected = model.lm_head(model.ln_f(model.wte(idx) + model.wpe.weight[:10]))
    assert torch.equal(logits, expected)  # each block adds exactly zero to the residual stream
    torch.manual_seed(0)
    default = GPT(TINY).eval()
    with torch.no_grad():
        embeddings_only = default.lm_head(default.ln_f(default.wte(idx) + default.wpe.weight[:10]))
        assert not torch.equal(default(idx)[0], embeddings_only)  # without zero_init the blocks do change it
    # the zero matrices still get gradients, so training moves them
    model.train()
    model(idx, ids((2, 10), 65, seed=1))[1].backward()
    for block in model.blocks:
        assert block.attn.out_proj.weight.grad.abs().max() > 0 and block.mlp.fc2.weight.grad.abs().max() > 0


def test_rope_gpt_has_no_position_table_and_its_angles_are_not_saved():
    model = GPT(ROPE)
    assert model.wpe is None
    hd = ROPE.n_embd // ROPE.n_head
    cos, sin = rope_angles(ROPE.block_size, hd)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert {"rope_cos", "rope_sin"} <= {name for name, _ in model.named_buffers()}
    keys = set(model.state_dict())
    assert not [k for k in keys if "wpe" in k or "rope" in k], sorted(keys)
    assert keys == set(GPT(TINY).state_dict()) - {"wpe.weight"}
    assert model.num_params() == model.num_params(non_embedding=False) == sum(p.numel() for p in model.parameters())
    assert model.double().rope_cos.dtype == torch.float64  # the buffers follow the model's dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_gpt_forward_with_kv_cache_in_pieces_equals_the_whole(dtype):
    config = GPTConfig.from_preset("tiny", position="rope", qk_norm=True)
    model = randomised_gpt(config, dtype)
    idx = ids((2, config.block_size), 65)
    cache = ListCache(config.n_layer)
    with torch.no_grad():
        whole = model(idx)[0]
        for a, b in ((0, 5), (5, 6), (6, 9), (9, 10), (10, 16)):
            logits, _ = model(idx[:, a:b], kv_cache=cache)
            torch.testing.assert_close(logits, whole[:, a:b], rtol=0, atol=ATOL[dtype])
            assert cache.length == b
        # without the cache, the same tokens sit at positions 0.. and are rotated by other angles
        assert (model(idx[:, 10:16])[0] - whole[:, 10:16]).abs().max() > 1e-3


def test_rope_gpt_greedy_generation_with_and_without_cache_agree():
    model = randomised_gpt(ROPE, torch.float64)
    idx = ids((2, 3), 65)
    cached = model.generate(idx, 20, temperature=0, use_cache=True)
    uncached = model.generate(idx, 20, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_rope_gpt_is_causal_exactly():
    model = randomised_gpt(ROPE)
    idx = ids((2, 16), 65)
    for t in (0, 7, 15):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 65
        with torch.no_grad():
            a, b = model(idx)[0], model(changed)[0]
        assert torch.equal(a[:, :t], b[:, :t])
        assert not torch.equal(a[:, t], b[:, t])


@pytest.mark.parametrize("overrides", [
    dict(position="rope"),
    dict(tie_embeddings=False),
    dict(position="rope", qk_norm=True, tie_embeddings=False, zero_init=True, logit_softcap=5.0, activation="relu2"),
], ids=["rope", "untied", "all"])
def test_save_pretrained_round_trips_the_architecture_options(tmp_path, token_ids, overrides):
    config = GPTConfig.from_preset("tiny", **overrides)
    model = randomised_gpt(config, torch.float64)
    model.save_pretrained(tmp_path / "m")
    back = GPT.from_pretrained(tmp_path / "m")
    assert back.config == config and back.wte.weight.dtype == torch.float64
    assert (back.lm_head.weight is back.wte.weight) == config.tie_embeddings
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(back(token_ids)[0], model(token_ids)[0])


def test_output_layer_is_tied_by_default_and_untied_on_request():
    torch.manual_seed(0)
    tied = GPT(TINY)
    assert tied.lm_head.weight is tied.wte.weight
    torch.manual_seed(0)
    untied = GPT(GPTConfig.from_preset("tiny", tie_embeddings=False))
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.lm_head.weight.data_ptr() != untied.wte.weight.data_ptr()
    assert untied.lm_head.weight.shape == untied.wte.weight.shape == (65, 32)
    assert not torch.equal(untied.lm_head.weight, untied.wte.weight)  # drawn separately
    # the sample std of 65 * 32 normal draws is within 10 % of 0.02 (relative standard error 1.6 %)
    assert abs(untied.lm_head.weight.std().item() / 0.02 - 1) < 0.1
    with torch.no_grad():
        untied.wte.weight[3, 0] = 7.0
    assert untied.lm_head.weight[3, 0] != 7.0
    assert untied.num_params(non_embedding=False) == tied.num_params(non_embedding=False) + 65 * 32
    assert sum(t.numel() for t in untied.state_dict().values()) == untied.num_params(non_embedding=False)
