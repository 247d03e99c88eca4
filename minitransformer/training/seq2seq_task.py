"""Translation as a training task: what ``train()`` needs to train an encoder-decoder.

The trainer sees a task only through ``batch``, ``loss``, ``tokens`` and ``sample`` (see
``LanguageModelTask``). Here a batch is a group of sentence pairs of similar length (a
bucket), chosen at random with the trainer's generator, so that exact resume holds:

    src     (B, S)   x_1 .. x_n </s>  <pad> ...
    tgt_in  (B, T)   <s> y_1 .. y_m   <pad> ...    what the decoder reads
    tgt_out (B, T)   y_1 .. y_m </s>  <pad> ...    what it must predict (pads ignored)

``batch_size`` caps the sentences of a batch and ``batch_tokens`` its padded tokens per side,
so a batch of short sentences holds more of them (the paper batched by about 25,000 tokens).
Training uses the label-smoothed loss; validation reports the plain cross-entropy (nats per
target token), so that it reads like any other val loss.
"""

from __future__ import annotations

import torch

from ..data import bucket_batches, collate
from ..models.decoding import greedy_decode


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
        self._batches: dict[tuple[str, int], list[list[int]]] = {}
        for name, (src, _) in splits.items():
            if not src:
                raise ValueError(f"the {name} split is empty")

    def batches(self, split: str, batch_size: int) -> list[list[int]]:
        """The fixed bucketed batches of a split (pair indices), built once per batch size."""
        split = "valid" if split == "val" else split
        key = (split, batch_size)
        if key not in self._batches:
            src, tgt = self.splits[split]
            self._batches[key] = bucket_batches([len(s) for s in src], [len(t) for t in tgt],
                                                batch_size, self.batch_tokens, self.seed)
        return self._batches[key]

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        """One random bucket: (src (B, S), tgt_in (B, T), tgt_out (B, T)), B <= batch_size."""
        batches = self.batches(split, batch_size)
        pick = batches[int(torch.randint(len(batches), (1,), generator=generator))]
        src, tgt = self.splits["valid" if split == "val" else split]
        return collate([src[i] for i in pick], [tgt[i] for i in pick], self.pad_id,
                       self.bos_id, self.eos_id)

    def loss(self, model, batch) -> torch.Tensor:
        src, tgt_in, tgt_out = batch
        smoothing = None if model.training else 0.0  # val loss: plain cross-entropy
        return model(src, tgt_in, tgt_out, label_smoothing=smoothing)[1]

    def tokens(self, batch) -> int:
        return batch[2].numel()  # target positions (fairseq reports target words per second)

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        """Greedy translations of a few fixed validation sentences."""
        if not self.sample_sources:
            return ""
        ids = [tokenizer.encode(s) + [self.eos_id] for s in self.sample_sources]
        width = max(len(s) for s in ids)
        src = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        for i, s in enumerate(ids):
            src[i, :len(s)] = torch.tensor(s)
        out = greedy_decode(model, src.to(device), max_len=max(1, n_tokens)).tokens
        return "\n".join(f"{s}\n  -> {tokenizer.decode(o)}"
                         for s, o in zip(self.sample_sources, out, strict=True))
