"""Chapter 5: the block and its residual stream (post-LN against pre-LN), the axes a normalisation
averages over, and the two feed-forward networks."""

from matplotlib.patches import Circle

from kit import COLORS, INK, MUTED, arrow, box, canvas, grid, line, plus, text

BLUE = COLORS["embed"][1]


def _sublayer(ax, cx, y, name, kind, pre, ln):
    """One sublayer with its residual path; returns the y where it ends."""
    rx = cx - 1.9
    line(ax, [(cx, y), (cx, y + 0.2), (rx, y + 0.2), (rx, y + 2.75)], color=BLUE, lw=1.6)
    arrow(ax, (rx, y + 2.75), (cx - 0.2, y + 2.75), color=BLUE, lw=1.6)
    if pre:
        arrow(ax, (cx, y + 0.2), (cx, y + 0.45))
        box(ax, cx - 1.2, y + 0.45, 2.4, 0.55, ln, "norm", fontsize=8)
        arrow(ax, (cx, y + 1.0), (cx, y + 1.25))
        box(ax, cx - 1.2, y + 1.25, 2.4, 0.9, name, kind, fontsize=8)
        arrow(ax, (cx, y + 2.15), (cx, y + 2.55))
        plus(ax, cx, y + 2.75)
        return y + 2.95
    arrow(ax, (cx, y + 0.2), (cx, y + 0.6))
    box(ax, cx - 1.2, y + 0.6, 2.4, 0.9, name, kind, fontsize=8)
    arrow(ax, (cx, y + 1.5), (cx, y + 2.55))
    plus(ax, cx, y + 2.75)
    arrow(ax, (cx, y + 2.95), (cx, y + 3.25))
    box(ax, cx - 1.2, y + 3.25, 2.4, 0.55, ln, "norm", fontsize=8)
    return y + 3.8


def pre_post_ln():
    fig, ax = canvas(13, 10.9)
    top = 8.9  # both columns end at the same height
    for k, (pre, title) in enumerate(((False, "post-LN (2017 paper)"), (True, "pre-LN (GPT-2, this book)"))):
        cx = 3.2 + k * 6.3
        text(ax, cx - 0.4, 10.5, title, size=10, weight="bold")
        box(ax, cx - 1.2, 0.2, 2.4, 0.6, "X  (B, T, C)", "data", fontsize=8)
        y = _sublayer(ax, cx, 0.8, "multi-head\nself-attention", "attn", pre, "LN$_1$")
        text(ax, cx + 0.2, y + 0.1, "H", ha="left", size=8, color=MUTED)
        y = _sublayer(ax, cx, y, "feed-forward\nC → 4C → C", "mlp", pre, "LN$_2$")
        arrow(ax, (cx, y), (cx, top))
        box(ax, cx - 1.2, top, 2.4, 0.6, "Y  (B, T, C)", "data", fontsize=8)
        text(ax, cx, top + 0.95, "to the next block", size=8, color=MUTED)
    text(ax, 0.5, 4.8, "every path from input to output\npasses a LayerNorm", size=7.5, color=MUTED,
         ha="left", rotation=90)
    text(ax, 12.7, 4.8, "the residual stream (blue) is never\nnormalised: x + f(LN(x))", size=7.5,
         color=BLUE, rotation=90)
    return fig


def _tensor(ax, x0, y0, B, T, C, cell, fills):
    """B sheets of (T, C) cells, drawn back to front with an offset, so that they read as a (B, T, C) block."""
    off = 0.24
    for b in reversed(range(B)):
        grid(ax, x0 + b * off, y0 + b * off, T, C, cell=cell, kind="data",
             fills=lambda i, j, b=b: fills(b, i, j))
    return off


def norm_axes():
    fig, ax = canvas(15, 6.9)
    B, T, C, cell = 3, 4, 6, 0.45
    ln_fill, bn_fill = "#c9b3e6", "#f6bf86"
    panels = (
        ("layer norm: statistics of one position", lambda b, i, j: ln_fill if (b == 0 and i == 1) else None,
         "μ, σ over the C features of one position:\none pair per position, B·T pairs"),
        ("batch norm: statistics of one feature", lambda b, i, j: bn_fill if j == 2 else None,
         "μ, σ over all B·T positions of the batch:\none pair per feature, C pairs"),
    )
    for k, (title, fills, note) in enumerate(panels):
        x0, y0 = 2.4 + k * 7.5, 3.3
        cx = x0 + 1.5
        text(ax, cx, 6.45, title, size=10, weight="bold")
        off = _tensor(ax, x0, y0, B, T, C, cell, fills)
        w, h = C * cell, T * cell
        text(ax, x0 + w / 2, y0 - 0.12, "C features →", size=8, color=MUTED, va="top")
        text(ax, x0 - 0.2, y0 + h / 2, "T positions", size=8, color=MUTED, ha="right", rotation=90)
        text(ax, x0 + w + (B - 1) * off + 0.2, y0 + h + (B - 1) * off - 0.2, "B sequences", size=8,
             color=MUTED, ha="left")
        text(ax, cx, 2.3, note, size=8)
    # the gain and bias of layer norm: one entry per feature, shared by every position
    gx, gy = 2.4, 0.45
    grid(ax, gx, gy, 1, C, cell=cell, kind="norm")
    text(ax, gx + C * cell + 0.25, gy + cell / 2, "γ, β: one value per feature, shape (C,),\n"
         "the same for every position", size=8, ha="left")
    return fig


def ffn_swiglu():
    fig, ax = canvas(15, 8.6)
    # left: the FFN of (ffn)
    cx = 3.4
    text(ax, cx, 8.2, "FeedForward (GPT-2)", size=10, weight="bold")
    box(ax, cx - 1.5, 0.3, 3.0, 0.6, "x  (B, T, C)", "data", fontsize=8)
    arrow(ax, (cx, 0.9), (cx, 1.4))
    box(ax, cx - 1.5, 1.4, 3.0, 0.8, "fc1: C → 4C", "mlp", fontsize=8)
    arrow(ax, (cx, 2.2), (cx, 2.7))
    text(ax, cx + 0.15, 2.45, "(B, T, 4C)", ha="left", size=7.5, color=MUTED)
    box(ax, cx - 1.5, 2.7, 3.0, 0.7, "GELU", "mlp", fontsize=8)
    arrow(ax, (cx, 3.4), (cx, 3.9))
    box(ax, cx - 1.5, 3.9, 3.0, 0.6, "dropout", "plain", fontsize=8)
    arrow(ax, (cx, 4.5), (cx, 5.0))
    box(ax, cx - 1.5, 5.0, 3.0, 0.8, "fc2: 4C → C", "mlp", fontsize=8)
    arrow(ax, (cx, 5.8), (cx, 6.3))
    box(ax, cx - 1.5, 6.3, 3.0, 0.6, "(B, T, C)", "data", fontsize=8)
    text(ax, cx, 7.45, "2 matrices, 8C² weights", size=8, color=MUTED)
    # right: SwiGLU of (swiglu)
    cx = 10.6
    text(ax, cx, 8.2, "SwiGLU (LLaMA)", size=10, weight="bold")
    box(ax, cx - 1.5, 0.3, 3.0, 0.6, "x  (B, T, C)", "data", fontsize=8)
    gx, ux = cx - 1.9, cx + 1.9
    line(ax, [(cx, 0.9), (cx, 1.1), (gx, 1.1)])
    line(ax, [(cx, 1.1), (ux, 1.1)])
    arrow(ax, (gx, 1.1), (gx, 1.4))
    arrow(ax, (ux, 1.1), (ux, 1.4))
    box(ax, gx - 1.4, 1.4, 2.8, 0.8, "gate_proj: C → d_ff", "mlp", fontsize=8)
    box(ax, ux - 1.4, 1.4, 2.8, 0.8, "up_proj: C → d_ff", "mlp", fontsize=8)
    arrow(ax, (gx, 2.2), (gx, 2.7))
    box(ax, gx - 1.4, 2.7, 2.8, 0.7, "SiLU  z·σ(z)", "mlp", fontsize=8)
    text(ax, ux + 0.15, 3.0, "(B, T, d_ff)", ha="left", size=7.5, color=MUTED)
    ax.add_patch(Circle((cx, 4.2), 0.22, facecolor="white", edgecolor=INK, lw=1.2))
    text(ax, cx, 4.2, "⊙", size=11)
    line(ax, [(gx, 3.4), (gx, 4.2)])
    arrow(ax, (gx, 4.2), (cx - 0.22, 4.2))
    line(ax, [(ux, 2.2), (ux, 4.2)])
    arrow(ax, (ux, 4.2), (cx + 0.22, 4.2))
    text(ax, cx, 3.7, "gate × value,\nentry by entry", size=7, color=MUTED)
    arrow(ax, (cx, 4.42), (cx, 5.0))
    box(ax, cx - 1.5, 5.0, 3.0, 0.8, "down_proj: d_ff → C", "mlp", fontsize=8)
    arrow(ax, (cx, 5.8), (cx, 6.3))
    box(ax, cx - 1.5, 6.3, 3.0, 0.6, "(B, T, C)", "data", fontsize=8)
    text(ax, cx, 7.45, "3 matrices; d_ff ≈ 8C/3 keeps 8C² weights", size=8, color=MUTED)
    return fig


FIGURES = {"pre_post_ln": pre_post_ln, "norm_axes": norm_axes, "ffn_swiglu": ffn_swiglu}
