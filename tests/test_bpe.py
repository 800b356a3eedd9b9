"""Unit tests for transformer_lib.bpe (chapter 13, "Subword tokens: byte-level BPE"). No network access."""

import json
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib import bpe
from transformer_lib.bpe import (
    GPT2_SPLIT_PATTERN,
    ByteBPETokenizer,
    bytes_to_unicode,
    pretokenize,
    train_bpe,
)
from transformer_lib.data import CharTokenizer

EOT = "<|endoftext|>"
# A small multilingual corpus, so that the merges also join bytes of multi-byte characters.
CORPUS = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune. We'll fight, they've won, I'm here!\n"
    "Ça, élève naïve: déjà vu à Noël, l'été dernier. Über Straßen und Brücken.\n"
    "東京は晴れ、明日は雨。東京の天気。 Здравствуй, мир! Здравствуй!\n"
    "Emoji 🙂🙂 and 👍🏽👍🏽, numbers 1599 and 2024, tabs\tand   spaces.\n"
) * 20


@pytest.fixture(scope="module")
def tok():
    return ByteBPETokenizer.train(CORPUS, 400, special_tokens=[EOT])


def merge_pair(seq, pair, new_id):
    """``seq`` with every non-overlapping occurrence of ``pair``, left to right, replaced by ``new_id``."""
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def naive_train(text, n_merges):
    """The definition: recount every pair of every chunk at every step; ties to the smaller ids."""
    chunks = Counter(pretokenize(text))
    seqs = {c: list(c.encode("utf-8")) for c in chunks}
    vocab = {i: bytes([i]) for i in range(256)}
    ids_of = {v: k for k, v in vocab.items()}
    merges = []
    for _ in range(n_merges):
        counts = Counter()
        for c, f in chunks.items():
            for p in zip(seqs[c], seqs[c][1:]):
                counts[p] += f
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        merged = vocab[pair[0]] + vocab[pair[1]]
        new_id = ids_of.setdefault(merged, len(vocab))
        vocab[new_id] = merged
        merges.append((vocab[pair[0]], vocab[pair[1]]))
        for c, s in seqs.items():
            seqs[c] = merge_pair(s, pair, new_id)
    return merges


# ---------------------------------------------------------------- bytes_to_unicode, pretokenize


def test_bytes_to_unicode_is_gpt2_mapping():
    b2u = bytes_to_unicode()
    assert sorted(b2u) == list(range(256))
    assert len(set(b2u.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in b2u.values())
    assert b2u[ord("A")] == "A" and b2u[ord(" ")] == "Ġ" and b2u[ord("\n")] == "Ċ" and b2u[0] == "Ā"
    assert sum(b2u[b] == chr(b) for b in range(256)) == 188


def test_pretokenize_gpt2_split():
    assert pretokenize("We'll   fight 1599 crowns!! 🙂\n\n") == [
        "We", "'ll", "  ", " fight", " 1599", " crowns", "!!", " 🙂", "\n\n",
    ]


@given(st.text())
def test_pretokenize_covers_any_text(s):
    assert "".join(pretokenize(s)) == s


def test_pretokenize_errors():
    with pytest.raises(TypeError, match="pretokenize: text"):
        pretokenize(b"bytes")
    with pytest.raises(ValueError, match="pattern must match every character.*' ' at position 3"):
        pretokenize("abc def", pattern=r"\p{L}+")
    with pytest.raises(ValueError, match="pattern"):
        pretokenize("abc", pattern="(")
    with pytest.raises(TypeError, match="pattern"):
        pretokenize("abc", pattern=3)


# ---------------------------------------------------------------- training


def test_train_toy_case_by_hand():
    # aaabdaaabac: (a, a) count 4; then (a, b) and (aa, a) tie at 2, smaller ids win; then (aa, ab).
    assert train_bpe("aaabdaaabac", 259) == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab")]


def test_train_matches_naive_recount():
    fast = train_bpe(CORPUS, 256 + 120)
    assert fast == naive_train(CORPUS, len(fast))
    assert len(fast) >= 120


def replay(text, tok):
    """Training's segmentation: every merge of ``tok``, in rank order, applied to every distinct chunk."""
    seqs = {c: [tok.vocab[bytes([b])] for b in c.encode("utf-8")] for c in set(pretokenize(text))}
    for left, right in tok.merges:
        a, b, new_id = tok.vocab[left], tok.vocab[right], tok.vocab[left + right]
        for c, s in seqs.items():
            seqs[c] = merge_pair(s, (a, b), new_id)
    return seqs


def test_encoding_a_training_chunk_reproduces_training(tok):
    assert len({l + r for l, r in tok.merges}) == len(tok.merges)  # every merge made a new token
    assert all(tok.encode(chunk) == seq for chunk, seq in replay(CORPUS, tok).items())


@given(st.lists(st.sampled_from(["a", "b", "aa", "ab", "aab", "bba", "ba", " "]), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_training_never_repeats_a_merge_result_so_encoding_reproduces_it(parts):
    # Runs of one letter are where the left-to-right rule matters: a string still becomes a token once.
    text = "".join(parts)
    merges = train_bpe(text, 256 + 40)
    assert len({l + r for l, r in merges}) == len(merges)
    t = ByteBPETokenizer(merges)
    assert all(t.encode(chunk) == seq for chunk, seq in replay(text, t).items())


def test_a_merge_list_with_a_repeated_result_can_encode_unlike_training():
    # (ab, c) and (a, bc) both spell abc; (abc, d) lies between them. Training leaves abc d, encoding abcd.
    t = ByteBPETokenizer([(b"b", b"c"), (b"a", b"b"), (b"ab", b"c"), (b"abc", b"d"), (b"a", b"bc")])
    assert t.vocab[b"abc"] == 258 and t.encode("abcd") == [259]
    assert replay("abcd", t)["abcd"] == [258, 100]


def test_merges_spelling_an_existing_token_share_its_id():
    # (aa, a) and (a, aa) both spell aaa: one id, 257, for both merges.
    tok = ByteBPETokenizer([(b"a", b"a"), (b"aa", b"a"), (b"a", b"aa")])
    assert tok.vocab_size == 258 and tok.vocab[b"aaa"] == 257
    assert tok.encode("aaa") == [257] and tok.encode("aaaaa") == [256, 257]
    assert tok.decode([257, 256]) == "aaaaa"


def test_train_vocab_size_and_specials():
    merges = train_bpe(CORPUS + EOT + CORPUS, 300, special_tokens=[EOT])
    assert len({l + r for l, r in merges}) == 300 - 256 - 1
    assert not any(b"<|" in l + r or b"|>" in l + r for l, r in merges)  # nothing learned across EOT
    tok = ByteBPETokenizer(merges, special_tokens=[EOT])
    assert tok.vocab_size == 300 and tok.special_tokens[EOT] == 299


def test_train_is_a_prefix_of_longer_training():
    short, long = train_bpe(CORPUS, 300), train_bpe(CORPUS, 400)
    assert long[: len(short)] == short


def test_train_stops_when_no_pairs_left():
    merges = train_bpe("ab ab", 1000)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]


def test_train_errors():
    with pytest.raises(TypeError, match="train_bpe: text"):
        train_bpe(None, 300)
    with pytest.raises(TypeError, match="train_bpe: vocab_size"):
        train_bpe("abc", 300.0)
    with pytest.raises(ValueError, match=r"train_bpe: vocab_size .*>= 257.*vocab_size=256"):
        train_bpe("abc", 256, special_tokens=[EOT])  # 256 bytes + 1 special token
    with pytest.raises(TypeError, match="special_tokens"):
        train_bpe("abc", 300, special_tokens=EOT)
    with pytest.raises(ValueError, match="special_tokens must not repeat"):
        train_bpe("abc", 300, special_tokens=[EOT, EOT])
    with pytest.raises(ValueError, match="special_tokens must hold non-empty strings"):
        train_bpe("abc", 300, special_tokens=[""])
    with pytest.raises(ValueError, match=r"train_bpe: text must hold only characters that UTF-8 can encode .*"
                                         r"lone surrogate '\\udc80' \(U\+DC80\) at position 4"):
        train_bpe("abc \udc80 d", 300)
    with pytest.raises(ValueError, match=r"train_bpe: special_tokens\[1\] must hold only characters that UTF-8"):
        train_bpe("abc", 300, special_tokens=[EOT, "<\ud800>"])


# ---------------------------------------------------------------- encoding, decoding


def test_encode_toy_case_by_hand():
    tok = ByteBPETokenizer([(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab")])
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert tok.vocab_size == 259


def test_merges_apply_in_rank_order():
    # "abc" with (a, b) first -> ab c; with (b, c) first -> a bc. Ids follow the merges.
    assert ByteBPETokenizer([(b"a", b"b"), (b"b", b"c")]).encode("abc") == [256, 99]
    assert ByteBPETokenizer([(b"b", b"c"), (b"a", b"b")]).encode("abc") == [97, 256]
    # Left to right on overlaps: aaa -> aa a; aaaa -> aa aa; then (aa, aa) merges.
    tok = ByteBPETokenizer([(b"a", b"a"), (b"aa", b"aa")])
    assert tok.encode("aaa") == [256, 97] and tok.encode("aaaa") == [257] and tok.encode("aaaaa") == [257, 97]


def test_merges_never_cross_chunks():
    tok = ByteBPETokenizer([(b"a", b" "), (b" ", b"b")])
    assert tok.encode("a b") == [97, 257]  # chunks "a", " b": the pair (a, space) is never adjacent


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(tok, s):
    ids = tok.encode(s, disallowed_special=())
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == s


@settings(max_examples=50, deadline=None)
@given(st.text(), st.text())
def test_round_trip_with_special_token(tok, a, b):
    text = a + EOT + b
    ids = tok.encode(text, allowed_special="all")
    assert tok.special_tokens[EOT] in ids
    assert tok.decode(ids) == text


def test_encode_is_compressive_on_training_text(tok):
    assert len(tok.encode(CORPUS)) < 0.5 * len(CORPUS.encode("utf-8"))


def test_special_tokens(tok):
    eot = tok.special_tokens[EOT]
    assert eot == tok.vocab_size - 1
    assert tok.encode(f"a{EOT}b", allowed_special={EOT}) == [*tok.encode("a"), eot, *tok.encode("b")]
    assert tok.encode(f"a{EOT}b", allowed_special="all") == [*tok.encode("a"), eot, *tok.encode("b")]
    plain = tok.encode(f"a{EOT}b", disallowed_special=())
    assert eot not in plain and tok.decode(plain) == f"a{EOT}b"
    with pytest.raises(ValueError, match=r"special token '<\|endoftext\|>' at position 1, which is not allowed"):
        tok.encode(f"a{EOT}b")
    with pytest.raises(ValueError, match="allowed_special holds '<|eot|>', which is not a special token"):
        tok.encode("a", allowed_special={"<|eot|>"})
    with pytest.raises(TypeError, match="allowed_special"):
        tok.encode("a", allowed_special=EOT)


def test_longer_special_token_wins():
    tok = ByteBPETokenizer([], special_tokens=["<|end|>", "<|endoftext|>"])
    assert tok.encode("x<|endoftext|>", allowed_special="all") == [ord("x"), 257]


def test_decode_accepts_arrays_and_tensors(tok):
    ids = tok.encode("To be, or not to be")
    expected = tok.decode(ids)
    assert tok.decode(np.array(ids)) == expected == tok.decode(torch.tensor(ids)) == tok.decode(tuple(ids))


def test_decode_invalid_ids(tok):
    v = tok.vocab_size
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {v - 1}\] .* got 1 invalid id: {v} at position 1"):
        tok.decode([65, v])
    with pytest.raises(ValueError, match=r"-1 at position 0"):
        tok.decode([-1])
    with pytest.raises(TypeError, match=r"ids.*1\.5"):
        tok.decode([65, 1.5])
    with pytest.raises(TypeError, match="ids"):
        tok.decode("65")
    with pytest.raises(ValueError, match="decode: errors .*'bogus'"):
        tok.decode([65], errors="bogus")
    with pytest.raises(ValueError, match="decode: errors"):
        tok.decode([65], errors=None)
    with pytest.raises(ValueError, match="ids must be 1-D"):
        tok.decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="ids must be 1-D"):
        tok.decode(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match=r"ids\[0\]=1\.0"):
        tok.decode(torch.tensor([1.0]))
    with pytest.raises(TypeError, match=r"ids\[0\]=True"):
        tok.decode(np.array([True]))
    with pytest.raises(ValueError, match=rf"{10**30} at position 0"):
        tok.decode([10**30])
    assert tok.decode([np.int64(65), 66]) == "AB"  # NumPy integers in a list are integers


def test_decode_partial_utf8_uses_replacement_character(tok):
    ids = ByteBPETokenizer([]).encode("é")  # two byte tokens
    assert tok.decode(ids[:1]) == "\ufffd" and tok.decode_bytes(ids[:1]) == b"\xc3"
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")


def test_encode_errors(tok):
    with pytest.raises(TypeError, match="encode: text"):
        tok.encode(b"abc")


@pytest.mark.parametrize("text, position", [("a\ud800b", 1), ("\udfff", 0), ("hello world \ud83d", 12)])
def test_encode_refuses_a_lone_surrogate_naming_its_position(tok, text, position):
    """Python strings may hold half of a UTF-16 pair, which has no UTF-8 bytes (UnicodeEncodeError before)."""
    c = text[position]
    with pytest.raises(ValueError, match=rf"ByteBPETokenizer.encode: text must hold only characters that UTF-8 can "
                                         rf"encode .*U\+{ord(c):04X}\) at position {position}"):
        tok.encode(text)
    with pytest.raises(ValueError, match=rf"at position {position + len(EOT)}"):
        tok.encode(EOT + text, allowed_special="all")
    assert tok.encode("a\U0001F600b") == tok.encode("a😀b")  # a proper pair is one character


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"merges\[0\] .* uses b'ab', which is not a token before this merge"):
        ByteBPETokenizer([(b"ab", b"c"), (b"a", b"b")])
    with pytest.raises(ValueError, match=r"merges\[1\] .* repeats merges\[0\]"):
        ByteBPETokenizer([(b"a", b"b"), (b"a", b"b")])
    with pytest.raises(TypeError, match=r"merges\[0\] must be a pair of bytes"):
        ByteBPETokenizer([("a", "b")])
    vocab = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match=r"merges\[0\] .* uses b'xy', which is not a token .*any merge"):
        ByteBPETokenizer([(b"xy", b"c")], vocab=vocab)
    with pytest.raises(ValueError, match="vocab must hold exactly .* it lacks 1: b'ab'"):
        ByteBPETokenizer([(b"a", b"b")], vocab=vocab)
    with pytest.raises(ValueError, match="it has 1 others: b'zz'"):
        ByteBPETokenizer([], vocab={**vocab, b"zz": 256})
    with pytest.raises(ValueError, match="token ids must be exactly 0..256"):
        ByteBPETokenizer([(b"a", b"b")], vocab={**vocab, b"ab": 300})
    with pytest.raises(ValueError, match="id 256 is given to two tokens"):
        ByteBPETokenizer([(b"a", b"b")], vocab={**vocab, b"ab": 256}, special_tokens={EOT: 256})
    with pytest.raises(TypeError, match=r"vocab\[b'ab'\]"):
        ByteBPETokenizer([(b"a", b"b")], vocab={**vocab, b"ab": "256"})
    with pytest.raises(ValueError, match=r"vocab\[b'ab'\]"):
        ByteBPETokenizer([(b"a", b"b")], vocab={**vocab, b"ab": -1})
    with pytest.raises(TypeError, match="vocab"):
        ByteBPETokenizer([(b"a", b"b")], vocab={**vocab, "ab": 256})
    with pytest.raises(TypeError, match=r"special_tokens\['<\|endoftext\|>'\]"):
        ByteBPETokenizer([], special_tokens={EOT: 256.0})


def test_explicit_vocab_layout():
    # Bytes in reverse order, the merge at 0, the special token in the middle.
    vocab = {bytes([b]): 257 - b for b in range(256)}
    vocab[b"ab"] = 0
    tok = ByteBPETokenizer([(b"a", b"b")], vocab=vocab, special_tokens={EOT: 1})
    assert tok.encode(f"abc{EOT}", allowed_special="all") == [0, 257 - ord("c"), 1]
    assert tok.decode([0, 257 - ord("c"), 1]) == f"abc{EOT}"


# ---------------------------------------------------------------- files


def test_save_load_round_trip(tok, tmp_path):
    vocab_path, merges_path = tok.save(tmp_path / "out")
    lines = merges_path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2" and len(lines) == 1 + len(tok.merges)
    table = json.loads(vocab_path.read_text(encoding="utf-8"))
    assert table[EOT] == tok.special_tokens[EOT] and table["Ġ"] == ord(" ")
    loaded = ByteBPETokenizer.load(tmp_path / "out")
    assert loaded.merges == tok.merges and dict(loaded.vocab) == dict(tok.vocab)
    assert dict(loaded.special_tokens) == dict(tok.special_tokens)
    text = CORPUS[:500] + EOT + "unseen: ñ 😀 漢字"
    assert loaded.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")


def test_from_gpt2_files_errors(tok, tmp_path):
    vocab_path, merges_path = tok.save(tmp_path)
    merges_path.write_text("#version: 0.2\nĠ t\nthree parts here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 of .*merges.txt must be two tokens"):
        ByteBPETokenizer.from_gpt2_files(vocab_path, merges_path)
    merges_path.write_text("#version: 0.2\nĠ t\n", encoding="utf-8")
    vocab_path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not valid JSON"):
        ByteBPETokenizer.from_gpt2_files(vocab_path, merges_path)
    with pytest.raises(FileNotFoundError, match="path"):
        ByteBPETokenizer.load(tmp_path / "missing")
    with pytest.raises(NotADirectoryError, match="path"):
        ByteBPETokenizer.load(vocab_path)
    with pytest.raises(FileNotFoundError, match="merges_txt"):
        ByteBPETokenizer.from_gpt2_files(vocab_path, tmp_path / "missing.txt")
    with pytest.raises(TypeError, match="vocab_json"):
        ByteBPETokenizer.from_gpt2_files(3, merges_path)


def test_files_that_are_not_utf8_or_not_files_name_the_file(tok, tmp_path):
    vocab_path, merges_path = tok.save(tmp_path / "tok")
    good_vocab, good_merges = vocab_path.read_bytes(), merges_path.read_bytes()
    merges_path.write_bytes(good_merges.replace("Ġ".encode(), b"\xc4", 1))  # a cut UTF-8 sequence
    with pytest.raises(ValueError, match=r"ByteBPETokenizer.from_gpt2_files: .*tok/merges.txt is not UTF-8 text"):
        ByteBPETokenizer.load(tmp_path / "tok")
    merges_path.write_bytes(good_merges)
    vocab_path.write_bytes(b"\xff\xfe" + good_vocab)
    with pytest.raises(ValueError, match=r"ByteBPETokenizer.from_gpt2_files: .*tok/vocab.json is not UTF-8 text"):
        ByteBPETokenizer.load(tmp_path / "tok")
    vocab_path.write_text(json.dumps({"!": "zero"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"from_gpt2_files: .*vocab.json and .*merges.txt do not make a tokenizer: "
                                         r".*must be an int"):
        ByteBPETokenizer.load(tmp_path / "tok")
    vocab_path.unlink()
    vocab_path.mkdir()
    with pytest.raises(IsADirectoryError, match=r"from_gpt2_files: vocab_json must be a file, got the directory .*vocab.json"):
        ByteBPETokenizer.load(tmp_path / "tok")


def test_save_errors_and_atomic_files(tok, tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="ByteBPETokenizer.save: path"):
        tok.save(tmp_path / "a_file")
    with pytest.raises(TypeError, match="ByteBPETokenizer.save: path"):
        tok.save(None)
    tok.save(tmp_path / "out")
    tok.save(tmp_path / "out")  # replaces the files, leaves no temporary file behind
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["merges.txt", "vocab.json"]


@pytest.mark.parametrize("make", [lambda: ByteBPETokenizer.train(CORPUS, 300, special_tokens=[EOT]),
                                  lambda: CharTokenizer.from_text(CORPUS)])
def test_tokenizer_contract(make, tmp_path):
    # ByteBPETokenizer and CharTokenizer share encode, decode, save(path), classmethod load(path), vocab_size.
    tok = make()
    assert isinstance(tok.vocab_size, int) and tok.vocab_size > 0
    ids = tok.encode(CORPUS[:300])
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == CORPUS[:300]
    path = tmp_path / "tokenizer"
    tok.save(path)
    loaded = type(tok).load(path)
    assert loaded.vocab_size == tok.vocab_size and loaded.encode(CORPUS[:300]) == ids


def test_save_rejects_special_spelled_like_a_token(tmp_path):
    tok = ByteBPETokenizer([], special_tokens=["Ġ"])
    with pytest.raises(ValueError, match="spelled like regular tokens"):
        tok.save(tmp_path)


# ---------------------------------------------------------------- Hugging Face as the reference

SAMPLES = [
    CORPUS[:2000],
    "Ça, élève naïve — déjà vu; Straße",
    "Emoji 🙂👍🏽 family 👩‍👩‍👧 flag 🇫🇷",
    "東京は晴れ、明日は雨。한국어 텍스트",
    "whitespace   runs\t\t\n\n\n   and trailing   ",
    "WE'LL we'll it's IT'S 'tis",
    "numbers 3.14159 and 1,000,000 and ٣٤٥",
]


@pytest.fixture(scope="module")
def hf_from_our_files(tok, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("ours")
    tok.save(directory)
    try:
        return transformers.GPT2Tokenizer.from_pretrained(directory)
    except OSError as err:  # e.g. a transformers version that cannot build it offline
        pytest.skip(f"transformers.GPT2Tokenizer cannot be built from local files here: {err}")


@pytest.mark.parametrize("text", SAMPLES)
def test_agrees_with_hf_on_our_files(tok, hf_from_our_files, text):
    assert tok.encode(text) == hf_from_our_files.encode(text, add_special_tokens=False)


def test_agrees_with_hf_with_special_token(tok, hf_from_our_files):
    text = f"first{EOT} second"
    assert tok.encode(text, allowed_special="all") == hf_from_our_files.encode(text, add_special_tokens=False)


# Characters assigned in Python's Unicode database: the regex engines of `regex` and of Hugging Face
# (Oniguruma) may classify characters added to Unicode later differently.
ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=ASSIGNED))
def test_agrees_with_hf_on_random_text(tok, hf_from_our_files, s):
    assert all(unicodedata.category(c) != "Cn" for c in s)
    assert tok.encode(s, disallowed_special=()) == hf_from_our_files.encode(s, add_special_tokens=False)


def test_reads_files_written_by_hf_trainer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.ByteLevelBPETokenizer()
    hf.train_from_iterator([CORPUS], vocab_size=350, special_tokens=[EOT], show_progress=False)
    vocab_path, merges_path = hf.save_model(str(tmp_path))
    ours = ByteBPETokenizer.from_gpt2_files(vocab_path, merges_path)
    assert ours.special_tokens[EOT] == 0 and ours.vocab_size == hf.get_vocab_size()
    for text in SAMPLES:
        assert ours.encode(text) == hf.encode(text).ids


def test_gpt2_split_pattern_and_no_model_import():
    assert "transformer_lib.gpt2" not in Path(bpe.__file__).read_text(encoding="utf-8")  # the tokenizer needs no model
    assert GPT2_SPLIT_PATTERN.startswith("'s|'t|'re|'ve|'m|'ll|'d")
