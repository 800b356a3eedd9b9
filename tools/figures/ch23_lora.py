"""Chapter 23: a LoRA layer, the frozen weight beside the trainable low-rank path, with shapes."""

from kit import COLORS, MUTED, arrow, box, canvas, line, plus, text


def lora_layer():
    fig, ax = canvas(15, 8.2)
    # the input
    box(ax, 0.4, 3.6, 2.2, 1.0, "x\n(..., in)", "data", fontsize=9)
    arrow(ax, (2.6, 4.1), (3.3, 4.1))
    line(ax, [(3.3, 6.2), (3.3, 1.8)])
    # the frozen path
    arrow(ax, (3.3, 6.2), (5.2, 6.2))
    box(ax, 5.2, 5.5, 3.6, 1.4, "W  (out × in)\nfrozen", "plain", fontsize=9, weight="bold", dashed=True)
    text(ax, 7.0, 7.35, "the pretrained weight: no gradient, no optimizer state", size=8, color=MUTED)
    line(ax, [(8.8, 6.2), (11.9, 6.2)])
    arrow(ax, (11.9, 6.2), (11.9, 4.35))
    # the low-rank path
    arrow(ax, (3.3, 1.8), (4.0, 1.8))
    box(ax, 4.0, 1.3, 1.5, 1.0, "dropout", "plain", fontsize=8)
    arrow(ax, (5.5, 1.8), (6.0, 1.8))
    box(ax, 6.0, 1.05, 1.9, 1.5, "A  (r × in)\nrandom", "attn", fontsize=8.5)
    text(ax, 6.95, 0.6, "(..., r)", size=8, color=MUTED)
    arrow(ax, (7.9, 1.8), (8.4, 1.8))
    box(ax, 8.4, 1.05, 1.9, 1.5, "B  (out × r)\nzero at start", "attn", fontsize=8.5)
    arrow(ax, (10.3, 1.8), (10.8, 1.8))
    box(ax, 10.8, 1.35, 1.0, 0.9, "× α/r", "plain", fontsize=8.5)
    line(ax, [(11.8, 1.8), (11.9, 1.8)])
    arrow(ax, (11.9, 1.8), (11.9, 3.85))
    text(ax, 8.1, 3.0, "trainable: r · (in + out) parameters", size=8, color=COLORS["attn"][1])
    # the sum
    plus(ax, 11.9, 4.1, r=0.25)
    arrow(ax, (12.15, 4.1), (12.9, 4.1))
    box(ax, 12.9, 3.6, 1.9, 1.0, "y\n(..., out)", "data", fontsize=9)
    text(ax, 7.5, 7.9, "y = x Wᵀ + (α/r) · x Aᵀ Bᵀ;   merged: W ← W + (α/r) B A", size=9.5, weight="bold")
    return fig


FIGURES = {"lora_layer": lora_layer}
