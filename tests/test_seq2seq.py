"""Tests of transformer_lib.seq2seq (chapter 11): the number-words task, vocabularies, padded batches,
exact match. The decoding (greedy, beam search) is tested in test_encoder_decoder_decoding.py."""

import pytest
import torch

from transformer_lib.config import Seq2SeqConfig
from transformer_lib.encoder_decoder import EncoderDecoder
from transformer_lib.seq2seq import (
    MAX_NUMBER,
    Seq2SeqVocab,
    exact_match,
    make_batch,
    number_to_words,
    pad_sequences,
    split_words,
)

PAD, BOS, EOS = Seq2SeqVocab.pad_id, Seq2SeqVocab.bos_id, Seq2SeqVocab.eos_id


def tiny_model(seed=0, tgt_vocab_size=6, dtype=torch.float64):
    cfg = Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=tgt_vocab_size, d_model=16, n_head=2,
                        n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=10)
    torch.manual_seed(seed)
    return EncoderDecoder(cfg).to(dtype).eval()


# number_to_words ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n, words", [
    (0, "zero"), (7, "seven"), (13, "thirteen"), (20, "twenty"), (42, "forty-two"), (100, "one hundred"),
    (105, "one hundred and five"), (999, "nine hundred and ninety-nine"), (1000, "one thousand"),
    (1005, "one thousand and five"), (1100, "one thousand, one hundred"), (20_017, "twenty thousand and seventeen"),
    (412_703, "four hundred and twelve thousand, seven hundred and three"),
    (999_999, "nine hundred and ninety-nine thousand, nine hundred and ninety-nine"),
])
def test_number_to_words_known_cases(n, words):
    assert number_to_words(n) == words


def test_number_to_words_is_injective_on_a_range():
    numbers = list(range(0, 3000)) + list(range(MAX_NUMBER - 2000, MAX_NUMBER + 1))
    assert len({number_to_words(n) for n in numbers}) == len(numbers)


def test_number_to_words_errors():
    with pytest.raises(ValueError, match=r"number_to_words: n .*\[0, 999999\].*n=1000000"):
        number_to_words(1_000_000)
    with pytest.raises(ValueError, match="n=-1"):
        number_to_words(-1)
    with pytest.raises(TypeError, match="n must be an int"):
        number_to_words(5.0)
    with pytest.raises(TypeError, match="n must be an int"):
        number_to_words(True)


def test_split_words():
    assert split_words("four hundred and twelve thousand, seventy-three") == [
        "four", "hundred", "and", "twelve", "thousand", ",", "seventy", "-", "three"]
    with pytest.raises(ValueError, match=r"split_words: .*'T' at position 0"):
        split_words("Twelve")
    with pytest.raises(TypeError, match="text must be a str"):
        split_words(["twelve"])


# vocabulary --------------------------------------------------------------------------------------

def test_vocab_round_trip_and_specials():
    v = Seq2SeqVocab(list("0123456789"))
    assert v.vocab_size == len(v) == 13
    assert v.itos[:3] == ("<pad>", "<bos>", "<eos>") and (v.pad_id, v.bos_id, v.eos_id) == (0, 1, 2)
    ids = v.encode("1005", bos=True, eos=True)
    assert ids == [1, 4, 3, 3, 8, 2]
    assert v.decode(ids) == list("1005")
    # decode stops at the first EOS and skips PAD and BOS, for lists and tensors alike
    assert v.decode(torch.tensor([4, 0, 5, 2, 6, 0])) == ["1", "2"]
    assert v.stoi["9"] == 12


def test_vocab_errors():
    v = Seq2SeqVocab(["one", "two"])
    with pytest.raises(ValueError, match=r"symbol 'three' at position 1 is not in the vocabulary"):
        v.encode(["one", "three"])
    with pytest.raises(ValueError, match="special token"):
        v.encode(["<eos>"])
    with pytest.raises(ValueError, match=r"decode: ids\[1\] .*\[0, 4\], got ids\[1\]=7"):
        v.decode([3, 7])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int"):
        v.decode([3.0])
    with pytest.raises(ValueError, match="ids must be 1-D"):
        v.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="ids must have dtype"):
        v.decode(torch.zeros(2))
    with pytest.raises(ValueError, match="must not repeat.*'a'"):
        Seq2SeqVocab(["a", "b", "a"])
    with pytest.raises(ValueError, match="special token"):
        Seq2SeqVocab(["a", "<pad>"])
    with pytest.raises(ValueError, match="at least one symbol"):
        Seq2SeqVocab([])
    with pytest.raises(TypeError, match="single str"):
        Seq2SeqVocab("abc")


# padding and batches -----------------------------------------------------------------------------

def test_pad_sequences():
    out = pad_sequences([[5, 6, 7], [8], []], pad_id=0)
    assert out.dtype == torch.int64 and out.shape == (3, 3)
    assert out.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert pad_sequences([[1]], 9, length=3).tolist() == [[1, 9, 9]]


def test_pad_sequences_errors():
    with pytest.raises(ValueError, match=r"pad_sequences: length .*>= 3, got length=2"):
        pad_sequences([[1, 2, 3]], 0, length=2)
    with pytest.raises(ValueError, match="length.*>= 1"):
        pad_sequences([[], []], 0)
    with pytest.raises(ValueError, match="seqs must hold at least one sequence"):
        pad_sequences([], 0)
    with pytest.raises(TypeError, match="seqs must be a list of lists"):
        pad_sequences("abc", 0)
    with pytest.raises(TypeError, match=r"seqs\[1\] must be a list"):
        pad_sequences([[1], 2], 0)
    with pytest.raises(TypeError, match=r"seqs\[1\]\[0\] must be an int"):
        pad_sequences([[1], [2.0]], 0)
    with pytest.raises(ValueError, match=r"seqs\[0\]\[1\] .*>= 0"):
        pad_sequences([[1, -2]], 0)
    with pytest.raises(ValueError, match="pad_id.*>= 0"):
        pad_sequences([[1]], -1)
    with pytest.raises(TypeError, match="length must be an int"):
        pad_sequences([[1]], 0, length=2.0)


def test_make_batch_shifts_targets():
    src, tgt_in, tgt_out = make_batch([[5, 6], [7]], [[3, 4, 5], [6]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    assert src.tolist() == [[5, 6], [7, 0]]
    assert tgt_in.tolist() == [[1, 3, 4, 5], [1, 6, 0, 0]]
    assert tgt_out.tolist() == [[3, 4, 5, 2], [6, 2, 0, 0]]
    assert tgt_in[0, 1:].tolist() == tgt_out[0, :-1].tolist()  # labels = inputs shifted left


def test_make_batch_errors():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        make_batch([[3], [4]], [[5]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match=r"tgt_seqs\[0\] holds the special id 2"):
        make_batch([[3]], [[5, 2]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="must be distinct"):
        make_batch([[3]], [[5]], pad_id=0, bos_id=0, eos_id=2)
    with pytest.raises(ValueError, match=r"src_seqs\[0\] is empty"):
        make_batch([[]], [[5]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match=r"make_batch: tgt_seqs\[0\]\[0\] must be an int"):
        make_batch([[3]], [["5"]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match="make_batch: eos_id must be an int"):
        make_batch([[3]], [[5]], pad_id=PAD, bos_id=BOS, eos_id=2.0)
    with pytest.raises(ValueError, match="make_batch: pad_id"):
        make_batch([[3]], [[5]], pad_id=-1, bos_id=BOS, eos_id=EOS)


def test_padding_does_not_change_the_logits():
    model = tiny_model()
    src, tgt_in, _ = make_batch([[3, 4, 5, 6, 7], [8, 3]], [[3, 4, 5, 3], [5]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with torch.no_grad():
        batched = model(src, tgt_in, src != PAD, tgt_in != PAD)[1, :2]
        alone = model(src[1:, :2], tgt_in[1:, :2])[0]
    torch.testing.assert_close(batched, alone, atol=1e-12, rtol=0)


# exact match -------------------------------------------------------------------------------------

def test_exact_match():
    assert exact_match(["12", "7", "1005"], ["12", "7", "105"]) == pytest.approx(2 / 3)
    assert exact_match([[1, 2]], [[1, 2]]) == 1.0
    assert exact_match(["1"], ["10"]) == 0.0
    with pytest.raises(ValueError, match="same length, got 1 and 2"):
        exact_match(["1"], ["1", "2"])
    with pytest.raises(TypeError, match="predictions must be a list of outputs"):
        exact_match("12", ["12"])
