"""Unit tests for transformer_lib.evaluate (chapter 10): whole-split scoring against a slow loop."""

import math

import pytest
import torch
import torch.nn as nn

import transformer_lib
from transformer_lib.config import GPTConfig
from transformer_lib.evaluate import evaluate_split
from transformer_lib.gpt import GPT
from transformer_lib.utils import eval_mode

TINY = GPTConfig.from_preset("tiny")
T = TINY.block_size
DATA = (torch.arange(500) * 7 + torch.arange(500) // 13) % TINY.vocab_size


def reference(model: nn.Module, data: torch.Tensor, block_size: int) -> float:
    """One window at a time, log_softmax in float64, summed over positions."""
    total, count = 0.0, 0
    with eval_mode(model), torch.no_grad():
        for i in range(0, len(data) - 1, block_size):
            y = data[i + 1:i + block_size + 1]
            x = data[i:i + len(y)]
            logp = torch.log_softmax(model(x[None])[0][0].double(), dim=-1)
            total -= logp[torch.arange(len(y)), y].sum().item()
            count += len(y)
    assert count == len(data) - 1
    return total / count


def test_top_level():
    assert transformer_lib.evaluate_split is evaluate_split


@pytest.mark.parametrize("n", [T + 1, 3 * T + 1, 200, 2])  # exact windows, partial last window, one position
def test_matches_reference_loop(tiny_model, n):
    model = tiny_model
    ours = evaluate_split(model, DATA[:n], block_size=T, batch_size=3)
    assert isinstance(ours, float)
    assert ours == pytest.approx(reference(model, DATA[:n], T), abs=1e-6)


def test_partial_last_window_is_weighted_by_its_length(tiny_model):
    # 2 full windows of T and a last window of 5 positions: the mean over positions, not over windows.
    model = tiny_model
    data = DATA[:2 * T + 6]
    full = evaluate_split(model, data[:2 * T + 1], block_size=T)
    last = evaluate_split(model, data[2 * T:], block_size=T)
    expected = (full * 2 * T + last * 5) / (2 * T + 5)
    assert evaluate_split(model, data, block_size=T) == pytest.approx(expected, abs=1e-6)
    mean_of_windows = (full * 2 + last) / 3
    assert abs(mean_of_windows - expected) > 1e-4  # the two definitions do differ on this data


def test_shorter_block_size_uses_smaller_windows(tiny_model):
    model = tiny_model
    assert evaluate_split(model, DATA, block_size=5, batch_size=7) == pytest.approx(reference(model, DATA, 5), abs=1e-6)


@pytest.mark.parametrize("mode", [True, False])
def test_restores_training_mode(mode):
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.5))
    model.train(mode)
    evaluate_split(model, DATA, block_size=T)
    assert model.training is mode
    assert all(m.training is mode for m in model.modules())


class _Exploding(nn.Module):
    """A model whose forward fails: evaluate_split must still restore its training mode."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        raise RuntimeError("boom")


def test_restores_training_mode_after_an_exception():
    model = _Exploding().train()
    with pytest.raises(RuntimeError, match="boom"):
        evaluate_split(model, DATA, block_size=T)
    assert model.training and model.drop.training


def test_eval_mode_disables_dropout_and_no_grad():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.5)).train()
    a = evaluate_split(model, DATA, block_size=T)
    b = evaluate_split(model, DATA, block_size=T)
    assert a == b
    assert all(p.grad is None for p in model.parameters())


def test_deterministic_and_batch_size_invariant(tiny_model):
    model = tiny_model
    results = [evaluate_split(model, DATA, block_size=T, batch_size=bs) for bs in (1, 4, 64, 1000)]
    assert max(results) - min(results) <= 1e-6
    assert evaluate_split(model, DATA, block_size=T) == evaluate_split(model, DATA, block_size=T)


def test_uniform_model_scores_ln_v(tiny_model):
    model = tiny_model
    with torch.no_grad():
        model.lm_head.weight.zero_()  # tied to the embedding in GPT; zero logits either way
        if model.lm_head.bias is not None:
            model.lm_head.bias.zero_()
    logits = model(DATA[:T][None])[0]
    assert torch.count_nonzero(logits) == 0
    assert evaluate_split(model, DATA, block_size=T) == pytest.approx(math.log(TINY.vocab_size), abs=1e-6)


def test_accepts_int32_data(tiny_model):
    model = tiny_model
    assert evaluate_split(model, DATA.int(), block_size=T) == pytest.approx(
        evaluate_split(model, DATA, block_size=T), abs=0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(data=DATA.view(10, 50)), ValueError, r"data.*data.shape=\(10, 50\)"),
        (dict(data=DATA[:1]), ValueError, r"data.*data.shape=\(1,\)"),
        (dict(data=DATA.float()), TypeError, r"data.*torch.float32"),
        (dict(data=DATA.tolist()), TypeError, r"data.*list"),
        (dict(block_size=0), ValueError, r"block_size.*block_size=0"),
        (dict(block_size=2.0), TypeError, r"block_size"),
        (dict(block_size=T + 1), ValueError, rf"block_size must be <= the model's context {T}.*block_size={T + 1}"),
        (dict(batch_size=0), ValueError, r"batch_size.*batch_size=0"),
        (dict(device="gpu7"), ValueError, r"device"),
        (dict(model=lambda x: x), TypeError, r"model.*function"),
    ],
)
def test_errors(tiny_model, kwargs, error, match):
    args = dict(model=tiny_model, data=DATA, block_size=T) | kwargs
    model, data = args.pop("model"), args.pop("data")
    with pytest.raises(error, match=f"evaluate_split: {match}"):
        evaluate_split(model, data, **args)
