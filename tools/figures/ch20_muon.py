"""Chapter 20: Muon. The path of one update of a hidden weight matrix (gradient, momentum,
Newton-Schulz, scaled step), with the singular values at each stage, and the split of the baby
GPT's parameters between Muon and AdamW."""

from matplotlib.patches import Rectangle

from kit import COLORS, INK, MUTED, arrow, box, canvas, text

# Singular values drawn as bars (illustrative shapes: a dominant direction, then after five
# Newton-Schulz steps a band around 1).
BEFORE = [1.0, 0.42, 0.2, 0.12, 0.08, 0.06, 0.05, 0.04]
AFTER = [0.95, 1.08, 0.74, 1.12, 0.86, 0.71, 1.02, 0.8]


def _bars(ax, x, y, values, kind, *, width=2.6, height=1.5, label=""):
    """A small bar chart of singular values from (x, y), largest first."""
    fill, edge = COLORS[kind]
    n = len(values)
    step = width / n
    ax.plot([x - 0.05, x + width], [y, y], color=MUTED, lw=0.8)
    for i, v in enumerate(values):
        ax.add_patch(Rectangle((x + i * step + 0.04, y), step - 0.08, v * height / 1.15, facecolor=fill,
                               edgecolor=edge, linewidth=0.8))
    if label:
        text(ax, x + width / 2, y - 0.35, label, size=7.5, color=MUTED)


def muon_pipeline():
    fig, ax = canvas(26, 12.2)
    text(ax, 13, 11.7, "One Muon step for a hidden weight matrix $W$ ($m \\times n$)", size=10, weight="bold")
    w, h, y = 4.6, 1.9, 8.2
    xs = [0.4, 5.7, 11.0, 16.3, 21.3]
    labels = [
        ("gradient\n$G = \\nabla_W \\mathcal{L}$", "data"),
        ("momentum (Nesterov)\n$B \\leftarrow \\mu B + (1-\\mu) G$\n$\\tilde B = \\mu B + (1-\\mu) G$", "cache"),
        ("Newton–Schulz, 5 steps\n$X \\leftarrow \\tilde B / \\|\\tilde B\\|_F$\n$X \\leftarrow aX + b(XX^T)X$\n"
         "$\\quad + c(XX^T)^2X$", "attn"),
        ("shape factor\n$s = \\sqrt{\\max(1, m/n)}$\nor $0.2\\sqrt{\\max(m, n)}$", "norm"),
        ("update\n$W \\leftarrow (1 - \\eta\\lambda) W$\n$\\qquad - \\eta\\, s\\, X$", "out"),
    ]
    for x, (label, kind) in zip(xs, labels):
        box(ax, x, y, w, h, label, kind, fontsize=8)
    for x0, x1 in zip(xs[:-1], xs[1:]):
        arrow(ax, (x0 + w, y + h / 2), (x1, y + h / 2))
    _bars(ax, xs[0] + 1.0, 5.5, BEFORE, "data", label="before: one direction dominates")
    _bars(ax, xs[2] + 1.0, 5.5, AFTER, "attn", label="after: all in a band around 1")
    arrow(ax, (xs[2] + w / 2, y), (xs[2] + w / 2, 7.3), color=MUTED)
    arrow(ax, (xs[0] + w / 2, y), (xs[0] + w / 2, 7.3), color=MUTED)
    text(ax, xs[3] + w / 2, 6.6, "$\\|s\\,UV^T\\|_{\\mathrm{rms}\\to\\mathrm{rms}} = 1$\nfor $m \\geq n$", size=7.5, color=MUTED)
    text(ax, xs[4] + w / 2, 6.6, "decay uses $\\eta$,\nnot $\\eta s$", size=7.5, color=MUTED)

    # the split of the parameters
    text(ax, 13, 4.0, "Which parameters of the baby GPT get which optimizer", size=10, weight="bold")
    box(ax, 0.9, 0.5, 11.6, 2.9,
        "Muon: the hidden 2-D matrices of every block\n\nattention in_proj (384 × 128: Q, K, V fused, one matrix)\nout_proj (128 × 128)\n"
        "MLP fc1 (512 × 128), fc2 (128 × 512)\n16 matrices in 4 blocks", "mlp", fontsize=8)
    box(ax, 13.5, 0.5, 11.6, 2.9,
        "AdamW: everything else\n\ntoken embedding wte (= the tied output head)\n"
        "position embedding wpe\nLayerNorm gains (and biases, where a model has them)", "embed", fontsize=8)
    return fig


FIGURES = {"muon_pipeline": muon_pipeline}
