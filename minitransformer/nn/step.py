"""A decoder block's one-token decoding step, flattened: the fast path beside the modules.

Cached decoding feeds each ``DecoderBlock`` one new position per row per step. Through the
modules (residual wrappers, attention, projections, norms) that is about twenty module calls
and a few hundred lines of Python per block, and at a small model's sizes that Python, not
the arithmetic, is much of a step. It also costs far more there than in a loop of its own:
each step streams the weights and the cached keys through the CPU's caches, which evicts
the interpreter's own code and objects, so every line pays its misses again
(docs/BENCHMARKS.md, "Translation speed").

So inside ``packed_weights`` a block whose parts are all plain keeps a ``StepPlan``: its
parameters gathered once, and ``run``, which computes the same step as ``DecoderBlock.forward``
from them, with torch.nn.functional calls alone:

    h = x (Post-LN) or Norm_1(x) (Pre-LN)
    q, k, v = h W^Q, h W^K, h W^V        k, v appended to the self-attention cache
    x <- x + Attention(q, K, V) W^O      (then Norm_1 for Post-LN)
    the same with the source's cached keys for cross-attention, then the FFN

Where it does not apply, the modules compute the step (their path is the reference; tests
hold the two equal):
- a part that is not plain: LoRA on a projection, ``attn_impl="reference"``, RMSNorm's
  reference formula, an FFN of another kind, weights that are not plain fp32 CPU tensors
  (FSDP's shards, which its hooks gather only inside the modules' calls), a forward hook on
  any part of the block (the plan would skip it; hooks added while a scope is open are not
  seen, global module hooks are seen at every step);
- a call that is not one new position per row: a prefill, left-padded rows with their own
  positions, attention weights asked for, training, gradients, a dtype other than fp32, a
  device other than the CPU.
Beam search's self-attention cache is a ``BeamCache``: the step attends a sentence's beams as
the queries of one attention over the keys of all its beams, each masked to its own ancestors
(``beam_attention``; the modules gather each beam's keys instead).
RoPE, ALiBi, QK-norm and grouped-query attention are computed by their own modules. The
products take the kernel their row count settled on (``nn.kernels.settled_kernel``: oneDNN's
packed copy, BLAS or MKL's packed copy) and read its weights directly; while that kernel is
on trial they go through their modules, which time them (``nn.kernels.measured_product``).
W^Q, W^K and W^V too small to pack are read as one product from a plain stacked copy the
plan holds (one product in place of three: 6% of a cpu-small greedy translation).

Shapes: B rows, C channels, nh heads, nkv key/value heads, hs head size, T cached positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_hooks  # the global module hooks

from .attention import MultiHeadAttention
from .beam_cache import BeamCache
from .feedforward import FeedForward, SwiGLU
from .kernels import settled_kernel
from .kv_cache import KVCache
from .linear import Linear, linear_then, stackable, use_packed
from .norm import RMSNorm
from .packing import MKLPacked, fused_activation, packed_linear, unfused_activation


def projection(layer: Linear, kernel: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x W^T + b for one step, on ``kernel`` (``settled_kernel``): the plain weight, one
    of its packed copies, or (None: a trial is running) the module, which takes part in it."""
    if layer.packed is None or kernel == "blas" or (kernel == "mkl" and layer.mkl_packed is None):
        return functools.partial(F.linear, weight=layer.weight, bias=layer.bias)
    if kernel == "packed":
        return functools.partial(packed_linear, packed=layer.packed, bias=layer.bias)
    if kernel == "mkl":
        return layer.mkl_packed
    return layer


def first_layer(ffn: FeedForward, kernel: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """h -> act(h W1 + b1) for one step: on oneDNN's packed copy with the activation applied
    inside the product where oneDNN has it (``linear_then``)."""
    fc, act = ffn.fc, ffn.act
    post = fused_activation(act)
    if fc.packed is None or kernel in ("blas", "mkl") or (kernel == "packed" and post is None):
        first = projection(fc, kernel)
        return functools.partial(apply, unfused_activation(act), first)
    if kernel == "packed":
        return functools.partial(packed_linear, packed=fc.packed, bias=fc.bias, post=post)
    return functools.partial(linear_then, fc, act=act)


def apply(outer, inner, x):
    return outer(inner(x))


def plain_norm(norm: nn.Module) -> bool:
    return type(norm) is nn.LayerNorm or (type(norm) is RMSNorm and not norm.reference)


def normalization(norm: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> ``norm(x)`` for a ``plain_norm`` (fp32: RMSNorm's fused op), without the module."""
    if type(norm) is nn.LayerNorm:
        return functools.partial(torch.layer_norm, normalized_shape=norm.normalized_shape,
                                 weight=norm.weight, bias=norm.bias, eps=norm.eps)
    return functools.partial(torch.rms_norm, normalized_shape=(norm.d,), weight=norm.weight,
                             eps=norm.eps)


def plain_attention(attn: MultiHeadAttention) -> bool:
    """Attention the step computes: the fused kernel allowed, plain projections."""
    return attn.attn_impl != "reference" and all(
        type(p) is Linear for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj))


def plain_feedforward(ffn: nn.Module) -> bool:
    layers = (ffn.fc, ffn.proj) + ((ffn.gate,) if type(ffn) is SwiGLU else ())
    return type(ffn) in (FeedForward, SwiGLU) and all(type(p) is Linear for p in layers)


def applies(block: nn.Module, x: torch.Tensor, cache, need_weights: bool, positions,
            self_mask) -> bool:
    """Whether this call of ``block`` is a cached one-token step a plan computes (see the
    module docstring)."""
    return (cache is not None and x.shape[1] == 1 and not need_weights and positions is None
            and self_mask is None and not block.training and use_packed(True, x)
            and not (module_hooks._global_forward_hooks
                     or module_hooks._global_forward_pre_hooks))


class StepPlan:
    """One ``DecoderBlock``'s step, ``run``: its parts gathered at the first step of a scope
    (when every packed copy is in place) on each kernel its products take, so that a step
    looks nothing up again."""

    def __init__(self, block):
        self.block = block
        self.parts: dict[str | None, tuple] = {}  # by kernel (``gather``)

    @staticmethod
    def of(block) -> StepPlan | None:
        """The plan for ``block``, or None where some part of it is not plain."""
        attns = [block.self_attn] + ([block.cross_attn] if block.cross_attn is not None else [])
        norms = [r.norm for r in residuals(block)]
        hooked = any(m._forward_hooks or m._forward_pre_hooks
                     for m in block.modules() if m is not block)
        if all(plain_attention(a) for a in attns) and all(plain_norm(n) for n in norms) \
                and plain_feedforward(block.ffn) and stackable(*block.parameters()) \
                and not hooked:
            return StepPlan(block)
        return None

    def gather(self, kernel: str | None) -> tuple:
        """The parts of a step whose products take ``kernel`` (``settled_kernel``)."""
        block = self.block
        sa, ca, ffn = block.self_attn, block.cross_attn, block.ffn
        stacked = sa.packed_qkv
        projs = (sa.q_proj, sa.k_proj, sa.v_proj)
        widths = tuple(p.out_features for p in projs)
        if stacked is None:  # too small to pack: one product from a plain stacked copy
            w, b = sa.stacked_qkv()
            qkv = functools.partial(stacked_product, weight=w, bias=b, widths=widths)
        elif kernel == "blas" or (kernel == "mkl" and stacked[2] is None):
            qkv = tuple(projection(p, "blas") for p in projs)
        elif kernel == "packed":
            qkv = functools.partial(stacked_product, packed=stacked[0], bias=stacked[1],
                                    widths=widths)
        elif kernel == "mkl":
            qkv = functools.partial(stacked_product, mkl=stacked[2], bias=None, widths=widths)
        else:
            qkv = sa.project_self
        attend_self = (qkv, projection(sa.out_proj, kernel), sa)
        attend_source = None if ca is None else \
            (projection(ca.q_proj, kernel), projection(ca.out_proj, kernel), ca)
        if type(ffn) is SwiGLU:
            inner = (projection(ffn.gate, kernel), projection(ffn.fc, kernel), F.silu)
        else:
            inner = (first_layer(ffn, kernel), None, None)
        norms = tuple(normalization(r.norm) for r in residuals(block))
        return (block.res_self.pre, norms, attend_self, attend_source,
                (inner, projection(ffn.proj, kernel)))

    def run(self, x: torch.Tensor, memory: torch.Tensor | None,
            memory_mask: torch.Tensor | None, cache: tuple[KVCache, KVCache]) -> torch.Tensor:
        """One step: x (B, 1, C) -> (B, 1, C); the self-attention cache gains a position.
        Inside, a row is (C,): x (B, C)."""
        b, _, c = x.shape
        kernel = settled_kernel(self.block.kernels, b)
        parts = self.parts.get(kernel)
        if parts is None:
            parts = self.parts[kernel] = self.gather(kernel)
        pre, norms, attend_self, attend_source, ffn = parts
        self_cache, cross_cache = cache
        x = x.reshape(b, c)  # (B, C)
        h = norms[0](x) if pre else x
        y = self_attention(h, self_cache, *attend_self)
        x = x + y if pre else norms[0](x + y)
        if attend_source is not None:
            h = norms[1](x) if pre else x
            y = cross_attention(h, memory, memory_mask, cross_cache, *attend_source)
            x = x + y if pre else norms[1](x + y)
        h = norms[-1](x) if pre else x
        y = feed_forward(h, *ffn)
        x = x + y if pre else norms[-1](x + y)
        return x.view(b, 1, c)  # (B, 1, C)


def stacked_product(x: torch.Tensor, bias: torch.Tensor | None, widths: tuple[int, int, int],
                    packed: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                    mkl: MKLPacked | None = None):
    """x [W^Q; W^K; W^V]^T + b from the stack, split: (B, width) each. From oneDNN's packed
    copy, MKL's (which holds its bias), or the plain stack."""
    if packed is not None:
        y = packed_linear(x, packed, bias)
    elif mkl is not None:
        y = mkl(x)
    else:
        y = F.linear(x, weight, bias)
    return y.split(widths, dim=-1)


def residuals(block) -> list[nn.Module]:
    """The block's residual sublayers in order: self-attention, (cross-attention,) FFN."""
    return [block.res_self] + ([block.res_cross] if block.cross_attn is not None else []) \
        + [block.res_ffn]


def self_attention(h: torch.Tensor, cache: KVCache, qkv, out,
                   attn: MultiHeadAttention) -> torch.Tensor:
    """Masked self-attention of the newest position (it may see every cached key): h (B, C)
    -> (B, C). QK-norm, RoPE (at the cache's length) and ALiBi where ``attn`` has them."""
    b, c = h.shape
    nh, nkv, hs = attn.n_head, attn.n_kv_head, attn.head_size
    q, k, v = qkv(h) if callable(qkv) else (p(h) for p in qkv)  # (B, width) each
    q = q.view(b, nh, 1, hs)  # (B, nh, 1, hs)
    k = k.view(b, nkv, 1, hs)  # (B, nkv, 1, hs)
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.rope is not None:
        q, k = attn.rope(q, offset=cache.length), attn.rope(k, offset=cache.length)
    if isinstance(cache, BeamCache):
        return out(beam_attention(q, k, v.view(b, nkv, 1, hs), cache, attn))
    keys, values = cache.update(k, v.view(b, nkv, 1, hs))  # (B, nkv, T, hs)
    if nkv != nh:
        keys, values = attn.expand_kv(keys), attn.expand_kv(values)  # (B, nh, T, hs)
    bias = None
    if attn.alibi is not None:
        t = keys.shape[-2]
        bias = attn.alibi(1, t, offset=t - 1).to(q.dtype)  # (nh, 1, T)
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)  # (B, nh, 1, hs)
    return out(y.reshape(b, c))  # (B, C)


def beam_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: BeamCache,
                   attn: MultiHeadAttention) -> torch.Tensor:
    """Self-attention of the newest position through a ``BeamCache``: q (B, nh, 1, hs),
    k, v (B, nkv, 1, hs) -> (B, C). A sentence's q rows (its beams) are the queries of one
    attention over the keys of all its beams, masked to each beam's own ancestors."""
    b, nh, _, hs = q.shape
    keys, values, mask = cache.grouped(k, v)  # (n, nkv, T K, hs), (n, 1, q, T K)
    n, _, g, _ = mask.shape
    if keys.shape[1] != nh:
        keys, values = attn.expand_kv(keys), attn.expand_kv(values)  # (n, nh, T K, hs)
    if attn.alibi is not None:  # each key's distance is its position's, index // K
        t = cache.length
        bias = attn.alibi(1, t, offset=t - 1).to(q.dtype)  # (nh, 1, T)
        mask = mask + bias.repeat_interleave(cache.beams, dim=-1)  # (n, nh, q, T K)
    q = q.view(n, g, nh, hs).transpose(1, 2)  # (n, nh, q, hs): a view
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (n, nh, q, hs)
    return y.transpose(1, 2).reshape(b, nh * hs)  # (B, C)


def cross_attention(h: torch.Tensor, memory: torch.Tensor | None,
                    memory_mask: torch.Tensor | None, cache: KVCache, query, out,
                    attn: MultiHeadAttention) -> torch.Tensor:
    """Attention to the source, whose keys are projected once (the first step): h (B, C) ->
    (B, C)."""
    if not cache.length:
        if memory is None:
            raise ValueError("this decoder block has cross-attention: pass memory")
        attn.fill_cache(cache, memory)
    b, c = h.shape
    nh, nkv, hs = attn.n_head, attn.n_kv_head, attn.head_size
    g = cache.group
    q = query(h).view(b, nh, 1, hs)  # (B, nh, 1, hs)
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    # A sentence's g beams as the queries of one attention, (B/g, nh, g, hs): a view, whose
    # rows the fused kernel reads where they are (g = 1: as they are).
    q = q.view(-1, g, nh, hs).transpose(1, 2)
    keys, values = cache.k, cache.v  # (B/g, nkv, S, hs)
    if nkv != nh:
        keys, values = attn.expand_kv(keys), attn.expand_kv(values)
    bias = memory_mask  # boolean: its additive form, made once
    if bias is not None and bias.dtype == torch.bool:
        bias = cache.additive(bias, q.dtype)
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)  # (B/g, nh, g, hs)
    return out(y.transpose(1, 2).reshape(b, c))  # (B, C): a view where y is laid out so


def feed_forward(h: torch.Tensor, inner, proj) -> torch.Tensor:
    """FFN(h) = act(h W1 + b1) W2 + b2, or SwiGLU's (SiLU(h W_gate) * h W1) W2: (B, C)."""
    first, second, act = inner
    g = first(h) if second is None else act(first(h)) * second(h)  # (B, F)
    return proj(g)  # (B, C)
