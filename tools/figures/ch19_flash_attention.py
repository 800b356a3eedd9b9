"""Chapter 19: FlashAttention's tiles. The score matrix cut into query and key tiles; the tiles a
causal pass visits, masks or skips; the running state one query tile carries across its key tiles;
and the tiles of sliding-window attention."""

from matplotlib.patches import Polygon, Rectangle

from kit import COLORS, INK, MUTED, arrow, box, canvas, text

FULL = COLORS["attn"][0]          # a visited tile, every score visible
EDGE = COLORS["attn"][1]
PART = "#f7c08a"                  # the visible part of a tile that needs a mask
SKIP = "#f2f2f2"                  # a tile that is never computed
HOT = COLORS["out"][1]            # the tile of the worked step


def _tiles(ax, x0, y0, n, size, kind, *, hot=None):
    """An n x n grid of tiles from (x0, y0) (row 0 at the top); ``kind(i, j)`` is 'full', 'diag',
    'lower' (the band's lower edge: visible above the tile's diagonal) or 'skip'."""
    cells = sorted(((i, j) for i in range(n) for j in range(n)), key=lambda c: kind(*c) != "skip")
    for i, j in cells:           # skipped tiles first, so that the solid edges are drawn over the dashed ones
        x, y = x0 + j * size, y0 + (n - 1 - i) * size
        k = kind(i, j)
        fill = {"full": FULL, "skip": SKIP}.get(k, "white")
        ax.add_patch(Rectangle((x, y), size, size, facecolor=fill, edgecolor="#bbbbbb" if k == "skip" else EDGE,
                               linewidth=0.8, linestyle="--" if k == "skip" else "-"))
        if k == "diag":        # visible where j <= i: the lower-left triangle
            ax.add_patch(Polygon([(x, y), (x + size, y), (x, y + size)], closed=True, facecolor=PART,
                                 edgecolor="none"))
        elif k == "lower":     # visible where j > i - window: the upper-right triangle
            ax.add_patch(Polygon([(x + size, y + size), (x + size, y), (x, y + size)], closed=True,
                                 facecolor=PART, edgecolor="none"))
        if k in ("diag", "lower"):
            ax.add_patch(Rectangle((x, y), size, size, facecolor="none", edgecolor=EDGE, linewidth=0.8))
    if hot is not None:
        i, j = hot
        ax.add_patch(Rectangle((x0 + j * size, y0 + (n - 1 - i) * size), size, size, facecolor="none",
                               edgecolor=HOT, linewidth=2.4))


def flash_tiling():
    fig, ax = canvas(24, 10.6)
    n, size = 6, 0.95
    # left: the causal score matrix, with the strips of Q and K^T that make one tile
    x0, y0 = 2.6, 1.7
    text(ax, x0 + n * size / 2, 10.1, "causal attention: 21 of 36 tiles are computed", size=10, weight="bold")

    def causal(i, j):
        return "full" if j < i else ("diag" if j == i else "skip")

    _tiles(ax, x0, y0, n, size, causal, hot=(4, 1))
    w = n * size
    for i in range(n):       # query tiles Q_i: strips to the left
        y = y0 + (n - 1 - i) * size
        ax.add_patch(Rectangle((x0 - 1.25, y + 0.04), 0.9, size - 0.08, facecolor=COLORS["attn"][0] if i == 4 else "white",
                               edgecolor=EDGE, linewidth=0.8))
        text(ax, x0 - 0.8, y + size / 2, f"$Q_{i}$", size=8)
    for j in range(n):       # key tiles K_j^T: strips on top
        x = x0 + j * size
        ax.add_patch(Rectangle((x + 0.04, y0 + w + 0.3), size - 0.08, 0.9, facecolor=COLORS["attn"][0] if j == 1 else "white",
                               edgecolor=EDGE, linewidth=0.8))
        text(ax, x + size / 2, y0 + w + 0.75, f"$K_{j}^T$", size=8)
    text(ax, x0 + w / 2, y0 - 0.35, "keys j →  (tiles of $b_k$ columns)", size=8, color=MUTED)
    text(ax, x0 - 1.75, y0 + w / 2, "queries i →  (tiles of $b_q$ rows)", size=8, color=MUTED, rotation=90)
    # legend
    ly = 0.35
    for k, (fill, label) in enumerate(((FULL, "computed, no mask"), (PART, "computed, masked inside"),
                                       (SKIP, "skipped: all masked"))):
        lx = 0.6 + (0, 4.0, 8.2)[k]
        ax.add_patch(Rectangle((lx, ly), 0.45, 0.45, facecolor=fill, edgecolor=EDGE if k < 2 else "#bbbbbb",
                               linewidth=0.8, linestyle="--" if k == 2 else "-"))
        text(ax, lx + 0.6, ly + 0.22, label, size=8, ha="left")

    # middle: the state of one query tile, updated by each key tile
    mx = 10.2
    text(ax, mx + 2.6, 10.1, "one step: query tile 4, key tile 1", size=10, weight="bold")
    box(ax, mx, 7.7, 5.2, 1.1, "$S = Q_4 K_1^T / \\sqrt{d}$\n($b_q \\times b_k$ scores, then discarded)", "attn", fontsize=8)
    arrow(ax, (x0 + 1.5 * size + 0.3, y0 + 1.5 * size), (mx, 8.25), color=HOT, rad=-0.25)
    arrow(ax, (mx + 2.6, 7.7), (mx + 2.6, 7.15))
    box(ax, mx, 3.5, 5.2, 3.65,
        "state of the $b_q$ rows\n(kept across key tiles)\n\n"
        "$m' = \\max(m, \\mathrm{rowmax}\\, S)$\n"
        "$\\alpha = e^{m - m'}$\n"
        "$\\ell' = \\alpha\\, \\ell + \\mathrm{rowsum}\\, e^{S - m'}$\n"
        "$A' = \\alpha\\, A + e^{S - m'}\\, V_1$", "cache", fontsize=8)
    arrow(ax, (mx + 2.6, 3.5), (mx + 2.6, 2.9))
    box(ax, mx, 1.7, 5.2, 1.2, "after the last key tile:\n$O_4 = A / \\ell$,   $\\mathrm{lse}_4 = m + \\log \\ell$", "out",
        fontsize=8)

    # right: sliding window, the tiles outside the band are skipped too
    rx = 17.6
    text(ax, rx + n * size / 2, 10.1, "sliding window: 11 of 36 tiles", size=10, weight="bold")

    def band(i, j):
        if j > i or j < i - 1:
            return "skip"
        return "diag" if j == i else "lower"

    _tiles(ax, rx, y0, n, size, band)
    text(ax, rx + w / 2, y0 - 0.35, "keys j →", size=8, color=MUTED)
    text(ax, rx - 0.35, y0 + w / 2, "queries i →", size=8, color=MUTED, rotation=90)
    text(ax, rx + w / 2, y0 + w + 0.75, "window = tile size: query i sees\nkeys $i - b < j \\leq i$", size=8, color=INK)
    return fig


FIGURES = {"flash_tiling": flash_tiling}
