"""Chapter 25: one GRPO step for one prompt: G sampled answers, rewards from a program, advantages
relative to the group, and the clipped update held near the reference model; and PPO's clipped
surrogate min(rho A, clip(rho, 1 - eps, 1 + eps) A) against the ratio rho, for A > 0 and A < 0."""

from matplotlib.patches import Rectangle

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, text

SAMPLES = [("12<e>", 1), ("13<e>", 0), ("12<e>", 1), ("2<e>", 0), ("12<e>", 1), ("112<e>", 0)]


def grpo_step():
    fig, ax = canvas(18, 9.2)
    text(ax, 9.0, 8.75, "GRPO: the group is the baseline; a program gives the reward", size=10, weight="bold")
    # the prompt and the policy
    box(ax, 0.3, 4.1, 2.6, 1.2, "prompt q\n'what is 7+5?'", "data", fontsize=8.5)
    arrow(ax, (2.9, 4.7), (3.5, 4.7))
    box(ax, 3.5, 4.0, 2.0, 1.4, "policy\n$\\pi_\\theta$\n(sample, T=1)", "embed", fontsize=8.5)
    # the group of samples
    G = len(SAMPLES)
    mean = sum(r for _, r in SAMPLES) / G
    std = (sum((r - mean) ** 2 for _, r in SAMPLES) / (G - 1)) ** 0.5
    top, step = 7.4, 1.05
    text(ax, 7.3, 8.1, f"G = {G} answers $o_i$", size=8.5, color=MUTED)
    text(ax, 10.1, 8.1, "reward $r_i$\n(check_answer)", size=8.5, color=MUTED)
    text(ax, 12.6, 8.1, "advantage\n$(r_i - \\mathrm{mean}) / \\mathrm{std}$", size=8.5, color=MUTED)
    for i, (answer, r) in enumerate(SAMPLES):
        y = top - i * step
        arrow(ax, (5.5, 4.7), (6.3, y), color=MUTED, lw=0.8)
        box(ax, 6.3, y - 0.35, 2.0, 0.7, answer, "data", fontsize=8.5)
        arrow(ax, (8.3, y), (9.4, y), color=MUTED, lw=0.8)
        box(ax, 9.4, y - 0.35, 1.4, 0.7, str(r), "mlp" if r else "out", fontsize=9)
        arrow(ax, (10.8, y), (11.8, y), color=MUTED, lw=0.8)
        a = (r - mean) / std
        box(ax, 11.8, y - 0.35, 1.6, 0.7, f"{a:+.2f}", "mlp" if a > 0 else "out", fontsize=9)
        line(ax, [(13.4, y), (13.9, y)], color=MUTED, lw=0.8)
    line(ax, [(13.9, top), (13.9, top - (G - 1) * step)], color=MUTED, lw=0.8)
    arrow(ax, (13.9, 4.7), (14.4, 4.7))
    # the loss
    box(ax, 14.4, 3.2, 3.4, 3.0, "loss per token:\n$-\\min(\\rho A,\\ \\mathrm{clip}(\\rho) A)$\n"
        "$+\\ \\beta\\, \\mathrm{KL}_{k3}(\\pi_\\theta \\| \\pi_{ref})$\n\n$\\rho = \\pi_\\theta / \\pi_{old}$",
        "out", fontsize=8.5)
    box(ax, 14.95, 0.9, 3.0, 1.0, "reference $\\pi_{ref}$\n(the SFT model, frozen)", "plain", fontsize=8, dashed=True)
    arrow(ax, (16.45, 1.9), (16.45, 3.2), color=MUTED, dashed=True)
    # the update goes back to the policy
    line(ax, [(14.75, 3.2), (14.75, 1.2), (4.5, 1.2)], color=COLORS["out"][1])
    arrow(ax, (4.5, 1.2), (4.5, 4.0), color=COLORS["out"][1])
    text(ax, 9.6, 0.55, "gradient step: more probability on the answers better than their group's mean,\n"
         "less on the worse; no value network, no reward model", size=8.5, color=COLORS["out"][1])
    return fig


EPS = 0.2


def _surrogate_panel(ax, x0, y0, w, h, A, title):
    """One panel: min(rho A, clip(rho) A) for rho in [0, 2], the flat (zero-gradient) part shaded."""
    lo, hi = 0.0, 2.0                                  # rho range
    ymin, ymax = -2.2, 2.2                             # objective range
    X = lambda rho: x0 + (rho - lo) / (hi - lo) * w
    Y = lambda v: y0 + (v - ymin) / (ymax - ymin) * h
    # the region where the clip is active: the term is constant, no gradient from the advantage
    a, b = (1 + EPS, hi) if A > 0 else (lo, 1 - EPS)
    fill, edge = COLORS["cache"]
    ax.add_patch(Rectangle((X(a), y0), X(b) - X(a), h, facecolor=fill, edgecolor="none"))
    text(ax, (X(a) + X(b)) / 2, y0 + (0.18 if A > 0 else 0.82) * h, "clipped:\nno gradient", size=7.5, color=edge)
    # axes
    arrow(ax, (X(lo), Y(0)), (X(hi) + 0.3, Y(0)), color=INK, lw=0.9)
    line(ax, [(X(lo), y0), (X(lo), y0 + h)], color=INK, lw=0.9)
    text(ax, X(hi) + 0.35, Y(0) - 0.35, "$\\rho$", size=9, ha="right")
    for rho in (1 - EPS, 1.0, 1 + EPS):
        line(ax, [(X(rho), y0), (X(rho), y0 + h)], color=MUTED, lw=0.6, dashed=True)
        text(ax, X(rho), y0 - 0.3, f"{rho:g}", size=7.5, color=MUTED)
    text(ax, X(1.0), y0 + h + 0.3, "on-policy: $\\rho = 1$", size=7.5, color=MUTED)
    # the unclipped rho A (dashed) and the clipped surrogate
    rhos = [lo + i * (hi - lo) / 200 for i in range(201)]
    line(ax, [(X(r), Y(r * A)) for r in rhos], color=MUTED, lw=1.0, dashed=True)
    clip = lambda r: min(max(r, 1 - EPS), 1 + EPS)
    line(ax, [(X(r), Y(min(r * A, clip(r) * A))) for r in rhos], color=COLORS["embed"][1], lw=2.0)
    text(ax, x0 + w / 2, y0 + h + 0.85, title, size=9, weight="bold")


def grpo_clip():
    fig, ax = canvas(18, 7.0)
    _surrogate_panel(ax, 1.0, 1.0, 6.8, 4.6, +1.0,
                     "$A > 0$: push $\\pi_\\theta$ up, but only to $\\rho = 1 + \\varepsilon$")
    _surrogate_panel(ax, 10.2, 1.0, 6.8, 4.6, -1.0,
                     "$A < 0$: push $\\pi_\\theta$ down, but only to $\\rho = 1 - \\varepsilon$")
    text(ax, 0.55, 3.3, "per-token\nobjective", size=7.5, color=MUTED, rotation=90)
    text(ax, 9.75, 3.3, "per-token\nobjective", size=7.5, color=MUTED, rotation=90)
    line(ax, [(6.2, 0.25), (6.8, 0.25)], color=COLORS["embed"][1], lw=2.0)
    text(ax, 6.9, 0.25, "$\\min(\\rho A,\\ \\mathrm{clip}(\\rho, 1 \\pm \\varepsilon) A)$, $\\varepsilon = 0.2$", size=8, ha="left")
    line(ax, [(11.6, 0.25), (12.2, 0.25)], color=MUTED, lw=1.0, dashed=True)
    text(ax, 12.3, 0.25, "$\\rho A$ unclipped", size=8, ha="left")
    return fig


FIGURES = {"grpo_step": grpo_step, "grpo_clip": grpo_clip}
