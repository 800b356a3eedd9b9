"""Unit tests for transformer_lib.model (chapter 6), against PyTorch's transformer modules."""

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.block import TransformerBlock
from transformer_lib.model import (
    GPT,
    GPT_PRESETS,
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderDecoder,
    GPTConfig,
    Seq2SeqConfig,
    encoder_decoder_from_torch,
    gpt_param_count,
)

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


# ---------------------------------------------------------------- GPTConfig


def test_gpt_config_defaults_are_gpt2_small():
    c = GPTConfig()
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size) == (12, 12, 768, 1024, 50257)
    assert (c.dropout, c.bias, c.activation, c.layer_norm_eps) == (0.0, True, "gelu", 1e-5)
    assert [f for f in c.to_dict()] == ["n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout",
                                        "bias", "activation", "layer_norm_eps"]


@pytest.mark.parametrize("field", ["n_layer", "n_head", "n_embd", "block_size", "vocab_size"])
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError),
                                        ("4", TypeError)])
def test_gpt_config_int_fields_are_validated(field, bad, error):
    with pytest.raises(error, match=f"GPTConfig: {field} must be"):
        GPTConfig(**{field: bad})


def test_gpt_config_n_embd_divisible_by_n_head():
    with pytest.raises(ValueError, match=r"GPTConfig: n_embd must be divisible by n_head, got n_embd=100 and n_head=3"):
        GPTConfig(n_embd=100, n_head=3)


@pytest.mark.parametrize("bad, error", [(-0.1, ValueError), (1.0, ValueError), (True, TypeError), ("0.1", TypeError)])
def test_gpt_config_dropout_is_validated(bad, error):
    with pytest.raises(error, match="GPTConfig: dropout must be"):
        GPTConfig(dropout=bad)


@pytest.mark.parametrize("bad", [1, 0, "True", None])
def test_gpt_config_bias_must_be_bool(bad):
    with pytest.raises(TypeError, match="GPTConfig: bias must be a bool"):
        GPTConfig(bias=bad)


def test_gpt_config_activation_is_validated():
    with pytest.raises(ValueError, match="GPTConfig: activation must be one of .*'gelu_tanh'.*got activation='swish'"):
        GPTConfig(activation="swish")
    with pytest.raises(TypeError, match="GPTConfig: activation must be a str"):
        GPTConfig(activation=None)


@pytest.mark.parametrize("bad, error", [(0.0, ValueError), (-1e-5, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("1e-5", TypeError), (False, TypeError)])
def test_gpt_config_layer_norm_eps_is_validated(bad, error):
    with pytest.raises(error, match="GPTConfig: layer_norm_eps must be"):
        GPTConfig(layer_norm_eps=bad)


def test_gpt_config_normalises_numbers():
    c = GPTConfig(dropout=0, layer_norm_eps=1)
    assert type(c.dropout) is float and type(c.layer_norm_eps) is float


def test_gpt_config_json_round_trip(tmp_path):
    for c in [GPTConfig.from_preset(n) for n in GPT_PRESETS] + [
        GPTConfig(n_layer=3, n_head=2, n_embd=10, block_size=7, vocab_size=11, dropout=0.25, bias=False,
                  activation="relu", layer_norm_eps=1e-6)
    ]:
        path = tmp_path / "config.json"
        c.to_json(path)
        back = GPTConfig.from_json(path)
        assert back == c
        assert [type(v) for v in back.to_dict().values()] == [type(v) for v in c.to_dict().values()]
        assert json.loads(path.read_text()) == c.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left behind


def test_gpt_config_to_json_replaces_an_existing_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("old contents")
    TINY.to_json(path)
    assert GPTConfig.from_json(path) == TINY


def test_gpt_config_from_dict_missing_keys_take_defaults_and_unknown_keys_fail():
    assert GPTConfig.from_dict({"n_layer": 2}) == GPTConfig(n_layer=2)
    with pytest.raises(ValueError, match=r"GPTConfig.from_dict: unknown keys \['n_embed', 'lr'\]"):
        GPTConfig.from_dict({"n_embed": 10, "lr": 1e-3})
    with pytest.raises(TypeError, match="GPTConfig.from_dict: d must be a mapping"):
        GPTConfig.from_dict([("n_layer", 2)])


def test_gpt_config_from_json_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"n_layer": 2,')
    with pytest.raises(ValueError, match=r"GPTConfig.from_json: .*broken.json is not valid JSON"):
        GPTConfig.from_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"broken.json must hold a JSON object"):
        GPTConfig.from_json(path)
    path.write_text('{"n_layer": 0}')
    with pytest.raises(ValueError, match="GPTConfig: n_layer must be >= 1"):
        GPTConfig.from_json(path)


def test_gpt_presets():
    assert set(GPT_PRESETS) >= {"tiny", "baby", "shakespeare-char", "gpt2"}
    tiny, baby = GPTConfig.from_preset("tiny"), GPTConfig.from_preset("baby")
    assert (tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.block_size, tiny.vocab_size) == (2, 2, 32, 16, 65)
    assert (baby.n_layer, baby.n_head, baby.n_embd, baby.block_size, baby.vocab_size) == (4, 4, 128, 64, 65)
    assert (baby.dropout, baby.bias) == (0.0, False)
    sc = GPTConfig.from_preset("shakespeare-char")
    assert (sc.n_layer, sc.n_head, sc.n_embd, sc.block_size, sc.vocab_size, sc.dropout, sc.bias) == (
        6, 6, 384, 256, 65, 0.2, False)
    g = GPTConfig.from_preset("gpt2")
    assert (g.n_layer, g.n_head, g.n_embd, g.block_size, g.vocab_size, g.bias, g.activation) == (
        12, 12, 768, 1024, 50257, True, "gelu_tanh")
    assert GPTConfig.from_preset("shakespeare-char", dropout=0.0).dropout == 0.0
    assert GPT_PRESETS["shakespeare-char"]["dropout"] == 0.2  # overrides do not modify the preset


def test_gpt_presets_errors():
    with pytest.raises(ValueError, match=r"unknown preset 'gpt3'; the presets are \['tiny', 'baby'"):
        GPTConfig.from_preset("gpt3")
    with pytest.raises(ValueError, match=r"unknown keys \['n_embed'\]"):
        GPTConfig.from_preset("tiny", n_embed=64)


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
    with pytest.raises(TypeError, match="GPT: config must be a GPTConfig, got dict"):
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


def test_gpt_loss_ignores_minus_100():
    model = GPT(TINY)
    idx, targets = ids((2, 6), 65), ids((2, 6), 65, seed=1)
    masked = targets.clone()
    masked[:, 3:] = -100
    logits, loss = model(idx, masked)
    expected = F.cross_entropy(logits[:, :3].reshape(-1, 65), targets[:, :3].reshape(-1))
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)


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


def test_gpt_forward_errors():
    model = GPT(TINY)
    good = ids((2, 4), 65)
    with pytest.raises(TypeError, match="GPT.forward: idx must be an int64 tensor of token ids, got list"):
        model([[1, 2]])
    with pytest.raises(TypeError, match="GPT.forward: idx must be an int64 tensor .* got dtype torch.int32"):
        model(good.int())
    with pytest.raises(TypeError, match="got dtype torch.float32"):
        model(good.float())
    with pytest.raises(ValueError, match=r"GPT.forward: idx must have shape \(B, T\), got idx.shape=\(4,\)"):
        model(good[0])
    with pytest.raises(ValueError, match=r"GPT.forward: idx has T=17 positions but block_size=16"):
        model(ids((1, 17), 65))
    with pytest.raises(ValueError, match=r"GPT.forward: idx must hold at least one token, got idx.shape=\(2, 0\)"):
        model(good[:, :0])
    with pytest.raises(ValueError, match="GPT.forward: idx holds the id 65, outside .* vocab_size=65"):
        model(torch.tensor([[1, 65]]))
    with pytest.raises(ValueError, match="GPT.forward: idx holds the id -1, outside .* vocab_size=65"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"GPT.forward: targets must have the shape of idx, \(2, 4\), got targets.shape=\(2, 3\)"):
        model(good, good[:, :3])
    with pytest.raises(TypeError, match="GPT.forward: targets must be an int64 tensor"):
        model(good, good.float())



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
    with pytest.raises(TypeError, match="GPT.forward: kv_cache must hold one layer cache per block and have an int attribute length, got list"):
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


def test_num_params_counts_tied_weight_once():
    model = GPT(TINY)
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - 16 * 32
    assert sum(t.numel() for t in model.state_dict().values()) == total + 65 * 32


@pytest.mark.parametrize(
    "config",
    [GPTConfig.from_preset(n) for n in ("tiny", "baby", "shakespeare-char")]
    + [GPTConfig(n_layer=L, n_head=h, n_embd=d, block_size=T, vocab_size=V, bias=b)
       for (L, h, d, T, V) in ((1, 1, 8, 5, 7), (3, 3, 24, 9, 100)) for b in (True, False)],
)
def test_gpt_param_count_formula(config):
    with torch.device("meta"):
        model = GPT(config)
    assert gpt_param_count(config) == sum(p.numel() for p in model.parameters())
    assert gpt_param_count(config, non_embedding=True) == model.num_params()


def test_gpt_param_count_gpt2():
    config = GPTConfig.from_preset("gpt2")
    assert gpt_param_count(config) == 124_439_808
    with torch.device("meta"):
        assert GPT(config).num_params(non_embedding=False) == 124_439_808
    with pytest.raises(TypeError, match="gpt_param_count: config must be a GPTConfig"):
        gpt_param_count({"n_layer": 1})


# ---------------------------------------------------------------- encoder, decoder, nn.Transformer

B, S, T, D = 2, 7, 5, 32
SRC_KPM = ~padding_mask([7, 4], S)
TGT_KPM = ~padding_mask([5, 3], T)


def make_transformer(dtype, norm_first=False, activation="relu", bias=True, seed=0):
    torch.manual_seed(seed)
    tr = nn.Transformer(d_model=D, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64,
                        dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first, bias=bias,
                        dtype=dtype)
    with torch.no_grad():
        for name, p in tr.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
    tr.encoder.use_nested_tensor = False
    return tr.eval()


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation, bias", [(False, "relu", True), (True, "gelu", False)])
def test_encoder_decoder_match_nn_transformer(dtype, norm_first, activation, bias):
    tr = make_transformer(dtype, norm_first, activation, bias)
    encoder, decoder = encoder_decoder_from_torch(tr)
    assert isinstance(encoder, Encoder) and isinstance(decoder, Decoder)
    assert len(encoder.layers) == len(decoder.layers) == 2 and not encoder.training
    assert decoder.layers[0].norm_first == norm_first and decoder.layers[0].mlp.activation == activation
    src = torch.randn(B, S, D, generator=torch.Generator().manual_seed(1), dtype=dtype)
    tgt = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2), dtype=dtype)
    with torch.no_grad():
        ref = tr(src, tgt, tgt_mask=~causal_mask(T), src_key_padding_mask=SRC_KPM, tgt_key_padding_mask=TGT_KPM,
                 memory_key_padding_mask=SRC_KPM, tgt_is_causal=True)
        memory = encoder(src, src_key_padding_mask=SRC_KPM)
        out = decoder(tgt, memory, tgt_key_padding_mask=TGT_KPM, memory_key_padding_mask=SRC_KPM, tgt_is_causal=True)
        torch.testing.assert_close(memory, tr.encoder(src, src_key_padding_mask=SRC_KPM), rtol=0, atol=ATOL[dtype])
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL[dtype])


def test_decoder_tgt_mask_tensor_equals_tgt_is_causal():
    tr = make_transformer(torch.float64)
    _, decoder = encoder_decoder_from_torch(tr)
    tgt = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, D, dtype=torch.float64)
    a = decoder(tgt, memory, tgt_is_causal=True)
    b = decoder(tgt, memory, tgt_mask=causal_mask(T))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_from_torch(dtype, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, 4, 48, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=norm_first, dtype=dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    layer.eval()
    block = DecoderBlock.from_torch(layer)
    assert not block.training and block.mlp.d_ff == 48 and block.ln3.weight.dtype == dtype
    x = torch.randn(B, T, D, dtype=dtype)
    memory = torch.randn(B, S, D, dtype=dtype)
    memory_mask = torch.rand(T, S, generator=torch.Generator().manual_seed(3)) > 0.3
    memory_mask[:, 0] = True  # every query keeps at least one key
    with torch.no_grad():
        ours = block(x, memory, memory_mask=memory_mask, tgt_key_padding_mask=TGT_KPM,
                     memory_key_padding_mask=SRC_KPM, tgt_is_causal=True)
        ref = layer(x, memory, tgt_mask=~causal_mask(T), memory_mask=~memory_mask, tgt_key_padding_mask=TGT_KPM,
                    memory_key_padding_mask=SRC_KPM)
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL[dtype])


def test_decoder_block_from_torch_errors():
    with pytest.raises(TypeError, match="DecoderBlock.from_torch: layer must be a torch.nn.TransformerDecoderLayer"):
        DecoderBlock.from_torch(nn.TransformerEncoderLayer(8, 2))
    with pytest.raises(ValueError, match="DecoderBlock.from_torch: layer must have batch_first=True"):
        DecoderBlock.from_torch(nn.TransformerDecoderLayer(8, 2))
    with pytest.raises(ValueError, match="DecoderBlock.from_torch: layer.activation must be ReLU or GELU"):
        DecoderBlock.from_torch(nn.TransformerDecoderLayer(8, 2, activation=F.silu, batch_first=True))
    with pytest.raises(TypeError, match="Encoder.from_torch: encoder must be a torch.nn.TransformerEncoder"):
        Encoder.from_torch(nn.Linear(2, 2))
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, batch_first=True), 2, enable_nested_tensor=False)
    with pytest.raises(ValueError, match="Encoder.from_torch: the PyTorch stack must end in a final norm"):
        Encoder.from_torch(enc)
    with pytest.raises(TypeError, match="encoder_decoder_from_torch: transformer must be a torch.nn.Transformer"):
        encoder_decoder_from_torch(enc)


def test_decoder_block_validation():
    with pytest.raises(ValueError, match="DecoderBlock: d_model must be divisible by n_head, got d_model=10 and n_head=3"):
        DecoderBlock(10, 3)
    with pytest.raises(ValueError, match="DecoderBlock: dropout must be in"):
        DecoderBlock(8, 2, dropout=1.5)
    with pytest.raises(ValueError, match="DecoderBlock: activation must be one of"):
        DecoderBlock(8, 2, activation="tanh")
    block = DecoderBlock(8, 2)
    with pytest.raises(ValueError, match=r"DecoderBlock: memory must have shape \(B, length, d_model=8\)"):
        block(torch.randn(1, 3, 8), torch.randn(1, 3, 6))
    with pytest.raises(TypeError, match="DecoderBlock: x must be a torch.Tensor"):
        block([1.0], torch.randn(1, 3, 8))


# ---------------------------------------------------------------- Seq2SeqConfig, EncoderDecoder

SMALL = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=32, n_head=4, n_encoder_layers=2, n_decoder_layers=2,
             d_ff=64, dropout=0.0, max_len=16)


def test_seq2seq_config_defaults_and_json(tmp_path):
    c = Seq2SeqConfig(100, 120)
    assert (c.d_model, c.n_head, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, c.dropout) == (512, 8, 6, 6, 2048, 0.1)
    assert (c.max_len, c.activation, c.norm_first, c.bias, c.pad_id, c.tie_embeddings) == (512, "relu", False, True, 0, True)
    other = Seq2SeqConfig(**SMALL, activation="gelu", norm_first=True, bias=False, pad_id=3, tie_embeddings=False)
    for cfg in (c, other):
        cfg.to_json(tmp_path / "s2s.json")
        assert Seq2SeqConfig.from_json(tmp_path / "s2s.json") == cfg
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.from_dict: missing required keys \['tgt_vocab_size'\]"):
        Seq2SeqConfig.from_dict({"src_vocab_size": 5})
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.from_dict: unknown keys \['vocab_size'\]"):
        Seq2SeqConfig.from_dict({"src_vocab_size": 5, "tgt_vocab_size": 5, "vocab_size": 5})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="Seq2SeqConfig.from_json: .*bad.json is not valid JSON"):
        Seq2SeqConfig.from_json(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(src_vocab_size=0), ValueError, "src_vocab_size must be >= 1"),
        (dict(tgt_vocab_size=True), TypeError, "tgt_vocab_size must be an int"),
        (dict(d_model=30, n_head=4), ValueError, "d_model must be divisible by n_head, got d_model=30 and n_head=4"),
        (dict(d_model=33, n_head=3), ValueError, "d_model must be even"),
        (dict(n_encoder_layers=0), ValueError, "n_encoder_layers must be >= 1"),
        (dict(n_decoder_layers=1.0), TypeError, "n_decoder_layers must be an int"),
        (dict(d_ff=-1), ValueError, "d_ff must be >= 1"),
        (dict(dropout=1.0), ValueError, "dropout must be in"),
        (dict(max_len=0), ValueError, "max_len must be >= 1"),
        (dict(activation="gelu_new"), ValueError, "activation must be one of"),
        (dict(norm_first=1), TypeError, "norm_first must be a bool"),
        (dict(bias="yes"), TypeError, "bias must be a bool"),
        (dict(layer_norm_eps=0), ValueError, "layer_norm_eps must be"),
        (dict(pad_id=-1), ValueError, "pad_id must be >= 0"),
        (dict(pad_id=11), ValueError, "pad_id must be an id of both vocabularies, got pad_id=11"),
        (dict(tie_embeddings=None), TypeError, "tie_embeddings must be a bool"),
    ],
)
def test_seq2seq_config_validation(kwargs, error, match):
    with pytest.raises(error, match=f"Seq2SeqConfig: {match}"):
        Seq2SeqConfig(**{**SMALL, **kwargs})


def test_encoder_decoder_forward_and_tying():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    assert model.generator.weight is model.tgt_embed.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    memory = model.encode(src, SRC_KPM)
    logits = model.decode(tgt, memory, TGT_KPM, SRC_KPM)
    assert memory.shape == (B, S, 32) and logits.shape == (B, T, 13)
    assert torch.equal(logits, model(src, tgt, SRC_KPM, TGT_KPM))
    untied = EncoderDecoder(Seq2SeqConfig(**SMALL, tie_embeddings=False))
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert n(untied) - n(model) == 13 * 32


def test_encoder_decoder_equals_its_parts():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    scale = math.sqrt(32)
    x = model.src_embed(src) * scale + model.pos.pe[:S]
    y = model.tgt_embed(tgt) * scale + model.pos.pe[:T]
    memory = model.encoder(x, src_key_padding_mask=SRC_KPM)
    expected = model.generator(model.decoder(y, memory, tgt_mask=causal_mask(T), memory_key_padding_mask=SRC_KPM))
    torch.testing.assert_close(model(src, tgt, SRC_KPM), expected, rtol=0, atol=1e-6)


def test_encoder_decoder_target_is_causal_and_padding_is_ignored():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    with torch.no_grad():
        base = model(src, tgt, SRC_KPM)
        tgt2 = tgt.clone()
        tgt2[:, 3] = (tgt2[:, 3] + 1) % 13
        assert torch.equal(base[:, :3], model(src, tgt2, SRC_KPM)[:, :3])
        src2 = src.clone()
        src2[1, 4:] = (src2[1, 4:] + 1) % 11  # padded positions of sequence 1
        torch.testing.assert_close(model(src2, tgt, SRC_KPM), base, rtol=0, atol=1e-6)


def test_encoder_decoder_errors():
    model = EncoderDecoder(Seq2SeqConfig(**SMALL))
    with pytest.raises(TypeError, match="EncoderDecoder: config must be a Seq2SeqConfig"):
        EncoderDecoder(GPTConfig())
    with pytest.raises(TypeError, match="EncoderDecoder: src must be an int64 tensor"):
        model.encode(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="EncoderDecoder: tgt has 17 positions but max_len=16"):
        model(ids((1, 4), 11), ids((1, 17), 13))
    with pytest.raises(ValueError, match=r"EncoderDecoder: src holds the id 11, outside \[0, 11\)"):
        model.encode(torch.tensor([[1, 11]]))
    with pytest.raises(ValueError, match=r"EncoderDecoder: src must have shape \(B, length\)"):
        model.encode(torch.tensor([1, 2]))
