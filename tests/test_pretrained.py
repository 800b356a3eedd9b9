"""Unit tests for transformer_lib.pretrained: the shipped model, its pinned files, load_book_model (chapter 10);
load_gpt2_tokenizer on local files (chapter 13); load_tokenizer_json against the tokenizers library and the pins
of SmolLM2 (chapter 17). No network access."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import transformer_lib
from transformer_lib import pretrained
from transformer_lib.config import GPTConfig
from transformer_lib.config import TrainConfig
from transformer_lib.data import CharTokenizer, load_tiny_shakespeare, train_val_split
from transformer_lib.evaluate import evaluate_split
from transformer_lib.gpt import GPT
from transformer_lib.bpe import ByteBPETokenizer
from transformer_lib.hub import (
    BRANCH,
    CACHE_ENV,
    DATA_ENV,
    GPT2_REVISION,
    MODELS_PATH,
    PINNED_FILES,
    REPOSITORY_URL,
    SMOLLM2_REPO,
    SMOLLM2_REVISION,
    book_model_url,
    sha256sum,
)
from transformer_lib.pretrained import (
    BOOK_MODELS,
    DIGITS_SPLIT_PATTERN,
    GPT2_END_OF_TEXT,
    SMOLLM2_FILES,
    book_model_dir,
    load_book_model,
    load_gpt2_tokenizer,
    load_tokenizer_json,
)

ROOT = Path(__file__).resolve().parents[1]
NAME = "shakespeare-baby"
SHIPPED = ROOT / MODELS_PATH / NAME


def pins(name: str) -> dict[str, str]:
    """File name -> pinned SHA-256 of every file of a shipped model."""
    return {filename: PINNED_FILES[f"models/{name}/{filename}"].sha256 for filename in BOOK_MODELS[name]}


def serve_from(monkeypatch, url):
    """Point the pinned URL of every file of the model NAME at ``url(filename)``."""
    for filename in BOOK_MODELS[NAME]:
        key = f"models/{NAME}/{filename}"
        monkeypatch.setitem(PINNED_FILES, key, PINNED_FILES[key]._replace(url=url(filename)))


@pytest.fixture(scope="module")
def shipped():
    """The shipped model and tokenizer, read from the checkout once."""
    return load_book_model(NAME)


@pytest.fixture
def copy(tmp_path):
    """A copy of the shipped model's directory."""
    target = tmp_path / NAME
    shutil.copytree(SHIPPED, target)
    return target


def test_top_level():
    assert transformer_lib.load_book_model is load_book_model


def test_repository_is_the_books():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert (REPOSITORY_URL, BRANCH) == (config["url"].rstrip("/"), config["branch"])
    assert book_model_url(NAME, "config.json") == (
        "https://raw.githubusercontent.com/transformers-from-scratch/transformers-from-scratch/main/"
        "book/models/shakespeare-baby/config.json")


@pytest.mark.parametrize("name", sorted(BOOK_MODELS))
def test_committed_files_match_the_pins(name):
    directory = ROOT / MODELS_PATH / name
    assert sorted(p.name for p in directory.iterdir()) == sorted(BOOK_MODELS[name])
    for filename, digest in pins(name).items():
        assert sha256sum(directory / filename) == digest, filename
        assert PINNED_FILES[f"models/{name}/{filename}"].url == book_model_url(name, filename)


def test_provenance_describes_the_shipped_files():
    provenance = json.loads((SHIPPED / "provenance.json").read_text(encoding="utf-8"))
    assert provenance["files_sha256"] == {k: v for k, v in pins(NAME).items() if k != "provenance.json"}
    assert provenance["steps"] == 6000 and provenance["init_seed"] == 0
    # Chapter 10's recipe; only the step count, the logging intervals and the device are set.
    assert TrainConfig.from_dict(provenance["train_config"]) == TrainConfig.from_preset(
        "shakespeare-baby", max_steps=6000, eval_interval=750, checkpoint_interval=6000, eval_iters=10,
        device="cpu", precision="float32")
    assert 1.0 < provenance["whole_validation_loss"] < 1.72  # it meets chapter 10's target


def test_loads_from_the_checkout(shipped):
    model, tok = shipped
    assert book_model_dir(NAME) == SHIPPED.resolve()
    assert isinstance(model, GPT) and not model.training
    assert model.config == GPTConfig.from_preset("baby", vocab_size=65)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    assert model.lm_head.weight is model.wte.weight  # tied, as GPT builds it
    assert isinstance(tok, CharTokenizer) and tok.vocab_size == 65
    assert tok.chars == CharTokenizer.from_text(load_tiny_shakespeare()).chars


def test_loads_from_an_explicit_path(shipped, copy):
    model, tok = load_book_model(NAME, path=copy)
    assert book_model_dir(NAME, path=copy) == copy
    reference = shipped[0].state_dict()
    assert all(torch.equal(t, reference[k]) for k, t in model.state_dict().items())
    assert tok.chars == shipped[1].chars


@pytest.mark.parametrize("filename", sorted(BOOK_MODELS[NAME]))
def test_a_modified_file_is_refused(copy, filename):
    file = copy / filename
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the tensors' bytes for the weights
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"load_book_model: .*{filename} is not the shipped file.*SHA-256"):
        load_book_model(NAME, path=copy)


def test_a_missing_file_is_refused(copy):
    (copy / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"load_book_model: .*tokenizer.json is missing"):
        load_book_model(NAME, path=copy)


@pytest.mark.parametrize("name, error", [("shakespeare-large", ValueError), ("", ValueError), (3, TypeError)])
def test_an_unknown_name_is_refused(name, error):
    with pytest.raises(error, match="load_book_model: name"):
        load_book_model(name)


def test_bad_path_and_device(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_book_model: path"):
        load_book_model(NAME, path=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="load_book_model: device"):
        load_book_model(NAME, device="cuda:99")


def test_reads_the_data_directory_without_a_checkout(tmp_path, monkeypatch, shipped):
    monkeypatch.setattr(pretrained, "_checkout_dir", lambda name: tmp_path / "no-clone" / name)
    data = tmp_path / "data"
    shutil.copytree(SHIPPED, data / "models" / NAME)
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(data))
    assert book_model_dir(NAME) == data / "models" / NAME
    assert torch.equal(load_book_model(NAME)[0].wte.weight, shipped[0].wte.weight)


def test_a_data_directory_without_the_model_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_checkout_dir", lambda name: tmp_path / "no-clone" / name)
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"load_book_model: .*TRANSFORMER_LIB_DATA/models/shakespeare-baby/"):
        load_book_model(NAME)


def test_downloads_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_checkout_dir", lambda name: tmp_path / "no-clone" / name)
    monkeypatch.delenv("TRANSFORMER_LIB_DATA", raising=False)
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "cache"))
    serve_from(monkeypatch, lambda filename: (SHIPPED / filename).as_uri())
    assert book_model_dir(NAME) == tmp_path / "cache" / "models" / NAME
    assert sorted(p.name for p in (tmp_path / "cache" / "models" / NAME).iterdir()) == sorted(BOOK_MODELS[NAME])
    # The second time the cache is read: a download would fail now.
    serve_from(monkeypatch, lambda filename: "http://127.0.0.1:9/unreachable")
    load_book_model(NAME)


def test_a_download_of_another_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_checkout_dir", lambda name: tmp_path / "no-clone" / name)
    monkeypatch.delenv("TRANSFORMER_LIB_DATA", raising=False)
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "cache"))
    serve_from(monkeypatch, lambda filename: (SHIPPED / "config.json").as_uri())
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_book_model(NAME)


def test_offline_without_a_copy_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "_checkout_dir", lambda name: tmp_path / "no-clone" / name)
    monkeypatch.delenv("TRANSFORMER_LIB_DATA", raising=False)
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "cache"))
    serve_from(monkeypatch, lambda filename: "http://127.0.0.1:9/unreachable")
    with pytest.raises(ConnectionError, match=r"load_book_model: .*could not be downloaded.*offline.*path="):
        load_book_model(NAME)


@pytest.mark.slow  # the whole validation split: 15 s on a busy 2-core machine
def test_logits_are_finite_and_the_loss_is_the_recorded_one(shipped):
    model, tok = shipped
    text = load_tiny_shakespeare()
    _, val_data = train_val_split(torch.tensor(tok.encode(text), dtype=torch.long), 0.1)
    with torch.no_grad():
        logits = model(val_data[:4 * 64].view(4, 64))[0]
    assert logits.shape == (4, 64, 65) and torch.isfinite(logits).all()
    provenance = json.loads((SHIPPED / "provenance.json").read_text(encoding="utf-8"))
    loss = evaluate_split(model, val_data, block_size=64)
    assert math.isclose(loss, provenance["whole_validation_loss"], abs_tol=1e-4)


# ---------------------------------------------------------------- load_gpt2_tokenizer (chapter 13, no network)
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok():
    """A small byte-level BPE, saved under GPT-2's file names by ``gpt2_like_files``."""
    corpus = "To be, or not to be, that is the question: été, naïve, 東京 and 42 others.\n" * 8
    return ByteBPETokenizer.train(corpus, 300, special_tokens=[EOT])


@pytest.fixture
def gpt2_like_files(tok, tmp_path, monkeypatch):
    """Our tokenizer's files under GPT-2's file names, no data override, a cache that must stay unused."""
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    vocab_path, merges_path = tok.save(tmp_path / "tmp")
    directory = tmp_path / "gpt2"
    directory.mkdir()
    (directory / "gpt2-vocab.json").write_bytes(vocab_path.read_bytes())
    (directory / "gpt2-merges.txt").write_bytes(merges_path.read_bytes())
    return directory


def test_load_gpt2_tokenizer_from_local_path(tok, gpt2_like_files, monkeypatch):
    digest = lambda name: hashlib.sha256((gpt2_like_files / name).read_bytes()).hexdigest()
    for name in ("gpt2-vocab.json", "gpt2-merges.txt"):
        monkeypatch.setitem(PINNED_FILES, name, PINNED_FILES[name]._replace(sha256=digest(name)))
    loaded = load_gpt2_tokenizer(gpt2_like_files)
    assert loaded.merges == tok.merges and dict(loaded.special_tokens) == dict(tok.special_tokens)
    assert loaded.encode("To be, or not to be: été 42") == tok.encode("To be, or not to be: été 42")


def test_load_gpt2_tokenizer_checksum_mismatch(gpt2_like_files):
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_gpt2_tokenizer(gpt2_like_files)


def test_load_gpt2_tokenizer_path_errors(gpt2_like_files, tmp_path):
    with pytest.raises(NotADirectoryError, match="load_gpt2_tokenizer: path"):
        load_gpt2_tokenizer(gpt2_like_files / "gpt2-vocab.json")
    with pytest.raises(FileNotFoundError, match="load_gpt2_tokenizer: path"):
        load_gpt2_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="gpt2-vocab.json"):
        load_gpt2_tokenizer(tmp_path / "empty")
    with pytest.raises(TypeError, match="load_gpt2_tokenizer: path"):
        load_gpt2_tokenizer(42)
    (tmp_path / "dirs" / "gpt2-vocab.json").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match="fetch: path points to .*'gpt2-vocab.json' is a directory"):
        load_gpt2_tokenizer(tmp_path / "dirs")
    (gpt2_like_files / "gpt2-merges.txt").write_bytes(b"\xff\xfe not UTF-8")
    with pytest.raises(ValueError, match="fetch: checksum mismatch for .*gpt2-"):  # a wrong file never gets parsed
        load_gpt2_tokenizer(gpt2_like_files)



def test_gpt2_tokenizer_pins():
    assert GPT2_END_OF_TEXT == EOT
    vocab, merges = PINNED_FILES["gpt2-vocab.json"], PINNED_FILES["gpt2-merges.txt"]
    assert vocab.url.endswith("/vocab.json") and merges.url.endswith("/merges.txt")
    assert vocab.revision == merges.revision == GPT2_REVISION  # the revision of the weights


# ---------------------------------------------------------------- tokenizer.json and SmolLM2 (chapter 17)
def test_tokenizer_json_against_tokenizers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = ["the quick brown fox jumps over the lazy dog " * 20, " ".join(str(n) for n in range(0, 5000, 3))]
    text = "The  fox 2024 jumped  12 times,\n\n  over 7 dogs — été 3.14 <|endoftext|> end"
    for digits in (False, True):
        tok = Tokenizer(models.BPE())
        bl = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl]) if digits else bl
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                            show_progress=False))
        path = tmp_path / f"tokenizer{digits}.json"
        tok.save(str(path))
        ours = load_tokenizer_json(path)
        assert ours.encode(text, allowed_special="all") == tok.encode(text, add_special_tokens=False).ids
        assert (ours.pattern == DIGITS_SPLIT_PATTERN) == digits


def test_tokenizer_json_refusals(tmp_path):
    base = {"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
    for change, field in (({"normalizer": {"type": "NFC"}}, "normalizer"),
                          ({"model": {**base["model"], "byte_fallback": True}}, "byte_fallback"),
                          ({"model": {**base["model"], "ignore_merges": True}}, "ignore_merges"),
                          ({"pre_tokenizer": {"type": "Metaspace"}}, "pre_tokenizer")):
        path = tmp_path / "t.json"
        path.write_text(json.dumps({**base, **change}))
        with pytest.raises(ValueError, match=field):
            load_tokenizer_json(path)


def test_smollm2_pins_are_digests():
    assert set(SMOLLM2_FILES) == {"config.json", "tokenizer.json", "model.safetensors"}
    pins = [PINNED_FILES[f"models/SmolLM2-135M/{name}"] for name in SMOLLM2_FILES]
    assert all(len(p.sha256) == 64 and int(p.sha256, 16) >= 0 for p in pins)
    assert all(p.url.startswith(f"https://huggingface.co/{SMOLLM2_REPO}/") and p.revision == SMOLLM2_REVISION
               for p in pins)

