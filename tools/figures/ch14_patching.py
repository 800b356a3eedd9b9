"""Chapter 14: activation patching, three runs of one model (clean, patched, corrupted)."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, text, title

CLEAN = "o r r o w".split()  # "... morrow": the last characters of a window
BAD = 3  # the second-to-last character is the one changed
PATCHED_HEAD = 1  # the head whose output is copied (drawn as head 2 of layer 1)
COL_W, GAP = 5.6, 1.1
COPY = COLORS["cache"][1]


def _run(ax, x0, name, note, chars, *, patched=False):
    """One forward pass drawn bottom-up in a column of width COL_W from x0; returns the patched head's centre x."""
    cx = x0 + COL_W / 2
    title(ax, cx, 9.25, name)
    text(ax, cx, 8.65, note, size=7.5, color=COPY if patched else MUTED, va="top", linespacing=1.5)
    # the input characters, the changed one in the output colour
    cw = 0.8
    left = cx - (len(chars) + 1) * cw / 2
    box(ax, left, 0.55, cw - 0.1, 0.6, "…", "data", fontsize=9)
    for i, c in enumerate(chars):
        changed = c != CLEAN[i]
        box(ax, left + (i + 1) * cw, 0.55, cw - 0.1, 0.6, c, "out" if changed else "data", fontsize=9,
            weight="bold" if changed else "normal")
    arrow(ax, (cx, 1.2), (cx, 1.6))
    box(ax, x0 + 0.3, 1.6, COL_W - 0.6, 0.6, "wte + wpe", "embed", fontsize=8.5)
    arrow(ax, (cx, 2.2), (cx, 2.6))
    # layer 1's attention: four heads side by side into out_proj
    box(ax, x0 + 0.15, 2.6, COL_W - 0.3, 2.6, "", "plain", dashed=True, round_=0.1)
    hw = (COL_W - 0.9) / 4
    for h in range(4):
        hx = x0 + 0.45 + h * hw
        if patched and h == PATCHED_HEAD:
            box(ax, hx, 3.5, hw - 0.15, 0.9, f"head {h + 1}\nclean", "cache", fontsize=7.5, weight="bold")
        else:
            box(ax, hx, 3.5, hw - 0.15, 0.9, f"head {h + 1}", "attn", fontsize=7.5)
        arrow(ax, (hx + (hw - 0.15) / 2, 3.5), (hx + (hw - 0.15) / 2, 3.3), lw=0.9)
    box(ax, x0 + 0.45, 2.75, COL_W - 1.05, 0.55, "out_proj of layer 1's attention", "attn", fontsize=7.5)
    arrow(ax, (cx, 5.2), (cx, 5.6))
    box(ax, x0 + 0.3, 5.6, COL_W - 0.6, 1.0, "MLP 1, layers 2–4,\nln_f, lm_head", "mlp", fontsize=8.5)
    arrow(ax, (cx, 6.6), (cx, 7.0))
    box(ax, x0 + 0.3, 7.0, COL_W - 0.6, 0.8, "", "out")
    key = name.split()[0]
    text(ax, cx, 7.4, f"$s_{{\\mathrm{{{key}}}}}$ = log p(true next char)", size=8.5)
    return x0 + 0.45 + PATCHED_HEAD * hw + (hw - 0.15) / 2


def activation_patching():
    w = 3 * COL_W + 2 * GAP + 0.4
    fig, ax = canvas(w, 12.0)
    ax.set_ylim(-2.3, 9.7)
    corrupted = CLEAN.copy()
    corrupted[BAD] = "k"
    x_clean = _run(ax, 0.2, "clean run", "the window as it is", CLEAN)
    x_patch = _run(ax, 0.2 + COL_W + GAP, "patched run", "the corrupted input; head 2's output, its d columns\n"
                   "of out_proj's input, copied from the clean run",
                   corrupted, patched=True)
    _run(ax, 0.2 + 2 * (COL_W + GAP), "corrupted run", "its second-to-last character changed", corrupted)
    # the copy: head 2's d columns of out_proj's input, at every position, from the clean run
    y = 4.85
    line(ax, [(x_clean, 4.4), (x_clean, y), (x_patch, y)], color=COPY, lw=1.5, dashed=True)
    arrow(ax, (x_patch, y), (x_patch, 4.42), color=COPY, lw=1.5)
    text(ax, 0.2 + COL_W + GAP / 2, y + 0.12, "copy", size=7.5, color=COPY, va="bottom")
    # the measure
    line(ax, [(0.4, -0.15), (w - 0.4, -0.15)], color=MUTED, lw=0.6)
    text(ax, w / 2, -0.95, r"restored $= \dfrac{s_{\mathrm{patched}} - s_{\mathrm{corrupted}}}"
         r"{s_{\mathrm{clean}} - s_{\mathrm{corrupted}}}$", size=11, color=INK)
    text(ax, w / 2, -1.8, "1: the head alone carries what the corruption took away;   0: it carries none of it",
         size=7.5, color=MUTED)
    return fig


FIGURES = {"activation_patching": activation_patching}
