"""Chapter 17: RoPE's two storage layouts of one head (d = 8), interleaved and rotate-half, and the
permutation P that maps one to the other."""

from matplotlib.patches import FancyArrowPatch

from kit import COLORS, INK, MUTED, box, canvas, line, text

D = 8
PAIR_KINDS = ("embed", "attn", "mlp", "norm")  # one colour per rotated pair i (frequency theta_i)
P = [*range(0, D, 2), *range(1, D, 2)]  # slot s of the rotate-half layout holds feature P[s]
X0, STEP, W, H = 6.2, 1.35, 1.0, 0.7  # first slot's left edge, slot spacing, box size


def _slot_x(s):
    return X0 + s * STEP + W / 2


def _arc(ax, s0, s1, y, rad, color):
    ax.add_patch(FancyArrowPatch((_slot_x(s0), y), (_slot_x(s1), y), arrowstyle="-", color=color, lw=1.6,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=0, shrinkB=0))


def rope_layouts():
    fig, ax = canvas(17.5, 7.9)
    text(ax, 8.75, 7.55, "One head, d = 8: the same four rotations, stored in two orders", size=10, weight="bold")
    top, bottom = 5.7, 2.0
    # interleaved: slot s holds x_s, pairs (2i, 2i + 1)
    for s in range(D):
        kind = PAIR_KINDS[s // 2]
        box(ax, X0 + s * STEP, top, W, H, f"$x_{s}$", kind, fontsize=10)
    for i in range(D // 2):
        color = COLORS[PAIR_KINDS[i]][1]
        _arc(ax, 2 * i, 2 * i + 1, top + H, -0.6, color)
        text(ax, (_slot_x(2 * i) + _slot_x(2 * i + 1)) / 2, top + H + 0.75, f"$\\theta_{i}$", size=10, color=color)
    # rotate-half: slot s holds x_P[s], pairs (i, i + d/2)
    for s, f in enumerate(P):
        box(ax, X0 + s * STEP, bottom, W, H, f"$x_{f}$", PAIR_KINDS[f // 2], fontsize=10)
    for i in range(D // 2):
        color = COLORS[PAIR_KINDS[i]][1]
        _arc(ax, i, i + D // 2, bottom, 0.28, color)
        text(ax, (_slot_x(i) + _slot_x(i + D // 2)) / 2, bottom - 1.25, f"$\\theta_{i}$", size=10, color=color)
    # the permutation: feature f moves from slot f (top) to slot P^-1(f) (bottom)
    for s, f in enumerate(P):
        line(ax, [(_slot_x(f), top), (_slot_x(s), bottom + H)], color=COLORS[PAIR_KINDS[f // 2]][1], lw=1.0)
    # row labels and the rule
    text(ax, 0.3, top + 0.55, "interleaved: pairs (2i, 2i + 1)", size=9, weight="bold", ha="left")
    text(ax, 0.3, top - 0.25, "Chapter 3's apply_rope, the RoPE\npaper, Meta's original weights",
         size=8, color=MUTED, ha="left")
    text(ax, 0.3, bottom + 0.55, "rotate-half: pairs (i, i + d/2)", size=9, weight="bold", ha="left")
    text(ax, 0.3, bottom - 0.25, "apply_rope_half, Hugging\nFace's Llama format", size=8, color=MUTED, ha="left")
    text(ax, 0.3, (top + bottom + H) / 2, "P = (0, 2, 4, 6, 1, 3, 5, 7):\npermute each head's rows\n"
         "of $W_q$ and $W_k$ by P: slot s of\nthe lower row holds $x_{P(s)}$", size=8.5, color=INK, ha="left")
    return fig


FIGURES = {"rope_layouts": rope_layouts}
