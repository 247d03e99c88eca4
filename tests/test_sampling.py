"""Sampling: greedy, top-k, top-p (nucleus), temperature, seeds."""

from __future__ import annotations

import pytest
import torch

from minitransformer.models.generation import filter_logits, sample_next

PROBS = [0.5, 0.3, 0.15, 0.05]


def _kept(logits: torch.Tensor) -> list[bool]:
    return torch.isfinite(logits)[0].tolist()


def test_top_k_one_is_greedy():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(4, 50)
        picked = sample_next(logits, temperature=1.0, top_k=1, generator=gen)
        assert torch.equal(picked[:, 0], logits.argmax(-1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    assert _kept(filter_logits(logits, top_k=3)) == [False, True, True, True, False]
    assert _kept(filter_logits(logits, top_k=99)) == [True] * 5  # more than V: keep all


@pytest.mark.parametrize("p, kept", [
    (0.4, 1),  # 0.5 alone reaches 0.4
    (0.5, 1),  # reaches it exactly
    (0.75, 2),  # 0.5 < 0.75 <= 0.5 + 0.3
    (0.8, 2),  # 0.5 + 0.3 reaches 0.8 exactly
    (0.81, 3),
    (0.95, 3),
    (0.99, 4),
    (1.0, 4),
])
def test_top_p_keeps_smallest_set_reaching_p(p, kept):
    logits = torch.tensor([PROBS]).log()
    assert _kept(filter_logits(logits, top_p=p)) == [i < kept for i in range(4)]


def test_top_p_in_shuffled_vocabulary_order_and_per_row():
    order = [2, 0, 3, 1]  # token 2 has 0.5, token 0 has 0.3, token 3 has 0.15, token 1 0.05
    probs = torch.zeros(4)
    probs[order] = torch.tensor(PROBS)
    other = torch.tensor([0.05, 0.05, 0.1, 0.8])  # second row: one token holds 0.8
    logits = torch.stack([probs, other]).log()
    kept = torch.isfinite(filter_logits(logits, top_p=0.75)).tolist()
    assert kept == [[True, False, True, False], [False, False, False, True]]


def test_top_p_samples_only_from_nucleus_in_proportion():
    logits = torch.tensor([PROBS]).log().repeat(20000, 1)
    gen = torch.Generator().manual_seed(1)
    picks = sample_next(logits, temperature=1.0, top_p=0.75, generator=gen)[:, 0]
    counts = torch.bincount(picks, minlength=4).double() / len(picks)
    assert counts[2] == 0 and counts[3] == 0
    assert counts[0].item() == pytest.approx(0.5 / 0.8, abs=0.02)  # renormalised 0.625


def test_temperature_to_zero_approaches_greedy():
    logits = torch.tensor([[1.0, 1.5, 1.2, 0.3]])
    p_max = [torch.softmax(logits / t, dim=-1)[0, 1].item() for t in (2.0, 1.0, 0.5, 0.1, 0.01)]
    assert p_max == sorted(p_max) and p_max[0] < 0.4 and p_max[-1] > 0.999999
    gen = torch.Generator().manual_seed(0)
    draws = sample_next(logits.repeat(1000, 1), temperature=1e-3, generator=gen)
    assert torch.all(draws == 1)
    hot = sample_next(logits.repeat(1000, 1), temperature=1.0, generator=gen)
    assert len(torch.unique(hot)) == 4  # at temperature 1 every token shows up
    assert torch.equal(sample_next(logits, temperature=0.0), torch.tensor([[1]]))


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 1e-40, 1e-45, 1e-46, 1e-300, 5e-324])
def test_a_vanishing_temperature_draws_the_largest_logit(temperature):
    """logits / 1e-40 overflow float32 to inf and softmax(inf - inf) is NaN: such a
    temperature still draws as greedy does, with top-k / top-p, one generator or a row
    each."""
    logits = torch.tensor([[1.0, 1.5, 1.2, -0.3], [40.0, -2.0, 39.0, 0.0]])
    want = torch.tensor([[1], [0]])
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits, temperature, generator=gen), want)
    assert torch.equal(sample_next(logits, temperature, 2, 0.9), want)
    rows = [torch.Generator().manual_seed(i) for i in range(2)]
    assert torch.equal(sample_next(logits, temperature, generator=rows), want)


def test_same_seed_same_text_different_seed_different_text(make_gpt):
    model = make_gpt(scale=0.1)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    a = model.generate(prompt, 40, temperature=1.0, seed=7)
    b = model.generate(prompt, 40, temperature=1.0, seed=7)
    c = model.generate(prompt, 40, temperature=1.0, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # The seed is private to the call: the global random state does not matter.
    torch.manual_seed(123)
    assert torch.equal(model.generate(prompt, 40, temperature=1.0, seed=7), a)


def test_generate_restores_training_mode(make_gpt):
    model = make_gpt().train()
    model.generate(torch.zeros(1, 1, dtype=torch.long), 3)
    assert model.training
