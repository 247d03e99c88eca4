"""Which kernel computes a decoding product, and how each model measures it.

Inside ``nn.linear.packed_weights`` an fp32 CPU product x W^T + b has three kernels:

- "blas": ``F.linear`` from the plain weight (MKL's GEMM behind it);
- "packed": W copied once into oneDNN's blocked layout, which can also apply a ReLU or GELU
  on the way out;
- "mkl": W copied into MKL's packed layout for its GEMM, which skips the re-packing of W that
  MKL's GEMM of a few rows does at every call, where this build has it.

The copies and their products are ``nn/packing.py``'s; this module chooses between them.

Decoding feeds one row per sequence through each projection, a matrix-vector product that
reads every weight once per token (a few rows when sequences are decoded together). Which
kernel reads it fastest is the machine's to say: it depends on the CPU, the row count and the
weight's size, and no fixed rule was right on the two machines measured (docs/BENCHMARKS.md,
"Which kernel" and "A third kernel"). So the first products of each row count take turns on
the kernels, timed where they run, and the fastest is kept for the model
(``measured_product``, ``KernelChoice``; MINITRANSFORMER_KERNEL fixes the choice instead).
Tests hold the kernels equal (to fp32 rounding): the choice changes the speed, and the
results only in the last bits.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from . import packing
from .packing import MKLPacked, mkl_works, next_power_of_two

T = TypeVar("T")


# Which kernel computes a product inside ``packed_weights``: "measured" (the default: the
# fastest where it runs, ``measured_product``), or "packed", "blas" or "mkl" always. The
# environment variable MINITRANSFORMER_KERNEL sets it: a fixed kernel makes runs with the same
# seed repeat to the last bit from one process to the next (the measured choice may differ
# between processes where two kernels are close, and they differ in the last bits).
KERNELS = ("measured", "packed", "blas", "mkl")
KERNEL_ENV = "MINITRANSFORMER_KERNEL"


def kernel_setting() -> str:
    """``KERNEL`` from the environment: unset, empty or not one of ``KERNELS``, measured
    (the command line refuses a value that is not, ``kernel_setting_problem``; a program
    that decodes is told once, ``note_kernel_setting``)."""
    value = os.environ.get(KERNEL_ENV) or "measured"
    return value if value in KERNELS else "measured"


def kernel_setting_problem() -> str | None:
    """What is wrong with the environment's MINITRANSFORMER_KERNEL, or None."""
    value = os.environ.get(KERNEL_ENV)
    if value and value not in KERNELS:
        return f"{KERNEL_ENV}={value!r} is not one of {', '.join(KERNELS)}"
    return None


@functools.cache
def note_kernel_setting() -> None:
    """Say once on stderr that a MINITRANSFORMER_KERNEL that is not one of ``KERNELS`` was
    taken as measured (at the first decoding scope, not at import)."""
    problem = kernel_setting_problem()
    if problem is not None:
        print(f"note: {problem}; measuring", file=sys.stderr)


KERNEL = kernel_setting()


# MKL's packed GEMM saves the packing of W that MKL's GEMM does at each call of a few rows.
# On an AMD VM the two were level from 32 rows on (547 against 549 µs at 64 rows on a 1,536 x
# 384 weight, 2 threads), where an Intel VM had MKL's the fastest at 32 rows; a copy packed
# for a prefill's rows is one more copy of every weight (42 MB for config (b)) and made whole
# prefills slower (275 against 210 ms at 8 x 192 rows). So trials of more rows than this, a
# judgement between the two, leave MKL out.
MKL_MAX_ROWS = 64


def trial_kernels(rows: int = 1) -> tuple[str, ...]:
    """The kernels a trial of products of ``rows`` rows compares: the packed copy and BLAS,
    and MKL's packed GEMM where it works here (``mkl_works``) and the rows are few
    (``MKL_MAX_ROWS``)."""
    return ("packed", "blas") + (("mkl",) if rows <= MKL_MAX_ROWS and mkl_works() else ())


# A trial's turn on one kernel (``trial_schedule``): untimed passes until they have taken
# TURN_WARM_SECONDS (one at least), then TURN_TIMED timed ones.
TURN_WARM_SECONDS, TURN_TIMED = 0.01, 2


def trial_schedule(kernels: tuple[str, ...]) -> tuple[str, ...]:
    """The kernels of a trial's turns: two each, in the order k1 .. kn, kn .. k1, which puts
    every kernel's timed passes at the same mean and median position, so that work growing
    from pass to pass (a longer cache) favours none. A turn runs untimed passes on its kernel
    until they have taken ``TURN_WARM_SECONDS`` (one at least), then ``TURN_TIMED`` timed ones.

    Why the untimed passes (``bench/kernel_settling.py``): after a switch, a kernel's steps
    run slow for a few passes, then settle, and decoding, which stays on one kernel, only
    sees the settled speed. Here, 8 rows, milliseconds by pass after a switch: MKL 3.90,
    3.59, 3.18, 2.68, 2.58, 2.71; BLAS 3.99, 3.58, 3.51, 3.18, 2.91, 3.14; oneDNN 4.18, 3.78,
    3.50, 3.32, 3.01, 3.17. Decoding on MKL was the fastest at 8 rows (2.77 against 3.16 ms
    a step over the cache's first 100 positions), yet trials that timed passes right after a
    switch chose BLAS or oneDNN in 12 processes of 12; these chose MKL in 8 of 8, and BLAS at
    one row. A long pass (an encoder's, a prefill's: many rows, each weight read many times)
    is its own warm-up, and its trial stays short."""
    return kernels + kernels[::-1]


Bucket = tuple[int, int]  # (rows to the next power of two, threads)
# Products in one pass past which its anchor is taken to have stopped computing (a LoRA merge
# can put another module in its place); the trial starts again from the current module.
MAX_PASS_PRODUCTS = 4096


@dataclass
class Trial:
    """The trial of one bucket: its passes, each from a product of ``anchor`` (the module
    whose product opened the trial) to the last product before the anchor's next, in the
    turns of ``schedule`` (``trial_schedule``), and how long the timed ones took."""

    anchor: int  # id() of that module
    schedule: tuple[str, ...]  # a kernel per turn
    start: float = 0.0  # when the current pass's first product began
    end: float = 0.0  # when its latest product ended
    products: int = 0  # in the current pass
    turn: int = 0  # index into ``schedule``
    warm: float = -1.0  # seconds of the turn's untimed passes so far (-1: none yet)
    timed: list[tuple[str, float]] = field(default_factory=list)  # (kernel, seconds)
    copies: int = 0  # ``packing.copies_made`` when the current pass began
    again: bool = False  # the current pass repeats one that made copies

    @property
    def kernel(self) -> str:
        return self.schedule[self.turn]

    def pass_ended(self, seconds: float) -> None:
        """Count a pass of the current turn: untimed until the turn's have taken
        ``TURN_WARM_SECONDS`` (one at least), then timed; the turn ends after
        ``TURN_TIMED`` timed ones."""
        if self.warm < TURN_WARM_SECONDS:
            self.warm = max(self.warm, 0.0) + seconds
            return
        self.timed.append((self.kernel, seconds))
        if len(self.timed) == TURN_TIMED * (self.turn + 1):  # the turn's last
            self.turn, self.warm = self.turn + 1, -1.0


class KernelChoice:
    """Which kernel one model's products take, per bucket, and the trials that choose it
    (``measured_product``). One per model (``packed_weights`` keeps it as long as the
    model), so that generation's scope per call does not measure again; a choice is never
    measured again."""

    def __init__(self):
        self.chosen: dict[Bucket, str] = {}  # "packed", "blas" or "mkl"
        self.trials: dict[Bucket, Trial] = {}
        # the model's MKL products (``packed_weights``): a trial that chooses another kernel
        # drops the copies no row count whose kernel is MKL's reads
        self.mkl_products: weakref.WeakSet[MKLPacked] = weakref.WeakSet()
        self.lock = threading.Lock()  # two threads may run one model

    def __deepcopy__(self, memo):  # a copy of a packed model measures anew
        return KernelChoice()

    def trial_kernel(self, bucket: Bucket, module: object) -> str:
        """The kernel of this product of ``module``, about to start in a bucket on trial:
        its pass's. A product of the trial's anchor ends the pass and opens the next; after
        the last pass of the schedule the kernel whose timed passes took the least time
        (medians) is chosen."""
        with self.lock:
            if bucket in self.chosen:  # chosen meanwhile, on another thread
                return self.chosen[bucket]
            now = time.perf_counter()
            trial = self.trials.get(bucket)
            if trial is None or trial.products >= MAX_PASS_PRODUCTS:
                schedule = trial_schedule(trial_kernels(bucket[0]))
                trial = self.trials[bucket] = Trial(id(module), schedule, start=now,
                                                    copies=packing.copies_made)
            elif id(module) == trial.anchor:
                if packing.copies_made != trial.copies and not trial.again:
                    trial.again = True  # it made MKL copies: not counted, once, and run again
                else:
                    trial.pass_ended(max(trial.end - trial.start, 0.0))
                    trial.again = False
                trial.start, trial.products, trial.copies = now, 0, packing.copies_made
                if trial.turn == len(trial.schedule):
                    kernels = sorted(set(trial.schedule), key=trial.schedule.index)
                    medians = {kernel: statistics.median(t for k, t in trial.timed if k == kernel)
                               for kernel in kernels}
                    self.chosen[bucket] = min(kernels, key=medians.__getitem__)
                    del self.trials[bucket]
                    if self.chosen[bucket] != "mkl":
                        served = {b[0] for b, k in self.chosen.items() if k == "mkl"}
                        for product in list(self.mkl_products):
                            product.release(served)
                    return self.chosen[bucket]
            trial.products += 1
            return trial.kernel

    def product_ended(self, bucket: Bucket) -> None:
        with self.lock:
            trial = self.trials.get(bucket)
            if trial is not None:
                trial.end = time.perf_counter()


_choices: weakref.WeakKeyDictionary[nn.Module, KernelChoice] = weakref.WeakKeyDictionary()


def choice_for(model: nn.Module) -> KernelChoice:
    """``model``'s ``KernelChoice`` (a fresh one, not kept, for a model that cannot be a
    weak dictionary's key)."""
    try:
        return _choices.setdefault(model, KernelChoice())
    except TypeError:
        return KernelChoice()


def measured_product(choice: KernelChoice | None, module: object, x: torch.Tensor,
                     packed_call: Callable[[], T], blas_call: Callable[[], T],
                     mkl_call: Callable[[], T] | None = None) -> T:
    """A product of ``x`` by ``module``'s weight: ``packed_call()`` from the packed copy,
    ``blas_call()`` from the plain weight or ``mkl_call()`` from MKL's packed copy (where
    there is none, BLAS computes the "mkl" kernel's products), all computing the same.

    Which one: ``KERNEL``'s, or when measured, the one ``choice`` holds for products of as
    many rows (to the next power of two, ``next_power_of_two``) on as many threads: the
    bucket. All products of a bucket take one kernel, since a step that switched between
    two ran slower here than one on either (docs/BENCHMARKS.md, "Which kernel"). Until a
    bucket has its kernel, its products are its trial: whole passes (from a product of the
    first module that came, the anchor, to the last product before its next: a decoding
    step, an encoder pass) on each kernel in turns, timed whole as they run, the model's
    other work included (a kernel timed alone, its weight hot in the cache, can rank
    otherwise, and a kernel can slow the work around it), and the kernel whose passes took
    the least time is kept (``KernelChoice.trial_kernel``). Without a choice (a module
    packed on its own) and inside ``torch.compile``, the packed copy; zero rows, BLAS.
    """
    calls = {"packed": packed_call, "blas": blas_call, "mkl": mkl_call or blas_call}
    if torch.compiler.is_compiling():  # MKL's copy is made lazily, which a graph cannot
        return blas_call() if KERNEL == "blas" else packed_call()
    if KERNEL != "measured" or choice is None:
        return calls["packed" if KERNEL == "measured" else KERNEL]()
    rows = x.numel() // x.shape[-1]
    if rows == 0:
        return blas_call()
    bucket = (next_power_of_two(rows), torch.get_num_threads())
    chosen = choice.chosen.get(bucket)
    if chosen is not None:
        return calls[chosen]()
    y = calls[choice.trial_kernel(bucket, module)]()
    choice.product_ended(bucket)
    return y


def settled_kernel(choice: KernelChoice | None, rows: int) -> str | None:
    """The kernel ("packed", "blas" or "mkl") that products of ``rows`` rows take by ``choice``
    where that is settled: ``KERNEL``'s when fixed, the measured one once chosen; None while
    the trial of their bucket runs, or without a choice (``measured_product`` decides)."""
    if torch.compiler.is_compiling():  # as ``measured_product``
        return "blas" if KERNEL == "blas" else "packed"
    if KERNEL != "measured":
        return KERNEL
    if choice is None or rows == 0:
        return None
    return choice.chosen.get((next_power_of_two(rows), torch.get_num_threads()))


@functools.cache
def say_no_mkl() -> None:
    print(f"note: {KERNEL_ENV}=mkl, but this PyTorch build has no MKL packed GEMM; BLAS "
          "computes its products", file=sys.stderr)
