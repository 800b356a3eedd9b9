"""Training-step time of the NumPy GPT of Chapter 8 next to the PyTorch GPT, at the same shape.

One training step is: forward, cross-entropy loss, backward, AdamW update. NumPy:
``transformer_lib.numpy_gpt.gpt_loss_and_grads`` + ``AdamWNumpy.step``. PyTorch:
``transformer_lib.gpt.GPT`` + ``loss.backward()`` + ``transformer_lib.optim.AdamW`` (with
``weight_decay_groups``; gradients set to None after each step). Both start from the same weights,
run in float32 on the same batches and with the same number of threads: PyTorch's through
``torch.set_num_threads``, NumPy's BLAS (OpenBLAS) through ``OPENBLAS_NUM_THREADS``, which must be
set before NumPy is imported, so this script reads its arguments first. After a warm-up the two
take turns (interleaved rounds, so that drift of the machine's speed affects both alike); the
ratio reported is the median of the per-round ratios.

MFU (model FLOPs utilisation) is the achieved FLOP/s over a measured NumPy float32 matmul peak,
with the FLOPs of a training step counted as in bench/train_throughput.py (``6 N + 12 L T d`` per
token, nanoGPT's estimate). Two peaks are reported: the best FLOP/s of ``np.matmul`` on the matrix
products the model's linear layers make at this shape (forward and both backward products), and on
large square products.

Usage:
    python bench/numpy_step.py                      # baby shape, 2 threads
    python bench/numpy_step.py --threads 1 --rounds 11
"""

from __future__ import annotations

import argparse
import os


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["baby", "larger"], default="baby")
    parser.add_argument("--threads", type=int, default=2, help="threads for NumPy's BLAS and for PyTorch")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    parser.add_argument("--seconds", type=float, default=2.0, help="about this long per model and round")
    return parser.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)  # read once, when NumPy loads OpenBLAS

import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from train_throughput import SHAPES, Shape, flops_per_token  # noqa: E402  (this script's folder)

from transformer_lib.config import GPTConfig  # noqa: E402
from transformer_lib.gpt import GPT  # noqa: E402
from transformer_lib.numpy_gpt import AdamWNumpy, gpt_loss_and_grads, params_from_torch  # noqa: E402
from transformer_lib.optim import AdamW, weight_decay_groups  # noqa: E402


def best_flops(a: np.ndarray, b: np.ndarray, repeats: int) -> float:
    """The best FLOP/s of ``a @ b`` over ``repeats`` timed calls (after one untimed call)."""
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    a @ b
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = max(best, flops / (time.perf_counter() - t0))
    return best


def matmul_peaks(s: Shape, repeats: int = 20) -> tuple[float, str, float]:
    """NumPy float32 matmul peaks: (best over the model's products, which product, best square)."""
    rng = np.random.default_rng(0)
    N, C = s.batch_size * s.block_size, s.n_embd
    best, which = 0.0, ""
    for n_out, n_in in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C)):  # in_proj, out_proj, fc1, fc2
        x = rng.standard_normal((N, n_in), dtype=np.float32)
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        dy = rng.standard_normal((N, n_out), dtype=np.float32)
        for a, b, label in ((x, w.T, "x @ W^T"), (dy, w, "dy @ W"), (dy.T, x, "dy^T @ x")):
            f = best_flops(a, b, repeats)
            if f > best:
                best, which = f, f"{label} {a.shape} @ {b.shape}"
    square = max(best_flops(m, m, 3) for m in (rng.standard_normal((n, n), dtype=np.float32) for n in (1024, 2048)))
    return best, which, square


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    s = SHAPES[args.shape]
    config = GPTConfig(n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd, block_size=s.block_size,
                       vocab_size=s.vocab_size, dropout=0.0, bias=False)
    torch.manual_seed(0)
    model = GPT(config)  # float32
    params = params_from_torch(model, np.float32)  # the same initial weights
    opt_t = AdamW(weight_decay_groups(model, 0.1), lr=1e-4)
    opt_np = AdamWNumpy(params, lr=1e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(s.vocab_size, (s.batch_size, s.block_size), generator=g),
         torch.randint(s.vocab_size, (s.batch_size, s.block_size), generator=g))
        for _ in range(8)
    ]
    np_batches = [(x.numpy(), y.numpy()) for x, y in batches]

    def numpy_step(i: int) -> float:
        loss, grads = gpt_loss_and_grads(params, *np_batches[i % len(np_batches)], config)
        opt_np.step(grads)
        return loss

    def torch_step(i: int) -> float:
        _, loss = model(*batches[i % len(batches)])
        loss.backward()
        opt_t.step()
        opt_t.zero_grad(set_to_none=True)
        return loss.item()

    steps = {"numpy": numpy_step, "torch": torch_step}
    first = {name: step(0) for name, step in steps.items()}  # also a warm-up
    if abs(first["numpy"] - first["torch"]) > 1e-4:
        raise RuntimeError(f"the two models disagree on the first loss: {first}")

    # Warm-up, and the number of steps per round that takes about `seconds` for the slower model.
    per_step = {}
    for name, step in steps.items():
        step(1)
        t0 = time.perf_counter()
        for i in range(3):
            step(i)
        per_step[name] = (time.perf_counter() - t0) / 3
    n_steps = max(2, round(args.seconds / max(per_step.values())))

    seconds = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            t0 = time.perf_counter()
            for i in range(n_steps):
                steps[name](i)
            seconds[name].append((time.perf_counter() - t0) / n_steps)

    peak_model, which, peak_square = matmul_peaks(s)
    tokens = s.batch_size * s.block_size
    flops_step = flops_per_token(s) * tokens
    per_round = [a / b for a, b in zip(seconds["numpy"], seconds["torch"])]
    print(f"numpy {np.__version__} (OpenBLAS, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"NumPy float32 matmul peak: {peak_model / 1e9:.1f} GFLOP/s on the model's products "
          f"(best: {which}), {peak_square / 1e9:.1f} GFLOP/s on square 1024/2048 products")
    print(f"\n{args.shape}: {s.n_layer} layers, {s.n_head} heads, {s.n_embd} wide, context {s.block_size}, "
          f"batch {s.batch_size}, vocab {s.vocab_size}, float32; {flops_step / 1e9:.2f} GFLOP per step; "
          f"{args.rounds} rounds of {n_steps} steps")
    print(f"{'model':>6} {'ms/step':>8} {'tokens/s':>9} {'MFU(model)':>11} {'MFU(square)':>12}   (ms/step min..max)")
    for name, v in seconds.items():
        med = statistics.median(v)
        print(f"{name:>6} {1e3 * med:8.1f} {tokens / med:9.0f} {flops_step / med / peak_model:11.1%} "
              f"{flops_step / med / peak_square:12.1%}   ({1e3 * min(v):.1f}..{1e3 * max(v):.1f})")
    print(f"numpy / torch: {statistics.median(per_round):.2f} (median of per-round ratios; "
          f"{min(per_round):.2f}..{max(per_round):.2f})")


if __name__ == "__main__":
    main(ARGS)
