"""Chapter 19: where the memory traffic of attention goes. Left, standard attention writes the scores S
and the weights P to HBM and reads them back; right, the tiled loop keeps them on chip and only streams
Q, K and V in and O and the log-sum-exp out. The arrows carry the element counts of the chapter's own
``hbm_traffic`` (taken from the chapter's source), and the script asserts that they add up to its totals."""

import ast
import math
from pathlib import Path

from kit import COLORS, INK, MUTED, arrow, box, canvas, text

CHAPTER = Path(__file__).resolve().parents[2] / "book" / "19_flash_attention.md"
N, D, M = 4096, 64, 2**16           # the row of the chapter's table that the figure draws
READ, WRITE = INK, COLORS["out"][1]


def hbm_traffic(N, d, M):
    """The chapter's ``hbm_traffic``, compiled from its code cell, so the figure cannot drift from it."""
    tree = ast.parse(next(block.split("\n```")[0] for block in CHAPTER.read_text(encoding="utf-8").split(
        "```{code-cell} ipython3\n") if "def hbm_traffic(" in block))
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "hbm_traffic")
    scope = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(CHAPTER), "exec"), scope)
    return scope["hbm_traffic"](N, d, M)


def counts():
    """The elements each arrow moves, per array, checked against ``hbm_traffic(N, D, M)``."""
    standard_total, tiled_total, b_q = hbm_traffic(N, D, M)
    passes = math.ceil(N / b_q)                                  # query tiles: each reads all of K and V
    standard = {"Q": N * D, "K": N * D, "S w": N * N, "S r": N * N, "P w": N * N, "P r": N * N,
                "V": N * D, "O": N * D}
    tiled = {"Q": N * D, "K": passes * N * D, "V": passes * N * D, "O": N * D, "lse": N}
    assert sum(standard.values()) == standard_total, (sum(standard.values()), standard_total)
    assert sum(tiled.values()) == tiled_total, (sum(tiled.values()), tiled_total)
    return standard, tiled, passes, b_q


def _m(n):
    """Elements in millions, as the chapter's table prints them."""
    return f"{n / 1e6:.3f}M" if n < 1e4 else f"{n / 1e6:.2f}M" if n < 1e6 else f"{n / 1e6:.1f}M"


def _array(ax, x, w, label, kind="attn", dashed=False, color=None):
    box(ax, x, 1.55, w, 1.25, label, kind, fontsize=8, dashed=dashed, color=color)
    return x + w / 2


def _flow(ax, start, end, label, color, *, dx=0.0, ha="left"):
    arrow(ax, start, end, color=color)
    mx, my = (start[0] + end[0]) / 2 + dx, (start[1] + end[1]) / 2
    text(ax, mx, my, label, size=7.5, color=color, ha=ha, weight="bold")


def flash_io():
    standard, tiled, passes, b_q = counts()
    fig, ax = canvas(24, 11)

    # left: standard attention, three kernels, S and P through HBM
    text(ax, 6.0, 10.55, "standard attention: S and P go through HBM", size=10, weight="bold")
    box(ax, 0.4, 6.4, 11.2, 2.9, "", "plain")
    text(ax, 0.6, 9.0, "on chip: compute and SRAM", size=8, color=MUTED, ha="left")
    steps = [box(ax, x, 6.8, 2.9, 1.4, s, "attn", fontsize=8) for x, s in
             ((0.8, "$S = Q K^T / \\sqrt{d}$"), (4.55, "$P = \\mathrm{softmax}(S)$"), (8.3, "$O = P V$"))]
    box(ax, 0.4, 0.9, 11.2, 2.5, "", "cache")
    text(ax, 0.6, 1.2, "HBM (main memory)", size=8, color=MUTED, ha="left")
    q, k = _array(ax, 0.8, 0.8, "$Q$"), _array(ax, 1.85, 0.8, "$K$")
    s = _array(ax, 3.4, 1.6, "$S$\n$N \\times N$", "out")
    p = _array(ax, 7.1, 1.6, "$P$\n$N \\times N$", "out")
    v, o = _array(ax, 9.35, 0.8, "$V$"), _array(ax, 10.4, 0.8, "$O$")
    top, low = 2.8, 6.8
    c1, c2, c3 = (x + w / 2 for x, _, w, _ in steps)
    _flow(ax, (q, top), (c1 - 0.9, low), _m(standard["Q"]), READ, dx=-0.15, ha="right")
    _flow(ax, (k, top), (c1 - 0.1, low), _m(standard["K"]), READ, dx=0.1)
    _flow(ax, (c1 + 0.8, low), (s - 0.35, top), _m(standard["S w"]), WRITE, dx=0.05)
    _flow(ax, (s + 0.35, top), (c2 - 0.6, low), _m(standard["S r"]), READ, dx=0.05)
    _flow(ax, (c2 + 0.6, low), (p - 0.35, top), _m(standard["P w"]), WRITE, dx=0.05)
    _flow(ax, (p + 0.35, top), (c3 - 0.9, low), _m(standard["P r"]), READ, dx=0.05)
    _flow(ax, (v, top), (c3 + 0.1, low), _m(standard["V"]), READ, dx=0.08)
    _flow(ax, (c3 + 0.9, low), (o, top), _m(standard["O"]), WRITE, dx=0.15)
    text(ax, 6.0, 0.4, f"moved: {_m(sum(standard.values()))} elements, $4Nd + 4N^2$", size=9, weight="bold")

    # right: the tiled loop, one kernel, S and P stay on chip
    x0 = 12.4
    text(ax, x0 + 5.6, 10.55, "tiled: S and P never leave the chip", size=10, weight="bold")
    box(ax, x0, 6.4, 11.2, 2.9, "", "plain")
    text(ax, x0 + 0.2, 9.0, "on chip: compute and SRAM", size=8, color=MUTED, ha="left")
    tiles = [("$Q_i$", "attn"), ("$K_j$", "attn"), ("$V_j$", "attn"), ("$S, P$\ntile", "out"), ("$m, \\ell, A$", "cache")]
    centres = []
    for n, (label, kind) in enumerate(tiles):
        x = x0 + 0.5 + n * 2.15
        box(ax, x, 6.8, 1.75 if n < 3 else 1.95, 1.4, label, kind, fontsize=8)
        centres.append(x + 0.875)
    text(ax, x0 + 5.6, 8.55, f"for each of {passes} query tiles of $b_q$ = {b_q} rows: every key tile $j$",
         size=8, color=INK)
    box(ax, x0, 0.9, 11.2, 2.5, "", "cache")
    text(ax, x0 + 0.2, 1.2, "HBM (main memory)", size=8, color=MUTED, ha="left")
    hq, hk, hv = _array(ax, x0 + 0.5, 0.8, "$Q$"), _array(ax, x0 + 2.65, 0.8, "$K$"), _array(ax, x0 + 4.8, 0.8, "$V$")
    _array(ax, x0 + 6.2, 1.9, "no $S$, no $P$", "plain", dashed=True, color="#f2f2f2")
    ho, hl = _array(ax, x0 + 8.6, 0.8, "$O$"), _array(ax, x0 + 9.8, 0.9, "lse")
    top, low = 2.8, 6.8
    _flow(ax, (hq, top), (centres[0], low), f"{_m(tiled['Q'])}\nonce", READ, dx=0.1)
    _flow(ax, (hk, top), (centres[1], low), f"{_m(tiled['K'])}\n{passes} times", READ, dx=0.1)
    _flow(ax, (hv, top), (centres[2], low), f"{_m(tiled['V'])}\n{passes} times", READ, dx=0.1)
    _flow(ax, (centres[4] - 0.3, low), (ho, top), _m(tiled["O"]), WRITE, dx=-0.1, ha="right")
    _flow(ax, (centres[4] + 0.4, low), (hl, top), _m(tiled["lse"]), WRITE, dx=0.1)
    text(ax, x0 + 5.6, 0.4, f"moved: {_m(sum(tiled.values()))} elements, $2Nd + N + \\lceil N / b_q \\rceil\\, 2Nd$",
         size=9, weight="bold")
    text(ax, 9.9, 9.85, f"one head, N = {N} positions, d = {D}, an SRAM of $M = 2^{{16}}$ elements;", size=8, color=MUTED,
         ha="right")
    text(ax, 10.0, 9.85, "elements read from HBM", size=8, color=READ, ha="left", weight="bold")
    text(ax, 13.35, 9.85, "and written to it", size=8, color=WRITE, ha="left", weight="bold")
    return fig


FIGURES = {"flash_io": flash_io}
