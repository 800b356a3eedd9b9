"""Unit tests for transformer_lib.data (chapter 1, "From text to tensors"). No network access."""

import json
import os
import pathlib
import re

import numpy as np
import pytest
import torch

import transformer_lib
from transformer_lib.data import CharTokenizer, get_batch, load_tiny_shakespeare, train_val_split
from transformer_lib.hub import DATA_ENV, PINNED_FILES

# ---------------------------------------------------------------- the real corpus


@pytest.mark.skipif(not os.environ.get(DATA_ENV), reason=f"{DATA_ENV} is not set (no offline corpus)")
def test_load_tiny_shakespeare_real_corpus():
    text = load_tiny_shakespeare()
    assert len(text) == 1_115_394 and len(text.encode("utf-8")) == 1_115_394
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    assert CharTokenizer.from_text(text).vocab_size == 65


ROOT = pathlib.Path(__file__).resolve().parents[1]


def _figure_ids() -> tuple[str, list[int]]:
    """The string and the ids typed into chapter 1's figure ``text_to_batches`` (read, not imported)."""
    import ast

    tree = ast.parse((ROOT / "tools" / "figures" / "ch01_text_to_tensors.py").read_text(encoding="utf-8"))
    draw = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "text_to_batches")
    found = {t.id: ast.literal_eval(n.value) for n in ast.walk(draw) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and t.id in ("s", "ids")}
    return found["s"], found["ids"]


def test_figure_ids_are_the_ones_chapter_1_asserts():
    """The figure's ids are typed in; chapter 1 asserts its tokenizer gives the same literal list."""
    s, ids = _figure_ids()
    chapter = (ROOT / "book" / "01_text_to_tensors.md").read_text(encoding="utf-8")
    asserted = re.search(r'^assert encode\("First Citizen:"\) == (\[[0-9, ]+\])$', chapter, flags=re.MULTILINE)
    assert s == "First Citizen:" and asserted and json.loads(asserted.group(1)) == ids


@pytest.mark.skipif(not os.environ.get(DATA_ENV), reason=f"{DATA_ENV} is not set (no offline corpus)")
def test_figure_ids_are_the_tokenizers():
    s, ids = _figure_ids()
    assert CharTokenizer.from_text(load_tiny_shakespeare()).encode(s) == ids


def test_load_tiny_shakespeare_paths_of_the_wrong_kind(isolated, tmp_path):
    (tmp_path / "tinyshakespeare.txt").mkdir()  # a directory where the file should be
    with pytest.raises(IsADirectoryError, match="fetch: path points to .*'tinyshakespeare.txt' is a directory"):
        load_tiny_shakespeare(path=tmp_path)
    with pytest.raises(FileNotFoundError, match="fetch: path points to the directory .*no file 'tinyshakespeare.txt'"):
        load_tiny_shakespeare(path=tmp_path / "tinyshakespeare.txt")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Ô Roméo\n".encode("latin-1"))  # not UTF-8: refused by its digest, naming the file
    with pytest.raises(ValueError, match="fetch: checksum mismatch for .*latin1.txt"):
        load_tiny_shakespeare(path=latin1)


def test_load_tiny_shakespeare_rejects_wrong_file(isolated, tmp_path):
    (tmp_path / "tinyshakespeare.txt").write_bytes(b"To be, or not to be: that is the question.\n")
    with pytest.raises(ValueError, match=PINNED_FILES["tinyshakespeare.txt"].sha256):
        load_tiny_shakespeare(path=tmp_path)



# ---------------------------------------------------------------- CharTokenizer


def test_from_text_sorts_by_code_point():
    tok = CharTokenizer.from_text("hello world\n")
    assert tok.chars == ("\n", " ", "d", "e", "h", "l", "o", "r", "w")
    assert tok.vocab_size == len(tok) == 9
    assert CharTokenizer.from_text("dlrow olleh\n").chars == tok.chars  # order of the text is irrelevant
    assert dict(tok.stoi) == {c: i for i, c in enumerate(tok.chars)}
    assert tok.itos[4] == "h"


def test_encode_decode_hand_computed():
    tok = CharTokenizer.from_text("hello")  # e=0, h=1, l=2, o=3
    assert tok.encode("hole") == [1, 3, 2, 0]
    assert tok.encode("") == []
    assert tok.decode([1, 0, 2, 2, 3]) == "hello"
    assert tok.decode([]) == ""


def test_explicit_vocabulary_order_is_kept():
    tok = CharTokenizer(["z", "a", "\n"])
    assert tok.encode("a\nz") == [1, 2, 0]
    assert CharTokenizer("cab").encode("abc") == [1, 2, 0]


def test_round_trip():
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text


def test_decode_accepts_numpy_and_tensors():
    tok = CharTokenizer.from_text("hello")
    for ids in (
        np.array([1, 0, 2, 2, 3]),
        np.array([1, 0, 2, 2, 3], dtype=np.uint8),
        torch.tensor([1, 0, 2, 2, 3]),
        torch.tensor([1, 0, 2, 2, 3], dtype=torch.int32),
        (1, 0, 2, 2, 3),
        [np.int64(1), 0, 2, 2, 3],
    ):
        assert tok.decode(ids) == "hello"


def test_stoi_is_read_only():
    tok = CharTokenizer.from_text("ab")
    with pytest.raises(TypeError):
        tok.stoi["c"] = 2


def test_repr():
    assert repr(CharTokenizer.from_text("ba")) == "CharTokenizer(vocab_size=2, chars='ab')"


def test_encode_unknown_characters_message():
    tok = CharTokenizer.from_text("abc ")
    with pytest.raises(ValueError) as info:
        tok.encode("ab é c é ☕")
    message = str(info.value)
    assert "text" in message and "vocab_size=4" in message
    assert "3 characters (2 distinct)" in message
    assert "'é' (U+00E9) at positions 3, 7" in message
    assert "'☕' (U+2615) at position 9" in message


def test_encode_unknown_lists_at_most_ten_characters_and_five_positions():
    tok = CharTokenizer.from_text("a")
    with pytest.raises(ValueError) as info:
        tok.encode("bbbbbbb" + "cdefghijklmnop")
    message = str(info.value)
    assert "'b' (U+0062) at positions 0, 1, 2, 3, 4, ..." in message
    assert "(15 distinct)" in message and "and 5 more distinct characters" in message
    assert "'k'" in message and "'l'" not in message  # b, c, ..., k are the first ten


def test_encode_rejects_non_string():
    with pytest.raises(TypeError, match="text must be a str"):
        CharTokenizer.from_text("ab").encode(["a"])


def test_decode_out_of_range_ids():
    tok = CharTokenizer.from_text("hello")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 4\).*2 out-of-range ids: 7 at position 1, -1 at position 3"):
        tok.decode([0, 7, 1, -1])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 4\)"):
        tok.decode(torch.tensor([4]))


@pytest.mark.parametrize(
    "ids, exc, pattern",
    [
        ([0.0, 1.0], TypeError, "ids must hold integers"),
        ([True, 0], TypeError, "ids must hold integers"),
        (torch.tensor([0.0, 1.0]), TypeError, r"ids must hold integers.*float32"),
        (np.array([0.5]), TypeError, r"ids must hold integers.*float64"),
        (torch.zeros(2, 3, dtype=torch.long), ValueError, r"ids must be 1-D.*\(2, 3\)"),
        (np.zeros((2, 3), dtype=np.int64), ValueError, r"ids must be 1-D"),
        ("abc", TypeError, "ids must be a list"),
        (5, TypeError, "ids must be a list"),
    ],
)
def test_decode_bad_input(ids, exc, pattern):
    with pytest.raises(exc, match=pattern):
        CharTokenizer.from_text("hello").decode(ids)


def test_constructor_rejects_bad_vocabularies():
    with pytest.raises(ValueError, match=r"duplicates 'a' \(U\+0061\) at positions \[0, 2\]"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match=r"single character, got 'ab' at position 1"):
        CharTokenizer(["x", "ab"])
    with pytest.raises(TypeError, match=r"chars must be strings, got int 3 at position 0"):
        CharTokenizer([3])
    with pytest.raises(ValueError, match="at least one character"):
        CharTokenizer([])


def test_from_text_rejects_empty_and_non_string():
    with pytest.raises(ValueError, match="text must not be empty"):
        CharTokenizer.from_text("")
    with pytest.raises(TypeError, match="text must be a str"):
        CharTokenizer.from_text(b"abc")


# ---------------------------------------------------------------- CharTokenizer.save and load


def test_save_load_round_trip_keeps_ids(tmp_path):
    text = "First Citizen:\nCafé ☕, naïve \"quotes\" and \\ backslash\ttab\r\n"
    tok = CharTokenizer.from_text(text)
    path = tmp_path / "tokenizer.json"
    assert tok.save(path) is None
    loaded = CharTokenizer.load(path)
    assert isinstance(loaded, CharTokenizer)
    assert loaded.chars == tok.chars and loaded.vocab_size == tok.vocab_size
    assert loaded.encode(text) == tok.encode(text) and loaded.decode(tok.encode(text)) == text
    assert CharTokenizer.load(str(path)).chars == tok.chars  # a str path works too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]  # no temporary file left


def test_save_keeps_an_explicit_vocabulary_order(tmp_path):
    tok = CharTokenizer(["z", "a", "\n"])
    tok.save(tmp_path / "t.json")
    assert CharTokenizer.load(tmp_path / "t.json").encode("a\nz") == [1, 2, 0]


def test_save_writes_the_documented_json_format(tmp_path):
    path = tmp_path / "tokenizer.json"
    CharTokenizer.from_text("ba\n").save(path)
    assert CharTokenizer.FORMAT == "transformer_lib.char_tokenizer/1"
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "format": "transformer_lib.char_tokenizer/1",
        "chars": ["\n", "a", "b"],
    }


def test_load_reads_a_file_written_by_hand_in_the_format(tmp_path):
    # The format of transformer_lib.char_tokenizer/1 files written by earlier versions of the CLI.
    path = tmp_path / "tokenizer.json"
    path.write_text('{\n "format": "transformer_lib.char_tokenizer/1",\n "chars": [\n  "b",\n  "a"\n ]\n}\n')
    assert CharTokenizer.load(path).chars == ("b", "a")


def test_save_replaces_an_existing_file_atomically(tmp_path, monkeypatch):
    path = tmp_path / "tokenizer.json"
    CharTokenizer("ab").save(path)
    CharTokenizer("xyz").save(path)
    assert CharTokenizer.load(path).chars == ("x", "y", "z")

    # A failure before the rename leaves the old file whole and no temporary file behind.
    def failing_replace(src, dst):
        raise OSError("no rename")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", failing_replace)
        with pytest.raises(OSError, match="no rename"):
            CharTokenizer("pq").save(path)
    assert CharTokenizer.load(path).chars == ("x", "y", "z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]


def test_save_errors(tmp_path):
    tok = CharTokenizer("ab")
    with pytest.raises(IsADirectoryError, match="CharTokenizer.save: path"):
        tok.save(tmp_path)
    with pytest.raises(FileNotFoundError, match="CharTokenizer.save: .*path.*no such directory"):
        tok.save(tmp_path / "missing" / "tokenizer.json")
    with pytest.raises(TypeError, match="CharTokenizer.save: path"):
        tok.save(3)


def test_load_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="CharTokenizer.load: path.*nowhere.json"):
        CharTokenizer.load(tmp_path / "nowhere.json")
    with pytest.raises(IsADirectoryError, match="CharTokenizer.load: path"):
        CharTokenizer.load(tmp_path)
    with pytest.raises(TypeError, match="CharTokenizer.load: path"):
        CharTokenizer.load(None)


@pytest.mark.parametrize(
    "content, pattern",
    [
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b'{"format": "transformer_lib.char_tokenizer/1", "chars": ["a"', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'["a", "b"]', r"must hold a JSON object .* got a JSON list"),
        (b'{"format": "transformer_lib.bpe/1", "chars": ["a"]}', r"format='transformer_lib.bpe/1'"),
        (b'{"chars": ["a", "b"]}', "format=None"),
        (b'{"format": "transformer_lib.char_tokenizer/1", "chars": "ab"}', "chars of type str"),
        (b'{"format": "transformer_lib.char_tokenizer/1", "chars": ["a", "a"]}', "invalid vocabulary.*duplicates"),
        (b'{"format": "transformer_lib.char_tokenizer/1", "chars": ["a", 1]}', "invalid vocabulary.*strings"),
        (b'{"format": "transformer_lib.char_tokenizer/1", "chars": []}', "invalid vocabulary.*at least one"),
    ],
)
def test_load_rejects_bad_files_naming_the_file(tmp_path, content, pattern):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=pattern) as info:
        CharTokenizer.load(path)
    assert str(info.value).startswith("CharTokenizer.load: ") and str(path) in str(info.value)


def test_top_level_exports_the_data_pipeline():
    for name in ("fetch", "load_tiny_shakespeare", "CharTokenizer", "train_val_split", "get_batch"):
        module = transformer_lib.hub if name == "fetch" else transformer_lib.data
        assert getattr(transformer_lib, name) is getattr(module, name)
        assert name in transformer_lib.__all__


# ---------------------------------------------------------------- train_val_split


def test_train_val_split_sizes_and_contiguity():
    data = torch.arange(1000)
    train, val = train_val_split(data)
    assert (len(train), len(val)) == (900, 100)
    assert torch.equal(torch.cat([train, val]), data)
    train, val = train_val_split(data, val_fraction=0.25)
    assert (len(train), len(val)) == (750, 250)


def test_train_val_split_floor_and_float_error():
    train, val = train_val_split(torch.arange(11), 0.5)
    assert (len(train), len(val)) == (5, 6)  # floor(11 * 0.5) = 5 for training
    train, val = train_val_split(torch.arange(20), 0.9)  # (1 - 0.9) * 20 = 1.999... in floats
    assert (len(train), len(val)) == (2, 18)


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, float("nan")])
def test_train_val_split_rejects_fraction_out_of_range(fraction):
    with pytest.raises(ValueError, match="train_val_split: val_fraction"):
        train_val_split(torch.arange(10), fraction)


def test_train_val_split_other_errors():
    with pytest.raises(ValueError, match="val_fraction=1e-09 leaves 0 tokens in the validation part"):
        train_val_split(torch.arange(5), 1e-9)
    with pytest.raises(ValueError, match="val_fraction=0.9 leaves 0 tokens in the training part"):
        train_val_split(torch.arange(5), 0.9)
    with pytest.raises(ValueError, match=r"data.*\(2, 5\)"):
        train_val_split(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="train_val_split: data"):
        train_val_split([1, 2, 3])
    with pytest.raises(TypeError, match="val_fraction"):
        train_val_split(torch.arange(10), "0.1")


def test_train_val_split_refuses_a_part_shorter_than_one_example():
    # 0.0001 of 1000 tokens is one validation token: no (input, target) pair at all.
    with pytest.raises(ValueError, match=r"train_val_split: val_fraction=0.0001 leaves 1 token in the validation "
                                         r"part of len\(data\)=1000, but each part needs at least 2 tokens"):
        train_val_split(torch.arange(1000), 0.0001)
    with pytest.raises(ValueError, match="leaves 1 token in the training part"):
        train_val_split(torch.arange(1000), 0.999)
    train, val = train_val_split(torch.arange(1000), 0.002)  # two tokens are enough
    assert (len(train), len(val)) == (998, 2)


def test_train_val_split_with_block_size_needs_a_block_in_each_part():
    data = torch.arange(1000)
    train, val = train_val_split(data, 0.1, block_size=99)  # 100 = block_size + 1 validation tokens
    assert (len(train), len(val)) == (900, 100)
    with pytest.raises(ValueError, match=r"leaves 100 tokens in the validation part .*block_size \+ 1 = 101"):
        train_val_split(data, 0.1, block_size=100)
    with pytest.raises(ValueError, match=r"leaves 100 tokens in the training part .*block_size \+ 1 = 201"):
        train_val_split(data, 0.9, block_size=200)
    x, y = get_batch(val, 99, 4)  # the smallest part still holds an example
    assert x.shape == (4, 99)
    with pytest.raises(ValueError, match="train_val_split: block_size must be an int >= 1, got block_size=0"):
        train_val_split(data, 0.1, block_size=0)
    with pytest.raises(TypeError, match="train_val_split: block_size must be an int"):
        train_val_split(data, 0.1, block_size=8.0)


# ---------------------------------------------------------------- get_batch


def test_get_batch_shapes_dtypes_and_shift():
    data = torch.arange(100, dtype=torch.int16)  # any integer dtype; the batch is int64
    x, y = get_batch(data, block_size=8, batch_size=5, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # data[i] == i, so every target is its input plus one
    assert torch.equal(x - x[:, :1], torch.arange(8).expand(5, 8))


def test_get_batch_matches_unfold_reference():
    data = torch.randint(0, 65, (500,), generator=torch.Generator().manual_seed(1))
    B, T = 16, 12
    x, y = get_batch(data, T, B, generator=torch.Generator().manual_seed(1337))
    offsets = torch.randint(len(data) - T, (B,), generator=torch.Generator().manual_seed(1337))
    windows = data.unfold(0, T + 1, 1)[offsets]
    assert torch.equal(x, windows[:, :-1]) and torch.equal(y, windows[:, 1:])


def test_get_batch_offsets_cover_full_range():
    data = torch.arange(12)
    T = 3  # offsets 0 .. 8
    g = torch.Generator().manual_seed(0)
    starts = torch.cat([get_batch(data, T, 64, generator=g)[0][:, 0] for _ in range(20)])
    assert set(starts.tolist()) == set(range(len(data) - T))


def test_get_batch_offsets_are_uniform():
    """Pearson's chi-square over 20 equal bins of offsets drawn through get_batch (19 degrees of freedom)."""
    data = torch.arange(10_000)  # tokens that are their own positions: x[:, 0] is the offset
    T, g = 16, torch.Generator().manual_seed(0)
    offsets = torch.cat([get_batch(data, T, 10_000, generator=g)[0][:, 0] for _ in range(10)])
    assert offsets.min() >= 0 and offsets.max() <= len(data) - T - 1
    observed = torch.bincount(offsets * 20 // (len(data) - T), minlength=20).double()
    expected = len(offsets) / 20
    assert ((observed - expected) ** 2 / expected).sum() < 60  # P(chi2_19 > 60) = 4e-6


def test_get_batch_smallest_data():
    x, y = get_batch(torch.tensor([3, 4]), block_size=1, batch_size=3)
    assert torch.equal(x, torch.full((3, 1), 3)) and torch.equal(y, torch.full((3, 1), 4))


def test_get_batch_determinism():
    data = torch.arange(1000)
    a = get_batch(data, 16, 8, generator=torch.Generator().manual_seed(7))
    b = get_batch(data, 16, 8, generator=torch.Generator().manual_seed(7))
    c = get_batch(data, 16, 8, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_get_batch_device_argument():
    x, y = get_batch(torch.arange(50), 4, 2, device="cpu")
    assert x.device.type == y.device.type == "cpu"
    x, y = get_batch(torch.arange(50), 4, 2, device=torch.device("cpu"))
    assert x.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_get_batch_to_cuda():
    data = torch.arange(1000)
    x, y = get_batch(data, 8, 4, generator=torch.Generator().manual_seed(0), device="cuda")
    assert x.is_cuda and y.is_cuda
    x_cpu, y_cpu = get_batch(data, 8, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x.cpu(), x_cpu) and torch.equal(y.cpu(), y_cpu)


@pytest.mark.parametrize(
    "data, block_size, batch_size, exc, pattern",
    [
        (torch.arange(10), 10, 2, ValueError, r"block_size must be smaller than len\(data\).*block_size=10.*len\(data\)=10"),
        (torch.arange(10), 0, 2, ValueError, "block_size=0"),
        (torch.arange(10), 4, 0, ValueError, "batch_size=0"),
        (torch.arange(10), 4.0, 2, TypeError, "block_size"),
        (torch.arange(10), 4, True, TypeError, "batch_size"),
        (torch.arange(10.0), 4, 2, TypeError, r"data.*float32"),
        (torch.zeros(10, dtype=torch.bool), 4, 2, TypeError, r"data.*bool"),
        (torch.zeros(2, 10, dtype=torch.long), 4, 2, ValueError, r"data.*\(2, 10\)"),
        (list(range(10)), 4, 2, TypeError, "data"),
    ],
)
def test_get_batch_errors(data, block_size, batch_size, exc, pattern):
    with pytest.raises(exc, match="get_batch: .*" + pattern):
        get_batch(data, block_size, batch_size)


def test_get_batch_rejects_bad_generator_and_device():
    with pytest.raises(TypeError, match="get_batch: generator"):
        get_batch(torch.arange(10), 4, 2, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="get_batch: device"):
        get_batch(torch.arange(10), 4, 2, device="gpu0")
    with pytest.raises(TypeError, match="get_batch: device"):
        get_batch(torch.arange(10), 4, 2, device=0.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_get_batch_refuses_a_device_this_machine_lacks():
    with pytest.raises(ValueError, match=r"get_batch: device must be a device of this machine, got device='cuda:0'"):
        get_batch(torch.arange(10), 4, 2, device="cuda:0")


def test_get_batch_accepts_numpy_ints():
    x, y = get_batch(torch.arange(20), np.int64(4), np.int32(3))
    assert x.shape == y.shape == (3, 4)
