"""Chapter 6: the whole GPT, and the cross-attention of the encoder-decoder."""

from kit import COLORS, MUTED, arrow, box, canvas, grid, line, plus, text


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


def cross_attention():
    fig, ax = canvas(15.5, 8.3)
    T, S, n_real, c = 4, 6, 4, 0.42
    text(ax, 7.75, 7.95, "cross-attention: queries from the target, keys and values from the source", size=10,
         weight="bold")
    # inputs and projections
    box(ax, 0.3, 0.3, 3.8, 0.8, "decoder stream  Y  (B, T, C)", "data", fontsize=8)
    box(ax, 10.0, 0.3, 4.4, 0.8, "memory  M  (B, S, C)\nthe encoder's output", "cache", fontsize=8)
    arrow(ax, (2.2, 1.1), (2.2, 1.6))
    box(ax, 1.4, 1.6, 1.6, 0.6, "W_Q", "attn", fontsize=8)
    arrow(ax, (2.2, 2.2), (2.2, 2.8))
    qx, qy = 2.2 - c, 2.8
    grid(ax, qx, qy, T, 2, cell=c, kind="attn")
    text(ax, qx - 0.15, qy + T * c / 2, "Q (T, d_k)", ha="right", size=8)
    kx, vx = 11.0, 13.4
    for x, name in ((kx, "W_K"), (vx, "W_V")):
        line(ax, [(12.2, 1.1), (12.2, 1.35), (x, 1.35)])
        arrow(ax, (x, 1.35), (x, 1.6))
        box(ax, x - 0.8, 1.6, 1.6, 0.6, name, "attn", fontsize=8)
        arrow(ax, (x, 2.2), (x, 2.8))
        grid(ax, x - c, 2.8, S, 2, cell=c, kind="attn")
    text(ax, kx - c - 0.15, 2.8 + S * c / 2, "K (S, d_k)", ha="right", size=8)
    text(ax, vx + c + 0.15, 2.8 + S * c / 2, "V (S, d_k)", ha="left", size=8)
    # the (T, S) weights
    sx, sy = 5.2, 3.5
    grid(ax, sx, sy, T, S, cell=c, kind="attn", fills=lambda i, j: "#d0d0d0" if j >= n_real else None)
    text(ax, sx + S * c / 2, sy + T * c + 0.15, "keys: source positions →", size=7.5, color=MUTED, va="bottom")
    text(ax, sx - 0.15, sy + T * c / 2, "queries:\ntarget", size=7.5, color=MUTED, ha="right")
    text(ax, sx + S * c / 2, sy - 0.15, "softmax(Q Kᵀ / √d_k): weights (T, S)\nno causal triangle; "
         "grey: source padding", size=7.5, va="top")
    arrow(ax, (qx + 2 * c + 0.1, qy + T * c / 2), (sx - 1.1, sy + T * c / 2 - 0.1))
    arrow(ax, (kx - c - 0.1, 2.8 + S * c - 0.2), (sx + S * c + 0.1, sy + T * c / 2), rad=0.15)
    # weights times values, then the output
    oy = 6.2
    box(ax, 4.6, oy, 5.2, 0.9, "weights · V  (T, d_k) per head; heads merged,\nW_O → (B, T, C), "
        "added to the stream Y", "attn", fontsize=8)
    arrow(ax, (sx + S * c / 2, sy + T * c + 0.55), (sx + S * c / 2, oy))
    line(ax, [(vx, 2.8 + S * c), (vx, oy + 0.45)])
    arrow(ax, (vx, oy + 0.45), (9.8, oy + 0.45))
    return fig


FIGURES = {"gpt_architecture": gpt_architecture, "cross_attention": cross_attention}
