"""Unit tests for transformer_lib.encoder_decoder (chapter 11), against PyTorch's nn.Transformer.

Seq2SeqConfig (transformer_lib.config) is tested in test_config.py; decoding in test_encoder_decoder_decoding.py."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.config import GPTConfig, Seq2SeqConfig
from transformer_lib.encoder_decoder import Decoder, DecoderBlock, Encoder, EncoderDecoder, encoder_decoder_from_torch

# float32: outputs after several blocks, each rounding; float64: a few hundred ulp at most.
ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DTYPES = list(ATOL)


def ids(shape, vocab, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- encoder, decoder, nn.Transformer

B, S, T, D = 2, 7, 5, 32
SRC_KEYS = padding_mask([7, 4], S)  # key masks, True at real tokens; torch's key_padding_mask is ~SRC_KEYS
TGT_KEYS = padding_mask([5, 3], T)


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
        ref = tr(src, tgt, tgt_mask=~causal_mask(T), src_key_padding_mask=~SRC_KEYS, tgt_key_padding_mask=~TGT_KEYS,
                 memory_key_padding_mask=~SRC_KEYS, tgt_is_causal=True)
        memory = encoder(src, src_key_mask=SRC_KEYS)
        out = decoder(tgt, memory, tgt_key_mask=TGT_KEYS, memory_key_mask=SRC_KEYS, tgt_is_causal=True)
        torch.testing.assert_close(memory, tr.encoder(src, src_key_padding_mask=~SRC_KEYS), rtol=0, atol=ATOL[dtype])
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
        ours = block(x, memory, memory_mask=memory_mask, tgt_key_mask=TGT_KEYS,
                     memory_key_mask=SRC_KEYS, tgt_is_causal=True)
        ref = layer(x, memory, tgt_mask=~causal_mask(T), memory_mask=~memory_mask, tgt_key_padding_mask=~TGT_KEYS,
                    memory_key_padding_mask=~SRC_KEYS)
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL[dtype])


def test_decoder_block_from_torch_errors():
    with pytest.raises(TypeError, match="DecoderBlock.from_torch: layer must be a torch.nn.TransformerDecoderLayer"):
        DecoderBlock.from_torch(nn.TransformerEncoderLayer(8, 2))
    with pytest.raises(ValueError, match="DecoderBlock.from_torch: layer must have batch_first=True"):
        DecoderBlock.from_torch(nn.TransformerDecoderLayer(8, 2))
    with pytest.raises(ValueError, match="DecoderBlock.from_torch: layer.activation must be ReLU or GELU"):
        DecoderBlock.from_torch(nn.TransformerDecoderLayer(8, 2, activation=F.silu, batch_first=True))


def test_stack_from_torch_errors():
    with pytest.raises(TypeError, match="Encoder.from_torch: encoder must be a torch.nn.TransformerEncoder, got encoder=Linear"):
        Encoder.from_torch(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Decoder.from_torch: decoder must be a torch.nn.TransformerDecoder"):
        Decoder.from_torch(nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, batch_first=True), 1,
                                                 enable_nested_tensor=False))
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, batch_first=True), 2, enable_nested_tensor=False)
    with pytest.raises(ValueError, match="Encoder.from_torch: encoder must end in a final norm"):
        Encoder.from_torch(enc)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, batch_first=True), 2)
    with pytest.raises(ValueError, match="Decoder.from_torch: decoder must end in a final norm"):
        Decoder.from_torch(dec)
    with pytest.raises(TypeError, match="encoder_decoder_from_torch: transformer must be a torch.nn.Transformer"):
        encoder_decoder_from_torch(enc)


def test_encoder_and_decoder_share_one_base_class():
    assert Encoder.__mro__[1] is Decoder.__mro__[1] and Encoder.__mro__[1] is not nn.Module
    assert "from_torch" not in vars(Encoder) and "from_torch" not in vars(Decoder)  # one implementation
    for cls in (Encoder, Decoder):
        with pytest.raises(ValueError, match=f"{cls.__name__}: n_layer must be"):
            cls(0, 8, 2)
        stack = cls(3, 8, 2, 16, norm_first=True, bias=False, eps=1e-3)
        assert len(stack.layers) == 3 and stack.norm.weight.shape == (8,) and stack.norm.bias is None


def test_decoder_block_validation():
    with pytest.raises(ValueError, match="DecoderBlock: d_model must be divisible by n_head, got d_model=10 and n_head=3"):
        DecoderBlock(10, 3)
    with pytest.raises(ValueError, match="DecoderBlock: dropout must be"):
        DecoderBlock(8, 2, dropout=1.5)
    with pytest.raises(ValueError, match="DecoderBlock: activation must be one of"):
        DecoderBlock(8, 2, activation="tanh")
    with pytest.raises(TypeError, match="DecoderBlock: norm_first must be a bool"):
        DecoderBlock(8, 2, norm_first=1)
    with pytest.raises(ValueError, match="DecoderBlock: eps must be"):
        DecoderBlock(8, 2, eps=0.0)


# ---------------------------------------------------------------- EncoderDecoder (Seq2SeqConfig: test_config.py)

SMALL = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=32, n_head=4, n_encoder_layers=2, n_decoder_layers=2,
             d_ff=64, dropout=0.0, max_len=16)


def test_encoder_decoder_forward_and_tying():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    assert model.generator.weight is model.tgt_embed.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    memory = model.encode(src, SRC_KEYS)
    logits = model.decode(tgt, memory, TGT_KEYS, SRC_KEYS)
    assert memory.shape == (B, S, 32) and logits.shape == (B, T, 13)
    assert torch.equal(logits, model(src, tgt, SRC_KEYS, TGT_KEYS))
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
    memory = model.encoder(x, src_key_mask=SRC_KEYS)
    expected = model.generator(model.decoder(y, memory, tgt_mask=causal_mask(T), memory_key_mask=SRC_KEYS))
    torch.testing.assert_close(model(src, tgt, SRC_KEYS), expected, rtol=0, atol=1e-6)


def test_encoder_decoder_target_is_causal_and_padding_is_ignored():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    with torch.no_grad():
        base = model(src, tgt, SRC_KEYS)
        tgt2 = tgt.clone()
        tgt2[:, 3] = (tgt2[:, 3] + 1) % 13
        assert torch.equal(base[:, :3], model(src, tgt2, SRC_KEYS)[:, :3])
        src2 = src.clone()
        src2[1, 4:] = (src2[1, 4:] + 1) % 11  # padded positions of sequence 1
        torch.testing.assert_close(model(src2, tgt, SRC_KEYS), base, rtol=0, atol=1e-6)


def test_encoder_decoder_errors():
    model = EncoderDecoder(Seq2SeqConfig(**SMALL))
    with pytest.raises(TypeError, match="EncoderDecoder: config must be a Seq2SeqConfig"):
        EncoderDecoder(GPTConfig())
    with pytest.raises(TypeError, match=r"EncoderDecoder.encode: src must have dtype int64, got src.dtype=torch.float32"):
        model.encode(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="EncoderDecoder.encode: src must be a tensor"):
        model.encode([[1, 2]])
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: tgt must have at most max_len=16 positions, got tgt.shape=\(1, 17\)"):
        model(ids((1, 4), 11), ids((1, 17), 13))
    with pytest.raises(ValueError, match=r"EncoderDecoder.encode: src must hold ids in \[0, vocab_size=11\), got the id 11"):
        model.encode(torch.tensor([[1, 11]]))
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: tgt must hold ids in \[0, vocab_size=13\), got the id -1"):
        model(ids((1, 4), 11), torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match=r"EncoderDecoder.encode: src must be 2-D"):
        model.encode(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"EncoderDecoder.encode: src must not be empty"):
        model.encode(torch.zeros(1, 0, dtype=torch.int64))


def test_encoder_decoder_refuses_inputs_of_another_dtype_device_or_shape():
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    memory = model.encode(src)
    for dtype in (torch.float64, torch.int64):
        with pytest.raises(TypeError, match=rf"EncoderDecoder.decode: memory must have dtype float32 .*got memory.dtype={dtype}"):
            model.decode(tgt, memory.to(dtype))
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: memory must not be empty"):
        model.decode(tgt, memory[:, :0])
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: memory must hold one encoded source per target"):
        model.decode(tgt, memory[:1])
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: memory must have shape \(\*, \*, 32\)"):
        model.decode(tgt, memory[..., :16])
    with pytest.raises(ValueError, match="EncoderDecoder.encode: src must be on the model's device cpu, got src.device=meta"):
        model.encode(src.to("meta"))
    with pytest.raises(ValueError, match=r"EncoderDecoder.encode: src_key_mask must have shape \(2, 7\)"):
        model.encode(src, SRC_KEYS[:, :5])
    with pytest.raises(TypeError, match=r"EncoderDecoder.encode: src_key_mask must have dtype bool"):
        model.encode(src, SRC_KEYS.float())
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: memory_key_mask must have shape \(2, 7\)"):
        model.decode(tgt, memory, memory_key_mask=TGT_KEYS)
    with pytest.raises(ValueError, match=r"EncoderDecoder.decode: tgt_key_mask must have shape \(2, 5\)"):
        model(src, tgt, SRC_KEYS, SRC_KEYS)


@pytest.mark.slow
def test_encoder_decoder_is_traceable_by_torch_export():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(**SMALL)).eval()
    src, tgt = ids((B, S), 11), ids((B, T), 13, seed=1)
    exported = torch.export.export(model, (src, tgt))  # the id-range check is skipped while tracing
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(src, tgt), model(src, tgt), rtol=0, atol=1e-6)
