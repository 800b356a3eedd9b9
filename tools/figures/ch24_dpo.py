"""Chapter 24: DPO, a preference pair scored by the policy and the frozen reference, into one logistic loss."""

from kit import COLORS, MUTED, arrow, box, canvas, line, text


def dpo_pair():
    fig, ax = canvas(15, 8.4)
    # the pair
    box(ax, 0.3, 3.55, 2.4, 1.1, "prompt x\n“What is 27+58?”", "data", fontsize=8.5)
    arrow(ax, (2.7, 4.4), (3.4, 6.0))
    arrow(ax, (2.7, 3.8), (3.4, 2.2))
    box(ax, 3.4, 5.5, 2.4, 1.0, "chosen  y_w\n“85<|end|>”  ✓", "mlp", fontsize=8.5)
    box(ax, 3.4, 1.7, 2.4, 1.0, "rejected  y_l\n“75<|end|>”  ✗", "out", fontsize=8.5)
    text(ax, 4.6, 4.1, "a program\njudges the pair", size=8, color=MUTED)
    # the two models
    for y, who in ((6.0, "w"), (2.2, "l")):
        arrow(ax, (5.8, y), (6.4, y + 0.55))
        arrow(ax, (5.8, y), (6.4, y - 0.55))
        box(ax, 6.4, y + 0.25, 3.2, 0.65, f"policy  log π(y_{who} | x)", "attn", fontsize=8)
        box(ax, 6.4, y - 0.9, 3.2, 0.65, f"reference  log π_ref(y_{who} | x)", "plain", fontsize=8, dashed=True)
        line(ax, [(9.6, y + 0.57), (9.9, y + 0.57), (9.9, y)])
        line(ax, [(9.6, y - 0.57), (9.9, y - 0.57), (9.9, y)])
        arrow(ax, (9.9, y), (10.3, y))
        box(ax, 10.3, y - 0.45, 1.5, 0.9, f"r_{who} = β ·\n(difference)", "plain", fontsize=8)
    text(ax, 8.0, 8.0, "the frozen reference is the SFT model; it gets no gradient", size=8, color=MUTED)
    # the loss
    line(ax, [(11.8, 6.0), (12.3, 6.0), (12.3, 4.6)])
    line(ax, [(11.8, 2.2), (12.3, 2.2), (12.3, 3.6)])
    box(ax, 12.0, 3.6, 2.7, 1.0, "−log σ(r_w − r_l)", "out", fontsize=9.5, weight="bold")
    text(ax, 13.35, 2.95, "small when the policy\nprefers y_w more than\nthe reference does", size=7.5,
         color=COLORS["out"][1])
    return fig


FIGURES = {"dpo_pair": dpo_pair}
