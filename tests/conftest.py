"""Fixtures shared by the unit tests: a tiny configuration, a seeded model and a batch of ids."""

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
