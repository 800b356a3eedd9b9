"""Unit tests for transformer_lib.block (chapter 5), against PyTorch's modules and autograd."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.block import (
    FeedForward,
    LayerNorm,
    RMSNorm,
    SwiGLU,
    TransformerBlock,
    gelu,
    layer_norm,
    rms_norm,
)

# float32: eps 1.2e-7, outputs of order 1 computed in different orders; float64: a few ulp.
ATOL = {torch.float32: 1e-6, torch.float64: 1e-12}
DTYPES = list(ATOL)
B, T, D, H, D_FF = 2, 7, 16, 4, 40


def randn(*shape, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def random_affine(C, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(C, generator=g, dtype=dtype) + 0.5, torch.rand(C, generator=g, dtype=dtype) - 0.5


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- layer_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_f_layer_norm(dtype, affine):
    x = randn(3, 5, 32, dtype=dtype) * 3 + 2
    weight, bias = random_affine(32, dtype) if affine else (None, None)
    ours = layer_norm(x, weight, bias, eps=1e-5)
    assert ours.shape == x.shape and ours.dtype == dtype
    torch.testing.assert_close(ours, F.layer_norm(x, (32,), weight, bias, 1e-5), rtol=0, atol=ATOL[dtype])


def test_layer_norm_uses_biased_variance_and_eps_inside_the_sqrt():
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    eps = 0.5
    mean, var = 3.0, (4 + 1 + 0 + 9) / 4  # biased variance: divide by C = 4
    expected = (x - mean) / (var + eps) ** 0.5
    torch.testing.assert_close(layer_norm(x, eps=eps), expected, rtol=0, atol=1e-15)


def test_layer_norm_gradients_match_autograd_through_f_layer_norm():
    x = randn(2, 3, 8, requires_grad=True)
    w, b = (p.requires_grad_() for p in random_affine(8, torch.float64))
    up = randn(2, 3, 8, seed=5)
    ours = torch.autograd.grad((layer_norm(x, w, b) * up).sum(), (x, w, b))
    ref = torch.autograd.grad((F.layer_norm(x, (8,), w, b) * up).sum(), (x, w, b))
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


_X8 = randn(2, 8)


@pytest.mark.parametrize(
    "args, kwargs, error, name",
    [
        (([1.0, 2.0],), {}, TypeError, "x"),
        ((torch.arange(4),), {}, TypeError, "x"),  # not floating
        ((torch.tensor(1.0),), {}, ValueError, "x"),  # 0-d: no channel dimension
        ((_X8, torch.ones(4, dtype=torch.float64)), {}, ValueError, "weight"),
        ((_X8, None, torch.zeros(8)), {}, TypeError, "bias"),  # float32 bias, float64 x
        ((_X8, [1.0] * 8), {}, TypeError, "weight"),
        ((_X8,), {"eps": 0}, ValueError, "eps"),
        ((_X8,), {"eps": "1e-5"}, TypeError, "eps"),
    ],
)
def test_layer_norm_errors(args, kwargs, error, name):
    with pytest.raises(error, match=f"layer_norm: {name} "):
        layer_norm(*args, **kwargs)


def test_layer_norm_error_says_what_came():
    with pytest.raises(ValueError, match=r"weight.shape=\(4,\)"):
        layer_norm(_X8, torch.ones(4, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"bias.dtype=torch.float32"):
        layer_norm(_X8, None, torch.zeros(8))


# ---------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_the_formula(dtype):
    x = randn(3, 5, 32, dtype=dtype) * 3 + 2
    w, _ = random_affine(32, dtype)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    ours = rms_norm(x, w)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL[dtype])


def test_rms_norm_of_centred_input_is_layer_norm():
    x = randn(4, 16) * 2 + 1
    centred = x - x.mean(-1, keepdim=True)
    torch.testing.assert_close(rms_norm(centred, eps=1e-5), layer_norm(x, eps=1e-5), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_module_matches_rms_norm(dtype):
    ours = RMSNorm(32).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(random_affine(32, dtype)[0])
    x = randn(3, 5, 32, dtype=dtype) * 3 + 2
    torch.testing.assert_close(ours(x), rms_norm(x, ours.weight, eps=ours.eps), rtol=0, atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_module_matches_torch_rmsnorm(dtype):
    ours = RMSNorm(32).to(dtype)
    ref = nn.RMSNorm(32, eps=1e-6, dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(random_affine(32, dtype)[0])
        ref.weight.copy_(ours.weight)
    x = randn(3, 5, 32, dtype=dtype) * 3 + 2
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=ATOL[dtype])


def test_rms_norm_errors():
    with pytest.raises(ValueError, match=r"rms_norm: weight .*weight.shape=\(3,\)"):
        rms_norm(randn(2, 8), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="rms_norm: eps .*eps=-1"):
        rms_norm(randn(2, 8), eps=-1)
    with pytest.raises(TypeError, match="rms_norm: x .*int32"):
        rms_norm(torch.ones(2, 8, dtype=torch.int32))


# ---------------------------------------------------------------- gelu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_f_gelu(dtype, approximate):
    x = torch.linspace(-8, 8, 2001, dtype=dtype)
    ours = gelu(x, approximate)
    assert ours.dtype == dtype
    atol = 4e-6 if dtype == torch.float32 else 1e-12  # outputs up to 8: one float32 ulp is 9.5e-7
    torch.testing.assert_close(ours, F.gelu(x, approximate=approximate), rtol=0, atol=atol)


def test_gelu_exact_and_tanh_differ_measurably():
    x = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    gap = (gelu(x) - gelu(x, "tanh")).abs().max().item()
    assert 1e-4 < gap < 5e-4


def test_gelu_errors():
    with pytest.raises(ValueError, match="gelu: approximate .*'none', 'tanh', got approximate='exact'"):
        gelu(randn(3), "exact")
    with pytest.raises(ValueError, match="gelu: approximate "):
        gelu(randn(3), None)
    with pytest.raises(TypeError, match="gelu: x .*int64"):
        gelu(torch.arange(3))
    with pytest.raises(TypeError, match="gelu: x .*float"):
        gelu(1.0)


# ---------------------------------------------------------------- LayerNorm, RMSNorm modules


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_module_matches_layer_norm(dtype, bias):
    ln = LayerNorm(32, bias=bias, eps=1e-5).to(dtype)
    with torch.no_grad():
        w, b = random_affine(32, dtype)
        ln.weight.copy_(w)
        if bias:
            ln.bias.copy_(b)
    x = randn(3, 5, 32, dtype=dtype) * 3 + 2
    torch.testing.assert_close(ln(x), layer_norm(x, ln.weight, ln.bias, eps=1e-5), rtol=0, atol=ATOL[dtype])


def test_layernorm_parameters_and_init():
    ln = LayerNorm(8)
    assert torch.equal(ln.weight, torch.ones(8)) and torch.equal(ln.bias, torch.zeros(8))
    assert n_params(ln) == 16
    no_bias = LayerNorm(8, bias=False)
    assert no_bias.bias is None and n_params(no_bias) == 8
    assert torch.equal(RMSNorm(8).weight, torch.ones(8)) and n_params(RMSNorm(8)) == 8


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: LayerNorm(0), ValueError, "LayerNorm: d_model .*d_model=0"),
        (lambda: LayerNorm(8.0), TypeError, "LayerNorm: d_model "),
        (lambda: LayerNorm(8, eps=0.0), ValueError, "LayerNorm: eps .*eps=0.0"),
        (lambda: LayerNorm(8, bias=1), TypeError, "LayerNorm: bias "),
        (lambda: RMSNorm(8, eps=float("nan")), ValueError, "RMSNorm: eps "),
        (lambda: RMSNorm(-1), ValueError, "RMSNorm: d_model "),
    ],
)
def test_norm_constructor_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_norm_forward_checks_nothing_and_pytorch_refuses_a_wrong_width():
    with pytest.raises(RuntimeError):
        LayerNorm(8)(torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError):
        RMSNorm(8)(torch.randn(2, 4))


MODULES = {
    "LayerNorm": lambda: LayerNorm(D),
    "RMSNorm": lambda: RMSNorm(D),
    "FeedForward": lambda: FeedForward(D, D_FF),
    "SwiGLU": lambda: SwiGLU(D, D_FF),
    "TransformerBlock": lambda: TransformerBlock(D, H, D_FF),
}


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # F.rms_norm's, not ours
@pytest.mark.parametrize("name", list(MODULES))
def test_forward_accepts_another_float_dtype_under_autocast(name):
    module = MODULES[name]()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(B, T, D).bfloat16())
    assert out.shape == (B, T, D) and out.is_floating_point()


# ---------------------------------------------------------------- FeedForward, SwiGLU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "activation, fn",
    [("relu", F.relu), ("gelu", lambda z: gelu(z)), ("gelu_tanh", lambda z: gelu(z, "tanh"))],
)
def test_feedforward_matches_the_formula(dtype, activation, fn):
    torch.manual_seed(0)
    ff = FeedForward(D, D_FF, activation=activation).to(dtype)
    x = randn(B, T, D, dtype=dtype)
    expected = fn(x @ ff.fc1.weight.T + ff.fc1.bias) @ ff.fc2.weight.T + ff.fc2.bias
    torch.testing.assert_close(ff(x), expected, rtol=0, atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_feedforward_is_position_wise(dtype):
    torch.manual_seed(0)
    ff = FeedForward(D, D_FF).to(dtype)
    x = randn(B, T, D, dtype=dtype)
    per_position = torch.stack([ff(x[:, t]) for t in range(T)], dim=1)
    torch.testing.assert_close(ff(x), per_position, rtol=0, atol=ATOL[dtype])


def test_feedforward_sizes_and_bias():
    ff = FeedForward(16)
    assert ff.d_ff == 64 and ff.fc1.weight.shape == (64, 16) and ff.fc2.weight.shape == (16, 64)
    assert n_params(ff) == 8 * 16 * 16 + 5 * 16
    no_bias = FeedForward(16, 24, bias=False)
    assert no_bias.fc1.bias is None and no_bias.fc2.bias is None and n_params(no_bias) == 2 * 16 * 24


def test_feedforward_dropout_train_and_eval():
    torch.manual_seed(0)
    ff = FeedForward(D, dropout=0.5)
    x = randn(B, T, D, dtype=torch.float32)
    with torch.no_grad():
        assert not torch.equal(ff(x), ff(x))
        ff.eval()
        eval_out = ff(x)
        assert torch.equal(eval_out, ff(x))
        expected = ff.fc2(F.gelu(ff.fc1(x)))
    torch.testing.assert_close(eval_out, expected, rtol=0, atol=0)


def test_feedforward_errors():
    with pytest.raises(ValueError, match="FeedForward: activation .*'relu', 'gelu', 'gelu_tanh', 'relu2', got activation='gelu_new'"):
        FeedForward(8, activation="gelu_new")
    with pytest.raises(ValueError, match="FeedForward: activation "):
        FeedForward(8, activation=F.relu)
    with pytest.raises(ValueError, match="FeedForward: dropout .*dropout=1.0"):
        FeedForward(8, dropout=1.0)
    with pytest.raises(TypeError, match="FeedForward: dropout "):
        FeedForward(8, dropout="0.1")
    with pytest.raises(ValueError, match="FeedForward: d_ff .*d_ff=0"):
        FeedForward(8, 0)
    with pytest.raises(TypeError, match="FeedForward: bias "):
        FeedForward(8, bias=None)


@pytest.mark.parametrize("d_model, d_ff", [(128, 344), (768, 2048), (100, 272), (3, 8)])
def test_swiglu_default_width_and_parameter_count(d_model, d_ff):
    m = SwiGLU(d_model)
    assert m.d_ff == d_ff and d_ff % 8 == 0 and d_ff >= 8 * d_model / 3 - 1
    assert n_params(m) == 3 * d_model * d_ff  # no biases by default
    # about the parameter count of a 4x FeedForward without biases
    if d_model >= 100:
        assert abs(n_params(m) / n_params(FeedForward(d_model, bias=False)) - 1) < 0.025


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_matches_the_formula(dtype, bias):
    torch.manual_seed(0)
    m = SwiGLU(D, 24, bias=bias).to(dtype)
    x = randn(B, T, D, dtype=dtype)
    gate, up = m.gate_proj(x), m.up_proj(x)
    expected = m.down_proj(gate * torch.sigmoid(gate) * up)
    out = m(x)
    assert out.shape == (B, T, D)
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL[dtype])


def test_swiglu_errors():
    with pytest.raises(ValueError, match="SwiGLU: d_model .*d_model=-2"):
        SwiGLU(-2)
    with pytest.raises(ValueError, match="SwiGLU: d_ff .*d_ff=0"):
        SwiGLU(8, 0)
    with pytest.raises(TypeError, match="SwiGLU: bias "):
        SwiGLU(8, bias="no")


# ---------------------------------------------------------------- TransformerBlock vs nn.TransformerEncoderLayer

CONFIGS = [(nf, act, bias) for nf in (False, True) for act in ("relu", "gelu") for bias in (True, False)]


def torch_layer(norm_first, activation, bias, dtype, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        D, H, D_FF, dropout=dropout, activation=activation, batch_first=True,
        norm_first=norm_first, bias=bias, dtype=dtype,
    )
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            if bias:
                norm.bias.uniform_(-0.5, 0.5)
    return layer.eval()


CAUSAL = causal_mask(T)  # True = may attend
KEY_MASK = padding_mask([T, 4], T)  # ours: True = real token; torch's src_key_padding_mask is ~KEY_MASK
MASKS = {
    "none": ({}, {}),
    "causal": ({"is_causal": True}, {"src_mask": ~CAUSAL, "is_causal": True}),
    "bool attn_mask": ({"attn_mask": CAUSAL}, {"src_mask": ~CAUSAL}),
    "padding": ({"key_mask": KEY_MASK}, {"src_key_padding_mask": ~KEY_MASK}),
    "padding + causal": (
        {"key_mask": KEY_MASK, "is_causal": True},
        {"src_mask": ~CAUSAL, "src_key_padding_mask": ~KEY_MASK, "is_causal": True},
    ),
}


def assert_block_matches_layer(norm_first, activation, bias, dtype, mask):
    layer = torch_layer(norm_first, activation, bias, dtype)
    block = TransformerBlock.from_torch(layer)
    ours_kwargs, torch_kwargs = MASKS[mask]
    x = randn(B, T, D, dtype=dtype, seed=1)
    out = block(x, **ours_kwargs)
    assert out.shape == (B, T, D) and out.dtype == dtype
    torch.testing.assert_close(out, layer(x, **torch_kwargs), rtol=0, atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation, bias", CONFIGS)
def test_block_matches_transformer_encoder_layer_every_config(dtype, norm_first, activation, bias):
    assert_block_matches_layer(norm_first, activation, bias, dtype, "padding + causal")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", list(MASKS))
def test_block_matches_transformer_encoder_layer_every_mask(dtype, norm_first, mask):
    assert_block_matches_layer(norm_first, "gelu", True, dtype, mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_float_attn_mask_equals_bool_mask(dtype):
    block = TransformerBlock.from_torch(torch_layer(True, "gelu", True, dtype))
    x = randn(B, T, D, dtype=dtype, seed=1)
    float_mask = torch.zeros(T, T, dtype=dtype).masked_fill(~CAUSAL, float("-inf"))
    torch.testing.assert_close(block(x, attn_mask=float_mask), block(x, attn_mask=CAUSAL), rtol=0, atol=ATOL[dtype])
    torch.testing.assert_close(block(x, is_causal=True), block(x, attn_mask=CAUSAL), rtol=0, atol=ATOL[dtype])


def test_block_gelu_tanh_module_activation():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        D, H, D_FF, dropout=0.0, activation=nn.GELU(approximate="tanh"), batch_first=True, dtype=torch.float64
    ).train()  # train mode with dropout 0: PyTorch's regular path, which honours the tanh approximation
    block = TransformerBlock.from_torch(layer)
    assert block.mlp.activation == "gelu_tanh" and block.training
    x = randn(B, T, D)
    torch.testing.assert_close(block(x), layer(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_block_gradients_match_autograd_through_torch_layer(norm_first):
    layer = torch_layer(norm_first, "gelu", True, torch.float64)
    block = TransformerBlock.from_torch(layer)
    names = {
        "ln1.weight": "norm1.weight", "ln1.bias": "norm1.bias",
        "attn.in_proj.weight": "self_attn.in_proj_weight", "attn.in_proj.bias": "self_attn.in_proj_bias",
        "attn.out_proj.weight": "self_attn.out_proj.weight", "attn.out_proj.bias": "self_attn.out_proj.bias",
        "ln2.weight": "norm2.weight", "ln2.bias": "norm2.bias",
        "mlp.fc1.weight": "linear1.weight", "mlp.fc1.bias": "linear1.bias",
        "mlp.fc2.weight": "linear2.weight", "mlp.fc2.bias": "linear2.bias",
    }
    ours_p, torch_p = dict(block.named_parameters()), dict(layer.named_parameters())
    assert set(ours_p) == set(names) and set(torch_p) == set(names.values())
    x = randn(B, T, D, seed=1, requires_grad=True)
    up = randn(B, T, D, seed=2)
    loss_ours = (block(x, is_causal=True, key_mask=KEY_MASK) * up).sum()
    loss_ref = (layer(x, src_mask=~CAUSAL, src_key_padding_mask=~KEY_MASK, is_causal=True) * up).sum()
    keys = list(names)
    g_ours = torch.autograd.grad(loss_ours, [x] + [ours_p[k] for k in keys])
    g_ref = torch.autograd.grad(loss_ref, [x] + [torch_p[names[k]] for k in keys])
    for a, r in zip(g_ours, g_ref):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-10)


def test_block_is_causal():
    torch.manual_seed(0)
    block = TransformerBlock(D, H).eval()
    x = randn(B, T, D, dtype=torch.float32)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        y, y2 = block(x, is_causal=True), block(x2, is_causal=True)
    torch.testing.assert_close(y[:, :-1], y2[:, :-1], rtol=0, atol=1e-6)
    assert (y[:, -1] - y2[:, -1]).abs().max() > 1e-3


def test_block_structure_defaults_and_no_bias():
    block = TransformerBlock(D, H)
    assert block.norm_first and block.mlp.d_ff == 4 * D and block.mlp.activation == "gelu"
    assert isinstance(block.ln1, LayerNorm) and isinstance(block.mlp, FeedForward)
    assert isinstance(block.dropout1, nn.Dropout) and isinstance(block.dropout2, nn.Dropout)
    assert n_params(block) == n_params(nn.TransformerEncoderLayer(D, H, 4 * D, batch_first=True))
    no_bias = TransformerBlock(D, H, D_FF, bias=False)
    assert not any(name.endswith("bias") for name, _ in no_bias.named_parameters())
    assert n_params(no_bias) == n_params(nn.TransformerEncoderLayer(D, H, D_FF, batch_first=True, bias=False))


def test_block_dropout_train_and_eval():
    layer = torch_layer(True, "gelu", True, torch.float32, dropout=0.2)
    block = TransformerBlock.from_torch(layer)
    assert block.dropout1.p == block.dropout2.p == block.mlp.dropout.p == block.attn.dropout == 0.2
    assert not block.training  # copied from the layer
    x = randn(B, T, D, dtype=torch.float32, seed=1)
    with torch.no_grad():
        eval_out = block(x)
        torch.testing.assert_close(eval_out, layer(x), rtol=0, atol=1e-6)  # dropout off in eval
        block.train()
        torch.manual_seed(1)
        a = block(x)
        b = block(x)
    assert not torch.equal(a, b) and not torch.equal(a, eval_out)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("where", ["attn", "dropout1", "mlp", "dropout2"])
def test_block_applies_each_dropout_in_training(norm_first, where):
    torch.manual_seed(0)
    block = TransformerBlock(D, H, dropout=0.0, norm_first=norm_first).train()
    if where == "attn":
        block.attn.dropout = 0.5
    elif where == "mlp":
        block.mlp.dropout.p = 0.5
    else:
        getattr(block, where).p = 0.5
    x = randn(B, T, D, dtype=torch.float32)
    with torch.no_grad():
        assert not torch.equal(block(x), block(x)), f"no randomness from {where}"
        block.eval()
        assert torch.equal(block(x), block(x))


def test_from_torch_preserves_dtype_and_training_mode():
    layer = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.1, batch_first=True, norm_first=True, dtype=torch.float64)
    block = TransformerBlock.from_torch(layer)
    assert block.training and all(p.dtype == torch.float64 for p in block.parameters())
    assert block.mlp.activation == "relu" and block.mlp.d_ff == D_FF and block.ln1.eps == layer.norm1.eps


def test_from_torch_errors():
    with pytest.raises(TypeError, match="TransformerBlock.from_torch: layer must be a torch.nn.TransformerEncoderLayer, got Linear"):
        TransformerBlock.from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="TransformerBlock.from_torch: layer must have batch_first=True"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(D, H, D_FF))
    with pytest.raises(ValueError, match="TransformerBlock.from_torch: layer.activation must be ReLU or GELU, got"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(D, H, D_FF, activation=torch.tanh, batch_first=True))
    odd = nn.TransformerEncoderLayer(D, H, D_FF, dropout=0.1, batch_first=True)
    odd.dropout2.p = 0.3
    with pytest.raises(ValueError, match=r"all dropout probabilities of layer must be equal, got \[0.1, 0.3\]"):
        TransformerBlock.from_torch(odd)
    odd = nn.TransformerEncoderLayer(D, H, D_FF, batch_first=True)
    odd.norm2.eps = 1e-6
    with pytest.raises(ValueError, match="norm1 and norm2 must have learnable weights and the same eps"):
        TransformerBlock.from_torch(odd)


@pytest.mark.parametrize(
    "args, kwargs, error, name",
    [
        ((0, H), {}, ValueError, "d_model"),
        ((D, 0), {}, ValueError, "n_head"),
        ((D, H, 0), {}, ValueError, "d_ff"),
        ((D, H), {"activation": "swish"}, ValueError, "activation"),
        ((D, H), {"norm_first": "pre"}, TypeError, "norm_first"),
        ((D, H), {"dropout": -0.1}, ValueError, "dropout"),
        ((D, H), {"bias": 0}, TypeError, "bias"),
        ((D, H), {"eps": 0}, ValueError, "eps"),
    ],
)
def test_block_constructor_errors_name_the_block_and_the_argument(args, kwargs, error, name):
    with pytest.raises(error, match=f"TransformerBlock: {name} "):
        TransformerBlock(*args, **kwargs)


def test_block_constructor_error_names_d_model_and_n_head_when_they_do_not_divide():
    with pytest.raises(ValueError, match="TransformerBlock: d_model .*n_head.*d_model=10 and n_head=3"):
        TransformerBlock(10, 3)


def test_block_forward_leaves_the_input_to_pytorch_and_checks_the_masks():
    block = TransformerBlock(D, H)
    with pytest.raises(RuntimeError):  # a wrong width fails in the first layer norm
        block(torch.randn(B, T, 8))
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: key_mask must have shape \(B, S\) = \(2, 7\)"):
        block(torch.randn(B, T, D), key_mask=torch.ones(B, T + 1, dtype=torch.bool))
    with pytest.raises(RuntimeError):  # attn_mask's shape is left to PyTorch's kernels
        block(torch.randn(B, T, D), attn_mask=torch.ones(T, T + 1, dtype=torch.bool))
    mask = torch.zeros(T, T)
    mask[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: attn_mask must hold finite numbers or -inf"):
        block(torch.randn(B, T, D), attn_mask=mask)


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_is_traceable_by_torch_export(norm_first):
    layer = torch_layer(norm_first, "gelu", True, torch.float32)
    block = TransformerBlock.from_torch(layer)
    x = randn(B, T, D, dtype=torch.float32, seed=1)
    exported = torch.export.export(block, (x,), {"key_mask": KEY_MASK, "is_causal": True})
    out = exported.module()(x, key_mask=KEY_MASK, is_causal=True)
    torch.testing.assert_close(out, block(x, key_mask=KEY_MASK, is_causal=True), rtol=0, atol=0)
    torch.testing.assert_close(out, layer(x, src_mask=~CAUSAL, src_key_padding_mask=~KEY_MASK, is_causal=True),
                               rtol=0, atol=ATOL[torch.float32])


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_with_kv_cache_in_pieces_equals_the_whole_sequence(norm_first, concat_cache):
    torch.manual_seed(0)
    block = TransformerBlock(D, H, norm_first=norm_first).double().eval()
    x = randn(B, T, D)
    with torch.no_grad():
        whole = block(x, is_causal=True)
        cache = concat_cache()
        pieces = [block(x[:, a:b], is_causal=True, kv_cache=cache) for a, b in ((0, 3), (3, 4), (4, 7))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=ATOL[torch.float64])
    assert cache.k.shape == (B, H, T, D // H)
