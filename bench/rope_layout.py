"""Is RoPE's layout worth changing? The speedrun's query/key path, one layer, two layouts, eager and compiled.

The speedrun rotates interleaved pairs of features (Chapter 3's ``apply_rope``) of the queries and of the keys
apart, after QK-norm (``F.rms_norm``). The alternative that modded-nanoGPT's code uses rotates the two halves of
each head (Chapter 17's ``apply_rope_half``) on the queries and keys stacked as one tensor: contiguous halves
instead of strided pairs, one kernel instead of two. This times the forward and backward pass of both, for one
layer of the speedrun's shape (batch 16, 4 heads, 128 positions, head width 32), in float32 and bfloat16, eager
and compiled (``torch.compile`` of the function alone), median of 50 repetitions after 10 of warm-up.

Usage:
    python bench/rope_layout.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from transformer_lib.embeddings import apply_rope, apply_rope_half, rope_angles


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    B, h, T, d = 16, 4, 128, 32
    cos, sin = rope_angles(T, d)

    def interleaved(q, k):
        q, k = F.rms_norm(q, (d,)), F.rms_norm(k, (d,))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def fused_half(q, k):
        qk = F.rms_norm(torch.stack((q, k)), (d,))
        qk = apply_rope_half(qk, cos.to(qk.dtype), sin.to(qk.dtype))
        return qk[0], qk[1]

    def ms(fn, dtype):
        q, k = (torch.randn(B, h, T, d, dtype=dtype, requires_grad=True) for _ in range(2))
        g = torch.randn(B, h, T, d, dtype=dtype)
        times = []
        for _ in range(60):
            start = time.perf_counter()
            a, b = fn(q, k)
            ((a * g).sum() + (b * g).sum()).backward()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times[10:])

    for dtype in (torch.float32, torch.bfloat16):
        for name, fn in (("interleaved, q and k apart", interleaved), ("rotate-half, q and k stacked", fused_half)):
            print(f"{str(dtype):<16}{name:<30} eager {ms(fn, dtype):6.2f} ms   compiled {ms(torch.compile(fn), dtype):6.2f} ms")


if __name__ == "__main__":
    main()
