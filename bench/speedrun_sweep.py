"""The speedrun's learning and speed, measured apart: which configuration reaches the lowest loss in 100 s.

A 100-second run mixes two things: how much a configuration learns per step, and how many steps the machine
gives it. This script measures them separately.

1. **Speed** (``--phase speed``): milliseconds per training step (forward, backward, optimizer) of every
   configuration, in an isolated micro-benchmark: configurations take turns, round after round, and the
   median is kept. Run it on an otherwise idle machine, with the thread count of the real run.
2. **Learning** (``--phase learn``): every configuration trains for the number of steps that fits in the
   budget at the measured speed, with the speedrun's warm-up-stable-decay schedule laid out over those
   steps. A run of a fixed number of steps does not depend on the machine's load, so these runs may share
   the machine; each is scored on the whole validation split, at its own context and at 128, and with
   exponential moving averages of its weights (``EMA_DECAYS``) in place of its last weights.

The predicted loss at equal time is the learning run's score. Rows have one seed each, three for the rows the
preset is chosen from. The best configurations are then confirmed by
real time-budget runs (``train --preset speedrun --time-budget 100`` and ``evaluate``), which Chapter 21
reports.

Configurations added later are timed in turns with one already in the record and placed at its recorded
time times their ratio to it (``--relative-to``), so that the record's other rows keep the times their
learning runs used. A compiled configuration is compiled before it is timed (``TrainConfig.compile``).

Usage:
    python bench/speedrun_sweep.py --phase speed --threads 2 --out bench/results/speedrun_sweep.json
    python bench/speedrun_sweep.py --phase learn --jobs 2 --out bench/results/speedrun_sweep.json
    python bench/speedrun_sweep.py --phase speed --relative-to "... batch 32" \
        --only "... batch 16, compiled" "... batch 32, compiled" --out bench/results/speedrun_sweep.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _machine import cpu_flags  # bench/ is on sys.path when a script here runs

#: name -> (changes to the "speedrun" GPT preset, changes to the "speedrun" training preset). The starting
#: point is the preset of the first ablation (float32, exact Muon, batches of 8 sequences of 128). Two keys are
#: the sweep's own: "fast_muon" (batched Newton-Schulz in bfloat16 where native) and "polar_express" (that many
#: Newton-Schulz steps with Polar Express's polynomials).
BASE_TRAIN = {"precision": "float32", "batch_size": 8, "compile": False}
CONFIGS: dict[str, tuple[dict, dict]] = {
    "float32, exact Muon (the first preset)": ({}, {}),
    "bfloat16 autocast": ({}, {"precision": "bfloat16"}),
    "+ fast Muon": ({}, {"precision": "bfloat16", "fast_muon": True}),
    "+ fast Muon, split q/k/v": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True}),
    "... batch 16": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True, "batch_size": 16}),
    "... batch 32": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True, "batch_size": 32}),
    "... batch 64": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True, "batch_size": 64}),
    "... batch 32, lr 8e-3": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True,
                                   "batch_size": 32, "lr": 8e-3}),
    "... batch 32, Muon lr 0.1": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True,
                                       "batch_size": 32, "muon_lr": 0.1}),
    "... batch 16, context 256": ({"block_size": 256}, {"precision": "bfloat16", "fast_muon": True,
                                                        "muon_split_qkv": True, "batch_size": 16}),
    "... batch 32, 6 layers": ({"n_layer": 6}, {"precision": "bfloat16", "fast_muon": True,
                                                "muon_split_qkv": True, "batch_size": 32}),
    "... batch 32, width 192": ({"n_embd": 192, "n_head": 3}, {"precision": "bfloat16", "fast_muon": True,
                                                               "muon_split_qkv": True, "batch_size": 32}),
    "... batch 16, compiled": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True,
                                    "batch_size": 16, "compile": True}),
    "... batch 32, compiled": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True,
                                    "batch_size": 32, "compile": True}),
    "... batch 16, compiled, decay 0.7": ({}, {"precision": "bfloat16", "fast_muon": True, "muon_split_qkv": True,
                                               "batch_size": 16, "compile": True, "decay_frac": 0.7}),
    "... batch 8, context 256, compiled": ({"block_size": 256}, {"precision": "bfloat16", "fast_muon": True,
                                                                 "muon_split_qkv": True, "batch_size": 8,
                                                                 "compile": True}),
}
#: The learning rates around the compiled batch-16 recipe (AdamW's 4e-3, Muon's 0.05), one at a time.
_COMPILED_16 = CONFIGS["... batch 16, compiled"][1]
CONFIGS.update({
    f"... batch 16, compiled, {label}": ({}, {**_COMPILED_16, field: value})
    for label, field, value in (("lr 2e-3", "lr", 2e-3), ("lr 8e-3", "lr", 8e-3),
                                ("Muon lr 0.025", "muon_lr", 0.025), ("Muon lr 0.1", "muon_lr", 0.1),
                                ("Muon lr 0.0125", "muon_lr", 0.0125), ("Muon lr 0.00625", "muon_lr", 0.00625))
})
CONFIGS["... batch 16, compiled, lr 2e-3, Muon lr 0.025"] = ({}, {**_COMPILED_16, "lr": 2e-3, "muon_lr": 0.025})
#: Polar Express (Chapter 20): one minimax polynomial per Newton-Schulz step, five steps or four.
CONFIGS.update({
    f"... batch 16, compiled, Polar Express {n}": ({}, {**_COMPILED_16, "polar_express": n}) for n in (5, 4)
})
#: Leave one out: the final recipe (the compiled batch-16 recipe with Muon's learning rate 0.0125) without one
#: of its changes, Chapter 10's choice in its place.
_FINAL = {**_COMPILED_16, "muon_lr": 0.0125}
CONFIGS.update({
    f"recipe without {label}": (model_over, {**_FINAL, **train_over}) for label, model_over, train_over in (
        ("RoPE (a learned table)", {"position": "learned"}, {}),
        ("QK-norm", {"qk_norm": False}, {}),
        ("ReLU² (GELU)", {"activation": "gelu"}, {}),
        ("the untied head", {"tie_embeddings": True}, {}),
        ("zero-init projections", {"zero_init": False}, {}),
        ("the logit soft-cap", {"logit_softcap": 0.0}, {}),
        ("WSD (cosine to 4e-5)", {}, {"schedule": "cosine", "min_lr": 4e-5}),
        ("Muon (AdamW)", {}, {"optimizer": "adamw"}),
        ("Muon (AdamW at lr 8e-3)", {}, {"optimizer": "adamw", "lr": 8e-3}),
    )
})
#: The final recipe's other learning rate and its schedule, retuned at Muon's new rate.
CONFIGS.update({
    f"recipe, {label}": ({}, {**_FINAL, field: value}) for label, field, value in (
        ("lr 2e-3", "lr", 2e-3), ("decay 0.7", "decay_frac", 0.7), ("warm-up 100", "warmup_steps", 100))
})


def _entry(name: str) -> dict:
    """The record's description of configuration ``name``: its model and training overrides."""
    return {"model": CONFIGS[name][0], "train": {**BASE_TRAIN, **CONFIGS[name][1]}}


def _build(name: str, vocab_size: int, device: str = "cpu"):
    """The model, optimizer and training configuration of a sweep configuration."""
    from transformer_lib import GPT, GPTConfig, TrainConfig
    from transformer_lib.optim import NS_COEFFICIENTS, MuonWithAdamW, polar_express_coefficients

    model_over, train_over = CONFIGS[name]
    train_over = {**BASE_TRAIN, **train_over}
    fast = train_over.pop("fast_muon", False)
    ns_steps = train_over.pop("polar_express", None)
    ns = dict(ns_steps=ns_steps, ns_coefficients=polar_express_coefficients(ns_steps)) if ns_steps else \
        dict(ns_steps=5, ns_coefficients=NS_COEFFICIENTS)
    model = GPT(GPTConfig.from_preset("speedrun", vocab_size=vocab_size, **model_over)).to(device)
    config = TrainConfig.from_preset("speedrun", device=device, **train_over)
    if config.optimizer == "adamw":
        from transformer_lib.training import _make_optimizer
        return model, _make_optimizer(model, config), config, fast
    opt = MuonWithAdamW(model, lr=config.lr, muon_lr=config.muon_lr, betas=config.betas,
                        weight_decay=config.weight_decay, ns_dtype="auto" if fast else torch.float32,
                        batched=fast, split_qkv=config.muon_split_qkv, **ns)
    return model, opt, config, fast


def speed(names: list[str], rounds: int, steps: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median ms per training step of each configuration, configurations in turns; and every round's mean."""
    from transformer_lib.data import get_batch
    from transformer_lib.training import _training_net

    data = torch.randint(0, 65, (200_000,), generator=torch.Generator().manual_seed(0))

    runs = {}
    for name in names:
        torch.manual_seed(0)
        model, opt, config, _ = _build(name, 65)
        net = _training_net(model, data, config, config.precision, 1)  # compiled here with "compile"
        runs[name] = (model, net, opt, config, torch.Generator().manual_seed(0), [])
    for r in range(rounds + 1):  # round 0 warms up
        for name, (model, net, opt, config, gen, times) in runs.items():
            start = time.perf_counter()
            for _ in range(steps):
                x, y = get_batch(data, model.config.block_size, config.batch_size, generator=gen)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bfloat16"):
                    loss = net(x, y)[1]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss.item()
            if r:
                times.append((time.perf_counter() - start) / steps)
        print(f"round {r}/{rounds}", file=sys.stderr, flush=True)
    return ({name: 1e3 * statistics.median(times) for name, (*_, times) in runs.items()},
            {name: [round(1e3 * t, 2) for t in times] for name, (*_, times) in runs.items()})


#: Decays of the exponential moving averages of the weights that every learning run also scores at its end.
EMA_DECAYS = (0.95, 0.98, 0.995, 0.998)


def _track_ema(model: torch.nn.Module, opt: torch.optim.Optimizer, decays) -> dict[float, list[torch.Tensor]]:
    """Averages of ``model``'s parameters, one per decay, updated after each ``opt.step()``."""
    averages = {d: [p.detach().clone() for p in model.parameters()] for d in decays}
    step = opt.step

    def step_and_average(*args, **kwargs):
        out = step(*args, **kwargs)
        with torch.no_grad():
            params = [p.detach() for p in model.parameters()]
            for d, average in averages.items():
                torch._foreach_lerp_(average, params, 1 - d)
        return out

    opt.step = step_and_average
    return averages


def learn_one(name: str, steps: int, seed: int) -> dict:
    """Train ``name`` for ``steps`` steps (WSD over those steps) and score it on the whole validation split."""
    import transformer_lib.training as training
    from transformer_lib.data import CharTokenizer, load_tiny_shakespeare, train_val_split
    from transformer_lib.evaluate import evaluate_split

    torch.set_num_threads(1)
    text = load_tiny_shakespeare()
    tok = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(torch.tensor(tok.encode(text), dtype=torch.long), 0.1)
    torch.manual_seed(seed)
    model, opt, config, _ = _build(name, tok.vocab_size)
    training._make_optimizer = lambda m, c: opt  # the sweep's optimizer, fast or exact
    config = type(config).from_dict({**config.to_dict(), "time_budget": 0.0, "max_steps": steps, "seed": seed,
                                     "eval_interval": 10**9, "eval_iters": 1})
    averages = _track_ema(model, opt, EMA_DECAYS)
    start = time.perf_counter()
    history = training.train(model, train_data, val_data, config, progress=False)
    seconds = time.perf_counter() - start
    losses = [h["loss"] for h in history]
    final = [p.detach().clone() for p in model.parameters()]
    ema_loss = {}
    with torch.no_grad():
        for decay, average in averages.items():
            torch._foreach_copy_([p.detach() for p in model.parameters()], average)
            ema_loss[str(decay)] = evaluate_split(model, val_data, block_size=model.config.block_size)
        torch._foreach_copy_([p.detach() for p in model.parameters()], final)
    return {"name": name, "steps": steps, "seed": seed, "tokens": steps * config.batch_size * model.config.block_size,
            "val_loss": evaluate_split(model, val_data, block_size=model.config.block_size),
            "val_loss_128": evaluate_split(model, val_data, block_size=128),
            "val_loss_ema": ema_loss,
            "train_loss_curve": [round(statistics.mean(losses[i:i + 25]), 4) for i in range(0, len(losses), 25)],
            "seconds_1_thread": seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["speed", "learn"], required=True)
    parser.add_argument("--out", required=True, help="the results JSON (speed writes it, learn adds to it)")
    parser.add_argument("--threads", type=int, default=2, help="speed: threads of the timed steps")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="speed: steps per timing")
    parser.add_argument("--budget", type=float, default=100.0, help="learn: seconds of training to predict")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="learn: runs at a time (each on 1 thread)")
    parser.add_argument("--only", nargs="+", help="configurations to run (default: all)")
    parser.add_argument("--relative-to", metavar="NAME",
                        help="speed: time the --only configurations in turns with NAME, a configuration of the record, "
                             "and add them to the record at NAME's recorded time times their ratio to it")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one learning run, as JSON
    args = parser.parse_args(argv)
    if args.one:
        name, steps, seed = json.loads(args.one)
        print(json.dumps(learn_one(name, steps, seed)))
        return
    names = args.only or list(CONFIGS)
    out = Path(args.out)
    if args.phase == "speed" and args.relative_to:
        torch.set_num_threads(args.threads)
        record = json.loads(out.read_text())
        ms, rounds = speed([args.relative_to] + names, args.rounds, args.steps)
        for n in names:
            record["configs"][n] = _entry(n)
            record["ms_per_step"][n] = record["ms_per_step"][args.relative_to] * ms[n] / ms[args.relative_to]
        record.setdefault("relative_speed", []).append({"date": datetime.date.today().isoformat(),
                                                        "threads": args.threads, "ms_per_step": ms,
                                                        "ms_per_round": rounds})
        out.write_text(json.dumps(record, indent=1) + "\n")
        for n, v in ms.items():
            print(f"{n:<45}{v:8.1f} ms/step now, {record['ms_per_step'][n]:8.1f} in the record")
        return
    if args.phase == "speed":
        torch.set_num_threads(args.threads)
        ms, rounds = speed(names, args.rounds, args.steps)
        record = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                  "cpu": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
                  "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads,
                  "configs": {n: _entry(n) for n in CONFIGS},
                  "ms_per_step": ms, "ms_per_round": rounds, "learn": []}
        out.write_text(json.dumps(record, indent=1) + "\n")
        for n, v in ms.items():
            print(f"{n:<45}{v:8.1f} ms/step {math.floor(args.budget * 1e3 / v):6d} steps in {args.budget:.0f} s")
        return
    record = json.loads(out.read_text())
    record["budget"] = args.budget
    # Learning rates and their schedule change the arithmetic of no step: such configurations share the mean
    # speed of their shape.
    def shape(n):
        return json.dumps([CONFIGS[n][0], {k: v for k, v in CONFIGS[n][1].items()
                                           if k not in ("lr", "muon_lr", "decay_frac", "warmup_steps")}])

    ms = {n: statistics.mean(v for m, v in record["ms_per_step"].items() if shape(m) == shape(n)) for n in names}
    for n in names:  # a configuration new to the record takes the speed of its shape
        record["configs"].setdefault(n, _entry(n))
        record["ms_per_step"].setdefault(n, ms[n])
    todo = [(n, math.floor(args.budget * 1e3 / ms[n]), s) for n in names for s in args.seeds]

    def run(job):
        proc = subprocess.run([sys.executable, __file__, "--phase", "learn", "--out", str(out), "--one",
                               json.dumps(job)], capture_output=True, text=True, env={**os.environ},
                              check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for result in pool.map(run, todo):
            record["learn"].append(result)
            out.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{result['name']:<45}{result['steps']:6d} steps  whole-val {result['val_loss']:.4f} "
                  f"(at context 128: {result['val_loss_128']:.4f})", flush=True)


if __name__ == "__main__":
    main()
