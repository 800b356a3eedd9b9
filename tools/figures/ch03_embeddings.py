"""Chapter 3: the embedding lookup, positions added to tokens, sinusoidal pairs as clocks, a RoPE rotation."""

import math

import numpy as np
from kit import COLORS, INK, MUTED, arrow, box, brace_label, canvas, grid, line, plus, text, title
from matplotlib import colormaps
from matplotlib.patches import Arc, Circle

EMBED_EDGE = COLORS["embed"][1]
ATTN_EDGE = COLORS["attn"][1]
# Three shades of the embedding blue, one per distinct token of the example.
ROW_SHADES = {2: "#7fb0e6", 5: "#b9d5f3", 0: "#4f8fd6"}


def embedding_lookup():
    """A one-hot matrix times the table selects rows: U (T, V) @ W (V, C) = W[ids] (T, C)."""
    fig, ax = canvas(16.0, 6.6)
    ids = [2, 5, 0, 5]
    T, V, C, cell = len(ids), 8, 4, 0.45
    y0 = 1.3
    # ids, a column of integers
    grid(ax, 0.4, y0 + (V - T) * cell / 2, T, 1, cell=cell, kind="data", values=lambda i, j: str(ids[i]),
         fontsize=8)
    text(ax, 0.4 + cell / 2, y0 + (V - T) * cell / 2 + T * cell + 0.35, "ids\n(T,)", size=8, va="bottom")
    arrow(ax, (1.05, y0 + V * cell / 2), (1.75, y0 + V * cell / 2))
    text(ax, 1.4, y0 + V * cell / 2 + 0.3, "one-hot", size=7.5, color=MUTED)
    # U: one-hot rows
    ux, uy = 1.95, y0 + (V - T) * cell / 2
    grid(ax, ux, uy, T, V, cell=cell, kind="data",
         fills=lambda i, j: ROW_SHADES[ids[i]] if j == ids[i] else None,
         values=lambda i, j: "1" if j == ids[i] else "0", fontsize=7.5)
    text(ax, ux + V * cell / 2, uy + T * cell + 0.3, "U  (T, V)", va="bottom")
    brace_label(ax, ux, ux + V * cell, uy - 0.1, "V columns, one per token")
    text(ax, ux + V * cell + 0.45, y0 + V * cell / 2, "@", size=14)
    # W: the table, selected rows shaded
    wx = ux + V * cell + 0.9
    grid(ax, wx, y0, V, C, cell=cell, kind="embed", fills=lambda i, j: ROW_SHADES.get(i))
    for v in range(V):
        text(ax, wx - 0.15, y0 + (V - 1 - v + 0.5) * cell, f"{v}", size=7, color=MUTED, ha="right")
    text(ax, wx + C * cell / 2, y0 + V * cell + 0.3, "W  (V, C)", va="bottom")
    brace_label(ax, wx, wx + C * cell, y0 - 0.1, "C numbers per token")
    text(ax, wx + C * cell + 0.5, y0 + V * cell / 2, "=", size=14)
    # E: the selected rows
    ex = wx + C * cell + 1.0
    ey = uy
    grid(ax, ex, ey, T, C, cell=cell, kind="embed", fills=lambda i, j: ROW_SHADES[ids[i]])
    for t, v in enumerate(ids):
        text(ax, ex + C * cell + 0.15, ey + (T - 1 - t + 0.5) * cell, f"row {v} of W", size=7.5, ha="left",
             color=MUTED)
    text(ax, ex + C * cell / 2, ey + T * cell + 0.3, "E = UW = W[ids]  (T, C)", va="bottom")
    # the cost, to the right
    nx = ex + C * cell + 1.6
    text(ax, nx, y0 + V * cell - 0.1, "product U @ W:\nT·V·C multiply-adds", ha="left", va="top", size=8.5)
    text(ax, nx, y0 + V * cell - 1.2, "lookup W[ids]:\nT·C copies", ha="left", va="top", size=8.5)
    text(ax, nx, y0 + V * cell - 2.3, "the same numbers,\nexactly: row t of U\nhas one 1, in\ncolumn ids[t]",
         ha="left", va="top", size=8, color=MUTED)
    title(ax, 8.0, 6.2, "An embedding lookup is a one-hot matrix times the table")
    return fig


def _pe(T, d, base=10000.0):
    omega = base ** (-np.arange(0, d, 2) / d)
    angles = np.arange(T)[:, None] * omega[None, :]
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(T, d)


def positions_added():
    """Token vectors (T, C) plus position vectors (T, C) -> the input x (T, C), broadcast over B."""
    fig, ax = canvas(14.6, 5.0)
    T, C, cell = 6, 10, 0.34
    chars = "to be?"
    cmap = colormaps["viridis"]
    rng = np.random.default_rng(3)
    tok = rng.standard_normal((T, C))
    pe = _pe(T, C, base=100.0)
    gy = 1.25

    def shade(v, lo=-2.5, hi=2.5):
        return cmap(0.1 + 0.8 * (min(max(v, lo), hi) - lo) / (hi - lo))

    grid(ax, 0.45, gy, T, 1, cell=cell, kind="data", values=lambda i, j: {" ": "␣"}.get(chars[i], chars[i]),
         fontsize=8)
    text(ax, 0.45 + cell / 2, gy + T * cell + 0.3, "ids", size=8, va="bottom")
    arrow(ax, (0.9, gy + T * cell / 2), (1.35, gy + T * cell / 2))
    tx = 1.45
    grid(ax, tx, gy, T, C, cell=cell, kind="embed", fills=lambda i, j: shade(tok[i, j]))
    text(ax, tx + C * cell / 2, gy + T * cell + 0.3, "token vectors  wte[ids]\n(T, C): one row per token",
         va="bottom", size=8.5)
    brace_label(ax, tx, tx + C * cell, gy - 0.1, "C dimensions")
    px = tx + C * cell + 1.25
    plus(ax, px - 0.62, gy + T * cell / 2)
    grid(ax, px, gy, T, C, cell=cell, kind="embed", fills=lambda i, j: shade(2.5 * pe[i, j]))
    for t in range(T):
        text(ax, px - 0.1, gy + (T - 1 - t + 0.5) * cell, f"{t}", size=7, color=MUTED, ha="right")
    text(ax, px + C * cell / 2, gy + T * cell + 0.3, "position vectors  PE[:T]\n(T, C): one row per position",
         va="bottom", size=8.5)
    brace_label(ax, px, px + 4 * cell, gy - 0.1, "fast pairs", size=7.5)
    brace_label(ax, px + (C - 4) * cell, px + C * cell, gy - 0.1, "slow pairs", size=7.5)
    sx = px + C * cell + 1.1
    text(ax, sx - 0.55, gy + T * cell / 2, "=", size=14)
    grid(ax, sx, gy, T, C, cell=cell, kind="embed", fills=lambda i, j: shade(tok[i, j] + 2.5 * pe[i, j] / 2))
    text(ax, sx + C * cell / 2, gy + T * cell + 0.3, "x: the input of the first block\n(T, C)", va="bottom",
         size=8.5)
    text(ax, 7.3, 0.3, "in a batch: (B, T, C) token vectors + (T, C) position vectors; broadcasting adds the same "
         "positions to every sequence", size=8, color=MUTED)
    title(ax, 7.3, 4.6, "Positions are added to the token vectors: the width stays C")
    return fig


def sinusoidal_clocks():
    """Pair i of PE_p is a point on the unit circle at angle p * omega_i: fast pairs, slow pairs."""
    d, base = 16, 10000.0
    pairs = [0, 1, 2, 7]
    positions = range(0, 7)
    fig, ax = canvas(16.0, 6.7)
    r = 1.25
    cmap = colormaps["viridis"]
    for k, i in enumerate(pairs):
        cx, cy = 2.0 + k * 4.0, 3.3
        omega = base ** (-2 * i / d)
        ax.add_patch(Circle((cx, cy), r, facecolor="white", edgecolor=MUTED, lw=0.8))
        line(ax, [(cx - r - 0.2, cy), (cx + r + 0.2, cy)], color="#cccccc", lw=0.6)
        line(ax, [(cx, cy - r - 0.2), (cx, cy + r + 0.2)], color="#cccccc", lw=0.6)
        for p in positions:
            a = p * omega
            # pair i = (sin, cos): draw cos on the horizontal axis and sin on the vertical one
            px, py = cx + r * math.cos(a), cy + r * math.sin(a)
            colour = cmap(0.1 + 0.8 * p / (len(positions) - 1))
            ax.add_patch(Circle((px, py), 0.11, facecolor=colour, edgecolor=INK, lw=0.5, zorder=3))
            last = len(positions) - 1
            if i == 0 or (p == 0 and last * omega > 0.3) or (p == last and last * omega > 0.3):
                lx, ly = cx + (r + 0.38) * math.cos(a), cy + (r + 0.38) * math.sin(a)
                text(ax, lx, ly, f"{p}", size=7.5)
            elif p == last:
                text(ax, cx + r - 0.1, cy + 0.45, f"p = 0 … {last}", size=7.5, ha="right")
        lab = "pair 0 (dimensions 0, 1)" if i == 0 else f"pair {i} (dims {2 * i}, {2 * i + 1})"
        text(ax, cx, cy - r - 0.75, lab, size=8)
        text(ax, cx, cy - r - 1.2, f"ω = {omega:.3g} rad / position", size=7.5, color=MUTED)
        text(ax, cx, cy - r - 1.6, f"wavelength {2 * math.pi / omega:,.0f} positions", size=7.5, color=MUTED)
    text(ax, 0.3, 5.75, r"$(\mathrm{PE}_{p,2i+1}, \mathrm{PE}_{p,2i}) = (\cos p\omega_i, \sin p\omega_i)$"
         "  for positions p = 0 … 6, d = 16", ha="left", size=8.5)
    title(ax, 8.0, 6.3, "Each pair of a sinusoidal encoding is a clock hand turning at its own speed")
    return fig


def _vec(ax, origin, angle, length, color, label, *, lw=1.8, label_r=0.32, size=9):
    ox, oy = origin
    end = (ox + length * math.cos(angle), oy + length * math.sin(angle))
    arrow(ax, origin, end, color=color, lw=lw)
    lx = ox + (length + label_r) * math.cos(angle)
    ly = oy + (length + label_r) * math.sin(angle)
    text(ax, lx, ly, label, size=size, color=color)


def _plane(ax, cx, cy, r, xlabel, ylabel):
    arrow(ax, (cx - 0.3, cy), (cx + r, cy), color=MUTED, lw=0.8)
    arrow(ax, (cx, cy - 0.3), (cx, cy + r), color=MUTED, lw=0.8)
    text(ax, cx + r + 0.15, cy, xlabel, size=8, color=MUTED, ha="left")
    text(ax, cx - 0.1, cy + r, ylabel, size=8, color=MUTED, ha="right", va="top")


def rope_rotation():
    """RoPE: pair i of q at position m is rotated by m * theta_i; two rotated vectors keep their offset."""
    fig, ax = canvas(16.0, 8.4)
    q_col, k_col = ATTN_EDGE, EMBED_EDGE
    L = 2.7
    # left: one pair of a query rotated by m theta_i
    ox, oy = 1.3, 3.75
    _plane(ax, ox, oy, 3.6, r"$x_{2i}$", r"$x_{2i+1}$")
    a0, rot = math.radians(18), math.radians(52)
    _vec(ax, (ox, oy), a0, L, MUTED, r"$q^{(i)}$")
    _vec(ax, (ox, oy), a0 + rot, L, q_col, r"$R(m\theta_i)\,q^{(i)}$", label_r=0.45)
    ax.add_patch(Arc((ox, oy), 2.8, 2.8, theta1=math.degrees(a0), theta2=math.degrees(a0 + rot), color=q_col,
                     lw=1.2))
    mid = a0 + rot / 2
    text(ax, ox + 1.75 * math.cos(mid), oy + 1.75 * math.sin(mid), r"$m\theta_i$", size=10, color=q_col)
    text(ax, ox + 2.0, oy - 0.7, "pair i of a query at position m, turned by the angle\n"
         r"$m\theta_i$; its length is unchanged", size=8.5)
    # right: a query at m and a key at n; the angle between them is phi + (m - n) theta_i
    ox2, oy2 = 11.2, 3.75
    line(ax, [(ox2 - 3.3, oy2), (ox2 + 3.3, oy2)], color="#bbbbbb", lw=0.8)
    line(ax, [(ox2, oy2 - 0.2), (ox2, oy2 + 3.5)], color="#bbbbbb", lw=0.8)
    k0, q0 = math.radians(10), math.radians(38)
    k1, q1 = k0 + math.radians(45), q0 + math.radians(100)
    _vec(ax, (ox2, oy2), q0, 1.5, "#e8b27d", r"$q^{(i)}$", lw=1.0, size=8.5)
    _vec(ax, (ox2, oy2), k0, 1.5, "#8fb3dd", r"$k^{(i)}$", lw=1.0, size=8.5, label_r=0.35)
    _vec(ax, (ox2, oy2), q1, L, q_col, r"$R(m\theta_i)\,q^{(i)}$", label_r=0.5)
    _vec(ax, (ox2, oy2), k1, L, k_col, r"$R(n\theta_i)\,k^{(i)}$", label_r=0.75)
    ax.add_patch(Arc((ox2, oy2), 3.2, 3.2, theta1=math.degrees(k1), theta2=math.degrees(q1), color=INK, lw=1.0))
    mid = (k1 + q1) / 2
    text(ax, ox2 + 1.95 * math.cos(mid), oy2 + 1.95 * math.sin(mid) + 0.1, r"$\varphi + (m-n)\theta_i$", size=9)
    text(ax, ox2, oy2 - 0.45, r"a query at position m and a key at position n ($\varphi$: the angle from"
         "\n" r"$k^{(i)}$ to $q^{(i)}$); their score $|q^{(i)}|\,|k^{(i)}|\cos(\varphi + (m-n)\theta_i)$"
         "\ndepends on the positions only through m − n", size=8.5, va="top")
    # bottom strip: the d/2 pairs of one head, each with its own angle
    sy = 0.35
    for j in range(6):
        x = 0.8 + j * 2.2
        lab = "…" if j == 4 else (r"$(x_{d-2}, x_{d-1})$" if j == 5 else f"$(x_{{{2 * j}}}, x_{{{2 * j + 1}}})$")
        ang = "" if j == 4 else (r"$m\theta_{d/2-1}$" if j == 5 else f"$m\\theta_{{{j}}}$")
        box(ax, x, sy, 1.9, 0.55, lab, "attn", fontsize=8)
        text(ax, x + 0.95, sy + 0.78, ang, size=8.5, color=q_col)
    text(ax, 14.1, sy + 0.28, "one head:\nwidth d", size=8, ha="left", color=MUTED)
    text(ax, 0.8, sy + 1.3, r"a query or key x at position m: d/2 pairs, pair i turned by $m\theta_i$ with "
         r"$\theta_i = \mathrm{base}^{-2i/d}$, fast to slow", size=8.5, ha="left")
    title(ax, 8.0, 8.0, "RoPE rotates each pair of a query or key by an angle proportional to its position")
    return fig


FIGURES = {
    "embedding_lookup": embedding_lookup,
    "positions_added": positions_added,
    "sinusoidal_clocks": sinusoidal_clocks,
    "rope_rotation": rope_rotation,
}
