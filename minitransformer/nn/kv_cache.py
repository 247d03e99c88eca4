"""The KV cache: the keys and values of one attention layer kept between decoding steps.

Each new position attends to every earlier one, whose keys and values (x W^K, x W^V) do not
change once computed in a causal decoder; so decoding keeps them, and a step computes the
projections and the FFN of the newest position only, attending over the kept keys
(``MultiHeadAttention`` appends to the cache; generation and beam search hold one per
layer, ``new_cache``).

Shapes: B batch, nkv key/value heads, hs head size, T positions.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of one attention layer kept between decoding steps.

    Self-attention appends the new position's k, v each step; cross-attention fills it once
    from the encoder output. Storage grows by doubling, so each step writes only the new
    slice instead of re-concatenating the whole history.

    The storage is laid out (B, nkv, capacity, hs), head-major: each head's keys of a row are
    one contiguous block, which a decoding step's attention reads whole (the fused kernel
    takes one (row, head) pair at a time). Appending a position writes nkv short runs a
    capacity apart. Position-major storage, (B, capacity, nkv, hs), writes one run instead
    but leaves attention reading each key a head-width apart from the last, and reading is
    what a step spends its time on once the weights and caches outgrow the CPU's last-level
    cache: on a 2-core machine with a 32 MB L3, a batch of 8 sampled its 500 tokens 6-9%
    faster head-major, one row 1-4% (docs/BENCHMARKS.md, "The KV cache head-major"). ``k`` and
    ``v`` read it as (B, nkv, length, hs) views, which attention takes as they are. A
    cross-attention cache keeps the keys it is given, without a copy (``fill``): its
    module gives it head-major copies of the source's (``MultiHeadAttention.fill_cache``).

    ``capacity``: the positions the first storage holds at least. Generation passes its
    window, ``block_size``, and a cache rebuilt from a moved window keeps its storage
    (``clear``): the storage is made once, at the window's size, where growing by doubling
    from the prompt made three and, after each context shift, one of 1.5 windows (block_size
    256: 192 positions, then 384). Time is about the same either way (a batch of 8, 500
    tokens: 2.19-2.36 s against 2.20-2.26 s).
    """

    def __init__(self, capacity: int = 0, storage: StoragePool | None = None):
        self.capacity = capacity
        self.storage = storage  # where new storage comes from and ``release`` returns it
        self._k: torch.Tensor | None = None  # (B, nkv, capacity, hs)
        self.borrowed = False  # the storage is ``fill``'s views of another tensor
        self._v: torch.Tensor | None = None
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # reorder's other buffer
        self.length = 0
        self.group = 1  # batch rows served by each cached row (beams of one sentence)
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None  # (mask, ``additive``)

    @property
    def k(self) -> torch.Tensor | None:
        """The cached keys (B, nkv, length, hs), a view."""
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> torch.Tensor | None:
        """The cached values (B, nkv, length, hs), a view."""
        return None if self._v is None else self._v[:, :, : self.length]

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Append k, v of shape (B, nkv, T, hs); return all cached (B, nkv, length, hs)."""
        t0, t1 = self.length, self.length + k.shape[-2]
        if self._k is None or t1 > self._k.shape[2]:
            cap = max(t1, 2 * (0 if self._k is None else self._k.shape[2]), self.capacity, 64)
            b, nkv, _, hs = k.shape
            new_k, new_v = take_storage(self.storage, (b, nkv, cap, hs), k)
            if self._k is not None:
                new_k[:, :, :t0] = self._k[:, :, :t0]
                new_v[:, :, :t0] = self._v[:, :, :t0]
                if not self.borrowed:
                    give_storage(self.storage, (self._k, self._v))
            self._k, self._v = new_k, new_v
        self._k[:, :, t0:t1] = k  # (B, nkv, T, hs)
        self._v[:, :, t0:t1] = v
        self.length = t1
        return self.k, self.v

    def clear(self) -> None:
        """Forget every position and keep the storage for the next ones (a cache rebuilt after
        a context shift, of the same batch). The keys ``fill`` kept are another tensor's
        views: dropped, never written over."""
        if self.borrowed:
            self._k = self._v = None
            self.borrowed = False
        self.length = 0

    def fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep k, v (B, nkv, T, hs) as the whole of an empty cache, without copying them
        (cross-attention's keys of the source, which are never appended to)."""
        if self.length:
            raise ValueError("fill is for an empty cache")
        self._k, self._v = k, v  # (B, nkv, T, hs) views of the projections, as they are
        self.borrowed = True
        self.length = k.shape[-2]

    def additive(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The boolean key ``mask`` (True = may attend) as the bias the fused kernel adds:
        0 where True, -inf where False. Made once per mask, not at every step as the kernel
        would make it from the boolean one (a cross-attention's mask holds for the whole
        translation)."""
        held = self._bias
        if held is None or held[0] is not mask or held[1].dtype != dtype:
            bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            held = self._bias = (mask, bias.masked_fill_(~mask, float("-inf")))
        return held[1]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows: index (B',), the rows that go on (greedy search's unfinished
        sentences, a ragged batch's rows, the sentences of a beam search for its
        cross-attention caches, a beam search of one beam at every step). The filled
        positions of the chosen rows are gathered
        into a second buffer kept from the previous reorder (no fresh allocation each time;
        the first B' rows of a larger one where rows have finished), and the two buffers
        swap. A beam search of more beams keeps its keys in a ``BeamCache`` instead, which
        moves none."""
        if self._k is None:
            return
        shape = (len(index), *self._k.shape[1:])  # (B', nkv, capacity, hs)
        spare = self._spare
        if spare is not None and not _fits(spare[0], shape, self._k):
            self._spare = None  # given back: never twice, should what follows fail
            give_storage(self.storage, spare)
            spare = None
        spare = take_storage(self.storage, shape, self._k) if spare is None else \
            (spare[0][: shape[0]], spare[1][: shape[0]])
        n = self.length  # only the filled positions are copied
        torch.index_select(self._k[:, :, :n], 0, index, out=spare[0][:, :, :n])
        torch.index_select(self._v[:, :, :n], 0, index, out=spare[1][:, :, :n])
        # the source's keys ``fill`` kept are another tensor's views: never a buffer to reuse
        self._spare = None if self.borrowed else (self._k, self._v)
        self._k, self._v = spare  # (B', nkv, capacity, hs)
        self.borrowed = False

    def release(self) -> None:
        """Empty the cache, and hand its storage to ``storage`` for the next cache to take
        (the end of a decoding call); without ``storage`` this is ``clear`` and more."""
        if not self.borrowed and self._k is not None:
            give_storage(self.storage, (self._k, self._v))
        if self._spare is not None:
            give_storage(self.storage, self._spare)
        self._k = self._v = self._spare = None
        self.borrowed, self.length, self._bias, self.group = False, 0, None, 1

    def drop_front(self, n: int, rekey=None, after: int = 0) -> None:
        """Forget the oldest ``n`` positions after the first ``after`` (a context shift; the
        first ``after`` stay where they are); the newest ``length - after - n`` move up to
        follow them. ``rekey`` (optional) maps those moved keys (B, nkv, T', hs) to the keys
        to keep instead (RoPE's re-rotation)."""
        if n <= 0 or self._k is None or self.length <= after:
            return
        a = after
        moved = max(self.length - a - n, 0)
        if moved:
            k = self._k[:, :, a + n: self.length]  # (B, nkv, moved, hs)
            self._k[:, :, a:a + moved] = rekey(k) if rekey is not None else k.clone()
            self._v[:, :, a:a + moved] = self._v[:, :, a + n: self.length].clone()
        self.length = a + moved


def take_storage(storage: StoragePool | None, shape: tuple[int, ...],
                 like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Storage for keys and values of ``shape``, ``like``'s dtype and device: from
    ``storage``, or new where it is None."""
    if storage is not None:
        return storage.take(shape, like)
    return like.new_empty(shape), like.new_empty(shape)


def give_storage(storage: StoragePool | None, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Hand ``pair`` back to ``storage`` (where there is one) for a later take."""
    if storage is not None:
        storage.give(pair)


def _same_kind(held: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> bool:
    """Whether ``held`` has ``shape``'s sizes but the rows, and ``like``'s dtype and device
    (and can be written here: a tensor made in inference mode only there)."""
    return held.shape[1:] == tuple(shape[1:]) and held.dtype == like.dtype \
        and held.device == like.device \
        and (not held.is_inference() or torch.is_inference_mode_enabled())


def _fits(held: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> bool:
    """Whether ``held``'s first rows can serve as storage of ``shape`` like ``like``."""
    return _same_kind(held, shape, like) and held.shape[0] >= shape[0]


class StoragePool:
    """Self-attention cache storage kept from one decoding call for the next.

    A cache's storage is large (a beam search of 32 sentences x 4 beams at cpu-small's sizes:
    4 MB per layer for keys, as much for values), and storage
    that large, freshly allocated, reaches the program as untouched pages of memory: the
    operating system maps each on its first write. Translating one batch after another
    allocated it anew for each, 7,000-12,000 page faults per cpu-small beam-4 batch; taken
    from the batch before, the batch takes none, and 13-23% less time on its own, 6-8% with
    other work between batches (docs/BENCHMARKS.md, "Cache storage kept between batches").
    ``translate_many`` keeps one pool for all its batches.

    Storage is kept in key/value pairs. ``take`` hands out the first rows of the smallest
    pair that has enough rows and the same other sizes, or a new pair; ``give`` takes back
    the whole pair a view was cut from. A new pair replaces the kept pairs with its other
    sizes and fewer rows, which it can serve in their place once given back. So the pool
    holds what one call used at most, per capacity that came up (a beam search: a pair per
    layer, and one more where some sentences stop and the rest are gathered; outputs longer
    than 64 tokens double a cache's capacity), never one set per batch, and it frees nothing
    while it lives. ``nn.beam_cache.BeamCache`` takes its storage the same way.
    """

    def __init__(self):
        self._free: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._lent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by address: whole pair
        self.made = 0  # pairs allocated so far

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Keys and values storage of ``shape`` (B, nkv, capacity, hs), like ``like``."""
        fits = [i for i, (k, _) in enumerate(self._free) if _fits(k, shape, like)]
        if fits:
            pair = self._free.pop(min(fits, key=lambda i: self._free[i][0].shape[0]))
        else:
            # none of this kind has enough rows: the new pair will serve in their place
            self._free = [p for p in self._free if not _same_kind(p[0], shape, like)]
            pair = (like.new_empty(shape), like.new_empty(shape))
            self.made += 1
        self._lent[pair[0].data_ptr()] = pair
        return pair[0][: shape[0]], pair[1][: shape[0]]  # the first rows: the same address

    def give(self, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep this storage (a cache no longer uses it) for a later ``take``: the whole
        pair it was cut from. Storage that is not lent (given back already, or never taken
        from this pool) is not kept: two caches must never share a pair."""
        whole = self._lent.pop(pair[0].data_ptr(), None)
        if whole is not None:
            self._free.append(whole)
