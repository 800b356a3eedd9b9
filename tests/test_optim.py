"""Unit tests for transformer_lib.optim: the teaching AdamW, fused_adamw, the parameter groups, the schedules and
clipping against PyTorch (chapter 9); Muon against torch.optim.Muon, Newton-Schulz against the SVD, the Muon/AdamW
split of a GPT's parameters, and the constructor's argument checks (chapter 20)."""

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer_lib
from transformer_lib.config import GPTConfig
from transformer_lib.data import get_batch
from transformer_lib.gpt import GPT
from transformer_lib.optim import (
    NS_COEFFICIENTS,
    AdamW,
    Muon,
    MuonWithAdamW,
    clip_grad_norm_,
    cosine_lr,
    fused_adamw,
    inverse_sqrt_lr,
    newton_schulz,
    polar_express_coefficients,
    split_muon_params,
    weight_decay_groups,
)

# Our Muon runs the same operations in the same order as torch.optim.Muon (bfloat16 Newton-Schulz, addmm), so
# the updates agree to the last bit in practice; these bounds leave room only for a different summation order
# inside a kernel, far below the ~1e-3 relative error a different formula or a wrong factor would give.
ATOL = {torch.float32: 1e-7, torch.float64: 1e-12}
SHAPES = ((48, 16), (16, 40), (24, 24))

# Five quintic steps on G / ||G||_F map every singular value s >= 3e-3 ||G||_F into about [0.682, 1.202]
# (the scalar band, measured in the chapter); the margin covers the rounding of the iteration's dtype.
BAND = (0.68, 1.21)



# ================================================================ chapter 9
TINY = GPTConfig.from_preset("tiny")
DATA = (torch.arange(3000) * 7 + torch.arange(3000) // 13) % TINY.vocab_size


# ---------------------------------------------------------------- AdamW
def _pair(dtype):
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10), nn.Tanh(), nn.Linear(10, 4)).to(dtype)
    return a, copy.deepcopy(a)


def _groups(m):
    return [{"params": [m[0].weight, m[3].weight], "weight_decay": 0.2},
            {"params": [m[0].bias, m[1].weight, m[1].bias, m[3].bias], "weight_decay": 0.0, "lr": 5e-3}]


def _steps(models_opts, dtype, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(16, 6, generator=g, dtype=dtype), torch.randint(0, 4, (16,), generator=g)
        for model, opt in models_opts:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_adamw_matches_torch(dtype, atol):
    a, b = _pair(dtype)
    ours = AdamW(_groups(a), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW(_groups(b), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    _steps([(a, ours), (b, ref)], dtype, 20)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=atol, rtol=0)
    st = ours.state[a[0].weight]
    assert int(st["step"]) == 20 and set(st) == {"step", "exp_avg", "exp_avg_sq"}


def test_adamw_state_dict_round_trip():
    a, b = _pair(torch.float64)
    opt_a = AdamW(_groups(a), lr=1e-2)
    _steps([(a, opt_a)], torch.float64, 5)
    b.load_state_dict(a.state_dict())
    opt_b = AdamW(_groups(b), lr=1e-2)
    buf = io.BytesIO()  # through bytes, as a checkpoint would (a live state_dict shares its tensors)
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    opt_b.load_state_dict(torch.load(buf, weights_only=True))
    _steps([(a, opt_a), (b, opt_b)], torch.float64, 5, seed=9)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_adamw_errors():
    p = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="AdamW: lr"):
        AdamW(p, lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        AdamW(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas"):
        AdamW(p, betas=(0.9,))
    with pytest.raises(ValueError, match="weight_decay"):
        AdamW(p, weight_decay=-0.1)
    with pytest.raises(TypeError, match="eps"):
        AdamW(p, eps="small")


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_fused_adamw_matches_ours(dtype, atol):
    a, b = _pair(dtype)
    ours = AdamW(_groups(a), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    fused = fused_adamw(_groups(b), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"]  # this PyTorch has the CPU kernel
    _steps([(a, ours), (b, fused)], dtype, 20)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=atol, rtol=0)


def test_fused_adamw_state_dict_loads_into_ours_and_back():
    a, b = _pair(torch.float64)
    fused = fused_adamw(_groups(a), lr=1e-2)
    _steps([(a, fused)], torch.float64, 5)
    b.load_state_dict(a.state_dict())
    ours = AdamW(_groups(b), lr=1e-2)
    ours.load_state_dict(copy.deepcopy(fused.state_dict()))  # a live state_dict shares its tensors
    _steps([(a, fused), (b, ours)], torch.float64, 5, seed=9)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-12, rtol=0)
    again = fused_adamw(_groups(a), lr=1e-2)
    again.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert int(again.state_dict()["state"][0]["step"]) == 10


def test_fused_adamw_falls_back_to_ours(monkeypatch):
    class NoFused(torch.optim.AdamW):
        def __init__(self, *args, fused=None, **kwargs):
            if fused:
                raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", NoFused)
    groups = _groups(_pair(torch.float32)[0])
    opt = fused_adamw(groups, lr=1e-2, weight_decay=0.3)
    assert type(opt) is AdamW
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0] and opt.param_groups[1]["lr"] == 5e-3
    assert "lr" not in groups[0]  # the caller's group dicts are not filled in


def test_fused_adamw_errors():
    p = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="lr"):
        fused_adamw(p, lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        fused_adamw(p, betas=(0.9, 1.5))


# ---------------------------------------------------------------- weight_decay_groups
def test_weight_decay_groups_tied_once_and_no_decay_for_vectors(tiny_model):
    model = tiny_model
    decay, other = weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and other["weight_decay"] == 0.0
    ids = [id(p) for grp in (decay, other) for p in grp["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert sum(p is model.wte.weight for p in decay["params"]) == 1
    assert any(p is model.ln_f.weight for p in other["params"])
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in other["params"])


def test_weight_decay_groups_errors():
    with pytest.raises(TypeError, match="model"):
        weight_decay_groups([nn.Parameter(torch.zeros(2))], 0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        weight_decay_groups(nn.Linear(2, 2), -1.0)


# ---------------------------------------------------------------- schedules
def test_inverse_sqrt_lr():
    assert inverse_sqrt_lr(4000, d_model=512, warmup_steps=4000) == pytest.approx((512 * 4000) ** -0.5, rel=1e-12)
    assert inverse_sqrt_lr(1, d_model=512, warmup_steps=4000) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-12)
    assert inverse_sqrt_lr(16000, d_model=512, warmup_steps=4000, scale=2.0) == pytest.approx(
        2 * 512**-0.5 / 16000**0.5, rel=1e-12)
    with pytest.raises(ValueError, match="step"):
        inverse_sqrt_lr(0, d_model=512, warmup_steps=4000)
    with pytest.raises(TypeError, match="d_model"):
        inverse_sqrt_lr(1, d_model=512.0, warmup_steps=4000)
    with pytest.raises(ValueError, match="scale"):
        inverse_sqrt_lr(1, d_model=512, warmup_steps=4000, scale=0.0)


def test_cosine_lr():
    kw = dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert cosine_lr(0, **kw) == pytest.approx(1e-3 / 11, rel=1e-12)
    lrs = [cosine_lr(s, **kw) for s in range(10)]
    assert all(a < b for a, b in zip(lrs, lrs[1:]))  # warm-up increases
    assert cosine_lr(10, **kw) == 1e-3
    assert cosine_lr(60, **kw) == pytest.approx(5.5e-4, rel=1e-12)
    assert cosine_lr(110, **kw) == 1e-4 and cosine_lr(1000, **kw) == 1e-4
    with pytest.raises(ValueError, match="min_lr must be <= max_lr"):
        cosine_lr(0, max_lr=1e-4, min_lr=1e-3, warmup_steps=1, max_steps=10)
    with pytest.raises(ValueError, match="max_steps must be > warmup_steps"):
        cosine_lr(0, max_lr=1e-3, min_lr=0.0, warmup_steps=10, max_steps=10)
    with pytest.raises(ValueError, match="step"):
        cosine_lr(-1, **kw)
    with pytest.raises(ValueError, match="max_lr"):
        cosine_lr(0, max_lr=0.0, min_lr=0.0, warmup_steps=1, max_steps=10)


# ---------------------------------------------------------------- clip_grad_norm_
@pytest.mark.parametrize("max_norm", [0.1, 1e4])
def test_clip_grad_norm_matches_torch(max_norm):
    a, b = GPT(TINY), GPT(TINY)
    b.load_state_dict(a.state_dict())
    x, y = get_batch(DATA, 16, 3, generator=torch.Generator().manual_seed(0))
    for m in (a, b):
        m(x, y)[1].backward()
    n_ours = clip_grad_norm_(a.parameters(), max_norm)
    n_ref = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    torch.testing.assert_close(n_ours, n_ref, atol=1e-6, rtol=0)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in a.parameters()]))
    assert after.item() <= max(max_norm, n_ref.item()) * (1 + 1e-5)


def test_clip_grad_norm_errors():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_([nn.Parameter(torch.zeros(2))], 0.0)
    with pytest.raises(TypeError, match="max_norm"):
        clip_grad_norm_([nn.Parameter(torch.zeros(2))], None)


def test_clip_grad_norm_single_tensor_and_no_grads():
    p = nn.Parameter(torch.zeros(4))
    assert clip_grad_norm_(p, 1.0).item() == 0.0  # no gradient yet
    p.grad = torch.full((4,), 2.0)  # norm 4
    torch.testing.assert_close(clip_grad_norm_(p, 1.0), torch.tensor(4.0))
    torch.testing.assert_close(p.grad, torch.full((4,), 0.5), atol=1e-6, rtol=0)



# ================================================================ chapter 20
def run(opt_class, dtype, steps=5, **kw):
    """The change of each parameter after ``steps`` updates on seeded random gradients."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in SHAPES]
    start = [p.detach().clone() for p in params]
    opt = opt_class(params, **kw)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
        opt.step()
    return [p.detach() - s for p, s in zip(params, start)], opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kw", [
    dict(lr=0.02),
    dict(lr=0.02, nesterov=False),
    dict(lr=0.05, weight_decay=0.1, momentum=0.9),
    dict(lr=0.01, nesterov=False, weight_decay=0.3, adjust_lr_fn="original"),
    dict(lr=0.01, adjust_lr_fn="match_rms_adamw", ns_steps=3),
])
def test_muon_equals_torch_muon(dtype, kw):
    ours, opt = run(Muon, dtype, **kw)
    theirs, ref = run(torch.optim.Muon, dtype, **kw)
    for o, t in zip(ours, theirs):
        assert o.abs().max() > 1e-3  # the parameters moved
        assert (o - t).abs().max() <= ATOL[dtype]
    for p_ours, p_ref in zip(opt.param_groups[0]["params"], ref.param_groups[0]["params"]):
        assert torch.allclose(opt.state[p_ours]["momentum_buffer"], ref.state[p_ref]["momentum_buffer"],
                              atol=ATOL[dtype], rtol=0)


def test_muon_skips_parameters_without_gradient_and_returns_closure_loss():
    a, b = torch.randn(8, 4, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    b0 = b.detach().clone()
    opt = Muon([a, b], lr=0.1)
    a.grad = torch.randn(8, 4)
    assert opt.step(lambda: torch.tensor(3.0)).item() == 3.0
    assert torch.equal(b.detach(), b0) and b not in opt.state


def test_muon_param_groups_may_override_options():
    a, b = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    opt = Muon([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    with pytest.raises(ValueError, match="Muon: lr"):
        Muon([{"params": [a]}, {"params": [b], "lr": -1.0}], lr=0.1)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_newton_schulz_is_close_to_uv(shape, dtype):
    gen = torch.Generator().manual_seed(1)
    # singular values spread over two decades, all above 3e-3 ||G||_F
    U, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=gen, dtype=torch.float64))
    S = torch.logspace(0, -2, min(shape), dtype=torch.float64)
    G = U @ torch.diag(S) @ V.T
    assert (S / G.norm()).min() >= 3e-3
    X = newton_schulz(G, dtype=dtype)
    assert X.dtype == dtype and X.shape == G.shape
    X = X.double()
    D = U.T @ X @ V                   # diag(p^5(S / ||G||_F)) when the singular vectors are kept
    sv = torch.diagonal(D)
    off = (D - torch.diag(sv)).abs().max()
    tol_off = {torch.bfloat16: 0.1, torch.float32: 1e-4, torch.float64: 1e-10}[dtype]
    assert off <= tol_off
    assert BAND[0] - 0.02 <= sv.min() and sv.max() <= BAND[1] + 0.02
    if dtype == torch.float64:
        assert BAND[0] <= sv.min() and sv.max() <= BAND[1]
    cosine = (X * (U @ V.T)).sum() / (X.norm() * (U @ V.T).norm())
    assert cosine > 0.97


def test_newton_schulz_coefficients_and_zero_matrix():
    assert NS_COEFFICIENTS == (3.4445, -4.7750, 2.0315)
    Z = newton_schulz(torch.zeros(5, 3))
    assert torch.equal(Z, torch.zeros(5, 3, dtype=torch.bfloat16))  # eps keeps 0 / 0 away


def test_split_muon_params_on_gpt():
    model = GPT(GPTConfig.from_preset("baby", vocab_size=65))
    muon, adamw = split_muon_params(model)
    ids = [id(p) for p in muon + adamw]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in muon) == sorted(
        n for n, p in model.named_parameters() if n.startswith("blocks.") and p.ndim == 2)
    assert id(model.wte.weight) in {id(p) for p in adamw}  # the tied head/embedding stays on AdamW
    assert all(p.ndim == 2 for p in muon) and len(muon) == 16
    Muon(muon, lr=0.02)  # the Muon group is accepted as it is


def test_split_muon_params_untied_head_and_frozen():
    model = torch.nn.Sequential()
    model.add_module("emb", torch.nn.Embedding(10, 8))
    model.add_module("hidden", torch.nn.Linear(8, 8))
    model.add_module("frozen", torch.nn.Linear(8, 8))
    model.add_module("lm_head", torch.nn.Linear(8, 10))
    model.frozen.requires_grad_(False)
    muon, adamw = split_muon_params(model)
    assert [id(p) for p in muon] == [id(model.hidden.weight)]
    assert {id(p) for p in adamw} == {id(model.emb.weight), id(model.hidden.bias), id(model.lm_head.weight),
                                      id(model.lm_head.bias)}
    muon2, _ = split_muon_params(model, head=())
    assert id(model.lm_head.weight) in {id(p) for p in muon2}


def test_top_level_exports():
    assert transformer_lib.Muon is Muon and transformer_lib.split_muon_params is split_muon_params


@pytest.mark.parametrize("kw, exc, name", [
    (dict(lr=0.0), ValueError, "lr"),
    (dict(lr=-0.1), ValueError, "lr"),
    (dict(lr="0.1"), TypeError, "lr"),
    (dict(momentum=1.0), ValueError, "momentum"),
    (dict(momentum=-0.1), ValueError, "momentum"),
    (dict(ns_steps=0), ValueError, "ns_steps"),
    (dict(ns_steps=2.5), TypeError, "ns_steps"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(nesterov=1), TypeError, "nesterov"),
    (dict(ns_coefficients=(1.0, 2.0)), ValueError, "ns_coefficients"),
    (dict(ns_coefficients=[NS_COEFFICIENTS] * 4), ValueError, "ns_coefficients"),  # 4 triples for 5 steps
    (dict(ns_coefficients=[NS_COEFFICIENTS] * 4 + [(1.0, 2.0)]), ValueError, "ns_coefficients"),
    (dict(ns_coefficients=[(1.0, "2", 3.0)] * 5), TypeError, "ns_coefficients"),
    (dict(adjust_lr_fn="rms"), ValueError, "adjust_lr_fn"),
    (dict(ns_dtype=torch.int32), TypeError, "ns_dtype"),
])
def test_bad_arguments_name_the_argument(kw, exc, name):
    with pytest.raises(exc, match=f"Muon: {name} must"):
        Muon([torch.randn(4, 4, requires_grad=True)], **kw)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), ()])
def test_non_matrix_parameter_is_refused(shape):
    with pytest.raises(ValueError, match=r"Muon: params must hold 2-D matrices.*shape " + repr(shape).replace("(", r"\(").replace(")", r"\)")):
        Muon([torch.randn(4, 4, requires_grad=True), torch.randn(shape, requires_grad=True)], lr=0.02)


def test_state_dict_of_torch_muon_loads_and_continues_identically():
    """A checkpoint written with torch.optim.Muon resumes in ours (and ours round-trips) with the same updates."""
    gen = torch.Generator().manual_seed(2)
    start = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(4)]

    def steps(opt, params, gs):
        for g_step in gs:
            for p, g in zip(params, g_step):
                p.grad = g.clone()
            opt.step()

    ref_params = [t.clone().requires_grad_() for t in start]
    ref = torch.optim.Muon(ref_params, lr=0.02, weight_decay=0.1)
    steps(ref, ref_params, grads[:2])
    ours_params = [p.detach().clone().requires_grad_() for p in ref_params]
    ours = Muon(ours_params, lr=0.5)                 # the loaded groups replace these options
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))  # a checkpoint's copy, not the live buffers
    assert ours.param_groups[0]["lr"] == 0.02 and ours.param_groups[0]["ns_dtype"] == torch.bfloat16
    steps(ref, ref_params, grads[2:])
    steps(ours, ours_params, grads[2:])
    for a, b in zip(ours_params, ref_params):
        assert (a.detach() - b.detach()).abs().max() <= ATOL[torch.float32]
    again = Muon([p.detach().clone().requires_grad_() for p in ours_params], lr=0.1, ns_dtype=torch.float32)
    again.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert again.param_groups[0]["ns_dtype"] == torch.bfloat16 and len(again.state) == len(SHAPES)


# ---------------------------------------------------------------- MuonWithAdamW

MIXED = dict(lr=1e-2, muon_lr=0.05, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1, muon_weight_decay=0.05,
             momentum=0.9)


def _tiny_gpt(dtype):
    torch.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny")).to(dtype)


def _gpt_steps(pairs, n, seed=0):
    """``n`` optimizer steps of every (model, optimizer) pair on the same seeded batches of the tiny vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        idx, targets = (torch.randint(0, 65, (3, 12), generator=gen) for _ in range(2))
        for model, opt in pairs:
            opt.zero_grad(set_to_none=True)
            model(idx, targets)[1].backward()
            opt.step()


class _Reference:
    """Muon on split_muon_params' matrices and torch.optim.AdamW on the rest (decay on the 2-D ones only)."""

    def __init__(self, model, ns_dtype):
        matrices, others = split_muon_params(model)
        self.muon = Muon(matrices, lr=MIXED["muon_lr"], weight_decay=MIXED["muon_weight_decay"],
                         momentum=MIXED["momentum"], ns_dtype=ns_dtype)
        # fused=True: the kernel MuonWithAdamW calls on the CPU; foreach would differ by an ulp here and there
        self.adamw = torch.optim.AdamW(
            [{"params": [p for p in others if p.ndim >= 2], "weight_decay": MIXED["weight_decay"]},
             {"params": [p for p in others if p.ndim < 2], "weight_decay": 0.0}],
            lr=MIXED["lr"], betas=MIXED["betas"], eps=MIXED["eps"], fused=True)

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.muon.step()
        self.adamw.step()


@pytest.mark.parametrize("dtype, ns_dtype", [(torch.float32, torch.bfloat16), (torch.float64, torch.float64)])
def test_muon_with_adamw_equals_muon_plus_torch_adamw(dtype, ns_dtype):
    ours_model = _tiny_gpt(dtype)
    ref_model = copy.deepcopy(ours_model)
    start = copy.deepcopy(ours_model.state_dict())
    ours = MuonWithAdamW(ours_model, ns_dtype=ns_dtype, **MIXED)
    ref = _Reference(ref_model, ns_dtype)
    _gpt_steps([(ours_model, ours), (ref_model, ref)], 3)
    # the same operations in the same order on both sides: equal up to a kernel's summation order
    for (name, a), b in zip(ours_model.state_dict().items(), ref_model.state_dict().values()):
        assert (a - start[name]).abs().max() > 1e-4, name  # every parameter moved
        assert (a - b).abs().max() <= ATOL[dtype], (name, (a - b).abs().max().item())
    matrices, _ = split_muon_params(ours_model)
    ref_matrices, _ = split_muon_params(ref_model)
    for p, q in zip(matrices, ref_matrices):
        torch.testing.assert_close(ours.state[p]["momentum_buffer"], ref.muon.state[q]["momentum_buffer"],
                                   rtol=0, atol=ATOL[dtype])


def test_muon_with_adamw_groups():
    model = _tiny_gpt(torch.float32)
    opt = MuonWithAdamW(model, **MIXED)
    matrices, others = split_muon_params(model)
    muon, decayed, plain = opt.param_groups
    assert [g["use_muon"] for g in opt.param_groups] == [True, False, False]
    assert [id(p) for p in muon["params"]] == [id(p) for p in matrices]
    assert {id(p) for p in decayed["params"]} == {id(model.wte.weight), id(model.wpe.weight)}  # lm_head is wte
    assert [id(p) for p in plain["params"]] == [id(p) for p in others if p.ndim < 2] and plain["params"]
    assert (muon["lr"], muon["max_lr"], muon["weight_decay"], muon["momentum"]) == (0.05, 0.05, 0.05, 0.9)
    assert (decayed["lr"], decayed["max_lr"], decayed["weight_decay"]) == (1e-2, 1e-2, 0.1)
    assert (plain["lr"], plain["max_lr"], plain["weight_decay"]) == (1e-2, 1e-2, 0.0)
    assert decayed["betas"] == plain["betas"] == (0.8, 0.95)


def test_muon_with_adamw_state_dict_round_trip():
    model = _tiny_gpt(torch.float32)
    opt = MuonWithAdamW(model, ns_dtype=torch.float32, **MIXED)
    _gpt_steps([(model, opt)], 2)
    saved = copy.deepcopy(opt.state_dict())  # a checkpoint's copy, not the live buffers
    twin = copy.deepcopy(model)
    fresh = MuonWithAdamW(twin, lr=0.5, muon_lr=0.5, ns_dtype=torch.float32)  # the loaded groups replace these
    fresh.load_state_dict(saved)
    assert [g["lr"] for g in fresh.param_groups] == [0.05, 1e-2, 1e-2]
    assert [g["max_lr"] for g in fresh.param_groups] == [0.05, 1e-2, 1e-2]
    assert len(fresh.state) == len(opt.state) == len(list(model.parameters()))
    before = copy.deepcopy(model.state_dict())
    _gpt_steps([(model, opt), (twin, fresh)], 1, seed=1)
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        assert not torch.equal(a, before[name]), name
        assert torch.equal(a, b), name  # the same state and the same gradients: the same update, bit for bit


def test_muon_with_adamw_returns_the_closure_loss_and_skips_parameters_without_gradient():
    model = _tiny_gpt(torch.float32)
    opt = MuonWithAdamW(model, **MIXED)
    before = copy.deepcopy(model.state_dict())
    assert opt.step(lambda: torch.tensor(2.5)).item() == 2.5  # no gradients yet: nothing moves
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()) and not opt.state


@pytest.mark.parametrize("kw, exc, name", [
    (dict(lr=0.0), ValueError, "lr"),
    (dict(lr=float("nan")), ValueError, "lr"),
    (dict(betas=(1.0, 0.9)), ValueError, "betas"),
    (dict(betas=(0.9,)), ValueError, "betas"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(momentum=1.0), ValueError, "momentum"),
    (dict(ns_dtype=torch.int64), TypeError, "ns_dtype"),
])
def test_muon_with_adamw_bad_arguments_name_the_argument(kw, exc, name):
    with pytest.raises(exc, match=f": {name} must"):
        MuonWithAdamW(_tiny_gpt(torch.float32), **kw)


@pytest.mark.parametrize("kw, name", [(dict(muon_lr=0.0), "muon_lr"), (dict(muon_weight_decay=-1.0),
                                                                       "muon_weight_decay")])
def test_muon_with_adamw_muon_options_are_named_as_passed(kw, name):
    # The caller passed muon_lr (or muon_weight_decay): an error that names "lr" points at the wrong argument.
    with pytest.raises(ValueError, match=f"{name} must"):
        MuonWithAdamW(_tiny_gpt(torch.float32), **kw)


# ---------------------------------------------------------------- the fast Muon: batched, split_qkv, ns_dtype="auto"
def _ns_error_gain(steps=5, coefficients=NS_COEFFICIENTS):
    """Sum over the iterates X_0 .. X_steps of the largest first-order gain of the iterations still to come.

    A relative perturbation of X_k (a rounding) reaches the output multiplied by at most
    max(|(p^j)'(s)|, p^j(s) / s) over the singular values s that X_k can have, with j = steps - k (p^j(s) / s
    bounds the gain of a perturbation that turns the singular vectors, |(p^j)'| one that moves a singular value).
    For Muon's quintic and five steps: 485 + 141 + 41 + 12 + 4 + 1, about 684.
    """
    a, b, c = coefficients
    p = lambda x: a * x + b * x**3 + c * x**5
    dp = lambda x: a + 3 * b * x**2 + 5 * c * x**4
    iterates = [torch.linspace(1e-9, 1.0, 200_001, dtype=torch.float64)]
    for _ in range(steps):
        iterates.append(p(iterates[-1]))
    total = 0.0
    for k in range(steps + 1):
        slope = torch.ones_like(iterates[0])
        for j in range(k, steps):
            slope = slope * dp(iterates[j])
        total += max(slope.abs().max().item(), (iterates[steps] / iterates[k]).max().item())
    return total


def ns_float32_tolerance(n):
    """Relative Frobenius tolerance of a float32 Newton-Schulz against the float64 one, inner dimension ``n``.

    Each iterate carries a fresh rounding error of relative size about sqrt(n) u (products of length n with
    rounding errors of random sign, float32's unit roundoff u = 2^-24), and grows by the gains of
    :func:`_ns_error_gain`: tol = sqrt(n) u * 684, 4.6e-4 for n = 128 (measured: 1e-6 to 7e-6). In bfloat16 the
    same bound, 684 * 2^-8 > 1, says nothing, so bfloat16 is held to the error of torch.optim.Muon's own.
    """
    return n**0.5 * 2.0**-24 * _ns_error_gain()


def _rel(a, b):
    """Relative Frobenius difference of each matrix of a stack (the largest)."""
    a, b = a.double().flatten(-2), b.double().flatten(-2)
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


def _gradient_like(*shape, seed=0):
    """A stack of matrices with a few dominant directions over a noise floor, as gradients have."""
    gen = torch.Generator().manual_seed(seed)
    rank = 4
    low = torch.randn(*shape[:-1], rank, generator=gen) @ torch.randn(*shape[:-2], rank, shape[-1], generator=gen)
    return low + 0.1 * torch.randn(*shape, generator=gen)


def test_ns_error_gain_is_derived_from_the_polynomial():
    assert 680 < _ns_error_gain() < 690
    assert _ns_error_gain(steps=1) == pytest.approx(NS_COEFFICIENTS[0] + 1, rel=1e-3)  # a, then the rounding of X_1


@pytest.mark.parametrize("shape", [(128, 128), (128, 512), (512, 128), (48, 16), (16, 40)])
def test_batched_newton_schulz_equals_the_loop(shape):
    G = _gradient_like(6, *shape)
    n = max(shape)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, ns_float32_tolerance(n))):
        batched = newton_schulz(G.to(dtype), dtype=dtype)
        loop = torch.stack([newton_schulz(g.to(dtype), dtype=dtype) for g in G])
        assert batched.shape == G.shape and batched.dtype == dtype
        assert _rel(batched, loop) <= tol, (dtype, _rel(batched, loop), tol)
    ref = torch.stack([newton_schulz(g.double(), dtype=torch.float64) for g in G])
    assert _rel(newton_schulz(G, dtype=torch.float32), ref) <= ns_float32_tolerance(n)
    # bfloat16: no more than twice the error of the loop (torch.optim.Muon's operations) against float64
    loop_err = _rel(torch.stack([newton_schulz(g) for g in G]), ref)
    assert _rel(newton_schulz(G), ref) <= 2 * loop_err + ns_float32_tolerance(n), loop_err
    # a stack with more leading dimensions, each matrix normalised on its own
    G64 = G.double()
    four = newton_schulz(torch.stack([G64[:3], 1024 * G64[3:]]), dtype=torch.float64)
    assert _rel(four.flatten(0, 1), ref) <= 1e-12


def _run_muon_on(shapes, opt_factory, steps=3, seed=0, dtype=torch.float32):
    """Changes of parameters of ``shapes`` after ``steps`` updates of ``opt_factory(params)`` on seeded gradients."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]  # the same numbers in any dtype
    start = [p.detach().clone() for p in params]
    opt = opt_factory(params)
    for _ in range(steps):
        for p in params:
            p.grad = _gradient_like(*p.shape, seed=int(torch.randint(0, 10**6, (), generator=gen))).to(dtype)
        opt.step()
    return [p.detach() - s for p, s in zip(params, start)]


# the baby GPT's matrices, the fused in_proj (3C x C) among them, and two odd shapes
FAST_SHAPES = ((384, 128), (128, 128), (512, 128), (128, 512), (48, 16), (16, 40), (24, 24))


@pytest.mark.parametrize("kw", [dict(lr=0.02), dict(lr=0.02, nesterov=False, weight_decay=0.1),
                                dict(lr=0.01, adjust_lr_fn="match_rms_adamw", momentum=0.9)])
def test_fast_muon_against_torch_muon(kw):
    # torch.optim.Muon runs Newton-Schulz in bfloat16 whatever the parameters' dtype; the float64 reference is our
    # exact mode (the loop, torch.optim.Muon's operations) with a float64 iteration
    exact64 = _run_muon_on(FAST_SHAPES, lambda ps: Muon(ps, ns_dtype=torch.float64, **kw), dtype=torch.float64)
    for ns_dtype in (torch.float32, torch.bfloat16):
        exact = _run_muon_on(FAST_SHAPES, lambda ps: torch.optim.Muon(ps, **kw))  # bfloat16 Newton-Schulz
        fast = _run_muon_on(FAST_SHAPES, lambda ps: Muon(ps, batched=True, ns_dtype=ns_dtype, **kw))
        for shape, f, e, e64 in zip(FAST_SHAPES, fast, exact, exact64):
            if ns_dtype == torch.float32:
                # three steps: the momentum carries each step's difference on; the weights move by lr * update
                assert _rel(f, e64) <= 3 * ns_float32_tolerance(max(shape)), (shape, _rel(f, e64))
            else:
                assert _rel(f, e64) <= 2 * _rel(e, e64) + 3 * ns_float32_tolerance(max(shape)), (shape, _rel(f, e64))


def test_batched_muon_equals_the_loop_in_float64():
    for kw in (dict(lr=0.02), dict(lr=0.02, split_qkv=True, weight_decay=0.1)):
        loop = _run_muon_on(FAST_SHAPES, lambda ps: Muon(ps, ns_dtype=torch.float64, **kw), dtype=torch.float64)
        batched = _run_muon_on(FAST_SHAPES, lambda ps: Muon(ps, ns_dtype=torch.float64, batched=True, **kw),
                               dtype=torch.float64)
        for a, b in zip(batched, loop):
            assert (a - b).abs().max() <= 1e-12


@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
def test_split_qkv_is_torch_muon_on_three_matrices(adjust_lr_fn):
    """A fused (3C, C) in_proj with split_qkv=True moves as W_Q, W_K and W_V would under torch.optim.Muon."""
    C, steps = 32, 4
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(3 * C, C, generator=gen)
    grads = [_gradient_like(3 * C, C, seed=s) for s in range(steps)]
    fused = W.clone().requires_grad_()
    blocks = [w.clone().requires_grad_() for w in W.split(C)]
    opts = {"exact": Muon([fused], lr=0.02, weight_decay=0.1, split_qkv=True, adjust_lr_fn=adjust_lr_fn),
            "ref": torch.optim.Muon(blocks, lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)}
    fast = W.clone().requires_grad_()
    fast_opt = Muon([fast], lr=0.02, weight_decay=0.1, split_qkv=True, batched=True, ns_dtype=torch.float32,
                    adjust_lr_fn=adjust_lr_fn)
    ref64 = [w.double().requires_grad_() for w in W.split(C)]  # the three matrices, float64 Newton-Schulz
    ref64_opt = Muon(ref64, lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn, ns_dtype=torch.float64)
    for g in grads:
        fused.grad, fast.grad = g.clone(), g.clone()
        for b, b64, gb in zip(blocks, ref64, g.split(C)):
            b.grad, b64.grad = gb.clone(), gb.double()
        for opt in (*opts.values(), fast_opt, ref64_opt):
            opt.step()
    ref = torch.cat([b.detach() for b in blocks])
    assert (fused.detach() - ref).abs().max() <= ATOL[torch.float32]  # the loop: torch.optim.Muon's operations
    move = torch.cat([b.detach() for b in ref64]) - W.double()
    assert _rel(fast.detach() - W, move) <= steps * ns_float32_tolerance(C)
    # bfloat16, batched: no more than twice the error of torch.optim.Muon's own bfloat16 update of the three blocks
    fast16 = W.clone().requires_grad_()
    fast16_opt = Muon([fast16], lr=0.02, weight_decay=0.1, split_qkv=True, batched=True, adjust_lr_fn=adjust_lr_fn)
    for g in grads:
        fast16.grad = g.clone()
        fast16_opt.step()
    torch_err = _rel(ref - W, move)
    assert _rel(fast16.detach() - W, move) <= 2 * torch_err + steps * ns_float32_tolerance(C), torch_err
    # and it is not the fused update: orthogonalising [W_Q; W_K; W_V] as one matrix moves them differently
    whole = W.clone().requires_grad_()
    whole_opt = Muon([whole], lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)
    for g in grads:
        whole.grad = g.clone()
        whole_opt.step()
    assert _rel(whole.detach() - W, move) > 0.05


def test_split_qkv_leaves_other_shapes_alone():
    shapes = ((128, 128), (512, 128), (128, 512))
    plain = _run_muon_on(shapes, lambda ps: Muon(ps, lr=0.02, ns_dtype=torch.float64), dtype=torch.float64)
    split = _run_muon_on(shapes, lambda ps: Muon(ps, lr=0.02, ns_dtype=torch.float64, split_qkv=True),
                         dtype=torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(plain, split))


@pytest.mark.parametrize("native", [True, False])
def test_ns_dtype_auto_follows_the_probe(monkeypatch, native):
    import transformer_lib.optim as optim

    monkeypatch.setattr(optim, "cpu_has_bfloat16_matmul", lambda: native)
    assert optim.bfloat16_is_native("cpu") is native
    seen = []
    real = optim.newton_schulz
    monkeypatch.setattr(optim, "newton_schulz", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    for batched in (False, True):
        p = torch.randn(8, 4, requires_grad=True)
        p.grad = torch.randn(8, 4)
        Muon([p], lr=0.02, ns_dtype="auto", batched=batched).step()
    assert seen == [torch.bfloat16 if native else torch.float32] * 2


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_probe_on_a_gpu(monkeypatch, native):
    from transformer_lib.optim import _ns_dtype, bfloat16_is_native

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: asked.append(
        including_emulation) or native)
    assert bfloat16_is_native("cuda:0") is native and asked == [False]  # hardware bfloat16, not emulated
    assert _ns_dtype({"ns_dtype": "auto"}, torch.device("cuda")) == (torch.bfloat16 if native else torch.float32)
    assert _ns_dtype({"ns_dtype": torch.float64}, torch.device("cuda")) == torch.float64  # an explicit dtype stays


def test_bfloat16_probe_on_other_devices():
    from transformer_lib.optim import bfloat16_is_native

    assert bfloat16_is_native("meta") is False
    if not torch.cuda.is_available():
        assert bfloat16_is_native("cuda") is False


def test_muon_with_adamw_passes_the_fast_options():
    model = _tiny_gpt(torch.float32)
    opt = MuonWithAdamW(model, ns_dtype="auto", batched=True, split_qkv=True, **MIXED)
    muon = opt.param_groups[0]
    assert (muon["ns_dtype"], muon["batched"], muon["split_qkv"]) == ("auto", True, True)
    before = copy.deepcopy(model.state_dict())
    _gpt_steps([(model, opt)], 2)
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    plain = MuonWithAdamW(_tiny_gpt(torch.float32), **MIXED).param_groups[0]
    assert (plain["batched"], plain["split_qkv"]) == (False, False)


def test_muon_with_adamw_split_qkv_refuses_other_fused_shapes():
    model = nn.Sequential()
    model.add_module("mlp", nn.Linear(8, 24, bias=False))  # (24, 8): the shape of a fused in_proj, but not one
    model.add_module("lm_head", nn.Linear(24, 5))
    with pytest.raises(ValueError, match="split_qkv.*mlp.weight"):
        MuonWithAdamW(model, split_qkv=True)
    MuonWithAdamW(model)  # without split_qkv it is an ordinary matrix


@pytest.mark.parametrize("kw, exc, name", [
    (dict(batched=1), TypeError, "batched"),
    (dict(batched="yes"), TypeError, "batched"),
    (dict(split_qkv=None), TypeError, "split_qkv"),
    (dict(ns_dtype="bfloat16"), TypeError, "ns_dtype"),
    (dict(ns_dtype="Auto"), TypeError, "ns_dtype"),
])
def test_fast_options_bad_arguments_name_the_argument(kw, exc, name):
    with pytest.raises(exc, match=f"Muon: {name} must"):
        Muon([torch.randn(4, 4, requires_grad=True)], **kw)
    with pytest.raises(exc, match=f"MuonWithAdamW: {name} must"):
        MuonWithAdamW(_tiny_gpt(torch.float32), **kw)


def test_muon_with_adamw_resumes_a_state_dict_saved_before_the_fast_options():
    model = _tiny_gpt(torch.float32)
    opt = MuonWithAdamW(model, ns_dtype=torch.float32, **MIXED)
    _gpt_steps([(model, opt)], 1)
    saved = copy.deepcopy(opt.state_dict())
    for group in saved["param_groups"]:
        group.pop("batched", None), group.pop("split_qkv", None)  # as a checkpoint written before them
    twin = copy.deepcopy(model)
    fresh = MuonWithAdamW(twin, ns_dtype=torch.float32, **MIXED)
    fresh.load_state_dict(saved)
    _gpt_steps([(model, opt), (twin, fresh)], 1, seed=1)
    for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- Polar Express: one polynomial per step
def _compose(coefficients, x):
    for a, b, c in coefficients:
        x = a * x + b * x**3 + c * x**5
    return x


@pytest.mark.parametrize("steps, lower, widen", [(5, 1e-3, 0.01), (4, 1e-3, 0.0), (3, 0.05, 0.02), (8, 1e-6, 0.01)])
def test_polar_express_polynomials_equioscillate(steps, lower, widen):
    # Chebyshev: the minimax odd quintic on [lo, hi] has |1 - p| <= E on the interval, reached with alternating
    # signs at lo, the two interior extrema and hi; and it maps the interval onto [1 - E, 1 + E], the next one.
    coefficients = polar_express_coefficients(steps, lower, widen)
    assert len(coefficients) == steps
    lo, hi = lower, 1.0
    for a, b, c in coefficients:
        x = torch.linspace(lo, hi * (1 + widen), 400_001, dtype=torch.float64)
        err = 1 - (a * x + b * x**3 + c * x**5)
        E = err.abs().max().item()
        # rel 1e-7: the 4x4 solve spans lo^5 to 1 (1e-30 for lo = 1e-6), which costs digits; a wrong extremum
        # or sign would be off by percents
        assert err[0].item() == pytest.approx(E, rel=1e-7) and err[-1].item() == pytest.approx(-E, rel=1e-7)
        sign_changes = (torch.sign(err[1:]) != torch.sign(err[:-1])).sum().item()
        assert sign_changes == 3  # four alternation points: lo, q, r, hi
        lo, hi = 1 - E, 1 + E


def test_polar_express_beats_one_polynomial_at_equal_steps():
    x = torch.geomspace(1e-3, 1.0, 100_001, dtype=torch.float64) if hasattr(torch, "geomspace") else \
        torch.logspace(-3, 0, 100_001, dtype=torch.float64)
    ours = _compose(polar_express_coefficients(5), x)
    muon = _compose([NS_COEFFICIENTS] * 5, x)
    assert (ours - 1).abs().max() < 0.5 * (muon - 1).abs().max()


def test_newton_schulz_takes_one_triple_per_step():
    G = torch.randn(24, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    coefficients = polar_express_coefficients(5)
    X = G / G.norm()
    for a, b, c in coefficients:  # the iteration written out, step by step
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    for H in (G, G.T, torch.stack([G, 2 * G])):
        out = newton_schulz(H, coefficients=coefficients, dtype=torch.float64)
        want = X.T if H.shape == G.T.shape else (torch.stack([X, X]) if H.ndim == 3 else X)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # one triple, repeated, is the default iteration
    torch.testing.assert_close(newton_schulz(G, coefficients=[NS_COEFFICIENTS] * 5, dtype=torch.float64),
                               newton_schulz(G, dtype=torch.float64), rtol=0, atol=0)
    with pytest.raises(ValueError, match="one \\(a, b, c\\) per step.*4 triples for steps=5"):
        newton_schulz(G, coefficients=coefficients[:4])


def test_muon_with_polar_express_steps_with_its_polynomials():
    coefficients = polar_express_coefficients(4)
    W = torch.randn(16, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    W.grad = torch.randn(16, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    start = W.detach().clone()
    opt = Muon([W], lr=0.1, weight_decay=0.0, nesterov=False, momentum=0.0, ns_steps=4,
               ns_coefficients=coefficients, ns_dtype=torch.float64)
    assert opt.param_groups[0]["ns_coefficients"] == tuple(coefficients)
    opt.step()
    want = start - 0.1 * newton_schulz(W.grad, 4, coefficients, dtype=torch.float64)
    torch.testing.assert_close(W.detach(), want, rtol=0, atol=1e-12)
    both = MuonWithAdamW(_tiny_gpt(torch.float32), ns_coefficients=coefficients, ns_steps=4)
    assert (both.param_groups[0]["ns_coefficients"], both.param_groups[0]["ns_steps"]) == (tuple(coefficients), 4)
    with pytest.raises(ValueError, match="MuonWithAdamW: ns_coefficients must"):
        MuonWithAdamW(_tiny_gpt(torch.float32), ns_coefficients=coefficients)  # 4 triples, 5 steps


@pytest.mark.parametrize("kw, exc, name", [
    (dict(steps=0), ValueError, "steps"),
    (dict(steps=2.0), TypeError, "steps"),
    (dict(lower=0.0), ValueError, "lower"),
    (dict(lower=1.0), ValueError, "lower"),
    (dict(widen=-0.1), ValueError, "widen"),
    (dict(widen="0.01"), TypeError, "widen"),
])
def test_polar_express_bad_arguments_name_the_argument(kw, exc, name):
    with pytest.raises(exc, match=f"polar_express_coefficients: {name} must"):
        polar_express_coefficients(**kw)
