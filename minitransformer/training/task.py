"""The Task protocol: everything the trainer asks of a training task, and nothing more.

One optimizer step, as the trainer runs it with P = processes x grad_accum parts:

    batch  <- task.batch("train", batch_size, gen)        the global batch, the same on every
                                                          rank (one generator, one seed)
    N      <- task.target_tokens(batch)                   its target tokens (known to every
                                                          rank without communication)
    part   <- task.split(batch, rank, world, m, accum)    rank's rows for micro-step m
    s, n   <- task.loss_terms(model, part)                sum of per-token losses, and n
    L      =  sum over all parts of s / N                 the mean loss per target token

so that the gradient, and the logged train loss, do not depend on how the batch was split:
N processes equal one. A window task's parts hold equal rows (batch_size must divide by P);
a token-bucketed task (seq2seq) splits one bucket's rows as evenly as it can and needs at
least P rows in every bucket (``check_split`` says so before training starts).

``WindowTask`` is the shared base of tasks whose batches are (inputs, targets) windows of a
token stream (``LanguageModelTask``, ``MaskedLMTask``); ``as_task`` adapts a task written to
the earlier four-method interface (batch, loss, tokens, sample).

Shapes: B batch, T time (block_size), V vocabulary size.
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from ..data import get_batch
from ..errors import UserError
from ..models.mlm import IGNORE  # the target id GPT and EncoderModel both skip (-1)

Batch = tuple[torch.Tensor, ...]
HEALTH_ROWS = 8  # most rows of the fixed val batch whose attention the health guard measures


# C0 and C1 but tab and newline; Unicode's bidirectional marks, embeddings, overrides and
# isolates, which reorder what follows them on the line; its line and paragraph separators
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\u2028\u2029]")


def terminal_text(text: str, limit: int | None = None) -> str:
    """A sample as the terminal may show it: control characters other than tab and newline
    written as escapes (``\\x1b``, ``\\u202e``). An untrained byte-level model's sample can
    hold any byte, and an escape sequence would move the cursor or clear the screen; a
    right-to-left override would show the rest of the line backwards. ``limit``: the first
    ``limit`` characters of ``text`` only, cut before escaping (so no escape is cut)."""
    return CONTROL.sub(escape, text[:limit])


def escape(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


@runtime_checkable
class Task(Protocol):
    """What ``train`` and ``estimate_loss`` call; batches are tuples of batch-first tensors."""

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """A global batch of ``split`` drawn with ``generator`` (host side)."""

    def check_split(self, batch_size: int, world_size: int, grad_accum: int) -> None:
        """Raise UserError unless every batch gives each of the world_size x grad_accum
        parts at least one row."""

    def split(self, batch: Batch, rank: int, world_size: int, micro: int,
              grad_accum: int) -> Batch:
        """The rows of ``batch`` for process ``rank``'s micro-step ``micro``; the parts of all
        ranks and micro-steps cover every row once."""

    def loss_terms(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of per-token losses, number of target tokens), both scalar tensors."""

    def target_tokens(self, batch: Batch) -> int:
        """The target tokens of a host-side batch (what ``loss_terms`` counts)."""

    def tokens(self, batch: Batch) -> int:
        """Tokens processed, from shapes (no device sync): the tokens/s of the progress bar."""

    def health_batch(self, n_tokens: int) -> Batch:
        """A fixed val batch of at most about ``n_tokens`` tokens (the same at every call)."""

    def attention_maps(self, internals) -> dict[str, list[torch.Tensor]]:
        """Column prefix -> per-layer attention weights, from the model's internals."""

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        """A short text to print at each evaluation."""


def split_rows(batch: Batch, rank: int, world_size: int, micro: int, grad_accum: int) -> Batch:
    """Part rank * grad_accum + micro of P = world_size * grad_accum contiguous row blocks,
    whose sizes differ by at most one (all equal when P divides the rows)."""
    parts = world_size * grad_accum
    index = rank * grad_accum + micro
    per, extra = divmod(batch[0].shape[0], parts)
    start = index * per + min(index, extra)
    stop = start + per + (index < extra)
    return tuple(t[start:stop] for t in batch)


def check_divisible(batch_size: int, world_size: int, grad_accum: int) -> None:
    """Fixed-size batches: every part gets batch_size / (world_size x grad_accum) rows."""
    if batch_size % (world_size * grad_accum):
        raise UserError(f"batch_size ({batch_size}) must be a multiple of processes x "
                        f"grad_accum ({world_size} x {grad_accum})")


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_i -log p(y_i), count) over the targets that are not IGNORE; logits (B, T, V),
    targets (B, T). The models' own cross-entropy, summed instead of averaged."""
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")
    return loss, (targets != IGNORE).sum()


def single_stack_maps(internals) -> dict[str, list[torch.Tensor]]:
    """One stack of layers (GPT's decoder, the encoder): columns attn_entropy_0, ..."""
    return {"": internals.attentions}


class RowSplit:
    """Batches of equal rows: each of the world_size x grad_accum parts takes as many."""

    def check_split(self, batch_size: int, world_size: int, grad_accum: int) -> None:
        check_divisible(batch_size, world_size, grad_accum)

    def split(self, batch: Batch, rank: int, world_size: int, micro: int,
              grad_accum: int) -> Batch:
        return split_rows(batch, rank, world_size, micro, grad_accum)


class WindowTask(RowSplit):
    """Batches of ``batch_size`` windows of ``block_size`` tokens: (inputs (B, T), targets
    (B, T)), targets IGNORE where nothing is predicted. Subclasses define ``batch`` and
    ``sample``."""

    def __init__(self, train_ids: torch.Tensor, val_ids: torch.Tensor, block_size: int,
                 vocab_size: int | None = None):
        self.data = {"train": train_ids, "val": val_ids}
        self.block_size, self.vocab_size = block_size, vocab_size

    def windows(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        x, y = get_batch(self.data[split], batch_size, self.block_size, generator)
        if self.vocab_size and (top := max(int(x.max()), int(y[:, -1].max()))) >= self.vocab_size:
            # prepared ids gone wrong: an embedding's IndexError otherwise
            raise UserError(f"the {split} data holds token id {top}, past the model's "
                            f"{self.vocab_size} ids: it is damaged or from another tokenizer; "
                            f"prepare it again")
        return x, y

    def loss_terms(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = model(x)[0]  # (B, T, V)
        return token_cross_entropy(logits, y)

    def loss(self, model, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy per target token of one batch (the model's own loss)."""
        x, y = batch
        return model(x, y)[1]

    def target_tokens(self, batch: Batch) -> int:
        return int((batch[1] != IGNORE).sum())

    def tokens(self, batch: Batch) -> int:
        return batch[0].numel()

    def health_batch(self, n_tokens: int) -> Batch:
        rows = max(1, min(HEALTH_ROWS, n_tokens // self.block_size))
        return self.batch("val", rows, torch.Generator().manual_seed(0))

    def attention_maps(self, internals) -> dict[str, list[torch.Tensor]]:
        return single_stack_maps(internals)


class LegacyTask(RowSplit):
    """A task with only ``batch``, ``loss`` (a mean), ``tokens`` and ``sample``: its rows are
    split like a window task's, and its mean loss weighs as ``tokens`` targets."""

    def __init__(self, task):
        self.task = task

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        return self.task.batch(split, batch_size, generator)

    def loss_terms(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.task.tokens(batch)
        loss = self.task.loss(model, batch)
        return loss * n, torch.tensor(n, device=loss.device)

    def target_tokens(self, batch: Batch) -> int:
        return self.task.tokens(batch)

    def tokens(self, batch: Batch) -> int:
        return self.task.tokens(batch)

    def health_batch(self, n_tokens: int) -> Batch:
        return self.task.batch("val", HEALTH_ROWS, torch.Generator().manual_seed(0))

    def attention_maps(self, internals) -> dict[str, list[torch.Tensor]]:
        return single_stack_maps(internals)

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        return self.task.sample(model, tokenizer, n_tokens, device)


def as_task(task) -> Task:
    """``task`` itself when it has every method of ``Task``, else a ``LegacyTask`` around it."""
    return task if isinstance(task, Task) else LegacyTask(task)
