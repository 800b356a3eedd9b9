"""Chapter 9: the training loop and its checkpoint."""

from kit import MUTED, arrow, box, canvas, line, text


def training_loop():
    fig, ax = canvas(16.6, 7.2)
    steps = [
        ("get_batch\nx, y  (B, T)", "data"),
        ("forward\nloss = CE(logits, y)", "attn"),
        ("backward\nloss.backward()", "out"),
        ("clip\n‖g‖ ≤ grad_clip", "norm"),
        ("AdamW step\nlr from the schedule", "mlp"),
    ]
    y, w, gap = 4.2, 2.6, 0.6
    xs = [0.4 + k * (w + gap) for k in range(len(steps))]
    for k, ((label, kind), x) in enumerate(zip(steps, xs)):
        box(ax, x, y, w, 1.1, label, kind, fontsize=8)
        if k:
            arrow(ax, (x - gap, y + 0.55), (x, y + 0.55))
    end = xs[-1] + w
    line(ax, [(end, y + 0.55), (end + 0.4, y + 0.55), (end + 0.4, y + 1.7), (xs[0] + w / 2, y + 1.7)])
    arrow(ax, (xs[0] + w / 2, y + 1.7), (xs[0] + w / 2, y + 1.1))
    text(ax, 8.2, y + 1.95, "step + 1, until max_steps or a stop request (should_stop, e.g. on Ctrl-C)", size=8,
         color=MUTED)
    arrow(ax, (xs[1] + w / 2, y), (xs[1] + w / 2, 3.4), dashed=True)
    text(ax, xs[1] + w / 2 + 0.15, 3.65, "every eval_interval: estimate_loss\non both splits → metrics.jsonl",
         ha="left", size=7.5, color=MUTED)
    arrow(ax, (xs[4] + w / 2, y), (xs[4] + w / 2, 3.0), dashed=True)
    text(ax, xs[4] + w / 2 - 0.15, 3.65, "every checkpoint_interval\nand at the end", ha="right", size=7.5,
         color=MUTED)
    # the checkpoint
    cx0, cw = 6.6, 9.6
    box(ax, cx0, 0.3, cw, 2.7, "", "cache")
    text(ax, cx0 + cw / 2, 2.7, "ckpt.pt, written atomically (temporary file, then rename)", size=8, weight="bold")
    fields = ["model state", "optimizer state (m, v)", "step",
              "RNG states (torch, NumPy,\nPython, the batch generator)", "both configurations", "SHA-256 of it all"]
    for k, f in enumerate(fields):
        r, col = divmod(k, 3)
        box(ax, cx0 + 0.2 + col * 3.1, 1.35 - r * 0.95, 2.95, 0.8, f, "plain", fontsize=7)
    arrow(ax, (cx0 - 0.1, 1.6), (3.1, 1.6), dashed=True)
    box(ax, 0.4, 1.0, 2.6, 1.2, "resume: restore all,\ncontinue bit for bit", "plain", fontsize=8)
    arrow(ax, (1.7, 2.2), (1.7, y), dashed=True)
    return fig


FIGURES = {"training_loop": training_loop}
