"""Batched sampling: N samples generated together equal the same N generated one by one.

Row i of a batch draws from its own generator seeded ``seed + i``, so sample i can be
reproduced alone with ``seed + i``. In fp64 the batched and the single-row kernels agree far
below any sampling threshold, so the texts are equal token for token; in fp32 they may differ
in the last bits, and over long runs a token now and then lands on the other side of a
threshold (``bench/generation.py`` counts how often; docs/BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
import torch

from minitransformer.models.generation import race, row_generators, sample_next


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.8, top_k=5),
                                dict(temperature=1.2, top_p=0.9)])
def test_batched_samples_equal_one_by_one_in_fp64(make_gpt, pos, kw):
    model = make_gpt(scale=0.3, pos_encoding=pos).double()  # block_size 16
    prompt = torch.randint(0, 13, (1, 4))
    n_samples, n_new, seed = 5, 45, 11  # 45 tokens: the window shifts several times
    batch = model.generate(prompt.repeat(n_samples, 1), n_new, seed=seed, **kw)
    assert batch.shape == (n_samples, 4 + n_new)
    for i in range(n_samples):
        alone = model.generate(prompt, n_new, seed=seed + i, **kw)
        assert torch.equal(batch[i:i + 1], alone), i
    assert len({tuple(row.tolist()) for row in batch}) == n_samples  # all different


def test_batched_samples_in_exact_mode_and_without_cache(make_gpt):
    model = make_gpt(scale=0.3, pos_encoding="learned").double()
    prompt = torch.randint(0, 13, (1, 2))
    for kw in (dict(context_shift=0), dict(use_cache=False)):
        batch = model.generate(prompt.repeat(3, 1), 30, temperature=1.0, seed=5, **kw)
        for i in range(3):
            assert torch.equal(batch[i:i + 1],
                               model.generate(prompt, 30, temperature=1.0, seed=5 + i, **kw))


def test_one_generator_per_row_draws_as_that_row_would_alone():
    logits = torch.randn(4, 30)
    gens = row_generators(3, 4, "cpu")
    together = sample_next(logits, temperature=1.0, top_k=10, generator=gens)  # (4, 1)
    for i in range(4):
        alone = sample_next(logits[i:i + 1], temperature=1.0, top_k=10,
                            generator=torch.Generator().manual_seed(3 + i))
        assert torch.equal(together[i:i + 1], alone)
    assert row_generators(None, 4, "cpu") is None


@pytest.mark.parametrize("vocab", [65, 4000, 50257])
def test_the_race_draws_what_torch_multinomial_draws(vocab):
    # Row by row, over many seeds, peaked and flat distributions, some tokens filtered out.
    g = torch.Generator().manual_seed(0)
    for seed in range(40 if vocab < 50000 else 5):
        logits = torch.randn(6, vocab, generator=g) * (0.5 + seed % 4)
        logits[:, ::7] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        raced = race(probs, row_generators(seed, 6, "cpu"))  # (6, 1)
        drawn = torch.cat([torch.multinomial(p[None], 1, generator=gen) for p, gen in
                           zip(probs, row_generators(seed, 6, "cpu"), strict=True)])
        assert torch.equal(raced, drawn)


def test_the_race_refuses_nan_as_torch_multinomial_does():
    probs = torch.tensor([[0.5, float("nan")]])
    with pytest.raises(RuntimeError, match="nan"):
        race(probs, row_generators(0, 1, "cpu"))


def test_a_seeded_batch_of_one_is_what_it_was(make_gpt):
    # Batch 1 with seed s draws exactly as a single generator seeded s always did.
    model = make_gpt(scale=0.3)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    out = model.generate(prompt, 10, temperature=1.0, seed=7)
    gen = torch.Generator().manual_seed(7)
    idx = prompt
    with torch.no_grad():
        for _ in range(10):
            logits, _ = model(idx)
            probs = torch.softmax(logits[:, -1].float(), dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=gen)], dim=1)
    assert torch.equal(out, idx)
