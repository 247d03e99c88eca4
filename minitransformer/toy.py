"""The first thing to run: teach a small encoder-decoder to copy or reverse random sequences.

    minitransformer toy --task reverse       # about 20-30 seconds on a CPU

Like the Annotated Transformer's copy task, the data is generated in code: sources are random
strings of symbols 3 .. vocab_size-1 (0, 1, 2 are <pad>, <s>, </s>), targets are the same
string (copy) or the string backwards (reverse). The task is trivial for a human and useless
in itself, but it exercises every part of the model (encoder, masked decoder,
cross-attention, padding, greedy and beam decoding) and it fails loudly if one is broken:
a model that cannot reach ~100% exact match here has a bug.

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from typing import Literal

import torch

from .config import Seq2SeqConfig
from .models.decoding import beam_search, greedy_decode
from .models.seq2seq import Seq2SeqTransformer

ToyTask = Literal["copy", "reverse"]
TASKS = ("copy", "reverse")
PAD, BOS, EOS = 0, 1, 2


def toy_batch(task: ToyTask, batch_size: int, max_length: int = 10, vocab_size: int = 13,
              generator: torch.Generator | None = None, min_length: int = 1):
    """A batch of random sequences: (src (B, S), tgt_in (B, T), tgt_out (B, T)), padded.

    src = x_1 .. x_n </s>; tgt_in = <s> y_1 .. y_n; tgt_out = y_1 .. y_n </s>,
    where y = x (copy) or x reversed (reverse).
    """
    if task not in ("copy", "reverse"):
        raise ValueError(f"unknown toy task {task!r}: choose copy or reverse")
    lengths = torch.randint(min_length, max_length + 1, (batch_size,), generator=generator)
    symbols = torch.randint(3, vocab_size, (batch_size, max_length), generator=generator)
    src = torch.full((batch_size, max_length + 1), PAD)  # (B, S)
    tgt_in = torch.full((batch_size, max_length + 1), PAD)  # (B, T)
    tgt_out = torch.full((batch_size, max_length + 1), PAD)  # (B, T)
    for i, n in enumerate(lengths.tolist()):
        x = symbols[i, :n]
        y = x.flip(0) if task == "reverse" else x
        src[i, :n], src[i, n] = x, EOS
        tgt_in[i, 0], tgt_in[i, 1:n + 1] = BOS, y
        tgt_out[i, :n], tgt_out[i, n] = y, EOS
    return src, tgt_in, tgt_out


def toy_config(vocab_size: int = 13, **overrides) -> Seq2SeqConfig:
    """A small model that solves the toy tasks in a few hundred steps."""
    values = dict(vocab_size=vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64,
                  d_ff=128, dropout=0.0, label_smoothing=0.0)
    return Seq2SeqConfig(**{**values, **overrides})


def train_toy(task: ToyTask = "reverse", steps: int = 400, batch_size: int = 64,
              max_length: int = 10, seed: int = 0, config: Seq2SeqConfig | None = None,
              learning_rate: float = 3e-3, warmup: int = 50, log=None) -> Seq2SeqTransformer:
    """Train a fresh model on the toy task: Adam (betas 0.9, 0.98, as in the paper), linear
    warmup, then cosine decay to 0 (the decay is what takes it from ~80% to ~100% exact).
    On one CPU thread (``one_thread``) unless OMP_NUM_THREADS says otherwise."""
    with one_thread():
        return _train(task, steps, batch_size, max_length, seed, config, learning_rate, warmup,
                      log)


@contextlib.contextmanager
def one_thread():
    """PyTorch on one CPU thread inside, as before after: a model this small trains several
    times faster so (threads cost more than they share here); OMP_NUM_THREADS, when set,
    wins."""
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(task, steps, batch_size, max_length, seed, config, learning_rate, warmup,
           log) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    config = config or toy_config()
    model = Seq2SeqTransformer(config)
    opt = torch.optim.Adam(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(1, steps + 1):
        progress = max(0, step - warmup) / max(1, steps - warmup)
        lr = learning_rate * min(step / warmup, 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:  # linear warmup, then cosine decay to 0
            group["lr"] = lr
        src, tgt_in, tgt_out = toy_batch(task, batch_size, max_length, config.vocab_size, gen)
        _, loss = model(src, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log is not None and (step % 50 == 0 or step == 1):
            log(f"step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    return model


@torch.no_grad()
def exact_match(model: Seq2SeqTransformer, task: ToyTask, n: int = 500, max_length: int = 10,
                seed: int = 1234, beam_size: int = 1) -> float:
    """Fraction of n fresh random sequences whose decoded output is exactly right."""
    gen = torch.Generator().manual_seed(seed)
    src, _, tgt_out = toy_batch(task, n, max_length, model.config.vocab_size, gen)
    if beam_size > 1:
        out = beam_search(model, src, beam_size, max_len=max_length + 2).tokens
    else:
        out = greedy_decode(model, src, max_len=max_length + 2).tokens
    right = 0
    for i, toks in enumerate(out):
        want = tgt_out[i][tgt_out[i] != PAD][:-1].tolist()  # drop </s>
        right += toks == want
    return right / n


def run_toy(task: str = "reverse", steps: int = 400, seed: int = 0, echo=print) -> int:
    """Train the toy task and show what the model does with it (``minitransformer toy``)."""
    with one_thread():  # decoding too
        return _show_toy(task, steps, seed, echo)


def _show_toy(task: str, steps: int, seed: int, echo) -> int:
    t0 = time.perf_counter()
    model = train_toy(task, steps, seed=seed, log=echo)
    echo(f"trained {model.num_params():,} parameters in {time.perf_counter() - t0:.1f}s")
    src, _, _ = toy_batch(task, 3, generator=torch.Generator().manual_seed(7))
    for s, out in zip(src, greedy_decode(model, src).tokens, strict=True):
        echo(f"  {s[s > EOS].tolist()} -> {out}")
    echo(f"exact match, greedy: {exact_match(model, task):.1%}; "
         f"beam 4: {exact_match(model, task, beam_size=4):.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m minitransformer.toy``: the same as ``minitransformer toy``."""
    p = argparse.ArgumentParser(prog="python -m minitransformer.toy",
                                description="The same as: minitransformer toy --help")
    p.add_argument("--task", choices=TASKS, default="reverse")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return run_toy(args.task, args.steps, args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
