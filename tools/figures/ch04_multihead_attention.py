"""Chapter 4: splitting the width into heads and merging them back."""

from kit import COLORS, MUTED, arrow, box, brace_label, canvas, grid, line, text

HEAD_COLORS = ["#fde5cc", "#dbe9f8", "#dcf0dc", "#ece3f5"]


def heads_split_merge():
    fig, ax = canvas(16.5, 6.4)
    T, h, dk, c = 4, 4, 2, 0.3
    C = h * dk
    colour = lambda i, j: HEAD_COLORS[j // dk]
    # (B, T, C) projected queries
    grid(ax, 0.5, 2.2, T, C, cell=c, fills=colour, kind="attn", label="$q = xW_q$\n(B, T, C)")
    text(ax, 0.5 + C * c / 2, 0.75, "C = h · d_k", size=7.5, color=MUTED, va="top")
    arrow(ax, (3.1, 2.2 + T * c / 2), (4.3, 2.2 + T * c / 2))
    text(ax, 0.5 + C * c / 2, 1.5, "split: .view(B, T, h, d_k)\n.transpose(1, 2)", size=7)
    # h separate (T, d_k) matrices
    x0 = 4.6
    for k in range(h):
        y = 4.5 - k * 1.45
        grid(ax, x0, y, T, dk, cell=c, fills=lambda i, j, k=k: HEAD_COLORS[k], kind="attn")
        text(ax, x0 - 0.15, y + T * c / 2, f"head {k}", ha="right", size=7, color=MUTED)
        arrow(ax, (x0 + dk * c + 0.1, y + T * c / 2), (x0 + dk * c + 1.2, y + T * c / 2), lw=0.9)
        box(ax, x0 + dk * c + 1.3, y + 0.05, 2.3, T * c - 0.1, "attention\n(T, T) weights", "attn",
            fontsize=7, color=HEAD_COLORS[k])
        arrow(ax, (x0 + dk * c + 3.7, y + T * c / 2), (x0 + dk * c + 4.6, y + T * c / 2), lw=0.9)
        grid(ax, x0 + dk * c + 4.7, y, T, dk, cell=c, fills=lambda i, j, k=k: HEAD_COLORS[k], kind="attn")
    text(ax, x0 + dk * c / 2, 6.05, "(B, h, T, d_k)", size=8)
    text(ax, x0 + dk * c + 2.45, 6.05, "each head attends alone", size=8)
    text(ax, x0 + dk * c + 4.7 + dk * c / 2, 6.05, "(B, h, T, d_k)", size=8)
    # merge
    mx = x0 + dk * c + 4.7 + dk * c + 0.3
    arrow(ax, (mx, 2.2 + T * c / 2), (mx + 1.55, 2.2 + T * c / 2))
    text(ax, mx + 0.78, 2.2 + T * c / 2 + 0.55, "merge:\n.transpose(1, 2)\n.reshape(B, T, C)", size=7)
    grid(ax, mx + 1.75, 2.2, T, C, cell=c, fills=colour, kind="attn", label="heads side by side\n(B, T, C)")
    arrow(ax, (mx + 1.75 + C * c / 2, 2.1), (mx + 1.75 + C * c / 2, 1.2))
    box(ax, mx + 1.75, 0.4, C * c, 0.75, "$W_o$: (C, C)\nmixes the heads", "attn", fontsize=7)
    return fig


def qkv_in_proj():
    """One matmul for the queries, keys and values of every head, then views (self-attention)."""
    fig, ax = canvas(17.5, 6.4)
    T, h, dk, c = 4, 3, 2, 0.27
    C = h * dk
    roles = ("q", "k", "v")
    y0 = 2.5
    ym = y0 + T * c / 2
    # x (B, T, C)
    grid(ax, 0.4, y0, T, C, cell=c, kind="embed", label="x  (B, T, C)")
    arrow(ax, (2.2, ym), (3.6, ym))
    text(ax, 2.9, ym + 0.45, "in_proj:\none matmul", size=7.5)
    # (B, T, 3C): queries | keys | values, each head by head
    px = 3.8
    grid(ax, px, y0, T, 3 * C, cell=c, kind="attn", fills=lambda i, j: HEAD_COLORS[(j % C) // dk],
         label=r"$x W_{in}^\top$  (B, T, 3C)")
    for r, name in enumerate(("queries", "keys", "values")):
        x0, x1 = px + r * C * c, px + (r + 1) * C * c
        if r:
            line(ax, [(x0, y0 - 0.1), (x0, y0 + T * c + 0.1)], lw=2.2)
        brace_label(ax, x0 + 0.04, x1 - 0.04, y0 - 0.12, name)
    text(ax, px + 1.5 * C * c, y0 - 0.95, "each block: head 0, head 1, head 2 (one colour per head)", size=7.5,
         color=MUTED, va="top")
    text(ax, px + 1.5 * C * c, y0 - 1.45, r"= the order of the rows of $W_{in}$ (3C, C): $W_q^\top$, then $W_k^\top$, then $W_v^\top$",
         size=7.5, color=MUTED, va="top")
    # split_heads(., 3h): 3h heads of width d_k, views
    sx = px + 3 * C * c + 0.25
    arrow(ax, (sx, ym), (sx + 1.9, ym))
    text(ax, sx + 0.95, ym + 0.55, "split_heads(·, 3h)\n(B, 3h, T, d_k)\na view, no copy", size=7)
    gx = sx + 2.2
    text(ax, gx + 1.2, 6.1, "3h heads of width d_k", size=8)
    for r, role in enumerate(roles):
        y = 4.5 - r * 1.6
        for k in range(h):
            grid(ax, gx + k * (dk * c + 0.3), y, T, dk, cell=c, kind="attn", fills=lambda i, j, k=k: HEAD_COLORS[k])
            text(ax, gx + k * (dk * c + 0.3) + dk * c / 2, y + T * c + 0.15, f"{r * h + k}", size=6.5, color=MUTED)
        ex = gx + h * (dk * c + 0.3) - 0.1
        arrow(ax, (ex, y + T * c / 2), (ex + 0.7, y + T * c / 2), lw=0.9)
        text(ax, ex + 0.85, y + T * c / 2, f"{role}  (B, h, T, d_k)", ha="left", size=8)
    text(ax, gx + 2.6, 0.55, "chunk(3, dim=1): heads 0..h-1 are q,\nh..2h-1 are k, 2h..3h-1 are v", size=7.5,
         color=MUTED)
    return fig

FIGURES = {"heads_split_merge": heads_split_merge, "qkv_in_proj": qkv_in_proj}
