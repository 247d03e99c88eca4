"""Positional information, four ways (plus none).

- ``SinusoidalPositionalEncoding``: the paper's fixed encoding (section 3.5), added to embeddings.
- ``LearnedPositionalEmbedding``: a trained table (GPT-2, BERT), added to embeddings.
- ``RotaryEmbedding``: RoPE (Su et al. 2021), rotates queries and keys inside attention.
- ``ALiBi``: attention with linear biases (Press et al. 2022), added to attention scores.

Shapes: T time, C channels (d_model), nh heads, hs head size, Tq/Tk query/key length.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

PosEncoding = Literal["sinusoidal", "learned", "rope", "alibi", "none"]


def sinusoidal_table(n_pos: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)); (n_pos, C)."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (C/2,)
    angle = pos / base ** (two_i / d_model)  # (T, C/2)
    pe = torch.zeros(n_pos, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()  # (T, C)


class SinusoidalPositionalEncoding(nn.Module):
    """Implements the paper's PE table (section 3.5); has no parameters and extrapolates."""

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, t: int, offset: int = 0) -> torch.Tensor:
        """Encodings of positions offset .. offset+t-1: (T, C)."""
        if offset + t > self.pe.shape[0]:  # longer than the table: extend it (no parameters)
            self.pe = sinusoidal_table(2 * (offset + t), self.d_model).to(self.pe.device)
        return self.pe[offset: offset + t]  # (T, C)

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """Encodings of per-row positions (B, T) -> (B, T, C) (rows of a left-padded batch)."""
        n = int(positions.max()) + 1
        if n > self.pe.shape[0]:
            self.pe = sinusoidal_table(2 * n, self.d_model).to(self.pe.device)
        return self.pe[positions]  # (B, T, C)


class LearnedPositionalEmbedding(nn.Module):
    """A trained position table as in GPT-2 and BERT; cannot go past ``max_len``."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))

    def forward(self, t: int, offset: int = 0) -> torch.Tensor:
        if offset + t > self.max_len:
            raise ValueError(
                f"sequence of {offset + t} positions is longer than the learned position "
                f"table ({self.max_len}); learned positions cannot extrapolate")
        return self.weight[offset: offset + t]  # (T, C)

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """Embeddings of per-row positions (B, T) -> (B, T, C)."""
        if int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is past the learned position "
                             f"table ({self.max_len}); learned positions cannot extrapolate")
        return self.weight[positions]  # (B, T, C)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each pair of channels (c, c + hs/2) of q and k by angle pos * theta_c.

    theta_c = base^(-2c/hs). The dot product of a rotated query at i and a rotated key at j
    then depends on i - j only (RoFormer, eq. 16).
    """

    def __init__(self, head_size: int, base: float = 10000.0, max_len: int = 1024):
        super().__init__()
        if head_size % 2:
            raise ValueError(f"RoPE needs an even head size, got {head_size}")
        self.head_size = head_size
        self.base = base
        self._build(max_len)

    def _build(self, n_pos: int, device=None):
        inv_freq = self.base ** (-torch.arange(0, self.head_size, 2, dtype=torch.float64)
                                 / self.head_size)  # (hs/2,)
        angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq  # (T, hs/2)
        self.register_buffer("cos", angle.cos().float().to(device), persistent=False)
        self.register_buffer("sin", angle.sin().float().to(device), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate x of shape (B, nh, T, hs) whose first position is ``offset``, or whose
        positions are ``positions`` (B, T), one row each (a left-padded batch)."""
        t = x.shape[-2]
        end = offset + t if positions is None else int(positions.max()) + 1
        if end > self.cos.shape[0]:
            self._build(2 * end, self.cos.device)
        if positions is None:
            cos = self.cos[offset: offset + t].to(x.dtype)  # (T, hs/2)
            sin = self.sin[offset: offset + t].to(x.dtype)  # (T, hs/2)
        else:
            cos = self.cos[positions][:, None].to(x.dtype)  # (B, 1, T, hs/2)
            sin = self.sin[positions][:, None].to(x.dtype)  # (B, 1, T, hs/2)
        x1, x2 = x[..., : self.head_size // 2], x[..., self.head_size // 2:]  # (B, nh, T, hs/2)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, nh, T, hs)

    def rotate_by(self, x: torch.Tensor, delta: int) -> torch.Tensor:
        """Rotate every position of x (B, nh, T, hs) by ``delta`` more positions.

        Rotations compose, R(p + delta) = R(delta) R(p): a key rotated at position p becomes
        the key rotated at p + delta (a context shift moves kept keys by -shift).
        """
        inv_freq = self.base ** (-torch.arange(0, self.head_size, 2, dtype=torch.float64)
                                 / self.head_size)  # (hs/2,)
        angle = delta * inv_freq  # (hs/2,)
        cos = angle.cos().to(x.device, x.dtype)  # (hs/2,)
        sin = angle.sin().to(x.device, x.dtype)  # (hs/2,)
        x1, x2 = x[..., : self.head_size // 2], x[..., self.head_size // 2:]  # (B, nh, T, hs/2)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, nh, T, hs)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Head slopes m of ALiBi: the geometric sequence 2^(-8/n), 2^(-16/n), ... (Press et al.).

    For a head count that is not a power of two, the paper takes the slopes of the closest
    smaller power of two and fills up with every other slope of the next power of two.
    """
    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(geometric(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    extra = geometric(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(geometric(closest) + extra)


class ALiBi(nn.Module):
    """Adds -m_h * |i - j| to the attention score of query i and key j in head h."""

    def __init__(self, n_head: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def forward(self, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
        """Bias of shape (nh, Tq, Tk); query i sits at absolute position offset + i."""
        q_pos = torch.arange(t_q, device=self.slopes.device)[:, None] + offset  # (Tq, 1)
        k_pos = torch.arange(t_k, device=self.slopes.device)[None, :]  # (1, Tk)
        dist = (q_pos - k_pos).abs().float()  # (Tq, Tk)
        return -self.slopes[:, None, None] * dist  # (nh, Tq, Tk)
