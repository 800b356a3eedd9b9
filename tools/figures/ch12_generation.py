"""Chapter 12: the samplers' filters, and the KV cache (prefill, then decode)."""

import math

from matplotlib.patches import Rectangle

from kit import COLORS, INK, MUTED, arrow, box, canvas, grid, text

NEW = "#f09a4a"
GONE = "#e4e4e4"


def _bars(ax, x, y, probs, kept, *, width=0.34, gap=0.08, height=2.2, top=0.6):
    """Bars of ``probs`` (most likely first) from (x, y); ``kept`` bars coloured, the others grey."""
    fill, edge = COLORS["out"]
    for i, (p, k) in enumerate(zip(probs, kept)):
        h = height * p / top
        ax.add_patch(Rectangle((x + i * (width + gap), y), width, h, facecolor=fill if k else GONE,
                               edgecolor=edge if k else "#bbbbbb", linewidth=0.8))
    ax.plot([x - 0.05, x + len(probs) * (width + gap)], [y, y], color=INK, lw=0.8)
    return x + len(probs) * (width + gap)


def sampling_filters():
    fig, ax = canvas(20.2, 5.0)
    logits = [2.0, 1.6, 1.1, 0.9, 0.4, 0.0, -0.5, -1.0]  # eight candidates, most likely first

    def softmax(z, keep=None):
        keep = keep or [True] * len(z)
        e = [math.exp(v) if k else 0.0 for v, k in zip(z, keep)]
        return [v / sum(e) for v in e]

    tau, k, p = 0.7, 5, 0.8
    p1 = softmax(logits)
    p2 = softmax([z / tau for z in logits])
    keep_k = [i < k for i in range(len(logits))]
    p3 = softmax([z / tau for z in logits], keep_k)
    above, keep_p = 0.0, []
    for q in p3:  # a token stays if the tokens ranked above it hold less than p
        keep_p.append(q > 0 and above < p)
        above += q
    p4 = softmax([z / tau for z in logits], keep_p)
    panels = [
        ("model: softmax(z)", p1, [True] * 8, "probabilities, shape (V,)"),
        (f"temperature τ = {tau}", p2, [True] * 8, "softmax(z / τ)"),
        (f"top-k, k = {k}", p2, keep_k, "the k largest stay"),
        (f"top-p, p = {p}", p3, keep_p, "smallest head\nreaching p stays"),
        ("renormalise, draw", p4, keep_p, "multinomial → 1 id"),
    ]
    x = 0.5
    for i, (title, probs, kept, note) in enumerate(panels):
        text(ax, x + 1.65, 4.7, title, size=8.5, weight="bold")
        end = _bars(ax, x, 1.6, probs, kept)
        text(ax, x + 1.65, 1.35, "tokens, most likely first", size=6.5, color=MUTED)
        text(ax, x + 1.65, 1.0, note, size=7.5, color=INK, va="top")
        if i < len(panels) - 1:
            arrow(ax, (end + 0.05, 2.8), (end + 0.45, 2.8))
        x = end + 0.55
    fill, edge = COLORS["out"]
    ax.add_patch(Rectangle((0.5, 4.05), 0.3, 0.25, facecolor=fill, edgecolor=edge, linewidth=0.8))
    text(ax, 0.9, 4.17, "kept", ha="left", size=7.5)
    ax.add_patch(Rectangle((1.7, 4.05), 0.3, 0.25, facecolor=GONE, edgecolor="#bbbbbb", linewidth=0.8))
    text(ax, 2.1, 4.17, "removed (logit set to −∞)", ha="left", size=7.5)
    return fig


def kv_cache():
    fig, ax = canvas(16, 7.2)
    c = 0.36
    # Without a cache: every step recomputes keys and values of the whole prefix
    text(ax, 0.3, 6.8, "without a cache: step t recomputes K and V for all t positions",
         ha="left", size=9, weight="bold")
    for k, t in enumerate((3, 4, 5)):
        x = 0.6 + k * 2.7
        grid(ax, x, 4.2, t, 2, cell=c, kind="attn", fills=lambda i, j: NEW)
        text(ax, x + c, 4.0, f"step {k + 1}: {t} rows", size=7.5, color=MUTED, va="top")
    # With a cache: prefill once, then one new row per step
    text(ax, 0.3, 3.35, "with a cache: prefill the prompt once, then each decode step appends one row of K and V",
         ha="left", size=9, weight="bold")
    for k, t in enumerate((3, 4, 5)):
        x = 0.6 + k * 2.7
        grid(ax, x, 0.6, t, 2, cell=c, kind="cache", fills=lambda i, j, t=t, k=k: NEW if (k > 0 and i == t - 1) or k == 0 else None)
        label = "prefill: 3 rows" if k == 0 else "decode: 1 new row"
        text(ax, x + c, 0.4, label, size=7.5, color=MUTED, va="top")
    # the attention of one decode step
    x = 9.4
    box(ax, x, 0.6, 1.3, 0.4, "q (1, d_k)", "attn", fontsize=7.5, color=NEW)
    arrow(ax, (x + 1.35, 0.8), (x + 1.9, 0.8))
    grid(ax, x + 2.0, 0.6, 5, 2, cell=c, kind="cache", fills=lambda i, j: NEW if i == 4 else None,
         label="K, V cache (t, d_k)")
    arrow(ax, (x + 2.9, 1.5), (x + 3.6, 1.5))
    box(ax, x + 3.7, 1.1, 2.6, 0.8, "softmax(q Kᵀ/√d_k) V\none output row", "attn", fontsize=7.5)
    box(ax, x - 0.2, 4.3, 6.6, 1.6,
        "prefill: all prompt tokens in one pass, matrix × matrix\n(limited by arithmetic)\n"
        "decode: 1 token per pass, each weight read for 2 FLOPs\n(limited by memory on large models,\nby per-operation overhead on small ones)",
        "plain", fontsize=7.5)
    box(ax, x + 0.2, 3.7, 0.35, 0.3, "", color=NEW, kind="attn")
    text(ax, x + 0.7, 3.85, "computed at this step", ha="left", size=7.5)
    box(ax, x + 3.4, 3.7, 0.35, 0.3, "", kind="cache")
    text(ax, x + 3.9, 3.85, "read from the cache", ha="left", size=7.5)
    text(ax, 15.8, 6.8, "one layer, one head", ha="right", size=7.5, color=MUTED)
    return fig


FIGURES = {"sampling_filters": sampling_filters, "kv_cache": kv_cache}
