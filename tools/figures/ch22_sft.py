"""Chapter 22: a conversation in the chat template, its inputs and targets, the loss on the
assistant's tokens only; and a batch padded against the same examples packed."""

from matplotlib.patches import Rectangle

from kit import COLORS, INK, MUTED, arrow, canvas, text

USER = ["<u>", "w", "h", "a", "t", " ", "i", "s", " ", "7", "+", "5", "?", "<e>"]
ASSISTANT = ["<a>", "1", "2", "<e>"]


def _cells(ax, x, y, labels, kinds, *, cell=0.62, size=7.5):
    for i, (label, kind) in enumerate(zip(labels, kinds)):
        fill, edge = COLORS[kind] if kind else ("white", MUTED)
        ax.add_patch(Rectangle((x + i * cell, y), cell, cell, facecolor=fill, edgecolor=edge, linewidth=0.9))
        text(ax, x + (i + 0.5) * cell, y + cell / 2, label, size=size, color=INK if kind else MUTED)


def sft_masking():
    fig, ax = canvas(17.5, 8.4)
    cell, x0 = 0.62, 2.6
    tokens = USER + ASSISTANT
    n = len(tokens)
    kinds = ["data"] * len(USER) + ["attn"] * len(ASSISTANT)
    text(ax, 8.75, 7.95, "Supervised fine-tuning: the loss is on the assistant's tokens only", size=10, weight="bold")
    # the conversation
    text(ax, x0 - 0.2, 6.9, "conversation", size=8.5, ha="right")
    _cells(ax, x0, 6.6, tokens, kinds, cell=cell)
    text(ax, x0 + len(USER) * cell / 2, 6.15, "user turn (prompt)", size=8, color=MUTED)
    text(ax, x0 + (len(USER) + len(ASSISTANT) / 2) * cell, 6.15, "assistant turn", size=8, color=COLORS["attn"][1])
    # inputs and targets
    text(ax, x0 - 0.2, 4.9, "inputs  x", size=8.5, ha="right")
    _cells(ax, x0, 4.6, tokens[:-1], kinds[:-1], cell=cell)
    text(ax, x0 - 0.2, 3.7, "targets  y", size=8.5, ha="right")
    targets = ["-1"] * len(USER) + ASSISTANT[1:]
    tkinds = [None] * len(USER) + ["out"] * (len(ASSISTANT) - 1)
    _cells(ax, x0, 3.4, targets, tkinds, cell=cell)
    for i in range(n - 1):
        arrow(ax, (x0 + (i + 0.5) * cell, 4.6), (x0 + (i + 0.5) * cell, 4.05), color=MUTED, lw=0.7)
    text(ax, x0 + (n - 1) * cell + 0.25, 3.7, "y[t] = x[t+1] where that is\nthe answer or its <e>, else -1:\n"
         "no loss on the prompt,\nwhich ends with the cue <a>", size=7.5, ha="left", color=INK)
    # padding versus packing
    y_pad, short = 1.1, 0.42
    lengths = [15, 9, 12, 7]
    longest = max(lengths)
    text(ax, 1.2, y_pad + 1.45, "padded batch", size=8.5, weight="bold")
    for r, length in enumerate(lengths):
        for j in range(longest):
            kind = "data" if j < length else None
            fill, edge = COLORS[kind] if kind else ("white", MUTED)
            ax.add_patch(Rectangle((0.4 + j * short, y_pad + 0.9 - r * 0.34), short, 0.3, facecolor=fill,
                                   edgecolor=edge, linewidth=0.6))
    pad = sum(longest - n_ for n_ in lengths) / (len(lengths) * longest)
    text(ax, 0.4 + longest * short / 2, y_pad - 0.55, f"{pad:.0%} of the positions are padding", size=8, color=MUTED)
    text(ax, 9.9, y_pad + 1.45, "packed rows", size=8.5, weight="bold")
    row_len = 24
    rows, current = [[]], 0
    for e, length in enumerate(lengths):
        if current + length > row_len:
            rows.append([])
            current = 0
        rows[-1].append((e, length))
        current += length
    shades = ["data", "embed", "mlp", "norm"]
    for r, row in enumerate(rows):
        j = 0
        for e, length in row:
            for _ in range(length):
                fill, edge = COLORS[shades[e]]
                ax.add_patch(Rectangle((9.0 + j * short * 0.8, y_pad + 0.9 - r * 0.34), short * 0.8, 0.3,
                                       facecolor=fill, edgecolor=edge, linewidth=0.6))
                j += 1
        for k in range(j, row_len):
            ax.add_patch(Rectangle((9.0 + k * short * 0.8, y_pad + 0.9 - r * 0.34), short * 0.8, 0.3,
                                   facecolor="white", edgecolor=MUTED, linewidth=0.6))
    text(ax, 9.0 + row_len * short * 0.4, y_pad - 0.55, "examples end to end: little padding, but an example\n"
         "attends to the ones before it in its row", size=8, color=MUTED)
    return fig


FIGURES = {"sft_masking": sft_masking}
