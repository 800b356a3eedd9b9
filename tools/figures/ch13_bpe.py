"""Chapter 13: the merges of the toy string, and encoding one chunk by rank."""

from kit import MUTED, box, canvas, text

PAIR = "#f09a4a"


def _tokens(ax, x, y, tokens, ids=None, highlight=(), *, h=0.6, fontsize=8):
    """A row of token boxes from (x, y); returns the x of each box's left and right edges."""
    edges = []
    for k, t in enumerate(tokens):
        w = 0.55 + 0.2 * len(t)
        box(ax, x, y, w, h, t, "data", fontsize=fontsize, color=PAIR if k in highlight else None)
        if ids is not None:
            text(ax, x + w / 2, y - 0.16, str(ids[k]), size=6.5, color=MUTED, va="top")
        edges.append((x, x + w))
        x += w + 0.14
    return edges


def bpe_merge():
    fig, ax = canvas(15.5, 8.0)
    rows = [
        ("the toy string: 11 bytes", list("aaabdaaabac"), [97, 97, 97, 98, 100, 97, 97, 97, 98, 97, 99],
         {0, 1, 5, 6}, "(a, a) occurs 4 times (overlapping), most often: merge it → 256"),
        ("after merge 1: 9 tokens", ["aa", "a", "b", "d", "aa", "a", "b", "a", "c"],
         [256, 97, 98, 100, 256, 97, 98, 97, 99], {1, 2, 5, 6}, "(aa, a) and (a, b) twice each; the tie goes to the smaller ids"),
        ("after merge 2: 7 tokens", ["aa", "ab", "d", "aa", "ab", "a", "c"], [256, 257, 100, 256, 257, 97, 99],
         {0, 1, 3, 4}, "(aa, ab) twice: merge it → 258"),
        ("after merge 3: 5 tokens", ["aaab", "d", "aaab", "a", "c"], [258, 100, 258, 97, 99], set(), ""),
    ]
    y = 6.95
    for title, toks, ids, hl, note in rows:
        text(ax, 0.3, y + 0.85, title, ha="left", size=8.5, weight="bold")
        _tokens(ax, 0.4, y, toks, ids, hl)
        if note:
            text(ax, 0.4, y - 0.65, note, ha="left", size=7.5, color=MUTED)
        y -= 2.05
    box(ax, 10.9, 2.7, 4.3, 2.6,
        "the merges, in order\n(the tokenizer)\n\n256 = (97, 97)    'aa'\n257 = (97, 98)    'ab'\n"
        "258 = (256, 257)  'aaab'", "plain", fontsize=8)
    text(ax, 13.05, 2.25, "highlighted: the occurrences\nmerged in the next round", size=7.5, color=MUTED, va="top")
    return fig


def bpe_encode():
    fig, ax = canvas(16.5, 7.9)
    merges = ["Ġ t", "h e", "Ġt he", "e r", "r e", "i n", "Ġ a", "Ġthe re"]
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    steps = [["Ġ", "t", "h", "e", "r", "e"]]
    applied = []
    while len(steps[-1]) > 1:
        toks = steps[-1]
        pairs = [(rank.get((a, b)), i) for i, (a, b) in enumerate(zip(toks, toks[1:])) if (a, b) in rank]
        if not pairs:
            break
        r, i = min(pairs)
        applied.append(r)
        steps.append(toks[:i] + [toks[i] + toks[i + 1]] + toks[i + 2:])
    text(ax, 0.3, 7.55, "encoding the chunk \" there\" (Ġ = space): merge the adjacent pair of lowest rank, repeat",
         ha="left", size=9, weight="bold")
    y = 6.45
    for k, toks in enumerate(steps):
        merged = None
        if k < len(applied):
            merged = next(i for i, (a, b) in enumerate(zip(toks, toks[1:])) if rank.get((a, b)) == applied[k])
        edges = _tokens(ax, 0.6, y, toks, highlight={merged, merged + 1} if merged is not None else set(),
                        h=0.55, fontsize=8.5)
        for i, (a, b) in enumerate(zip(toks, toks[1:])):
            r = rank.get((a, b))
            text(ax, (edges[i][1] + edges[i + 1][0]) / 2, y - 0.2, "–" if r is None else str(r), size=7.5,
                 color="#c8630a" if i == merged else MUTED, weight="bold" if i == merged else "normal")
        label = f"merge rank {applied[k]}" if k < len(applied) else "no pair left: one token"
        text(ax, 6.6, y + 0.27, label, ha="left", size=8)
        y -= 1.22
    box(ax, 11.2, 2.3, 4.9, 4.2, "merge list: rank  pair\n\n" + "\n".join(f"{r}:  {m}" for r, m in enumerate(merges)),
        "plain", fontsize=8)
    text(ax, 13.65, 1.9, f"ranks applied: {', '.join(map(str, applied))}\nnever decreasing", size=8, va="top")
    return fig


FIGURES = {"bpe_merge": bpe_merge, "bpe_encode": bpe_encode}
