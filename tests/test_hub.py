"""Unit tests for transformer_lib.hub (chapter 1 and the chapters that pin downloads): cache_dir, sha256sum,
fetch from every source, and the table of pinned downloads with fetch_pinned. No network access."""

import hashlib
import io
import os
import pathlib
import re
import urllib.error
import urllib.request

import pytest

import transformer_lib
from transformer_lib.hub import (
    CACHE_ENV,
    DATA_ENV,
    PINNED_FILES,
    PinnedFile,
    cache_dir,
    fetch,
    fetch_pinned,
    hf_url,
    sha256sum,
)

CONTENT = b"To be, or not to be: that is the question.\n"
DIGEST = hashlib.sha256(CONTENT).hexdigest()
NAME = "hamlet.txt"
URL = "https://example.invalid/hamlet.txt"


@pytest.fixture
def local_copy(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / NAME).write_bytes(CONTENT)
    return folder



# ---------------------------------------------------------------- cache_dir, sha256sum


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cache_dir() == pathlib.Path.home() / ".cache" / "transformer_lib"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_dir() == tmp_path


def test_sha256sum_matches_hashlib_across_chunk_boundaries(tmp_path):
    payload = os.urandom(3 * (1 << 20) + 123)  # spans several 1 MiB chunks
    f = tmp_path / "blob"
    f.write_bytes(payload)
    assert sha256sum(f) == hashlib.sha256(payload).hexdigest()
    assert sha256sum(str(f)) == hashlib.sha256(payload).hexdigest()


def test_sha256sum_rejects_non_path():
    with pytest.raises(TypeError, match="path"):
        sha256sum(123)


# ---------------------------------------------------------------- fetch: local sources


def test_fetch_explicit_path_file_and_directory(isolated, local_copy):
    assert fetch(NAME, URL, DIGEST, path=local_copy / NAME) == local_copy / NAME
    assert fetch(NAME, URL, DIGEST, path=local_copy) == local_copy / NAME
    assert fetch(NAME, URL, DIGEST, path=str(local_copy)) == local_copy / NAME


def test_fetch_env_override_file_and_directory(isolated, local_copy, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(local_copy))
    assert fetch(NAME, URL, DIGEST) == local_copy / NAME
    monkeypatch.setenv(DATA_ENV, str(local_copy / NAME))
    assert fetch(NAME, URL, DIGEST) == local_copy / NAME


def test_fetch_explicit_path_beats_env(isolated, local_copy, monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "does-not-exist"))
    assert fetch(NAME, URL, DIGEST, path=local_copy) == local_copy / NAME


def test_fetch_checksum_mismatch_names_both_digests(isolated, local_copy):
    wrong = "0" * 64
    with pytest.raises(ValueError, match="checksum mismatch") as info:
        fetch(NAME, URL, wrong, path=local_copy)
    message = str(info.value)
    assert wrong in message and DIGEST in message and NAME in message


def test_fetch_missing_env_override_names_variable(isolated, monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(DATA_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match=DATA_ENV) as info:
        fetch(NAME, URL, DIGEST)
    assert str(missing) in str(info.value)


def test_fetch_env_directory_without_file(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=rf"{DATA_ENV}.*{re.escape(repr(NAME))}"):
        fetch(NAME, URL, DIGEST)


def test_fetch_missing_path_argument_names_path(isolated, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"fetch: path points to .*nowhere"):
        fetch(NAME, URL, DIGEST, path=tmp_path / "nowhere")


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(filename="dir/x.txt"), ValueError, "filename"),
        (dict(filename=""), ValueError, "filename"),
        (dict(filename=3), TypeError, "filename"),
        (dict(url=None), TypeError, "url"),
        (dict(sha256="abc"), ValueError, "sha256"),
        (dict(sha256="z" * 64), ValueError, "sha256"),
        (dict(path=3), TypeError, "path"),
    ],
)
def test_fetch_bad_arguments(isolated, kwargs, exc, pattern):
    args = dict(filename=NAME, url=URL, sha256=DIGEST)
    path = kwargs.pop("path", None)
    args.update(kwargs)
    with pytest.raises(exc, match=pattern):
        fetch(args["filename"], args["url"], args["sha256"], path=path)


# ---------------------------------------------------------------- fetch: cache and download


def test_fetch_cache_hit_does_not_touch_network(isolated):
    cached = cache_dir() / NAME
    cached.parent.mkdir(parents=True)
    cached.write_bytes(CONTENT)
    assert fetch(NAME, URL, DIGEST) == cached  # urlopen raises if called


def test_fetch_subdir_keeps_same_named_files_apart(isolated, monkeypatch, tmp_path):
    """Files of one name live in their own folder, in the cache and under the data override."""
    cached = cache_dir() / "models" / "a" / NAME
    cached.parent.mkdir(parents=True)
    cached.write_bytes(CONTENT)
    assert fetch(NAME, URL, DIGEST, subdir="models/a") == cached
    override = tmp_path / "override" / "models" / "a"
    override.mkdir(parents=True)
    (override / NAME).write_bytes(CONTENT)
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "override"))
    assert fetch(NAME, URL, DIGEST, subdir="models/a") == override / NAME


@pytest.mark.parametrize("subdir", ["/abs", "../up", "", 3])
def test_fetch_refuses_a_subdir_that_is_not_a_relative_folder(isolated, subdir):
    with pytest.raises(ValueError, match="subdir"):
        fetch(NAME, URL, DIGEST, subdir=subdir)


def test_fetch_corrupt_cache_is_reported(isolated):
    cached = cache_dir() / NAME
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"tampered")
    with pytest.raises(ValueError, match=r"checksum mismatch for the cached file"):
        fetch(NAME, URL, DIGEST)


def _serve(monkeypatch, payload, calls):
    def fake_urlopen(url, timeout=None):
        calls.append((url, timeout))
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)


def test_fetch_downloads_verifies_and_caches(isolated, monkeypatch):
    calls = []
    _serve(monkeypatch, CONTENT, calls)
    got = fetch(NAME, URL, DIGEST)
    assert got == cache_dir() / NAME
    assert got.read_bytes() == CONTENT and sha256sum(got) == DIGEST
    assert calls == [(URL, calls[0][1])] and calls[0][1] is not None  # one call, with a timeout
    assert sorted(p.name for p in cache_dir().iterdir()) == [NAME]  # no temporary file left
    fetch(NAME, URL, DIGEST)  # second call: served from the cache
    assert len(calls) == 1


def test_fetch_bad_download_leaves_nothing(isolated, monkeypatch):
    _serve(monkeypatch, b"not the pinned file", [])
    with pytest.raises(ValueError, match="checksum mismatch") as info:
        fetch(NAME, URL, DIGEST)
    assert DIGEST in str(info.value)
    assert hashlib.sha256(b"not the pinned file").hexdigest() in str(info.value)
    assert list(cache_dir().iterdir()) == []


def test_fetch_network_failure_is_connection_error(isolated, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ConnectionError, match=DATA_ENV) as info:
        fetch(NAME, URL, DIGEST)
    assert isinstance(info.value, OSError)
    assert "name resolution" in str(info.value) and NAME in str(info.value)
    assert list(cache_dir().iterdir()) == []


def test_fetch_http_error_is_connection_error(isolated, monkeypatch):
    def not_found(url, timeout=None):
        raise urllib.error.HTTPError(url, 404, "Not Found", None, None)

    monkeypatch.setattr(urllib.request, "urlopen", not_found)
    with pytest.raises(ConnectionError, match="404"):
        fetch(NAME, URL, DIGEST)



# ---------------------------------------------------------------- the table of pinned downloads
def test_constants():
    assert PINNED_FILES["tinyshakespeare.txt"].url.startswith("https://raw.githubusercontent.com/karpathy/char-rnn/")
    assert DATA_ENV == "TRANSFORMER_LIB_DATA" and CACHE_ENV == "TRANSFORMER_LIB_CACHE"


def test_every_download_is_pinned_in_one_table():
    keys = set(PINNED_FILES)
    assert {"tinyshakespeare.txt", "gpt2-124M.safetensors", "gpt2-vocab.json", "gpt2-merges.txt",
            "models/shakespeare-baby/model.safetensors", "models/SmolLM2-135M/model.safetensors"} <= keys
    for key, pin in PINNED_FILES.items():
        assert isinstance(pin, PinnedFile) and pin.url.startswith("https://") and not key.startswith("/")
        assert pin.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", pin.sha256), key
    unpinned = [k for k, pin in PINNED_FILES.items() if pin.sha256 is None]
    assert unpinned == ["gpt2-large-774M.safetensors"]  # refused by fetch_pinned until its digest is pinned
    package = pathlib.Path(transformer_lib.__file__).parent
    for path in package.glob("*.py"):  # one fetch path: no module but hub calls fetch itself
        if path.stem != "hub":
            assert not re.search(r"\bfetch\(", path.read_text(encoding="utf-8")), path.name


def test_hf_url_and_revision():
    pin = PinnedFile(hf_url("owner/model", "abc123", "config.json"), None)
    assert pin.url == "https://huggingface.co/owner/model/resolve/abc123/config.json" and pin.revision == "abc123"
    assert PINNED_FILES["tinyshakespeare.txt"].revision is None  # not a Hub file


def test_fetch_pinned_uses_the_key_as_the_local_path(isolated, monkeypatch):
    digest = hashlib.sha256(CONTENT).hexdigest()
    monkeypatch.setitem(PINNED_FILES, "models/toy/hamlet.txt", PinnedFile(URL, digest))
    calls = []
    _serve(monkeypatch, CONTENT, calls)
    got = fetch_pinned("models/toy/hamlet.txt")
    assert got == cache_dir() / "models" / "toy" / "hamlet.txt" and got.read_bytes() == CONTENT
    assert fetch_pinned("models/toy/hamlet.txt", path=got) == got and len(calls) == 1
    with pytest.raises(ValueError, match="fetch_pinned: key must be one of"):
        fetch_pinned("models/toy/other.txt")
    monkeypatch.setitem(PINNED_FILES, "unpinned.bin", PinnedFile(URL, None))
    with pytest.raises(ValueError, match="fetch_pinned: no SHA-256 digest of 'unpinned.bin'.*pass sha256="):
        fetch_pinned("unpinned.bin")


def test_fetch_pinned_verifies_an_unpinned_file_against_the_callers_digest(isolated, monkeypatch):
    digest = hashlib.sha256(CONTENT).hexdigest()
    monkeypatch.setitem(PINNED_FILES, "unpinned.bin", PinnedFile(URL, None))
    monkeypatch.setitem(PINNED_FILES, "pinned.bin", PinnedFile(URL, digest))
    _serve(monkeypatch, CONTENT, [])
    assert fetch_pinned("unpinned.bin", sha256=digest.upper()).read_bytes() == CONTENT
    assert PINNED_FILES["unpinned.bin"].sha256 is None  # the caller's digest pins nothing
    with pytest.raises(ValueError, match="checksum mismatch"):
        fetch_pinned("unpinned.bin", path=cache_dir() / "unpinned.bin", sha256="0" * 64)
    assert fetch_pinned("pinned.bin", sha256=digest) == cache_dir() / "pinned.bin"
    with pytest.raises(ValueError, match="fetch_pinned: sha256='0+' differs from the digest pinned for 'pinned.bin'"):
        fetch_pinned("pinned.bin", sha256="0" * 64)
    with pytest.raises(TypeError, match="fetch_pinned: sha256 must be a str or None, got int"):
        fetch_pinned("unpinned.bin", sha256=1)
