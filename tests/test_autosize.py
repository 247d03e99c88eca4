"""Autosize: the pick follows the stated rule for given speeds, respects the corpus and the
command line, and a real 10-second run stops on its own."""

from __future__ import annotations

import csv
import os
import time

import pytest
import torch

from minitransformer import cli
from minitransformer.config import GPTConfig
from minitransformer.experiments import autosize
from minitransformer.models import GPT


def _params(n_layer, n_embd, n_head, block_size, vocab=65) -> int:
    return GPT(GPTConfig(vocab_size=vocab, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                         block_size=block_size)).num_params()


class FakeSpeed:
    """tokens/s by model width, and a record of which widths were timed."""

    def __init__(self, by_width: dict[int, float] | None = None, default: float = 0.0):
        self.by_width, self.default, self.timed = by_width or {}, default, []

    def __call__(self, fields, batch_size, device, dtype, seconds):
        self.timed.append(fields["n_embd"])
        return self.by_width.get(fields["n_embd"], self.default)


def test_picks_the_largest_model_that_sees_two_tokens_per_parameter():
    # 2 CPU cores, roughly: 120 s at 17,000 tokens/s is 2.04M tokens; the 4 x 128 model has
    # 0.81M parameters (needs 1.62M), the 4 x 192 one 1.8M (needs 3.6M, gets 0.72M)
    speed = FakeSpeed({64: 60_000, 96: 30_000, 128: 17_000, 192: 6_000, 256: 3_000})
    assert 17_000 * 120 >= 2 * _params(4, 128, 4, 64)
    assert 6_000 * 120 < 2 * _params(4, 192, 6, 128)
    out, lines = autosize.plan(120, 1_003_854, 111_540, 65, measure=speed)
    assert (out["n_layer"], out["n_embd"], out["n_head"], out["block_size"]) == (4, 128, 4, 64)
    assert (out["batch_size"], out["learning_rate"]) == (16, 3e-3)
    assert out["time_budget"] == 120 and out["dropout"] == 0.0  # 2 epochs: no dropout
    # stopped at the first that was too slow (4 x 192 is timed, or predicted too slow)
    assert speed.timed[:3] == [64, 96, 128] and 256 not in speed.timed
    text = "\n".join(lines)
    assert "picked 4 layers x 128 wide" in text and "too slow" in text
    # evaluation near 8% of the budget: (steps / interval + 1) evals x iters x step / 3
    steps = 17_000 * 120 / (12 * 64)
    evals = steps / out["eval_interval"] + 1
    eval_s = evals * out["eval_iters"] * (12 * 64 / 17_000) / 3
    assert 0.04 * 120 < eval_s < 0.12 * 120


def test_a_fast_device_climbs_until_the_corpus_caps_it():
    speed = FakeSpeed(default=5e6)  # a GPU: every candidate is fast enough
    out, lines = autosize.plan(300, 1_003_854, 111_540, 65, measure=speed)
    # 8 x 512 has 25M parameters, more than 12 per training token: nanoGPT's size is picked
    assert (out["n_layer"], out["n_embd"], out["block_size"], out["batch_size"]) == \
        (6, 384, 256, 64)
    assert out["dropout"] == 0.2  # ~1,500 epochs of the corpus
    assert 512 not in speed.timed and "too big for a corpus" in "\n".join(lines)


def test_tiny_corpus_gets_a_short_context():
    speed = FakeSpeed(default=50_000)
    out, lines = autosize.plan(10, 1_800, 20, 40, measure=speed)
    assert out["block_size"] == 16  # the val split has 20 tokens: windows of 16 + 1 fit
    assert out["n_embd"] == 64 and "too big for a corpus of 1,800" in "\n".join(lines)


def test_short_budget_keeps_enough_steps_and_command_line_wins():
    speed = FakeSpeed(default=4_000)
    out, lines = autosize.plan(10, 1_003_854, 111_540, 65, {"pos_encoding": "rope"},
                               {"learning_rate": 1e-3, "time_budget": 10}, measure=speed)
    assert out["pos_encoding"] == "rope" and out["learning_rate"] == 1e-3
    # 4,000 tokens/s for 10 s is 40,000 tokens: at least 200 steps of 4 x 32 or more
    assert out["batch_size"] * out["block_size"] * autosize.MIN_STEPS <= 40_000 or \
        out["batch_size"] == 4
    assert "kept from the command line: pos_encoding=rope, learning_rate=0.001" in lines[-1]
    out, _ = autosize.plan(10, 1_003_854, 111_540, 65, {"n_layer": 1}, {"batch_size": 7},
                           measure=FakeSpeed(default=1e6))
    assert out["n_layer"] == 1 and out["batch_size"] == 7


def test_a_four_second_budget_stops_on_its_own(tmp_path, capsys):
    """train --time-budget 4s (no preset): sized, trained and done well before 20 s."""
    run = tmp_path / "run"
    t0 = time.perf_counter()
    assert cli.main(["train", "--data", "shakespeare", "--time-budget", "4s", "--out",
                     str(run), "--quiet"]) == 0
    wall = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert wall < 20, f"took {wall:.1f}s"
    assert "autosize: 4s of training" in out and "picked" in out
    with open(run / "log.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["elapsed_s"]) == pytest.approx(4, abs=1.0)  # the budget, spent
    assert rows[-1]["val_loss"] and int(rows[-1]["step"]) < 1_000_000


@pytest.mark.parametrize("one, two, expect_one", [(30_000, 700, True), (20_000, 32_000, False)])
def test_one_thread_is_kept_only_when_clearly_faster(monkeypatch, one, two, expect_one):
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(autosize, "measure_speed",
                        lambda *a: one if torch.get_num_threads() == 1 else two)
    torch.set_num_threads(2)
    try:
        note = autosize.pick_cpu_threads(65, torch.float32)
        assert (torch.get_num_threads() == 1) == expect_one
        assert (os.environ.get("OMP_NUM_THREADS") == "1") == expect_one
        assert ("1 thread runs" in note) == expect_one
    finally:
        torch.set_num_threads(1)
