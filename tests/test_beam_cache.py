"""The beam cache: each beam's keys through its ancestry equal a row-per-beam cache's, and its
grouped, masked attention equals each beam's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitransformer.config import Seq2SeqConfig
from minitransformer.models import Seq2SeqTransformer
from minitransformer.models.decoding import beam_search, pad_batch
from minitransformer.models.generation import decoding_weights
from minitransformer.nn import BeamCache, KVCache, StoragePool

N, K, NKV, HS = 3, 3, 2, 4


def steps(seed: int = 0):
    """A beam search's moves for N sentences of K beams: (new k, v, then the rows kept).
    The first step has one row per sentence; then within-sentence reorders, 70 positions in
    all (past the first storage's 64), with a sentence left out and two swapped."""
    g = torch.Generator().manual_seed(seed)
    n, rows = N, N  # sentences, rows
    for t in range(70):
        k, v = torch.randn(rows, NKV, 1, HS, generator=g), torch.randn(rows, NKV, 1, HS,
                                                                       generator=g)
        q = rows // n
        parent = torch.randint(0, q, (n, K), generator=g)  # each new beam's parent
        index = (torch.arange(n)[:, None] * q + parent).view(-1)  # (n K,)
        if t == 30:  # the middle sentence stops, the other two swap
            keep = torch.tensor([2, 0])
            index = (keep[:, None] * q + parent[keep]).view(-1)
            n = 2
        yield k, v, index
        rows = n * K


def test_each_beams_keys_are_a_row_per_beam_caches():
    plain, beam = KVCache(), BeamCache(K, capacity=8)
    for k, v in ((c.k, c.v) for c in (plain, beam)):
        assert k is None and v is None
    for k, v, index in steps():
        want_k, want_v = plain.update(k, v)
        got_k, got_v = beam.update(k, v)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        plain.reorder(index)
        beam.reorder(index)
    assert beam.length == plain.length == 70 and beam._k.shape[2] == 128  # grew past 64


def attend_through(beam: BeamCache, reference: BeamCache) -> None:
    """Run ``steps`` through both caches, checking ``beam``'s grouped attention against
    each row's own keys from ``reference`` (SDPA with two query heads per key head)."""
    g = torch.Generator().manual_seed(1)
    for k, v, index in steps(seed=1):
        q = torch.randn(k.shape[0], 2 * NKV, 1, HS, generator=g)
        keys, values = reference.update(k, v)  # (R, nkv, T, hs): each row's own
        want = F.scaled_dot_product_attention(q, keys.repeat_interleave(2, 1),
                                              values.repeat_interleave(2, 1))
        keys, values, mask = beam.grouped(k, v)  # (n, nkv, T K, hs), (n, 1, q, T K)
        n, _, rows, tk = mask.shape
        assert tk == K * beam.length and rows * n == k.shape[0]
        got = F.scaled_dot_product_attention(
            q.view(n, rows, 2 * NKV, HS).transpose(1, 2), keys.repeat_interleave(2, 1),
            values.repeat_interleave(2, 1), attn_mask=mask)  # (n, nh, q, hs)
        got = got.transpose(1, 2).reshape(-1, 2 * NKV, 1, HS)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        beam.reorder(index)
        reference.reorder(index)
    beam.release()
    reference.release()


def test_grouped_attention_equals_each_beams_own():
    pool = StoragePool()
    attend_through(BeamCache(K, storage=pool), BeamCache(K))
    assert not pool._lent and pool._free  # every pair back
    # storage handed out again holds what the last search left (here NaN, inf): never read
    for k, v in pool._free:
        k.fill_(float("nan"))
        v.fill_(float("inf"))
    made = pool.made
    attend_through(BeamCache(K, storage=pool), BeamCache(K))
    assert pool.made == made  # the kept storage served every take


def test_rows_must_come_in_whole_sentences():
    cache = BeamCache(2)
    cache.update(torch.zeros(2, 1, 1, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(ValueError, match="whole sentences"):
        cache.reorder(torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="in its place"):
        cache.reorder(torch.tensor([1, 1, 0, 0]))  # as many sentences: each in its place
    cache.reorder(torch.tensor([0, 0, 1, 1]))  # one row per sentence, then K
    with pytest.raises(ValueError, match="together"):
        cache.reorder(torch.tensor([0, 2]))  # fewer sentences: whole ones
    cache.reorder(torch.tensor([3, 2]))  # the second sentence goes on
    with pytest.raises(ValueError, match="one position"):
        cache.update(torch.zeros(4, 1, 2, 4), torch.zeros(4, 1, 2, 4))
    with pytest.raises(ValueError, match="at least 1"):
        BeamCache(0)


@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("fast", [False, True])
def test_beam_search_through_the_beam_cache_equals_no_cache(pos_encoding, fast, monkeypatch):
    """Through the decoding step's grouped attention (``fast``) and through the modules
    (reference attention), which gather each beam's keys."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(
        vocab_size=23, block_size=32, n_layer=2, n_head=2, n_embd=16, d_ff=32, dropout=0.0,
        pos_encoding=pos_encoding, attn_impl="auto" if fast else "reference")).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5)
    g = torch.Generator().manual_seed(2)
    src = pad_batch([torch.randint(3, 23, (int(n),), generator=g).tolist() + [2]
                     for n in (4, 1, 6, 3)], 0)
    calls = {"grouped": 0, "update": 0}
    for name in calls:
        method = getattr(BeamCache, name)

        def counted(self, *args, _name=name, _method=method):
            calls[_name] += 1
            return _method(self, *args)
        monkeypatch.setattr(BeamCache, name, counted)
    want = beam_search(model, src, beam_size=3, max_len=12, length_penalty=0.6,
                       use_cache=False)
    with decoding_weights(model):
        got = beam_search(model, src, beam_size=3, max_len=12, length_penalty=0.6)
    assert calls["grouped" if fast else "update"] > 0
    assert calls["update" if fast else "grouped"] == 0
    assert got.tokens == want.tokens
    assert got.scores == pytest.approx(want.scores, abs=1e-5)
