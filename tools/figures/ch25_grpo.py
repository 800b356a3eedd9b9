"""Chapter 25: one GRPO step for one prompt: G sampled answers, rewards from a program, advantages
relative to the group, and the clipped update held near the reference model."""

from kit import COLORS, MUTED, arrow, box, canvas, line, text

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


FIGURES = {"grpo_step": grpo_step}
