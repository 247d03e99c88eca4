"""The affine map every projection of the Transformer uses: y = x W^T + b.

``Linear`` is ``torch.nn.Linear`` (same parameters, same state dict, same computation): one
class that every projection of the model is, so that LoRA can find its targets.

Two ways to compute it:

- the reference path, ``F.linear`` (BLAS), always used for training, gradients and any
  dtype but fp32;
- the decoding path, inside ``packed_weights(model)``: each W is copied once into oneDNN's
  blocked layout, and each product reads that copy where it is the faster of the two.
  Decoding feeds one row per sequence through each projection, a matrix-vector product that
  reads every weight once per token. Which kernel reads it faster is the machine's to say
  (docs/BENCHMARKS.md, "Which kernel", bench/linear_kernels.py): on a 2-core AMD EPYC the
  packed product won for 1 and 8 rows at every size from 384 x 384 up; on a 2-core Intel
  Xeon BLAS won for one row at every size, and the packed product for 32 rows of 512-wide
  weights. So the first products of each row count (to the next power of two) and thread
  count take turns on the two kernels, timed where they run, and the faster is kept for the
  rest of the process (``measured_product``; ``KERNEL`` fixes the choice instead).
  Tests hold the two paths equal (to fp32 rounding): the choice changes the speed, and the
  results only in the last bits.

The copy is taken when the scope opens and dropped when it closes, so a scope must not span
a change of the weights (an optimizer step): generation opens one per call, ``serve`` one
for its whole life (its model never trains). An earlier cache keyed on the weights' version
counters went stale under CPU's fused AdamW, which does not bump them.

An even earlier version wrote the one-row product as ``torch.linalg.vecdot``; in current
PyTorch that is an elementwise product through a W-sized temporary and a sum, 4-7x slower
than BLAS (docs/BENCHMARKS.md).

Shapes: N rows of input, K = in_features, M = out_features.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

T = TypeVar("T")


class Packable:
    """A module with weights that ``packed_weights`` can pack: ``pack_weights`` takes its
    packed copies (returning whether it took any), ``unpack_weights`` drops them. While they
    are held, ``kernels`` is the model's ``KernelChoice``."""

    kernels: KernelChoice | None = None

    def pack_weights(self) -> bool:
        raise NotImplementedError

    def unpack_weights(self) -> None:
        raise NotImplementedError

    def packs_for(self) -> tuple[nn.Module, ...]:
        """Submodules whose products this module's packed copy computes while it holds one,
        so that they need none of their own (self-attention's stacked q, k, v)."""
        return ()


# Smallest weight worth packing. A packed product costs about 20 us more per call than BLAS's
# before it reads anything, which a weight this size (256 KB) repays in a decoding step; a
# smaller one (a 128-wide model's) is faster through ``F.linear`` (docs/BENCHMARKS.md).
PACK_MIN_ELEMENTS = 1 << 16


# Which kernel computes a product inside ``packed_weights``: "measured" (the default: the
# faster of the two where it runs, ``measured_product``), or "packed" or "blas" always (tests
# use "packed" to hold the packed path to the reference).
KERNEL: Literal["measured", "packed", "blas"] = "measured"
PROBES = 5  # products each kernel computes, in turns, before the faster is chosen
Rows = tuple[int, int]  # (rows to the next power of two, threads)


class KernelChoice:
    """Which kernel one model's products take, per row count and thread count, and the
    trials that choose it (``measured_product``). One per model, kept for the process's
    life, so that generation's scope per call does not measure again."""

    def __init__(self):
        self.faster: dict[Rows, bool] = {}  # whether the packed products were the faster
        self.trials: dict[Rows, dict[tuple, tuple[list[float], list[float]]]] = {}  # seconds


_choices: weakref.WeakKeyDictionary[nn.Module, KernelChoice] = weakref.WeakKeyDictionary()


def measured_product(choice: KernelChoice | None, key: tuple, x: torch.Tensor,
                     packed_call: Callable[[], T], blas_call: Callable[[], T]) -> T:
    """A product of ``x``: ``packed_call()`` from the packed copy or ``blas_call()`` from the
    plain weight, as ``KERNEL`` says, or when measured, by the kernel that was the faster
    for this model's products of as many rows (to the next power of two) on as many threads.

    All products of such a row count take the same kernel: a step that switches between the
    two ran slower here than one on either (docs/BENCHMARKS.md). The first products are the
    trials: each ``key`` (what is computed and the weight's shape) takes turns on the two,
    timed where it runs, among the model's other work (a kernel timed alone, its weight hot
    in the cache, can rank otherwise); once every key has ``PROBES`` turns on each, the
    kernel that would have taken less time for all of them (medians, each key weighted by how
    often it came) is kept in ``choice``. Without a choice (a module packed on its own, not
    through ``packed_weights``), the packed copy.
    """
    if KERNEL != "measured" or choice is None or torch.compiler.is_compiling():
        return blas_call() if KERNEL == "blas" else packed_call()
    rows = x.numel() // x.shape[-1]
    bucket = (1 << max(rows - 1, 0).bit_length(), torch.get_num_threads())
    faster = choice.faster.get(bucket)
    if faster is not None:
        return packed_call() if faster else blas_call()
    trials = choice.trials.setdefault(bucket, {})
    packed_times, blas_times = trials.setdefault(key, ([], []))
    packed_turn = len(packed_times) <= len(blas_times)
    t0 = time.perf_counter()
    y = packed_call() if packed_turn else blas_call()
    (packed_times if packed_turn else blas_times).append(time.perf_counter() - t0)
    if all(len(b) >= PROBES for _, b in trials.values()):
        saved = sum((len(p) + len(b)) * (statistics.median(b) - statistics.median(p))
                    for p, b in trials.values())
        choice.faster[bucket] = saved > 0
        choice.trials.pop(bucket, None)
    return y


def packable(*weights: torch.Tensor) -> bool:
    """Whether to pack ``weights`` (as one, stacked): plain tensors (not FSDP's sharded
    ones), fp32, on the CPU, at least ``PACK_MIN_ELEMENTS`` together, and a build where
    packing works."""
    return (all(type(w) in (torch.Tensor, nn.Parameter) and w.dtype == torch.float32
                and w.device.type == "cpu" for w in weights)
            and sum(w.numel() for w in weights) >= PACK_MIN_ELEMENTS and packing_works())


def use_packed(packed, x: torch.Tensor) -> bool:
    """Whether to compute with a packed copy for this input: there is one, x is fp32 on the
    CPU, no gradient is wanted (the packed product has no backward), and no autocast would
    have run the product in lower precision. ``packed`` is read once by the caller: another
    thread's scope may drop it meanwhile."""
    return (packed is not None and x.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"))


class Linear(nn.Linear, Packable):
    """Implements y = x W^T + b."""

    packed: torch.Tensor | None = None  # W in oneDNN's layout, while ``packed_weights`` holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed
        if use_packed(packed, x):
            return measured_product(self.kernels, ("linear", *self.weight.shape), x,
                                    lambda: packed_linear(x, packed, self.bias),
                                    lambda: F.linear(x, self.weight, self.bias))  # (..., M)
        return F.linear(x, self.weight, self.bias)  # (..., M)

    def pack_weights(self) -> bool:
        if self.packed is not None or not packable(self.weight):
            return False
        self.packed = pack(self.weight)
        return True

    def unpack_weights(self) -> None:
        drop_attribute(self, "packed")


def drop_attribute(module: nn.Module, name: str) -> None:
    """Remove a packed copy set on ``module``, so that ``name`` reads the class's None again
    and the module's attributes are as before the scope (a ``torch.compile`` graph guards
    on them: setting None instead would make it compile again)."""
    module.__dict__.pop(name, None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W (M, K) copied into oneDNN's blocked layout for ``packed_linear``."""
    with torch.inference_mode():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  post: tuple[str, str] = ("none", "")):
    """x W^T + b from W packed by ``pack``: (..., K) -> (..., M); ``post`` = (an activation
    oneDNN applies on the way out, its variant), e.g. ("gelu", "tanh")."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, post[0], [], post[1])


def fused_activation(act: nn.Module) -> tuple[str, str] | None:
    """The oneDNN post-op computing ``act``, or None where there is none."""
    if type(act) is nn.ReLU:
        return "relu", ""
    if type(act) is nn.GELU:
        return "gelu", act.approximate  # "none" (erf) or "tanh"
    return None


def linear_then(layer: nn.Module, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
    """act(layer(x)); inside ``packed_weights`` one call for a plain ``Linear`` and an
    activation oneDNN can apply itself (ReLU, GELU), which saves the activation's own pass
    (where that call is measured the faster, against BLAS's product and the activation).
    (A LoRA wrapper adds its path after the product, before the activation: never fused.)"""
    packed = layer.packed if type(layer) is Linear else None
    if use_packed(packed, x) and (post := fused_activation(act)) is not None:
        return measured_product(layer.kernels, ("linear", *layer.weight.shape, *post), x,
                                lambda: packed_linear(x, packed, layer.bias, post),
                                lambda: act(F.linear(x, layer.weight, layer.bias)))
    return act(layer(x))


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


@contextlib.contextmanager
def packed_weights(model: nn.Module):
    """Within the scope, every ``Packable`` of ``model`` (each fp32 CPU ``Linear``, and
    self-attention's stacked q, k, v) computes with packed copies of its weights (see the
    module docstring); gradients, other dtypes and other devices keep the reference path.
    Nested scopes keep the outer copies. The weights must not change inside.

    ``modules()`` lists a module before its submodules, so a module's ``packs_for`` is known
    before they come up, and they are skipped (in a nested scope too: the outer copy serves).
    The products choose their kernel by ``model``'s ``KernelChoice``, kept across scopes.
    """
    packed, served = [], set()
    choice = _choices.setdefault(model, KernelChoice())
    try:
        for m in model.modules():
            if not isinstance(m, Packable) or id(m) in served:
                continue
            if m.pack_weights():
                m.kernels = choice
                packed.append(m)
            served.update(id(sub) for sub in m.packs_for())
        yield
    finally:
        for m in packed:
            m.unpack_weights()
            drop_attribute(m, "kernels")
