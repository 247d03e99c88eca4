"""Size a GPT to a time budget: from the corpus, the device's measured speed and the budget.

In a short run a bigger model learns more per token but sees fewer tokens, so the best model
is the largest one that still sees enough of them. The rule:

    for each candidate on LADDER, small to large:
        tokens/s  <- a few timed training steps on this device (random tokens, same batch shape)
        tokens    =  tokens/s * budget
        keep it if tokens >= TOKENS_PER_PARAM * parameters     (fast enough)
               and parameters <= CORPUS_FACTOR * corpus tokens  (not absurd for the data)
    pick the largest kept (the smallest if none is)

TOKENS_PER_PARAM = 2 is calibrated on Tiny Shakespeare: in 120 s on 2 CPU cores at about
17,000 tokens/s for 4 layers x 128 (fp32) it lands on that size (the hand-tuned ``cpu-small``
preset does better still: 3 layers, ReLU, larger batches); on a GPU the same rule climbs to
nanoGPT's shakespeare-char size,
where the corpus cap stops it. Context and batch come with the candidate (shrunk for a tiny
corpus or a budget too short for 200 steps); dropout follows the number of epochs; the
evaluation schedule keeps evaluation near 8% of the budget; on a GPU, runs under 10 minutes
skip torch.compile (it takes about a minute). Fields given on the command line win over
every pick.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..config import GPTConfig, config_from_dict
from ..errors import ConfigError, UserError
from ..presets import NO_STEP_CAP

TOKENS_PER_PARAM = 2.0
CORPUS_FACTOR = 12.0  # at most 12 parameters per training token (nanoGPT: 10.7M on 1M chars)
MIN_STEPS = 200
PROBE_FRACTION, PROBE_MIN_S, PROBE_MAX_S = 0.05, 1.0, 20.0  # timing: 5% of the budget
EVAL_FRACTION, MAX_EVALS = 0.08, 8  # each evaluation also saves a checkpoint and a plot
COMPILE_MIN_S = 600  # torch.compile takes about a minute: worth it only in longer runs


@dataclass(frozen=True)
class Candidate:
    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    batch_size: int
    learning_rate: float


LADDER = (
    Candidate(2, 64, 4, 32, 16, 3e-3),
    Candidate(3, 96, 4, 64, 12, 3e-3),
    Candidate(4, 128, 4, 64, 16, 3e-3),
    Candidate(4, 192, 6, 128, 12, 1.5e-3),
    Candidate(6, 256, 8, 128, 16, 1e-3),
    Candidate(6, 384, 6, 256, 64, 1e-3),  # nanoGPT's shakespeare-char
    Candidate(8, 512, 8, 256, 64, 6e-4),
    Candidate(12, 768, 12, 512, 32, 6e-4),  # GPT-2 small's shape
)


@dataclass
class Trial:
    """One candidate as sized for this corpus, with what was measured."""

    fields: dict  # GPTConfig fields
    batch_size: int
    learning_rate: float
    params: int
    tokens_per_s: float | None = None
    verdict: str = ""

    def shape(self) -> str:
        f = self.fields
        return f"{f['n_layer']} x {f['n_embd']}, context {f['block_size']}, batch " \
               f"{self.batch_size}"


def count_params(fields: dict) -> int:
    from ..models import GPT

    with torch.device("meta"):  # no memory, no init: only the shapes
        return GPT(config_from_dict(GPTConfig, fields)).num_params()


def measure_speed(fields: dict, batch_size: int, device, dtype, seconds: float) -> float:
    """Training tokens/s of this model: two warm-up steps, then timed steps (at least 3)."""
    from ..data import get_batch
    from ..models import GPT
    from ..training.device import autocast
    from ..training.optim import make_optimizer

    model = GPT(config_from_dict(GPTConfig, fields)).to(device)
    opt = make_optimizer(model, 1e-4, 0.1, (0.9, 0.99), device.type)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(fields["vocab_size"], (8 * batch_size * fields["block_size"],),
                         generator=gen)  # a stand-in corpus

    def step():  # what one training step does (trainer.py), on random tokens
        x, y = (t.to(device) for t in get_batch(data, batch_size, fields["block_size"], gen))
        with autocast(device, dtype):
            loss = model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):  # the first steps allocate memory and pick kernels: not timed
        step()
    sync()
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < seconds:
        step()
        n += 1
        sync()
    return n * batch_size * fields["block_size"] / (time.perf_counter() - t0)


def _fit_context(block: int, limit: int) -> int:
    if block <= limit:
        return block
    return max(8, 2 ** int(math.log2(max(limit, 1)))) if limit >= 8 else limit


def _nice(n: float) -> int:
    """Round to 1, 2 or 5 times a power of ten (eval intervals read better that way)."""
    if n < 10:
        return max(1, int(n))
    p = 10 ** int(math.log10(n))
    return int(min((1, 2, 5, 10), key=lambda m: abs(m * p - n)) * p)


def plan(budget: float, train_tokens: int, val_tokens: int, vocab_size: int,
         model_over: dict | None = None, train_over: dict | None = None, device=None,
         dtype=torch.float32, measure=measure_speed) -> tuple[dict, list[str]]:
    """(preset-like flat dict of model + training fields, lines saying what and why)."""
    model_over, train_over = dict(model_over or {}), dict(train_over or {})
    device = device or torch.device("cpu")
    context_limit = min(train_tokens, val_tokens) - 1
    if context_limit < 2:
        raise UserError(f"the corpus is too short to train on ({train_tokens} training and "
                        f"{val_tokens} validation tokens)")
    probe_left = min(PROBE_MAX_S, max(PROBE_MIN_S, PROBE_FRACTION * budget))
    if device.type == "cuda":  # start CUDA and cuBLAS before the clock: a one-time cost
        (torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)).sum().item()
    trials: list[Trial] = []
    prev: Trial | None = None
    for cand in LADDER:
        fields = {"vocab_size": vocab_size, "n_layer": cand.n_layer, "n_embd": cand.n_embd,
                  "n_head": cand.n_head,
                  "block_size": _fit_context(cand.block_size, context_limit), **model_over}
        fields["vocab_size"] = vocab_size
        try:
            params = count_params(fields)
        except ConfigError:
            continue  # e.g. a --n_head that does not divide this width
        trial = Trial(fields, train_over.get("batch_size", cand.batch_size),
                      train_over.get("learning_rate", cand.learning_rate), params)
        if trials and trials[-1].fields == fields and trials[-1].batch_size == trial.batch_size:
            continue  # the overrides made it the same as the last one
        trials.append(trial)
        need = TOKENS_PER_PARAM * params
        if params > CORPUS_FACTOR * train_tokens:
            trial.verdict = f"too big for a corpus of {train_tokens:,} tokens"
            break
        # On a CPU speed falls with FLOPs, so a hopeless candidate need not be timed; small
        # models on a GPU are bound by kernel launches instead, so there every one is timed.
        if device.type == "cpu" and prev is not None and prev.tokens_per_s:
            ratio = _flops_per_token(prev) / _flops_per_token(trial)
            if prev.tokens_per_s * ratio * budget < 0.25 * need:
                trial.verdict = "too slow (predicted from the one before)"
                break
        if probe_left <= 0:
            trial.verdict = "not timed (timing budget spent)"
            break
        t0 = time.perf_counter()
        trial.tokens_per_s = measure(fields, trial.batch_size, device, dtype,
                                     min(0.3, probe_left / 3))
        probe_left -= time.perf_counter() - t0
        if trial.tokens_per_s * budget < need:
            trial.verdict = "too slow"
            break
        trial.verdict = "fits"
        prev = trial
    if not trials:
        raise UserError("no model size fits the fields given on the command line")
    fitting = [t for t in trials if t.verdict == "fits"]
    pick = fitting[-1] if fitting else trials[0]
    if pick.tokens_per_s is None:  # nothing could be timed: time the smallest now
        pick.tokens_per_s = measure(pick.fields, pick.batch_size, device, dtype, 0.2)
    return _settle(pick, trials, budget, train_tokens, model_over, train_over, device)


def _flops_per_token(t: Trial) -> float:
    """6 N for the weights plus the attention scores (Kaplan et al. 2020, table 1)."""
    f = t.fields
    return 6 * t.params + 12 * f["n_layer"] * f["block_size"] * f["n_embd"]


def _settle(pick: Trial, trials: list[Trial], budget: float, train_tokens: int,
            model_over: dict, train_over: dict, device) -> tuple[dict, list[str]]:
    tok_s, block = pick.tokens_per_s, pick.fields["block_size"]
    batch = pick.batch_size
    if "batch_size" not in train_over and tok_s * budget / (batch * block) < MIN_STEPS:
        batch = max(4, int(tok_s * budget / (MIN_STEPS * block)))  # more, smaller steps
    steps = max(1, int(tok_s * budget / (batch * block)))
    tokens = tok_s * budget
    epochs = tokens / max(train_tokens, 1)
    dropout = 0.0 if epochs < 4 else 0.1 if epochs < 20 else 0.2
    step_s = batch * block / tok_s
    n_planned = min(MAX_EVALS, max(3, int(budget / 6)))  # a 10 s run: 3; a minute: 8
    eval_interval = _nice(max(10, steps / n_planned))
    n_evals = steps / eval_interval + 1
    eval_iters = int(min(200, max(10, EVAL_FRACTION * budget / n_evals / (step_s / 3))))
    lr = pick.learning_rate
    out = {**pick.fields, "dropout": dropout, "batch_size": batch, "learning_rate": lr,
           "min_lr": round(lr / 10, 10), "warmup_iters": min(100, max(10, steps // 10)),
           "max_iters": NO_STEP_CAP, "time_budget": budget, "eval_interval": eval_interval,
           "eval_iters": eval_iters, "weight_decay": 0.1, "beta2": 0.99,
           "sample_tokens": 200 if budget >= 300 else 100 if budget >= 60 else 0}
    if device.type == "cuda" and budget < COMPILE_MIN_S:
        out["compile"] = "off"  # the timings above are eager; compiling would eat the budget
    out.pop("vocab_size")
    out.update(model_over)
    out.update(train_over)
    lines = [f"autosize: {budget:g}s of training on {device.type}, {train_tokens:,} training "
             f"tokens; candidates (tokens/s measured here, {TOKENS_PER_PARAM:g} tokens per "
             f"parameter needed):"]
    for t in trials:
        speed = f"{t.tokens_per_s:>9,.0f} tokens/s -> {t.tokens_per_s * budget / t.params:5.1f}" \
                f" tokens/parameter" if t.tokens_per_s else " " * 35
        lines.append(f"  {t.shape():<34} {t.params / 1e6:6.2f}M parameters {speed}  "
                     f"{t.verdict}")
    why = "the largest that sees enough tokens in the budget" if pick.verdict == "fits" else \
        f"the smallest candidate, though it is {pick.verdict}"
    reg = "no dropout" if dropout == 0 else f"dropout {dropout}"
    f = out
    lines.append(f"picked {f['n_layer']} layers x {f['n_embd']} wide ({f['n_head']} heads), "
                 f"context {f['block_size']}, batch {batch}, lr {lr:g}: {why}; at most "
                 f"{steps:,} steps and {epochs:.1f} epochs at the probe's speed (logging, "
                 f"checkpoints and a busy machine make it fewer), so {reg}; evaluating every "
                 f"{eval_interval} steps on {eval_iters} batches"
                 + ("; no torch.compile in so short a run" if f.get("compile") == "off"
                    and "compile" not in train_over else ""))
    if model_over or set(train_over) - {"time_budget"}:
        given = ", ".join(f"{k}={v}" for k, v in {**model_over, **train_over}.items()
                          if k != "time_budget")
        lines.append(f"kept from the command line: {given}")
    return out, lines


def autosize_for_train(train_tokens: int, val_tokens: int, vocab_size: int, model_over: dict,
                       train_over: dict, echo=print) -> dict:
    """``train --time_budget`` without ``--preset``: the settings to use, said out loud."""
    from ..training.device import pick_device, pick_dtype, set_threads

    set_threads()  # time with the threads training will use
    device = pick_device(train_over.get("device", "auto"))
    dtype = pick_dtype(train_over.get("dtype", "auto"), device)
    if device.type == "cpu":
        note = pick_cpu_threads(vocab_size, dtype)
        if note:
            echo(note)
    fields, lines = plan(train_over["time_budget"], train_tokens, val_tokens, vocab_size,
                         model_over, train_over, device, dtype)
    for line in lines:
        echo(line)
    return fields


def pick_cpu_threads(vocab_size: int, dtype, seconds: float = 0.3) -> str:
    """On a CPU whose cores other programs are using, one thread can beat several that wait
    for each other. Time the smallest candidate both ways; keep one thread (for the training
    too, through OMP_NUM_THREADS) when it is clearly faster. Returns a note, or ''."""
    import os

    n = torch.get_num_threads()
    if n == 1 or "OMP_NUM_THREADS" in os.environ:
        return ""
    c, cpu = LADDER[0], torch.device("cpu")
    fields = {"vocab_size": vocab_size, "n_layer": c.n_layer, "n_embd": c.n_embd,
              "n_head": c.n_head, "block_size": c.block_size}
    many = measure_speed(fields, c.batch_size, cpu, dtype, seconds)
    torch.set_num_threads(1)
    one = measure_speed(fields, c.batch_size, cpu, dtype, seconds)
    if one > 1.3 * many:
        os.environ["OMP_NUM_THREADS"] = "1"  # the trainer's set_threads() keeps it
        return (f"autosize: 1 thread runs {one / many:.1f}x faster than {n} here (other "
                f"programs are using the cores), so training uses 1")
    torch.set_num_threads(n)
    return ""
