"""Chapter 14: recording a forward pass with hooks, and the logit lens."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, plus, text, title

RESID = "#2f6db5"  # the residual stream, as in chapter 6's GPT
HOOK = COLORS["cache"]


def _hook(ax, x, y, label):
    """A small hook tag at (x, y), its label to the right."""
    box(ax, x, y - 0.2, 0.75, 0.4, "hook", "cache", fontsize=7, round_=0.08)
    text(ax, x + 0.9, y, label, ha="left", size=7.5)


def trace_hooks():
    fig, ax = canvas(18.6, 11.2)
    cx, w = 3.6, 3.0
    rx = cx - w / 2 - 0.45  # the residual stream runs up the left side
    title(ax, cx, 10.75, "block l of model.blocks")
    box(ax, rx - 0.5, 0.9, w + 1.6, 9.2, "", dashed=True)
    # input
    text(ax, cx, 0.45, "x⁽ˡ⁻¹⁾ (B, T, C)", size=8.5)
    line(ax, [(cx, 0.65), (cx, 1.3), (rx, 1.3), (rx, 4.5)], color=RESID, lw=1.6)
    arrow(ax, (cx, 1.3), (cx, 1.7))
    box(ax, cx - w / 2, 1.7, w, 0.6, "ln1", "norm")
    arrow(ax, (cx, 2.3), (cx, 2.8))
    box(ax, cx - w / 2, 2.8, w, 0.9, "attn\n(fused SDPA inside)", "attn", fontsize=8)
    arrow(ax, (cx, 3.7), (cx, 4.3))
    plus(ax, cx, 4.5)
    arrow(ax, (rx, 4.5), (cx - 0.2, 4.5), color=RESID, lw=1.6)
    line(ax, [(cx, 4.7), (cx, 5.3), (rx, 5.3), (rx, 8.5)], color=RESID, lw=1.6)
    text(ax, cx + 0.15, 5.0, "m⁽ˡ⁾", ha="left", size=8.5)
    arrow(ax, (cx, 5.3), (cx, 5.7))
    box(ax, cx - w / 2, 5.7, w, 0.6, "ln2", "norm")
    arrow(ax, (cx, 6.3), (cx, 6.8))
    box(ax, cx - w / 2, 6.8, w, 0.9, "mlp", "mlp")
    arrow(ax, (cx, 7.7), (cx, 8.3))
    plus(ax, cx, 8.5)
    arrow(ax, (rx, 8.5), (cx - 0.2, 8.5), color=RESID, lw=1.6)
    arrow(ax, (cx, 8.7), (cx, 10.4))
    text(ax, cx + 0.15, 9.6, "x⁽ˡ⁾ (B, T, C)", ha="left", size=8.5)

    # the hooks and what they keep
    hx = 6.3
    _hook(ax, hx, 9.6, "forward hook on the block: keeps its output x⁽ˡ⁾,")
    text(ax, hx + 0.9, 9.2, "and on block 1 also its input x⁽⁰⁾  → Trace.hidden", ha="left", size=7.5)
    line(ax, [(5.85, 9.6), (hx, 9.6)], color=HOOK[1], dashed=True)
    text(ax, hx + 0.9, 4.5, "no hook: m⁽ˡ⁾ = x⁽ˡ⁻¹⁾ + a, the block's input plus attn's output", ha="left", size=7.5)
    text(ax, hx + 0.9, 4.1, "→ Trace.hidden_mid", ha="left", size=7.5)
    line(ax, [(cx + 0.25, 4.5), (hx + 0.8, 4.5)], color=MUTED, dashed=True)
    _hook(ax, hx, 3.25, "forward hook on attn: keeps its input ln1(x) and output a;")
    text(ax, hx + 0.9, 2.85, "attn is called once more on the input with need_weights=True", ha="left", size=7.5)
    text(ax, hx + 0.9, 2.45, "(SDPA never returns the weights)  → Trace.attn", ha="left", size=7.5)
    line(ax, [(cx + w / 2, 3.25), (hx, 3.25)], color=HOOK[1], dashed=True)

    # the Trace they fill
    tx, ty = 13.0, 5.9
    box(ax, tx, ty, 5.3, 3.6, "", "cache")
    text(ax, tx + 2.65, ty + 3.25, "Trace (n_layer = L)", size=9, weight="bold")
    for i, (field, shape) in enumerate([("hidden", "(L + 1, B, T, C)"), ("hidden_mid", "(L, B, T, C)"),
                                        ("attn", "(L, B, n_head, T, T)"), ("logits", "(B, T, V)")]):
        y = ty + 2.6 - i * 0.7
        text(ax, tx + 0.3, y, field, ha="left", size=8.5, family="monospace")
        text(ax, tx + 5.0, y, shape, ha="right", size=8, color=MUTED)
    text(ax, tx + 2.65, ty - 0.45, "model(idx) runs once, unchanged;", size=7.5, color=MUTED)
    text(ax, tx + 2.65, ty - 0.85, "logits is its output; the hooks", size=7.5, color=MUTED)
    text(ax, tx + 2.65, ty - 1.25, "are removed afterwards", size=7.5, color=MUTED)
    return fig


def logit_lens():
    fig, ax = canvas(16.0, 11.4)
    sx = 5.2  # the residual stream
    bw = 2.6
    box(ax, sx - 2.2, 0.3, 4.4, 0.8, "wte(idx) + wpe", "embed")
    stages = []  # (y, name): where the lens reads the stream
    y = 1.1
    line(ax, [(sx, y), (sx, y + 0.7)], color=RESID, lw=2.0)
    stages.append((y + 0.55, "x⁽⁰⁾", "embedding"))
    y += 0.7
    for layer, label in ((1, "1"), (2, "2")):
        for kind, name in (("attn", "attention"), ("mlp", "MLP")):
            # a branch to the left that reads the stream and adds back into it
            line(ax, [(sx, y + 0.15), (sx - 1.4, y + 0.15)], color=INK, lw=1.0)
            arrow(ax, (sx - 1.4, y + 0.15), (sx - 1.4, y + 0.35))
            norm = "ln1" if kind == "attn" else "ln2"
            box(ax, sx - 1.4 - bw / 2 - 0.6, y + 0.35, bw, 0.65, f"{norm} → {name} {label}", kind, fontsize=8)
            line(ax, [(sx - 1.4, y + 1.0), (sx - 1.4, y + 1.2), (sx - 0.2, y + 1.2)], color=INK, lw=1.0)
            arrow(ax, (sx - 0.6, y + 1.2), (sx - 0.2, y + 1.2))
            line(ax, [(sx, y), (sx, y + 1.0)], color=RESID, lw=2.0)
            plus(ax, sx, y + 1.2)
            line(ax, [(sx, y + 1.4), (sx, y + 1.85)], color=RESID, lw=2.0)
            stage = "m" if kind == "attn" else "x"
            stages.append((y + 1.6, f"{stage}⁽{'¹²'[layer - 1]}⁾", f"+ {name} {label}"))
            y += 1.85
    text(ax, sx, y + 0.35, "⋮  blocks 3 … L", size=9, color=MUTED)
    line(ax, [(sx, y + 0.7), (sx, y + 1.2)], color=RESID, lw=2.0)
    stages.append((y + 1.0, "x⁽ᴸ⁾", "last block"))
    text(ax, sx - 0.2, stages[-1][0], "residual stream (B, T, C)", size=8, color=RESID, ha="right")

    # the lens: the same ln_f and lm_head at every stage
    lx = 8.3
    for i, (ys, sym, name) in enumerate(stages):
        last = i == len(stages) - 1
        arrow(ax, (sx, ys), (lx, ys), color=INK if last else MUTED, dashed=not last, lw=1.2 if last else 0.9)
        text(ax, sx + 0.15, ys + 0.17, sym, ha="left", size=8, color=RESID)
        box(ax, lx, ys - 0.27, 2.7, 0.54, "ln_f → lm_head", "out", fontsize=7.5, round_=0.08)
        arrow(ax, (lx + 2.7, ys), (lx + 3.2, ys), color=INK if last else MUTED)
        text(ax, lx + 3.3, ys, "logits: the model's output" if last else f"logits read after: {name}",
             ha="left", size=7.5, weight="bold" if last else "normal")
    text(ax, lx + 1.35, stages[-1][0] + 0.75, "one ln_f and one lm_head (tied to wte), shared", size=7.5,
         color=MUTED)
    return fig


FIGURES = {"trace_hooks": trace_hooks, "logit_lens": logit_lens}
