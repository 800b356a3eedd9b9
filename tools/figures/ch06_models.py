"""Chapter 6: the whole GPT."""

from kit import MUTED, arrow, box, canvas, line, plus, text


def gpt_architecture():
    fig, ax = canvas(9.6, 15.5)
    cx, w = 4.2, 4.4
    x = cx - w / 2
    box(ax, x, 0.3, w, 0.8, "token ids  idx (B, T)", "data")
    arrow(ax, (cx - 1.1, 1.1), (cx - 1.1, 1.7))
    arrow(ax, (cx + 1.1, 1.1), (cx + 1.1, 1.7))
    box(ax, x, 1.7, 2.1, 1.0, "token embedding\nwte (V, C)", "embed", fontsize=8)
    box(ax, x + 2.3, 1.7, 2.1, 1.0, "position embedding\nwpe (block_size, C)", "embed", fontsize=7.5)
    plus(ax, cx, 3.35)
    arrow(ax, (cx - 1.1, 2.7), (cx - 0.2, 3.25))
    arrow(ax, (cx + 1.1, 2.7), (cx + 0.2, 3.25))
    arrow(ax, (cx, 3.57), (cx, 4.3))
    text(ax, cx + 0.15, 3.95, "x (B, T, C)", ha="left", size=8, color=MUTED)

    # one block, repeated n_layer times
    by, bh = 4.3, 7.4
    box(ax, x - 0.5, by, w + 1.0, bh, "", "plain", dashed=True)
    text(ax, x + w + 0.7, by + bh - 0.35, "× n_layer", ha="left", size=10, weight="bold")
    text(ax, x + w + 0.7, by + bh - 0.85, "transformer\nblock", ha="left", va="top", size=8, color=MUTED)
    rx = x + 0.1  # the residual stream runs up the left side of the block
    line(ax, [(cx, by), (cx, by + 0.3)])
    line(ax, [(cx, by + 0.3), (rx, by + 0.3), (rx, by + 3.55)], color="#2f6db5", lw=1.6)
    arrow(ax, (cx, by + 0.3), (cx, by + 0.7))
    box(ax, cx - 1.5, by + 0.7, 3.0, 0.7, "LayerNorm", "norm")
    arrow(ax, (cx, by + 1.4), (cx, by + 1.8))
    box(ax, cx - 1.5, by + 1.8, 3.0, 1.0, "causal multi-head\nself-attention", "attn")
    arrow(ax, (cx, by + 2.8), (cx, by + 3.35))
    plus(ax, cx, by + 3.55)
    arrow(ax, (rx, by + 3.55), (cx - 0.2, by + 3.55), color="#2f6db5", lw=1.6)
    line(ax, [(cx, by + 3.75), (cx, by + 3.95), (rx, by + 3.95), (rx, by + 7.05)], color="#2f6db5", lw=1.6)
    arrow(ax, (cx, by + 3.95), (cx, by + 4.3))
    box(ax, cx - 1.5, by + 4.3, 3.0, 0.7, "LayerNorm", "norm")
    arrow(ax, (cx, by + 5.0), (cx, by + 5.4))
    box(ax, cx - 1.5, by + 5.4, 3.0, 1.0, "MLP\nC → 4C → C, GELU", "mlp")
    arrow(ax, (cx, by + 6.4), (cx, by + 6.85))
    plus(ax, cx, by + 7.05)
    arrow(ax, (rx, by + 7.05), (cx - 0.2, by + 7.05), color="#2f6db5", lw=1.6)
    text(ax, rx - 0.15, by + 5.3, "residual stream", rotation=90, size=7.5, color="#2f6db5", ha="right")

    arrow(ax, (cx, by + 7.25), (cx, by + bh + 0.4))
    y = by + bh + 0.4
    box(ax, cx - 1.5, y, 3.0, 0.7, "final LayerNorm  ln_f", "norm")
    arrow(ax, (cx, y + 0.7), (cx, y + 1.1))
    box(ax, cx - 1.5, y + 1.1, 3.0, 0.8, "lm_head (C → V)", "out")
    arrow(ax, (cx, y + 1.9), (cx, y + 2.3))
    box(ax, x, y + 2.3, w, 0.8, "logits (B, T, V)", "out")
    # the tied weight: lm_head uses wte's matrix
    line(ax, [(cx - 1.5, y + 1.5), (0.9, y + 1.5), (0.9, 2.2), (x, 2.2)], color="#2f6db5", dashed=True, lw=1.0)
    text(ax, 0.75, 8.0, "tied: lm_head.weight is wte.weight", rotation=90, size=7.5, color="#2f6db5", ha="right")
    return fig


FIGURES = {"gpt_architecture": gpt_architecture}
