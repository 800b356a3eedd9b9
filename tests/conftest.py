"""Fixtures shared by the unit tests: a tiny configuration, a seeded model, a batch of ids, the reference KV
cache, and an isolated download cache."""

import urllib.request

import pytest
import torch


@pytest.fixture
def tiny_config():
    """The "tiny" preset: 2 layers, 2 heads, width 32, context 16, 65 token ids."""
    from transformer_lib.config import GPTConfig

    return GPTConfig.from_preset("tiny")


@pytest.fixture
def tiny_model(tiny_config):
    """A seeded GPT of the tiny preset, in evaluation mode."""
    from transformer_lib.gpt import GPT

    torch.manual_seed(0)
    return GPT(tiny_config).eval()


@pytest.fixture
def token_ids(tiny_config):
    """A seeded (2, 8) int64 batch of ids below the tiny preset's vocabulary size."""
    return torch.randint(0, tiny_config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))


class ConcatCache:
    """The simplest KV cache: ``update(k, v)`` appends along the positions (dim 2) and returns all so far."""

    def __init__(self):
        self.k = self.v = None

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


@pytest.fixture
def concat_cache():
    """A factory of empty :class:`ConcatCache` objects, the reference cache of the attention tests."""
    return ConcatCache


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No data override, an empty cache under tmp_path, and a network that fails the test if touched."""
    from transformer_lib.hub import CACHE_ENV, DATA_ENV

    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    return tmp_path
