"""``minitransformer toy``: the copy / reverse task, the first thing to train (toy.py)."""

from __future__ import annotations

from ..toy import TASKS, run_toy
from .flags import positive_int, seed


def add_parser(sub) -> None:
    t = sub.add_parser("toy", help="train an encoder-decoder to copy or reverse random "
                                   "sequences (seconds; the first thing to run)")
    t.add_argument("--task", choices=TASKS, default="reverse", help="(default reverse)")
    t.add_argument("--steps", type=positive_int, default=400,
                   help="optimizer steps (default 400)")
    t.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    t.set_defaults(func=lambda args: run_toy(args.task, args.steps, args.seed))
