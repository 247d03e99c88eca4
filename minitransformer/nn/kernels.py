"""Which kernel computes a decoding product, and how each model measures it.

Inside ``nn.linear.packed_weights`` an fp32 CPU product x W^T + b has three kernels:

- "blas": ``F.linear`` from the plain weight (MKL's GEMM behind it);
- "packed": W copied once into oneDNN's blocked layout (``pack``, ``packed_linear``), which
  can also apply a ReLU or GELU on the way out (``fused_activation``);
- "mkl": W copied into MKL's packed layout for its GEMM (``MKLPacked``: ``cblas_sgemm_pack``,
  then ``cblas_sgemm_compute``, which skips the re-packing of W that MKL's GEMM of a few rows
  does at every call), where this build has it (``mkl_works``).

Decoding feeds one row per sequence through each projection, a matrix-vector product that
reads every weight once per token (a few rows when sequences are decoded together). Which
kernel reads it fastest is the machine's to say: it depends on the CPU, the row count and the
weight's size, and no fixed rule was right on the two machines measured (docs/BENCHMARKS.md,
"Which kernel" and "A third kernel"). So the first products of each row count take turns on
the kernels, timed where they run, and the fastest is kept for the model
(``measured_product``, ``KernelChoice``; MINITRANSFORMER_KERNEL fixes the choice instead).
Tests hold the kernels equal (to fp32 rounding): the choice changes the speed, and the
results only in the last bits.

Shapes: N rows of input, K = in_features, M = out_features.
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
import torch.nn.functional as F
from torch import nn

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


def trial_kernels() -> tuple[str, ...]:
    """The kernels a trial compares: the packed copy and BLAS, and MKL's packed GEMM where
    it works here (``mkl_works``)."""
    return ("packed", "blas") + (("mkl",) if mkl_works() else ())


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


def next_power_of_two(n: int) -> int:
    """1 -> 1, 3 -> 4, 6 -> 8: products whose row counts round to the same number share a
    kernel choice."""
    return 1 << max(n - 1, 0).bit_length()


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
    copies: int = 0  # ``copies_made`` when the current pass began
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
        self.schedule = trial_schedule(trial_kernels())
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
                trial = self.trials[bucket] = Trial(id(module), self.schedule, start=now,
                                                    copies=copies_made)
            elif id(module) == trial.anchor:
                if copies_made != trial.copies and not trial.again:
                    trial.again = True  # it made MKL copies: not counted, once, and run again
                else:
                    trial.pass_ended(max(trial.end - trial.start, 0.0))
                    trial.again = False
                trial.start, trial.products, trial.copies = now, 0, copies_made
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


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W (M, K) copied into oneDNN's blocked layout for ``packed_linear``."""
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  post: tuple[str, str] = ("none", "")):
    """x W^T + b from W packed by ``pack``: (..., K) -> (..., M); ``post`` = (an activation
    oneDNN applies on the way out, its variant), e.g. ("gelu", "tanh")."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, post[0], [], post[1])


# MKL's copy is packed for the products' row count rounded up to a multiple of this, their
# inputs padded with zero rows to match: the rows of a batch whose sentences end one by one
# then need a new copy every 8, not every row (a product of a few rows reads W once, so the
# padding rows cost little; the trials time them).
MKL_ROW_GRAIN = 8
# MKL copies kept per weight, the latest used (``MKLPacked``): a generation's steps and its
# prefills each keep theirs.
MKL_COPIES = 2
# MKL copies made so far in this process. A trial's pass in which some were made (the first
# on MKL of a new scope: generation opens one per call) is not counted but run again, once,
# since the packing is not the kernel's speed.
copies_made = 0


class MKLPacked:
    """x W^T + b from W in MKL's packed layout (``cblas_sgemm_pack``, then
    ``cblas_sgemm_compute``), which skips the packing of W that MKL's GEMM of a few rows
    otherwise does at every call.

    MKL packs W for the number of rows it is told (a copy packed for one row computed 8
    rows 25% slower here than one packed for 8), and PyTorch's op computes from the copy
    only for those rows. So a copy is made at the first product of a row count, for its rows
    rounded up to ``MKL_ROW_GRAIN``, and the last ``MKL_COPIES`` copies are kept: a
    generation's steps and its context shifts' prefills each find theirs (with one copy,
    while the prefills' kernel was on trial, a batch of 8 packed every weight twice at each
    shift the trial ran on MKL, and its 500 tokens took 2.35-2.42 s against 2.20-2.37 s),
    and a row count that no kept copy serves packs anew. A copy must stay where it is:
    MKL's layout depends on its address's alignment.

    ``source`` gives (W, b) when a copy is made: a layer's own parameters, or a stack made
    then (self-attention's [W^Q; W^K; W^V]), held with the copy and dropped with it
    (``release``), so that nothing is held while MKL's kernel is not used."""

    def __init__(self, source: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]):
        self.source = source
        # ((rows, copy, W, b), ...), the latest first: read and replaced whole, so that a
        # thread sees one whole tuple
        self.held: tuple[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None], ...] = ()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., M)."""
        held = self.held  # read once: another thread may pack for its rows meanwhile
        if held and x.dim() == 2 and x.shape[0] == held[0][0]:
            # a step's rows, as the last product's and a multiple of 8: the copy as it is
            # (this call costs 12 µs on 8 rows of 384 x 384, and the general path 4 µs more)
            rows, copy, weight, bias = held[0]
            return torch.ops.mkl._mkl_linear(x, copy, weight, bias, rows)  # (N, M)
        x2 = x.reshape(-1, x.shape[-1])  # (N, K)
        n = x2.shape[0]
        if n == 0:  # no rows to pack for
            return F.linear(x, *self.source())
        rows = -(-n // MKL_ROW_GRAIN) * MKL_ROW_GRAIN
        entry = next((e for e in held if e[0] == rows), None)
        if entry is None:
            weight, bias = self.source()
            with torch.inference_mode():
                copy = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
            entry = (rows, copy, weight, bias)
            self.held = (entry,) + held[:MKL_COPIES - 1]
            global copies_made
            copies_made += 1
        elif entry is not held[0]:
            self.held = (entry,) + tuple(e for e in held if e is not entry)
        _, copy, weight, bias = entry
        if rows > n:
            x2 = torch.cat((x2, x2.new_zeros(rows - n, x2.shape[1])))  # (rows, K)
        y = torch.ops.mkl._mkl_linear(x2, copy, weight, bias, rows)  # (rows, M)
        return y[:n].view(*x.shape[:-1], y.shape[-1])  # (..., M)

    def release(self, served: set[int]) -> None:
        """Drop the copies except those serving products whose rows round (to the next power
        of two, as ``KernelChoice`` groups them) to one of ``served``, the row counts whose
        kernel is MKL's (the copy for 8 rows serves every count up to 8)."""
        buckets = {max(rows, MKL_ROW_GRAIN) for rows in served}
        self.held = tuple(e for e in self.held if next_power_of_two(e[0]) in buckets)


def fused_activation(act: nn.Module) -> tuple[str, str] | None:
    """The oneDNN post-op computing ``act``, or None where there is none."""
    if type(act) is nn.ReLU:
        return "relu", ""
    if type(act) is nn.GELU:
        return "gelu", act.approximate  # "none" (erf) or "tanh"
    return None


@functools.cache
def packing_works() -> bool:
    """Whether this PyTorch build has oneDNN's packed linear and it computes x W^T + b (an
    fp32-rounding match with ``F.linear`` on a probe); False turns packing off."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
        x = torch.randn(3, 5, 40, generator=g)
        torch.is_autocast_enabled("cpu")  # use_packed asks it (PyTorch 2.4 on)
        with torch.inference_mode():
            return torch.allclose(packed_linear(x, pack(w), b), F.linear(x, w, b),
                                  rtol=1e-5, atol=1e-5)
    except (RuntimeError, AttributeError, NotImplementedError, TypeError):
        return False


@functools.cache
def say_no_mkl() -> None:
    print(f"note: {KERNEL_ENV}=mkl, but this PyTorch build has no MKL packed GEMM; BLAS "
          "computes its products", file=sys.stderr)


@functools.cache
def mkl_works() -> bool:
    """Whether this build has MKL's packed GEMM and it computes x W^T + b (fp32-rounding
    matches with ``F.linear`` on probes of 1 to 70 rows); False leaves the "mkl" kernel out
    of the trials."""
    if not (torch.backends.mkl.is_available() and packing_works()):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(200, 136, generator=g), torch.randn(200, generator=g)
        product = MKLPacked(lambda: (w, b))
        with torch.inference_mode():
            return all(torch.allclose(product(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
                       for rows in (1, 3, 8, 70, 67)
                       for x in [torch.randn(rows, 136, generator=g)])
    except (RuntimeError, AttributeError, NotImplementedError, TypeError):
        return False
