"""Unit tests for transformer_lib.training (chapter 9): the loss against PyTorch's, estimate_loss, and train
(resumption, early stop, data parallelism, Chapter 21's Muon, WSD schedule and time budget)."""

import copy
import dataclasses
import json
import math
import socket
import subprocess
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer_lib
from transformer_lib.checkpoint import load_checkpoint, save_checkpoint
from transformer_lib.config import MAX_STEPS, GPTConfig, TrainConfig
from transformer_lib.gpt import GPT
from transformer_lib.optim import AdamW, weight_decay_groups
from transformer_lib.rundir import CHECKPOINT_FILE, METRICS_FILE
from transformer_lib.training import _eval_seed, cross_entropy, estimate_loss, train

# float32: a loss of a few nats has an ulp of 4.8e-7; float64: a few ulp at most.
ATOL = {torch.float32: 2e-6, torch.float64: 1e-12}
DTYPES = list(ATOL)
TINY = GPTConfig.from_preset("tiny")
DATA = (torch.arange(3000) * 7 + torch.arange(3000) // 13) % TINY.vocab_size


def small_config(**kw) -> TrainConfig:
    base = dict(max_steps=12, warmup_steps=2, batch_size=4, eval_interval=4, eval_iters=2,
                checkpoint_interval=4, device="cpu")
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------- cross_entropy
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(17, 9), (2, 6, 13)])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_matches_torch(dtype, shape, smoothing):
    g = torch.Generator().manual_seed(0)
    z = (4 * torch.randn(shape, generator=g, dtype=dtype)).requires_grad_()
    y = torch.randint(0, shape[-1], shape[:-1], generator=g)
    y[..., ::3] = -7  # a custom ignore_index
    ours = cross_entropy(z, y, ignore_index=-7, label_smoothing=smoothing)
    (g_ours,) = torch.autograd.grad(ours, z)
    ref = F.cross_entropy(z.reshape(-1, shape[-1]), y.reshape(-1), ignore_index=-7, label_smoothing=smoothing)
    (g_ref,) = torch.autograd.grad(ref, z)
    assert ours.dtype == dtype and ours.shape == ()
    torch.testing.assert_close(ours, ref, atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(g_ours, g_ref, atol=ATOL[dtype], rtol=0)


def test_cross_entropy_huge_logits_are_finite():
    z = torch.tensor([[1000.0, 999.0, 990.0]])
    loss = cross_entropy(z, torch.tensor([1]))
    torch.testing.assert_close(loss, F.cross_entropy(z, torch.tensor([1])))


def test_cross_entropy_errors():
    with pytest.raises(ValueError, match="targets.shape=\\(10,\\)"):
        cross_entropy(torch.randn(2, 5, 7), torch.zeros(10, dtype=torch.long))
    with pytest.raises(TypeError, match="targets"):
        cross_entropy(torch.randn(4, 7), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="logits"):
        cross_entropy(torch.zeros(4, 7, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        cross_entropy(torch.randn(7), torch.zeros((), dtype=torch.long))
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(torch.randn(4, 7), torch.zeros(4, dtype=torch.long), label_smoothing=1.5)
    with pytest.raises(ValueError, match="logits must not be empty"):  # an empty batch: a mean over nothing
        cross_entropy(torch.randn(0, 7), torch.zeros(0, dtype=torch.long))
    with pytest.raises(TypeError, match="ignore_index"):
        cross_entropy(torch.randn(4, 7), torch.zeros(4, dtype=torch.long), ignore_index=1.5)


def test_cross_entropy_refuses_targets_out_of_range():
    z = torch.randn(4, 7)
    with pytest.raises(ValueError, match=r"targets must hold ids in \[0, 7\) or ignore_index=-100, got the id 7"):
        cross_entropy(z, torch.tensor([0, 1, 7, 2]))
    # GPT's -1 with PyTorch's default ignore_index: the message says what to pass
    with pytest.raises(ValueError, match="got the id -1 .*pass ignore_index=-1"):
        cross_entropy(z, torch.tensor([0, -1, 3, 2]))
    ours = cross_entropy(z, torch.tensor([0, -1, 3, 2]), ignore_index=-1)
    torch.testing.assert_close(ours, F.cross_entropy(z, torch.tensor([0, -1, 3, 2]), ignore_index=-1))


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_cross_entropy_refuses_a_mean_over_nothing(ignore_index):
    targets = torch.full((2, 3), ignore_index)
    assert F.cross_entropy(torch.randn(6, 5), targets.view(-1), ignore_index=ignore_index).isnan()  # PyTorch
    with pytest.raises(ValueError, match=f"every target equals ignore_index={ignore_index}"):
        cross_entropy(torch.randn(2, 3, 5), targets, ignore_index=ignore_index)




def test_curated_top_level():
    for module, names in ((transformer_lib.training, ("train", "estimate_loss")), (transformer_lib.config, ("TrainConfig",)),
                          (transformer_lib.checkpoint, ("save_checkpoint", "load_checkpoint")),
                          (transformer_lib.optim, ("cosine_lr",))):
        for name in names:
            assert getattr(transformer_lib, name) is getattr(module, name)
    for name in ("AdamW", "cross_entropy", "clip_grad_norm_"):  # teaching versions: module only
        assert not hasattr(transformer_lib, name)



# ---------------------------------------------------------------- training
@pytest.mark.parametrize("mode", [True, False])
def test_estimate_loss_is_deterministic_and_keeps_mode(mode):
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.1)).train(mode)
    kw = dict(block_size=16, batch_size=4, iters=3, device="cpu")
    a = estimate_loss(model, DATA, generator=torch.Generator().manual_seed(0), **kw)
    b = estimate_loss(model, DATA, generator=torch.Generator().manual_seed(0), **kw)
    assert a == b and model.training is mode
    assert all(m.training is mode for m in model.modules())


def test_estimate_loss_restores_training_mode_after_an_exception():
    class Failing(nn.Module):
        def forward(self, x, y):
            raise RuntimeError("the forward pass failed")

    model = nn.Sequential(Failing(), nn.Dropout(0.1)).train()
    model.forward = model[0].forward
    with pytest.raises(RuntimeError, match="forward pass failed"):
        estimate_loss(model, DATA, block_size=16, batch_size=4, iters=3,
                      generator=torch.Generator().manual_seed(0), device="cpu")
    assert model.training and all(m.training for m in model.modules())


def test_estimate_loss_errors(tiny_model):
    kw = dict(block_size=16, batch_size=4, device="cpu")
    g = torch.Generator()
    with pytest.raises(TypeError, match="estimate_loss: generator"):
        estimate_loss(tiny_model, DATA, iters=3, generator=None, **kw)
    with pytest.raises(ValueError, match="estimate_loss: iters"):
        estimate_loss(tiny_model, DATA, iters=0, generator=g, **kw)
    with pytest.raises(ValueError, match="estimate_loss: iters"):
        estimate_loss(tiny_model, DATA, iters=10**9, generator=g, **kw)
    with pytest.raises(ValueError, match=r"estimate_loss: data must hold more than block_size=16 tokens"):
        estimate_loss(tiny_model, DATA[:16], iters=1, generator=g, **kw)
    with pytest.raises(ValueError, match=r"estimate_loss: data must hold ids in \[0, vocab_size=65\), got the id -1"):
        estimate_loss(tiny_model, torch.cat([DATA, torch.tensor([-1])]), iters=1, generator=g, **kw)
    with pytest.raises(TypeError, match="estimate_loss: data must hold integer token ids"):
        estimate_loss(tiny_model, DATA.float(), iters=1, generator=g, **kw)
    with pytest.raises(ValueError, match="estimate_loss: device must hold data"):
        estimate_loss(tiny_model, DATA, iters=1, generator=g, **{**kw, "device": "meta"})
    with pytest.raises(ValueError, match="estimate_loss: device"):
        estimate_loss(tiny_model, DATA, iters=1, generator=g, **{**kw, "device": "banana"})


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_resume_is_bit_identical(tmp_path, precision):
    cfg = GPTConfig.from_preset("tiny", dropout=0.1)
    tc = small_config(max_steps=20, eval_interval=5, checkpoint_interval=5, precision=precision)
    torch.manual_seed(0)
    straight = GPT(cfg)
    h1 = train(straight, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "a", progress=False)
    torch.manual_seed(0)
    train(GPT(cfg), DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", progress=False, stop_at=7)
    torch.manual_seed(99)
    resumed = GPT(cfg)
    h2 = train(resumed, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", resume=True, progress=False)
    assert [h["step"] for h in h2] == list(range(20))
    assert torch.equal(torch.tensor([h["loss"] for h in h1]), torch.tensor([h["loss"] for h in h2]))
    assert all(torch.equal(p, q) for p, q in zip(straight.state_dict().values(), resumed.state_dict().values()))


@pytest.mark.slow
def test_bfloat16_training_follows_float32():
    # Mixed precision: float32 weights and optimizer state, the forward pass under bfloat16 autocast.
    histories, models = {}, {}
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        models[precision] = GPT(TINY)
        histories[precision] = [h["loss"] for h in train(
            models[precision], DATA[:2500], DATA[2500:], small_config(max_steps=30, lr=1e-2, min_lr=1e-3, precision=precision), progress=False)]
    assert all(p.dtype == torch.float32 for p in models["bfloat16"].parameters())
    assert histories["float32"] != histories["bfloat16"]  # the precision did change the arithmetic
    late = [sum(h[-10:]) / 10 for h in histories.values()]
    assert abs(late[0] - late[1]) <= 0.05, late  # bfloat16 keeps about 3 significant digits
    assert late[1] < histories["bfloat16"][0] - 0.5, late  # and it trains


def test_train_writes_metrics_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = GPT(TINY)
    history = train(model, DATA[:2500], DATA[2500:], small_config(max_steps=10, eval_interval=4), out_dir=tmp_path,
                    progress=False)
    assert [set(h) for h in history] == [{"step", "loss", "lr"}] * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CHECKPOINT_FILE, METRICS_FILE])
    lines = [json.loads(s) for s in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 4, 8, 10]
    assert all(set(r) == {"step", "train_loss", "val_loss", "lr", "elapsed", "train_time", "precision", "setup_time"}
               for r in lines)
    assert all(math.isfinite(r["val_loss"]) for r in lines)
    assert lines[-1]["val_loss"] < lines[0]["val_loss"]
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)["step"] == 10
    assert model.training  # train leaves the model in training mode


def test_train_evaluates_on_batches_independent_of_the_training_stream(tmp_path):
    # The evaluation generator is not seeded like the training batches (config.seed), so the
    # training estimate does not score the first eval_iters training batches.
    config = small_config(max_steps=4, eval_interval=4, eval_iters=3)
    torch.manual_seed(0)
    initial = GPT(TINY)
    train(copy.deepcopy(initial), DATA[:2500], DATA[2500:], config, out_dir=tmp_path, progress=False)
    step0 = json.loads((tmp_path / METRICS_FILE).read_text().splitlines()[0])

    def estimate(seed):
        return estimate_loss(initial, DATA[:2500], block_size=TINY.block_size, batch_size=config.batch_size,
                             iters=config.eval_iters, generator=torch.Generator().manual_seed(seed), device="cpu")

    assert abs(step0["train_loss"] - estimate(_eval_seed(config.seed))) <= 1e-6
    assert abs(step0["train_loss"] - estimate(config.seed)) > 1e-4  # the first training batches' loss
    assert all(_eval_seed(s) != s and 0 <= _eval_seed(s) < 2**63 for s in (0, 1337, 2**63 - 1))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(model=nn.Linear(2, 2)), TypeError, "model"),
    (dict(config=dict(max_steps=12)), TypeError, "config"),
    (dict(train_data=DATA.tolist()), TypeError, "train_data"),
    (dict(val_data=DATA.view(30, 100)), ValueError, "val_data"),
    (dict(resume=1), TypeError, "resume"),
    (dict(progress="no"), TypeError, "progress"),
    (dict(stop_at=100), ValueError, "stop_at"),
    (dict(stop_at=0), ValueError, "stop_at"),
    (dict(should_stop=True), TypeError, "should_stop"),
    (dict(out_dir=3), TypeError, "out_dir"),
    (dict(resume=True), ValueError, "resume"),
    (dict(train_data=DATA.float()), TypeError, "train_data must hold integer token ids"),
    (dict(train_data=DATA[:16]), ValueError, "train_data must hold more than block_size=16 tokens"),
    (dict(val_data=DATA + 6), ValueError, r"val_data must hold ids in \[0, vocab_size=65\), got the id 70"),
    (dict(train_data=DATA - 1), ValueError, "train_data must hold ids .* got the id -1"),
])
def test_train_argument_errors(tiny_model, kw, exc, match):
    args = dict(model=tiny_model, train_data=DATA, val_data=DATA, config=small_config(), progress=False) | kw
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with pytest.raises(exc, match=f"train: {match}"):
        train(args.pop("model"), args.pop("train_data"), args.pop("val_data"), args.pop("config"), **args)
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())  # nothing trained


def _snapshot(model):
    return model.training, {k: (v.device, v.clone()) for k, v in model.state_dict().items()}


def _unchanged(model, snapshot) -> bool:
    mode, state = snapshot
    return model.training == mode and all(
        v.device == state[k][0] and torch.equal(v, state[k][1]) for k, v in model.state_dict().items()
    )


def test_train_on_the_meta_device_is_refused_and_the_model_kept(tiny_model):
    before = _snapshot(tiny_model)
    config = dataclasses.replace(small_config())
    object.__setattr__(config, "device", "meta")  # as if TrainConfig had not refused it
    with pytest.raises(ValueError, match="train: config.device must hold data, got config.device='meta'"):
        train(tiny_model, DATA, DATA, config, progress=False)
    assert _unchanged(tiny_model, before)
    meta_model = GPT(TINY).to("meta")
    with pytest.raises(ValueError, match="train: model is on the meta device"):
        train(meta_model, DATA, DATA, small_config(), progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_on_a_missing_gpu_is_refused_and_the_model_kept(tiny_model):
    before = _snapshot(tiny_model)
    for device in ("cuda", "cuda:3"):
        with pytest.raises(ValueError, match=f"train: config.device must be a device of this machine, "
                                             f"got config.device='{device}'"):
            train(tiny_model, DATA, DATA, small_config(device=device), progress=False)
    assert _unchanged(tiny_model, before)


def test_a_failure_during_training_restores_the_device_and_mode(tiny_model, monkeypatch):
    tiny_model.eval()
    moves = []
    real_to = GPT.to

    def recording_to(self, *args, **kwargs):
        moves.append(args)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "to", recording_to)

    def boom() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_model, DATA, DATA, small_config(), progress=False, should_stop=boom)
    assert not tiny_model.training  # back in the mode it came in
    assert moves == [("cpu",), (torch.device("cpu"),)]  # moved to the training device, then back home


def test_out_dir_that_is_a_file_is_refused(tmp_path, tiny_model):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="train: out_dir must be a directory, got the file"):
        train(tiny_model, DATA, DATA, small_config(), out_dir=tmp_path / "f", progress=False)
    with pytest.raises(NotADirectoryError, match="train: out_dir .*f/run cannot be created"):
        train(tiny_model, DATA, DATA, small_config(), out_dir=tmp_path / "f" / "run", progress=False)


def _save(path):
    """A checkpoint of a fresh tiny GPT at step 3, as train writes them."""
    model = GPT(TINY)
    save_checkpoint(path, model=model, optimizer=AdamW(weight_decay_groups(model, 0.1)), step=3, model_config=TINY,
                    train_config=small_config(), generator=torch.Generator().manual_seed(5))


def _resave(path, change):
    """Load the checkpoint's dict, ``change(d)`` it, and save it with torch.save (no new checksum)."""
    d = torch.load(path, weights_only=True)
    change(d)
    torch.save(d, path)


def test_resume_from_a_corrupt_checkpoint_changes_nothing(tmp_path, tiny_model):
    _save(tmp_path / CHECKPOINT_FILE)
    _resave(tmp_path / CHECKPOINT_FILE, lambda d: d["model"]["wte.weight"].add_(1.0))
    before = _snapshot(tiny_model)
    with pytest.raises(ValueError, match="checksum mismatch"):
        train(tiny_model, DATA, DATA, small_config(), out_dir=tmp_path, resume=True, progress=False)
    assert _unchanged(tiny_model, before)


def test_train_resume_errors(tmp_path, tiny_model):
    with pytest.raises(FileNotFoundError, match="ckpt.pt"):
        train(tiny_model, DATA, DATA, small_config(), out_dir=tmp_path, resume=True, progress=False)
    _save(tmp_path / CHECKPOINT_FILE)  # written for the tiny preset
    other = GPT(GPTConfig.from_preset("tiny", n_layer=1))
    with pytest.raises(ValueError, match="model_config"):
        train(other, DATA, DATA, small_config(), out_dir=tmp_path, resume=True, progress=False)


@pytest.mark.slow
def test_should_stop_checkpoints_and_resumes_exactly(tmp_path):
    cfg = GPTConfig.from_preset("tiny", dropout=0.1)
    tc = small_config(max_steps=12, eval_interval=5, checkpoint_interval=5)
    torch.manual_seed(0)
    straight = GPT(cfg)
    h1 = train(straight, DATA[:2500], DATA[2500:], tc, progress=False)
    calls = []

    def stop_after_7() -> bool:  # asked once per optimizer step
        calls.append(1)
        return len(calls) >= 7

    torch.manual_seed(0)
    h_cut = train(GPT(cfg), DATA[:2500], DATA[2500:], tc, out_dir=tmp_path, progress=False, should_stop=stop_after_7)
    assert len(h_cut) == 7 and len(calls) == 7
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 7  # written at the stop, between the intervals
    resumed = GPT(cfg)
    h2 = train(resumed, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path, resume=True, progress=False)
    assert [h["loss"] for h in h2] == [h["loss"] for h in h1]
    assert all(torch.equal(p, q) for p, q in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_should_stop_always_true_advances_one_step_per_call(tmp_path):
    kw = dict(out_dir=tmp_path, progress=False, should_stop=lambda: True)
    torch.manual_seed(0)
    steps = [len(train(GPT(TINY), DATA[:2500], DATA[2500:], small_config(max_steps=4), **kw))]
    for _ in range(3):
        steps.append(len(train(GPT(TINY), DATA[:2500], DATA[2500:], small_config(max_steps=4), resume=True, **kw)))
        assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == steps[-1]
    assert steps == [1, 2, 3, 4]  # a stop asked for at the last step is an ordinary end
    evaluated = [json.loads(s)["step"] for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert evaluated == [0, 4]  # stops write a checkpoint but no evaluation


# ---------------------------------------------------------------- distributed data parallel
DDP_WORKER = '''
import sys
import torch
import torch.distributed as dist
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.gpt import GPT
from transformer_lib.training import train

dist.init_process_group("gloo")
data = (torch.arange(3000) * 7 + torch.arange(3000) // 13) % 65
torch.manual_seed(100 + dist.get_rank())  # different initialisations: DDP must start from rank 0's
model = GPT(GPTConfig.from_preset("tiny", bias=False))
config = TrainConfig(**{**eval(sys.argv[2]), "batch_size": 4})
train(model, data[:2500], data[2500:], config, out_dir=sys.argv[1], progress=False)
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.subprocess
def test_ddp_two_processes_match_one_process_with_the_global_batch(tmp_path):
    """2 gloo processes x batch 4 vs 1 process x batch 8, 6 steps of the tiny GPT without biases.

    The two ranks' gradients are means over 4 sequences; DDP averages them, which is the mean
    over all 8 up to float32 rounding, so the parameters agree to a few ulp: atol 1e-6 for values of
    order 1 (ulp 1.2e-7). Biases are left out because the key bias has a gradient that is exactly 0
    in exact arithmetic; in float32 it is rounding noise, which Adam's normalisation amplifies to
    updates of order lr, different in the two runs.
    """
    fields = dict(max_steps=6, warmup_steps=2, eval_interval=3, eval_iters=2, checkpoint_interval=3, device="cpu")
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={port}", str(script), str(tmp_path / "ddp"), repr(fields)],
        capture_output=True, text=True, timeout=300,  # a loaded machine starts two processes slowly
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ckpt = load_checkpoint(tmp_path / "ddp" / "ckpt.pt")
    torch.manual_seed(100)
    single = GPT(GPTConfig.from_preset("tiny", bias=False))
    history = train(single, DATA[:2500], DATA[2500:], TrainConfig(**fields, batch_size=8), progress=False)
    assert ckpt["step"] == 6 and ckpt["model"].keys() == single.state_dict().keys()
    for name, value in single.state_dict().items():
        torch.testing.assert_close(ckpt["model"][name], value, atol=1e-6, rtol=0, msg=name)
    ddp_losses = torch.tensor([h["loss"] for h in ckpt["metrics"]["history"]])
    torch.testing.assert_close(ddp_losses, torch.tensor([h["loss"] for h in history]), atol=1e-5, rtol=0)
    lines = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in lines] == [0, 3, 6]  # rank 0 alone wrote the log


# ---------------------------------------------------------------- Chapter 21: Muon, the WSD schedule, a time budget
def _wsd(step, c):
    """The warm-up, stable, decay schedule of a step-based run, written out."""
    if step < c.warmup_steps:
        return c.lr * (step + 1) / (c.warmup_steps + 1)
    fraction = step / c.max_steps
    return c.min_lr + min(1.0, (1.0 - fraction) / c.decay_frac) * (c.lr - c.min_lr)


def test_wsd_schedule_in_a_step_based_run():
    config = small_config(max_steps=20, warmup_steps=2, decay_frac=0.5, min_lr=0.0, lr=2e-3, schedule="wsd",
                          eval_interval=20, checkpoint_interval=20)
    torch.manual_seed(0)
    history = train(GPT(TINY), DATA[:2500], DATA[2500:], config, progress=False)
    lrs = [h["lr"] for h in history]
    assert len(lrs) == 20
    for step, lr in enumerate(lrs):  # the same few operations: equal up to their rounding
        assert math.isclose(lr, _wsd(step, config), rel_tol=1e-12, abs_tol=0), (step, lr, _wsd(step, config))
    assert lrs[:2] == pytest.approx([2e-3 / 3, 4e-3 / 3], rel=1e-12)  # warm-up
    assert lrs[2:11] == [2e-3] * 9  # stable at the peak until the last half of the run
    assert lrs[11:] == sorted(lrs[11:], reverse=True) and lrs[-1] == pytest.approx(2e-3 * 0.1, rel=1e-12)


class _RecordingMuonWithAdamW(transformer_lib.optim.MuonWithAdamW):
    """MuonWithAdamW that records its groups' (use_muon, lr) at every step."""

    seen: list = []

    def step(self, closure=None):
        type(self).seen.append([(g["use_muon"], g["lr"]) for g in self.param_groups])
        return super().step(closure)


def test_muon_training_scales_each_group_by_its_peak(tmp_path, monkeypatch):
    monkeypatch.setattr(_RecordingMuonWithAdamW, "seen", [])
    monkeypatch.setattr(transformer_lib.training, "MuonWithAdamW", _RecordingMuonWithAdamW)
    config = small_config(max_steps=10, optimizer="muon", lr=2e-3, min_lr=2e-4, muon_lr=0.03, eval_interval=10,
                          checkpoint_interval=5)
    torch.manual_seed(0)
    model = GPT(TINY)
    start = copy.deepcopy(model.state_dict())
    history = train(model, DATA[:2500], DATA[2500:], config, out_dir=tmp_path, progress=False, stop_at=5)
    seen = _RecordingMuonWithAdamW.seen
    assert len(seen) == len(history) == 5
    for groups, h in zip(seen, history):
        assert [use for use, _ in groups] == [True, False, False]
        muon_lr, adam_lrs = groups[0][1], [lr for _, lr in groups[1:]]
        assert adam_lrs == [h["lr"]] * 2  # AdamW follows the schedule of lr itself
        assert math.isclose(muon_lr / adam_lrs[0], 0.03 / 2e-3, rel_tol=1e-12), (muon_lr, adam_lrs)
    groups = load_checkpoint(tmp_path / CHECKPOINT_FILE)["optimizer"]["param_groups"]
    assert [g["use_muon"] for g in groups] == [True, False, False]
    assert [g["max_lr"] for g in groups] == [0.03, 2e-3, 2e-3]
    assert math.isclose(groups[0]["lr"] / groups[1]["lr"], 0.03 / 2e-3, rel_tol=1e-12)
    matrix = "blocks.0.attn.in_proj.weight"
    assert not torch.equal(model.state_dict()[matrix], start[matrix])  # the matrices were trained


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_resume_with_muon_is_bit_identical(tmp_path, schedule):
    cfg = GPTConfig.from_preset("tiny", dropout=0.1)
    tc = small_config(max_steps=16, eval_interval=4, checkpoint_interval=4, optimizer="muon", schedule=schedule)
    torch.manual_seed(0)
    straight = GPT(cfg)
    h1 = train(straight, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "a", progress=False)
    torch.manual_seed(0)
    train(GPT(cfg), DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", progress=False, stop_at=7)
    torch.manual_seed(99)
    resumed = GPT(cfg)
    h2 = train(resumed, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", resume=True, progress=False)
    assert [h["step"] for h in h2] == list(range(16))
    assert [h["loss"] for h in h1] == [h["loss"] for h in h2] and [h["lr"] for h in h1] == [h["lr"] for h in h2]
    assert all(torch.equal(p, q) for p, q in zip(straight.state_dict().values(), resumed.state_dict().values()))
    a, b = (load_checkpoint(tmp_path / d / CHECKPOINT_FILE)["optimizer"] for d in ("a", "b"))
    for key in a["state"]:
        for name, t in a["state"][key].items():
            assert torch.equal(t, b["state"][key][name]), (key, name)  # momentum buffers and Adam moments


def test_time_budget_stops_the_run_and_decays_the_learning_rate(tmp_path, monkeypatch):
    # The loop reads the clock through its module's `time`: a clock that advances 1/128 s per reading makes
    # every step take exactly 1/128 s of training time, whatever the machine's load.
    readings = iter(range(10**6))
    monkeypatch.setattr(transformer_lib.training, "time", types.SimpleNamespace(perf_counter=lambda: next(readings) / 128))
    budget = 1.0
    config = small_config(max_steps=MAX_STEPS, warmup_steps=2, lr=2e-3, min_lr=0.0, schedule="wsd",
                          decay_frac=0.5, time_budget=budget, eval_interval=10**6, checkpoint_interval=10**6)
    torch.manual_seed(0)
    history = train(GPT(TINY), DATA[:2500], DATA[2500:], config, out_dir=tmp_path, progress=False)
    assert len(history) == 128  # the step that brings the training time to the budget is the last
    records = [json.loads(s) for s in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 128]  # an evaluation at the start and where the budget ran out
    assert records[-1]["train_time"] == budget and records[-1]["elapsed"] > budget  # evaluations count in elapsed
    checkpoint = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert checkpoint["step"] == 128 and checkpoint["metrics"]["train_time"] == budget
    lrs = [h["lr"] for h in history]
    assert lrs[:2] == [2e-3 / 3, 2e-3 * 2 / 3]  # the warm-up counts steps, not seconds
    # then the peak until half the budget is spent, and a linear decay to 0 over the second half
    expected = [2e-3 * min(1.0, (1.0 - step / 128) / 0.5) for step in range(2, 128)]
    assert lrs[2:] == pytest.approx(expected, rel=1e-12, abs=0.0)


# ---------------------------------------------------------------- Chapter 10: precision="auto"
def test_time_precisions_times_both_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = GPT(TINY)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    times = transformer_lib.training.time_precisions(model, DATA, batch_size=2, device="cpu", passes=2)
    assert set(times) == {"float32", "bfloat16"} and all(t > 0 for t in times.values()), times
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in model.parameters())  # .grad untouched
    assert torch.equal(torch.get_rng_state(), rng) and model.training


class _NoBfloat16GPT(GPT):
    """A GPT on a device that cannot run bfloat16: its forward pass fails under bfloat16 autocast."""

    def forward(self, *args, **kwargs):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("bfloat16 is not supported here")
        return super().forward(*args, **kwargs)


def test_time_precisions_leaves_out_a_precision_the_device_cannot_run():
    torch.manual_seed(0)
    times = transformer_lib.training.time_precisions(_NoBfloat16GPT(TINY), DATA, batch_size=2, device="cpu")
    assert set(times) == {"float32"}, times


def _fixed_probe(monkeypatch, times: dict) -> list:
    """Make train's probe report ``times``; returns the list of calls it received."""
    calls = []

    def probe(model, data, *, batch_size, device, passes=3):
        calls.append((batch_size, str(device)))
        return dict(times)

    monkeypatch.setattr(transformer_lib.training, "time_precisions", probe)
    return calls


@pytest.mark.parametrize("times, chosen", [
    ({"float32": 1.0, "bfloat16": 0.89}, "bfloat16"),   # more than 10 % faster
    ({"float32": 1.0, "bfloat16": 0.91}, "float32"),    # faster, but not by enough to give up float32
    ({"float32": 1.0, "bfloat16": 3.0}, "float32"),     # emulated bfloat16
    ({"float32": 1.0}, "float32"),                      # a device without bfloat16
])
def test_auto_precision_trains_in_the_precision_the_probe_picks(tmp_path, monkeypatch, times, chosen):
    calls = _fixed_probe(monkeypatch, times)
    runs = {}
    for precision in ("auto", chosen):
        torch.manual_seed(0)
        model = GPT(TINY)
        history = train(model, DATA[:2500], DATA[2500:], small_config(max_steps=4, precision=precision),
                        out_dir=tmp_path / precision, progress=False)
        runs[precision] = (history, model.state_dict())
    assert calls == [(4, "cpu")]  # asked once, by the "auto" run, with the run's batch size
    (h_auto, w_auto), (h_fixed, w_fixed) = runs["auto"], runs[chosen]
    assert [h["loss"] for h in h_auto] == [h["loss"] for h in h_fixed]  # the same run, bit for bit
    assert all(torch.equal(w_auto[k], w_fixed[k]) for k in w_auto)
    records = [json.loads(s) for s in (tmp_path / "auto" / METRICS_FILE).read_text().splitlines()]
    assert {r["precision"] for r in records} == {chosen}
    assert load_checkpoint(tmp_path / "auto" / CHECKPOINT_FILE)["metrics"]["precision"] == chosen


def test_a_resumed_auto_run_keeps_the_precision_it_started_in(tmp_path, monkeypatch):
    config = small_config(max_steps=8, precision="auto")
    _fixed_probe(monkeypatch, {"float32": 1.0, "bfloat16": 0.5})
    torch.manual_seed(0)
    train(GPT(TINY), DATA[:2500], DATA[2500:], config, out_dir=tmp_path / "a", stop_at=4, progress=False)
    calls = _fixed_probe(monkeypatch, {"float32": 1.0, "bfloat16": 2.0})  # the machine changed its mind
    resumed = GPT(TINY)
    train(resumed, DATA[:2500], DATA[2500:], config, out_dir=tmp_path / "a", resume=True, progress=False)
    assert calls == []  # no second probe
    torch.manual_seed(0)
    straight = GPT(TINY)
    train(straight, DATA[:2500], DATA[2500:], dataclasses.replace(config, precision="bfloat16"), progress=False)
    assert all(torch.equal(p, q) for p, q in zip(straight.state_dict().values(), resumed.state_dict().values()))
    records = [json.loads(s) for s in (tmp_path / "a" / METRICS_FILE).read_text().splitlines()]
    assert {r["precision"] for r in records} == {"bfloat16"}


def test_precision_auto_is_a_choice_and_others_are_refused():
    assert TrainConfig(precision="auto").precision == "auto"
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="float16")


DDP_VOTE_WORKER = '''
import sys
import torch
import torch.distributed as dist
import transformer_lib.training as training
from transformer_lib.config import GPTConfig, TrainConfig
from transformer_lib.gpt import GPT

dist.init_process_group("gloo")
rank = dist.get_rank()
# rank 0 finds bfloat16 twice as fast, rank 1 finds it slower: they must agree on float32
training.time_precisions = lambda *a, **k: {"float32": 1.0, "bfloat16": 0.5 if rank == 0 else 2.0}
data = (torch.arange(3000) * 7 + torch.arange(3000) // 13) % 65
model = GPT(GPTConfig.from_preset("tiny", bias=False))
config = TrainConfig(max_steps=2, warmup_steps=1, batch_size=2, eval_interval=2, eval_iters=1, precision="auto")
training.train(model, data[:2500], data[2500:], config, out_dir=sys.argv[1], progress=False)
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.subprocess
def test_ddp_ranks_agree_on_the_auto_precision(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(DDP_VOTE_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={port}", str(script), str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert load_checkpoint(tmp_path / "ddp" / CHECKPOINT_FILE)["metrics"]["precision"] == "float32"


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("split", [True, False])
def test_muon_in_train_batches_newton_schulz_where_bfloat16_is_native(monkeypatch, native, split):
    monkeypatch.setattr(transformer_lib.training, "bfloat16_is_native", lambda device: native)
    config = small_config(optimizer="muon", muon_split_qkv=split)
    opt = transformer_lib.training._make_optimizer(GPT(TINY), config)
    (muon,) = [g for g in opt.param_groups if g["use_muon"]]
    assert muon["ns_dtype"] == "auto" and muon["batched"] is native and muon["split_qkv"] is split


# ---------------------------------------------------------------- Chapter 21: TrainConfig(compile=True)
def _count_compiles(monkeypatch, make=None):
    """Count torch.compile's calls in train; ``make(module)`` replaces what it returns."""
    calls, real = [], torch.compile

    def fake(module, *args, **kwargs):
        calls.append(module)
        return make(module) if make is not None else real(module, *args, **kwargs)

    monkeypatch.setattr(torch, "compile", fake)
    return calls


def test_a_compiled_run_matches_the_eager_run(tmp_path, monkeypatch):
    config = small_config(max_steps=6, eval_interval=6, checkpoint_interval=6)
    runs = {}
    for compiled in (False, True):
        calls = _count_compiles(monkeypatch)
        torch.manual_seed(0)
        model = GPT(TINY)
        out = tmp_path / str(compiled)
        history = train(model, DATA[:2500], DATA[2500:], dataclasses.replace(config, compile=compiled), out_dir=out,
                        progress=False)
        assert len(calls) == int(compiled)
        runs[compiled] = [h["loss"] for h in history], model, json.loads((out / METRICS_FILE).read_text().splitlines()[-1])
        assert list(model.state_dict()) == list(GPT(TINY).state_dict())  # the bare model, no "_orig_mod."
    (eager_losses, eager, _), (compiled_losses, compiled, record) = runs[False], runs[True]
    # float32: the compiled kernels sum in other orders (a few ulp of a loss of 4 nats, ~1e-6 per step); six AdamW
    # steps at lr 1e-3 move the weights by at most 6e-3, so rounding-level gradient differences stay far below 1e-4.
    assert max(abs(a - b) for a, b in zip(eager_losses, compiled_losses)) < 1e-4, (eager_losses, compiled_losses)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert record["setup_time"] > 0.0


def test_compiling_leaves_gradients_and_random_state_as_they_were(monkeypatch):
    from transformer_lib.training import _training_net

    calls = _count_compiles(monkeypatch)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.1))  # dropout draws from the global generator
    sentinels = [torch.full_like(p, 7.0) for p in model.parameters()]
    for p, s in zip(model.parameters(), sentinels):
        p.grad = s
    state = torch.get_rng_state()
    net = _training_net(model, DATA, small_config(compile=True), "float32", 1)
    assert len(calls) == 1 and net is not model
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is s for p, s in zip(model.parameters(), sentinels))


def test_a_failed_compilation_warns_and_trains_eagerly(tmp_path, monkeypatch):
    class Broken(nn.Module):
        def forward(self, *args):
            raise RuntimeError("no C++ compiler found\nmore detail")

    config = small_config(max_steps=4, eval_interval=4, checkpoint_interval=4)
    torch.manual_seed(0)
    eager = GPT(TINY)
    eager_history = train(eager, DATA[:2500], DATA[2500:], config, progress=False)
    calls = _count_compiles(monkeypatch, make=lambda module: Broken())
    torch.manual_seed(0)
    model = GPT(TINY)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed, training without it \(RuntimeError: no C\+\+ "
                                            r"compiler found\)"):
        history = train(model, DATA[:2500], DATA[2500:], dataclasses.replace(config, compile=True), progress=False)
    assert len(calls) == 1
    assert [h["loss"] for h in history] == [h["loss"] for h in eager_history]  # the same eager run, bit for bit


def test_a_failed_compilation_names_the_compiler_error_not_its_wrapper(monkeypatch):
    # torch.compile wraps a backend's error in BackendCompilerFailed, whose message opens with the line
    # "backend='...' raised:"; the warning must name the error underneath (its type and first non-empty line).
    from transformer_lib.training import _training_net

    def failing_backend(graph_module, example_inputs):
        raise OSError("\n  g++ was killed by signal 9\nmore detail")

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: real(module, backend=failing_backend))
    torch.manual_seed(0)
    model = GPT(TINY)
    with pytest.warns(RuntimeWarning) as caught:
        net = _training_net(model, DATA, small_config(compile=True), "float32", 1)
    assert net is model  # trains uncompiled
    (message,) = [str(w.message) for w in caught if "torch.compile failed" in str(w.message)]
    assert message == "train: torch.compile failed, training without it (OSError: g++ was killed by signal 9)", message


def test_root_cause_follows_inner_exceptions_and_causes():
    from torch._dynamo.exc import BackendCompilerFailed

    from transformer_lib.training import _root_cause

    compiler_error = RuntimeError("C++ compile error\n\nCommand: g++ ...")
    wrapped = BackendCompilerFailed(lambda: None, compiler_error, None)
    assert str(wrapped).splitlines()[0].endswith("raised:")
    assert _root_cause(wrapped) == "RuntimeError: C++ compile error"
    try:
        try:
            raise KeyError("missing")
        except KeyError as err:
            raise ValueError("outer") from err
    except ValueError as err:
        assert _root_cause(err) == "KeyError: 'missing'"
    assert _root_cause(RuntimeError("")) == "RuntimeError"


@pytest.mark.parametrize("bfloat16_matmul", [False, True], ids=["fused kernel", "two matmuls"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_speedrun_model_compiles_into_one_graph(precision, bfloat16_matmul, monkeypatch):
    # A graph break splits the compiled step (e.g. a call Dynamo does not trace, such as PyTorch's CPU probes).
    import transformer_lib.multihead as multihead

    monkeypatch.setattr(multihead, "_CPU_BF16_MATMUL", bfloat16_matmul)  # both paths of the attention
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("speedrun", block_size=32))
    x = DATA[:64].view(2, 32)

    def loss(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            return model(x, y)[1]

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(loss)(x, x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.parametrize("times,chosen", [
    ({"float32": 1.0, "bfloat16": 0.9}, "bfloat16"),   # at the threshold: bfloat16
    ({"float32": 1.0, "bfloat16": 0.91}, "float32"),
    ({"float32": 1.0, "bfloat16": 3.0}, "float32"),    # emulated bfloat16
    ({"float32": 1.0}, "float32"),                     # a device without bfloat16
])
def test_faster_precision_takes_bfloat16_only_at_the_threshold_or_below(times, chosen):
    from transformer_lib.training import BFLOAT16_SPEEDUP, faster_precision

    assert BFLOAT16_SPEEDUP == 0.9
    assert faster_precision(times) == chosen


# ---------------------------------------------------------------- Chapter 21: an average of the weights (EMA)
def _averages(model, config, checkpoint) -> dict:
    """The checkpoint's averages by parameter name (the optimizer's state is keyed by its own order)."""
    from transformer_lib.training import _make_optimizer

    name_of = {id(p): n for n, p in model.named_parameters()}
    order = [name_of[id(p)] for g in _make_optimizer(model, config).param_groups for p in g["params"]]
    return {order[i]: s["ema"] for i, s in checkpoint["optimizer"]["state"].items() if "ema" in s}


@pytest.mark.parametrize("value,exc", [(1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                                       ("0.9", TypeError), (True, TypeError)])
def test_ema_decay_is_checked(value, exc):
    with pytest.raises(exc, match="TrainConfig: ema_decay"):
        TrainConfig(ema_decay=value)
    assert TrainConfig(ema_decay=0).ema_decay == 0.0 and TrainConfig.from_preset("speedrun").ema_decay == 0.995


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_track_ema_matches_torch_averaged_model(optimizer):
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from transformer_lib.training import _end_run, _make_optimizer

    torch.manual_seed(0)
    model = GPT(TINY)
    opt = _make_optimizer(model, small_config(optimizer=optimizer, ema_decay=0.8))
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))
    g = torch.Generator().manual_seed(0)
    for _ in range(15):
        x = DATA[torch.randint(0, 2900, (4,), generator=g)[:, None] + torch.arange(17)]
        model(x[:, :-1], x[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        reference.update_parameters(model)
    # each update rounds once per element: 15 updates stay within 15 u (u = 2^-24) of the largest weight
    bound = 15 * 2.0**-24 * max(p.abs().max().item() for p in model.parameters())
    for p, q in zip(model.parameters(), reference.module.parameters()):
        torch.testing.assert_close(opt.state[p]["ema"], q, atol=bound, rtol=0)
    assert any(not torch.equal(p, opt.state[p]["ema"]) for p in model.parameters())
    _end_run(model, opt)
    assert all(torch.equal(p, opt.state[p]["ema"]) for p in model.parameters())


def test_track_ema_arguments():
    from transformer_lib.training import track_ema

    opt = torch.optim.SGD(GPT(TINY).parameters(), lr=0.1)
    with pytest.raises(TypeError, match="track_ema: optimizer must be"):
        track_ema(object(), 0.9)
    with pytest.raises(ValueError, match="track_ema: decay"):
        track_ema(opt, 1.0)
    assert track_ema(opt, 0.5) is opt


@pytest.mark.slow
def test_a_run_with_ema_ends_with_the_average_and_resumes_bit_for_bit(tmp_path):
    cfg = GPTConfig.from_preset("tiny", dropout=0.1)
    tc = small_config(max_steps=12, eval_interval=4, checkpoint_interval=4, optimizer="muon", ema_decay=0.8)
    torch.manual_seed(0)
    straight = GPT(cfg)
    h1 = train(straight, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "a", progress=False)
    torch.manual_seed(0)
    cut = GPT(cfg)
    train(cut, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", progress=False, stop_at=5)
    interrupted = load_checkpoint(tmp_path / "b" / CHECKPOINT_FILE)
    averages = _averages(cut, tc, interrupted)
    assert len(averages) == len(list(cut.parameters()))
    assert any(not torch.equal(interrupted["model"][n], a) for n, a in averages.items())  # its last weights kept
    torch.manual_seed(99)
    resumed = GPT(cfg)
    h2 = train(resumed, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path / "b", resume=True, progress=False)
    assert [h["loss"] for h in h1] == [h["loss"] for h in h2]
    assert all(torch.equal(p, q) for p, q in zip(straight.state_dict().values(), resumed.state_dict().values()))
    final = load_checkpoint(tmp_path / "a" / CHECKPOINT_FILE)
    assert all(torch.equal(final["model"][n], a) for n, a in _averages(straight, tc, final).items())
    assert all(torch.equal(p, final["model"][n]) for n, p in straight.named_parameters())
    torch.manual_seed(0)
    plain = GPT(cfg)
    h3 = train(plain, DATA[:2500], DATA[2500:], dataclasses.replace(tc, ema_decay=0.0), progress=False)
    assert [h["loss"] for h in h3] == [h["loss"] for h in h1]  # the average changes no step
    assert not all(torch.equal(p, q) for p, q in zip(plain.parameters(), straight.parameters()))


def test_a_budgeted_run_that_reaches_max_steps_ends_with_the_average(tmp_path):
    # max_steps ends the run before its budget is spent: the run is over all the same
    tc = small_config(max_steps=6, time_budget=10**6, schedule="wsd", ema_decay=0.8)
    torch.manual_seed(0)
    model = GPT(TINY)
    assert len(train(model, DATA[:2500], DATA[2500:], tc, out_dir=tmp_path, progress=False)) == 6
    final = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    averages = _averages(model, tc, final)
    assert len(averages) == len(list(model.parameters()))
    assert all(torch.equal(p, averages[n]) for n, p in model.named_parameters())
