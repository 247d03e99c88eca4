"""The affine map every projection of the Transformer uses: y = x W^T + b.

``Linear`` is ``torch.nn.Linear`` (same parameters, same state dict, same computation): one
class that every projection of the model is, so that LoRA can find its targets.

Decoding one token feeds a single row through each projection, a matrix-vector product that
reads every weight once. An earlier version wrote it as one dot product per output
(``torch.linalg.vecdot``); in current PyTorch that is an elementwise product through a
temporary as large as W and then a sum, 4-7x slower than BLAS on one row (384 x 1152: 68 us
against 518 us, one thread, docs/BENCHMARKS.md), so every input goes to ``F.linear``.

Shapes: N rows of input, K = in_features, M = out_features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """Implements y = x W^T + b."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., M)
