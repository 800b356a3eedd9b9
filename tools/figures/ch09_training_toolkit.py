"""Chapter 9: the training loop and its checkpoint; data parallelism."""

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


def ddp_allreduce():
    fig, ax = canvas(16.0, 9.6)
    cols, w = (0.6, 8.6), 6.8
    # the global batch, drawn alike on every rank, and its slices
    text(ax, 8.0, 9.2, "the global batch of W·B sequences, drawn by the same generator on every rank", size=8,
         color=MUTED)
    for label, x in zip(("slice 0: sequences 0 to B − 1", "slice W − 1: sequences (W − 1)·B to W·B − 1"), cols):
        box(ax, x, 7.7, w, 0.9, label + "   (B, T)", "data", fontsize=8)
    text(ax, 8.0, 8.15, "…", size=12)
    for r, x in enumerate(cols):
        cx = x + w / 2
        text(ax, x + 0.1, 7.35, f"rank {r}" if r == 0 else "rank W − 1", ha="left", size=8, weight="bold")
        arrow(ax, (cx, 7.7), (cx, 6.9))
        box(ax, x, 5.7, w, 1.2, "a full copy of the model\nforward, loss, backward on its slice", "attn", fontsize=8)
        arrow(ax, (cx, 5.7), (cx, 5.0))
        box(ax, x + 1.4, 4.1, w - 2.8, 0.9, f"local gradient $g_{{{r if r == 0 else 'W-1'}}}$", "out", fontsize=8)
        arrow(ax, (cx, 4.1), (cx, 3.45))
        arrow(ax, (cx, 2.35), (cx, 1.75))
        box(ax, x, 0.55, w, 1.2, "AdamW step with the same $\\bar g$\nthe copies stay identical", "mlp", fontsize=8)
    box(ax, 0.6, 2.35, 14.8, 1.1, "all-reduce (during backward, bucket by bucket): every rank receives "
        "$\\bar g = (g_0 + \\dots + g_{W-1})\\,/\\,W$", "cache", fontsize=8)
    text(ax, 8.0, 0.2, "rank 0 alone evaluates and writes the checkpoint", size=7.5, color=MUTED)
    return fig


FIGURES = {"training_loop": training_loop, "ddp_allreduce": ddp_allreduce}
