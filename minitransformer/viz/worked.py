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
from .i18n import msg
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


def worked_example_doc(lang: str = "en") -> dict:
    """The page description of the worked example, opening in ``lang``."""
    n = worked_numbers()
    s, e, w, o = n["scores"], n["exps"], n["weights"], n["output"]
    rows, cols = ["q\u2081", "q\u2082"], ["k\u2081", "k\u2082"]
    dims = ["d\u2081", "d\u2082"]
    sq = math.sqrt(2)
    steps = [
        {"id": "inputs", "title": msg("wk.inputs_title"),
         "formulas": ["Q = K = I = [[1, 0], [0, 1]]", "V = [[10, 20], [30, 40]]", "d_k = 2"],
         "text": [msg("wk.inputs_text")],
         "blocks": [matrix("Q", "Q", n["Q"], rows=rows, cols=dims),
                    matrix("K", "K", n["K"], rows=cols, cols=dims),
                    matrix("V", "V", n["V"], rows=["v\u2081", "v\u2082"], cols=dims)]},
        {"id": "dots", "title": msg("wk.dots_title"),
         "formulas": ["(Q K\u1d40)[i, j] = q_i \u00b7 k_j",
                      "q\u2081\u00b7k\u2081 = 1\u00b71 + 0\u00b70 = 1,   "
                      "q\u2081\u00b7k\u2082 = 1\u00b70 + 0\u00b71 = 0"],
         "text": [msg("wk.dots_text")],
         "blocks": [matrix("dots", "Q K\u1d40", n["dots"], rows=rows, cols=cols)]},
        {"id": "scale", "title": msg("wk.scale_title"),
         "formulas": [f"scores = Q K\u1d40 / \u221a2 = Q K\u1d40 / {_f(sq)}",
                      f"1 / \u221a2 = {_f(s[0, 0].item())}"],
         "text": [msg("wk.scale_text")],
         "blocks": [matrix("scores", msg("wk.scores"), s, rows=rows, cols=cols)]},
        {"id": "softmax", "title": msg("wk.softmax_title"),
         "formulas": [f"e^{_f(s[0, 0].item())} = {_f(e[0, 0].item())},   e^0 = 1",
                      msg("wk.row_sum", a=_f(e[0, 0].item()), s=_f(n["sums"][0, 0].item())),
                      msg("wk.weights_formula", a=_f(e[0, 0].item()),
                          s=_f(n["sums"][0, 0].item()), w1=_f(w[0, 0].item()),
                          w2=_f(w[0, 1].item()))],
         "text": [msg("wk.softmax_text")],
         "blocks": [matrix("exps", "exp(scores)", e, rows=rows, cols=cols),
                    matrix("attn-weights", msg("wk.weights_block"), w, rows=rows, cols=cols,
                           color="prob")]},
        {"id": "output", "title": msg("wk.output_title"),
         "formulas": [f"out\u2081 = {_f(w[0, 0].item())}\u00b7[10, 20] + "
                      f"{_f(w[0, 1].item())}\u00b7[30, 40] = [{_f(o[0, 0].item(), 2)}, "
                      f"{_f(o[0, 1].item(), 2)}]",
                      f"out\u2082 = {_f(w[1, 0].item())}\u00b7[10, 20] + "
                      f"{_f(w[1, 1].item())}\u00b7[30, 40] = [{_f(o[1, 0].item(), 2)}, "
                      f"{_f(o[1, 1].item(), 2)}]"],
         "text": [msg("wk.output_text")],
         "blocks": [matrix("output", "Attention(Q, K, V)", o, rows=rows, cols=dims)]},
    ]
    return {"title": msg("wk.title"), "subtitle": msg("wk.subtitle"), "lang": lang,
            "n_layer": 1, "n_head": 1, "layer": 0, "head": 0, "autoplay_ms": 4000,
            "steps": steps}
