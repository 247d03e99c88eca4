"""The masked-language-model task: what the trainer needs to train an ``EncoderModel``.

A ``WindowTask`` (see ``task.py``) like ``LanguageModelTask``: each batch is ``batch_size``
random windows of the token stream, corrupted as BERT does (15% chosen; 80% [MASK], 10%
random, 10% kept), with the original ids as targets at the chosen positions. The target
tokens that the loss is normalised by are the chosen positions only.
The corruption draws from the trainer's batch generator, so a resumed run sees the same
batches. Evaluation adds masked-token accuracy beside the loss, and the accuracy of always
guessing the most frequent training token, the baseline to beat.

Shapes: B batch, T time (block_size), V vocabulary size.
"""

from __future__ import annotations

import torch

from ..data.shards import token_counts
from ..models.mlm import IGNORE, mask_tokens, masked_accuracy
from .task import Batch, WindowTask, token_cross_entropy

MASK_SHOWN = "▒"  # how a masked position is printed in samples


def head_sees_chosen_only(x: torch.Tensor) -> bool:
    """Whether only the chosen positions go through the masked-LM head: on a CPU, where it
    makes a step of all-MiniLM-L6-v2's sizes 1.8x faster, compiled or not. On a GPU the
    boolean selection waits for the device and splits a compiled graph, and the saving is
    gone: an H200 took 22 against 23 ms a step eagerly, 18 against 16 ms compiled
    (docs/BENCHMARKS.md)."""
    return x.device.type == "cpu"


class MaskedLMTask(WindowTask):
    """Masked-token prediction on one token stream (BERT's pre-training task #1)."""

    family = "encoder"

    def __init__(self, train_ids: torch.Tensor, val_ids: torch.Tensor, block_size: int,
                 mask_id: int, vocab_size: int, mask_prob: float = 0.15):
        super().__init__(train_ids, val_ids, block_size, vocab_size)
        self.mask_id = mask_id
        self.mask_prob = mask_prob
        counts = token_counts(train_ids, vocab_size)  # (V,)
        self.most_frequent = int(counts.argmax())

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """(inputs (B, T), targets (B, T)); targets are IGNORE where nothing was chosen."""
        ids, _ = self.windows(split, batch_size, generator)  # (B, T)
        return mask_tokens(ids, self.mask_id, self.vocab_size, generator, self.mask_prob)

    def loss_terms(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of the chosen positions' losses, their number). On a CPU only they go through
        the masked-LM head (``head_sees_chosen_only``; ``EncoderModel.forward``'s
        ``targets_only``)."""
        x, y = batch
        if not head_sees_chosen_only(x):
            return super().loss_terms(model, batch)
        logits = model(x, y, targets_only=True)[0]  # (N, V)
        return token_cross_entropy(logits, y[y != IGNORE])

    @torch.no_grad()
    def accuracy(self, model, split: str, batch_size: int, iters: int, device,
                 seed: int = 0) -> tuple[float, float]:
        """(masked-token accuracy, most-frequent-token baseline) over ``iters`` batches drawn
        with a fixed seed (the same positions for both)."""
        gen = torch.Generator().manual_seed(seed)
        was_training = model.training
        model.eval()
        right = base = total = 0
        for _ in range(iters):
            x, y = (t.to(device) for t in self.batch(split, batch_size, gen))
            if head_sees_chosen_only(x):
                logits, _ = model(x, y, targets_only=True)  # (N, V)
                chosen = y[y != IGNORE]  # (N,)
                r, n = int((logits.argmax(dim=-1) == chosen).sum()), chosen.numel()
            else:
                r, n = masked_accuracy(model(x)[0].cpu(), y.cpu())  # logits (B, T, V)
            right, total = right + r, total + n
            base += int((y == self.most_frequent).sum())
        model.train(was_training)
        return right / max(total, 1), base / max(total, 1)

    def show(self, tokenizer, ids: list[int], masked: list[bool]) -> str:
        """Text of ids with masked positions printed as MASK_SHOWN (runs decoded together)."""
        out, run = [], []
        for i, m in zip(ids, masked, strict=True):
            if m:
                out.append(tokenizer.decode(run) + MASK_SHOWN)
                run = []
            else:
                run.append(i)
        return "".join(out) + tokenizer.decode(run)

    @torch.no_grad()
    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        """A fill-in-the-mask example from the val split, and the val accuracy."""
        gen = torch.Generator().manual_seed(0)
        t = max(8, min(self.block_size, n_tokens))
        window = self.data["val"][:t][None]  # (1, T)
        _, targets = mask_tokens(window, self.mask_id, self.vocab_size, gen, self.mask_prob)
        chosen = targets != IGNORE  # (1, T)
        inputs = window.masked_fill(chosen, self.mask_id)  # every chosen position -> [MASK]
        was_training = model.training
        model.eval()
        logits, _ = model(inputs.to(device))  # (1, T, V)
        model.train(was_training)
        pred = logits.argmax(dim=-1).cpu()  # (1, T)
        filled = torch.where(chosen, pred, window)[0].tolist()
        right, total = masked_accuracy(logits.cpu(), targets)
        acc, base = self.accuracy(model, "val", 16, 4, device)  # a quick look: 64 windows
        return (f"{self.show(tokenizer, inputs[0].tolist(), chosen[0].tolist())}\n"
                f"-> {self.show(tokenizer, filled, [i == self.mask_id for i in filled])}\n"
                f"({right}/{total} filled right; a quick look at 64 val windows: masked-token "
                f"accuracy {acc:.1%}, most-frequent-token baseline {base:.1%})")
