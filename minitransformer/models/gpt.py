"""GPT: a decoder-only Transformer language model (Radford et al. 2018/2019).

    h0 = TokenEmbedding(idx) [+ PositionalEncoding]      (rope / alibi act inside attention)
    h  = Decoder(h0)   N blocks of masked self-attention + FFN, no cross-attention
    logits = h W_vocab^T                                  (W_vocab tied to the embedding)
    logits = cap * tanh(logits / cap)                     (only with ``logit_softcap``)

The switches of later models (``norm``, ``activation="swiglu"``, ``qk_norm``, ``n_kv_head``,
``rope_base``) act inside the shared blocks; docs/modern.md measures each.

Shapes: B batch, T time, C channels (n_embd), V vocabulary size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import GPTConfig
from ..nn.block import Decoder, Internals
from ..nn.init import init_weights
from ..nn.kv_cache import KVCache
from ..nn.linear import Linear
from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from . import generation


def absolute_positions(pos_encoding: str, max_len: int, d_model: int) -> nn.Module | None:
    """The position module added to the embeddings, or None for rope / alibi / none."""
    if pos_encoding == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len)
    if pos_encoding == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    return None


def padded_positions(pad: torch.Tensor, past: int, t: int):
    """Per-row positions (B, T) of columns past .. past+T-1 of a left-padded batch (pads at
    0), and the self-attention mask (B, 1, T, past+T): real keys, plus each pad query's own
    key (so that no softmax row is empty)."""
    cols = torch.arange(past, past + t, device=pad.device)  # (T,)
    positions = (cols[None, :] - pad[:, None]).clamp_min(0)  # (B, T)
    keys = torch.arange(past + t, device=pad.device)  # (Tk,)
    real = keys[None, :] >= pad[:, None]  # (B, Tk)
    mask = real[:, None, :] | (keys[None, :] == cols[:, None])[None]  # (B, T, Tk)
    return positions, mask[:, None]  # (B, T), (B, 1, T, Tk)


class GPT(nn.Module):
    """Decoder-only language model built from the shared ``Decoder`` stack."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = absolute_positions(c.pos_encoding, c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.decoder = Decoder(c.n_layer, c.n_embd, c.n_head, c.ffn_width, c.dropout, c.bias,
                               c.activation, c.norm_position, c.attn_impl, c.layer_norm_eps,
                               cross_attention=False, pos_encoding=c.pos_encoding,
                               max_len=c.block_size, norm=c.norm, n_kv_head=c.n_kv_head,
                               qk_norm=c.qk_norm, rope_base=c.rope_base)
        self.lm_head = Linear(c.n_embd, c.vocab_size, bias=False)
        init_weights(self, c.init, c.n_layer)
        self.emb_scale = math.sqrt(c.n_embd) if c.scale_embeddings else 1.0
        if c.scale_embeddings:
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=c.n_embd ** -0.5)
        if c.tie_weights:  # share the token embedding with the output head (Press & Wolf 2017)
            self.lm_head.weight = self.tok_emb.weight

    def num_params(self) -> int:
        """Number of parameters, shared (tied) ones counted once."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, capacity: int = 0) -> list[tuple[KVCache, KVCache]]:
        return self.decoder.new_cache(capacity)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                return_internals: bool = False, cache: list | None = None,
                pad: torch.Tensor | None = None, logits_to_keep: int = 0):
        """idx: (B, T) token ids; targets: (B, T) next-token ids (-1 = ignore).

        Returns (logits (B, T, V), loss or None), plus an ``Internals`` with every layer's
        attention weights and hidden states when ``return_internals`` is set.
        ``cache`` (from ``new_cache``) makes this an incremental decoding step.
        ``pad`` (B,): left padding per row (a ragged batch, ``models/ragged.py``): row b's
        first ``pad[b]`` cached-or-given positions are padding, hidden from every query,
        and its positions count from its first real token.
        ``logits_to_keep`` > 0: logits (B, logits_to_keep, V) for the last positions only
        (Hugging Face's name), and the last block computes nothing else: its queries,
        attention and FFN run for those positions, its keys and values for all (into the
        cache). A prefill reads one position's logits; the rest of a last block is about a
        sixth of a 6-layer model's work, and the output layer over a BPE vocabulary more.
        """
        b, t = idx.shape
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0, got {logits_to_keep}")
        if logits_to_keep and targets is not None:
            raise ValueError("logits_to_keep is for inference: the loss needs every position")
        past = cache[0][0].length if cache else 0  # positions already in the cache
        positions, self_mask = padded_positions(pad, past, t) if pad is not None else (None,
                                                                                       None)
        x = self.tok_emb(idx)  # (B, T, C)
        if self.emb_scale != 1.0:
            x = x * self.emb_scale  # (B, T, C)
        internals_tok = x
        pos = None
        if self.pos_emb is not None:
            # (T, C), or (B, T, C) per row
            pos = self.pos_emb(t, offset=past) if pad is None else self.pos_emb.at(positions)
            x = x + pos  # (B, T, C)
        if self.training:  # dropout is the identity at inference
            x = self.drop(x)
        x, internals = self.decoder(x, self_mask=self_mask, cache=cache,
                                    need_weights=return_internals, positions=positions,
                                    keep=logits_to_keep)  # (B, T or logits_to_keep, C)
        logits = self.lm_head(x)  # (B, T or logits_to_keep, V)
        if c_cap := self.config.logit_softcap:  # smooth, bounded in (-cap, cap)
            logits = c_cap * torch.tanh(logits / c_cap)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                   targets.reshape(-1), ignore_index=-1)
        if return_internals:
            internals.token_embeddings, internals.position_embeddings = internals_tok, pos
            return logits, loss, internals
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, use_cache: bool = True,
                 context_shift: int | None = None,
                 context_mode: generation.ContextMode = "recompute",
                 context_keep: int = 0) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens; returns (B, T + max_new_tokens).

        With ``seed``, row i draws from its own generator seeded ``seed + i`` (so a batch of
        copies of one prompt gives the same samples as generating them one by one).
        Past ``block_size`` tokens the window moves by ``context_shift`` tokens at once
        (default block_size // 4; 0 = the exact sliding window); ``context_mode`` "roll" keeps
        the cache instead of rebuilding it (RoPE / ALiBi only, an approximation); the first
        ``context_keep`` tokens never leave the window (a start token, as Llama's <s>). See
        ``models/generation.py``.
        """
        with generation.decoding_weights(self, use_cache):  # packed for the whole run
            new = list(self.stream(idx, max_new_tokens, temperature, top_k, top_p, seed,
                                   use_cache, context_shift, context_mode, context_keep))
        return torch.cat([idx, *new], dim=1) if new else idx

    @torch.no_grad()
    def stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
               top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, use_cache: bool = True,
               context_shift: int | None = None,
               context_mode: generation.ContextMode = "recompute", context_keep: int = 0):
        """Yield each new token (B, 1) as soon as it is sampled (arguments as ``generate``).
        Its steps read the plain weights unless the caller holds ``decoding_weights(model)``
        (faster on a CPU) and changes no weight until the stream ends."""
        yield from generation.generate_tokens(self, idx, max_new_tokens, temperature, top_k,
                                              top_p, seed, use_cache, context_shift,
                                              context_mode, context_keep)


__all__ = ["GPT", "Internals"]
