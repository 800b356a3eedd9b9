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
