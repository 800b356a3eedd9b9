"""Training throughput of transformer_lib.GPT next to two same-shape baselines.

One training step is: forward, cross-entropy loss, backward, AdamW step. Each model gets the same
optimizer (``torch.optim.AdamW(fused=True)``, the one our trainer uses), the same random batches,
the same precision and the same number of threads. After a warm-up, the models take turns
(interleaved rounds, so that drift of the machine's speed affects all of them alike) and the median
over rounds is reported.

Precision: ``float32`` (the default), or ``bfloat16`` mixed precision, where every model's forward
pass runs under ``torch.autocast(dtype=torch.bfloat16)`` with float32 weights and optimizer state.

Baselines:
- ``torch``: token and position embeddings, an ``nn.TransformerEncoder`` stack of pre-LN GELU
  ``nn.TransformerEncoderLayer``s with a causal mask, a final ``nn.LayerNorm`` and a tied head.
- ``hf-gpt2``: Hugging Face ``GPT2LMHeadModel`` of the same shape.

MFU (model FLOPs utilisation) is the achieved FLOP/s over the matmul peak of the chosen precision
measured here, with the FLOP count of a training step per token estimated as in nanoGPT: ``6 N + 12 L T d`` (N the
non-embedding parameters, L layers, T context, d width).

Usage:
    python bench/train_throughput.py                 # both shapes
    python bench/train_throughput.py --shapes baby   # one shape
    python bench/train_throughput.py --precision bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib import GPT, GPTConfig


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    batch_size: int
    vocab_size: int = 65


SHAPES = {
    "baby": Shape(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12),
    "larger": Shape(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=8),
}


class TorchEncoderLM(nn.Module):
    """A GPT built from PyTorch parts: nn.TransformerEncoder (pre-LN, GELU, causal) + tied head."""

    def __init__(self, s: Shape, bias: bool):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        layer = nn.TransformerEncoderLayer(
            s.n_embd, s.n_head, 4 * s.n_embd, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True, bias=bias,
        )
        self.encoder = nn.TransformerEncoder(layer, s.n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(s.n_embd, bias=bias)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(s.block_size))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        x = self.encoder(x, mask=self.mask[:T, :T], is_causal=True)
        return self.lm_head(self.ln_f(x))


class HFGPT2LM(nn.Module):
    """Hugging Face's GPT2LMHeadModel, returning logits only (the loss is computed outside)."""

    def __init__(self, s: Shape):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd, n_positions=s.block_size,
            vocab_size=s.vocab_size, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0,
        )
        self.model = GPT2LMHeadModel(config)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, use_cache=False).logits


def make_step(model: nn.Module, ours: bool, precision: str):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            if ours:
                _, loss = model(x, y)
            else:
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def matmul_peak_flops(dtype: torch.dtype, repeats: int = 5) -> float:
    """Best matmul FLOP/s in ``dtype`` over a few square sizes."""
    best = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def flops_per_token(s: Shape) -> float:
    d, L, T = s.n_embd, s.n_layer, s.block_size
    config = GPTConfig(n_layer=L, n_head=s.n_head, n_embd=d, block_size=T, vocab_size=s.vocab_size)
    with torch.device("meta"):
        n_params = GPT(config).num_params(non_embedding=True)
    return 6 * n_params + 12 * L * T * d


def run_shape(name: str, s: Shape, rounds: int, seconds: float, bias: bool, peak: float,
              precision: str) -> dict[str, float]:
    torch.manual_seed(0)
    config = GPTConfig(
        n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd, block_size=s.block_size,
        vocab_size=s.vocab_size, dropout=0.0, bias=bias,
    )
    models = {
        "transformer_lib": GPT(config),
        "torch": TorchEncoderLM(s, bias),
        "hf-gpt2": HFGPT2LM(s),
    }
    steps = {n: make_step(m, ours=(n == "transformer_lib"), precision=precision) for n, m in models.items()}
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(s.vocab_size, (s.batch_size, s.block_size), generator=g),
         torch.randint(s.vocab_size, (s.batch_size, s.block_size), generator=g))
        for _ in range(8)
    ]

    # Warm-up, and the number of steps per round that takes about `seconds` for the slowest model.
    per_step = {}
    for n, step in steps.items():
        for x, y in batches[:2]:
            step(x, y)
        t0 = time.perf_counter()
        for x, y in batches[:3]:
            step(x, y)
        per_step[n] = (time.perf_counter() - t0) / 3
    n_steps = max(2, round(seconds / max(per_step.values())))

    tokens = {n: [] for n in models}
    for r in range(rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        for n in order:
            t0 = time.perf_counter()
            for i in range(n_steps):
                steps[n](*batches[i % len(batches)])
            tokens[n].append(n_steps * s.batch_size * s.block_size / (time.perf_counter() - t0))

    fpt = flops_per_token(s)
    median = {n: statistics.median(v) for n, v in tokens.items()}
    # The machine's speed drifts between rounds; a ratio taken within each round cancels most of it.
    ratio = {n: statistics.median(a / b for a, b in zip(v, tokens["torch"])) for n, v in tokens.items()}
    print(f"\n{name}: {s.n_layer} layers, {s.n_head} heads, {s.n_embd} wide, context {s.block_size}, "
          f"batch {s.batch_size}, vocab {s.vocab_size}, bias={bias}, {precision}; {rounds} rounds of {n_steps} steps")
    print(f"{'model':>16} {'tokens/s':>10} {'ms/step':>9} {'MFU':>6} {'vs torch':>9}   "
          "(tokens/s min..max; vs torch: median of per-round ratios, min..max)")
    for n, v in median.items():
        ms = 1000 * s.batch_size * s.block_size / v
        per_round = [a / b for a, b in zip(tokens[n], tokens["torch"])]
        print(f"{n:>16} {v:10.0f} {ms:9.1f} {fpt * v / peak:6.1%} {ratio[n]:9.3f}"
              f"   ({min(tokens[n]):.0f}..{max(tokens[n]):.0f}; {min(per_round):.3f}..{max(per_round):.3f})")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="about this long per model and round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-bias", action="store_true", help="no biases in ours and the torch baseline")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: mixed precision (autocast) for every model")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    peak = matmul_peak_flops(getattr(torch, args.precision))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.precision} matmul peak {peak / 1e9:.1f} GFLOP/s")
    for name in args.shapes:
        run_shape(name, SHAPES[name], args.rounds, args.seconds, not args.no_bias, peak, args.precision)


if __name__ == "__main__":
    main()
