"""The utilities appendix: how a later chapter adds to an earlier chapter's class."""

from kit import MUTED, arrow, box, canvas, text


def add_to_class():
    fig, ax = canvas(16.8, 6.2)
    box(ax, 0.3, 3.4, 4.6, 2.3, "Chapter 4's cell\n\nclass MultiHeadAttention:\n    def forward(self, x)", "attn",
        fontsize=8)
    box(ax, 0.3, 0.4, 4.6, 2.3, "Chapter 12's cell\n\n@add_to_class(MultiHeadAttention,\n               replace=True)\n"
        "def forward(self, x, cache)", "cache", fontsize=8)
    text(ax, 2.6, 3.05, "a later idea, in its own chapter", size=7.5, color=MUTED)
    box(ax, 7.0, 3.4, 9.4, 2.3, "in the notebook: the decorator sets the method\non the live class "
        "(setattr), so the chapter's\nlater cells already call the new forward", "plain", fontsize=8)
    box(ax, 7.0, 0.4, 9.4, 2.3, "tools/export.py: writes the new forward into the class body\nin "
        "transformer_lib/multihead.py, where the old one was;\nthe library keeps one implementation", "data",
        fontsize=8)
    arrow(ax, (4.9, 1.9), (7.0, 4.4))
    arrow(ax, (4.9, 1.4), (7.0, 1.4))
    text(ax, 5.75, 3.55, "run", size=7.5, color=MUTED)
    text(ax, 5.95, 1.65, "export", size=7.5, color=MUTED)
    return fig


FIGURES = {"add_to_class": add_to_class}
