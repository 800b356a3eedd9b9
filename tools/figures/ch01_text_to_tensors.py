"""Chapter 1: from text to blocks of token ids, inputs and shifted targets; the bigram model."""

from matplotlib.patches import Rectangle

from kit import COLORS, MUTED, arrow, box, canvas, grid, text

ORANGE = COLORS["attn"][1]


def text_to_batches():
    fig, ax = canvas(16, 6.6)
    s = "First Citizen:"
    # The ids of "First Citizen:"; chapter 1 asserts that its tokenizer gives exactly this list.
    ids = [18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52, 10]
    c = 0.62
    text(ax, 0.3, 6.25, "text", ha="left", size=9, weight="bold")
    for k, ch in enumerate(s):
        box(ax, 1.6 + k * c, 5.9, c - 0.06, 0.55, repr(ch)[1:-1] if ch != " " else "␣", "data", fontsize=8)
    arrow(ax, (0.9, 5.8), (0.9, 5.0))
    # V = 65: chapter 1 asserts it (with the landmarks ln V, H).
    text(ax, 1.0, 5.4, "CharTokenizer.encode: one id per character (65 characters, ids 0..64)", ha="left",
         size=7.5, color=MUTED)
    text(ax, 0.3, 4.55, "ids", ha="left", size=9, weight="bold")
    for k, i in enumerate(ids):
        box(ax, 1.6 + k * c, 4.2, c - 0.06, 0.55, str(i), "embed", fontsize=8)
    # a window of T + 1 ids at a random offset
    T, off = 8, 3
    x0 = 1.6 + off * c
    ax.add_patch(Rectangle((x0 - 0.05, 4.12), (T + 1) * c, 0.7, fill=False, edgecolor=ORANGE, lw=1.5,
                           linestyle="--"))
    text(ax, x0 + (T + 1) * c / 2, 3.9, f"get_batch: a window of T + 1 = {T + 1} ids at a random offset i_b",
         size=7.5, color=ORANGE, va="top")
    text(ax, 0.3, 2.85, "x", ha="left", size=9, weight="bold")
    text(ax, 0.3, 1.75, "y", ha="left", size=9, weight="bold")
    for k in range(T):
        box(ax, 1.6 + (off + k) * c, 2.55, c - 0.06, 0.55, str(ids[off + k]), "attn", fontsize=8)
        box(ax, 1.6 + (off + k + 1) * c, 1.45, c - 0.06, 0.55, str(ids[off + k + 1]), "out", fontsize=8)
    text(ax, x0 + T * c + 0.9, 2.82, "inputs  x[b, t] = data[i_b + t]", ha="left", size=8)
    text(ax, x0 + T * c + 0.9, 1.86, "targets y[b, t] = data[i_b + t + 1]:", ha="left", size=8)
    text(ax, x0 + T * c + 0.9, 1.58, "x shifted left by one, plus the next id", ha="left", size=8)
    text(ax, 1.6, 0.75, "B such windows stacked: x and y are (B, T) int64 tensors; "
         "at every position t the model predicts y[b, t] from x[b, :t + 1]", ha="left", size=8, color=MUTED)
    return fig


def bigram_model():
    fig, ax = canvas(16, 7.4)
    # Left: the (V, V) table of pair counts, an excerpt, with the row of the current character lit.
    rows = ["a", "e", "h", "t", "…"]
    cols = ["␣", "a", "e", "h", "o", "…"]
    cell, gx, gy = 0.62, 1.5, 1.6
    lit = rows.index("t")
    fill_lit = COLORS["attn"][0]
    grid(ax, gx, gy, len(rows), len(cols), cell=cell, kind="data",
         fills=lambda i, j: fill_lit if i == lit else None,
         values=lambda i, j: "…" if rows[i] == "…" or cols[j] == "…" else f"N{rows[i]}{cols[j]}",
         fontsize=6.5)
    for i, r in enumerate(rows):
        text(ax, gx - 0.25, gy + (len(rows) - 1 - i + 0.5) * cell, r, size=8.5, weight="bold" if i == lit else "normal")
    for j, ch in enumerate(cols):
        text(ax, gx + (j + 0.5) * cell, gy + len(rows) * cell + 0.22, ch, size=8.5)
    text(ax, gx + len(cols) * cell / 2, gy + len(rows) * cell + 0.75, "next character b", size=8, color=MUTED)
    text(ax, gx - 0.8, gy + len(rows) * cell / 2, "current character a", size=8, color=MUTED, rotation=90)
    text(ax, gx + len(cols) * cell / 2, gy - 0.45, "counts $N_{ab}$ from the training text", size=8.5)
    text(ax, gx + len(cols) * cell / 2, gy - 0.9, "a (V, V) table, V = 65", size=8, color=MUTED)
    ax.add_patch(Rectangle((gx - 0.04, gy + (len(rows) - 1 - lit) * cell - 0.04), len(cols) * cell + 0.08,
                           cell + 0.08, fill=False, edgecolor=ORANGE, lw=1.6))

    # Middle: that row, plus one and normalised, as a distribution over the next character.
    row_y = gy + (len(rows) - 1 - lit + 0.5) * cell
    mx = 7.0
    arrow(ax, (gx + len(cols) * cell + 0.15, row_y), (mx - 0.25, row_y), color=ORANGE)
    text(ax, (gx + len(cols) * cell + mx) / 2 - 0.05, row_y + 0.35, "row a = t", size=8, color=ORANGE)
    heights = [0.35, 0.2, 1.3, 2.3, 0.9, 0.45, 0.15]
    bar_labels = ["␣", "a", "e", "h", "o", "r", "…"]
    bw, base = 0.5, 2.0
    for k, (h, lab) in enumerate(zip(heights, bar_labels)):
        box(ax, mx + k * (bw + 0.1), base, bw, h, "", "out", round_=0.05)
        text(ax, mx + k * (bw + 0.1) + bw / 2, base - 0.25, lab, size=8.5)
    bars_w = len(heights) * (bw + 0.1) - 0.1
    ax.plot([mx - 0.1, mx + bars_w + 0.1], [base, base], color=MUTED, lw=0.8)
    text(ax, mx + bars_w / 2, 0.95, r"$p(b \mid t) = \dfrac{N_{tb} + 1}{\sum_{b'} N_{tb'} + V}$", size=10)

    # Right: sample the next character, which becomes the current one.
    sx = mx + bars_w + 1.7
    arrow(ax, (mx + bars_w + 0.25, base + 1.2), (sx - 0.1, base + 1.2))
    text(ax, (mx + bars_w + sx) / 2 + 0.05, base + 1.5, "sample", size=8.5)
    box(ax, sx, base + 0.9, 0.65, 0.6, "h", "out", fontsize=10, weight="bold")
    text(ax, sx + 0.33, base + 0.55, "next character", size=8, color=MUTED, va="top")
    # loop back: the sample is appended and indexes the next row
    arrow(ax, (sx + 0.33, base + 1.55), (gx + len(cols) * cell / 2, gy + len(rows) * cell + 1.05),
          rad=0.28, dashed=True, color=MUTED)
    text(ax, 9.3, 6.75, "append it to the text; its row gives the distribution after it: repeat",
         size=8, color=MUTED)
    return fig


FIGURES = {"text_to_batches": text_to_batches, "bigram_model": bigram_model}
