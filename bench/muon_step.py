"""Milliseconds per Muon step: the exact mode (torch.optim.Muon's operations, one matrix at a time) against the
fast options of :class:`transformer_lib.optim.Muon` (``batched``, ``split_qkv``), in float32 and bfloat16.

The parameters are the hidden matrices of a preset's GPT (``split_muon_params``), with fixed random gradients; a
step is ``optimizer.step()`` alone (momentum, Newton-Schulz, update), no forward or backward pass. The modes take
turns, round after round, so that a drift of the machine's speed touches all of them alike; the median over rounds
is reported, with the speed-up over the exact mode in the same dtype. bfloat16 is timed everywhere, and the table
says whether ``bfloat16_is_native`` (the probe ``ns_dtype="auto"`` follows) found bfloat16 instructions.

Usage:
    python bench/muon_step.py                                   # baby and speedrun presets, 1 thread
    python bench/muon_step.py --presets speedrun --threads 2 --rounds 20
    python bench/muon_step.py --out /tmp/muon_step.json         # also write the numbers as JSON
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from _machine import cpu_flags  # bench/ is on sys.path when a script here runs

from transformer_lib import GPT, GPTConfig
from transformer_lib.optim import Muon, bfloat16_is_native, split_muon_params

#: mode -> Muon options beyond the dtype ("exact" is torch.optim.Muon's update, operation for operation).
MODES = {
    "exact": {},
    "batched": {"batched": True},
    "batched+split_qkv": {"batched": True, "split_qkv": True},
}


def time_modes(preset: str, dtypes: list[torch.dtype], rounds: int, steps: int) -> dict:
    """Median ms per step of every mode and dtype on the hidden matrices of ``preset``'s GPT."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset(preset))
    matrices, _ = split_muon_params(model)
    grads = [torch.randn_like(p) for p in matrices]
    runs = {}
    for dtype in dtypes:
        for mode, options in MODES.items():
            params = [p.detach().clone().requires_grad_() for p in matrices]
            for p, g in zip(params, grads):
                p.grad = g
            runs[(mode, dtype)] = (Muon(params, lr=0.02, ns_dtype=dtype, **options), [])
    for r in range(rounds + 1):  # round 0 warms up (allocation, thread start-up)
        for opt, times in runs.values():
            start = time.perf_counter()
            for _ in range(steps):
                opt.step()
            if r:
                times.append((time.perf_counter() - start) / steps)
    shapes = sorted({tuple(p.shape) for p in matrices})
    result = {"preset": preset, "matrices": len(matrices), "shapes": shapes, "ms": {}}
    for (mode, dtype), (_, times) in runs.items():
        result["ms"][f"{mode} {str(dtype).removeprefix('torch.')}"] = 1e3 * statistics.median(times)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["baby", "speedrun"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=3, help="steps per timing")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtypes = [torch.float32, torch.bfloat16]
    machine = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "bfloat16_is_native": bfloat16_is_native("cpu"),
               "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "processor": platform.processor() or platform.machine()}
    print(f"CPU capability {machine['cpu_capability']}, bfloat16_is_native: {machine['bfloat16_is_native']}, "
          f"{machine['threads']} thread(s), torch {machine['torch']}")
    results = []
    for preset in args.presets:
        res = time_modes(preset, dtypes, args.rounds, args.steps)
        results.append(res)
        print(f"\n{preset}: {res['matrices']} matrices of shapes {res['shapes']}")
        for key, ms in res["ms"].items():
            mode, dtype = key.rsplit(" ", 1)
            base = res["ms"][f"exact {dtype}"]
            vs32 = res["ms"]["exact float32"]
            print(f"  {mode:>18} {dtype:>8}: {ms:7.2f} ms/step  x{base / ms:4.2f} vs exact {dtype}, "
                  f"x{vs32 / ms:4.2f} vs exact float32")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
