"""The book's first page: which chapter builds on which (drawn by ``python tools/figures/build.py chapter_map``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kit import COLORS, MUTED, arrow, box, canvas, text  # noqa: E402

#: What each chapter says it needs in its opening paragraph, mostly in a "You need ..." sentence
#: (Chapter 8: "Chapters 2 to 6"; Chapter 15 works on Chapter 10's model; Chapter 18 builds on
#: Chapter 5's feed-forward network and Chapter 17's `Llama`; Chapter 16's 1 is implied through 9).
NEEDS = {
    2: [1], 3: [1, 2], 4: [2], 5: [2, 4], 6: [3, 5], 7: [1, 6], 8: [2, 3, 4, 5, 6], 9: [1, 6],
    10: [1, 6, 9], 11: [3, 4, 5, 6, 9], 12: [6, 10], 13: [1, 7], 14: [4, 6, 10], 15: [6, 10],
    16: [1, 9, 10, 12], 17: [3, 5, 12, 13], 18: [5, 17], 19: [2, 8], 20: [9, 10],
    21: [6, 9, 10, 17, 20], 22: [9, 12], 23: [9, 17, 22], 24: [22], 25: [22],
}
NAMES = {
    1: "text to tensors", 2: "attention", 3: "embeddings", 4: "multi-head", 5: "the block",
    6: "the GPT", 7: "GPT-2", 8: "backprop", 9: "training toolkit", 10: "Shakespeare",
    11: "seq2seq", 12: "generation", 13: "BPE", 14: "looking inside", 15: "shipping",
    16: "command line", 17: "Llama, Qwen3", 18: "experts", 19: "FlashAttention", 20: "Muon",
    21: "speedrun", 22: "SFT", 23: "LoRA", 24: "DPO", 25: "GRPO",
}
PARTS = [  # (caption, first chapter, last chapter, colour kind)
    ("I Foundations", 1, 2, "data"), ("II Architecture", 3, 7, "embed"), ("III Learning", 8, 11, "mlp"),
    ("IV Using models", 12, 16, "cache"), ("V Modern models", 17, 19, "attn"),
    ("VI Training faster", 20, 21, "norm"), ("VII Post-training", 22, 25, "out"),
]
#: Row (0 = top) of each chapter in its column, chosen so that no arrow crosses a box.
ROW = {1: 2, 2: 2, 3: 1, 4: 3, 5: 3, 6: 2, 7: 1, 8: 4, 9: 2, 10: 2, 11: 3, 13: 0, 19: 4, 12: 1, 14: 2,
       20: 3, 15: 4, 17: 0, 16: 1, 22: 3, 18: 0, 21: 1, 23: 2, 24: 3, 25: 4}


def ancestors(c: int) -> set[int]:
    seen: set[int] = set()
    stack = list(NEEDS.get(c, []))
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(NEEDS.get(n, []))
    return seen


def direct_edges() -> list[tuple[int, int]]:
    """The arrows to draw: every stated need that no other stated need already implies."""
    edges = []
    for c, needs in NEEDS.items():
        for n in needs:
            if not any(n in ancestors(m) for m in needs if m != n):
                edges.append((n, c))
    return edges


def column(c: int) -> int:
    """The length of the longest chain of needs that ends at chapter ``c``."""
    return 1 + max((column(n) for n in NEEDS[c]), default=-1) if c in NEEDS else 0


def chapter_map():
    col_w, row_h, bw, bh = 1.72, 1.02, 1.42, 0.72
    n_cols = 1 + max(column(c) for c in NAMES)
    width, height = 0.35 + n_cols * col_w, 7.0
    fig, ax = canvas(width, height)
    top = height - 1.25
    kind = {c: k for _, a, b, k in PARTS for c in range(a, b + 1)}
    pos = {c: (0.35 + column(c) * col_w, top - ROW[c] * row_h) for c in NAMES}
    for c, (x, y) in pos.items():
        box(ax, x, y - bh / 2, bw, bh, "", kind[c], round_=0.12)
        text(ax, x + bw / 2, y + 0.13, str(c), size=8.5, weight="bold")
        text(ax, x + bw / 2, y - 0.15, NAMES[c], size=6.6)
    for n, c in direct_edges():
        (x0, y0), (x1, y1) = pos[n], pos[c]
        arrow(ax, (x0 + bw + 0.02, y0), (x1 - 0.04, y1), color=MUTED, lw=0.9)
    text(ax, width / 2, height - 0.35, "Which chapter builds on which: an arrow from A to B means B needs A",
         size=9.5, weight="bold")
    # The parts' colours, in one row below the map.
    for i, (caption, a, b, k) in enumerate(PARTS):
        x, y = 0.35 + (i % 4) * 4.3, 0.75 - (i // 4) * 0.5
        box(ax, x, y - 0.14, 0.38, 0.28, "", k, round_=0.06)
        text(ax, x + 0.5, y, f"{caption}: Chapters {a}–{b}", size=7, ha="left")
    return fig


FIGURES = {"chapter_map": chapter_map}

# The layout's invariants: every arrow points forward, and no two chapters share a place.
for _c, _needs in NEEDS.items():
    assert all(n < _c for n in _needs) and _c in ROW, _c
assert len({(column(c), ROW[c]) for c in NAMES}) == len(NAMES), "two chapters in one place"
