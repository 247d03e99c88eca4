"""Position-wise feed-forward network, "Attention Is All You Need" section 3.3.

    FFN(x) = act(x W1 + b1) W2 + b2

with act = ReLU in the paper and GELU in GPT-2 / BERT.

Shapes: B batch, T time, C channels (d_model), F hidden width (d_ff).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from .linear import Linear

Activation = Literal["relu", "gelu", "gelu_tanh"]


def make_activation(name: Activation) -> nn.Module:
    """ReLU (paper), exact GELU (BERT) or GELU with the tanh approximation (GPT-2)."""
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    raise ValueError(f"unknown activation {name!r}: choose relu, gelu or gelu_tanh")


class FeedForward(nn.Module):
    """Implements FFN(x) = act(x W1 + b1) W2 + b2 (paper eq. 2)."""

    def __init__(self, d_model: int, d_ff: int, activation: Activation = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc = Linear(d_model, d_ff, bias=bias)
        self.act = make_activation(activation)
        self.proj = Linear(d_ff, d_model, bias=bias)  # residual output projection
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))  # (B, T, F)
        if self.training:  # dropout is the identity at inference
            h = self.dropout(h)
        return self.proj(h)  # (B, T, C)
