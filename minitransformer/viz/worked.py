"""The hand calculation of scaled dot-product attention, step by step, as a page.

    Q = K = I (2 x 2),  V = [[10, 20], [30, 40]],  d_k = 2
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Every number is computed here in float64 by hand-style formulas and checked against the
library's own ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch

from ..nn.attention import scaled_dot_product_attention
from .walkthrough import matrix

Q = [[1.0, 0.0], [0.0, 1.0]]
K = [[1.0, 0.0], [0.0, 1.0]]
V = [[10.0, 20.0], [30.0, 40.0]]


def worked_numbers() -> dict[str, torch.Tensor]:
    """Every intermediate of the worked example (float64), checked against the library."""
    q, k, v = (torch.tensor(m, dtype=torch.float64) for m in (Q, K, V))
    d_k = q.shape[-1]
    dots = q @ k.T  # (2, 2)
    scores = dots / math.sqrt(d_k)  # (2, 2)
    exps = scores.exp()  # (2, 2)
    sums = exps.sum(-1, keepdim=True)  # (2, 1)
    weights = exps / sums  # (2, 2)
    out = weights @ v  # (2, 2)
    lib_out, lib_weights = scaled_dot_product_attention(q, k, v)
    if not (torch.allclose(lib_out, out) and torch.allclose(lib_weights, weights)):
        raise RuntimeError("the worked example disagrees with scaled_dot_product_attention")
    return {"Q": q, "K": k, "V": v, "dots": dots, "scores": scores, "exps": exps,
            "sums": sums, "weights": weights, "output": out}


def _f(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}f}"


def worked_example_doc() -> dict:
    n = worked_numbers()
    s, e, w, o = n["scores"], n["exps"], n["weights"], n["output"]
    rows, cols = ["q\u2081", "q\u2082"], ["k\u2081", "k\u2082"]
    dims = ["d\u2081", "d\u2082"]
    sq = math.sqrt(2)
    steps = [
        {"id": "inputs", "title": "The inputs",
         "formulas": ["Q = K = I = [[1, 0], [0, 1]]", "V = [[10, 20], [30, 40]]", "d_k = 2"],
         "text": ["Two tokens, d_k = 2. The queries and keys are the identity, so each query "
                  "matches its own key best; the values are the numbers being mixed."],
         "blocks": [matrix("Q", "Q", n["Q"], rows=rows, cols=dims),
                    matrix("K", "K", n["K"], rows=cols, cols=dims),
                    matrix("V", "V", n["V"], rows=["v\u2081", "v\u2082"], cols=dims)]},
        {"id": "dots", "title": "Dot products Q K\u1d40",
         "formulas": ["(Q K\u1d40)[i, j] = q_i \u00b7 k_j",
                      "q\u2081\u00b7k\u2081 = 1\u00b71 + 0\u00b70 = 1,   "
                      "q\u2081\u00b7k\u2082 = 1\u00b70 + 0\u00b71 = 0"],
         "text": ["Each query is compared with each key: the identity gives 1 on the "
                  "diagonal and 0 elsewhere."],
         "blocks": [matrix("dots", "Q K\u1d40", n["dots"], rows=rows, cols=cols)]},
        {"id": "scale", "title": "Scale by \u221ad_k",
         "formulas": [f"scores = Q K\u1d40 / \u221a2 = Q K\u1d40 / {_f(sq)}",
                      f"1 / \u221a2 = {_f(s[0, 0].item())}"],
         "text": ["Dividing by \u221ad_k keeps the scores' spread independent of the "
                  "dimension, so the softmax stays soft."],
         "blocks": [matrix("scores", "scores", s, rows=rows, cols=cols)]},
        {"id": "softmax", "title": "Softmax, row by row",
         "formulas": [f"e^{_f(s[0, 0].item())} = {_f(e[0, 0].item())},   e^0 = 1",
                      f"row sum = {_f(e[0, 0].item())} + 1 = {_f(n['sums'][0, 0].item())}",
                      f"weights = [{_f(e[0, 0].item())} / {_f(n['sums'][0, 0].item())}, "
                      f"1 / {_f(n['sums'][0, 0].item())}] = [{_f(w[0, 0].item())}, "
                      f"{_f(w[0, 1].item())}]"],
         "text": ["Each row is exponentiated and divided by its sum, so it becomes a set of "
                  "weights that sum to 1. Row 2 is row 1 mirrored."],
         "blocks": [matrix("exps", "exp(scores)", e, rows=rows, cols=cols),
                    matrix("attn-weights", "attention weights A", w, rows=rows, cols=cols,
                           color="prob")]},
        {"id": "output", "title": "Weighted sum of the values",
         "formulas": [f"out\u2081 = {_f(w[0, 0].item())}\u00b7[10, 20] + "
                      f"{_f(w[0, 1].item())}\u00b7[30, 40] = [{_f(o[0, 0].item(), 2)}, "
                      f"{_f(o[0, 1].item(), 2)}]",
                      f"out\u2082 = {_f(w[1, 0].item())}\u00b7[10, 20] + "
                      f"{_f(w[1, 1].item())}\u00b7[30, 40] = [{_f(o[1, 0].item(), 2)}, "
                      f"{_f(o[1, 1].item(), 2)}]"],
         "text": ["Token 1 takes two thirds of v\u2081 and one third of v\u2082; token 2 the "
                  "other way round. The same numbers come out of "
                  "minitransformer.nn.attention.scaled_dot_product_attention."],
         "blocks": [matrix("output", "Attention(Q, K, V)", o, rows=rows, cols=dims)]},
    ]
    return {"title": "Attention by hand: Q = K = I, V = [[10, 20], [30, 40]]",
            "subtitle": "softmax(Q K\u1d40 / \u221ad_k) V with d_k = 2, one step at a time",
            "n_layer": 1, "n_head": 1, "layer": 0, "head": 0, "autoplay_ms": 4000,
            "steps": steps}
