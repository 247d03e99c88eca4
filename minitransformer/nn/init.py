"""Weight initialisation schemes.

- "gpt2": every Linear and Embedding weight ~ N(0, 0.02); the projections that write into
  the residual stream (attention W^O and the FFN's second layer) ~ N(0, 0.02 / sqrt(2 n_layer)),
  so the residual sum does not grow with depth (GPT-2 paper, section 2.3). Biases zero.
- "xavier": Xavier/Glorot uniform on every matrix, as the paper's reference code
  (tensor2tensor) and the Annotated Transformer do. Biases zero.
LayerNorms and RMSNorms start at weight 1 (and bias 0) in both.
"""

from __future__ import annotations

import math

from torch import nn

from .norm import NORMS
from .positional import LearnedPositionalEmbedding

RESIDUAL_PROJECTIONS = ("out_proj", "ffn.proj")


def init_weights(model: nn.Module, scheme: str, n_layer: int) -> None:
    """Initialise ``model`` in place with the "gpt2" or "xavier" scheme."""
    if scheme not in ("gpt2", "xavier"):
        raise ValueError(f"unknown init {scheme!r}: choose gpt2 or xavier")
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if scheme == "xavier":
                nn.init.xavier_uniform_(module.weight)
            else:
                std = residual_std if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
            if scheme == "xavier":
                nn.init.xavier_uniform_(module.weight)
            else:
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, NORMS):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:  # RMSNorm has none
                nn.init.zeros_(module.bias)
