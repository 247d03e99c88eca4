"""``minitransformer toy``: the copy / reverse task, the first thing to train (toy.py)."""

from __future__ import annotations

from ..toy import TASKS, run_toy
from .flags import positive_int, seed


def add_parser(sub) -> None:
    t = sub.add_parser("toy", help="train an encoder-decoder to copy or reverse random "
                                   "sequences (seconds; the first thing to run)",
                       description="Train a small encoder-decoder on sequences generated in "
                                   "code: random strings of up to 10 symbols, to copy as they "
                                   "are or to write backwards. Trivial for a person, but it "
                                   "runs every part of the model (encoder, masked decoder, "
                                   "cross-attention, padding, greedy and beam decoding), and "
                                   "a model that does not reach about 100% exact match has a "
                                   "bug.")
    t.add_argument("--task", choices=TASKS, default="reverse",
                   help="copy: the target is the source; reverse: the source backwards, "
                        "which needs attention to look far away (default reverse)")
    t.add_argument("--steps", type=positive_int, default=400,
                   help="optimizer steps (default 400)")
    t.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    t.set_defaults(func=lambda args: run_toy(args.task, args.steps, args.seed))
