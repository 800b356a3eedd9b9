"""Chapter 11: cross-attention, the encoder-decoder, its masks on a padded batch, and a beam-search tree."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, grid, line, text, title

RESID = "#2f6db5"  # the residual stream, as in chapter 6's GPT


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


def _sublayer(ax, cx, w, y, h, label, kind, resid_x, norm_y, *, fontsize=8):
    """A post-LN sublayer: a split below it, the sublayer, and the residual into "Add & LayerNorm"."""
    split = y - 0.3
    line(ax, [(cx, split), (resid_x, split), (resid_x, norm_y + 0.3)], color=RESID, lw=1.6)
    side = cx - w / 2 if resid_x < cx else cx + w / 2
    arrow(ax, (resid_x, norm_y + 0.3), (side, norm_y + 0.3), color=RESID, lw=1.6)
    arrow(ax, (cx, split), (cx, y))
    box(ax, cx - w / 2, y, w, h, label, kind, fontsize=fontsize)
    arrow(ax, (cx, y + h), (cx, norm_y))
    box(ax, cx - w / 2, norm_y, w, 0.6, "Add & LayerNorm", "norm", fontsize=8)


def seq2seq_architecture():
    fig, ax = canvas(16.0, 14.45)
    w = 3.8
    # ---- encoder (residuals on the left)
    ex = 3.9
    title(ax, ex, 14.05, "encoder")
    box(ax, ex - w / 2, 0.3, w, 0.8, "source ids  src (B, S)", "data")
    arrow(ax, (ex, 1.1), (ex, 1.6))
    box(ax, ex - w / 2, 1.6, w, 0.9, "src_embed × √C\n+ sinusoidal positions", "embed", fontsize=8)
    arrow(ax, (ex, 2.5), (ex, 3.2))
    text(ax, ex + 0.15, 2.85, "(B, S, C)", ha="left", size=8, color=MUTED)
    by = 3.2
    box(ax, ex - w / 2 - 0.75, by, w + 1.2, 5.4, "", dashed=True)
    text(ax, ex - w / 2 - 1.0, by + 2.7, "× n_encoder_layers", size=8.5, weight="bold", rotation=90)
    rx = ex - w / 2 - 0.35
    _sublayer(ax, ex, w, by + 0.6, 0.9, "self-attention\n(source padding mask)", "attn", rx, by + 1.9)
    _sublayer(ax, ex, w, by + 3.1, 0.9, "feed-forward\nC → d_ff → C, ReLU", "mlp", rx, by + 4.4)
    arrow(ax, (ex, by + 5.0), (ex, by + 6.0))
    box(ax, ex - w / 2, by + 6.0, w, 0.8, "memory (B, S, C)", "embed")
    mem_y = by + 6.4

    # ---- decoder (residuals on the right, memory enters from the left)
    dx = 11.6
    title(ax, dx, 14.05, "decoder")
    box(ax, dx - w / 2, 0.3, w, 0.8, "decoder input  BOS y  (B, T)", "data", fontsize=8.5)
    arrow(ax, (dx, 1.1), (dx, 1.6))
    box(ax, dx - w / 2, 1.6, w, 0.9, "tgt_embed × √C\n+ sinusoidal positions", "embed", fontsize=8)
    arrow(ax, (dx, 2.5), (dx, 3.2))
    text(ax, dx - 0.15, 2.85, "(B, T, C)", ha="right", size=8, color=MUTED)
    box(ax, dx - w / 2 - 0.45, by, w + 1.2, 7.9, "", dashed=True)
    text(ax, dx + w / 2 + 1.05, by + 3.95, "× n_decoder_layers", size=8.5, weight="bold", rotation=-90)
    rx = dx + w / 2 + 0.35
    _sublayer(ax, dx, w, by + 0.6, 0.9, "masked self-attention\n(causal + target padding)", "attn", rx, by + 1.9)
    _sublayer(ax, dx, w, by + 3.1, 0.9, "cross-attention\nQ: decoder;  K, V: memory", "attn", rx, by + 4.4)
    _sublayer(ax, dx, w, by + 5.6, 0.9, "feed-forward\nC → d_ff → C, ReLU", "mlp", rx, by + 6.9)
    arrow(ax, (dx, by + 7.5), (dx, by + 8.4))
    box(ax, dx - w / 2, by + 8.4, w, 0.7, "generator: Linear C → V", "out", fontsize=8.5)
    arrow(ax, (dx, by + 9.1), (dx, by + 9.6))
    box(ax, dx - w / 2, by + 9.6, w, 0.8, "logits (B, T, V)", "out")

    # memory -> every decoder layer's cross-attention (keys and values)
    mx = 7.55
    line(ax, [(ex + w / 2, mem_y), (mx, mem_y), (mx, by + 3.55)], color=COLORS["embed"][1], lw=1.6)
    arrow(ax, (mx, by + 3.55), (dx - w / 2, by + 3.55), color=COLORS["embed"][1], lw=1.6)
    text(ax, mx + 0.12, by + 5.1, "K, V\n(source\npadding\nmask)", ha="left", va="center", size=7.5,
         color=COLORS["embed"][1])
    text(ax, ex, by + 7.3, "encoded once, read by\nevery decoder layer", size=7.5, color=MUTED, va="bottom")
    text(ax, 8.0, 0.7, "C = d_model", size=8, color=MUTED)
    return fig


# ---- the masks of a padded batch --------------------------------------------------------------

KEEP, PADDED, CAUSAL = "#fde5cc", "#4a5568", "#a99cc0"


def _labelled_grid(ax, x, y, rows, cols, fill, title_, *, cell=0.5):
    grid(ax, x, y, len(rows), len(cols), cell=cell, kind="attn", fills=fill)
    for i, r in enumerate(rows):
        text(ax, x - 0.1, y + (len(rows) - 0.5 - i) * cell, r, ha="right", size=7.5,
             color=MUTED if r == "PAD" else INK)
    for j, c in enumerate(cols):
        text(ax, x + (j + 0.5) * cell, y - 0.1, c, ha="right", va="top", size=7.5, rotation=50,
             color=MUTED if c == "PAD" else INK)
    text(ax, x + len(cols) * cell / 2, y + len(rows) * cell + 0.55, title_, size=9, weight="bold", va="bottom")
    text(ax, x + len(cols) * cell / 2, y + len(rows) * cell + 0.2, "rows: queries · columns: keys", size=7,
         color=MUTED, va="bottom")


def seq2seq_masks():
    fig, ax = canvas(17.6, 9.4)
    # the batch, as ids: two rows each
    title(ax, 3.3, 9.0, "a batch of two:  100  and  1005")
    src = [["one", "hundred", "PAD", "PAD"], ["one", "thousand", "and", "five"]]
    tgt = [["BOS", "1", "0", "0", "PAD"], ["BOS", "1", "0", "0", "5"]]
    cw = 1.05
    text(ax, 0.3, 8.25, "src (B, S) = (2, 4)", ha="left", size=8.5)
    for b, row in enumerate(src):
        for j, tok in enumerate(row):
            box(ax, 0.3 + j * cw, 7.45 - b * 0.55, cw - 0.05, 0.48, tok, "data", fontsize=7.5, round_=0.05,
                color="#d5dbe3" if tok == "PAD" else None, text_color=MUTED if tok == "PAD" else INK)
    text(ax, 0.3, 6.35, "tgt_in (B, T) = (2, 5)", ha="left", size=8.5)
    for b, row in enumerate(tgt):
        for j, tok in enumerate(row):
            box(ax, 0.3 + j * cw, 5.55 - b * 0.55, cw - 0.05, 0.48, tok, "data", fontsize=7.5, round_=0.05,
                color="#d5dbe3" if tok == "PAD" else None, text_color=MUTED if tok == "PAD" else INK)
    text(ax, 0.3, 4.45, "key masks (True at real tokens):", ha="left", size=8)
    text(ax, 0.3, 4.0, "src != PAD,  tgt_in != PAD", ha="left", size=8, color=MUTED)
    text(ax, 0.3, 3.2, "The panels show row 0", ha="left", size=8)
    text(ax, 0.3, 2.8, "(\"one hundred\" → 100), the padded one.", ha="left", size=8)
    text(ax, 0.3, 2.1, "Rows of PAD queries are computed", ha="left", size=8, color=MUTED)
    text(ax, 0.3, 1.7, "but never read: the loss ignores", ha="left", size=8, color=MUTED)
    text(ax, 0.3, 1.3, "their labels (ignore_index).", ha="left", size=8, color=MUTED)

    s_tok, t_tok = src[0], tgt[0]
    n_src, n_tgt = 2, 4  # real tokens of row 0
    _labelled_grid(ax, 6.7, 3.6, s_tok, s_tok, lambda i, j: KEEP if j < n_src else PADDED,
                   "encoder self-attention")
    _labelled_grid(ax, 10.3, 3.1, t_tok, t_tok,
                   lambda i, j: PADDED if j >= n_tgt else (CAUSAL if j > i else KEEP),
                   "decoder self-attention")
    _labelled_grid(ax, 14.5, 3.1, t_tok, s_tok, lambda i, j: KEEP if j < n_src else PADDED,
                   "cross-attention")
    # legend
    for k, (fill, label) in enumerate([(KEEP, "may attend"), (CAUSAL, "masked: a later position (causal)"),
                                       (PADDED, "masked: a padded key")]):
        x = (6.7, 9.3, 14.1)[k]
        box(ax, x, 0.5, 0.4, 0.3, "", "attn", color=fill, round_=0.05)
        text(ax, x + 0.5, 0.65, label, ha="left", size=7.5)
    return fig


# ---- a beam of width 2 over a toy model -------------------------------------------------------

# The toy model of the chapter (its cell checks these numbers): p(first token), then p(next | first).
P1 = {"A": 0.5, "B": 0.4, "EOS": 0.1}
P2 = {"A": {"A": 0.3, "B": 0.3, "EOS": 0.4}, "B": {"A": 0.05, "B": 0.05, "EOS": 0.9}}


def _edge(ax, start, end, p, *, color=INK, lw=1.0, at=0.5):
    """An arrow from parent to child, labelled with the child's conditional probability."""
    arrow(ax, start, end, color=color, lw=lw)
    x, y = start[0] + at * (end[0] - start[0]), start[1] + at * (end[1] - start[1])
    text(ax, x, y, f"{p:g}", size=7, color=MUTED, bbox=dict(facecolor="white", edgecolor="none", pad=0.6))


def _lp(p):
    import math

    return f"{math.log(p):.2f}".replace("-", "\u2212")


def beam_search_tree():
    fig, ax = canvas(18.0, 10.6)
    FIN, LIVE, GONE = COLORS["mlp"][0], COLORS["attn"][0], "#eeeeee"
    GREEDY, BEAM = "#b23a3a", COLORS["mlp"][1]
    bw, bh = 2.3, 0.75
    root = (0.4, 4.4)
    box(ax, *root, 1.3, bh, "BOS\nlog p = 0", "data", fontsize=7.5)
    level1 = {"A": 7.4, "B": 3.7, "EOS": 1.0}
    x1, x2 = 4.0, 10.0
    fates1 = {"A": ("kept", LIVE), "B": ("kept", LIVE), "EOS": ("not among the 2 best: dropped", GONE)}
    for tok, y in level1.items():
        fate, fill = fates1[tok]
        color, lw = (GREEDY, 2.2) if tok == "A" else (BEAM, 2.2) if tok == "B" else (INK, 1.0)
        _edge(ax, (root[0] + 1.3, root[1] + bh / 2), (x1, y + bh / 2), P1[tok], color=color, lw=lw, at=0.55)
        box(ax, x1, y, bw, bh, f"{tok}\nlog p = {_lp(P1[tok])}", "attn", color=fill, fontsize=8,
            dashed=fill == GONE, text_color=MUTED if fill == GONE else INK)
        text(ax, x1 + bw / 2, y - 0.12, fate, size=7, color=MUTED, va="top")
    # step 2: the children of the two kept hypotheses
    kids = {"A": [("A", 8.9), ("B", 7.9), ("EOS", 6.9)], "B": [("A", 4.9), ("B", 3.9), ("EOS", 2.9)]}
    for parent, children in kids.items():
        py = level1[parent]
        for tok, y in children:
            if tok == "EOS":
                fill, fate = FIN, "finished: " + ("the best, beam search's answer" if parent == "B" else "greedy's answer")
            elif parent == "A":
                fill, fate = LIVE, "live (the 2 best unfinished)"
            else:
                fill, fate = GONE, "pruned"
            color, lw = INK, 1.0
            if tok == "EOS":
                color, lw = (GREEDY, 2.2) if parent == "A" else (BEAM, 2.2)
            _edge(ax, (x1 + bw, py + bh / 2), (x2, y + 0.35), P2[parent][tok], color=color, lw=lw, at=0.6)
            box(ax, x2, y, 2.9, 0.7, f"{parent} {tok}   log p = {_lp(P1[parent] * P2[parent][tok])}", "attn",
                color=fill, fontsize=8, dashed=fill == GONE, text_color=MUTED if fill == GONE else INK)
            text(ax, x2 + 3.05, y + 0.35, fate, ha="left", size=7.5,
                 color=INK if fill == FIN else MUTED, weight="bold" if parent == "B" and tok == "EOS" else "normal")
    text(ax, x1 + bw / 2, 10.1, "step 1: 3 candidates, keep k = 2", size=8.5, weight="bold")
    text(ax, x2 + 1.45, 10.1, "step 2: 2 × 3 candidates", size=8.5, weight="bold")
    text(ax, x2 + 1.45, 2.1, "stop: the best finished score (\u22121.02) beats the best live one (\u22121.90),",
         size=7.5, color=MUTED)
    text(ax, x2 + 1.45, 1.65, "and a log-probability only falls as a hypothesis grows", size=7.5, color=MUTED)
    line(ax, [(0.5, 0.3), (1.2, 0.3)], color=GREEDY, lw=2.2)
    text(ax, 1.35, 0.3, "greedy: A (0.5 > 0.4), then EOS; p = 0.2", ha="left", size=8)
    line(ax, [(8.0, 0.3), (8.7, 0.3)], color=BEAM, lw=2.2)
    text(ax, 8.85, 0.3, "beam search, k = 2: B, then EOS; p = 0.36", ha="left", size=8)
    return fig


FIGURES = {
    "cross_attention": cross_attention,
    "seq2seq_architecture": seq2seq_architecture,
    "seq2seq_masks": seq2seq_masks,
    "beam_search_tree": beam_search_tree,
}
