"""Chapter 18: a router dispatching six tokens to four experts (top-2, capacity factor 1), and
the assignments that find no free slot."""

import math

from matplotlib.patches import Rectangle

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, text

# The router's probabilities for 6 tokens over 4 experts (rows sum to 1), chosen so that one
# expert is over-subscribed. The routing below is computed from them, as SparseMoE does.
PROBS = [
    [0.50, 0.30, 0.15, 0.05],
    [0.10, 0.60, 0.05, 0.25],
    [0.45, 0.05, 0.40, 0.10],
    [0.20, 0.10, 0.15, 0.55],
    [0.55, 0.05, 0.30, 0.10],
    [0.35, 0.40, 0.10, 0.15],
]
TOP_K = 2
RED = COLORS["out"][1]
GREEN = COLORS["mlp"][1]


def _route(probs, top_k, capacity_factor=1.0):
    """Top-k experts per token, then slots first to every first choice (token order), then second choices."""
    n_tokens, n_experts = len(probs), len(probs[0])
    choices = [sorted(range(n_experts), key=lambda e: -p[e])[:top_k] for p in probs]
    capacity = math.ceil(capacity_factor * top_k * n_tokens / n_experts)
    slots = {e: [] for e in range(n_experts)}
    dropped = {e: [] for e in range(n_experts)}
    for rank in range(top_k):
        for t, chosen in enumerate(choices):
            e = chosen[rank]
            (slots[e] if len(slots[e]) < capacity else dropped[e]).append(t)
    return choices, capacity, slots, dropped


def moe_dispatch():
    choices, capacity, slots, dropped = _route(PROBS, TOP_K)
    n_tokens, n_experts = len(PROBS), len(PROBS[0])
    fig, ax = canvas(17, 10.6)
    top, row = 8.0, 1.05                                   # y of the first token row, row pitch
    ys = [top - t * row for t in range(n_tokens)]

    # 1. tokens
    text(ax, 1.25, 9.75, "tokens\n(N, C)", size=10, weight="bold")
    for t, y in enumerate(ys):
        box(ax, 0.4, y - 0.3, 1.7, 0.6, f"x$_{t + 1}$", "data", fontsize=8)
        arrow(ax, (2.1, y), (2.9, y), color=MUTED)

    # 2. the router: softmax probabilities, the top-2 of each row outlined
    cell = 0.62
    gx = 3.0
    text(ax, gx + n_experts * cell / 2, 9.75, "router\nsoftmax(x W$_r^T$)", size=10, weight="bold")
    for j in range(n_experts):
        text(ax, gx + (j + 0.5) * cell, top + 0.55, f"E{j + 1}", size=8, color=MUTED)
    for t, y in enumerate(ys):
        for j in range(n_experts):
            chosen = j in choices[t]
            shade = COLORS["attn"][0] if chosen else "white"
            ax.add_patch(Rectangle(
                (gx + j * cell, y - cell / 2), cell, cell, facecolor=shade,
                edgecolor=COLORS["attn"][1] if chosen else MUTED, linewidth=1.8 if chosen else 0.6))
            text(ax, gx + (j + 0.5) * cell, y, f"{PROBS[t][j]:.2f}".lstrip("0"), size=7.5,
                 weight="bold" if chosen else "normal", color=INK if chosen else MUTED)
    text(ax, gx + n_experts * cell / 2, ys[-1] - 0.75, f"top-{TOP_K} per token (outlined)", size=8, color=MUTED)

    # 3. dispatch arrow
    ax_x0, ax_x1 = gx + n_experts * cell + 0.3, 8.4
    arrow(ax, (ax_x0, 5.4), (ax_x1, 5.4), lw=2.0)
    text(ax, (ax_x0 + ax_x1) / 2, 5.8, "dispatch:\ngroup by expert", size=8, va="bottom")
    text(ax, (ax_x0 + ax_x1) / 2, 5.05, "first choices\nbefore second", size=7.5, color=MUTED, va="top")

    # 4. experts with their capacity slots
    ex, slot = 8.6, 0.62
    text(ax, ex + 3.2, 9.75,
         f"experts, {capacity} slots each\ncapacity = ⌈1.0 · {TOP_K} · {n_tokens} / {n_experts}⌉",
         size=10, weight="bold")
    eh = 1.6
    for e in range(n_experts):
        y0 = 8.45 - (e + 1) * eh + 0.3
        box(ax, ex, y0, 1.75, eh - 0.3, f"E{e + 1}\nSwiGLU", "mlp", fontsize=8)
        sx = ex + 2.0
        ymid = y0 + (eh - 0.3) / 2
        for s in range(capacity):
            filled = s < len(slots[e])
            fill = COLORS["mlp"][0] if filled else "white"
            ax.add_patch(Rectangle(
                (sx + s * slot, ymid - slot / 2), slot, slot, facecolor=fill, edgecolor=GREEN, linewidth=1.0))
            if filled:
                text(ax, sx + (s + 0.5) * slot, ymid, f"x$_{slots[e][s] + 1}$", size=7.5)
        if not slots[e] or len(slots[e]) < capacity:
            text(ax, sx + capacity * slot + 0.15, ymid, "idle slot", size=7, color=MUTED, ha="left")
        for d, t in enumerate(dropped[e]):
            dx = sx + (capacity + d) * slot + 0.25
            ax.add_patch(Rectangle(
                (dx, ymid - slot / 2), slot, slot, facecolor="white", edgecolor=RED, linewidth=1.2,
                linestyle="--"))
            text(ax, dx + slot / 2, ymid, f"x$_{t + 1}$", size=7.5, color=RED)
        if dropped[e]:
            text(ax, sx + (capacity + len(dropped[e])) * slot + 0.4, ymid,
                 "dropped: over\ncapacity, adds 0", size=7, color=RED, ha="left")

    # 5. combine
    n_drop = sum(len(v) for v in dropped.values())
    text(ax, 8.5, 0.75,
         "combine:  y$_t$ = Σ$_e$ g$_{t,e}$ · E$_e$(x$_t$)  over the experts that processed x$_t$;   "
         f"{n_drop} of {TOP_K * n_tokens} assignments dropped",
         size=8.5)
    text(ax, 8.5, 0.25, "a dropped assignment adds nothing, so in a block x + MoE(norm(x)) its share of x passes "
         "through on the residual", size=7.5, color=MUTED)
    line(ax, [(0.3, 1.15), (16.7, 1.15)], color=MUTED, lw=0.6)
    return fig


FIGURES = {"moe_dispatch": moe_dispatch}
