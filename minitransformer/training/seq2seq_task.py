"""Translation as a training task: what ``train()`` needs to train an encoder-decoder.

A ``Task`` (see ``task.py``). A batch is a group of sentence pairs of similar length (a
bucket), chosen at random with the trainer's generator, so that exact resume holds:

    src     (B, S)   x_1 .. x_n </s>  <pad> ...
    tgt_in  (B, T)   <s> y_1 .. y_m   <pad> ...    what the decoder reads
    tgt_out (B, T)   y_1 .. y_m </s>  <pad> ...    what it must predict (pads ignored)

``batch_size`` caps the sentences of a batch and ``batch_tokens`` its padded tokens per side,
so a batch of short sentences holds more of them (the paper batched by about 25,000 tokens).

One bucket is the global batch of an optimizer step. Under torchrun and with grad_accum its
pairs are split as evenly as possible over the P = processes x grad_accum parts and the loss
is divided by the bucket's target tokens, so that N processes compute what one does. Every
training bucket therefore needs at least P pairs: a bucket closed by a cap holds at least
min(batch_size, batch_tokens / longest pair) of them, and the leftover last bucket, when it
holds fewer than P, joins the one before it (``check_split`` sets P and checks the rest).

Training uses the label-smoothed loss; validation reports the plain cross-entropy (nats per
target token, pads ignored), so that it reads like any other val loss.
"""

from __future__ import annotations

import torch

from ..data import bucket_batches, collate, source_ids
from ..errors import UserError
from ..models.decoding import greedy_decode, pad_batch
from .task import HEALTH_ROWS, Batch, split_rows


class Seq2SeqTask:
    """Sentence pairs split into train / valid, served as length-bucketed batches."""

    family = "seq2seq"

    def __init__(self, splits: dict[str, tuple[list[list[int]], list[list[int]]]],
                 pad_id: int, bos_id: int, eos_id: int, batch_tokens: int,
                 sample_sources: list[str] | None = None, seed: int = 0):
        """splits: name -> (source ids ending in </s>, bare target ids), already filtered."""
        self.splits = splits
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.batch_tokens = batch_tokens
        self.sample_sources = sample_sources or []
        self.seed = seed
        self.parts = 1  # processes x grad_accum that each training bucket is split over
        self._batches: dict[tuple[str, int, int], list[list[int]]] = {}
        for name, (src, _) in splits.items():
            if not src:
                raise ValueError(f"the {name} split is empty")

    def batches(self, split: str, batch_size: int) -> list[list[int]]:
        """The fixed bucketed batches of a split (pair indices), built once per batch size."""
        split = "valid" if split == "val" else split
        parts = self.parts if split == "train" else 1
        key = (split, batch_size, parts)
        if key not in self._batches:
            src, tgt = self.splits[split]
            found = bucket_batches([len(s) for s in src], [len(t) for t in tgt],
                                   batch_size, self.batch_tokens, self.seed)
            if len(found) > 1 and len(found[-1]) < parts:  # the leftover of the longest pairs
                found = [*found[:-2], found[-2] + found[-1]]
            self._batches[key] = found
        return self._batches[key]

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """One random bucket: (src (B, S), tgt_in (B, T), tgt_out (B, T)), B <= batch_size."""
        batches = self.batches(split, batch_size)
        pick = batches[int(torch.randint(len(batches), (1,), generator=generator))]
        src, tgt = self.splits["valid" if split == "val" else split]
        return collate([src[i] for i in pick], [tgt[i] for i in pick], self.pad_id,
                       self.bos_id, self.eos_id)

    def check_split(self, batch_size: int, world_size: int, grad_accum: int) -> None:
        """Every training bucket must hold at least processes x grad_accum pairs."""
        parts = self.parts = world_size * grad_accum
        smallest = min(len(b) for b in self.batches("train", batch_size))
        if smallest >= parts:
            return
        src, tgt = self.splits["train"]
        longest = max(max(len(s), len(t) + 1) for s, t in zip(src, tgt, strict=True))
        raise UserError(
            f"seq2seq batches are buckets of sentence pairs, and each step splits one bucket "
            f"over processes x grad_accum ({world_size} x {grad_accum} = {parts} parts), so "
            f"every bucket needs at least {parts} pairs; the smallest holds {smallest}. Raise "
            f"--batch_size to at least {parts} and --batch_tokens to at least "
            f"{parts * longest} ({parts} x the longest training pair, {longest} tokens), or "
            f"use fewer processes or a smaller --grad_accum")

    def split(self, batch: Batch, rank: int, world_size: int, micro: int,
              grad_accum: int) -> Batch:
        """This part's pairs of the bucket: pair counts of the parts differ by at most one."""
        if batch[0].shape[0] < world_size * grad_accum:
            raise ValueError(f"a bucket of {batch[0].shape[0]} pairs cannot be split over "
                             f"{world_size * grad_accum} parts (call check_split first)")
        return split_rows(batch, rank, world_size, micro, grad_accum)

    def loss_terms(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, target tokens): label-smoothed in training, plain in evaluation."""
        src, tgt_in, tgt_out = batch
        smoothing = None if model.training else 0.0  # val loss: plain cross-entropy
        total = model(src, tgt_in, tgt_out, label_smoothing=smoothing, reduction="sum")[1]
        return total, (tgt_out != self.pad_id).sum()

    def loss(self, model, batch: Batch) -> torch.Tensor:
        """Mean loss per target token of one batch."""
        total, n = self.loss_terms(model, batch)
        return total / n.clamp(min=1)

    def target_tokens(self, batch: Batch) -> int:
        return int((batch[2] != self.pad_id).sum())

    def tokens(self, batch: Batch) -> int:
        return batch[2].numel()  # target positions (fairseq reports target words per second)

    def health_batch(self, n_tokens: int) -> Batch:
        """HEALTH_ROWS pairs of one val bucket (sentences: well under n_tokens tokens)."""
        return self.batch("val", HEALTH_ROWS, torch.Generator().manual_seed(0))

    def attention_maps(self, internals) -> dict[str, list[torch.Tensor]]:
        """Encoder self-, decoder self- and cross-attention: enc_/dec_/cross_attn_entropy_i."""
        return {"enc_": internals.encoder.attentions, "dec_": internals.decoder.attentions,
                "cross_": internals.decoder.cross_attentions}

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        """Greedy translations of a few fixed validation sentences."""
        if not self.sample_sources:
            return ""
        src = pad_batch(source_ids(tokenizer, self.sample_sources, self.eos_id), self.pad_id)
        # what `translate` prints (at most 1.5 x the source + 10 tokens, inside a learned
        # position table), cut to sample_tokens: a young model that never ends a sentence
        # would otherwise write sample_tokens at every evaluation. Greedy decoding's first
        # n tokens do not depend on how many follow.
        out = [o[:max(1, n_tokens)] for o in greedy_decode(model, src.to(device)).tokens]
        return "\n".join(f"{s}\n  -> {tokenizer.decode(o)}"
                         for s, o in zip(self.sample_sources, out, strict=True))
