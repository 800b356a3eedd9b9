"""Train the book's Shakespeare model with chapter 10's recipe and write it for shipping.

    python tools/train_book_model.py [--steps 6000] [--out book/models/shakespeare-baby]

Chapter 10's recipe is the preset ``TrainConfig.from_preset("shakespeare-baby")`` on the ``baby``
GPT; chapter 10 gives it a 100-second budget, which decides the number of steps (about 2,000 on a
2-core CPU in float32, the recipe's cap of 6,000 where bfloat16 is fast). The shipped model is
trained for a fixed number of steps instead (default: the cap), in float32 on the CPU, with the
weights initialised from ``torch.manual_seed(0)`` as in chapter 10 and the batches drawn from the
recipe's ``seed``, so that the same command reproduces its weights (bit for bit on the same machine,
PyTorch version and number of threads; up to float rounding elsewhere). The shipped
``model.safetensors`` was written before ``save_pretrained`` sorted the header's metadata keys, so a
retrained file holds the same tensors under a header in another order, and another SHA-256. The directory receives
``model.safetensors`` and ``config.json`` (``GPT.save_pretrained``), ``tokenizer.json``
(``CharTokenizer.save``) and ``provenance.json`` (how it was made, its whole-validation loss, the
SHA-256 of the other three files). The script prints the digests to paste into chapter 10's entries
of ``PINNED_FILES`` (``book/10_shakespeare.md``), which pin all four files; chapters 12, 14 and 15 load the
model with ``transformer_lib.pretrained.load_book_model``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

import transformer_lib
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.data import CharTokenizer, load_tiny_shakespeare, train_val_split
from transformer_lib.evaluate import evaluate_split
from transformer_lib.gpt import GPT
from transformer_lib.hub import PINNED_FILES, sha256sum
from transformer_lib.rundir import METRICS_FILE
from transformer_lib.training import train

ROOT = Path(__file__).resolve().parents[1]
INIT_SEED = 0  # torch.manual_seed before GPT(...), as chapter 10 does
SHIPPED = ("model.safetensors", "config.json", "tokenizer.json")


def machine() -> str:
    """The processor, its core count and the threads PyTorch used, in words."""
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


def command(steps: int) -> str:
    """The command line that reproduces the run, with the thread count when it was set."""
    threads = os.environ.get("OMP_NUM_THREADS")
    return (f"OMP_NUM_THREADS={threads} " if threads else "") + f"python tools/train_book_model.py --steps {steps}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "models" / "shakespeare-baby")
    args = parser.parse_args()

    text = load_tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    train_data, val_data = train_val_split(data, 0.1)
    model_config = GPTConfig.from_preset("baby", vocab_size=tok.vocab_size)
    config = TrainConfig.from_preset("shakespeare-baby", max_steps=args.steps, eval_interval=math.ceil(args.steps / 8),
                                     checkpoint_interval=args.steps, eval_iters=10, device="cpu", precision="float32")
    torch.manual_seed(INIT_SEED)
    model = GPT(model_config)
    print(f"training {model.num_params():,} parameters for {args.steps} steps on {machine()}", flush=True)
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        history = train(model, train_data, val_data, config, out_dir=run_dir, progress=False)
        seconds = time.perf_counter() - t0
        estimates = [json.loads(line) for line in (Path(run_dir) / METRICS_FILE).read_text().splitlines()]
    for r in estimates:
        print(f"step {r['step']:>5}: train {r['train_loss']:.4f}, validation {r['val_loss']:.4f} (estimates)")
    val_loss = evaluate_split(model, val_data, block_size=model_config.block_size)
    print(f"{len(history)} steps in {seconds:.0f} s; whole-validation loss {val_loss:.6f}", flush=True)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, metadata={"recipe": "shakespeare-baby", "steps": str(len(history))})
    tok.save(out / "tokenizer.json")
    provenance = {
        "model": "baby GPT (GPTConfig.from_preset('baby')), character-level, trained on Tiny Shakespeare",
        "parameters": model.num_params(),
        "command": command(args.steps),
        "recipe": "TrainConfig.from_preset('shakespeare-baby') (chapter 10), float32, CPU",
        "train_config": config.to_dict(),
        "init_seed": INIT_SEED,
        "steps": len(history),
        "training_seconds": round(seconds, 1),  # wall time, on a machine that may have been busy
        "whole_validation_loss": val_loss,
        "validation_positions": len(val_data) - 1,
        "estimates": [{k: r[k] for k in ("step", "train_loss", "val_loss")} for r in estimates],
        "final_training_batch_loss": history[-1]["loss"],
        "data": "tinyshakespeare.txt: the first 90 % for training, the last 10 % for validation",
        "data_sha256": PINNED_FILES["tinyshakespeare.txt"].sha256,  # load_tiny_shakespeare verified it
        "machine": machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lib": transformer_lib.__version__,
        "files_sha256": {name: sha256sum(out / name) for name in SHIPPED},
    }
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    pins = {**provenance["files_sha256"], "provenance.json": sha256sum(out / "provenance.json")}
    print(f"wrote {', '.join(pins)} to {out}; paste the digests into PINNED_FILES (book/10_shakespeare.md):")
    print(json.dumps({out.name: pins}, indent=4))


if __name__ == "__main__":
    main()
