"""Seeing inside: attention heatmaps and the step-by-step HTML walkthrough.

- ``views``: a model's attention weights on a text (self_attention_views, seq2seq_views; each
  family's ``attention_views`` picks one).
- ``heatmap.save_attention_png``: a grid of heatmaps, one row per layer, one column per head.
- ``trace.trace_gpt``: every intermediate tensor of a forward pass, checked against the model.
- ``explain.explain_gpt`` + ``page.write_page``: the eight-step offline HTML page.
- ``worked.worked_example_doc``: attention by hand, Q = K = I, V = [[10, 20], [30, 40]].

The loss curve is drawn by ``training/curves.py`` while training.
"""

from .heatmap import attention_figure, save_attention_png
from .page import embed_json, render_page, write_page
from .trace import ForwardTrace, trace_gpt
from .views import AttentionView, self_attention_views, seq2seq_views

__all__ = ["AttentionView", "ForwardTrace", "attention_figure", "embed_json", "render_page",
           "save_attention_png", "self_attention_views", "seq2seq_views", "trace_gpt",
           "write_page"]
