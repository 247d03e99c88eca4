"""The attention maps of a checkpoint on one text, per model family.

A model family maps to one small function that runs the model with ``return_internals=True``
and returns its ``AttentionView``s: a decoder-only GPT has one (masked self-attention); an
encoder-decoder has three (encoder self-attention, decoder self-attention, cross-attention).
Adding a family means adding one entry to ``VIEW_BUILDERS``.

Shapes: L layers, nh heads, Tq query tokens, Tk key tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from .trace import encode_text, token_labels


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
def gpt_views(model, tokenizer, text: str, target: str | None = None) -> list[AttentionView]:
    """Masked self-attention of a decoder-only model."""
    if target is not None:
        raise UserError("--target is for encoder-decoder models; this is a decoder-only GPT")
    model.eval()
    ids = encode_text(tokenizer, text, model.config.block_size)
    device = next(model.parameters()).device
    _, _, internals = model(torch.tensor([ids], device=device), return_internals=True)
    labels = token_labels(tokenizer, ids)
    return [AttentionView("self-attention", _stack(internals.attentions), labels, labels)]


def _seq2seq_parts(model, tokenizer, text: str, target: str | None):
    """(source ids, target ids, source labels, target labels) for an encoder-decoder."""
    src_tok = getattr(tokenizer, "source", tokenizer)
    tgt_tok = getattr(tokenizer, "target", tokenizer)
    max_len = getattr(model.config, "block_size", None) or getattr(model.config, "max_len", 1024)
    src = encode_text(src_tok, text, max_len)
    if target is None:
        raise UserError("an encoder-decoder model needs --target TEXT as well (the decoder's "
                        "side, e.g. the translation)")
    tgt = encode_text(tgt_tok, target, max_len, what="target")
    return src, tgt, token_labels(src_tok, src), token_labels(tgt_tok, tgt)


@torch.no_grad()
def seq2seq_views(model, tokenizer, text: str, target: str | None = None):
    """Encoder self-, decoder self- and decoder-to-encoder cross-attention."""
    model.eval()
    src, tgt, src_labels, tgt_labels = _seq2seq_parts(model, tokenizer, text, target)
    device = next(model.parameters()).device
    out = model(torch.tensor([src], device=device), torch.tensor([tgt], device=device),
                return_internals=True)
    internals = out[-1]
    enc, dec = _encoder_decoder_internals(internals)
    return [AttentionView("encoder self-attention", _stack(enc.attentions), src_labels,
                          src_labels),
            AttentionView("decoder self-attention", _stack(dec.attentions), tgt_labels,
                          tgt_labels),
            AttentionView("cross-attention", _stack(dec.cross_attentions), tgt_labels,
                          src_labels)]


def _encoder_decoder_internals(internals):
    """(encoder Internals, decoder Internals) from what an encoder-decoder returns."""
    if isinstance(internals, (tuple, list)) and len(internals) == 2:
        return internals
    enc = getattr(internals, "encoder", None)
    dec = getattr(internals, "decoder", None)
    if enc is None or dec is None:
        raise RuntimeError("cannot find encoder and decoder internals in the model's output")
    return enc, dec


VIEW_BUILDERS = {"gpt": gpt_views, "seq2seq": seq2seq_views}


def attention_views(model, tokenizer, family: str, text: str,
                    target: str | None = None) -> list[AttentionView]:
    """The attention views of a model of the given family on ``text``."""
    builder = VIEW_BUILDERS.get(family)
    if builder is None:
        raise UserError(f"attention maps are not available for model family {family!r} "
                        f"(known: {', '.join(VIEW_BUILDERS)})")
    return builder(model, tokenizer, text, target)
