"""Attention against hand-computed values and against PyTorch's own implementations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer.nn import (
    ALiBi,
    KVCache,
    MultiHeadAttention,
    RotaryEmbedding,
    StoragePool,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

D, NH = 16, 4


def test_worked_example_by_hand():
    """Q = K = I, V = [[10, 20], [30, 40]], d_k = 2: the tutorial's numbers."""
    q = torch.eye(2, dtype=torch.float64)
    v = torch.tensor([[10.0, 20.0], [30.0, 40.0]], dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, q.clone(), v)
    # Scores are I / sqrt(2): each row is [1/sqrt2, 0] (or its mirror), so the softmax gives
    # w = e^(1/sqrt2) / (e^(1/sqrt2) + e^0) on the diagonal and 1 - w off it.
    e = math.exp(1 / math.sqrt(2))
    w = e / (e + 1.0)
    assert w == pytest.approx(0.67, abs=1e-3)
    expected_w = torch.tensor([[w, 1 - w], [1 - w, w]], dtype=torch.float64)
    expected_out = torch.tensor([[10 * w + 30 * (1 - w), 20 * w + 40 * (1 - w)],
                                 [10 * (1 - w) + 30 * w, 20 * (1 - w) + 40 * w]],
                                dtype=torch.float64)
    torch.testing.assert_close(weights, expected_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=1e-10)
    # The rounded values the tutorial prints.
    torch.testing.assert_close(out, torch.tensor([[16.6, 26.6], [23.4, 33.4]],
                                                 dtype=torch.float64), rtol=0, atol=0.05)


def test_masked_keys_get_zero_weight():
    q, k, v = (torch.randn(1, 3, 4) for _ in range(3))
    mask = torch.tensor([[True, False, True]])  # nobody may look at key 1
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(weights[..., 1] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 3))


def _mask_cases(b, t):
    lengths = torch.tensor([t, t - 2, 1])[:b]
    return {
        "none": None,
        "causal": causal_mask(t),
        "padding": padding_mask(lengths, t),  # (B, 1, 1, T)
        "causal+padding": causal_mask(t) & padding_mask(lengths, t),
    }


@pytest.mark.parametrize("case", ["none", "causal", "padding", "causal+padding"])
def test_reference_equals_torch_sdpa_forward_and_backward(case):
    b, nh, t, hs = 3, 2, 6, 8
    mask = _mask_cases(b, t)[case]
    q, k, v = (torch.randn(b, nh, t, hs, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    ours, _ = scaled_dot_product_attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    upstream = torch.randn_like(ours)
    g_ours = torch.autograd.grad(ours, (q, k, v), upstream)
    g_theirs = torch.autograd.grad(theirs, (q, k, v), upstream)
    for a, b_ in zip(g_ours, g_theirs, strict=True):
        torch.testing.assert_close(a, b_, rtol=1e-10, atol=1e-10)


def test_reference_equals_torch_sdpa_cross_lengths_and_bias():
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)  # Tq = 4
    k = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)  # Tk = 7
    v = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, 4, 7, dtype=torch.float64)  # an additive score bias, as ALiBi's
    ours, _ = scaled_dot_product_attention(q, k, v, bias=bias)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(ours, theirs)
    g1 = torch.autograd.grad(ours.sum(), (q, k, v))
    g2 = torch.autograd.grad(theirs.sum(), (q, k, v))
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b)


# ---- MultiHeadAttention: fast path == reference path ------------------------------------

def _pair(**kwargs):
    """The same weights behind a reference-path and a fast-path MultiHeadAttention."""
    ref = MultiHeadAttention(D, NH, attn_impl="reference", **kwargs).double().eval()
    fast = MultiHeadAttention(D, NH, attn_impl="fast", **kwargs).double().eval()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


POSITIONS = {
    "none": {},
    "rope": {"rope": RotaryEmbedding(D // NH)},
    "alibi": {"alibi": ALiBi(NH)},
}


@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_path_equals_reference(pos, causal, padded):
    ref, fast = _pair(causal=causal, **POSITIONS[pos])
    x = torch.randn(2, 7, D, dtype=torch.float64, requires_grad=True)
    mask = padding_mask(torch.tensor([7, 4]), 7) if padded else None
    y_ref, w = ref(x, mask=mask)
    y_fast, none = fast(x, mask=mask)
    assert none is None and w is not None
    torch.testing.assert_close(y_fast, y_ref)
    g_ref = torch.autograd.grad(y_ref.sum(), x)[0]
    g_fast = torch.autograd.grad(y_fast.sum(), x)[0]
    torch.testing.assert_close(g_fast, g_ref)
    # need_weights always takes the reference path, whatever attn_impl says.
    _, w_fast = fast(x, mask=mask, need_weights=True)
    torch.testing.assert_close(w_fast, w)


def test_fast_path_equals_reference_cross_attention():
    ref, fast = _pair()
    x, ctx = torch.randn(2, 3, D, dtype=torch.float64), torch.randn(2, 6, D, dtype=torch.float64)
    mask = padding_mask(torch.tensor([6, 2]), 6)
    torch.testing.assert_close(fast(x, ctx, mask=mask)[0], ref(x, ctx, mask=mask)[0])


@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_kv_cache_equals_full_causal_pass(pos, impl):
    """Prefill 3 positions, then 2 at once, then one at a time: same as the whole sequence."""
    ref, fast = _pair(causal=True, **POSITIONS[pos])
    mha = ref if impl == "reference" else fast
    x = torch.randn(2, 9, D, dtype=torch.float64)
    full, _ = ref(x)
    cache = KVCache()
    pieces, start = [], 0
    for n in (3, 2, 1, 1, 1, 1):
        y, _ = mha(x[:, start:start + n], cache=cache)
        pieces.append(y)
        start += n
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_kv_cache_grows_past_its_first_allocation():
    cache = KVCache()
    ks = torch.randn(1, 2, 150, 4)
    for i in range(150):
        k, v = cache.update(ks[:, :, i:i + 1], -ks[:, :, i:i + 1])
    torch.testing.assert_close(k, ks)
    torch.testing.assert_close(v, -ks)


def test_kv_cache_made_for_its_capacity_and_cleared_keeps_its_storage():
    cache = KVCache(capacity=100)
    ks = torch.randn(2, 3, 100, 4)
    cache.update(ks[:, :, :40], ks[:, :, :40])
    storage = cache._k.data_ptr()
    for i in range(40, 100):  # up to its capacity: never grown
        cache.update(ks[:, :, i:i + 1], ks[:, :, i:i + 1])
    assert cache._k.data_ptr() == storage and cache._k.shape[2] == 100
    cache.clear()  # a window rebuilt: its positions written where the last ones were
    assert cache.length == 0 and cache.k.shape[2] == 0
    k, v = cache.update(-ks[:, :, :30], ks[:, :, :30])
    assert cache._k.data_ptr() == storage
    torch.testing.assert_close(k, -ks[:, :, :30])
    torch.testing.assert_close(v, ks[:, :, :30])


def test_kv_cache_keeps_each_heads_keys_contiguous():
    """Head-major storage: a row's keys of one head are one block that attention reads whole,
    positions hs floats apart; the cross-attention keys ``fill`` keeps stay as projected."""
    cache = KVCache(capacity=16)
    ks = torch.randn(2, 3, 10, 4)
    for i in range(10):
        k, v = cache.update(ks[:, :, i:i + 1], -ks[:, :, i:i + 1])
    assert k.stride()[2:] == (4, 1) and v.stride()[2:] == (4, 1)  # (position, channel)
    assert k.stride(1) == cache._k.shape[2] * 4  # the next head: a capacity further
    projected = torch.randn(2, 10, 3, 4)  # (B, T, nkv, hs), as the projections give it
    source = KVCache()
    source.fill(projected.transpose(1, 2), projected.transpose(1, 2))
    assert source.k.data_ptr() == projected.data_ptr()
    torch.testing.assert_close(source.k, projected.transpose(1, 2))


@pytest.mark.parametrize("step", ["fill_cache", "forward"])
def test_cross_attention_keeps_the_source_keys_head_major(step):
    # read at every decoding step: each (row, head) one block, as in the self-attention cache
    attn = MultiHeadAttention(D, NH, cross=True).eval()
    x, ctx = torch.randn(2, 1, D), torch.randn(2, 7, D)
    cache = KVCache()
    with torch.no_grad():
        if step == "fill_cache":
            attn.fill_cache(cache, ctx)
        else:
            y, _ = attn(x, ctx, cache=cache)
            torch.testing.assert_close(y, attn(x, ctx)[0])
        k, v = attn.keys_values(ctx, offset=0, rotate=False)  # (B, nkv, Tk, hs)
    assert cache.k.is_contiguous() and cache.v.is_contiguous()
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v)


def test_clearing_a_filled_cache_leaves_the_source_keys_alone():
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    kept = k.clone()
    cache = KVCache()
    cache.fill(k, v)  # views of the source's keys, not a copy
    cache.clear()
    cache.update(torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 2, 4))  # a storage of its own
    assert torch.equal(k, kept)
    cache.clear()
    cache.fill(k, v)  # and it can take the source's keys again
    assert cache.length == 5


def test_storage_pool_lends_a_released_caches_storage_to_the_next_cache():
    pool = StoragePool()
    ks = torch.randn(6, 2, 3, 4)  # (B, nkv, T, hs)
    first = KVCache(capacity=8, storage=pool)
    first.update(ks, -ks)
    first.reorder(torch.tensor([5, 0, 1, 2, 3, 4]))  # its spare: a second pair
    torch.testing.assert_close(first.k, ks[[5, 0, 1, 2, 3, 4]])
    addresses = {first._k.data_ptr(), first._spare[0].data_ptr()}
    assert pool.made == 2 and len(addresses) == 2
    first.release()
    assert first.k is None and first.length == 0
    for k, v in pool._free:  # nothing a later cache reads may come from the last one
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    second = KVCache(capacity=8, storage=pool)  # fewer rows: the first rows of a kept pair
    second.update(ks[:4], -ks[:4])
    second.reorder(torch.tensor([3, 3, 1]))  # fewer again: the other pair's first rows
    assert {second._k.data_ptr(), second._spare[0].data_ptr()} == addresses
    assert pool.made == 2
    torch.testing.assert_close(second.k, ks[[3, 3, 1]])
    torch.testing.assert_close(second.v, -ks[[3, 3, 1]])
    second.update(ks[:3, :, :1], ks[:3, :, :1])
    torch.testing.assert_close(second.k[:, :, 3], ks[:3, :, 0])
    second.release()
    third = KVCache(capacity=8, storage=pool)  # more rows: new pairs, which replace the old
    third.update(torch.randn(7, 2, 3, 4), torch.randn(7, 2, 3, 4))
    third.reorder(torch.arange(7))
    third.release()
    assert pool.made == 4 and len(pool._free) == 2
    other = KVCache(capacity=100, storage=pool)  # another capacity: a pair of its own
    other.update(ks, ks)
    assert pool.made == 5 and other._k.shape[2] == 100


def test_storage_pool_never_lends_one_pair_to_two_caches():
    pool = StoragePool()
    cache = KVCache(storage=pool)
    cache.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    cache.reorder(torch.tensor([1, 0]))  # a spare pair, of capacity 64
    cache.update(torch.randn(2, 1, 70, 4), torch.randn(2, 1, 70, 4))  # grown to 128
    with pytest.raises(IndexError):  # the old spare no longer fits: given back, then this fails
        cache.reorder(torch.tensor([0, 5]))
    cache.release()
    pool.give(pool.take((2, 1, 64, 4), torch.zeros(0)))  # a pair given back once...
    pool.give(pool._free[-1])  # ...and again, without being lent: not kept twice
    assert len(pool._free) == len({k.data_ptr() for k, _ in pool._free})
    caches = [KVCache(storage=pool) for _ in range(3)]
    for i, c in enumerate(caches):
        c.update(torch.full((2, 1, 1, 4), float(i)), torch.zeros(2, 1, 1, 4))
    assert len({c._k.data_ptr() for c in caches}) == 3
    assert [float(c.k[0, 0, 0, 0]) for c in caches] == [0.0, 1.0, 2.0]


# ---- MultiHeadAttention == torch.nn.MultiheadAttention with the same weights ------------

def _torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    theirs = nn.MultiheadAttention(D, NH, batch_first=True).double().eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat(
            [ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat(
            [ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return theirs


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_equals_torch_multihead_attention(impl, kind):
    ours = MultiHeadAttention(D, NH, attn_impl=impl).double().eval()
    theirs = _torch_mha(ours)
    x = torch.randn(3, 5, D, dtype=torch.float64)
    ctx = x if kind == "self" else torch.randn(3, 8, D, dtype=torch.float64)
    lengths = torch.tensor([ctx.shape[1], 3, 1])
    keep = padding_mask(lengths, ctx.shape[1])  # (B, 1, 1, Tk), True = may attend
    y_ours, _ = ours(x, None if kind == "self" else ctx, mask=keep)
    y_theirs, w_theirs = theirs(x, ctx, ctx, key_padding_mask=~keep[:, 0, 0, :],
                                need_weights=True, average_attn_weights=True)
    torch.testing.assert_close(y_ours, y_theirs)
    _, w_ours = ours(x, None if kind == "self" else ctx, mask=keep, need_weights=True)
    torch.testing.assert_close(w_ours.mean(dim=1), w_theirs)  # heads averaged: (B, Tq, Tk)


def test_causal_equals_torch_multihead_attention_with_attn_mask():
    ours = MultiHeadAttention(D, NH, causal=True).double().eval()
    theirs = _torch_mha(ours)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    y_theirs, _ = theirs(x, x, x, attn_mask=~causal_mask(6), need_weights=False)
    torch.testing.assert_close(ours(x)[0], y_theirs)


def test_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)


def test_reordering_a_filled_cache_never_writes_over_the_source_keys():
    # the projections ``fill`` kept are not a buffer for the next reorder to gather into
    projected = torch.randn(4, 10, 2, 3)  # (B, T, nkv, hs)
    kept = projected.clone()
    cache = KVCache()
    cache.fill(projected.transpose(1, 2), projected.transpose(1, 2))
    cache.reorder(torch.tensor([3, 1, 0, 2]))
    cache.reorder(torch.arange(4))
    assert torch.equal(projected, kept)
    torch.testing.assert_close(cache.k, kept.transpose(1, 2)[[3, 1, 0, 2]])
    cache.clear()  # its storage is its own now: kept for the next positions
    assert cache._k is not None
