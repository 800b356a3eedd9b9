"""Appendix 91: the checkpoint file and the checks load_checkpoint makes, in order."""

from kit import MUTED, arrow, box, canvas, text, title


def checkpoint_ladder():
    fig, ax = canvas(17.0, 9.6)
    title(ax, 8.5, 9.2, "A checkpoint is restored only after every check passes")
    # the file
    box(ax, 0.3, 0.4, 4.4, 8.1, "", "cache")
    text(ax, 2.5, 8.1, "ckpt.pt (a zip of pickled tensors)", size=8, weight="bold")
    entries = ["format", "model", "optimizer (m, v, steps)", "step", "rng (torch, CUDA, NumPy,\nPython, batches)",
               "model_config, train_config", "metrics", "model_sha256\n(one per tensor)", "sha256 (of all the rest)"]
    for k, e in enumerate(entries):
        box(ax, 0.55, 7.2 - k * 0.77, 3.9, 0.62, e, "plain", fontsize=7)
    # the ladder
    checks = [
        ("torch.load(weights_only=True)", "random bytes, a truncated file,\npickled code"),
        ("format is transformer_lib.checkpoint/1", "a bare state dict,\nanother format's marker"),
        ("an entry 'sha256' is present", "a checkpoint re-saved by hand"),
        ("sha256 recomputed = sha256 stored", "one flipped bit\n(model_sha256 names the tensor)"),
        ("entries well-formed: step, configs,\nrandom states", "a malformed entry"),
        ("fits the model and optimizer:\nnames and shapes", "another model's checkpoint"),
    ]
    x, w, h, top = 6.0, 5.4, 0.82, 7.55
    arrow(ax, (4.7, 7.96), (x, 7.96))
    for k, (check, refused) in enumerate(checks):
        y = top - k * 1.22
        box(ax, x, y, w, h, check, "norm", fontsize=7.5)
        box(ax, x + w + 1.0, y + 0.06, 4.2, h - 0.12, refused, "out", fontsize=7)
        arrow(ax, (x + w, y + h / 2), (x + w + 1.0, y + h / 2))
        text(ax, x + w + 0.5, y + h / 2 + 0.2, "no", size=7, color=MUTED)
        nxt = top - (k + 1) * 1.22 + h
        arrow(ax, (x + w / 2, y), (x + w / 2, nxt))
        text(ax, x + w / 2 + 0.3, (y + nxt) / 2, "yes", size=7, color=MUTED)
    y = top - len(checks) * 1.22
    box(ax, x, y, w, h, "restore: model, optimizer, step,\nrandom states", "mlp", fontsize=7.5)
    text(ax, x + w + 3.1, y + h / 2, "refused: a ValueError naming the file;\nmodel, optimizer and RNGs untouched",
         size=7, color=MUTED)
    return fig


FIGURES = {"checkpoint_ladder": checkpoint_ladder}
