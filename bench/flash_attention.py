"""Time and peak memory of transformer_lib's flash_attention against PyTorch's scaled_dot_product_attention.

For each sequence length T (batch 1, ``--heads`` heads of ``--head-dim``, float32, causal unless
``--no-causal``) three contenders compute attention of the same random q, k, v:

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch's fused kernel (on the CPU
  itself a tiled, FlashAttention-style loop in C++);
- ``flash``: ``transformer_lib.flash_attention`` (chapter 19), the same algorithm written as Python
  loops over tiles of PyTorch operations;
- ``naive``: ``softmax(q k^T / sqrt(d)) v`` with the whole (T, T) matrix, for the memory it needs
  (only up to ``--naive-max``, since it grows like T^2).

Two passes are measured: the forward pass alone (``torch.no_grad``) and forward plus backward
(the gradients of q, k and v for a random weighting of the output). Time: after a warm-up the
contenders take turns (interleaved rounds, so that drift of the machine's speed affects all alike)
and the ratios are medians of per-round ratios; a short call is repeated within a round until the
round's measurement takes at least 50 ms. Peak memory: the largest total of bytes PyTorch had
allocated beyond what existed before the call, from the profiler's record of every allocation and
free (``profile_memory=True``), in one separate run per contender (the profiler slows the run it
records). The outputs are checked against ``sdpa`` first.

Usage:
    python bench/flash_attention.py                          # T = 256 .. 8192, 3 rounds
    python bench/flash_attention.py --lengths 256 1024 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from transformer_lib import flash_attention


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2, where the profiler's C++ code logs each start and stop."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def peak_allocated(fn) -> int:
    """The most bytes PyTorch had allocated at once, beyond what existed before, while fn() ran."""
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    total = peak = 0
    for e in events:
        total += e.nbytes()
        peak = max(peak, total)
    return peak


def naive_attention(q, k, v, is_causal):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return s.softmax(dim=-1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128, help="flash_attention's tile size (both sides)")
    parser.add_argument("--naive-max", type=int, default=4096, help="longest T for the naive contender")
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    causal, h, d, b = not args.no_causal, args.heads, args.head_dim, args.block_size
    contenders = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "flash": lambda q, k, v: flash_attention(q, k, v, is_causal=causal, block_size_q=b, block_size_k=b),
        "naive": lambda q, k, v: naive_attention(q, k, v, causal),
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch 1, {h} heads, d = {d}, float32, "
          f"{'causal' if causal else 'not causal'}; flash tiles {b} x {b}; {args.rounds} interleaved rounds")
    results = []
    for T in args.lengths:
        g = torch.Generator().manual_seed(args.seed)
        q, k, v = (torch.randn(1, h, T, d, generator=g) for _ in range(3))
        weight = torch.randn(1, h, T, d, generator=g)
        names = [n for n in contenders if n != "naive" or T <= args.naive_max]
        with torch.no_grad():
            ref = contenders["sdpa"](q, k, v)
            err = {n: (contenders[n](q, k, v) - ref).abs().max().item() for n in names}
        assert max(err.values()) <= 1e-4, (T, err)

        def forward(name):
            with torch.no_grad():
                contenders[name](q, k, v)

        def train_step(name):
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            (contenders[name](qg, kg, vg) * weight).sum().backward()

        for mode, step in (("forward", forward), ("fwd+bwd", train_step)):
            repeats = {}
            for name in names:                                               # warm-up, and how many calls
                t0 = time.perf_counter()                                     # make a measurement of >= 50 ms
                step(name)
                repeats[name] = max(1, math.ceil(0.05 / (time.perf_counter() - t0)))
            seconds = {n: [] for n in names}
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else list(reversed(names))):
                    t0 = time.perf_counter()
                    for _ in range(repeats[name]):
                        step(name)
                    seconds[name].append((time.perf_counter() - t0) / repeats[name])
            peak = {n: peak_allocated(lambda n=n: step(n)) for n in names}
            ratio = statistics.median(f / s for f, s in zip(seconds["flash"], seconds["sdpa"]))
            results.append((T, mode, {n: statistics.median(s) for n, s in seconds.items()}, ratio, peak))
            row = results[-1]
            naive_mib = f"{peak['naive'] / 2**20:10.1f}" if "naive" in peak else f"{'-':>10}"
            print(f"T = {T:5d} {mode:8}: time sdpa {1000 * row[2]['sdpa']:8.1f} ms, flash {1000 * row[2]['flash']:8.1f} ms, "
                  f"flash/sdpa {ratio:5.2f}x | peak MiB sdpa {peak['sdpa'] / 2**20:7.2f}, flash {peak['flash'] / 2**20:7.2f}, "
                  f"flash/sdpa {peak['flash'] / max(peak['sdpa'], 1):5.2f}x, naive {naive_mib}", flush=True)

    print()
    print(f"{'T':>6} {'pass':>8} {'sdpa ms':>9} {'flash ms':>9} {'time ratio':>11} {'sdpa MiB':>9} {'flash MiB':>10} "
          f"{'mem ratio':>10} {'naive MiB':>10}")
    for T, mode, sec, ratio, peak in results:
        naive_mib = f"{peak['naive'] / 2**20:10.1f}" if "naive" in peak else f"{'-':>10}"
        print(f"{T:>6} {mode:>8} {1000 * sec['sdpa']:9.1f} {1000 * sec['flash']:9.1f} {ratio:10.2f}x "
              f"{peak['sdpa'] / 2**20:9.2f} {peak['flash'] / 2**20:10.2f} {peak['flash'] / max(peak['sdpa'], 1):9.2f}x "
              f"{naive_mib}")
    print("time ratio: flash_attention / sdpa (median of per-round ratios; > 1 means flash_attention is slower); "
          "mem ratio: flash_attention / sdpa peak allocated bytes")


if __name__ == "__main__":
    main()
