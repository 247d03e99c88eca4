"""Attention heatmaps: a grid of panels, one row per layer and one column per head.

Panel (l, h) shows softmax(Q K^T / sqrt(d_k)) of head h in layer l: row i is how query token i
spreads its attention over the key tokens (each row sums to 1). Tokens label both axes.
An encoder-decoder adds one block of rows per kind of attention. Labels come from the message
catalogues (``i18n.py``), in English or Chinese.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

from ..errors import UserError
from .fonts import font_chain
from .i18n import msg, render
from .views import AttentionView, check_choice

SOFTWARE = "minitransformer attention"  # the PNG's Software text: how attention knows its own
MAX_TICKS = 48  # beyond this many tokens, label every n-th one
VIEW_KEYS = {"self-attention": "heat.view.self", "encoder self-attention": "heat.view.encoder",
             "decoder self-attention": "heat.view.decoder", "cross-attention": "heat.view.cross"}


def _select(n: int, chosen: int | None, what: str) -> list[int]:
    if chosen is None:
        return list(range(n))
    check_choice(chosen, n, what)
    return [chosen]


def _rows(views: list[AttentionView], layer: int | None) -> list[tuple[AttentionView, int]]:
    """(view, layer) of each row of panels: every layer, or the one asked for in each stack
    that has it (an encoder and a decoder may differ in depth)."""
    deepest = max(v.n_layer for v in views)
    if len({v.n_layer for v in views}) > 1 and layer is not None and not 0 <= layer < deepest:
        raise UserError(f"--layer {layer} is out of range: the deepest stack has {deepest} "
                        f"layers (0 .. {deepest - 1})")
    _select(deepest, layer, "layer")  # out of range for every stack: the error
    return [(v, i) for v in views for i in range(v.n_layer) if layer is None or i == layer]


def _ticks(labels: list[str]) -> tuple[list[int], list[str]]:
    step = max(1, -(-len(labels) // MAX_TICKS))
    pos = list(range(0, len(labels), step))
    return pos, [labels[i] for i in pos]


def view_title(name: str, lang: str = "en") -> str:
    """The name of a kind of attention in ``lang`` (the catalogue's, else as it is)."""
    key = VIEW_KEYS.get(name)
    return render(msg(key), lang) if key else name


def attention_figure(views: list[AttentionView], layer: int | None = None,
                     head: int | None = None, title: str | None = None, lang: str = "en"):
    """A matplotlib Figure with one panel per (view, layer, head), labelled in ``lang``.

    Each panel axes has ``get_gid() == "attn:<view>:<layer>:<head>"`` so callers can find it.
    Call inside ``plot_context`` (``save_attention_png`` does) so CJK labels have a font.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(views, layer)
    heads = _select(max(v.n_head for v in views), head, "head")
    longest = max(max(len(v.query_labels), len(v.key_labels)) for v in views)
    side = min(max(2.6, 0.2 * min(longest, MAX_TICKS) + 1.2), 9.0)  # inches per panel
    fig, axes = plt.subplots(len(rows), len(heads), figsize=(side * len(heads) + 1.2,
                                                             side * len(rows) + 0.6),
                             squeeze=False, dpi=100)
    image = None
    for r, (view, li) in enumerate(rows):
        for c, hi in enumerate(heads):
            ax = axes[r][c]
            ax.set_gid(f"attn:{view.name}:{li}:{hi}")
            w = view.weights[li, hi].numpy()  # (Tq, Tk)
            image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                              interpolation="nearest")
            xp, xl = _ticks(view.key_labels)
            yp, yl = _ticks(view.query_labels)
            ax.set_xticks(xp, xl, rotation=90 if any(len(s) > 1 for s in xl) else 0,
                          fontsize=8)
            ax.set_yticks(yp, yl, fontsize=8)
            ax.tick_params(length=0)
            ax.set_title(render(msg("heat.panel", i=li, j=hi), lang), fontsize=9)
            if c == 0:
                ax.set_ylabel(render(msg("heat.query", view=view_title(view.name, lang)), lang),
                              fontsize=9)
            if r == len(rows) - 1 or rows[r + 1][0] is not view:
                ax.set_xlabel(render(msg("heat.key"), lang), fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / fig.get_figwidth(), 1))
    cax = fig.add_axes((1 - 0.7 / fig.get_figwidth(), 0.15, 0.15 / fig.get_figwidth(), 0.7))
    fig.colorbar(image, cax=cax, label=render(msg("heat.colorbar"), lang))
    return fig


def figure_texts(views: list[AttentionView], title: str | None = None,
                 lang: str = "en") -> list[str]:
    """Every string the figure will draw (for choosing fonts)."""
    texts = [title or ""] + [render(msg(k), lang) for k in ("heat.panel", "heat.key",
                                                             "heat.colorbar")]
    for v in views:
        texts += v.query_labels + v.key_labels + [view_title(v.name, lang)]
    return texts


@contextlib.contextmanager
def plot_context(texts):
    """An rc_context whose font chain covers every character in ``texts``; characters none
    covers were named once by ``font_chain`` (not again per glyph by matplotlib)."""
    import matplotlib.pyplot as plt

    families, missing = font_chain(texts)
    with plt.rc_context({"font.family": families, "axes.unicode_minus": False}), \
            warnings.catch_warnings():
        for code in missing:  # matplotlib's own warning, once per glyph drawn: said above
            warnings.filterwarnings("ignore", message=rf"Glyph {code} \(")
        yield


def save_attention_png(views: list[AttentionView], out, layer: int | None = None,
                       head: int | None = None, title: str | None = None,
                       lang: str = "en") -> Path:
    """Draw the attention grid and write it to ``out`` (a .png path), labels in ``lang``."""
    import matplotlib.pyplot as plt

    out = Path(out)
    if out.parent and not out.parent.exists():
        raise UserError(f"cannot write {out}: the folder {out.parent} does not exist")
    with plot_context(figure_texts(views, title, lang)):
        fig = attention_figure(views, layer, head, title, lang)
        try:
            fig.savefig(out, metadata={"Software": SOFTWARE})
        except OSError as e:
            raise UserError(f"cannot write {out}: {e.strerror or e}") from None
        finally:
            plt.close(fig)
    return out
