"""The two normalisations a Transformer uses between its sublayers.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * g + b        (Ba et al. 2016; the paper)
    RMSNorm(x)   = x / sqrt(mean(x^2) + eps) * g                      (Zhang & Sennrich 2019)

RMSNorm drops the mean subtraction and the bias: one reduction instead of two and no shift,
at no cost in quality (Llama, Qwen, Gemma and modded-nanogpt use it). ``norm = "rmsnorm"``
puts it in every place a LayerNorm stood, the final one included.

Both normalise over the last dimension C: x (..., C) -> (..., C).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Norm = Literal["layernorm", "rmsnorm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The formula written out: x / sqrt(mean(x^2) + eps) * g, reduced in at least fp32."""
    h = x.to(torch.promote_types(x.dtype, torch.float32))  # (..., C)
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., C)
    return (h if weight is None else h * weight).to(x.dtype)  # (..., C)


class RMSNorm(nn.Module):
    """Implements RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g over the last dimension.

    The same parameter (``weight``, started at 1) and state dict as ``torch.nn.RMSNorm``.
    ``reference=True`` computes the formula above step by step; otherwise PyTorch's fused
    ``F.rms_norm`` computes it (tests hold the two equal).
    """

    def __init__(self, d: int, eps: float = 1e-6, elementwise_affine: bool = True,
                 reference: bool = False):
        super().__init__()
        self.d, self.eps, self.reference = d, eps, reference
        self.weight = nn.Parameter(torch.ones(d)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reference or x.dtype in (torch.bfloat16, torch.float16):
            # low precision: the square and mean in fp32, as Llama's reference code does
            return rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (self.d,), self.weight, self.eps)  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


def make_norm(kind: Norm, d: int, eps: float) -> nn.Module:
    """LayerNorm (with its bias b) or RMSNorm (gain only) over a width of ``d``."""
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(d, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: choose layernorm or rmsnorm")


NORMS = (nn.LayerNorm, RMSNorm)  # modules whose parameters are gains and shifts, never decayed
