"""Attention masks.

Convention used everywhere in minitransformer: a boolean mask where ``True`` means
"this query may attend to this key" (the same convention as
``torch.nn.functional.scaled_dot_product_attention``'s boolean ``attn_mask``).

Shapes: B batch, T time, Tq query length, Tk key length.
"""

from __future__ import annotations

import functools

import torch


def causal_mask(t_q: int, t_k: int | None = None, offset: int = 0, device=None) -> torch.Tensor:
    """Lower-triangular mask: query i (absolute position ``offset + i``) sees keys j <= offset + i.

    ``offset`` is the number of cached positions before the first query (KV-cache decoding).
    Returns a (Tq, Tk) bool tensor, built once per shape and device, then reused (read-only).
    """
    t_k = t_q + offset if t_k is None else t_k
    device = torch.device(device) if device is not None else None
    if torch.compiler.is_compiling():  # a compiled graph builds it in place: no cache to keep
        return _causal_mask.__wrapped__(t_q, t_k, offset, device)
    return _causal_mask(t_q, t_k, offset, device)


@functools.lru_cache(maxsize=64)
def _causal_mask(t_q: int, t_k: int, offset: int, device) -> torch.Tensor:
    q_pos = torch.arange(t_q, device=device)[:, None] + offset  # (Tq, 1)
    k_pos = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
    return k_pos <= q_pos  # (Tq, Tk)


def padding_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """Key-padding mask from sequence lengths: (B,) -> (B, 1, 1, T), True at real tokens."""
    keep = torch.arange(t, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
    return keep[:, None, None, :]  # (B, 1, 1, T)


def key_padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask from token ids: (B, T) -> (B, 1, 1, T), True where ids != pad_id."""
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T)


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the given masks (broadcasting); None entries are ignored."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out & m)
    return out
