"""Pretrain Part VII's base model, a character-level GPT that has read arithmetic, and write it for shipping.

    python tools/train_posttrain_base.py [--steps 4000] [--out book/models/arith-baby]

Part VII (post-training: SFT, LoRA, DPO, GRPO) needs a base model small enough to post-train in a
minute on two CPU cores and a task whose answers a program can check. The base model is a character-level
GPT (4 layers, 4 heads, width 128, context 64, 0.79 M parameters) pretrained on a synthetic corpus that a
seeded program writes (:func:`corpus_lines`): 85 % sums of two operands of one or two digits in three
phrasings ("23+45=68" twice as often as "23 plus 45 is 68" and "the sum of 23 and 45 is 68"), 15 % plain
lines (little sentences and number facts), so that it is a language model that has learnt to add, not a
calculator. One unordered pair of operands in ten (:func:`is_held_out`) never appears in the corpus, in
any phrasing: the held-out prompts of the chapters use only those pairs. (Three-digit operands and
subtraction were tried first: after 1,500 steps such a model had learnt no sum at all; with one- and
two-digit sums the held-out accuracy jumps from 1.5 % at step 1,000 to 49 % at step 1,500 and 97-99 %
from step 3,500.) 4,000 steps take about 13 minutes on one CPU thread.

The chat template's three special tokens ``<|user|>``, ``<|assistant|>`` and ``<|end|>`` are reserved
in the vocabulary from the start (as real tokenizers reserve special tokens), each one character of
the :class:`~transformer_lib.data.CharTokenizer`, but never occur in pretraining: the base model has
never seen the template, and SFT (chapter 22) teaches it.

The task (the corpus, the problems, the held-out split, the checker) is ``transformer_lib.arithmetic``,
exported from chapter 22; this script only pretrains and evaluates. The directory receives ``model.safetensors`` and ``config.json`` (``GPT.save_pretrained``),
``tokenizer.json`` (``CharTokenizer.save``) and ``provenance.json`` (how it was made, the losses, the
held-out accuracies, the SHA-256 of the other three files), as tools/train_book_model.py does.
"""

from __future__ import annotations

import argparse
import re
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from transformer_lib.arithmetic import (
    DIGITS, END, HELD_OUT_EVERY, PHRASINGS, SPECIAL, VOCAB, chat_prompt, check_answer, corpus_lines, sample_problems,
)
from transformer_lib.data import CharTokenizer
from transformer_lib.sft import complete

ROOT = Path(__file__).resolve().parents[1]
INIT_SEED = 0  # torch.manual_seed before GPT(...)
CORPUS_SEED = 1234  # the corpus generator's seed
VAL_SEED = 4321  # the validation lines' seed
SHIPPED = ("model.safetensors", "config.json", "tokenizer.json")

ARITHMETIC_FRACTION = 0.85  # corpus_lines' default: the rest are plain lines


def score(model, tok, problems, *, chat: bool = True, temperature: float = 0.0, seed: int = 0,
          strict: bool = True) -> float:
    """Held-out accuracy: in the chat template (the exact sum, then <|end|>), or after the pretraining
    phrasing "a+b=" after a newline (the text before the next newline is the sum). ``strict=False``: the first
    integer of the continuation is the sum."""
    g = torch.Generator().manual_seed(seed)
    prompts = [chat_prompt(p.question) if chat else f"\n{p.a}+{p.b}=" for p in problems]
    outs = complete(model, tok, prompts, 6, temperature=temperature, generator=g, stop=END if chat else "\n")
    right = 0
    for p, o in zip(problems, outs):
        if not strict:
            m = re.search(r"\d+", o)
            right += m is not None and m.group() == p.answer
        else:
            right += check_answer(p, o) if chat else o.split("\n", 1)[0] == p.answer
    return right / len(problems)


MODEL = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False)
RECIPE = dict(batch_size=32, lr=2e-3, min_lr=2e-4, warmup_steps=100, weight_decay=0.1, seed=1337)
TRAIN_LINES, VAL_LINES = 700_000, 20_000


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    return f"{cpu}, {os.cpu_count()} logical CPUs, {threads} PyTorch thread{'s' * (threads != 1)}"


def evaluate_base(model, tok, n: int = 500) -> dict:
    """Held-out accuracies of the base model: raw prompts greedy and sampled, chat template greedy."""
    problems = sample_problems(n, held_out=True, seed=7)
    return {
        "raw_greedy": score(model, tok, problems, chat=False),
        "raw_sampled_T1": score(model, tok, problems, chat=False, temperature=1.0, seed=1),
        "chat_greedy_strict": score(model, tok, problems),
        "chat_greedy_lenient": score(model, tok, problems, strict=False),
        "problems": n,
    }


def main() -> None:
    import transformer_lib
    from transformer_lib.config import GPTConfig, TrainConfig
    from transformer_lib.evaluate import evaluate_split
    from transformer_lib.gpt import GPT
    from transformer_lib.hub import sha256sum
    from transformer_lib.rundir import METRICS_FILE
    from transformer_lib.training import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "models" / "arith-baby")
    args = parser.parse_args()

    tok = CharTokenizer(VOCAB)
    t0 = time.perf_counter()
    train_text = "\n".join(corpus_lines(TRAIN_LINES, CORPUS_SEED)) + "\n"
    val_text = "\n".join(corpus_lines(VAL_LINES, VAL_SEED)) + "\n"
    train_data = torch.tensor(tok.encode(train_text), dtype=torch.long)
    val_data = torch.tensor(tok.encode(val_text), dtype=torch.long)
    print(f"corpus: {len(train_data):,} training and {len(val_data):,} validation characters "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    model_config = GPTConfig(vocab_size=tok.vocab_size, **MODEL)
    config = TrainConfig(max_steps=args.steps, eval_interval=math.ceil(args.steps / 8), checkpoint_interval=args.steps,
                         eval_iters=10, device="cpu", precision="float32", **RECIPE)
    torch.manual_seed(INIT_SEED)
    model = GPT(model_config)
    print(f"training {model.num_params():,} parameters for {args.steps} steps on {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        calls, curve, probe = [0], [], sample_problems(200, held_out=True, seed=7)

        def probe_accuracy() -> bool:  # a learning curve: raw greedy held-out accuracy every 500 steps
            calls[0] += 1
            if calls[0] % 500 == 0:
                acc = score(model, tok, probe, chat=False)
                curve.append({"step": calls[0], "raw_greedy": acc})
                print(f"step {calls[0]}: held-out raw greedy accuracy {acc:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            return False

        history = train(model, train_data, val_data, config, out_dir=run_dir, progress=False, should_stop=probe_accuracy)
        seconds = time.perf_counter() - t0
        estimates = [json.loads(line) for line in (Path(run_dir) / METRICS_FILE).read_text().splitlines()]
    for r in estimates:
        print(f"step {r['step']:>5}: train {r['train_loss']:.4f}, validation {r['val_loss']:.4f} (estimates)")
    val_loss = evaluate_split(model, val_data, block_size=model_config.block_size)
    print(f"{len(history)} steps in {seconds:.0f} s ({1000 * seconds / len(history):.0f} ms/step); "
          f"whole-validation loss {val_loss:.6f}", flush=True)
    model.eval()
    t0 = time.perf_counter()
    accuracy = evaluate_base(model, tok)
    print(f"held-out accuracy ({time.perf_counter() - t0:.0f} s): {json.dumps(accuracy)}", flush=True)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, metadata={"recipe": "arith-baby", "steps": str(len(history))})
    tok.save(out / "tokenizer.json")
    threads = os.environ.get("OMP_NUM_THREADS")
    provenance = {
        "model": "character-level GPT pretrained on synthetic arithmetic and plain lines (Part VII's base model)",
        "parameters": model.num_params(),
        "model_config": model_config.to_dict(),
        "command": (f"OMP_NUM_THREADS={threads} " if threads else "") + f"python tools/train_posttrain_base.py --steps {args.steps}",
        "train_config": config.to_dict(),
        "init_seed": INIT_SEED,
        "corpus": {"train_lines": TRAIN_LINES, "train_seed": CORPUS_SEED, "val_lines": VAL_LINES, "val_seed": VAL_SEED,
                   "arithmetic_fraction": ARITHMETIC_FRACTION, "phrasings": list(PHRASINGS), "digits": DIGITS,
                   "held_out": f"unordered pairs with sha256('lo,hi')[:4] % {HELD_OUT_EVERY} == 0, in no line"},
        "special_tokens": {k: f"\\x{ord(v):02x}" for k, v in SPECIAL.items()},
        "steps": len(history),
        "training_seconds": round(seconds, 1),
        "whole_validation_loss": val_loss,
        "estimates": [{k: r[k] for k in ("step", "train_loss", "val_loss")} for r in estimates],
        "final_training_batch_loss": history[-1]["loss"],
        "held_out_accuracy": accuracy,
        "held_out_raw_greedy_curve": curve,
        "machine": machine(),
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
