"""Position-wise feed-forward networks, "Attention Is All You Need" section 3.3, and the gated
variant modern models use.

    FFN(x)    = act(x W1 + b1) W2 + b2                        (paper eq. 2)
    SwiGLU(x) = (SiLU(x W_gate) * (x W1)) W2                  (Shazeer 2020, "GLU Variants")

act is ReLU in the paper, GELU in GPT-2 / BERT, and ReLU^2 = max(0, x)^2 (So et al. 2021,
"Primer"; modded-nanogpt) in some newer models. SwiGLU has three matrices instead of two, so
its default hidden width is 2/3 of 4d (rounded up to a multiple of 8): the same parameter
count as a 4d two-matrix FFN.

Shapes: B batch, T time, C channels (d_model), F hidden width (d_ff).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear, linear_then

Activation = Literal["relu", "gelu", "gelu_tanh", "relu2", "swiglu"]


class ReLUSquared(nn.Module):
    """Implements relu2(x) = max(0, x)^2 (Primer, So et al. 2021)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


def make_activation(name: Activation) -> nn.Module:
    """ReLU (paper), exact GELU (BERT), GELU with the tanh approximation (GPT-2) or ReLU^2."""
    if name == "relu":
        return nn.ReLU()
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu2":
        return ReLUSquared()
    raise ValueError(f"unknown activation {name!r}: choose relu, gelu, gelu_tanh or relu2 "
                     f"(swiglu is a FeedForward of its own: make_feedforward)")


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
        h = linear_then(self.fc, x, self.act)  # act(x W1 + b1): (B, T, F)
        if self.training:  # dropout is the identity at inference
            h = self.dropout(h)
        return self.proj(h)  # (B, T, C)


class SwiGLU(nn.Module):
    """Implements SwiGLU(x) = (SiLU(x W_gate) * (x W1)) W2 (Shazeer 2020; Llama's MLP).

    SiLU(z) = z * sigmoid(z). The gate decides, per hidden unit, how much of x W1 passes.
    Llama names the three matrices gate_proj, up_proj and down_proj; here they are ``gate``,
    ``fc`` and ``proj`` (``proj`` writes into the residual stream, as in ``FeedForward``).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=bias)  # W_gate
        self.fc = Linear(d_model, d_ff, bias=bias)  # W1 ("up")
        self.proj = Linear(d_ff, d_model, bias=bias)  # W2 ("down"), residual output projection
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate(x)) * self.fc(x)  # (B, T, F)
        if self.training:
            h = self.dropout(h)
        return self.proj(h)  # (B, T, C)


def make_feedforward(d_model: int, d_ff: int, activation: Activation, dropout: float,
                     bias: bool) -> nn.Module:
    """The two-matrix FFN for a plain activation, the three-matrix SwiGLU for "swiglu"."""
    if activation == "swiglu":
        return SwiGLU(d_model, d_ff, dropout, bias)
    return FeedForward(d_model, d_ff, activation, dropout, bias)
