"""Beam search's self-attention cache: a sentence's beams share one store of keys.

Beam search keeps K prefixes (beams) per sentence. After each step the K best extensions
become the next beams, and a new beam's past is its parent's; a cache of one row per beam
(``KVCache``) follows by copying each parent's keys and values into the new beam's row, at
every step and in every layer (``KVCache.reorder``). At cpu-small's sizes that copy, and
the attention that reads the copies row by row, were a fifth of a beam search's time
(docs/BENCHMARKS.md, "Beam search without moving keys").

This cache never moves a key. At position t, slot j of sentence s holds the key that beam j
wrote at step t, and each beam keeps its ancestry: which slot its ancestor wrote at each
position. After a step, a beam inherits its parent's ancestry (its row of the mask below,
K numbers per position, not the keys), and attention reads the sentence's K slots at every
position with that additive mask, which lets each beam see only its ancestors' slots:

    keys of sentence s:   K_s = [k_(0, slot 0), ..., k_(0, slot K-1), k_(1, slot 0), ...]
    beam i of sentence s: softmax(q_i K_s^T / sqrt(hs) + M_i) V_s,
                          M_i[t K + j] = 0 if slot j is beam i's ancestor at t, else -inf

Masked keys get weight exp(-inf) = 0, so this is beam i's attention over its own past,
computed as the K beams' queries of one attention (``grouped``) over K times the keys: more
arithmetic (small at a decoding step), and no key moves. The mask is the state: ``reorder``
gathers its rows (K numbers per position and beam, where its keys and values are 2 nkv hs),
and each new position writes its columns. One caveat of sharing: a key that is not finite
(an overflow) spoils the attention of its sentence's other beams too, where a cache of one
row per beam keeps it to its own beam.

``update`` returns each beam's own keys and values, gathered, as ``KVCache.update`` does:
the readable path, which the modules take (``MultiHeadAttention.forward``); the decoding
step (``nn.step``) takes ``grouped``. Tests hold the two equal.

Before the first ``reorder`` a sentence has one row (beam search decodes ``<s>`` once per
sentence), and its key is written into every slot, so that no slot is ever unwritten (the
kernel multiplies masked values by 0, and 0 * NaN is NaN). After it, every sentence has K
rows, i*K .. i*K+K-1. A ``reorder`` to fewer sentences (some stopped) gathers the stored keys
of those that go on.

Shapes: n sentences, K slots (beams), R = n*q rows (q = 1, then K), nkv heads, hs head size,
T positions. The keys are stored (n, nkv, capacity, K, hs): a head's keys of a sentence are
one contiguous (T K, hs) block, as ``KVCache`` keeps a row's.
"""

from __future__ import annotations

import torch

from .kv_cache import StoragePool, give_storage, take_storage


class BeamCache:
    """One attention layer's keys and values for a beam search of ``beams`` per sentence
    (see the module docstring). ``capacity`` and ``storage`` as for ``KVCache``."""

    def __init__(self, beams: int, capacity: int = 0, storage: StoragePool | None = None):
        if beams < 1:
            raise ValueError(f"beams must be at least 1, got {beams}")
        self.beams, self.capacity, self.storage = beams, capacity, storage
        self._k: torch.Tensor | None = None  # (n, nkv, capacity, K, hs)
        self._v: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None  # (R, capacity, K): 0 at ancestors, else -inf
        self._own: torch.Tensor | None = None  # (R, K): a new position's columns
        self._own_for = (0, 0)  # the (R, q) it was made for
        self.rows_per_sentence = 1  # q: 1 until the first reorder, then K
        self.length = 0

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new position's k, v (R, nkv, 1, hs): row i*q + j's in slot j of
        sentence i (every slot, while q = 1), and mark it each row's own."""
        r, nkv, t_new, hs = k.shape
        if t_new != 1:
            raise ValueError("a beam cache takes one position per step")
        q, g = self.rows_per_sentence, self.beams
        if r % q:
            raise ValueError(f"{r} rows are not whole sentences of {q}")
        n, t = r // q, self.length
        if self._k is None or t >= self._k.shape[2]:
            self._grow(n, nkv, hs, k)
        kk = k.view(n, q, nkv, hs).transpose(1, 2)  # (n, nkv, q, hs)
        vv = v.view(n, q, nkv, hs).transpose(1, 2)
        if q == 1:
            kk, vv = kk.expand(n, nkv, g, hs), vv.expand(n, nkv, g, hs)
        self._k[:, :, t] = kk  # (n, nkv, K, hs)
        self._v[:, :, t] = vv
        own = self._own
        if own is None or self._own_for != (r, q):
            own = torch.full((q, g), float("-inf"), dtype=k.dtype, device=k.device)
            own.fill_diagonal_(0.0)  # row j of a sentence: its own slot j
            own = self._own = own.repeat(n, 1)  # (R, K)
            self._own_for = (r, q)
        self._mask[:, t] = own
        self.length = t + 1

    def _grow(self, n: int, nkv: int, hs: int, like: torch.Tensor) -> None:
        """New storage of twice the capacity (at least ``capacity``, 64), the filled positions
        copied."""
        t, g = self.length, self.beams
        old = 0 if self._k is None else self._k.shape[2]
        cap = max(t + 1, 2 * old, self.capacity, 64)
        new_k, new_v = take_storage(self.storage, (n, nkv, cap, g, hs), like)
        mask = like.new_empty((n * self.rows_per_sentence, cap, g))
        if self._k is not None:
            new_k[:, :, :t] = self._k[:, :, :t]
            new_v[:, :, :t] = self._v[:, :, :t]
            mask[:, :t] = self._mask[:, :t]
            give_storage(self.storage, (self._k, self._v))
        self._k, self._v, self._mask = new_k, new_v, mask

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Append k, v (R, nkv, 1, hs); return each row's own cached keys and values
        (R, nkv, length, hs), gathered through its ancestry (the readable path)."""
        self._write(k, v)
        slots = self._ancestors()  # (R, length), for the keys and the values alike
        return self._own_keys(self._k, slots), self._own_keys(self._v, slots)

    def grouped(self, k: torch.Tensor, v: torch.Tensor):
        """Append k, v (R, nkv, 1, hs); return a sentence's keys and values at every slot,
        (n, nkv, length K, hs) views, and the additive mask (n, 1, q, length K) that keeps
        each of its q rows to its own ancestors (the fast path)."""
        self._write(k, v)
        t, g, q = self.length, self.beams, self.rows_per_sentence
        n, nkv, _, _, hs = self._k.shape
        keys = self._k[:, :, :t].reshape(n, nkv, t * g, hs)  # a view: (t, K) adjacent
        values = self._v[:, :, :t].reshape(n, nkv, t * g, hs)
        mask = self._mask[:, :t].reshape(n, 1, q, t * g)  # a view
        return keys, values, mask

    def _ancestors(self) -> torch.Tensor:
        """The slot each row's ancestor wrote at each position: (R, length)."""
        return self._mask[:, : self.length].argmax(dim=-1)  # the one 0 among -infs

    def _own_keys(self, store: torch.Tensor, slots: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """Each row's own keys (or values) from ``store``: (R, nkv, length, hs), through
        ``slots`` (``_ancestors``, made here where not given)."""
        t, q = self.length, self.rows_per_sentence
        rows = self._mask.shape[0]
        sentence = torch.arange(rows, device=store.device) // q  # (R,)
        per_position = store[:, :, :t].permute(0, 2, 3, 1, 4)  # (n, T, K, nkv, hs)
        steps = torch.arange(t, device=store.device)
        slots = self._ancestors() if slots is None else slots
        picked = per_position[sentence[:, None], steps[None, :], slots]
        return picked.permute(0, 2, 1, 3)  # (R, nkv, T, hs)

    @property
    def k(self) -> torch.Tensor | None:
        """Each row's cached keys (R, nkv, length, hs), gathered (a copy)."""
        return None if self._k is None else self._own_keys(self._k)

    @property
    def v(self) -> torch.Tensor | None:
        """Each row's cached values (R, nkv, length, hs), gathered (a copy)."""
        return None if self._v is None else self._own_keys(self._v)

    def reorder(self, index: torch.Tensor) -> None:
        """The rows ``index`` (R',) become the cache's rows, K per sentence: each group of K
        from one sentence, and a cache never goes back to one row per sentence. As many
        sentences as before: each group is the next beams of the sentence in its place, and
        only the ancestry moves. Fewer (sentences that stop): each group is the beams of a
        sentence that goes on, whose stored keys are gathered. The groups are checked where
        ``index`` is on the CPU; on a GPU the check would wait for the device at every step
        in every layer."""
        if self._k is None:
            return
        g, q, t = self.beams, self.rows_per_sentence, self.length
        if len(index) % g:
            raise ValueError(f"{len(index)} rows are not whole sentences of {g} beams")
        from_sentence = (index // q).view(-1, g)  # (n', K)
        n = self._k.shape[0]
        if len(from_sentence) == n:  # each sentence's next beams, in its place
            if index.device.type == "cpu" and not bool(
                    (from_sentence == torch.arange(n)[:, None]).all()):
                raise ValueError("a beam cache keeps each sentence's beams in its place")
        else:  # the sentences that go on: their stored keys gathered
            if index.device.type == "cpu" and not bool(
                    (from_sentence == from_sentence[:, :1]).all()):
                raise ValueError("a beam cache keeps each sentence's beams together")
            sentences = from_sentence[:, 0]  # (n',)
            shape = (len(sentences), *self._k.shape[1:])
            new_k, new_v = take_storage(self.storage, shape, self._k)
            torch.index_select(self._k[:, :, :t], 0, sentences, out=new_k[:, :, :t])
            torch.index_select(self._v[:, :, :t], 0, sentences, out=new_v[:, :, :t])
            give_storage(self.storage, (self._k, self._v))
            self._k, self._v = new_k, new_v
        mask = self._mask.new_empty((len(index), *self._mask.shape[1:]))
        torch.index_select(self._mask[:, :t], 0, index, out=mask[:, :t])
        self._mask, self.rows_per_sentence = mask, g

    def clear(self) -> None:
        raise NotImplementedError("a beam cache is not rebuilt: it serves one beam search")

    def drop_front(self, *args, **kwargs) -> None:
        raise NotImplementedError("a beam cache keeps every position: no context shift")

    def release(self) -> None:
        """Empty the cache and hand its storage to ``storage`` (the end of a beam search)."""
        if self._k is not None:
            give_storage(self.storage, (self._k, self._v))
        self._k = self._v = self._mask = self._own = None
        self.length, self.rows_per_sentence, self._own_for = 0, 1, (0, 0)
