"""Scaled dot-product attention and multi-head attention.

"Attention Is All You Need", section 3.2:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                       (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Two paths compute the same thing: the readable reference path below (explicit softmax,
returns the attention probabilities) and the fast path through PyTorch's fused
``torch.nn.functional.scaled_dot_product_attention``. Tests hold them equal.
``attn_impl="auto"`` takes the fused kernel except where the explicit formula is measured to
be faster (``fused_kernel_pays``).

Masks are boolean with True = "may attend" (see ``nn/mask.py``).

Two changes of later models, both off by default:
- grouped-query attention (Ainslie et al. 2023): ``n_kv_head`` < ``n_head`` key/value heads,
  each shared by n_head / n_kv_head query heads (one: multi-query attention, Shazeer 2019).
  K and V shrink by that factor, and so does the KV cache.
- QK-norm (Dehghani et al. 2023; Qwen3, modded-nanogpt): RMSNorm over the head size on each
  query and key before RoPE, q <- RMSNorm(q), k <- RMSNorm(k), which bounds the logits.

Shapes: B batch, Tq query length, Tk key length, C channels (d_model), nh heads,
nkv key/value heads (nh unless grouped), hs head size (C // nh).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import measured_product
from .kv_cache import KVCache
from .linear import Linear, Packable, drop_attribute, packable, use_packed
from .mask import causal_mask, combine
from .norm import RMSNorm
from .packing import MKLPacked, mkl_works, pack, packed_linear
from .positional import ALiBi, RotaryEmbedding

AttnImpl = Literal["auto", "reference", "fast"]


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 bias: torch.Tensor | None = None):
    """Implements eq. 1: softmax(Q K^T / sqrt(d_k) + bias) V, the readable reference path.

    q: (..., Tq, d_k), k: (..., Tk, d_k), v: (..., Tk, d_v); mask broadcastable to
    (..., Tq, Tk) with True/1 = may attend (positions where it is False/0 get -inf before the
    softmax); bias (optional, e.g. ALiBi) is added to the scores.
    Returns (output (..., Tq, d_v), weights (..., Tq, Tk)); weights are before dropout.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask.bool(), float("-inf"))  # (..., Tq, Tk)
    # the softmax in at least fp32: under bf16/fp16 mixed precision the scores are low-precision
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights  # (..., Tq, Tk)
    return dropped.to(v.dtype) @ v, weights  # (..., Tq, d_v), (..., Tq, Tk)


# Longest key sequence for which the explicit formula beats the fused kernel on a CPU in
# bf16/fp16 (training step, 2 cores: 1.0 vs 3.7 ms at T = 64, 34 vs 47 ms at T = 256, but
# 56 vs 40 ms at T = 512; docs/BENCHMARKS.md).
CPU_LOW_PRECISION_EXPLICIT_MAX_LEN = 256


def fused_kernel_pays(q: torch.Tensor, t_k: int) -> bool:
    """Whether PyTorch's fused kernel is the faster way to compute eq. 1 for these queries.

    Everywhere but one place: on a CPU in reduced precision, the fused kernel's backward pass
    is slower than the explicit matmuls for short sequences.
    """
    low = q.dtype in (torch.bfloat16, torch.float16)
    return not (q.device.type == "cpu" and low and t_k <= CPU_LOW_PRECISION_EXPLICIT_MAX_LEN)


def ungroup(x: torch.Tensor, group: int, t_q: int) -> torch.Tensor:
    """(B/g, nh, g Tq, d) -> (B, nh, Tq, d): the rows of grouped queries back in batch order."""
    n, nh, _, d = x.shape
    return x.reshape(n, nh, group, t_q, d).transpose(1, 2).reshape(n * group, nh, t_q, d)


class MultiHeadAttention(nn.Module, Packable):
    """Implements MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2).

    Self-attention when ``context`` is None, cross-attention otherwise (queries from ``x``,
    keys and values from ``context``, e.g. the encoder output). ``causal=True`` adds the
    decoder's look-ahead mask. ``rope`` / ``alibi`` add relative position information inside
    self-attention. ``n_kv_head`` (default n_head) and ``qk_norm``: see the module docstring.
    ``cross=True`` marks a module built for cross-attention (a decoder's second sublayer):
    it computes the same, but its queries and keys come from different inputs, so decoding
    does not stack its q, k, v (``pack_weights``).
    """

    # ``pack_weights``: [W^Q; W^K; W^V] packed for oneDNN, the biases stacked, and where MKL's
    # packed GEMM works (``mkl_works``) the stack's product through it
    packed_qkv: tuple[torch.Tensor, torch.Tensor | None, MKLPacked | None] | None = None

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, attn_impl: AttnImpl = "auto",
                 rope: RotaryEmbedding | None = None, alibi: ALiBi | None = None,
                 n_kv_head: int | None = None, qk_norm: bool = False, norm_eps: float = 1e-6,
                 cross: bool = False):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"n_embd ({d_model}) must be divisible by n_head ({n_head})")
        n_kv_head = n_kv_head or n_head
        if n_head % n_kv_head:
            raise ValueError(f"n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
        self.n_head, self.n_kv_head, self.head_size = n_head, n_kv_head, d_model // n_head
        self.causal, self.attn_impl, self.dropout, self.cross = causal, attn_impl, dropout, cross
        self.rope, self.alibi = rope, alibi
        kv_width = n_kv_head * self.head_size
        self.q_proj = Linear(d_model, d_model, bias=bias)  # W^Q for all heads at once
        self.k_proj = Linear(d_model, kv_width, bias=bias)  # W^K (nkv heads)
        self.v_proj = Linear(d_model, kv_width, bias=bias)  # W^V (nkv heads)
        self.out_proj = Linear(d_model, d_model, bias=bias)  # W^O (residual projection)
        # one gain per channel of a head, shared by all heads (Qwen3's q_norm / k_norm)
        self.q_norm = RMSNorm(self.head_size, eps=norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_size, eps=norm_eps) if qk_norm else None

    def drop_front(self, cache: KVCache, n: int, after: int = 0) -> None:
        """Drop the oldest ``n`` positions after the first ``after`` of this layer's
        self-attention ``cache``, so that the first one kept after them moves to position
        ``after``: RoPE keys that move are rotated back by ``n`` positions
        (R(p - n) = R(-n) R(p)); ALiBi's bias and no positions follow the cache indices."""
        rope = self.rope
        cache.drop_front(n, None if rope is None else (lambda k: rope.rotate_by(k, -n)),
                         after=after)

    def fill_cache(self, cache: KVCache, context: torch.Tensor, group: int = 1,
                   projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Cross-attention: store the keys and values of ``context`` (B, Tk, C) in an empty
        ``cache`` that serves ``group`` query rows per row (rows i*g .. i*g+g-1: the beams of
        sentence i). Beam search then projects each source once, and each step attends the
        g beams of a sentence as g queries of one attention over its keys, which are read
        once instead of once per beam (the mask is then per sentence, (B, 1, 1, Tk)). Beam
        search decodes its first step with one row per sentence (g = 1), then sets
        ``cache.group`` to its beam size. ``projected``: the keys and values, where the
        caller has them already.

        They are kept head-major, as the self-attention cache keeps its own: copied once,
        read at every step (a cpu-small greedy translation 7-8% faster than reading the
        projections' (B, Tk, nkv, hs) layout in place; docs/BENCHMARKS.md)."""
        k, v = projected if projected is not None else \
            self.keys_values(context, offset=0, rotate=False)  # (B, nkv, Tk, hs)
        cache.fill(k.contiguous(), v.contiguous())
        cache.group = group

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, n * hs) -> (B, n, T, hs): n = nh for queries, nkv for keys and values."""
        b, t, width = x.shape
        return x.view(b, t, width // self.head_size, self.head_size).transpose(1, 2)

    def queries(self, x: torch.Tensor, offset: int, rotate: bool = True,
                positions: torch.Tensor | None = None, projected: torch.Tensor | None = None
                ) -> torch.Tensor:
        """q = x W^Q split into heads (B, nh, Tq, hs), QK-normed, RoPE-rotated from position
        ``offset`` (or at per-row ``positions`` (B, Tq)) when ``rotate``. ``projected``:
        x W^Q already computed (B, Tq, C)."""
        q = self.split_heads(self.q_proj(x) if projected is None else projected)
        if self.q_norm is not None:
            q = self.q_norm(q)  # (B, nh, Tq, hs)
        if rotate and self.rope is not None:
            q = self.rope(q, offset=offset, positions=positions)
        return q

    def keys_values(self, src: torch.Tensor, offset: int, rotate: bool = True,
                    positions: torch.Tensor | None = None,
                    projected: tuple[torch.Tensor, torch.Tensor] | None = None):
        """k = src W^K (QK-normed, RoPE-rotated when ``rotate``) and v = src W^V, each
        (B, nkv, Tk, hs). ``projected``: (src W^K, src W^V) already computed."""
        k_lin, v_lin = (self.k_proj(src), self.v_proj(src)) if projected is None else projected
        k = self.split_heads(k_lin)  # (B, nkv, Tk, hs)
        v = self.split_heads(v_lin)  # (B, nkv, Tk, hs)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if rotate and self.rope is not None:
            k = self.rope(k, offset=offset, positions=positions)  # at their own positions
        return k, v

    def project_self(self, x: torch.Tensor):
        """x W^Q, x W^K, x W^V (B, T, width each): through the three modules, or inside
        ``packed_weights`` as one product with the three weights stacked, [W^Q; W^K; W^V],
        which reads them in one call (a decoding step's three small products are each too
        short to keep every core busy), where that is measured the faster
        (``nn.kernels.measured_product``)."""
        stacked = self.packed_qkv
        if use_packed(stacked, x):
            packed, b, mkl = stacked
            widths = (self.q_proj.out_features, self.k_proj.out_features,
                      self.v_proj.out_features)

            def packed_call():
                return packed_linear(x, packed, b).split(widths, dim=-1)  # (B, T, width) each

            def blas_call():
                return tuple(F.linear(x, p.weight, p.bias)
                             for p in (self.q_proj, self.k_proj, self.v_proj))

            def mkl_call():
                return mkl(x).split(widths, dim=-1)

            return measured_product(self.kernels, self, x, packed_call, blas_call,
                                    mkl_call if mkl is not None else None)
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def pack_weights(self) -> bool:
        """Stack and pack W^Q, W^K, W^V for ``project_self`` (self-attention, plain ``Linear``s
        only: a LoRA wrapper adds its own path to a projection). The three then need no packed
        copies of their own (``packs_for``); cross-attention packs each projection alone."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if self.cross or self.packed_qkv is not None or \
                not all(type(p) is Linear for p in projs) or \
                not packable(*(p.weight for p in projs)):
            return False
        w, b = self.stacked_qkv()  # MKL's product stacks them again when it packs its copy
        self.packed_qkv = (pack(w), b, MKLPacked(self.stacked_qkv) if mkl_works() else None)
        return True

    def stacked_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[W^Q; W^K; W^V] (C + 2 nkv hs, C) and their biases stacked alike (or None): one
        product computes the three projections."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        w = torch.cat([p.weight.detach() for p in projs])
        b = None if self.q_proj.bias is None else torch.cat([p.bias.detach() for p in projs])
        return w, b

    def unpack_weights(self) -> None:
        drop_attribute(self, "packed_qkv")

    def packs_for(self) -> tuple[nn.Module, ...]:
        return () if self.packed_qkv is None else (self.q_proj, self.k_proj, self.v_proj)

    def mkl_products(self) -> tuple[MKLPacked, ...]:
        stacked = self.packed_qkv
        return () if stacked is None or stacked[2] is None else (stacked[2],)

    def expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """Grouped-query sharing: key/value head j serves query heads j*g .. j*g+g-1
        (g = nh / nkv), so it is repeated g times: (B, nkv, T, hs) -> (B, nh, T, hs)."""
        group = self.n_head // self.n_kv_head
        return kv if group == 1 else kv.repeat_interleave(group, dim=1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False, positions: torch.Tensor | None = None,
                keep: int = 0):
        """x: (B, Tq, C); context: (B, Tk, C) or None; mask broadcastable to (B, nh, Tq, Tk);
        positions (B, Tq): each row's own positions of x for RoPE (a left-padded batch; None:
        the cache length onwards).

        ``keep`` > 0 (self-attention): keys and values from every position of x, queries and
        output from the last ``keep`` only, y (B, keep, C); a prefill whose other positions
        only need to reach the cache (``DecoderBlock``'s ``keep``).

        Returns (y (B, Tq, C), weights (B, nh, Tq, Tk) or None). Weights come from the
        reference path, which is used whenever ``need_weights`` is set.
        ``attn_impl``: "reference" always computes eq. 1 explicitly, "fast" always calls the
        fused kernel, "auto" picks the faster of the two for the device and dtype.
        """
        b, t_q, c = x.shape
        cross = context is not None
        past = cache.length if (cache is not None and not cross) else 0  # cached positions
        if cross:
            q = self.queries(x, offset=0, rotate=False)  # (B, nh, Tq, hs)
        else:
            q_lin, k_lin, v_lin = self.project_self(x)  # (B, Tq, width) each
            q_past, q_positions = past, positions
            if 0 < keep < t_q:  # queries of the last ``keep`` positions: (B, keep, C)
                q_lin, q_past, t_q = q_lin[:, -keep:], past + t_q - keep, keep
                q_positions = None if positions is None else positions[:, -keep:]
                if mask is not None and mask.shape[-2] > 1:  # the kept queries' rows
                    mask = mask[..., -keep:, :]
            q = self.queries(x, q_past, positions=q_positions,
                             projected=q_lin)  # (B, nh, Tq, hs)
        if cross and cache is not None and cache.length:  # encoder keys/values computed once
            k, v = cache.k, cache.v  # (B, nkv, Tk, hs)
        else:
            k, v = (self.keys_values(context, offset=0, rotate=False) if cross else
                    self.keys_values(x, past, positions=positions, projected=(k_lin, v_lin)))
            if cache is not None and cross:  # the source's keys, kept for every step
                self.fill_cache(cache, context, cache.group, projected=(k, v))
            elif cache is not None:
                k, v = cache.update(k, v)  # (B, nkv, past + Tq, hs) for self-attention
        k, v = self.expand_kv(k), self.expand_kv(v)  # (B, nh, Tk, hs)
        t_k = k.shape[-2]
        group = cache.group if (cross and cache is not None) else 1
        if group > 1:  # a sentence's beams as the queries of one attention: (B/g, nh, g Tq, hs)
            q = q.reshape(-1, group, self.n_head, t_q, self.head_size).transpose(1, 2) \
                .reshape(-1, self.n_head, group * t_q, self.head_size)

        causal_only = self.causal and mask is None and past == 0 and t_q == t_k
        if self.causal and t_q > 1:  # a single newest query may see every key: no mask needed
            mask = combine(causal_mask(t_q, t_k, offset=t_k - t_q, device=x.device), mask)
        bias = None
        if self.alibi is not None and not cross:
            bias = self.alibi(t_q, t_k, offset=t_k - t_q).to(q.dtype)  # (nh, Tq, Tk)
        p = self.dropout if self.training else 0.0

        weights = None
        if need_weights or self.attn_impl == "reference":
            y, weights = scaled_dot_product_attention(q, k, v, mask, p, bias)  # (B, nh, Tq, hs)
        elif self.attn_impl == "auto" and not fused_kernel_pays(q, t_k):
            y, _ = scaled_dot_product_attention(q, k, v, mask, p, bias)  # (B, nh, Tq, hs)
        elif bias is None and causal_only:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            attn_mask = mask
            if bias is not None:  # fold the boolean mask into the additive bias
                attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        if group > 1:  # back to one row per beam: (B, nh, Tq, hs)
            y, weights = ungroup(y, group, t_q), weights if weights is None else \
                ungroup(weights, group, t_q)
        y = y.transpose(1, 2).reshape(b, t_q, c)  # concatenate heads: (B, Tq, C)
        return self.out_proj(y), weights  # (B, Tq, C)
