"""The packed copies of a weight that decoding's products compute from (``nn/kernels.py``
says which kernel takes which).

- oneDNN's blocked layout (``pack``, ``packed_linear``), which can also apply a ReLU or GELU
  on the way out (``fused_activation``);
- MKL's packed GEMM (``MKLPacked``: ``cblas_sgemm_pack``, then ``cblas_sgemm_compute``),
  packed for the products' row count.

Each is probed once (``packing_works``, ``mkl_works``): where this PyTorch build lacks one, or
it does not compute x W^T + b, it is left out.

Shapes: N rows of input, K = in_features, M = out_features.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def next_power_of_two(n: int) -> int:
    """1 -> 1, 3 -> 4, 6 -> 8: products whose row counts round to the same number share a
    kernel choice."""
    return 1 << max(n - 1, 0).bit_length()


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


# An exact GELU on at most this many values goes to PyTorch's own kernel (``own_gelu``).
OWN_GELU_MAX = 32768


def own_gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, x Φ(x), by PyTorch's own CPU kernel, for a decoding step's few thousand
    values.

    ``F.gelu`` hands a contiguous fp32 CPU tensor to oneDNN's eltwise primitive, whose fixed
    cost is large beside so little arithmetic, most of all inside a decoding loop, where the
    step's weights and caches have just gone through the CPU's caches: 36 µs a call there at
    one row of 1,536 values, 7-9% of a one-row step of a 6-layer model (docs/BENCHMARKS.md,
    "GELU in decoding steps"); hot, 8.9 µs against 6.8 µs for this function (of which 1.7
    are the kernel, the rest the views). A transposed view of the same values is not
    contiguous, so it goes to PyTorch's own kernel, which writes the result in the view's
    layout: transposed back, it is x's. The two kernels differ by at most about 1e-6 (below
    x = -2, where oneDNN returns 0, by up to 2e-7, PyTorch's the more accurate). Up to 32,768
    values (PyTorch's grain: its kernel runs on one thread below it); larger tensors keep
    oneDNN, faster there (479 against 816 µs on 2.4 million values)."""
    n = x.numel()
    if n % 2 or not 2 < n <= OWN_GELU_MAX or not x.is_contiguous():  # (1, 2) is contiguous
        return F.gelu(x)
    return F.gelu(x.view(2, n // 2).t()).t().reshape(x.shape)


def product_gelu(y: torch.Tensor) -> torch.Tensor:
    """Exact GELU of a product's output ``y``, which nothing else holds: a step's few thousand
    values by ``own_gelu``; more, in place (by oneDNN where PyTorch has it, as ``F.gelu``: the
    same values).

    In place, because a new output is fresh memory, and the first write to each of its pages
    is a page fault: on 2.4 million values (a prefill of 8 x 192 positions, 1,536 wide) a new
    output cost 4.0 ms here, of which the GELU itself was 1.05 ms, the other 2,300 faults."""
    if y.numel() <= OWN_GELU_MAX or not y.is_contiguous():
        return own_gelu(y)
    return torch.ops.aten.gelu_(y)


def unfused_activation(act: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``act`` for the output of a product that did not apply it (BLAS's, MKL's), which
    nothing else holds: exact GELU by ``product_gelu``, ReLU in place, anything else by the
    module."""
    if type(act) is nn.GELU and act.approximate == "none":
        return product_gelu
    if type(act) is nn.ReLU:
        return F.relu_
    return act


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
