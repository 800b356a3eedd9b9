"""Chapter 17: the GPT-2 block next to the Llama/Qwen3 block, and how grouped-query attention shares
key-value heads among query heads (MHA, GQA, MQA)."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, plus, text

BLUE = COLORS["embed"][1]


def _column(ax, cx, title, parts, notes):
    """A pre-norm block drawn bottom-up: parts = [(label, kind, height)], residual adds after 2 and 4."""
    text(ax, cx, 9.75, title, size=10, weight="bold")
    box(ax, cx - 1.5, 0.2, 3.0, 0.6, "x  (B, T, d)", "data", fontsize=8)
    y = 0.8
    for k, (label, kind, h) in enumerate(parts):
        if k % 2 == 0:  # the residual branch starts here
            rx = cx - 2.2
            start = y
            line(ax, [(cx, y), (cx, y + 0.2), (rx, y + 0.2)], color=BLUE, lw=1.6)
        arrow(ax, (cx, y + 0.05 if k % 2 == 0 else y), (cx, y + 0.35))
        box(ax, cx - 1.7, y + 0.35, 3.4, h, label, kind, fontsize=8)
        y += 0.35 + h
        if k % 2 == 1:
            arrow(ax, (cx, y), (cx, y + 0.35))
            plus(ax, cx, y + 0.55)
            line(ax, [(rx, start + 0.2), (rx, y + 0.55)], color=BLUE, lw=1.6)
            arrow(ax, (rx, y + 0.55), (cx - 0.2, y + 0.55), color=BLUE, lw=1.6)
            y += 0.75
    arrow(ax, (cx, y), (cx, y + 0.4))
    box(ax, cx - 1.5, y + 0.4, 3.0, 0.6, "to the next block", "data", fontsize=8)
    for k, (yy, note) in enumerate(notes):
        text(ax, cx + 1.75, yy, note, size=7.5, color=MUTED, ha="left")


def llama_block():
    fig, ax = canvas(17.5, 10.3)
    gpt2 = [("LayerNorm\n(mean, variance, bias)", "norm", 0.9),
            ("multi-head attention\n12 K, V heads; biases", "attn", 1.3),
            ("LayerNorm", "norm", 0.6),
            ("MLP  d → 4d → d\nGELU; biases", "mlp", 1.3)]
    llama = [("RMSNorm\n(no mean, no bias)", "norm", 0.9),
             ("grouped-query attention\nRoPE on q, k  [+ QK-norm]\nfewer K, V heads; no biases", "attn", 1.3),
             ("RMSNorm", "norm", 0.6),
             ("SwiGLU  d → 8d/3 → d\nSiLU gate × up; no biases", "mlp", 1.3)]
    _column(ax, 3.4, "GPT-2 block (2019)", gpt2,
            [(1.45, "positions: learned\ntable added to x\nbefore the first block")])
    _column(ax, 11.6, "Llama / Qwen3 block", llama,
            [(1.45, "positions: rotations\nof q and k inside\nevery attention"),
             (3.0, "Qwen3: RMSNorm\non each q and k head"),
             (6.4, "3 matrices of d × 8d/3:\nthe parameters of\n2 of d × 4d")])
    return fig


def gqa_heads():
    fig, ax = canvas(17.5, 6.6)
    cols = [("multi-head (MHA)\n8 query heads, 8 K/V heads", 8),
            ("grouped-query (GQA)\n8 query heads, 2 K/V heads", 2),
            ("multi-query (MQA)\n8 query heads, 1 K/V head", 1)]
    q_fill = COLORS["attn"][0]
    for c, (label, n_kv) in enumerate(cols):
        x0 = 0.5 + c * 5.8
        text(ax, x0 + 2.4, 6.05, label, size=8.5, weight="bold")
        group = 8 // n_kv
        for h in range(8):
            box(ax, x0 + h * 0.6, 3.9, 0.5, 0.8, f"q{h}", "attn", fontsize=7)
        kv_w = 0.6 * group - 0.1
        for g in range(n_kv):
            gx = x0 + g * 0.6 * group
            box(ax, gx, 1.0, kv_w, 0.8, "K,V" if n_kv > 1 and group == 1 else f"K,V {g}", "cache", fontsize=7)
            for h in range(g * group, (g + 1) * group):
                arrow(ax, (gx + kv_w / 2, 1.8), (x0 + h * 0.6 + 0.25, 3.9), color=MUTED, lw=0.8)
        text(ax, x0 + 2.4, 0.35, f"KV cache: {n_kv} × 2 × head_dim numbers\nper token and layer", size=7.5, color=INK)
    return fig


FIGURES = {"llama_block": llama_block, "gqa_heads": gqa_heads}
