"""Generation throughput of transformer_lib's GPT, with and without the KV cache, next to Hugging Face.

Each contender generates ``--new-tokens`` tokens greedily (batch 1) after the same random prompt:

- ``cached``: ``GPT.generate(..., temperature=0, use_cache=True)``, the KV cache of chapter 12;
- ``uncached``: ``GPT.generate(..., temperature=0, use_cache=False)``, which runs the model on the
  whole sequence again for every new token;
- ``hf-gpt2``: Hugging Face's ``GPT2LMHeadModel.generate(..., do_sample=False, use_cache=True)``.

All three hold the same weights (ours are loaded from the Hugging Face model with
``GPT.from_hf``), so they must produce the same tokens; the script checks that and reports it.
After a warm-up the contenders take turns (interleaved rounds, so that drift of the machine's speed
affects all of them alike), and the reported ratios are medians of the per-round ratios.

The shape is the ``baby`` model of Part III (4 layers, 4 heads, 128 wide, vocabulary 65) with a
context of 1024 positions, long enough for the prompt and all new tokens.

Usage:
    python bench/generate_throughput.py                  # 512 new tokens, 5 rounds
    python bench/generate_throughput.py --rounds 3 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from transformer_lib import GPT, GPTConfig

N_LAYER, N_HEAD, N_EMBD, VOCAB_SIZE, BLOCK_SIZE = 4, 4, 128, 65, 1024


def build_models(seed: int) -> tuple[GPT, torch.nn.Module]:
    """Hugging Face's GPT2LMHeadModel at the baby shape, and our GPT holding the same weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    hf_config = GPT2Config(
        n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, vocab_size=VOCAB_SIZE, n_positions=BLOCK_SIZE,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )
    hf = GPT2LMHeadModel(hf_config).eval()
    # No end-of-text token: every contender must generate exactly the requested number of tokens.
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    config = GPTConfig(
        n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, vocab_size=VOCAB_SIZE, block_size=BLOCK_SIZE,
        dropout=0.0, bias=True, activation="gelu_tanh",  # GPT-2's activation, as in the HF model
    )
    ours = GPT.from_hf(hf.state_dict(), config).eval()
    return ours, hf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=512, help="tokens to generate per call")
    parser.add_argument("--prompt-len", type=int, default=16, help="length of the random prompt")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.prompt_len + args.new_tokens > BLOCK_SIZE:
        parser.error(f"--prompt-len + --new-tokens must be <= {BLOCK_SIZE}")

    torch.set_num_threads(args.threads)
    ours, hf = build_models(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(VOCAB_SIZE, (1, args.prompt_len), generator=g)
    n = args.new_tokens

    def hf_generate() -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                use_cache=True,
            )

    contenders = {
        "cached": lambda: ours.generate(prompt, n, temperature=0, use_cache=True),
        "uncached": lambda: ours.generate(prompt, n, temperature=0, use_cache=False),
        "hf-gpt2": hf_generate,
    }

    # Warm-up, and the tokens of each contender, which must agree.
    outputs = {name: run() for name, run in contenders.items()}
    for name, out in outputs.items():
        assert out.shape == (1, args.prompt_len + n), (name, out.shape)
    same = {name: int((out == outputs["cached"]).all(dim=0).sum()) - args.prompt_len for name, out in outputs.items()}

    tokens_per_s = {name: [] for name in contenders}
    for r in range(args.rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            t0 = time.perf_counter()
            contenders[name]()
            tokens_per_s[name].append(n / (time.perf_counter() - t0))

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        per_round = [x / y for x, y in zip(tokens_per_s[a], tokens_per_s[b])]
        return statistics.median(per_round), min(per_round), max(per_round)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {N_LAYER} layers, {N_HEAD} heads, "
          f"{N_EMBD} wide, vocab {VOCAB_SIZE}, block_size {BLOCK_SIZE}; batch 1, prompt {args.prompt_len} tokens, "
          f"{n} new tokens (greedy); {args.rounds} interleaved rounds")
    print(f"{'contender':>10} {'tokens/s':>9} {'ms/token':>9}   (tokens/s min..max; new tokens equal to cached)")
    for name, v in tokens_per_s.items():
        med = statistics.median(v)
        print(f"{name:>10} {med:9.1f} {1000 / med:9.2f}   ({min(v):.1f}..{max(v):.1f}; {same[name]}/{n})")
    for a, b, target in (("cached", "uncached", 3.0), ("cached", "hf-gpt2", 1.0)):
        med, lo, hi = ratio(a, b)
        verdict = "meets" if med >= target else "MISSES"
        print(f"{a}/{b}: {med:.2f}x (median of per-round ratios, {lo:.2f}..{hi:.2f}); target >= {target:.1f}x: {verdict}")


if __name__ == "__main__":
    main()
