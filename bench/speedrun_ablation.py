"""The speedrun ablation of Chapter 21: what each technique buys at equal wall time.

Every variant trains a character-level GPT on Tiny Shakespeare for the same budget of training
time (``--budget`` seconds, 100 by default; evaluations are not counted) with ``train``'s
``time_budget``, which also sets the length of the learning-rate schedule, then scores the whole
validation split with ``evaluate_split``. The variants are Chapter 10's baseline (the ``baby`` GPT
and the ``shakespeare-baby`` recipe, in float32), the baseline with one technique added, the baseline
with the changes that helped alone, the final recipe (the ``speedrun`` presets), and the final
recipe with AdamW in place of Muon. Runs are interleaved, seed by seed, so that a drift of the
machine's speed touches every variant alike.

The results go to ``bench/results/speedrun_ablation.json`` (one record per variant and seed, the
full configurations, the machine), which Chapter 21 reads; a run with ``--only`` replaces the
records of those variants and seeds and keeps the others.

Usage:
    python bench/speedrun_ablation.py                          # 15 variants x 3 seeds: about 85 minutes
    python bench/speedrun_ablation.py --only baseline muon --seeds 0
    python bench/speedrun_ablation.py --budget 20 --out /tmp/short.json

Run it on an otherwise idle machine: other work on the same cores slows the steps and so lowers
the number of steps every variant gets in its budget.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import torch

from transformer_lib.config import GPTConfig
from transformer_lib.data import CharTokenizer, load_tiny_shakespeare, train_val_split
from transformer_lib.evaluate import evaluate_split
from transformer_lib.gpt import GPT
from transformer_lib.config import MAX_STEPS, TrainConfig
from transformer_lib.rundir import METRICS_FILE
from transformer_lib.training import train

RESULTS = Path(__file__).resolve().parent / "results" / "speedrun_ablation.json"

#: name -> (label, GPTConfig overrides of the "baby" preset, TrainConfig overrides of the baseline).
#: The final recipe is not an override: it is the "speedrun" presets themselves.
VARIANTS: dict[str, tuple[str, dict, dict]] = {
    "baseline": ("Chapter 10 (AdamW, cosine)", {}, {}),
    "muon": ("+ Muon", {}, {"optimizer": "muon"}),
    "rope": ("+ RoPE", {"position": "rope"}, {}),
    "qk_norm": ("+ QK-norm", {"qk_norm": True}, {}),
    "relu2": ("+ ReLU²", {"activation": "relu2"}, {}),
    "untied": ("+ untied head", {"tie_embeddings": False}, {}),
    "zero_init": ("+ zero-init projections", {"zero_init": True}, {}),
    "softcap": ("+ logit soft-cap 15", {"logit_softcap": 15.0}, {}),
    "wsd": ("+ WSD schedule", {}, {"schedule": "wsd", "min_lr": 0.0}),
    "batch24": ("batch 24 instead of 12", {}, {"batch_size": 24}),
    "dropout": ("+ dropout 0.1", {"dropout": 0.1}, {}),
    "bfloat16": ("bfloat16 autocast", {}, {"precision": "bfloat16"}),
    "helped_alone": ("baseline + WSD + batch 24 + soft-cap", {"logit_softcap": 15.0},
                     {"schedule": "wsd", "min_lr": 0.0, "batch_size": 24}),
    "speedrun": ("final recipe (speedrun presets)", {}, {}),
    "speedrun_adamw": ("final recipe with AdamW, no Muon", {}, {"optimizer": "adamw"}),
}
#: The variants built from the "speedrun" presets (with their TrainConfig overrides), not from the baseline.
RECIPES = ("speedrun", "speedrun_adamw")


def configs(name: str, budget: float, vocab_size: int) -> tuple[GPTConfig, TrainConfig]:
    """The model and training configurations of variant ``name`` with a budget of ``budget`` seconds."""
    quiet = dict(eval_interval=MAX_STEPS, eval_iters=1, checkpoint_interval=MAX_STEPS)
    _, model_over, train_over = VARIANTS[name]
    if name in RECIPES:
        model = GPTConfig.from_preset("speedrun", vocab_size=vocab_size)
        return model, TrainConfig.from_preset("speedrun", time_budget=budget, **quiet, **train_over)
    model = GPTConfig.from_preset("baby", vocab_size=vocab_size, **model_over)
    recipe = {"max_steps": MAX_STEPS, "time_budget": budget, "precision": "float32", **quiet, **train_over}
    return model, TrainConfig.from_preset("shakespeare-baby", **recipe)


def run_one(name: str, seed: int, budget: float, train_data, val_data, vocab_size: int) -> dict:
    """Train variant ``name`` from seed ``seed``; return its record."""
    model_config, train_config = configs(name, budget, vocab_size)
    train_config = TrainConfig.from_dict({**train_config.to_dict(), "seed": seed})
    torch.manual_seed(seed)
    model = GPT(model_config)
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        history = train(model, train_data, val_data, train_config, out_dir=run_dir, progress=False)
        wall = time.perf_counter() - start
        last = json.loads((Path(run_dir) / METRICS_FILE).read_text().splitlines()[-1])
    val_loss = evaluate_split(model, val_data, block_size=model_config.block_size)
    return {"variant": name, "seed": seed, "val_loss": val_loss, "steps": len(history),
            "train_time": last["train_time"], "wall_time": wall,
            "tokens": len(history) * train_config.batch_size * model_config.block_size,
            "last_train_loss": sum(h["loss"] for h in history[-50:]) / min(50, len(history)),
            "model_config": model_config.to_dict(), "train_config": train_config.to_dict()}


def cpu_name() -> str:
    """The processor's model name (Linux), else what ``platform`` knows."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else (platform.processor() or platform.machine())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=100.0, help="seconds of training per run (default 100)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), help="variants to run (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args()
    text = load_tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(torch.tensor(tok.encode(text), dtype=torch.long), 0.1)
    names = args.only or list(VARIANTS)
    old = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    keep = [r for r in old["runs"] if not (r["variant"] in names and r["seed"] in args.seeds)]
    runs = []
    for seed in args.seeds:  # seed-major: every variant once per round
        for name in names:
            record = run_one(name, seed, args.budget, train_data, val_data, tok.vocab_size)
            runs.append(record)
            print(f"{name:>10} seed {seed}: val {record['val_loss']:.4f} in {record['steps']} steps "
                  f"({record['wall_time']:.1f} s)", flush=True)
            out = {"budget": args.budget, "labels": {n: VARIANTS[n][0] for n in VARIANTS},
                   "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                               "threads": torch.get_num_threads(), "torch": torch.__version__,
                               "python": platform.python_version()},
                   "date": datetime.date.today().isoformat(), "runs": keep + runs}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(out, indent=1) + "\n")
            os.replace(tmp, args.out)  # written after every run, atomically: an interruption loses one run


if __name__ == "__main__":
    main()
