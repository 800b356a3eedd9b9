"""Chapter 10: a sample of random windows against the whole split, and the contexts inside a window."""

import random

from kit import MUTED, box, brace_label, canvas, line, text


def whole_split_eval():
    fig, ax = canvas(16, 9.4)
    x0, width = 0.4, 15.2
    n = 40  # the split drawn as 40 windows of T tokens
    cw = width / n

    # 1. estimate_loss: a few windows at random offsets, drawn above the split.
    text(ax, x0, 9.0, "estimate_loss: B x iters windows of T at random offsets (another seed, other windows)",
         ha="left", size=8.5, weight="bold")
    box(ax, x0, 7.2, width, 0.45, "", "data", round_=0.05)
    text(ax, x0 + width / 2, 7.425, "the validation split: N tokens", size=7.5, color=MUTED)
    rng = random.Random(3)
    for k in range(12):
        start = rng.uniform(0, n - 1)
        box(ax, x0 + start * cw, 7.8 + (k % 3) * 0.25, cw, 0.18, "", "attn", round_=0.02)
    text(ax, x0 + width / 2, 6.95, "some positions seen twice, most never: a sample, with a sampling error",
         size=7.5, color=MUTED, va="top")

    # 2. evaluate_split: consecutive windows tiling the split, the last one shorter.
    text(ax, x0, 6.0, "evaluate_split: consecutive windows starting at 0, T, 2T, ... (the same at every call)",
         ha="left", size=8.5, weight="bold")
    last = 0.45 * cw
    full = (width - last) / (n - 1)
    for k in range(n - 1):
        box(ax, x0 + k * full, 4.9, full, 0.45, "", "embed", round_=0.02, color="#dbe9f8" if k % 2 else "#b9d3f0")
    box(ax, x0 + (n - 1) * full, 4.9, last, 0.45, "", "embed", round_=0.02, color="#dbe9f8")
    brace_label(ax, x0, x0 + full, 4.83, "T")
    text(ax, x0 + width, 4.72, "last window: shorter", ha="right", va="top", size=7.5, color=MUTED)
    text(ax, x0 + width / 2, 4.3, "every one of the N - 1 targets predicted once; the score sums their losses "
         "and divides by N - 1", size=7.5, color=MUTED, va="top")

    # 3. Inside any window: the prediction at position j sees the inputs 0..j, so contexts grow from 1 to T.
    T = 8
    c = 0.72
    left = 1.6
    text(ax, x0, 3.5, "inside every window (drawn with T = 8): the prediction at position j sees j + 1 inputs",
         ha="left", size=8.5, weight="bold")
    for t in range(T):
        y = 2.9 - t * 0.325
        line(ax, [(left, y), (left + (t + 1) * c - 0.08, y)], color="#c8630a", lw=3.2)
        text(ax, left + (t + 1) * c + 0.05, y, f"predicts $x_{{i+{t + 1}}}$ from {t + 1}", ha="left", size=7,
             color=MUTED)
    for t in range(T):
        box(ax, left + t * c, 0.0, c - 0.06, 0.38, f"$x_{{i+{t}}}$", "data", fontsize=7.5, round_=0.05)
    text(ax, left - 0.2, 0.19, "inputs", ha="right", size=7.5, color=MUTED)
    right = left + T * c + 2.9
    text(ax, right, 2.6, "Random or consecutive, every window gives", ha="left", size=8)
    text(ax, right, 2.15, "its positions contexts of 1, 2, ..., T characters:", ha="left", size=8)
    text(ax, right, 1.7, "the short contexts at its start cost the most.", ha="left", size=8)
    text(ax, right, 1.0, "Sliding windows (Exercise 3) give every", ha="left", size=8, color=MUTED)
    text(ax, right, 0.55, "position T characters, at T times the cost.", ha="left", size=8, color=MUTED)
    return fig


FIGURES = {"whole_split_eval": whole_split_eval}
