"""Ragged batches: rows of different prompt lengths decoded together, each finishing on its own.

Rows are padded on the left to one width, so that every row's newest token sits in the last
column and one cached step serves them all:

    row 0:  _ _ a b c d  -> next
    row 1:  e f g h i j  -> next

The model is told each row's padding (``GPT.forward(pad=)``): positions count from each row's
first real token (learned and sinusoidal tables, RoPE angles), and a key-padding mask hides
the pads from every query, in the prefill and in every cached step (a pad query sees only
itself, so that no softmax row is empty). ALiBi's bias depends on i - j alone, which padding
on the left does not change, so it needs nothing more.

Finish state: ``finish`` takes rows out of the batch (their cache rows go with them, and
columns that are padding in every row left are dropped), so the rows still decoding do not
pay for the finished ones.

Past the window every row follows ``window_start`` on its own, the rule ``generate_tokens``
uses in "recompute" mode (with ``context_keep``, each row's own first tokens stay): when any
row's window moves, the batch cache is rebuilt from every row's current window (re-padded), so
each row sees exactly the tokens it sees decoded alone.
A batch whose rows move at different steps rebuilds more often than one row would.

Shapes: B rows still decoding, T time, V vocabulary size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..nn.linear import packed_weights
from .generation import check_context, default_context_shift, sample_next, window_start


class RaggedBatch:
    """Prompts of any lengths, decoded as one batch: ``next_logits``, sample, ``push``, and
    ``finish`` the rows that are done; ``rows`` lists the rows (prompt indices) still in it."""

    def __init__(self, model, prompts: Sequence[Sequence[int]],
                 context_shift: int | None = None, pad_id: int = 0, context_keep: int = 0):
        c = model.config
        self.model, self.block_size, self.pad_id = model, c.block_size, pad_id
        self.shift = default_context_shift(c.block_size) if context_shift is None \
            else context_shift
        self.keep = context_keep
        check_context(c.block_size, self.shift, "recompute", c.pos_encoding, self.keep)
        self.device = next(model.parameters()).device
        self.texts = [list(p) for p in prompts]  # prompt + tokens pushed, per row
        self.starts = [self.keep] * len(self.texts)  # each window's first token after the kept
        self.rows = list(range(len(self.texts)))
        self.cache: list | None = None
        self.pad: torch.Tensor | None = None  # (B,) left padding of each row in the cache

    def _pad_arg(self) -> torch.Tensor | None:
        return self.pad if bool(self.pad.any()) else None  # no padding: the plain model

    def _prefill(self) -> torch.Tensor:
        windows = [self.texts[r][:self.keep] + self.texts[r][self.starts[r]:]
                   for r in self.rows]  # ``generation.window``
        width = max(len(w) for w in windows)
        pads = [width - len(w) for w in windows]
        idx = torch.tensor([[self.pad_id] * p + w for p, w in zip(pads, windows, strict=True)],
                           dtype=torch.long, device=self.device)  # (B, T)
        self.pad = torch.tensor(pads, dtype=torch.long, device=self.device)  # (B,)
        self.cache = self.model.new_cache()
        logits, _ = self.model(idx, cache=self.cache, pad=self._pad_arg(),
                               logits_to_keep=1)  # (B, 1, V)
        return logits[:, -1]  # (B, V)

    @torch.inference_mode()
    def next_logits(self) -> torch.Tensor:
        """Next-token logits of every row still in the batch, in ``rows`` order: (B, V)."""
        moved = False
        for r in self.rows:
            start = window_start(len(self.texts[r]), self.starts[r], self.block_size,
                                 self.shift, self.keep)
            moved, self.starts[r] = moved or start != self.starts[r], start
        if self.cache is None or moved:
            return self._prefill()
        last = torch.tensor([[self.texts[r][-1]] for r in self.rows], dtype=torch.long,
                            device=self.device)  # (B, 1)
        logits, _ = self.model(last, cache=self.cache, pad=self._pad_arg())  # (B, 1, V)
        return logits[:, -1]  # (B, V)

    def push(self, tokens: torch.Tensor | Sequence[int]) -> None:
        """Append one token to every row still in the batch: (B,) or (B, 1), ``rows`` order."""
        values = tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else tokens
        for r, token in zip(self.rows, values, strict=True):
            self.texts[r].append(int(token))

    @torch.inference_mode()
    def finish(self, rows: Iterable[int]) -> None:
        """Take these rows (prompt indices) out of the batch. In inference mode, as the
        cache was made: a reorder's second buffer made in it can only be written in it."""
        done = set(rows)
        keep = [i for i, r in enumerate(self.rows) if r not in done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.pad = None
            return
        if self.cache is not None:
            index = torch.tensor(keep, device=self.device)
            self.pad = self.pad[index]
            drop = int(self.pad.min())  # columns that are padding in every row left
            for self_cache, _ in self.cache:
                self_cache.reorder(index)
                self_cache.drop_front(drop)  # positions are per row: nothing to re-rotate
            self.pad = self.pad - drop


@torch.inference_mode()
def generate_ragged(model, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                    temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, context_shift: int | None = None,
                    context_keep: int = 0) -> list[list[int]]:
    """The new tokens of each prompt, decoded as one ragged batch (``max_new_tokens``: one
    number, or one per prompt); unseeded sampling (one draw for the batch), or greedy."""
    wants = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) \
        else list(max_new_tokens)
    batch = RaggedBatch(model, prompts, context_shift, context_keep=context_keep)
    out: list[list[int]] = [[] for _ in prompts]
    batch.finish(r for r in batch.rows if wants[r] == 0)
    with packed_weights(model):
        while batch.rows:
            nxt = sample_next(batch.next_logits(), temperature, top_k, top_p)  # (B, 1)
            batch.push(nxt)
            for r, token in zip(batch.rows, nxt[:, 0].tolist(), strict=True):
                out[r].append(token)
            batch.finish(r for r in batch.rows if len(out[r]) == wants[r])
    return out
