"""Tests of the decoding of an encoder-decoder (chapter 11): greedy_decode, beam_search and
gnmt_length_penalty in transformer_lib.encoder_decoder."""

import itertools

import pytest
import torch

from transformer_lib.config import Seq2SeqConfig
from transformer_lib.encoder_decoder import EncoderDecoder, beam_search, gnmt_length_penalty, greedy_decode

PAD, BOS, EOS = 0, 1, 2  # Seq2SeqConfig's default pad_id, and the BOS and EOS of Seq2SeqVocab


def tiny_model(seed=0, tgt_vocab_size=6, dtype=torch.float64):
    cfg = Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=tgt_vocab_size, d_model=16, n_head=2,
                        n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=10)
    torch.manual_seed(seed)
    return EncoderDecoder(cfg).to(dtype).eval()


def random_src(B=6, S=5, seed=0):
    return torch.randint(3, 9, (B, S), generator=torch.Generator().manual_seed(seed))


# decoding ----------------------------------------------------------------------------------------

def test_greedy_decode_matches_step_by_step_argmax():
    model, src = tiny_model(), random_src()
    out = greedy_decode(model, src, max_len=6, bos_id=BOS, eos_id=EOS)
    assert out.dtype == torch.int64 and out.shape[0] == 6 and out.shape[1] <= 6
    with torch.no_grad():
        for b in range(src.size(0)):
            ys = [BOS]
            for _ in range(6):
                logits = model(src[b:b + 1], torch.tensor([ys]))[0, -1]
                logits[[PAD, BOS]] = float("-inf")
                ys.append(int(logits.argmax()))
                if ys[-1] == EOS:
                    break
            got = out[b].tolist()
            assert got[: len(ys) - 1] == ys[1:]
            assert all(i == PAD for i in got[len(ys) - 1:])


def test_decoding_restores_training_mode():
    model = tiny_model().train()
    greedy_decode(model, random_src(), max_len=3, bos_id=BOS, eos_id=EOS)
    assert model.training
    beam_search(model, random_src(), beam_size=2, max_len=3, bos_id=BOS, eos_id=EOS)
    assert model.training
    model.eval()
    greedy_decode(model, random_src(), max_len=3, bos_id=BOS, eos_id=EOS)
    assert not model.training


def test_decoding_restores_training_mode_after_an_error():
    model = tiny_model().train()

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    model.decode = fail  # an error inside the decoding loop
    for decode in (greedy_decode, beam_search):
        kwargs = {"beam_size": 2} if decode is beam_search else {}
        with pytest.raises(RuntimeError, match="boom"):
            decode(model, random_src(), max_len=3, bos_id=BOS, eos_id=EOS, **kwargs)
        assert model.training


def test_beam_size_one_is_greedy():
    for seed in range(3):
        model, src = tiny_model(seed, tgt_vocab_size=8), random_src(B=16, seed=seed)
        mask = torch.ones_like(src, dtype=torch.bool)
        mask[::2, -2:] = False  # some padded sources
        src = src.masked_fill(~mask, PAD)
        greedy = greedy_decode(model, src, max_len=7, bos_id=BOS, eos_id=EOS, src_key_mask=mask)
        beam, _ = beam_search(model, src, beam_size=1, max_len=7, bos_id=BOS, eos_id=EOS, length_penalty=0.0,
                              src_key_mask=mask)
        assert torch.equal(greedy, beam)


def test_wide_beam_equals_exhaustive_search():
    model, src, L = tiny_model(), random_src(B=4), 3
    outputs = [list(p) + [EOS] for n in range(L) for p in itertools.product([3, 4, 5], repeat=n)]
    outputs += [list(p) for p in itertools.product([3, 4, 5], repeat=L)]
    tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([BOS] + y[:-1]) for y in outputs], batch_first=True,
                                             padding_value=PAD)  # causal: trailing padding is harmless
    with torch.no_grad():
        # the log-probability of every output of every source, by teacher forcing
        logp = torch.empty(src.size(0), len(outputs), dtype=torch.float64)
        for b in range(src.size(0)):
            logits = model(src[b:b + 1].expand(len(outputs), -1), tgt_in)
            logits[..., [PAD, BOS]] = float("-inf")
            table = torch.log_softmax(logits, dim=-1)
            for j, y in enumerate(outputs):
                logp[b, j] = table[j, torch.arange(len(y)), y].sum()
    for alpha in (0.0, 0.6, 1.5):
        lp = torch.tensor([gnmt_length_penalty(len(y), alpha) for y in outputs], dtype=torch.float64)
        score = logp / lp
        ids, scores = beam_search(model, src, beam_size=len(outputs), max_len=L, bos_id=BOS, eos_id=EOS,
                                  length_penalty=alpha)
        assert ids.dtype == torch.int64 and scores.dtype == torch.float64 and scores.shape == (4,)
        for b in range(src.size(0)):
            j = int(score[b].argmax())
            assert [i for i in ids[b].tolist() if i != PAD] == outputs[j]
            assert abs(scores[b].item() - score[b, j].item()) <= 1e-12


def test_gnmt_length_penalty():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.0) == 1.0
    assert gnmt_length_penalty(7, 1.0) == pytest.approx(2.0)
    t = gnmt_length_penalty(torch.tensor([1, 7]), 1.0)
    assert t.dtype == torch.float64 and t.tolist() == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError, match="gnmt_length_penalty: alpha"):
        gnmt_length_penalty(3, -0.1)
    with pytest.raises(ValueError, match="alpha"):
        gnmt_length_penalty(3, float("nan"))
    with pytest.raises(TypeError, match="alpha must be a number"):
        gnmt_length_penalty(3, "0.6")
    with pytest.raises(TypeError, match="length must be an int"):
        gnmt_length_penalty(3.0, 0.6)


def test_decode_errors():
    model, src = tiny_model(), random_src()
    with pytest.raises(TypeError, match="greedy_decode: model must be an EncoderDecoder"):
        greedy_decode(torch.nn.Linear(2, 2), src, max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="greedy_decode: src must have dtype int64"):
        greedy_decode(model, src.int(), max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="src must be a tensor"):
        greedy_decode(model, src.tolist(), max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="src must be 2-D"):
        greedy_decode(model, src[0], max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="src must not be empty"):
        greedy_decode(model, src[:, :0], max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match=r"max_len .*\[1, 10\].*got max_len=11"):
        greedy_decode(model, src, max_len=11, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="max_len must be an int"):
        greedy_decode(model, src, max_len=3.0, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match=r"eos_id .*\[0, 5\].*got eos_id=6"):
        greedy_decode(model, src, max_len=3, bos_id=BOS, eos_id=6)
    with pytest.raises(ValueError, match="bos_id, eos_id and model.config.pad_id must be distinct"):
        greedy_decode(model, src, max_len=3, bos_id=BOS, eos_id=BOS)
    with pytest.raises(ValueError, match="must be distinct"):
        greedy_decode(model, src, max_len=3, bos_id=PAD, eos_id=EOS)
    with pytest.raises(ValueError, match="greedy_decode: src_key_mask must have shape"):
        greedy_decode(model, src, max_len=3, bos_id=BOS, eos_id=EOS, src_key_mask=src[:, :2] != PAD)
    with pytest.raises(TypeError, match="greedy_decode: src_key_mask must have dtype bool"):
        greedy_decode(model, src, max_len=3, bos_id=BOS, eos_id=EOS, src_key_mask=src.float())
    # beam_search shares these checks and adds its own
    with pytest.raises(ValueError, match="beam_search: max_len"):
        beam_search(model, src, beam_size=2, max_len=0, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="beam_search: beam_size .*>= 1, got beam_size=0"):
        beam_search(model, src, beam_size=0, max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="beam_size must be an int"):
        beam_search(model, src, beam_size=True, max_len=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="beam_search: length_penalty"):
        beam_search(model, src, beam_size=2, max_len=3, bos_id=BOS, eos_id=EOS, length_penalty=-1.0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(model, src, beam_size=2, max_len=3, bos_id=BOS, eos_id=EOS, length_penalty=float("inf"))
