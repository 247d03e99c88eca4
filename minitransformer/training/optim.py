"""AdamW with weight decay on matrices only.

Decay pulls weights toward zero; it regularises the matrices that mix features (linear
layers, token embeddings) but not biases, LayerNorm gains or position tables, where pulling
toward zero only hurts (GPT-2 / nanoGPT practice).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..nn.positional import LearnedPositionalEmbedding


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices (decayed) and everything else (not decayed)."""
    no_decay_ids = set()
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, LearnedPositionalEmbedding)):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay = [], []
    for p in model.parameters():  # shared (tied) parameters come once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and id(p) not in no_decay_ids else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, learning_rate: float, weight_decay: float,
                   betas: tuple[float, float], device_type: str) -> torch.optim.AdamW:
    """AdamW; the fused kernel on CUDA and CPU (one pass over all parameters: 0.55 vs 2.6 ms a
    step for the cpu-small model), the multi-tensor (foreach) one elsewhere."""
    kwargs = {}
    params = inspect.signature(torch.optim.AdamW).parameters
    if device_type in ("cuda", "cpu") and "fused" in params:
        kwargs["fused"] = True
    elif "foreach" in params:
        kwargs["foreach"] = True
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=learning_rate, betas=betas,
                             **kwargs)
