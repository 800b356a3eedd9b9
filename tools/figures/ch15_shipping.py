"""Chapter 15: what a saved model is on disk."""

from kit import COLORS, MUTED, arrow, box, canvas, text


def safetensors_layout():
    fig, ax = canvas(17.4, 5.6)
    text(ax, 0.3, 5.2, "model.safetensors", ha="left", size=10, weight="bold")
    box(ax, 0.3, 3.3, 1.6, 1.3, "8 bytes:\nheader\nlength N", "data", fontsize=7.5)
    box(ax, 1.9, 3.3, 6.2, 1.3, "N bytes of JSON: every tensor's dtype, shape, byte range;\n"
        "__metadata__: format, dtype, config, tied names,\nthe SHA-256 of every tensor", "cache", fontsize=7.5)
    parts = [("wte.weight", 2.6), ("wpe.weight", 1.6), ("blocks.0. ...", 2.2), ("...", 0.9), ("ln_f.weight", 1.6)]
    x = 8.1
    for name, w in parts:
        box(ax, x, 3.3, w, 1.3, name, "embed", fontsize=7.5)
        x += w
    text(ax, 8.1 + (x - 8.1) / 2, 3.05, "raw little-endian tensor bytes, one after another (no code, no pickle)",
         size=7.5, color=MUTED, va="top")
    box(ax, 0.3, 0.4, 3.6, 1.4, "config.json\nthe GPTConfig as JSON", "plain", fontsize=8)
    arrow(ax, (4.1, 1.1), (5.0, 1.1))
    box(ax, 5.1, 0.2, 11.8, 1.8, "", "plain")
    text(ax, 11.0, 1.55, "loading checks, in order", size=8, weight="bold")
    text(ax, 11.0, 0.85, "header parses and fits the file  →  format marker  →  config.json equals the recorded config\n"
         "→  dtypes agree  →  every tensor's SHA-256 matches  →  load_state_dict (shapes)", size=7.5)
    return fig


def onnx_export():
    fig, ax = canvas(18.0, 3.2)
    stages = [("GPT", "PyTorch module\n(Python code)", "embed"),
              ("torch.export", "FX graph of tensor ops;\nbatch, seq symbolic", "norm"),
              ("ONNX translation", "standard operators\n(opset 18+), optimised", "mlp"),
              ("model.onnx", "protobuf: graph + weights\n+ model.onnx.sha256", "cache"),
              ("ONNX Runtime", "OnnxGPT checks the hash;\nlogits (batch, seq, V)", "out")]
    steps = ["trace on\nsymbolic sizes", "one op to\nONNX ops", "write", "load, run\nno Python"]
    w, gap, x0, y0, h = 2.9, 0.6, 0.3, 0.9, 2.0
    for i, (name, detail, kind) in enumerate(stages):
        x = x0 + i * (w + gap)
        box(ax, x, y0, w, h, "", kind)
        text(ax, x + w / 2, y0 + h - 0.45, name, size=8.5, weight="bold")
        text(ax, x + w / 2, y0 + 0.75, detail, size=7.2)
        if i < len(steps):
            arrow(ax, (x + w + 0.05, y0 + h / 2), (x + w + gap - 0.05, y0 + h / 2))
            text(ax, x + w + gap / 2, y0 - 0.4, steps[i], size=6.8, color=MUTED)
    return fig


FIGURES = {"safetensors_layout": safetensors_layout, "onnx_export": onnx_export}
