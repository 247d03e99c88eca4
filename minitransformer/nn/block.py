"""Transformer blocks and stacks (paper Figure 1), with residual + LayerNorm in both placements.

    Post-LN (the paper, section 3.1):  x = LayerNorm(x + Sublayer(x))
    Pre-LN  (GPT-2, Xiong et al. 2020): x = x + Sublayer(LayerNorm(x))

A Pre-LN stack ends with one more LayerNorm (GPT-2's ``ln_f``); a Post-LN stack does not
need one, since every block already ends in a norm. ``norm="rmsnorm"`` puts RMSNorm in every
one of these places (``nn/norm.py``); ``activation="swiglu"`` makes the FFN gated
(``nn/feedforward.py``); ``n_kv_head`` and ``qk_norm`` change the attention
(``nn/attention.py``).

Shapes: B batch, T time (Tq decoder, Ts source), C channels, nh heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from .attention import AttnImpl, MultiHeadAttention
from .beam_cache import BeamCache
from .feedforward import Activation, make_feedforward
from .kv_cache import KVCache, StoragePool
from .linear import Packable, drop_attribute
from .norm import Norm, make_norm
from .positional import ALiBi, PosEncoding, RotaryEmbedding
from .step import StepPlan, applies

NormPosition = Literal["pre", "post"]


@dataclass
class Internals:
    """What happened inside a stack, returned (never stored on modules) when asked for.

    hidden_states: n_layer + 1 tensors (B, T, C): the stack's input, then each block's output.
    attentions: per layer, self-attention weights (B, nh, T, T).
    cross_attentions: per layer, decoder-to-encoder weights (B, nh, Tq, Ts) (decoders only).
    token_embeddings / position_embeddings: filled in by the models, (B, T, C) and (T, C).
    """

    hidden_states: list[torch.Tensor] = field(default_factory=list)
    attentions: list[torch.Tensor] = field(default_factory=list)
    cross_attentions: list[torch.Tensor] = field(default_factory=list)
    token_embeddings: torch.Tensor | None = None
    position_embeddings: torch.Tensor | None = None


class Residual(nn.Module):
    """One sublayer with its residual connection and LayerNorm, placed "pre" or "post"."""

    def __init__(self, d_model: int, norm_position: NormPosition, dropout: float, eps: float,
                 norm: Norm = "layernorm"):
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        self.pre = norm_position == "pre"
        self.norm = make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)  # residual dropout (paper section 5.4)

    def forward(self, x: torch.Tensor, sublayer) -> tuple[torch.Tensor, object]:
        """sublayer(h) -> (y, extra). Pre: x + y(LN(x)); post: LN(x + y(x)).

        A sublayer may answer for the last positions only (y (B, T', C), T' <= T: a block's
        ``keep``); the residual then adds them to the last T' positions of x."""
        if self.pre:
            y, extra = sublayer(self.norm(x))
            return last(x, y) + self.drop(y), extra  # (B, T', C)
        y, extra = sublayer(x)
        return self.norm(last(x, y) + self.drop(y)), extra  # (B, T', C)

    def drop(self, y: torch.Tensor) -> torch.Tensor:
        # dropout is the identity at inference: skipping the call saves per-token time
        return self.dropout(y) if self.training else y


def last(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) cut to the positions y (B, T', C) answers for: its last T'."""
    return x if x.shape[1] == y.shape[1] else x[:, -y.shape[1]:]


def _ffn_sublayer(ffn: nn.Module):
    return lambda h: (ffn(h), None)


class EncoderBlock(nn.Module):
    """Implements one encoder layer: self-attention, then feed-forward; residual + norm each."""

    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float = 0.0,
                 bias: bool = True, activation: Activation = "relu",
                 norm_position: NormPosition = "post", attn_impl: AttnImpl = "auto",
                 layer_norm_eps: float = 1e-5, rope: RotaryEmbedding | None = None,
                 alibi: ALiBi | None = None, *, norm: Norm = "layernorm",
                 n_kv_head: int | None = None, qk_norm: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_head, dropout, bias, causal=False,
                                       attn_impl=attn_impl, rope=rope, alibi=alibi,
                                       n_kv_head=n_kv_head, qk_norm=qk_norm,
                                       norm_eps=layer_norm_eps)
        self.ffn = make_feedforward(d_model, d_ff, activation, dropout, bias)
        self.res_attn = Residual(d_model, norm_position, dropout, layer_norm_eps, norm)
        self.res_ffn = Residual(d_model, norm_position, dropout, layer_norm_eps, norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False):
        """x: (B, T, C), mask: key padding (B, 1, 1, T). Returns (x, self-attention weights)."""
        x, w = self.res_attn(x, lambda h: self.attn(h, mask=mask, need_weights=need_weights))
        x, _ = self.res_ffn(x, _ffn_sublayer(self.ffn))  # (B, T, C)
        return x, w


class DecoderBlock(nn.Module, Packable):
    """Implements one decoder layer: masked self-attention, cross-attention to the encoder
    output (optional: a decoder-only GPT has none), feed-forward; each with residual + norm.

    Inside ``packed_weights`` a cached one-token step runs through the block's ``StepPlan``
    (``nn/step.py``), the same computation with less Python, where every part is plain."""

    step_plan: StepPlan | None = None  # ``pack_weights``

    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float = 0.0,
                 bias: bool = True, activation: Activation = "relu",
                 norm_position: NormPosition = "post", attn_impl: AttnImpl = "auto",
                 layer_norm_eps: float = 1e-5, cross_attention: bool = True,
                 rope: RotaryEmbedding | None = None, alibi: ALiBi | None = None, *,
                 norm: Norm = "layernorm", n_kv_head: int | None = None, qk_norm: bool = False):
        super().__init__()
        heads = dict(n_kv_head=n_kv_head, qk_norm=qk_norm, norm_eps=layer_norm_eps)
        self.self_attn = MultiHeadAttention(d_model, n_head, dropout, bias, causal=True,
                                            attn_impl=attn_impl, rope=rope, alibi=alibi,
                                            **heads)
        self.res_self = Residual(d_model, norm_position, dropout, layer_norm_eps, norm)
        self.cross_attn = None
        if cross_attention:  # no positional term in cross-attention
            self.cross_attn = MultiHeadAttention(d_model, n_head, dropout, bias, causal=False,
                                                 attn_impl=attn_impl, cross=True, **heads)
            self.res_cross = Residual(d_model, norm_position, dropout, layer_norm_eps, norm)
        self.ffn = make_feedforward(d_model, d_ff, activation, dropout, bias)
        self.res_ffn = Residual(d_model, norm_position, dropout, layer_norm_eps, norm)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                self_mask: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, KVCache] | None = None, need_weights: bool = False,
                positions: torch.Tensor | None = None, keep: int = 0):
        """x: (B, Tq, C); memory: encoder output (B, Ts, C); memory_mask: (B, 1, 1, Ts).

        cache: (self-attention cache, cross-attention cache) for incremental decoding.
        positions: (B, Tq) per-row positions for RoPE (a left-padded batch), or None.
        keep > 0: the output of the last ``keep`` positions only, x (B, keep, C). Keys and
        values still come from every position (into the cache), but queries, attention,
        cross-attention and the FFN run for the kept ones alone: the last block of a prefill
        whose logits are read at the last position (``GPT.forward``'s ``logits_to_keep``).
        Returns (x, self-attention weights, cross-attention weights).
        """
        plan = self.step_plan
        if plan is not None and applies(self, x, cache, need_weights, positions, self_mask):
            return plan.run(x, memory, memory_mask, cache), None, None  # the fast path
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x, w_self = self.res_self(x, lambda h: self.self_attn(
            h, mask=self_mask, cache=self_cache, need_weights=need_weights,
            positions=positions, keep=keep))  # (B, keep or Tq, C)
        w_cross = None
        if self.cross_attn is not None:
            if memory is None and not (cross_cache is not None and cross_cache.length):
                raise ValueError("this decoder block has cross-attention: pass memory")
            x, w_cross = self.res_cross(x, lambda h: self.cross_attn(
                h, context=memory if memory is not None else h, mask=memory_mask,
                cache=cross_cache, need_weights=need_weights))
        x, _ = self.res_ffn(x, _ffn_sublayer(self.ffn))  # (B, Tq, C)
        return x, w_self, w_cross

    def pack_weights(self) -> bool:
        """Keep the ``StepPlan`` where the block has one (its parts' own copies are theirs
        to take); without one the block's attributes stay as they were."""
        if self.step_plan is not None:
            return False
        plan = StepPlan.of(self)
        if plan is None:
            return False
        self.step_plan = plan
        return True

    def unpack_weights(self) -> None:
        drop_attribute(self, "step_plan")


def relative_positions(pos_encoding: PosEncoding, n_head: int, head_size: int, max_len: int,
                       rope_base: float = 10000.0):
    """The (rope, alibi) modules a stack shares across its self-attention layers."""
    rope = RotaryEmbedding(head_size, base=rope_base, max_len=max_len) \
        if pos_encoding == "rope" else None
    alibi = ALiBi(n_head) if pos_encoding == "alibi" else None
    return rope, alibi


class Encoder(nn.Module):
    """Implements the encoder stack: N identical EncoderBlocks (no embeddings)."""

    def __init__(self, n_layer: int, d_model: int, n_head: int, d_ff: int, dropout: float = 0.0,
                 bias: bool = True, activation: Activation = "relu",
                 norm_position: NormPosition = "post", attn_impl: AttnImpl = "auto",
                 layer_norm_eps: float = 1e-5, pos_encoding: PosEncoding = "none",
                 max_len: int = 1024, *, norm: Norm = "layernorm", n_kv_head: int | None = None,
                 qk_norm: bool = False, rope_base: float = 10000.0):
        super().__init__()
        rope, alibi = relative_positions(pos_encoding, n_head, d_model // n_head, max_len,
                                         rope_base)
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, n_head, d_ff, dropout, bias, activation, norm_position,
                         attn_impl, layer_norm_eps, rope, alibi, norm=norm,
                         n_kv_head=n_kv_head, qk_norm=qk_norm) for _ in range(n_layer))
        self.final_norm = make_norm(norm, d_model, layer_norm_eps) \
            if norm_position == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False):
        """x: (B, T, C) embeddings; mask: (B, 1, 1, T). Returns (x (B, T, C), Internals)."""
        internals = Internals(hidden_states=[x])
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)  # (B, T, C)
            internals.hidden_states.append(x)
            if w is not None:
                internals.attentions.append(w)
        return self.final_norm(x), internals


class Decoder(nn.Module):
    """Implements the decoder stack: N DecoderBlocks; ``cross_attention=False`` gives GPT's."""

    def __init__(self, n_layer: int, d_model: int, n_head: int, d_ff: int, dropout: float = 0.0,
                 bias: bool = True, activation: Activation = "relu",
                 norm_position: NormPosition = "post", attn_impl: AttnImpl = "auto",
                 layer_norm_eps: float = 1e-5, cross_attention: bool = True,
                 pos_encoding: PosEncoding = "none", max_len: int = 1024, *,
                 norm: Norm = "layernorm", n_kv_head: int | None = None, qk_norm: bool = False,
                 rope_base: float = 10000.0):
        super().__init__()
        rope, alibi = relative_positions(pos_encoding, n_head, d_model // n_head, max_len,
                                         rope_base)
        self.layers = nn.ModuleList(
            DecoderBlock(d_model, n_head, d_ff, dropout, bias, activation, norm_position,
                         attn_impl, layer_norm_eps, cross_attention, rope, alibi, norm=norm,
                         n_kv_head=n_kv_head, qk_norm=qk_norm)
            for _ in range(n_layer))
        self.final_norm = make_norm(norm, d_model, layer_norm_eps) \
            if norm_position == "pre" else nn.Identity()

    def new_cache(self, capacity: int = 0, *, storage: StoragePool | None = None,
                  beams: int = 1) -> list[tuple[KVCache | BeamCache, KVCache]]:
        """One (self, cross) cache pair per layer for incremental decoding; ``capacity``:
        the positions a self-attention cache's first storage holds at least; ``storage``:
        where the self-attention caches' storage comes from (``KVCache.release`` gives it
        back), or new. The cross-attention caches keep the source's keys, made once.
        ``beams`` > 1: self-attention caches for a beam search of that many beams per
        sentence, which keep a sentence's beams together (``nn.beam_cache``)."""
        if beams > 1:
            return [(BeamCache(beams, capacity, storage), KVCache()) for _ in self.layers]
        return [(KVCache(capacity, storage), KVCache()) for _ in self.layers]

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                self_mask: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: list[tuple[KVCache, KVCache]] | None = None, need_weights: bool = False,
                positions: torch.Tensor | None = None, keep: int = 0):
        """x: (B, Tq, C) embeddings; positions (B, Tq): per-row positions for RoPE, or None.
        keep > 0: the output of the last ``keep`` positions only; the last block computes no
        more (``DecoderBlock``), every other block all of them, whose keys its successor
        needs.
        Returns (x (B, Tq or keep, C), Internals; its last hidden state is (B, keep, C)
        too)."""
        internals = Internals(hidden_states=[x])
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x, w_self, w_cross = layer(x, memory, self_mask, memory_mask,
                                       None if cache is None else cache[i], need_weights,
                                       positions, keep if i == n - 1 else 0)
            internals.hidden_states.append(x)
            if w_self is not None:
                internals.attentions.append(w_self)
            if w_cross is not None:
                internals.cross_attentions.append(w_cross)
        return self.final_norm(x), internals
