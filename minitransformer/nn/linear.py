"""The affine map every projection of the Transformer uses: y = x W^T + b.

``Linear`` is ``torch.nn.Linear`` (same parameters, same state dict, same computation): one
class that every projection of the model is, so that LoRA can find its targets.

Two ways to compute it:

- the reference path, ``F.linear`` (BLAS), always used for training, gradients and any
  dtype but fp32;
- the decoding path, inside ``packed_weights(model)``: each W of 256 KB or more is copied
  once into oneDNN's blocked layout, and, where this build has it, gets a product through
  MKL's packed GEMM; each product then takes the kernel (one of those copies, or the plain
  weight through BLAS) that the model measured fastest for its row count
  (``nn/packing.py`` makes the copies, ``nn/kernels.py`` chooses).

The copies are taken when the scope opens (MKL's at its first product) and dropped when it
closes, so a scope must not span a change of the weights (an optimizer step): generation
opens one per call, ``serve`` one for its whole life (its model never trains). An earlier
cache keyed on the weights' version counters went stale under CPU's fused AdamW, which does
not bump them.

An even earlier version wrote the one-row product as ``torch.linalg.vecdot``; in current
PyTorch that is an elementwise product through a W-sized temporary and a sum, 4-7x slower
than BLAS (docs/BENCHMARKS.md).

Shapes: N rows of input, K = in_features, M = out_features.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .kernels import KernelChoice, choice_for, measured_product
from .packing import (
    MKLPacked,
    fused_activation,
    mkl_works,
    pack,
    packed_linear,
    packing_works,
    unfused_activation,
)


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

    def mkl_products(self) -> tuple[MKLPacked, ...]:
        """Its products through MKL's packed GEMM, while ``packed_weights`` holds them."""
        return ()


# Smallest weight worth packing. A packed product costs about 20 us more per call than BLAS's
# before it reads anything, which a weight this size (256 KB) repays in a decoding step; a
# smaller one (a 128-wide model's) is faster through ``F.linear`` (docs/BENCHMARKS.md).
PACK_MIN_ELEMENTS = 1 << 16


def stackable(*weights: torch.Tensor) -> bool:
    """Whether a decoding scope may hold on to ``weights`` (read, copy or pack them outside
    their modules' calls): plain tensors (not FSDP's sharded ones), fp32, on the CPU."""
    return all(type(w) in (torch.Tensor, nn.Parameter) and w.dtype == torch.float32
               and w.device.type == "cpu" for w in weights)


def packable(*weights: torch.Tensor) -> bool:
    """Whether to pack ``weights`` (as one, stacked): ``stackable``, at least
    ``PACK_MIN_ELEMENTS`` together, and a build where packing works."""
    return (stackable(*weights) and sum(w.numel() for w in weights) >= PACK_MIN_ELEMENTS
            and packing_works())


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
    mkl_packed: MKLPacked | None = None  # W in MKL's, alike (where ``mkl_works``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed, mkl = self.packed, self.mkl_packed
        if use_packed(packed, x):
            return measured_product(self.kernels, self, x,
                                    lambda: packed_linear(x, packed, self.bias),
                                    lambda: F.linear(x, self.weight, self.bias),
                                    None if mkl is None else lambda: mkl(x))
        return F.linear(x, self.weight, self.bias)  # (..., M)

    def pack_weights(self) -> bool:
        if self.packed is not None or not packable(self.weight):
            return False
        self.packed = pack(self.weight)
        if mkl_works():
            self.mkl_packed = MKLPacked(lambda: (self.weight, self.bias))
        return True

    def unpack_weights(self) -> None:
        drop_attribute(self, "packed")
        drop_attribute(self, "mkl_packed")

    def mkl_products(self) -> tuple[MKLPacked, ...]:
        return () if self.mkl_packed is None else (self.mkl_packed,)


def drop_attribute(module: nn.Module, name: str) -> None:
    """Remove a packed copy set on ``module``, so that ``name`` reads the class's None again
    and the module's attributes are as before the scope (a ``torch.compile`` graph guards
    on them: setting None instead would make it compile again)."""
    module.__dict__.pop(name, None)


def linear_then(layer: nn.Module, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
    """act(layer(x)); inside ``packed_weights`` one call for a plain ``Linear`` and an
    activation oneDNN can apply itself (ReLU, GELU), which saves the activation's own pass
    (where that call is measured the faster, against BLAS's or MKL's product and the
    activation, ``unfused_activation``).
    (A LoRA wrapper adds its path after the product, before the activation: never fused.)"""
    packed = layer.packed if type(layer) is Linear else None
    if use_packed(packed, x) and (post := fused_activation(act)) is not None:
        mkl, then = layer.mkl_packed, unfused_activation(act)
        return measured_product(
            layer.kernels, layer, x, lambda: packed_linear(x, packed, layer.bias, post),
            lambda: then(F.linear(x, layer.weight, layer.bias)),
            None if mkl is None else lambda: then(mkl(x)))
    return act(layer(x))


@contextlib.contextmanager
def packed_weights(model: nn.Module, measure: bool = True):
    """Within the scope, every ``Packable`` of ``model`` (each fp32 CPU ``Linear``, and
    self-attention's stacked q, k, v) computes with packed copies of its weights (see the
    module docstring), and each decoder block takes its one-token steps through its
    ``StepPlan`` (``nn/step.py``); gradients, other dtypes and other devices keep the
    reference path.
    Nested scopes keep the outer copies. The weights must not change inside.

    ``modules()`` lists a module before its submodules, so a module's ``packs_for`` is known
    before they come up, and they are skipped (in a nested scope too: the outer copy serves).
    The products choose their kernel by ``model``'s ``KernelChoice``, kept across scopes
    (a submodule already packed by a scope of its own keeps that scope's). ``measure=False``
    leaves it out: the products take the packed copy (or MINITRANSFORMER_KERNEL's kernel) and
    no trial times them (``decoding_threads``' probes, which alternate thread counts).
    """
    packed, served = [], set()
    choice = choice_for(model) if measure else None
    kernels.note_kernel_setting()
    if kernels.KERNEL == "mkl" and not mkl_works():
        kernels.say_no_mkl()
    try:
        for m in model.modules():
            if not isinstance(m, Packable) or id(m) in served:
                continue
            if m.pack_weights():
                m.kernels = choice
                packed.append(m)
                if choice is not None:
                    choice.mkl_products.update(m.mkl_products())
            served.update(id(sub) for sub in m.packs_for())
        yield
    finally:
        for m in packed:
            m.unpack_weights()
            drop_attribute(m, "kernels")
