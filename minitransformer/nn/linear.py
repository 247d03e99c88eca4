"""The affine map every projection of the Transformer uses: y = x W^T + b.

``Linear`` is ``torch.nn.Linear`` (same parameters, same state dict) with one fast path.
Decoding one token feeds a single row through each projection, a matrix-vector product that
must read every weight once. On a CPU, BLAS's matrix-vector kernel (MKL's sgemv) streams
those weights at well under the memory's speed (about 9 GB/s of 24 GB/s on one core of the
machine in docs/BENCHMARKS.md); writing the same product as one dot product per output,
y_j = <W_j, x> + b_j (``torch.linalg.vecdot``), gets through a block's six matrices about
1.4x faster (and uses the second core, which MKL's kernel does not).

Shapes: N rows of input, K = in_features, M = out_features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The dot products go through a temporary as large as W: beyond 16 MB (a large vocabulary's
# output layer) BLAS is left to it.
VECDOT_MAX = 1 << 22


class Linear(nn.Linear):
    """Implements y = x W^T + b; a single fp32 input row on a CPU takes the dot-product path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] and x.device.type == "cpu" and x.dtype == torch.float32 \
                and self.weight.dtype == torch.float32 and self.weight.numel() <= VECDOT_MAX \
                and not torch.is_autocast_enabled("cpu"):
            y = torch.linalg.vecdot(self.weight, x.reshape(1, -1))  # (M,): y_j = <W_j, x>
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*x.shape[:-1], -1)  # (..., M)
        return F.linear(x, self.weight, self.bias)  # (..., M)
