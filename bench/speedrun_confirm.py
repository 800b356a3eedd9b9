"""Real 100-second runs of the speedrun preset against variants, seed by seed, in turns.

The sweep (``speedrun_sweep.py``) predicts the loss at equal time from fixed-step runs. This script checks the
prediction the way a user meets it: each configuration trains for the preset's time budget through ``train``
(compiled before the clock starts), then is scored on the whole validation split. For every seed the
configurations run one after the other, so that a slower or busier stretch of the machine falls on all of them
alike, in an order that alternates from seed to seed (the first record ran the preset first for every seed, so
there the order and the configuration cannot be told apart); the comparison is then paired by seed. A configuration with an average of the weights (``ema_decay``) is
also scored with its last step's weights, from the same run: the pair differs in nothing else.

Run it on an otherwise idle machine: two jobs on two cores do not share the time, they collapse it.

Usage:
    python bench/speedrun_confirm.py --seeds 0 1 2 3 4 --out bench/results/speedrun_confirm.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _machine import cpu_flags  # bench/ is on sys.path when a script here runs

#: name -> overrides of TrainConfig.from_preset("speedrun"); the first is the preset itself.
CONFIGS: dict[str, dict] = {
    "the preset (Muon lr 0.0125, EMA 0.995)": {},
    "the previous preset (Muon lr 0.05, no EMA)": {"muon_lr": 0.05, "ema_decay": 0.0},
}


def run_one(name: str, seed: int, budget: float) -> dict:
    """Train the speedrun GPT with configuration ``name`` for ``budget`` seconds and score it."""
    import transformer_lib.training as training
    from transformer_lib import GPT, GPTConfig, TrainConfig
    from transformer_lib.data import CharTokenizer, load_tiny_shakespeare, train_val_split
    from transformer_lib.evaluate import evaluate_split

    text = load_tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(torch.tensor(tok.encode(text), dtype=torch.long), 0.1)
    last = {}
    end_run = training._end_run

    def keep_last_weights(model, optimizer):  # the last step's weights, before an average replaces them
        last.update({k: v.clone() for k, v in model.state_dict().items()})
        end_run(model, optimizer)

    training._end_run = keep_last_weights
    try:
        torch.manual_seed(seed)
        model = GPT(GPTConfig.from_preset("speedrun", vocab_size=tok.vocab_size))
        config = TrainConfig.from_preset("speedrun", seed=seed, time_budget=budget, **CONFIGS[name])
        start = time.perf_counter()
        history = training.train(model, train_data, val_data, config, progress=False)
        wall = time.perf_counter() - start
    finally:
        training._end_run = end_run
    result = {"name": name, "seed": seed, "steps": len(history), "wall_seconds": round(wall, 2),
              "val_loss": evaluate_split(model, val_data, block_size=model.config.block_size)}
    if config.ema_decay:
        model.load_state_dict(last)
        result["val_loss_last_weights"] = evaluate_split(model, val_data, block_size=model.config.block_size)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results JSON (written after every run)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=float, default=100.0, help="seconds of training per run")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, as JSON [name, seed]
    args = parser.parse_args(argv)
    if args.one:
        name, seed = json.loads(args.one)
        print(json.dumps(run_one(name, seed, args.budget)))
        return
    record = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "budget": args.budget, "configs": CONFIGS, "runs": []}
    out = Path(args.out)
    for k, seed in enumerate(args.seeds):
        for name in list(CONFIGS)[:: 1 if k % 2 == 0 else -1]:  # alternate which configuration runs first
            # a process per run, so that no run inherits another's compiled code or caches
            proc = subprocess.run([sys.executable, __file__, "--budget", str(args.budget), "--out", args.out,
                                   "--one", json.dumps([name, seed])], capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            record["runs"].append(result)
            out.write_text(json.dumps(record, indent=1) + "\n")
            extra = f" (last weights {result['val_loss_last_weights']:.4f})" if "val_loss_last_weights" in result else ""
            print(f"seed {seed}  {name:<45}{result['steps']:6d} steps  whole-val {result['val_loss']:.4f}{extra}",
                  flush=True)
    for name in CONFIGS:
        losses = [r["val_loss"] for r in record["runs"] if r["name"] == name]
        print(f"{name:<45} mean {statistics.mean(losses):.4f} over {len(losses)} seeds")


if __name__ == "__main__":
    main()
