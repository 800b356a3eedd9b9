"""The book's drawing kit: one style for every diagram.

Diagrams are drawn with matplotlib in a coordinate system of "units" (1 unit = 0.5 inch at the
default scale), saved as SVG for the website and PNG for the notebooks (Colab shows neither a
relative image path nor an SVG served from the repository; the exporter embeds the PNG in the
paired .ipynb). Every figure has an opaque white background, so it reads in the light and the
dark theme alike.

A figure module (``chNN_*.py`` beside this file) defines ``FIGURES = {name: draw}``, where
``draw()`` returns a matplotlib figure; ``python tools/figures/build.py`` writes
``book/figures/<name>.svg`` and ``.png``.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

UNIT = 0.5  # inches per unit
FONT = 9

# One colour per kind of component, the same in every chapter (pale fill, darker edge).
COLORS = {
    "data": ("#eef1f5", "#5b6b7f"),       # tokens, ids, text
    "embed": ("#dbe9f8", "#2f6db5"),      # embeddings, positions
    "attn": ("#fde5cc", "#c8630a"),       # attention, queries/keys/values
    "mlp": ("#dcf0dc", "#2e7d32"),        # feed-forward
    "norm": ("#ece3f5", "#6a3d9a"),       # normalisation
    "out": ("#f9dcdc", "#b23a3a"),        # logits, loss, output layer
    "cache": ("#fff4bf", "#a07c00"),      # caches, memory
    "plain": ("#ffffff", "#333333"),
}
INK = "#222222"
MUTED = "#777777"


def canvas(width: float, height: float):
    """A figure of ``width`` x ``height`` units with no axes; (0, 0) is the bottom left."""
    plt.rcParams.update({"svg.hashsalt": "transformers-from-scratch", "font.size": FONT,
                         "font.family": "DejaVu Sans", "mathtext.fontset": "dejavusans"})
    fig = plt.figure(figsize=(width * UNIT, height * UNIT), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def box(ax, x, y, w, h, label="", kind="plain", *, fontsize=FONT, weight="normal", dashed=False,
        round_=0.15, color=None, text_color=INK):
    """A rounded box with its bottom-left corner at (x, y) and ``label`` centred in it."""
    fill, edge = COLORS[kind]
    if color is not None:
        fill = color
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={round_}",
                                facecolor=fill, edgecolor=edge, linewidth=1.2,
                                linestyle="--" if dashed else "-"))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize,
                color=text_color, weight=weight)
    return (x, y, w, h)


def arrow(ax, start, end, *, color=INK, style="-|>", lw=1.2, rad=0.0, dashed=False):
    """An arrow from ``start`` to ``end`` ((x, y) pairs); ``rad`` bends it."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color, lw=lw,
                                 connectionstyle=f"arc3,rad={rad}", linestyle="--" if dashed else "-",
                                 shrinkA=0, shrinkB=0))


def line(ax, points, *, color=INK, lw=1.2, dashed=False):
    """A polyline through ``points``."""
    xs, ys = zip(*points)
    ax.plot(xs, ys, color=color, lw=lw, linestyle="--" if dashed else "-", solid_capstyle="round")


def plus(ax, x, y, r=0.2):
    """The circled plus of a residual addition, centred at (x, y)."""
    ax.add_patch(Circle((x, y), r, facecolor="white", edgecolor=INK, lw=1.2))
    ax.text(x, y, "+", ha="center", va="center", fontsize=FONT + 2, color=INK)


def text(ax, x, y, s, *, size=FONT, color=INK, ha="center", va="center", **kw):
    """Text at (x, y); mathtext (``$...$``) allowed."""
    ax.text(x, y, s, ha=ha, va=va, fontsize=size, color=color, **kw)


def grid(ax, x, y, rows, cols, *, cell=0.35, kind="plain", fills=None, label=None, label_pos="top",
         values=None, fontsize=FONT - 2):
    """A matrix of ``rows`` x ``cols`` squares with its bottom-left corner at (x, y).

    ``fills`` is an optional function ``(i, j) -> colour or None`` (row i counted from the top);
    ``values`` an optional function ``(i, j) -> str`` written in each cell.
    Returns ``(x, y, width, height)``.
    """
    fill, edge = COLORS[kind]
    for i in range(rows):
        for j in range(cols):
            c = fills(i, j) if fills else None
            ax.add_patch(Rectangle((x + j * cell, y + (rows - 1 - i) * cell), cell, cell,
                                   facecolor=c or fill, edgecolor=edge, linewidth=0.8))
            if values is not None:
                v = values(i, j)
                if v:
                    ax.text(x + (j + 0.5) * cell, y + (rows - 1 - i + 0.5) * cell, v, ha="center",
                            va="center", fontsize=fontsize, color=INK)
    w, h = cols * cell, rows * cell
    if label:
        if label_pos == "top":
            ax.text(x + w / 2, y + h + 0.22, label, ha="center", va="bottom", fontsize=FONT)
        elif label_pos == "bottom":
            ax.text(x + w / 2, y - 0.22, label, ha="center", va="top", fontsize=FONT)
        elif label_pos == "left":
            ax.text(x - 0.2, y + h / 2, label, ha="right", va="center", fontsize=FONT)
    return (x, y, w, h)


def brace_label(ax, x0, x1, y, s, *, below=True, size=FONT - 1):
    """A thin bracket from x0 to x1 at height y with a label, to mark a dimension."""
    d = -0.12 if below else 0.12
    line(ax, [(x0, y), (x0, y + d), (x1, y + d), (x1, y)], color=MUTED, lw=0.8)
    text(ax, (x0 + x1) / 2, y + 2.5 * d, s, size=size, color=MUTED, va="top" if below else "bottom")


def title(ax, x, y, s, *, size=FONT + 1):
    text(ax, x, y, s, size=size, weight="bold")
