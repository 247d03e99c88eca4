"""Next-token prediction on one token stream: the task that trains a ``GPT``.

A batch is ``batch_size`` random windows x (B, T) of the stream and their targets y (B, T),
the same windows shifted by one token; the loss is the cross-entropy of every position's
next token (nanoGPT's ``get_batch`` and loss). See ``task.py`` for what the trainer calls.

Shapes: B batch, T time (block_size).
"""

from __future__ import annotations

import torch

from ..errors import UserError
from .task import Batch, WindowTask


class LanguageModelTask(WindowTask):
    """Next-token prediction on one token stream: batches, loss, sample."""

    family = "gpt"

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """(x (B, T), y (B, T)): random windows and their next tokens."""
        return self.windows(split, batch_size, generator)

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        try:  # start from a newline where the tokenizer has one, else from a val token
            ids = tokenizer.encode("\n")
        except UserError:
            ids = []
        idx = torch.tensor([ids or self.data["val"][:1].tolist()], device=device)  # (1, T)
        out = model.generate(idx, n_tokens, temperature=0.8, top_k=50, seed=0)
        return tokenizer.decode(out[0, idx.shape[1]:].tolist())
