"""Masked-language modelling as in BERT (Devlin et al. 2019, section 3.1, "Task #1").

Corruption: choose 15% of the positions; of those, 80% become [MASK], 10% a random token and
10% stay as they are. The model predicts the original token at every chosen position only.

Output head ("bert"): logits = LayerNorm(act(h W_t + b_t)) E^T + b, with E the token
embedding when tied; "linear" drops the transform: logits = h E^T + b.

Shapes: B batch, T time, C channels (n_embd), V vocabulary size.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from ..nn.feedforward import Activation, make_activation

IGNORE = -1  # target value of positions that are not predicted (cross_entropy ignore_index)


class MaskedLMHead(nn.Module):
    """Implements BERT's masked-LM output layer: transform, then project onto the vocabulary."""

    def __init__(self, d_model: int, vocab_size: int, kind: Literal["bert", "linear"] = "bert",
                 activation: Activation = "gelu", eps: float = 1e-12):
        super().__init__()
        if kind not in ("bert", "linear"):
            raise ValueError(f"unknown masked-LM head {kind!r}: choose bert or linear")
        self.transform = None
        if kind == "bert":
            self.transform = nn.Sequential(nn.Linear(d_model, d_model), make_activation(activation),
                                           nn.LayerNorm(d_model, eps=eps))
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)  # tied to the embedding
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # one output bias per token

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.transform is not None:
            h = self.transform(h)  # (B, T, C)
        return self.decoder(h) + self.bias  # (B, T, V)


def mask_tokens(ids: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator,
                mask_prob: float = 0.15, special: torch.Tensor | None = None):
    """BERT's corruption of a batch of ids (B, T); returns (inputs (B, T), targets (B, T)).

    Each position is chosen with probability ``mask_prob`` (at least one per row, so every
    row has something to predict); a chosen position's input becomes ``mask_id`` with
    probability 0.8, a uniformly random token with 0.1, and stays unchanged with 0.1. Targets
    hold the original id at chosen positions and IGNORE elsewhere. ``special`` (B, T) bool
    marks positions never chosen (e.g. padding).
    """
    b, t = ids.shape
    u = torch.rand(b, t, generator=generator)  # (B, T)
    if special is not None:
        u = u.masked_fill(special, 2.0)  # never chosen
    chosen = u < mask_prob  # (B, T)
    first = u.argmin(dim=1)  # (B,) the most eligible position of each row
    chosen[torch.arange(b), first] = True
    if special is not None:
        chosen &= ~special
    targets = ids.masked_fill(~chosen, IGNORE)  # (B, T)
    r = torch.rand(b, t, generator=generator)  # (B, T): which of the three treatments
    random_ids = torch.randint(vocab_size, (b, t), generator=generator)  # (B, T)
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (r >= 0.8) & (r < 0.9), random_ids, inputs)  # (B, T)
    return inputs, targets


def masked_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct, total) argmax predictions over the positions whose target is not IGNORE."""
    keep = targets != IGNORE  # (B, T)
    correct = (logits.argmax(dim=-1) == targets) & keep  # (B, T)
    return int(correct.sum()), int(keep.sum())
