"""Chapter 7: how Hugging Face's GPT-2 state dict maps onto our GPT; Conv1D's transposed fused c_attn."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, text, title
from matplotlib.patches import Rectangle

ROW_H, GAP = 0.78, 0.22
LEFT_X, LEFT_W = 0.55, 5.8
RIGHT_X, RIGHT_W = 10.0, 5.7


def _row(ax, y, theirs, ours, kind, *, transpose=False, skipped=None, tied=False):
    """One line of the map: their tensor on the left, ours on the right, an arrow between."""
    box(ax, LEFT_X, y, LEFT_W, ROW_H, theirs, kind, fontsize=8)
    mid = y + ROW_H / 2
    if skipped:
        box(ax, RIGHT_X, y, RIGHT_W, ROW_H, "", "plain", dashed=True)
        text(ax, RIGHT_X + RIGHT_W / 2, mid, skipped, size=8, color=MUTED)
        line(ax, [(LEFT_X + LEFT_W, mid), (RIGHT_X - 0.15, mid)], color=MUTED, lw=1.0, dashed=True)
        return
    if tied:
        box(ax, RIGHT_X, y, RIGHT_W, ROW_H, ours, kind, fontsize=8, dashed=True)
        line(ax, [(LEFT_X + LEFT_W, mid), (RIGHT_X - 0.15, mid)], color=MUTED, lw=1.0, dashed=True)
        text(ax, (LEFT_X + LEFT_W + RIGHT_X) / 2, mid + 0.22, "checked equal, not copied", size=7, color=MUTED)
        return
    box(ax, RIGHT_X, y, RIGHT_W, ROW_H, ours, kind, fontsize=8)
    arrow(ax, (LEFT_X + LEFT_W, mid), (RIGHT_X, mid))
    if transpose:
        cx = (LEFT_X + LEFT_W + RIGHT_X) / 2
        box(ax, cx - 0.95, mid - 0.22, 1.9, 0.44, "transpose  .T", "cache", fontsize=7.5, round_=0.1)


def gpt2_key_map():
    fig, ax = canvas(16.0, 14.8)
    y = 12.6
    text(ax, LEFT_X + LEFT_W / 2, y + 1.05, "transformers: GPT2LMHeadModel.state_dict()", size=8.5, weight="bold")
    text(ax, LEFT_X + LEFT_W / 2, y + 0.65, "Conv1D weights stored (in, out)", size=8, color=MUTED)
    text(ax, RIGHT_X + RIGHT_W / 2, y + 1.05, "ours: GPT.state_dict()", size=9, weight="bold")
    text(ax, RIGHT_X + RIGHT_W / 2, y + 0.65, "nn.Linear weights stored (out, in)", size=8, color=MUTED)
    step = ROW_H + GAP
    y -= step
    _row(ax, y, "transformer.wte.weight  (V, C)", "wte.weight  (V, C)", "embed")
    y -= step
    _row(ax, y, "transformer.wpe.weight  (n_positions, C)", "wpe.weight  (block_size, C)", "embed")
    # one block, repeated
    top = y - 0.3
    rows = [
        ("ln_1.weight, ln_1.bias  (C,)", "ln1.weight, ln1.bias  (C,)", "norm", False, None),
        ("attn.c_attn.weight  (C, 3C)\n+ .bias (3C,)", "attn.in_proj.weight  (3C, C)\n+ .bias (3C,)", "attn", True,
         None),
        ("attn.c_proj.weight  (C, C)\n+ .bias (C,)", "attn.out_proj.weight  (C, C)\n+ .bias (C,)", "attn", True,
         None),
        ("ln_2.weight, ln_2.bias  (C,)", "ln2.weight, ln2.bias  (C,)", "norm", False, None),
        ("mlp.c_fc.weight  (C, 4C)\n+ .bias (4C,)", "mlp.fc1.weight  (4C, C)\n+ .bias (4C,)", "mlp", True, None),
        ("mlp.c_proj.weight  (4C, C)\n+ .bias (C,)", "mlp.fc2.weight  (C, 4C)\n+ .bias (C,)", "mlp", True, None),
        ("attn.bias  (1, 1, 1024, 1024)\ncausal mask (older checkpoints)", "", "plain", False,
         "skipped: a buffer, not a parameter"),
    ]
    y -= 0.55
    bottom = y - len(rows) * step - 0.2
    box(ax, LEFT_X - 0.15, bottom, LEFT_W + 0.3, top - bottom, "", "plain", dashed=True, round_=0.1)
    box(ax, RIGHT_X - 0.15, bottom, RIGHT_W + 0.3, top - bottom, "", "plain", dashed=True, round_=0.1)
    for theirs, ours, kind, transpose, skipped in rows:
        y -= step
        _row(ax, y, theirs, ours, kind, transpose=transpose, skipped=skipped)
    text(ax, LEFT_X + 0.05, top - 0.28, "transformer.h.i.   (i = 0 … n_layer − 1)", size=8, ha="left",
         color=MUTED)
    text(ax, RIGHT_X + 0.05, top - 0.28, "blocks.i.", size=8, ha="left", color=MUTED)
    y = bottom - 0.25
    y -= step
    _row(ax, y, "transformer.ln_f.weight, .bias  (C,)", "ln_f.weight, ln_f.bias  (C,)", "norm")
    y -= step
    _row(ax, y, "lm_head.weight  (V, C)", "lm_head.weight is wte.weight  (tied)", "out", tied=True)
    title(ax, 8.0, 14.35, "Loading GPT-2: rename, transpose the four Conv1D weights, skip the mask and the tied head")
    return fig


def conv1d_c_attn():
    """c_attn's (C, 3C) weight: q | k | v column blocks of heads; its transpose is in_proj's (3C, C)."""
    fig, ax = canvas(13.8, 7.6)
    H = 4
    fills = {"q": "#fde5cc", "k": "#f7c99a", "v": "#eea866"}
    edge = COLORS["attn"][1]
    # left: GPT-2's Conv1D weight, (C, 3C): 3 * H column blocks
    cw, x0, y0, h = 0.55, 1.3, 3.3, 1.9
    for part_i, part in enumerate("qkv"):
        for head in range(H):
            x = x0 + (part_i * H + head) * cw
            ax.add_patch(Rectangle((x, y0), cw, h, facecolor=fills[part], edgecolor=edge, lw=0.8))
            text(ax, x + cw / 2, y0 + h / 2, f"{part}{head}", size=7.5)
        text(ax, x0 + (part_i * H + H / 2) * cw, y0 + h + 0.2, f"{part}: C columns", size=8, va="bottom")
    width = 3 * H * cw
    text(ax, x0 + width / 2, y0 + h + 0.85, "GPT-2: attn.c_attn.weight  W′  (C, 3C) = (in, out)", size=9,
         weight="bold", va="bottom")
    text(ax, x0 - 0.12, y0 + h / 2, "C rows", size=7.5, ha="right", color=MUTED)
    text(ax, x0 + width / 2, y0 - 0.35, "Conv1D:  y = x W′ + b", size=9)
    text(ax, x0 + width / 2, y0 - 0.75, "column j of W′ makes output j; the 3C outputs are split into q, k, v,\n"
         "each into n_head heads of head_dim consecutive columns (q0 … q3)", size=7.5, color=MUTED, va="top")
    text(ax, x0 + width / 2, 1.45, "our forward: y = x Wᵀ + b  (B, T, 3C), then\n"
         "unflatten(-1, (3, n_head, head_dim)) splits q, k, v and the\n"
         "heads in the same order: no rows need reordering", size=8, va="top")
    # arrow: transpose
    ax_x = x0 + width + 0.3
    arrow(ax, (ax_x, y0 + h / 2), (ax_x + 1.3, y0 + h / 2))
    text(ax, ax_x + 0.65, y0 + h / 2 + 0.3, ".T", size=10, weight="bold")
    text(ax, ax_x + 0.65, y0 + h / 2 - 0.25, "once, at\nload time", size=7, color=MUTED, va="top")
    # right: our in_proj.weight, (3C, C): 3 * H row blocks
    rx, rw, rh = ax_x + 1.55, 1.9, 0.42
    ry_top = 6.15
    for part_i, part in enumerate("qkv"):
        for head in range(H):
            y = ry_top - (part_i * H + head + 1) * rh
            ax.add_patch(Rectangle((rx, y), rw, rh, facecolor=fills[part], edgecolor=edge, lw=0.8))
            text(ax, rx + rw / 2, y + rh / 2, f"{part}{head}", size=7.5)
        text(ax, rx + rw + 0.15, ry_top - (part_i * H + H / 2) * rh, f"{part}: C rows", size=8, ha="left")
    text(ax, rx + rw / 2, ry_top + 0.2, "ours: attn.in_proj.weight  W\n(3C, C) = (out, in)", size=9,
         weight="bold", va="bottom")
    text(ax, rx + rw / 2, ry_top - 3 * H * rh - 0.3, "nn.Linear:  y = x Wᵀ + b", size=9)
    title(ax, 6.9, 7.3, "Conv1D stores nn.Linear's weight transposed; q, k, v keep their order")
    return fig


FIGURES = {"gpt2_key_map": gpt2_key_map, "conv1d_c_attn": conv1d_c_attn}
