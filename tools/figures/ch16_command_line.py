"""Chapter 16: the commands and the run directory they share; Ctrl-C at a step boundary."""

from kit import COLORS, INK, MUTED, arrow, box, canvas, line, text


def run_directory():
    fig, ax = canvas(16.8, 6.4)
    box(ax, 0.3, 3.7, 4.2, 1.6, "python -m transformer_lib train\n--data input.txt --out runs/x", "attn",
        fontsize=8)
    box(ax, 0.3, 0.6, 4.2, 1.6, "python -m transformer_lib generate\n--checkpoint runs/x --prompt ...", "out",
        fontsize=8)
    box(ax, 6.0, 0.4, 5.2, 5.4, "", "cache")
    text(ax, 8.6, 5.45, "runs/x/", size=10, weight="bold")
    files = [("tokenizer.json", "the characters, in id order"), ("run.json", "the data's path and SHA-256"),
             ("metrics.jsonl", "one line per evaluation"), ("ckpt.pt", "model, optimizer, RNG, step, checksum")]
    for k, (name, what) in enumerate(files):
        y = 4.2 - k * 1.2
        box(ax, 6.3, y, 4.6, 0.95, "", "plain")
        text(ax, 6.5, y + 0.65, name, ha="left", size=8, weight="bold")
        text(ax, 6.5, y + 0.3, what, ha="left", size=7, color=MUTED)
    arrow(ax, (4.6, 4.8), (5.9, 4.8))
    text(ax, 5.25, 5.1, "writes", size=7.5, color=MUTED)
    arrow(ax, (5.9, 1.4), (4.6, 1.4))
    text(ax, 5.25, 1.7, "reads", size=7.5, color=MUTED)
    arrow(ax, (5.9, 3.2), (4.6, 4.0), rad=-0.25)
    text(ax, 5.3, 2.85, "--resume\nreads", size=7.5, color=MUTED)
    # evaluate reads the same directory
    box(ax, 12.1, 2.3, 4.4, 1.6, "python -m transformer_lib evaluate\n--checkpoint runs/x --data input.txt",
        "embed", fontsize=8)
    arrow(ax, (11.3, 3.1), (12.0, 3.1))
    text(ax, 11.65, 3.4, "reads", size=7.5, color=MUTED)
    return fig


def sigint_step_boundary():
    fig, ax = canvas(16.0, 7.0)
    green, red = COLORS["mlp"][1], COLORS["out"][1]
    y0, h, w = 4.2, 1.0, 3.0
    xs = (0.5, 4.4, 8.3)
    for x0, label, later in zip(xs, ("step k-1", "step k", "step k+1"), (False, False, True)):
        box(ax, x0, y0, w, h, "", "plain", dashed=later)
        for j, part in enumerate(("forward", "backward", "update")):
            px = x0 + j * w / 3
            if j:
                line(ax, [(px, y0 + 0.12), (px, y0 + h - 0.12)], color=MUTED, lw=0.6)
            text(ax, px + w / 6, y0 + h / 2, part, size=7, color=MUTED if later else INK)
        text(ax, x0 + 0.05, y0 + h + 0.3, label, ha="left", size=8.5, color=MUTED if later else INK)
    for bx, answer in ((3.95, "no"), (7.85, "yes")):  # the step boundaries
        line(ax, [(bx, y0 - 0.3), (bx, y0 + h + 0.2)], color=green, lw=1.6)
        text(ax, bx, y0 - 0.45, f"should_stop()? {answer}", size=7.5, color=green, va="top",
             weight="bold" if answer == "yes" else "normal")
    sx = xs[1] + w / 2  # Ctrl-C arrives during step k's backward pass
    arrow(ax, (sx, 6.75), (sx, y0 + h + 0.05), color=red)
    text(ax, sx + 0.15, 6.5, "Ctrl-C (SIGINT) during step k: the handler only sets a flag, and step k runs to its end",
         ha="left", size=8, color=red)
    # after the boundary: the checkpoint, then the exit
    box(ax, 5.6, 1.7, 4.5, 1.2, "write a temporary file, then\nos.replace → ckpt.pt (atomic)", "cache", fontsize=8)
    arrow(ax, (7.85, y0 - 0.9), (7.85, 2.95))
    box(ax, 10.9, 1.7, 4.6, 1.2, "exit status 130", "out", fontsize=8.5)
    arrow(ax, (10.15, 2.3), (10.85, 2.3))
    arrow(ax, (9.3, 2.95), (9.3, y0 - 0.05), dashed=True)
    text(ax, 9.45, 3.55, "--resume\n(later)", ha="left", size=7.5, color=MUTED)
    text(ax, 11.7, 5.1, "ckpt.pt holds the state after step k:\nweights, optimizer state, step,\n"
         "random states; all of it consistent", ha="left", va="center", size=7.5, color=MUTED)
    text(ax, 0.5, 0.75, "A second Ctrl-C: the flag's handler has put Python's default handler in place, so it raises "
         "KeyboardInterrupt at once;\nthe last ckpt.pt is still whole, because a checkpoint is only ever "
         "replaced by a rename.", ha="left", size=7.5, color=MUTED)
    return fig


FIGURES = {"run_directory": run_directory, "sigint_step_boundary": sigint_step_boundary}
