"""Training health: attention entropy against hand-computed values, the overfitting rule on
made-up loss sequences, and real runs: a tiny corpus with a large model overfits and is
stopped early, an ordinary run is left alone."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import torch

from minitransformer import cli
from minitransformer.data import corpus_path
from minitransformer.training.health import HealthGuard, attention_entropy


def _log(run) -> list[dict]:
    with open(run / "log.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ---- attention entropy --------------------------------------------------------------------

def test_attention_entropy_hand_computed():
    uniform4 = torch.full((1, 1, 1, 4), 0.25)
    assert attention_entropy(uniform4) == pytest.approx(math.log(4))
    one_hot = torch.tensor([[[[0.0, 1.0, 0.0, 0.0]]]])
    assert attention_entropy(one_hot) == pytest.approx(0.0)
    # two heads: -(0.5 ln 0.5) * 2 = ln 2, and -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.325083
    w = torch.tensor([[[[0.5, 0.5, 0.0]], [[0.9, 0.1, 0.0]]]])  # (1, 2, 1, 3)
    assert attention_entropy(w) == pytest.approx((math.log(2) + 0.325083) / 2, abs=1e-6)
    # a causal map: query i spreads evenly over keys 0..i -> mean of ln(i + 1)
    t = 5
    causal = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]
    expected = sum(math.log(i + 1) for i in range(t)) / t
    assert attention_entropy(causal[None, None]) == pytest.approx(expected, abs=1e-6)


# ---- the overfitting rule -----------------------------------------------------------------

def _feed(guard: HealthGuard, evals: list[tuple[float, float | None]]) -> list[list[str]]:
    """evals: (val loss, train loss logged before it) per evaluation, from step 0."""
    out = []
    for i, (val, train) in enumerate(evals):
        if train is not None:
            guard.on_train_loss(train + 0.1)  # two log points per evaluation window
            guard.on_train_loss(train - 0.1)
        out.append(guard.on_eval(100 * i, val))
    return out


def test_warns_after_patience_rises_while_train_falls():
    evals = [(4.0, None), (2.5, 3.0), (2.4, 2.5), (2.5, 2.2), (2.6, 2.0), (2.7, 1.8),
             (2.8, 1.6)]
    guard = HealthGuard(patience=3)
    msgs = _feed(guard, evals)
    assert [bool(m) for m in msgs] == [False, False, False, False, False, True, True]
    assert "overfitting" in msgs[5][0] and "best 2.4000" in msgs[5][0]
    assert "--early_stop" in msgs[5][0]
    assert not guard.stop_requested and len(guard.warnings) == 1


def test_early_stop_requests_a_stop():
    guard = HealthGuard(patience=2, early_stop=True)
    msgs = _feed(guard, [(4.0, None), (2.5, 3.0), (2.6, 2.5), (2.7, 2.0)])
    assert not any(msgs[:3]) and "stopping early" in msgs[3][0]
    assert guard.stop_requested


def test_best_is_said_against_step_0_which_is_never_saved():
    # fine-tuning: the starting weights (step 0) score 2.0, the first saved model is worse
    guard = HealthGuard()
    _feed(guard, [(2.0, None), (2.5, 3.0)])
    assert guard.best_label(2.5) == " (best since step 0, saved; step 0 had 2.0000)"
    guard.on_eval(200, 1.5)
    assert guard.best_label(1.5) == " (best so far, saved)"
    fresh = HealthGuard()  # a resumed run never saw step 0
    assert fresh.best_label(3.0) == " (best so far, saved)"


@pytest.mark.parametrize("evals", [
    [(4.0, None), (3.0, 3.5), (2.8, 3.0), (2.7, 2.8), (2.6, 2.7)],  # healthy: both fall
    [(4.0, None), (3.0, 3.5), (3.1, 3.6), (3.2, 3.7), (3.3, 3.8)],  # both rise: not overfitting
    [(4.0, None), (3.0, 3.5), (3.1, 3.0), (3.0, 2.9), (3.1, 2.8), (3.2, 2.7)],  # streak broken
])
def test_no_warning_without_a_streak(evals):
    guard = HealthGuard(patience=3, early_stop=True)
    assert not any(_feed(guard, evals)) and not guard.stop_requested


# ---- real runs ----------------------------------------------------------------------------

def test_a_resumed_run_still_says_best_against_step_0(tmp_path, capsys):
    """A learning rate far too high: every later evaluation is worse than step 0's. The
    checkpoint keeps step 0's val loss, so after --resume a new best is still 'since step 0'."""
    text = corpus_path("shakespeare").read_text(encoding="utf-8")[:4000]
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    args = ["train", "--data", str(tmp_path / "t.txt"), "--out", str(tmp_path / "run"),
            "--preset", "debug", "--learning_rate", "1", "--warmup_iters", "0",
            "--eval_interval", "5", "--eval_iters", "2", "--sample_tokens", "0", "--quiet"]
    assert cli.main([*args, "--max_iters", "10"]) == 0
    first = capsys.readouterr().out
    start = re.search(r"step 0: val loss (\S+)", first).group(1)
    assert f"(best since step 0, saved; step 0 had {start})" in first
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--resume", "--max_iters", "40",
                     "--quiet"]) == 0, capsys.readouterr().err
    labels = re.findall(r"\((best [^)]*saved[^)]*)\)", capsys.readouterr().out)
    assert labels and all(x == f"best since step 0, saved; step 0 had {start}" for x in labels)

def test_tiny_corpus_large_model_overfits_and_stops_early(tmp_path, capsys):
    """2,000 characters and a 2 x 128 model: train loss keeps falling, val loss turns up."""
    text = corpus_path("shakespeare").read_text(encoding="utf-8")[:2000]
    (tmp_path / "tiny.txt").write_text(text, encoding="utf-8")
    run = tmp_path / "run"
    code = cli.main(["train", "--data", str(tmp_path / "tiny.txt"), "--out", str(run),
                     "--preset", "debug", "--n_layer", "2", "--n_embd", "128", "--n_head", "4",
                     "--block_size", "32", "--batch_size", "32", "--learning_rate", "3e-3",
                     "--warmup_iters", "10", "--max_iters", "200", "--eval_interval", "20",
                     "--eval_iters", "4", "--sample_tokens", "0", "--quiet", "--early_stop"])
    assert code == 0
    out = capsys.readouterr().out
    assert "overfitting?" in out and "stopping early" in out
    rows = _log(run)
    vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    last_step = vals[-1][0]
    assert last_step < 200  # stopped by the guard, not by max_iters
    # the last three evaluations each rose, while the logged train loss fell
    assert all(b[1] > a[1] for a, b in zip(vals[-4:-1], vals[-3:], strict=True))
    trains = [float(r["train_loss"]) for r in rows if r["train_loss"]]
    assert trains[-1] < trains[len(trains) // 2]
    # the run folder's top level holds the best model, from before the rise
    meta = json.loads((run / "config.json").read_text(encoding="utf-8"))
    best_step, best_val = min(vals[1:], key=lambda sv: sv[1])
    assert meta["step"] == best_step < last_step
    assert meta["val_loss"] == pytest.approx(best_val, abs=1e-4)


def test_normal_run_gets_no_warning_and_logs_entropy(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", "--data", "shakespeare", "--out", str(run), "--preset", "debug",
                     "--max_iters", "120", "--eval_interval", "20", "--eval_iters", "5",
                     "--sample_tokens", "0", "--quiet", "--early_stop"]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "done: 120 steps" in out
    evals = [r for r in _log(run) if r["val_loss"]]
    assert [int(r["step"]) for r in evals] == [0, 20, 40, 60, 80, 100, 120]
    # one entropy column per layer (debug: 2), at every evaluation and nowhere else
    assert {k for k in evals[0] if "entropy" in k} == {"attn_entropy_0", "attn_entropy_1"}
    assert all(r["attn_entropy_0"] == "" for r in _log(run) if not r["val_loss"])
    # untrained, attention is nearly uniform over the causal window: mean of ln(i + 1), T = 32
    uniform = sum(math.log(i + 1) for i in range(32)) / 32
    for key in ("attn_entropy_0", "attn_entropy_1"):
        assert float(evals[0][key]) == pytest.approx(uniform, abs=0.02)
        assert 0 < float(evals[-1][key]) < uniform  # training sharpens attention


def test_a_resume_from_a_step_never_evaluated_says_so_not_nan():
    from minitransformer.training.health import HealthGuard

    assert HealthGuard.resume_label(1.23456, 1.2) == "val loss 1.2346"
    assert HealthGuard.resume_label(float("nan"), 1.2) == \
        "not evaluated at that step; best val loss 1.2000"
    assert HealthGuard.resume_label(float("nan"), float("inf")) == "not evaluated at that step"
