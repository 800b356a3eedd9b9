"""Appendix 92: the checks `train` makes before any work, in order, and the status each failure returns."""

from kit import MUTED, arrow, box, canvas, line, text, title

USAGE, FAILED = "attn", "out"  # status 2 (fix the command) and status 1 (fix the machine or the files)


def cli_checks():
    fig, ax = canvas(17.0, 15.4)
    title(ax, 8.5, 15.0, "Every check runs before any work; each failure has its status")
    # the ladder of checks: (the check, [(status, what it refuses), ...])
    checks = [
        ("argparse: every flag parses\n(types, choices)", [("2", "--max-steps ten, --preset huge")]),
        ("TrainConfig built from the flags\n(ranges, warm-up < max steps)", [("2", "--max-steps 0, --lr inf, --seed -1")]),
        ("--device names a device\nthat holds data", [("2", "--device banana, --device meta")]),
        ("--data exists and is UTF-8 text", [("1", "missing.txt, notes.pdf")]),
        ("the device is on this machine", [("1", "--device cuda without a GPU")]),
        ("--out can hold this run", [("2", "it holds a run, and no --resume"),
                                     ("1", "under a file; --resume with no run")]),
        ("the model configuration;\nwith --resume, the run to continue", [("1", "a bad --config, a corrupt checkpoint"),
                                                                       ("2", "--resume with another --lr or text")]),
        ("--data is long enough for block_size", [("1", "a text of a few characters")]),
        ("the memory estimate fits the device", [("1", "--preset gpt2-xl --batch-size 10**6")]),
    ]
    x, w, h, top, gap = 2.2, 5.6, 0.9, 13.35, 1.25
    sx, sw = x + w + 1.1, 6.9  # the status boxes
    arrow(ax, (x + w / 2, 14.55), (x + w / 2, top + h))
    text(ax, x + w / 2 + 0.25, 14.45, "python -m transformer_lib train ...", ha="left", size=8, color=MUTED)
    for k, (check, refusals) in enumerate(checks):
        y = top - k * gap
        box(ax, x, y, w, h, check, "norm", fontsize=7.5)
        arrow(ax, (x + w, y + h / 2), (sx, y + h / 2))
        text(ax, x + w + 0.55, y + h / 2 + 0.2, "no", size=7, color=MUTED)
        rh = (h - 0.08 * (len(refusals) - 1)) / len(refusals)
        for j, (status, refused) in enumerate(refusals):
            ry = y + h - (j + 1) * rh - j * 0.08
            box(ax, sx, ry, 0.75, rh, status, USAGE if status == "2" else FAILED, fontsize=8.5, weight="bold")
            box(ax, sx + 0.85, ry, sw - 0.85, rh, refused, "plain", fontsize=7)
        nxt = top - (k + 1) * gap + h
        arrow(ax, (x + w / 2, y), (x + w / 2, nxt))
        text(ax, x + w / 2 + 0.3, (y + nxt) / 2, "yes", size=7, color=MUTED)
    # a bracket on the left: nothing has been written or allocated while the checks run
    last = top - (len(checks) - 1) * gap
    line(ax, [(x - 0.2, top + h), (x - 0.45, top + h), (x - 0.45, last), (x - 0.2, last)], color=MUTED, lw=0.8)
    text(ax, x - 0.75, (top + h + last) / 2, "before any work: nothing written, nothing allocated",
         size=7.5, color=MUTED, rotation=90)
    # training, and how it ends
    y = top - len(checks) * gap
    box(ax, x, y, w, h, "train: a checkpoint every\ncheckpoint_interval steps", "mlp", fontsize=7.5)
    arrow(ax, (x + w, y + h / 2), (sx, y + h / 2))
    text(ax, x + w + 0.55, y + h / 2 + 0.2, "done", size=7, color=MUTED)
    box(ax, sx, y + 0.08, 0.75, h - 0.16, "0", "mlp", fontsize=8.5, weight="bold")
    box(ax, sx + 0.85, y + 0.08, sw - 0.85, h - 0.16, "the run is over", "plain", fontsize=7)
    y2 = y - gap
    arrow(ax, (x + w / 2, y), (x + w / 2, y2 + h))
    text(ax, x + w / 2 + 0.3, (y + y2 + h) / 2, "a signal", ha="left", size=7, color=MUTED)
    box(ax, x, y2, w, h, "SIGINT (Ctrl-C) or SIGTERM: stop at\nthe next step boundary, checkpoint", "cache",
        fontsize=7.5)
    arrow(ax, (x + w, y2 + h / 2), (sx, y2 + h / 2))
    box(ax, sx, y2 + 0.08, 0.75, h - 0.16, "130\n143", "cache", fontsize=7, weight="bold")
    box(ax, sx + 0.85, y2 + 0.08, sw - 0.85, h - 0.16, "128 + the signal's number: 2 or 15", "plain", fontsize=7)
    # the key
    ky = 0.15
    box(ax, 2.2, ky, 0.6, 0.45, "2", USAGE, fontsize=8, weight="bold")
    text(ax, 3.0, ky + 0.22, "bad arguments: fix the command", ha="left", size=7.5)
    box(ax, 8.0, ky, 0.6, 0.45, "1", FAILED, fontsize=8, weight="bold")
    text(ax, 8.8, ky + 0.22, "a failed run: fix the machine or the files", ha="left", size=7.5)
    return fig


FIGURES = {"cli_checks": cli_checks}
