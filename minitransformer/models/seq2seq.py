"""The paper's encoder-decoder Transformer ("Attention Is All You Need", Figure 1).

    x0 = E[src] * sqrt(d_model) + PE            (section 3.4 and 3.5; E shared by both sides)
    memory = Encoder(x0)                        N x (self-attention, FFN)
    y0 = E[tgt_in] * sqrt(d_model) + PE         tgt_in = <s> y_1 ... y_{m-1} (shifted right)
    h = Decoder(y0, memory)                     N x (masked self-attention, cross-attention, FFN)
    logits = h E^T                              output layer tied to the embedding (3.4)
    loss = label-smoothed cross-entropy         epsilon_ls = 0.1 (section 5.4), pad ignored

Positions: "sinusoidal" / "learned" are added to the embeddings above; "rope" / "alibi" act
inside each stack's self-attention instead (the stacks handle that); cross-attention never
has a positional term (a target position has no natural distance to a source position).

Shapes: B batch, S source length, T target length, C channels (n_embd), V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..config import Seq2SeqConfig
from ..nn.beam_cache import BeamCache
from ..nn.block import Decoder, Encoder, Internals
from ..nn.init import init_weights
from ..nn.kv_cache import KVCache, StoragePool
from ..nn.linear import Linear
from ..nn.mask import key_padding_mask
from .gpt import absolute_positions


def label_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 epsilon: float, ignore_index: int,
                                 reduction: Literal["mean", "sum"] = "mean") -> torch.Tensor:
    """Implements label smoothing (Szegedy et al. 2016; the paper's section 5.4).

    The one-hot target becomes q = (1 - eps) * onehot(y) + eps / V on every class, and the
    loss is the cross-entropy -sum_v q_v log p_v = (1 - eps) * NLL(y) + eps * mean_v(-log p_v),
    averaged over the positions whose target is not ``ignore_index`` (``reduction="sum"``:
    summed over them, for a trainer that divides by the target tokens of a whole batch split
    across processes). Same value as ``F.cross_entropy(..., label_smoothing=eps,
    ignore_index=..., reduction=...)``.

    logits: (N, V), targets: (N,). Returns a scalar.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    keep = targets != ignore_index  # (N,)
    safe = targets.masked_fill(~keep, 0)  # any valid id; these rows are dropped below
    nll = -logp.gather(-1, safe[:, None]).squeeze(-1)  # (N,)
    uniform = -logp.mean(dim=-1)  # (N,) cross-entropy against the uniform distribution
    per_token = (1.0 - epsilon) * nll + epsilon * uniform  # (N,)
    total = (per_token * keep).sum()
    if reduction == "sum":
        return total
    # An all-padding batch gives 0 (with a gradient path), not NaN.
    return total / keep.sum().clamp(min=1)


@dataclass
class Seq2SeqInternals:
    """Attention maps and hidden states of both stacks (the ``nn`` stacks' ``Internals``).

    encoder.attentions: per layer (B, nh, S, S); decoder.attentions: per layer (B, nh, T, T);
    decoder.cross_attentions: per layer (B, nh, T, S), each row a distribution over source
    tokens (where the decoder looked while producing each target token).
    """

    encoder: Internals
    decoder: Internals

    @property
    def cross_attentions(self) -> list[torch.Tensor]:
        return self.decoder.cross_attentions


class Seq2SeqTransformer(nn.Module):
    """The encoder-decoder built from the shared ``Encoder`` and ``Decoder`` stacks."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)  # shared source/target embedding E
        self.pos_emb = absolute_positions(c.pos_encoding, c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)  # dropout on embeddings + positions (section 5.4)
        stack = dict(d_model=c.n_embd, n_head=c.n_head, d_ff=c.ffn_width, dropout=c.dropout,
                     bias=c.bias, activation=c.activation, norm_position=c.norm_position,
                     attn_impl=c.attn_impl, layer_norm_eps=c.layer_norm_eps,
                     pos_encoding=c.pos_encoding, max_len=c.block_size)
        self.encoder = Encoder(c.encoder_layers, **stack)
        self.decoder = Decoder(c.decoder_layers, cross_attention=True, **stack)
        self.lm_head = Linear(c.n_embd, c.vocab_size, bias=False)
        init_weights(self, c.init, c.encoder_layers + c.decoder_layers)
        if c.scale_embeddings:
            # E ~ N(0, d^-0.5), so that E * sqrt(d) has unit variance, as in the paper's
            # reference code (tensor2tensor). Xavier's far smaller values would leave the
            # tokens a whisper under the positional encoding: training starts much slower.
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=c.n_embd ** -0.5)
        if c.tie_weights:  # pre-softmax layer = embedding matrix (section 3.4)
            self.lm_head.weight = self.tok_emb.weight
        self.emb_scale = math.sqrt(c.n_embd) if c.scale_embeddings else 1.0

    def num_params(self) -> int:
        """Number of parameters, shared (tied) ones counted once."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, *, storage: StoragePool | None = None,
                  beams: int = 1) -> list[tuple[KVCache | BeamCache, KVCache]]:
        """(self-attention, cross-attention) caches, one pair per decoder layer; ``storage``:
        kept from earlier caches (``nn.kv_cache.StoragePool``), or None for new; ``beams``
        > 1: for a beam search of that many beams per sentence (``nn.beam_cache``)."""
        return self.decoder.new_cache(storage=storage, beams=beams)

    def embed(self, ids: torch.Tensor, offset: int = 0):
        """E[ids] * sqrt(d_model) + PE: (B, T) -> (B, T, C); also the token and position parts."""
        tok = self.tok_emb(ids) * self.emb_scale  # (B, T, C)
        pos = None
        x = tok
        if self.pos_emb is not None:
            pos = self.pos_emb(ids.shape[1], offset=offset)  # (T, C)
            x = x + pos  # (B, T, C)
        return (self.drop(x) if self.training else x), tok, pos  # dropout: identity at inference

    def encode(self, src: torch.Tensor, need_weights: bool = False):
        """src: (B, S) ids, right-padded with pad_id.

        Returns (memory (B, S, C), src_mask (B, 1, 1, S) True at real tokens, Internals).
        """
        src_mask = key_padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        x, tok, pos = self.embed(src)
        memory, internals = self.encoder(x, src_mask, need_weights)  # (B, S, C)
        internals.token_embeddings, internals.position_embeddings = tok, pos
        return memory, src_mask, internals

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               cache: list | None = None, need_weights: bool = False):
        """tgt: (B, T) decoder input ids (<s> first); memory, src_mask from ``encode``.

        With ``cache`` (from ``new_cache``) ``tgt`` holds only the new positions: the
        self-attention keys/values of earlier ones and the cross-attention keys/values of
        the source (computed at the first step) come from the cache.
        Returns (logits (B, T, V), Internals).
        """
        past = cache[0][0].length if cache else 0  # target positions already cached
        y, tok, pos = self.embed(tgt, offset=past)  # (B, T, C)
        # Target padding needs no mask: pads sit at the end, and the causal mask already
        # stops every real position from looking at later ones.
        h, internals = self.decoder(y, memory, memory_mask=src_mask, cache=cache,
                                    need_weights=need_weights)  # (B, T, C)
        internals.token_embeddings, internals.position_embeddings = tok, pos
        return self.lm_head(h), internals  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, targets: torch.Tensor | None = None,
                return_internals: bool = False, label_smoothing: float | None = None,
                reduction: Literal["mean", "sum"] = "mean"):
        """src: (B, S) source ids; tgt: (B, T) decoder input (<s> y_1 ...); targets: (B, T)
        the ids to predict (y_1 ... </s>, pad_id where there is nothing to predict).

        Returns (logits (B, T, V), loss or None) and, with ``return_internals``, a
        ``Seq2SeqInternals`` with every attention map. ``label_smoothing`` overrides the
        config's epsilon (0 gives the plain cross-entropy, e.g. for validation); ``reduction``
        "sum" sums the loss over the target tokens instead of averaging it.
        """
        memory, src_mask, enc_int = self.encode(src, need_weights=return_internals)
        logits, dec_int = self.decode(tgt, memory, src_mask, need_weights=return_internals)
        loss = None
        if targets is not None:
            eps = self.config.label_smoothing if label_smoothing is None else label_smoothing
            loss = label_smoothed_cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                targets.reshape(-1), eps, self.config.pad_id,
                                                reduction)
        if return_internals:
            return logits, loss, Seq2SeqInternals(enc_int, dec_int)
        return logits, loss

    @torch.no_grad()
    def translate(self, src: torch.Tensor, beam_size: int = 1, max_len: int | None = None,
                  length_penalty: float = 0.0, use_cache: bool = True) -> list[list[int]]:
        """Token ids of each sentence's translation (no <s> or </s>); src (B, S) padded.

        beam_size 1 is greedy decoding; see ``models/decoding.py``.
        """
        from .decoding import beam_search, greedy_decode

        if beam_size <= 1:
            return greedy_decode(self, src, max_len, use_cache=use_cache, scores=False).tokens
        return beam_search(self, src, beam_size, max_len, length_penalty,
                           use_cache=use_cache).tokens


__all__ = ["Seq2SeqInternals", "Seq2SeqTransformer", "label_smoothed_cross_entropy"]
