"""Chapter 8: backpropagation by hand (the computational graph, a layer pair, the NumPy GPT's backward order)."""

import math

from kit import COLORS, MUTED, arrow, box, canvas, line, plus, text

GRAD = COLORS["out"][1]  # gradients (adjoints) are drawn in the loss's colour, flowing back
CACHE = COLORS["cache"][1]


def backprop_graph():
    """The five-node example of the chapter: forward values left to right, adjoints right to left."""
    # the numbers are the chapter's example, computed here (the chapter prints the same ones)
    x, w, b, t = 0.5, -1.5, 0.25, 0.8
    s1 = w * x
    s2 = s1 + b
    s3 = math.tanh(s2)
    loss = (s3 - t) ** 2
    d3 = 2 * (s3 - t)
    d2 = (1 - s3 * s3) * d3
    dx, dw = w * d2, x * d2

    fig, ax = canvas(19.0, 7.4)
    ym = 3.9  # the row of operation nodes
    ops = [(4.3, "×"), (7.9, "+"), (11.5, "tanh"), (15.1, "$(\\,\\cdot\\, - t)^2$")]
    wid = {"×": 1.0, "+": 1.0, "tanh": 1.3, "$(\\,\\cdot\\, - t)^2$": 1.9}
    for cx, s in ops:
        box(ax, cx - wid[s] / 2, ym - 0.45, wid[s], 0.9, s, "plain", fontsize=10)
    # leaves
    box(ax, 0.4, 5.2, 1.9, 0.8, f"x = {x}", "data")
    box(ax, 0.4, 1.8, 1.9, 0.8, f"w = {w}", "data")
    box(ax, 6.0, 0.9, 1.9, 0.8, f"b = {b}", "data")
    box(ax, 17.3, ym - 0.4, 1.4, 0.8, "$\\mathcal{L}$", "out", fontsize=10)

    # edges from the leaves; each leaf's adjoint is written under it
    arrow(ax, (2.3, 5.6), (3.8, ym + 0.25))
    arrow(ax, (2.3, 2.2), (3.8, ym - 0.25))
    arrow(ax, (7.9, 1.7), (7.9, ym - 0.45))
    text(ax, 1.35, 4.85, f"$\\bar x$ = {dx:.4g}", size=8.5, color=GRAD)
    text(ax, 1.35, 1.45, f"$\\bar w$ = {dw:.4g}", size=8.5, color=GRAD)
    text(ax, 8.05, 2.35, f"$\\bar b$ = {d2:.4g}", size=8.5, color=GRAD, ha="left")
    for (x0, s0), (x1, s1), name, value, grad in (
        ((4.3, "×"), (7.9, "+"), "s_1", s1, d2),
        ((7.9, "+"), (11.5, "tanh"), "s_2", s2, d2),
        ((11.5, "tanh"), (15.1, "$(\\,\\cdot\\, - t)^2$"), "s_3", s3, d3),
    ):
        xa, xb = x0 + wid[s0] / 2, x1 - wid[s1] / 2
        arrow(ax, (xa, ym), (xb, ym))
        text(ax, (xa + xb) / 2, ym + 0.32, f"${name}$ = {value:.4g}", size=8.5)
        text(ax, (xa + xb) / 2, ym - 0.32, f"$\\bar s_{name[-1]}$ = {grad:.4g}", size=8.5, color=GRAD)
    arrow(ax, (15.1 + wid[ops[3][1]] / 2, ym), (17.3, ym))
    text(ax, 18.0, ym + 0.75, f"$\\mathcal{{L}}$ = {loss:.4g}", size=8.5)
    text(ax, 18.0, ym - 0.75, "$\\bar{\\mathcal{L}}$ = 1", size=8.5, color=GRAD)

    # the two sweeps
    arrow(ax, (4.0, 6.9), (15.0, 6.9), lw=1.6)
    text(ax, 9.5, 7.15, "forward: compute each value, keep it (the cache)", size=9)
    arrow(ax, (15.0, 0.35), (4.0, 0.35), color=GRAD, lw=1.6)
    text(ax, 9.5, 0.65, "backward: multiply by one local derivative per node", size=9, color=GRAD)
    # the local derivative of each node, used on the way back
    for cx, s in ((4.3, "$\\bar x = w\\,\\bar s_1,\\;\\bar w = x\\,\\bar s_1$"), (7.9, "$\\times 1$ to both inputs"),
                  (11.5, "$\\times\\,(1 - s_3^2)$"), (15.1, "$2\\,(s_3 - t)$")):
        text(ax, cx, ym + 1.0, s, size=8, color=MUTED)
    return fig


def layer_pair():
    """One MLP half-layer, linear then GELU, as two layer pairs: forward on top, backward below."""
    fig, ax = canvas(17.6, 7.6)
    yf, yb = 5.6, 1.6  # the forward and the backward row
    h = 1.0
    # forward row
    box(ax, 0.3, yf - 0.4, 2.2, 0.8, "x  (N, C)", "data")
    box(ax, 3.6, yf - h / 2, 3.6, h, "linear_forward\nW (4C, C), b (4C,)", "mlp", fontsize=8.5)
    box(ax, 8.3, yf - 0.4, 2.4, 0.8, "z  (N, 4C)", "data")
    box(ax, 11.8, yf - h / 2, 2.8, h, "gelu_forward", "mlp", fontsize=8.5)
    box(ax, 15.4, yf - 0.4, 1.9, 0.8, "y  (N, 4C)", "data")
    for x0, x1 in ((2.5, 3.6), (7.2, 8.3), (10.7, 11.8), (14.6, 15.4)):
        arrow(ax, (x0, yf), (x1, yf))
    # backward row, right to left
    box(ax, 15.4, yb - 0.4, 1.9, 0.8, "dy  (N, 4C)", "out", fontsize=8.5)
    box(ax, 11.8, yb - h / 2, 2.8, h, "gelu_backward", "out", fontsize=8.5)
    box(ax, 8.3, yb - 0.4, 2.4, 0.8, "dz  (N, 4C)", "out", fontsize=8.5)
    box(ax, 3.6, yb - h / 2, 3.6, h, "linear_backward", "out", fontsize=8.5)
    box(ax, 0.3, yb - 0.4, 2.2, 0.8, "dx  (N, C)", "out", fontsize=8.5)
    for x0, x1 in ((15.4, 14.6), (11.8, 10.7), (8.3, 7.2), (3.6, 2.5)):
        arrow(ax, (x0, yb), (x1, yb), color=GRAD)
    # parameter gradients leave linear_backward downwards
    arrow(ax, (4.6, yb - h / 2), (4.6, 0.25), color=GRAD)
    arrow(ax, (6.2, yb - h / 2), (6.2, 0.25), color=GRAD)
    text(ax, 4.5, 0.45, "dW (4C, C)", size=8, color=GRAD, ha="right")
    text(ax, 6.3, 0.45, "db (4C,)", size=8, color=GRAD, ha="left")
    # the caches go from each forward function to its backward function
    for cx, label in ((5.4, "cache: x, W"), (13.2, "cache: z, Φ(z)")):
        arrow(ax, (cx, yf - h / 2), (cx, yb + h / 2), color=CACHE, dashed=True)
        box(ax, cx - 1.35, (yf + yb) / 2 - 0.33, 2.7, 0.66, label, "cache", fontsize=8)
    text(ax, 0.3, 6.95, "forward: inputs → (output, cache)", ha="left", size=9)
    text(ax, 17.3, 0.45, "backward: (d_output, cache) → gradients", ha="right", size=9, color=GRAD)
    text(ax, 17.3, 6.95, "N = B·T rows", ha="right", size=8, color=MUTED)
    return fig


def numpy_gpt_backward():
    """The NumPy GPT: the forward pass up the left, the backward pass down the right, caches between."""
    fig, ax = canvas(21.0, 18.4)
    lx, rx, w = 0.4, 8.4, 5.6  # left column (forward), right column (backward)
    lc, rc = lx + w / 2, rx + w / 2
    hbox = 0.8
    ys = [0.4, 3.0, 4.5, 8.2, 11.9, 13.4, 14.9, 16.4]  # the rows, bottom to top
    fwd = [
        ("idx (B, T)", "data"),
        ("wte[idx] + wpe[:T]", "embed"),
        ("block 0", "attn"),
        ("block n_layer − 1", "attn"),
        ("ln_f", "norm"),
        ("logits = x wteᵀ  (tied head)", "out"),
        ("cross-entropy with targets", "out"),
        ("loss  ℒ", "out"),
    ]
    bwd = [
        ("d wte,  d wpe (sum over the batch)", "embed"),
        ("embedding_backward", "embed"),
        ("block_backward 0", "attn"),
        ("block_backward n_layer − 1", "attn"),
        ("layer_norm_backward", "norm"),
        ("linear_backward", "out"),
        ("cross_entropy_backward", "out"),
        ("d ℒ = 1", "out"),
    ]
    for y, (s, kind) in zip(ys, fwd):
        box(ax, lx, y, w, hbox, s, kind, fontsize=8.5)
    for y, (s, kind) in zip(ys[1:], bwd[1:]):
        box(ax, rx, y, w, hbox, s, kind, fontsize=8.5)
    box(ax, rx, ys[0], w, hbox, bwd[0][0], "plain", fontsize=8.5)
    for i, (y0, y1) in enumerate(zip(ys[:-1], ys[1:])):
        if y1 - y0 > 2 and i > 0:  # the blocks in between, drawn as dots
            arrow(ax, (lc, y0 + hbox), (lc, y0 + hbox + 0.6))
            text(ax, lc, (y0 + y1 + hbox) / 2, "⋮", size=14)
            arrow(ax, (lc, y1 - 0.6), (lc, y1))
            line(ax, [(rc, y1), (rc, y1 - 0.6)], color=GRAD)
            text(ax, rc, (y0 + y1 + hbox) / 2, "⋮", size=14, color=GRAD)
            arrow(ax, (rc, y0 + hbox + 0.6), (rc, y0 + hbox), color=GRAD)
        elif i > 0:
            arrow(ax, (lc, y0 + hbox), (lc, y1))
            arrow(ax, (rc, y1), (rc, y0 + hbox), color=GRAD)
    arrow(ax, (lc, ys[0] + hbox), (lc, ys[1]))
    text(ax, lc + 0.15, (ys[3] + ys[2] + hbox) / 2 + 0.9, "x (B, T, C)", size=8, color=MUTED, ha="left")
    text(ax, rc + 0.15, (ys[3] + ys[2] + hbox) / 2 + 0.9, "dx (B, T, C)", size=8, color=GRAD, ha="left")
    # caches: from each forward box to its backward box
    for y in ys[1:-1]:
        arrow(ax, (lx + w, y + hbox / 2), (rx, y + hbox / 2), color=CACHE, dashed=True, lw=1.0)
    text(ax, (lx + w + rx) / 2, ys[-2] + hbox / 2 + 0.3, "cache", size=8, color=CACHE)
    # the turn at the top: the loss starts the backward pass
    top = ys[-1] + hbox + 0.45
    line(ax, [(lc, ys[-1] + hbox), (lc, top), (rc, top)], color=GRAD)
    arrow(ax, (rc, top), (rc, ys[-1] + hbox), color=GRAD)
    # the tied weight: its two gradients are added at the bottom
    px, py = rc, (ys[0] + hbox + ys[1]) / 2
    plus(ax, px, py, r=0.25)
    arrow(ax, (rc, ys[1]), (rc, py + 0.25), color=GRAD)
    arrow(ax, (rc, py - 0.25), (rc, ys[0] + hbox), color=GRAD)
    ex = rx + w + 0.5
    line(ax, [(rx + w, ys[5] + hbox / 2), (ex, ys[5] + hbox / 2), (ex, py)], color=GRAD)
    arrow(ax, (ex, py), (px + 0.25, py), color=GRAD)
    text(ax, rx + w + 0.1, ys[5] + hbox / 2 + 0.3, "d wte (head part)", size=8, color=GRAD, ha="left")
    text(ax, px - 0.4, py, "embedding part", size=8, color=GRAD, ha="right")
    text(ax, ex + 0.15, py + 0.5, "sum at the fork:\nwte is used twice", size=8, color=GRAD, ha="left", va="bottom")
    # inside one block: the backward order
    bx, bw = ex + 0.6, 5.8
    by, bh = ys[3] - 0.95, 2.6
    box(ax, bx, by, bw, bh, "", "plain", dashed=True, round_=0.1)
    line(ax, [(rx + w, ys[3] + hbox / 2), (bx, ys[3] + hbox / 2)], color=MUTED, dashed=True, lw=0.8)
    text(ax, bx + bw / 2, by + bh - 0.3, "inside block_backward:", size=8.5, color=MUTED)
    steps = ["dy → fc2 → GELU → fc1 → ln2", "+ dy   (the residual fork)", "→ attention → ln1",
             "+   (the second fork) → dx"]
    for i, s in enumerate(steps):
        text(ax, bx + 0.3, by + bh - 0.8 - 0.45 * i, s, size=8.5, color=GRAD, ha="left")
    text(ax, lc, 17.95, "forward (up)", size=10, weight="bold")
    text(ax, rc, 17.95, "backward (down)", size=10, weight="bold", color=GRAD)
    return fig


FIGURES = {"backprop_graph": backprop_graph, "layer_pair": layer_pair, "numpy_gpt_backward": numpy_gpt_backward}
