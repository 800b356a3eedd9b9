"""Fine-tune Part VII's base model briefly in the chat template, and write it for shipping: the start of chapters 24 and 25.

    OMP_NUM_THREADS=1 python tools/train_posttrain_sft.py [--steps 100] [--out book/models/arith-sft]

Chapter 22 fine-tunes ``arith-baby`` (tools/train_posttrain_base.py) for 300 steps in the chat
template. Preference optimisation (chapter 24) and RL with verifiable rewards (chapter 25) start from
a fine-tuned model and need room to improve it that a 2-core CPU can measure in a minute: this script
runs chapter 22's recipe (``init_new_tokens`` on the three special tokens, ``fine_tune`` with batch 16,
peak rate 1e-3, 20 warm-up steps, batch seed 0, on the same 4,000 training problems) for only 100
steps. On 500 held-out problems the result answers about 91 % greedily but only about 69 % when
sampled at temperature 1 (measured below and written to provenance.json): it has learnt the template
and most sums, and its sampling distribution still puts a third of its mass on wrong answers, which
is what DPO and GRPO act on. One thread makes the run reproducible bit for bit on one machine.

The directory receives ``model.safetensors`` and ``config.json`` (``GPT.save_pretrained``),
``tokenizer.json`` and ``provenance.json`` (the recipe, the accuracies, the SHA-256 of the base
model's weights and of the other three files), as tools/train_posttrain_base.py does.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("model.safetensors", "config.json", "tokenizer.json")
RECIPE = {"batch_size": 16, "lr": 1e-3, "warmup_steps": 20, "seed": 0}
TRAIN_PROBLEMS, TRAIN_SEED = 4000, 1  # chapter 22's sample_problems(4000, held_out=False, seed=1)
TEST_PROBLEMS, TEST_SEED = 500, 7  # chapter 22's held-out test set


def main() -> None:
    import transformer_lib
    from transformer_lib.arithmetic import END, SPECIAL, chat_prompt, check_answer, sample_problems
    from transformer_lib.hub import sha256sum
    from transformer_lib.pretrained import book_model_dir, load_book_model
    from transformer_lib.sft import complete, fine_tune, init_new_tokens, sft_example

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "models" / "arith-sft")
    args = parser.parse_args()

    base, tok = load_book_model("arith-baby", device="cpu")
    train = [sft_example(tok, chat_prompt(p.question), p.answer + END)
             for p in sample_problems(TRAIN_PROBLEMS, held_out=False, seed=TRAIN_SEED)]
    test = sample_problems(TEST_PROBLEMS, held_out=True, seed=TEST_SEED)

    def accuracy(m, temperature: float, seed: int) -> float:
        g = torch.Generator().manual_seed(seed)
        outs = complete(m, tok, [chat_prompt(p.question) for p in test], 6, temperature=temperature,
                        generator=g, stop=END)
        return sum(check_answer(p, o) for p, o in zip(test, outs)) / len(test)

    model = copy.deepcopy(base)
    init_new_tokens(model.wte.weight, [tok.encode(c)[0] for c in SPECIAL.values()])
    t0 = time.perf_counter()
    losses = fine_tune(model, train, steps=args.steps, **RECIPE)
    seconds = time.perf_counter() - t0
    held_out = {"greedy": accuracy(model, 0.0, 0), "sampled_T1": accuracy(model, 1.0, 1),
                "problems": TEST_PROBLEMS, "seed": TEST_SEED}
    print(f"{args.steps} steps in {seconds:.1f} s; held-out accuracy {json.dumps(held_out)}", flush=True)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, metadata={"recipe": "arith-sft", "steps": str(args.steps)})
    tok.save(out / "tokenizer.json")
    threads = os.environ.get("OMP_NUM_THREADS")
    provenance = {
        "model": "arith-baby fine-tuned in the chat template for a short run (the start of chapters 24 and 25)",
        "base_model": {"name": "arith-baby",
                       "model.safetensors_sha256": sha256sum(book_model_dir("arith-baby") / "model.safetensors")},
        "parameters": model.num_params(),
        "command": (f"OMP_NUM_THREADS={threads} " if threads else "") + f"python tools/train_posttrain_sft.py --steps {args.steps}",
        "recipe": {"steps": args.steps, **RECIPE, "train_problems": TRAIN_PROBLEMS, "train_seed": TRAIN_SEED,
                   "new_token_rows": "mean of the other rows (init_new_tokens)"},
        "special_tokens": {k: f"\\x{ord(v):02x}" for k, v in SPECIAL.items()},
        "steps": args.steps,
        "training_seconds": round(seconds, 1),
        "first_loss": losses[0],
        "last_20_mean_loss": sum(losses[-20:]) / len(losses[-20:]),
        "held_out_accuracy": held_out,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
                   f"{torch.get_num_threads()} PyTorch threads",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lib": transformer_lib.__version__,
        "files_sha256": {name: sha256sum(out / name) for name in SHIPPED},
    }
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    pins = {**provenance["files_sha256"], "provenance.json": sha256sum(out / "provenance.json")}
    print(f"wrote {', '.join(pins)} to {out}:")
    print(json.dumps({out.name: pins}, indent=4))


if __name__ == "__main__":
    main()
