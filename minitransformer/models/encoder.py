"""EncoderModel: a bidirectional Transformer encoder (BERT, Devlin et al. 2019).

    h0 = LayerNorm(TokenEmbedding(idx) + Position(t) + TokenType(segment))   (BERT, Figure 2)
    h  = Encoder(h0)     N blocks of unmasked self-attention + FFN (Post-LN in BERT)
    logits = MaskedLMHead(h)                                                  (masked-LM training)

Every position attends to every other (no causal mask); only padding is masked out.
A sentence embedding is by default the mean of h over the real tokens, L2-normalised (as
sentence-transformers pools all-MiniLM-L6-v2); ``embed`` also takes [CLS] or the maximum, and
leaves out the normalisation, as a folder's modules say (interop/sentence.py).

Shapes: B batch, T time, C channels (n_embd), V vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..nn.block import Encoder, Internals
from ..nn.init import init_weights
from .gpt import absolute_positions
from .mlm import IGNORE, MaskedLMHead


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of hidden (B, T, C) over positions where attention_mask (B, T) is 1; (B, C)."""
    if attention_mask is None:
        return hidden.mean(dim=1)  # (B, C)
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)  # (B, C)


class EncoderModel(nn.Module):
    """Embeddings (token + position + token type, then LayerNorm) and the shared ``Encoder``."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = absolute_positions(c.pos_encoding, c.block_size, c.n_embd)
        self.type_emb = nn.Embedding(c.type_vocab_size, c.n_embd) if c.type_vocab_size else None
        self.emb_norm = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps) \
            if c.embedding_norm == "layernorm" else nn.Identity()
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(c.n_layer, c.n_embd, c.n_head, c.ffn_width, c.dropout, c.bias,
                               c.activation, c.norm_position, c.attn_impl, c.layer_norm_eps,
                               pos_encoding=c.pos_encoding, max_len=c.block_size)
        self.mlm_head = None
        if c.mlm_head != "none":
            self.mlm_head = MaskedLMHead(c.n_embd, c.vocab_size, c.mlm_head, c.activation,
                                         c.layer_norm_eps)
        init_weights(self, c.init, c.n_layer)
        if self.mlm_head is not None and c.tie_weights:
            self.mlm_head.decoder.weight = self.tok_emb.weight

    def num_params(self) -> int:
        """Number of parameters, shared (tied) ones counted once."""
        return sum(p.numel() for p in self.parameters())

    def encode(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, return_internals: bool = False):
        """idx: (B, T) ids; attention_mask: (B, T), 1 at real tokens, 0 at padding;
        token_type_ids: (B, T) segment ids (default all 0).

        Returns the final hidden states (B, T, C), plus an ``Internals`` when asked.
        """
        b, t = idx.shape
        x = self.tok_emb(idx)  # (B, T, C)
        tok = x
        pos = None
        if self.pos_emb is not None:
            pos = self.pos_emb(t)  # (T, C)
            x = x + pos  # (B, T, C)
        if self.type_emb is not None:
            if token_type_ids is None:
                x = x + self.type_emb.weight[0]  # (B, T, C): every token in segment A
            else:
                x = x + self.type_emb(token_type_ids)  # (B, T, C)
        x = self.drop(self.emb_norm(x))  # (B, T, C)
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys that exist
        h, internals = self.encoder(x, mask, need_weights=return_internals)  # (B, T, C)
        if return_internals:
            internals.token_embeddings, internals.position_embeddings = tok, pos
            return h, internals
        return h

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                return_internals: bool = False, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, targets_only: bool = False):
        """idx: (B, T); targets: (B, T) original ids at masked positions, -1 elsewhere.

        Returns (out, loss or None), plus ``Internals`` when ``return_internals`` is set.
        ``out`` is the masked-LM logits (B, T, V), or the hidden states (B, T, C) for a model
        built without a head (mlm_head="none", e.g. a sentence-embedding checkpoint).
        ``targets_only`` (with targets): only the positions that have a target go through the
        head, and ``out`` is their logits (N, V), in row-major order. The loss needs no
        others, and projecting every position onto the vocabulary can cost as much as the
        whole encoder (all-MiniLM-L6-v2: 30,522 ids x 384 channels, about its six layers).
        """
        # Internals only when asked: they force the reference path (explicit softmax) and keep
        # every attention map alive, which masked-LM training has no use for.
        encoded = self.encode(idx, attention_mask, token_type_ids, return_internals)
        h, internals = encoded if return_internals else (encoded, None)  # h: (B, T, C)
        if targets is not None and self.mlm_head is None:
            raise ValueError("this encoder has no masked-LM head (mlm_head='none')")
        if targets_only:
            if targets is None:
                raise ValueError("targets_only needs targets")
            chosen = targets != IGNORE  # (B, T)
            h, targets = h[chosen], targets[chosen]  # (N, C), (N,)
        out = self.mlm_head(h) if self.mlm_head is not None else h  # (B, T, V) or (B, T, C)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)).float(), targets.reshape(-1),
                                   ignore_index=IGNORE)
        if return_internals:
            return out, loss, internals
        return out, loss

    @torch.no_grad()
    def embed(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None, pooling: str = "mean",
              normalize: bool = True) -> torch.Tensor:
        """Sentence embeddings (B, C): the mean over real tokens (``pooling="mean"``), the
        first token's vector ("cls") or each channel's largest over real tokens ("max");
        then L2-normalised unless ``normalize`` is False."""
        h = self.encode(idx, attention_mask, token_type_ids)  # (B, T, C)
        if pooling == "mean":
            e = mean_pool(h, attention_mask)  # (B, C)
        elif pooling == "cls":
            e = h[:, 0]  # (B, C)
        elif pooling == "max":
            real = torch.ones_like(idx) if attention_mask is None else attention_mask
            e = h.masked_fill(real[..., None] == 0, float("-inf")).amax(dim=1)  # (B, C)
        else:
            raise ValueError(f"pooling must be mean, cls or max, got {pooling!r}")
        return F.normalize(e, dim=-1) if normalize else e  # (B, C)


__all__ = ["EncoderModel", "Internals", "mean_pool"]
