"""Beam search: size 1 is greedy, a full-width beam is exhaustive, scores are what they say."""

from __future__ import annotations

import itertools

import pytest
import torch

from minitransformer.config import Seq2SeqConfig
from minitransformer.models import Seq2SeqTransformer, decoding
from minitransformer.models.decoding import (
    beam_search,
    greedy_decode,
    length_penalty_factor,
    pad_batch,
    translate_many,
)
from minitransformer.nn import StoragePool

PAD, BOS, EOS = 0, 1, 2


def make_model(vocab_size: int = 17, scale: float = 0.5, seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=vocab_size, block_size=32, n_layer=2,
                                             n_head=2, n_embd=16, d_ff=32, dropout=0.0))
    with torch.no_grad():  # far-from-uniform outputs that depend on the input
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, scale)
    return model.eval()


def sources(n: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, vocab_size, (int(torch.randint(1, 6, (1,), generator=g)),),
                          generator=g).tolist() + [EOS] for _ in range(n)]
    return pad_batch(rows, PAD)


@torch.no_grad()
def sequence_logprob(model, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens </s> | src) by teacher forcing, with the decoders' rule that <pad> and <s>
    are never produced (their probability mass is simply lost, not renormalised)."""
    tgt_in = torch.tensor([[BOS] + tokens])
    tgt_out = torch.tensor(tokens + [EOS])
    logits, _ = model(src, tgt_in)
    logp = torch.log_softmax(logits[0].float(), dim=-1)  # (T, V)
    return float(logp[torch.arange(len(tgt_out)), tgt_out].sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(seed, alpha):
    model = make_model(seed=seed)
    src = sources(6, 17, seed)
    greedy = greedy_decode(model, src, max_len=12)
    beam = beam_search(model, src, beam_size=1, max_len=12, length_penalty=alpha)
    assert beam.tokens == greedy.tokens
    if alpha == 0.0:
        assert beam.scores == pytest.approx(greedy.scores, abs=1e-4)
    # the tokens alone: chosen from the logits, the same tokens, no scores
    alone = greedy_decode(model, src, max_len=12, min_len=2 * seed, scores=False)
    with_scores = greedy_decode(model, src, max_len=12, min_len=2 * seed)
    assert alone.tokens == with_scores.tokens and alone.scores is None
    assert all(len(t) >= 2 * seed for t in alone.tokens)


def exhaustive(model, src_row: torch.Tensor, vocab_size: int, max_len: int, alpha: float):
    """Score every translation of at most max_len tokens (then </s>); return the best."""
    real = range(3, vocab_size)
    best, best_score = None, float("-inf")
    for n in range(max_len + 1):
        for seq in itertools.product(real, repeat=n):
            score = sequence_logprob(model, src_row, list(seq)) / \
                length_penalty_factor(n + 1, alpha)
            if score > best_score:
                best, best_score = list(seq), score
    return best, best_score


def discourage_early_end(model, bias: float = 1.5):
    """Lower the </s> logit at the first target position, so that the best translation is
    not simply the empty one (a random model's </s> is often likely at once)."""
    decode = model.decode

    def biased(tgt, memory, src_mask, cache=None, need_weights=False):
        past = cache[0][0].length if cache else 0  # positions already decoded
        logits, internals = decode(tgt, memory, src_mask, cache, need_weights)
        first = (past + torch.arange(tgt.shape[1])) == 0  # (T,)
        logits = logits.clone()
        logits[:, first, EOS] -= bias
        return logits, internals

    model.decode = biased  # forward() and the decoders all go through model.decode
    return model


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_full_width_beam_finds_the_exhaustive_best(alpha):
    # Vocabulary <pad> <s> </s> a b and a beam as wide as the vocabulary (5). With at most 2
    # tokens before </s> the beam never has to drop a prefix that could still win: after
    # step 1 it holds both one-token prefixes, after step 2 all four two-token ones, and the
    # only candidate it may lose (the 6th of 6 at step 2) ends in </s> below another such
    # candidate of the same length. So it must find exactly the exhaustive optimum.
    v, max_len = 5, 2
    greedy_missed, lengths = 0, set()
    for seed in range(4):
        model = discourage_early_end(make_model(vocab_size=v, scale=0.5, seed=seed))
        src = sources(4, v, seed)
        beam = beam_search(model, src, beam_size=v, max_len=max_len, length_penalty=alpha)
        greedy = greedy_decode(model, src, max_len=max_len)
        for i in range(src.shape[0]):
            row = src[i:i + 1, : int((src[i] != PAD).sum())]
            want, want_score = exhaustive(model, row, v, max_len, alpha)
            assert beam.tokens[i] == want
            assert beam.scores[i] == pytest.approx(want_score, abs=1e-4)
            greedy_missed += greedy.tokens[i] != want
            lengths.add(len(want))
    assert greedy_missed > 0  # the search had something to find beyond the greedy path
    assert len(lengths) > 1


def test_beam_scores_are_length_normalised_logprobs():
    model = make_model(seed=4)
    src = sources(5, 17, seed=4)
    for alpha in (0.0, 1.0):
        out = beam_search(model, src, beam_size=4, max_len=10, length_penalty=alpha)
        for i, toks in enumerate(out.tokens):
            row = src[i:i + 1, : int((src[i] != PAD).sum())]
            want = sequence_logprob(model, row, toks) / length_penalty_factor(len(toks) + 1,
                                                                              alpha)
            assert out.scores[i] == pytest.approx(want, abs=1e-4)


def test_wider_beam_scores_at_least_as_well_here_and_batches_equal_single():
    model = make_model(seed=5)
    src = sources(6, 17, seed=5)
    greedy = greedy_decode(model, src, max_len=10)
    beam = beam_search(model, src, beam_size=4, max_len=10)
    assert all(b >= g - 1e-5 for b, g in zip(beam.scores, greedy.scores, strict=True))
    for i in range(src.shape[0]):
        row = src[i:i + 1, : int((src[i] != PAD).sum())]
        assert beam_search(model, row, beam_size=4, max_len=10).tokens[0] == beam.tokens[i]


def test_max_len_and_never_pad_or_bos():
    model = make_model(seed=6)
    src = sources(8, 17, seed=6)
    for k in (1, 3):
        out = translate_many(model, [r[r != PAD].tolist() for r in src], beam_size=k,
                             max_len=3, batch_size=3)
        assert all(len(t) <= 3 for t in out)
        assert all(PAD not in t and BOS not in t and EOS not in t for t in out)
        direct = (greedy_decode(model, src, max_len=3) if k == 1
                  else beam_search(model, src, k, max_len=3)).tokens
        assert out == direct  # sorted into length batches, returned in input order


@pytest.mark.parametrize("k", [1, 3])
def test_min_len_holds_back_the_end_and_equal_bounds_force_the_length(k):
    model = make_model(seed=5)  # a model whose translations sometimes end at once
    src = sources(6, 17, seed=5)
    free = beam_search(model, src, k, max_len=12) if k > 1 else greedy_decode(model, src, 12)
    assert min(len(t) for t in free.tokens) < 5  # without it some translations end early
    decode = (lambda **kw: beam_search(model, src, k, **kw)) if k > 1 else \
        (lambda **kw: greedy_decode(model, src, **kw))
    held = decode(max_len=12, min_len=5)
    assert all(5 <= len(t) <= 12 for t in held.tokens)
    for i, toks in enumerate(held.tokens):  # the score is still the sequence's log-probability
        row = src[i:i + 1, : int((src[i] != PAD).sum())]
        if k == 1:
            assert held.scores[i] == pytest.approx(sequence_logprob(model, row, toks), abs=1e-4)
    exact = decode(max_len=7, min_len=7)
    assert all(len(t) == 7 for t in exact.tokens)
    assert decode(max_len=12, min_len=0).tokens == free.tokens
    many = translate_many(model, [r[r != PAD].tolist() for r in src], beam_size=k, max_len=7,
                          min_len=7, batch_size=4)
    assert many == exact.tokens


def test_min_len_option_is_checked():
    from minitransformer.errors import UserError
    from minitransformer.families.seq2seq import decoding_options

    assert decoding_options({"min_len": 3, "max_len": 5})["min_len"] == 3
    assert decoding_options({})["min_len"] == 0
    with pytest.raises(UserError, match="--min_len"):
        decoding_options({"min_len": 6, "max_len": 5})
    assert decoding_options({"beam": 1})["beam"] == 1
    for bad in ({"beam": 0}, {"length_penalty": float("nan")}, {"length_penalty": 1e308},
                {"length_penalty": -0.1}):
        with pytest.raises(UserError, match=f"--{next(iter(bad))}"):
            decoding_options(bad)


def test_min_len_without_max_len_raises_the_default_within_the_positions():
    from minitransformer.errors import UserError
    from minitransformer.families.seq2seq import decoding_options

    sinusoidal = make_model(seed=5)  # positions without an end
    src = sources(3, 17, seed=5)  # the default max_len is 1.5 x the longest source + 10
    assert all(len(t) == 60 for t in greedy_decode(sinusoidal, src, min_len=60).tokens)
    assert decoding_options({"min_len": 500}, sinusoidal)["min_len"] == 500
    torch.manual_seed(0)
    learned = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=17, block_size=32, n_layer=1,
                                               n_head=2, n_embd=16, pos_encoding="learned"))
    assert decoding_options({"min_len": 31}, learned.eval())["min_len"] == 31
    for flag in ("min_len", "max_len"):  # the decoder's input <s> y_1 .. y_31 fills 32
        with pytest.raises(UserError, match=f"--{flag} must be at most 31"):
            decoding_options({flag: 32}, learned)
    assert all(len(t) == 31 for t in greedy_decode(learned, src, min_len=31).tokens)
    assert all(len(t) == 31 for t in beam_search(learned, src, 2, max_len=31, min_len=31).tokens)
    for decode in (greedy_decode, lambda *a, **k: beam_search(*a, beam_size=2, **k)):
        with pytest.raises(ValueError, match="past the learned position table"):
            decode(learned, src, max_len=32)


@pytest.mark.parametrize("beam", [1, 3])
def test_without_max_len_each_sentence_has_its_own_limit(beam):
    # a translation must not depend on the sentences batched with it
    model = make_model(seed=3)
    with torch.no_grad():  # </s> (logit 0) is never the likeliest: translations run long
        model.tok_emb.weight[EOS] = 0.0
    rows = [[5, 6, EOS], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 4, 5, 6, 7, EOS]]

    def decode(src):
        return (greedy_decode(model, src) if beam == 1 else beam_search(model, src, beam)).tokens

    together = decode(pad_batch(rows, PAD))
    alone = [decode(pad_batch([row], PAD))[0] for row in rows]
    assert together == alone
    if beam == 1:  # the short one stops at its own limit, 1.5 x 3 + 10, not the long one's 32
        assert [len(t) for t in together] == [14, 32]


def test_first_step_decodes_one_row_per_sentence():
    # every beam starts as <s>: the first step decodes each sentence once, not K times
    model = make_model(seed=7)
    src = sources(5, 17, seed=7)
    want = beam_search(model, src, beam_size=4, max_len=8)
    rows = []
    decode = model.decode

    def counting(tgt, memory, src_mask, cache=None, need_weights=False):
        rows.append(tgt.shape[0])
        return decode(tgt, memory, src_mask, cache, need_weights)

    model.decode = counting
    for use_cache in (True, False):
        rows.clear()
        got = beam_search(model, src, beam_size=4, max_len=8, use_cache=use_cache)
        assert rows[0] == 5 and rows[1] == 20
        assert got.tokens == want.tokens
        assert got.scores == pytest.approx(want.scores, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_storage_kept_between_calls_decodes_as_new_storage(beam):
    model = make_model(seed=3)
    pool = StoragePool()
    for seed, n in ((1, 6), (2, 3), (3, 6), (4, 8)):
        src = sources(n, 17, seed=seed)
        if beam == 1:
            want = greedy_decode(model, src, max_len=9)
            got = greedy_decode(model, src, max_len=9, storage=pool)
        else:
            want = beam_search(model, src, beam_size=beam, max_len=9)
            got = beam_search(model, src, beam_size=beam, max_len=9, storage=pool)
        assert got.tokens == want.tokens
        assert got.scores == pytest.approx(want.scores, abs=1e-5)
        for k, v in pool._free:  # the next call must not read what this one left
            k.fill_(float("nan"))
            v.fill_(float("nan"))
    assert pool.made > 0 and not pool._lent  # every cache gave its storage back


def test_translate_many_allocates_cache_storage_once_for_all_batches(monkeypatch):
    model = make_model(seed=5)
    src = sources(4, 17, seed=5)
    one = StoragePool()
    beam_search(model, src, beam_size=3, max_len=7, storage=one)
    pools = []

    class Kept(StoragePool):
        def __init__(self):
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(decoding, "StoragePool", Kept)
    rows = [[t for t in row.tolist() if t != PAD] for row in src]
    translate_many(model, rows * 3, beam_size=3, max_len=7, batch_size=4)
    assert len(pools) == 1 and pools[0].made == one.made  # three batches, one batch's storage


def test_storage_kept_through_a_growing_cache_and_a_failed_call():
    # outputs past 64 tokens double each cache's capacity: the pool takes the old pair back
    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=17, block_size=128, n_layer=2, n_head=2,
                                             n_embd=16, d_ff=32, dropout=0.0)).eval()
    src = sources(3, 17, seed=9)
    pool = StoragePool()
    for beam in (1, 2, 1, 2):
        decode = greedy_decode if beam == 1 else beam_search
        kwargs = {} if beam == 1 else {"beam_size": beam}
        want = decode(model, src, max_len=70, min_len=70, **kwargs)
        got = decode(model, src, max_len=70, min_len=70, storage=pool, **kwargs)
        assert got.tokens == want.tokens and all(len(t) == 70 for t in got.tokens)
        assert got.scores == pytest.approx(want.scores, abs=1e-4)
        for k, v in pool._free:
            k.fill_(float("nan"))
            v.fill_(float("nan"))
    made = pool.made
    calls = 0
    step = model.decode

    def failing(*args, **kwargs):  # the fourth step of the next call fails
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("stopped")
        return step(*args, **kwargs)

    model.decode = failing
    with pytest.raises(RuntimeError, match="stopped"):
        beam_search(model, src, beam_size=2, max_len=70, min_len=70, storage=pool)
    assert not pool._lent  # a call that fails gives its storage back too
    model.decode = step
    beam_search(model, src, beam_size=2, max_len=70, min_len=70, storage=pool)
    assert pool.made == made
