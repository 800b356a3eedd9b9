"""Decoding speed and KV-cache memory of multi-head, grouped-query and multi-query attention.

Three :class:`transformer_lib.Llama` models that differ only in ``n_kv_head`` (the number of
key-value heads shared by the query heads) generate the same number of tokens greedily with the
KV cache, after the same random prompt; the decoding rate leaves out the prefill (the time of a
call that generates one token is subtracted):

- ``MHA``: ``n_kv_head = n_head``, every query head has its own keys and values;
- ``GQA``: ``n_kv_head = n_head / 4``, groups of four query heads share one key-value head;
- ``MQA``: ``n_kv_head = 1``, all query heads share one.

The KV cache holds ``2 * n_layer * batch * n_kv_head * head_dim * positions`` numbers, so its
bytes (read from the allocated cache) shrink by exactly ``n_head / n_kv_head``; the parameters of
``k_proj`` and ``v_proj`` shrink by the same factor. The decoding speed changes less: each step also
reads all the other weights. After a warm-up the three take turns (interleaved rounds, so that
drift of the machine's speed affects all alike); tokens/s are medians, and the ratios against MHA
are medians of the per-round ratios.

Usage:
    python bench/kv_heads.py                              # batch 4, prompt 512, 64 new tokens, 3 rounds
    python bench/kv_heads.py --batch 16 --prompt-len 2048 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transformer_lib import Llama, LlamaConfig

SHAPE = dict(vocab_size=8192, n_embd=512, n_layer=8, n_head=16, n_inner=1408, rope_theta=10000.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    total = args.prompt_len + args.new_tokens
    variants = {"MHA": SHAPE["n_head"], "GQA": SHAPE["n_head"] // 4, "MQA": 1}
    models = {}
    for name, n_kv in variants.items():
        torch.manual_seed(args.seed)
        config = LlamaConfig(**SHAPE, n_kv_head=n_kv, block_size=total)
        models[name] = Llama(config).to(device=args.device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(SHAPE["vocab_size"], (args.batch, args.prompt_len), generator=g).to(args.device)

    def sync() -> None:
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize()

    def timed(name: str, new_tokens: int) -> float:
        sync()
        t0 = time.perf_counter()
        out = models[name].generate(prompt, new_tokens, temperature=0)
        sync()
        assert out.shape == (args.batch, args.prompt_len + new_tokens)
        return time.perf_counter() - t0

    for name in models:  # warm-up
        timed(name, 2)
    # decoding alone: (time for all new tokens) - (time for the prefill and the first token)
    tokens_per_s = {name: [] for name in models}
    prefill_s = {name: [] for name in models}
    for r in range(args.rounds):
        for name in (list(models) if r % 2 == 0 else list(reversed(models))):
            t_first, t_all = timed(name, 1), timed(name, args.new_tokens)
            prefill_s[name].append(t_first)
            tokens_per_s[name].append(args.batch * (args.new_tokens - 1) / (t_all - t_first))

    device_name = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {device_name}, {torch.get_num_threads()} threads, {args.dtype}; "
          f"{SHAPE['n_layer']} layers, n_embd {SHAPE['n_embd']}, {SHAPE['n_head']} query heads of "
          f"{SHAPE['n_embd'] // SHAPE['n_head']}, vocab {SHAPE['vocab_size']}; batch {args.batch}, prompt "
          f"{args.prompt_len}, {args.new_tokens} new tokens (greedy, KV cache); {args.rounds} interleaved rounds")
    print(f"{'attention':>9} {'K/V heads':>9} {'KV cache':>11} {'K,V params':>11} {'prefill s':>9} "
          f"{'decode tokens/s':>15} {'vs MHA':>7}")
    for name, model in models.items():
        cache_bytes = model.new_kv_cache(args.batch, total).nbytes
        kv_params = sum(b.attn.k_proj.weight.numel() + b.attn.v_proj.weight.numel() for b in model.blocks)
        med = statistics.median(tokens_per_s[name])
        ratio = statistics.median(x / y for x, y in zip(tokens_per_s[name], tokens_per_s["MHA"]))
        print(f"{name:>9} {model.config.n_kv_head:>9} {cache_bytes / 2**20:>7.1f} MiB {kv_params:>11,} "
              f"{statistics.median(prefill_s[name]):>9.2f} {med:>15.1f} {ratio:>6.2f}x")


if __name__ == "__main__":
    main()
