"""Chapter 2: queries, keys and values; the masks."""

from kit import COLORS, MUTED, arrow, box, canvas, grid, text

ORANGE = COLORS["attn"][1]


def attention_qkv():
    """softmax(Q K^T / sqrt(d_k)) V for one sequence, with every shape."""
    fig, ax = canvas(16.5, 6.2)
    c = 0.32
    T, d, dv = 5, 3, 4
    # X and the three projections
    grid(ax, 0.4, 2.2, T, 4, cell=c, kind="embed", label="X  (T, C)")
    text(ax, 0.4 + 2 * c, 1.75, "one row per token", size=7, color=MUTED)
    for k, (name, y, cols) in enumerate(((r"$Q = XW_q$", 4.3, d), (r"$K = XW_k$", 2.2, d), (r"$V = XW_v$", 0.2, dv))):
        arrow(ax, (1.85, 2.2 + T * c / 2), (2.9, y + T * c / 2), color=MUTED, lw=0.9)
        grid(ax, 3.0, y, T, cols, cell=c, kind="attn", label=None)
        text(ax, 3.0 + cols * c + 0.15, y + T * c / 2, f"{name}\n(T, {'d_k' if cols == d else 'd_v'})",
             ha="left", size=8)
    # scores = Q K^T / sqrt(d_k)
    sx, sy = 6.9, 2.9
    arrow(ax, (5.9, 4.3 + T * c / 2), (sx - 0.4, sy + T * c * 0.8), color=MUTED, lw=0.9)
    arrow(ax, (5.9, 2.2 + T * c / 2), (sx - 0.4, sy + T * c * 0.3), color=MUTED, lw=0.9)
    grid(ax, sx, sy, T, T, cell=c, kind="attn", label=r"scores $QK^\top/\sqrt{d_k}$  (T, T)",
         values=lambda i, j: "")
    text(ax, sx - 0.12, sy + T * c / 2, "query i", rotation=90, size=7, color=MUTED, ha="right")
    text(ax, sx + T * c / 2, sy - 0.2, "key j", size=7, color=MUTED, va="top")
    # softmax over each row
    ax2 = sx + T * c + 0.3
    arrow(ax, (ax2, sy + T * c / 2), (ax2 + 1.0, sy + T * c / 2))
    text(ax, ax2 + 0.5, sy + T * c / 2 + 0.3, "softmax\nper row", size=7.5)
    px = ax2 + 1.2
    shade = ["#fde5cc", "#f7c08a", "#f09a4a", "#e07b24", "#c8630a"]
    weights = [[4, 1, 0, 2, 1], [0, 3, 1, 1, 0], [1, 0, 4, 0, 2], [2, 1, 0, 3, 1], [0, 2, 1, 1, 4]]
    grid(ax, px, sy, T, T, cell=c, kind="attn", label="weights A  (T, T)\nrows sum to 1",
         fills=lambda i, j: shade[weights[i][j]])
    # A V
    ox = px + T * c + 0.5
    arrow(ax, (ox - 0.2, sy + T * c / 2), (ox + 0.7, sy + T * c / 2))
    text(ax, ox + 0.25, sy + T * c / 2 + 0.3, "A V", size=8)
    arrow(ax, (5.9, 0.2 + T * c / 2), (ox + 0.3, sy - 0.1), color=MUTED, lw=0.9, rad=0.25)
    grid(ax, ox + 0.9, sy, T, dv, cell=c, kind="out", label="Y = A V  (T, d_v)")
    text(ax, ox + 0.9 + dv * c / 2, sy - 0.25, "row i = weighted\nmean of V's rows", size=7, color=MUTED,
         va="top")
    return fig


def attention_masks():
    """The causal mask, a padding mask, and their combination, as query x key grids."""
    fig, ax = canvas(15, 5.4)
    T, c = 6, 0.45
    keep, drop = "#fde5cc", "#5b6b7f"
    pad_len = 2  # the last two positions are padding
    panels = [
        ("causal: key j ≤ query i", lambda i, j: keep if j <= i else drop),
        ("padding: key j is a real token (length 4)", lambda i, j: keep if j < T - pad_len else drop),
        ("both (AND)", lambda i, j: keep if (j <= i and j < T - pad_len) else drop),
    ]
    for k, (label, fill) in enumerate(panels):
        x = 0.9 + k * 4.9
        grid(ax, x, 0.9, T, T, cell=c, kind="attn", fills=fill, label=label)
        text(ax, x - 0.4, 0.9 + T * c / 2, "query i", rotation=90, size=7.5, color=MUTED, ha="right")
        text(ax, x + T * c / 2, 0.55, "key j", size=7.5, color=MUTED, va="top")
        for n in range(T):  # indices: keys along the bottom, queries down the left
            text(ax, x + (n + 0.5) * c, 0.78, str(n), size=6.5, color=MUTED)
            text(ax, x - 0.12, 0.9 + (T - 1 - n + 0.5) * c, str(n), size=6.5, color=MUTED, ha="right")
    box(ax, 0.9, 4.7, 0.4, 0.3, "", color=keep, kind="attn")
    text(ax, 1.45, 4.85, "may attend (True)", ha="left", size=8)
    box(ax, 4.6, 4.7, 0.4, 0.3, "", color=drop, kind="data")
    text(ax, 5.15, 4.85, "masked: score set to −∞, weight 0", ha="left", size=8)
    return fig


FIGURES = {"attention_qkv": attention_qkv, "attention_masks": attention_masks}
