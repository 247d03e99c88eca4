"""The affine map every projection of the Transformer uses: y = x W^T + b.

``Linear`` is ``torch.nn.Linear`` (same parameters, same state dict, same computation): one
class that every projection of the model is, so that LoRA can find its targets.

Two ways to compute it:

- the reference path, ``F.linear`` (BLAS), always used for training, gradients and any
  dtype but fp32;
- the decoding path, inside ``packed_weights(model)``: each W is copied once into oneDNN's
  blocked layout and every product reads that copy. Decoding feeds one row per sequence
  through each projection, a matrix-vector product that reads every weight once per token;
  from the blocked copy a batch of 8 rows costs 0.7-1.5x what one row costs, where BLAS's own
  product costs 0.9-2.6x, and BLAS is slower for one row too in all but one of the sizes
  measured (docs/BENCHMARKS.md, "Generation", bench/linear_kernels.py). Tests hold the two
  paths equal (to fp32 rounding).

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

import torch
import torch.nn.functional as F
from torch import nn


class Packable:
    """A module with weights that ``packed_weights`` can pack: ``pack_weights`` takes its
    packed copies (returning whether it took any), ``unpack_weights`` drops them."""

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
            return packed_linear(x, packed, self.bias)  # (..., M)
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
    activation oneDNN can apply itself (ReLU, GELU), which saves the activation's own pass.
    (A LoRA wrapper adds its path after the product, before the activation: never fused.)"""
    packed = layer.packed if type(layer) is Linear else None
    if use_packed(packed, x) and (post := fused_activation(act)) is not None:
        return packed_linear(x, packed, layer.bias, post)
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
    """
    packed, served = [], set()
    try:
        for m in model.modules():
            if not isinstance(m, Packable) or id(m) in served:
                continue
            if m.pack_weights():
                packed.append(m)
            served.update(id(sub) for sub in m.packs_for())
        yield
    finally:
        for m in packed:
            m.unpack_weights()
