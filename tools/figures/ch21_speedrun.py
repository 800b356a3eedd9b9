"""Chapter 21: where each change of the speedrun acts in the GPT of Chapter 6."""

from ch17_llama import _column
from kit import MUTED, arrow, box, canvas, text


def speedrun_changes():
    fig, ax = canvas(17.5, 10.6)
    block = [("LayerNorm", "norm", 0.6),
             ("causal self-attention\nRoPE on q, k   [+ QK-norm]\nout_proj = 0 at init", "attn", 1.3),
             ("LayerNorm", "norm", 0.6),
             ("MLP  d → 4d → d\nReLU² instead of GELU\nfc2 = 0 at init", "mlp", 1.3)]
    _column(ax, 3.6, "one block (× n_layer)", block,
            [(1.5, "RoPE: positions are\nrotations of q and k,\nno table wpe"),
             (3.05, "QK-norm: RMS of each\nq and k head is 1"),
             (6.55, "zero-init: the block\nstarts as the identity")])
    # the model around the blocks, bottom to top
    cx = 13.2
    text(ax, cx, 10.05, "the model", size=10, weight="bold")
    parts = [(0.3, "token ids (B, T)", "data", 0.6),
             (1.5, "wte: token embedding\n(no position table with RoPE)", "embed", 0.9),
             (3.0, "n_layer blocks", "plain", 0.7),
             (4.3, "ln_f", "norm", 0.6),
             (5.5, "lm_head: its own matrix\n(untied from wte)", "out", 0.9),
             (7.0, "soft-cap: c · tanh(logits / c)", "out", 0.7),
             (8.3, "logits (B, T, V)", "data", 0.6)]
    for k, (y, label, kind, h) in enumerate(parts):
        box(ax, cx - 2.2, y, 4.4, h, label, kind, fontsize=8)
        if k + 1 < len(parts):
            arrow(ax, (cx, y + h), (cx, parts[k + 1][0]))
    text(ax, cx, 9.45, "optimizer: Muon on the block matrices, AdamW on wte, lm_head, gains", size=7.5, color=MUTED)
    return fig


FIGURES = {"speedrun_changes": speedrun_changes}
