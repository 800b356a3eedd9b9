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


FIGURES = {"safetensors_layout": safetensors_layout}
