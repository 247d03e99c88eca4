"""The optimizers: AdamW with weight decay on matrices only, or Muon for the hidden matrices.

Decay pulls weights toward zero; it regularises the matrices that mix features (linear
layers, token embeddings) but not biases, norm gains or position tables, where pulling
toward zero only hurts (GPT-2 / nanoGPT practice).

Muon (Jordan et al. 2024; ``torch.optim.Muon``) replaces each hidden matrix's momentum-
averaged gradient by the nearest semi-orthogonal matrix (five Newton-Schulz iterations of
G -> a G + b G G^T G + c (G G^T)^2 G), so that every direction of the update moves at the
same rate. It is defined for 2-D matrices only, and for those that map features to
features: the embedding (a lookup table), the output head (which maps to the vocabulary),
norms and biases stay with AdamW. ``MuonWithAdamW`` steps both as one optimizer, each group
with its own peak learning rate, one schedule scaling both (``lr_scale``).

torch.optim.Muon runs the iterations in bf16. A CPU without native bf16 (no AVX512-BF16 or
AMX: most AMD and many Intel chips) emulates bf16 products, about 35x slower than fp32 ones
there, and Muon took 420 ms of a 520 ms ``cpu-small-modern`` step. On such a CPU the step
runs the same iteration in fp32 (``newton_schulz``), more precise and far faster.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import nn

from ..errors import ConfigError, UserError
from ..nn.norm import NORMS
from ..nn.positional import LearnedPositionalEmbedding
from .device import cpu_has_bf16

MUON_LR, MUON_MOMENTUM = 0.02, 0.95  # Keller Jordan's defaults for the hidden matrices

# Layers that map to the vocabulary: never Muon's, even where they are not tied to an embedding
OUTPUT_LAYERS = ("lm_head", "mlm_head.decoder")


def param_groups(model: nn.Module, weight_decay: float, exclude: set[int] = frozenset()
                 ) -> list[dict]:
    """Two AdamW groups: matrices (decayed) and everything else (not decayed); parameters
    whose id is in ``exclude`` (Muon's) are left out."""
    no_decay_ids = set()
    for module in model.modules():
        if isinstance(module, (*NORMS, LearnedPositionalEmbedding)):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay = [], []
    for p in model.parameters():  # shared (tied) parameters come once
        if not p.requires_grad or id(p) in exclude:
            continue
        (decay if p.dim() >= 2 and id(p) not in no_decay_ids else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def muon_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the hidden matrices: 2-D weights of linear layers that are neither
    an output layer nor shared with an embedding (a tied head)."""
    embedding_ids = {id(p) for m in model.modules()
                     if isinstance(m, (nn.Embedding, LearnedPositionalEmbedding))
                     for p in m.parameters(recurse=False)}
    found, seen = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or name.endswith(OUTPUT_LAYERS):
            continue
        w = module.weight
        if w.requires_grad and w.dim() == 2 and id(w) not in embedding_ids | seen:
            seen.add(id(w))
            found.append((f"{name}.weight", w))
    return found


def _adamw(groups: list[dict], learning_rate: float, betas: tuple[float, float],
           device_type: str) -> torch.optim.AdamW:
    """AdamW; the fused kernel on CUDA and CPU (one pass over all parameters: 0.55 vs 2.6 ms a
    step for the cpu-small model), the multi-tensor (foreach) one elsewhere."""
    kwargs = {}
    params = inspect.signature(torch.optim.AdamW).parameters
    if device_type in ("cuda", "cpu") and "fused" in params:
        kwargs["fused"] = True
    elif "foreach" in params:
        kwargs["foreach"] = True
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **kwargs)


class MuonWithAdamW:
    """Muon for the hidden matrices and AdamW for the rest, stepped as one optimizer.

    ``param_groups`` lists AdamW's groups, then Muon's; ``state_dict`` is one dict in
    PyTorch's layout (Muon's parameter indices after AdamW's, each group marked with its
    ``optimizer``), so checkpoints store it as they store AdamW's.
    """

    def __init__(self, adamw: torch.optim.Optimizer, muon: torch.optim.Optimizer,
                 fp32_iterations: bool = False):
        self.adamw, self.muon = adamw, muon
        self.fp32_iterations = fp32_iterations  # newton_schulz instead of torch's bf16 one

    @property
    def state(self) -> dict:
        """Both optimizers' per-parameter state, as of now (filled in by their first step)."""
        return {**self.adamw.state, **self.muon.state}

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups + self.muon.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None) -> None:
        self.adamw.step()
        with newton_schulz_in_fp32() if self.fp32_iterations else contextlib.nullcontext():
            self.muon.step()

    def state_dict(self) -> dict:
        a, m = self.adamw.state_dict(), self.muon.state_dict()
        offset = sum(len(g["params"]) for g in a["param_groups"])
        groups = [{**g, "optimizer": "adamw"} for g in a["param_groups"]]
        groups += [{**g, "optimizer": "muon", "params": [i + offset for i in g["params"]]}
                   for g in m["param_groups"]]
        state = {**a["state"], **{i + offset: s for i, s in m["state"].items()}}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        kinds = [g.get("optimizer", "adamw") for g in sd["param_groups"]]
        if "muon" not in kinds:
            raise UserError("this checkpoint's optimizer state is AdamW's alone; resume it with "
                            "--optimizer adamw")
        parts = {}
        for kind, opt in (("adamw", self.adamw), ("muon", self.muon)):
            groups = [g for g, k in zip(sd["param_groups"], kinds, strict=True) if k == kind]
            ids = [i for g in groups for i in g["params"]]
            offset = min(ids, default=0)
            parts[kind] = {
                "state": {int(i) - offset: s for i, s in sd["state"].items() if int(i) in ids},
                "param_groups": [{**{k: v for k, v in g.items() if k != "optimizer"},
                                  "params": [i - offset for i in g["params"]]} for g in groups]}
            opt.load_state_dict(parts[kind])


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """torch.optim.Muon's iteration in fp32: X = G / ||G||_F (wide: the transpose of a tall
    G), then ``steps`` times X <- a X + (b X X^T + c (X X^T)^2) X; (m, n) -> (m, n)."""
    a, b, c = coefficients
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x  # (r, k) with r <= k
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T  # (r, r)
        x = a * x + (b * gram + c * gram @ gram) @ x  # (r, k)
    return x.T if tall else x


@contextlib.contextmanager
def newton_schulz_in_fp32():
    """For the ``with`` block, torch.optim.Muon orthogonalises with ``newton_schulz`` (its
    module's function is looked up at every step; a PyTorch without it is left alone)."""
    from torch.optim import _muon

    original = getattr(_muon, "_zeropower_via_newtonschulz", None)
    if original is None:
        yield
        return
    _muon._zeropower_via_newtonschulz = newton_schulz
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = original


def check_muon(optimizer: str) -> None:
    """Muon needs torch.optim.Muon (PyTorch 2.9 and later)."""
    if optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        raise ConfigError(f"optimizer muon needs torch.optim.Muon (PyTorch >= 2.9); this is "
                          f"PyTorch {torch.__version__}")


def make_optimizer(model: nn.Module, learning_rate: float, weight_decay: float,
                   betas: tuple[float, float], device_type: str, optimizer: str = "adamw",
                   muon_lr: float | None = None, muon_momentum: float | None = None):
    """AdamW over every parameter, or ``MuonWithAdamW`` (``optimizer="muon"``): Muon at peak
    ``muon_lr`` (default 0.02) and momentum ``muon_momentum`` (default 0.95) for
    ``muon_parameters``, AdamW at ``learning_rate`` for the rest."""
    muon_lr = MUON_LR if muon_lr is None else muon_lr
    muon_momentum = MUON_MOMENTUM if muon_momentum is None else muon_momentum
    if optimizer == "adamw":
        return _adamw(param_groups(model, weight_decay), learning_rate, betas, device_type)
    check_muon(optimizer)
    hidden = [p for _, p in muon_parameters(model)]
    if not hidden:
        raise ConfigError("optimizer muon found no hidden matrices to optimise")
    adamw = _adamw(param_groups(model, weight_decay, exclude={id(p) for p in hidden}),
                   learning_rate, betas, device_type)
    muon = torch.optim.Muon([{"params": hidden, "lr_scale": muon_lr / learning_rate}],
                            lr=muon_lr, weight_decay=weight_decay, momentum=muon_momentum)
    return MuonWithAdamW(adamw, muon, device_type == "cpu" and not cpu_has_bf16())
