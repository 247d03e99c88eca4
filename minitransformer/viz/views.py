"""The attention maps of a checkpoint on one text, per model family.

Each function runs a model with ``return_internals=True`` and returns its
``AttentionView``s: a decoder-only GPT has one (masked self-attention), so has an encoder
(bidirectional self-attention); an encoder-decoder has three (encoder self-attention,
decoder self-attention, cross-attention). Each family's ``attention_views`` picks one.

Shapes: L layers, nh heads, Tq query tokens, Tk key tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from .trace import encode_text, token_labels


def check_choice(value: int, n: int, what: str) -> None:
    """A layer or head number the model has (0 .. n - 1), else the user error naming it."""
    if not 0 <= value < n:
        raise UserError(f"--{what} {value} is out of range: the model has {n} {what}"
                        f"{'s' if n != 1 else ''} (0 .. {n - 1})")


@dataclass
class AttentionView:
    """One kind of attention in a model: weights (L, nh, Tq, Tk) with the tokens they join."""

    name: str
    weights: torch.Tensor  # (L, nh, Tq, Tk)
    query_labels: list[str]
    key_labels: list[str]

    @property
    def n_layer(self) -> int:
        return self.weights.shape[0]

    @property
    def n_head(self) -> int:
        return self.weights.shape[1]


def _stack(maps: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([m[0].float().cpu() for m in maps])  # (L, nh, Tq, Tk)


@torch.no_grad()
def self_attention_views(model, tokenizer, text: str, target: str | None = None,
                         ids: list[int] | None = None, special: dict[int, str] | None = None,
                         prompt: bool = False):
    """One stack's self-attention: masked for a decoder-only GPT, bidirectional for an
    encoder-only (BERT-style) model. ``ids``: the text's ids where the caller encoded it
    (an encoder's [MASK] slots), labelled by ``special`` where it names them; ``prompt``:
    read as a decoder-only model reads a prompt (``encode_text``)."""
    if target is not None:
        raise UserError("--target is for encoder-decoder models; this one has a single stack")
    model.eval()
    if ids is None:
        ids = encode_text(tokenizer, text, model.config.block_size, prompt=prompt)
    device = next(model.parameters()).device
    _, _, internals = model(torch.tensor([ids], device=device), return_internals=True)
    labels = token_labels(tokenizer, ids, special)
    return [AttentionView("self-attention", _stack(internals.attentions), labels, labels)]


@torch.no_grad()
def seq2seq_views(model, tokenizer, text: str, target: str | None = None):
    """Encoder self-, decoder self- and decoder-to-encoder cross-attention.

    The source is ``text </s>``, the decoder reads ``<s> target`` (the model's own greedy
    translation when no target is given), as in training.
    """
    model.eval()
    c = model.config
    src = encode_text(tokenizer, text, c.block_size - 1) + [c.eos_id]
    device = next(model.parameters()).device
    src_t = torch.tensor([src], device=device)  # (1, S)
    if target is None:
        out = model.translate(src_t)[0]
    else:
        out = encode_text(tokenizer, target, c.block_size - 1, what="target")
    tgt = [c.bos_id] + out[: c.block_size - 1]
    _, _, internals = model(src_t, torch.tensor([tgt], device=device), return_internals=True)
    src_labels = token_labels(tokenizer, src, special={c.eos_id: "</s>"})
    tgt_labels = token_labels(tokenizer, tgt, special={c.bos_id: "<s>", c.eos_id: "</s>"})
    enc, dec = internals.encoder, internals.decoder
    return [AttentionView("encoder self-attention", _stack(enc.attentions), src_labels,
                          src_labels),
            AttentionView("decoder self-attention", _stack(dec.attentions), tgt_labels,
                          tgt_labels),
            AttentionView("cross-attention", _stack(dec.cross_attentions), tgt_labels,
                          src_labels)]
