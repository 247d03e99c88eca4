"""Data-parallel training with ``torchrun``: DistributedDataParallel, or FSDP2 with --shard.

``torchrun --nproc_per_node N -m minitransformer train ...`` starts N processes with RANK,
LOCAL_RANK and WORLD_SIZE set; each builds the same model, DDP averages the gradients after
every backward pass, and only rank 0 writes files. Without those variables everything here is
a no-op and training runs in one process.

``--shard`` (``shard``) keeps 1/N of every parameter, gradient and AdamW moment on each rank
(``torch.distributed.fsdp.fully_shard``): each Transformer block is one unit, gathered for
its forward and backward pass and freed after; the root unit holds the rest (the token
embedding and the output head tied to it, positions, the last norm). Gradients are
reduce-scattered (averaged, as DDP's all-reduce), so the losses equal DDP's. A checkpoint
gathers the full state on rank 0 (``full_model_state``, ``full_optimizer_state``) and is the
same files as a DDP run's; ``set_full_state`` gives each rank its shards back on --resume.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import UserError
from ..nn.block import DecoderBlock, EncoderBlock
from .device import pick_device

# optimizers that need whole matrices (not the row slices a rank holds under --shard)
WHOLE_MATRIX_OPTIMIZERS = {"muon"}
# methods a model's decoding calls instead of forward; under --shard they gather the root
FORWARD_METHODS = ("encode", "decode")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def command(self) -> str:
        """How to start the CLI as this run was started (torchrun's processes, or one)."""
        return "minitransformer" if self.world_size == 1 else \
            f"torchrun --nproc_per_node {self.world_size} -m minitransformer"


def setup(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the process group if torchrun started us; pick this process's device."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo(), pick_device(device_name)
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                    int(os.environ.get("LOCAL_RANK", 0)))
    device = pick_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return info, device


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, info: DistInfo, device: torch.device,
         sharded: bool = False) -> torch.nn.Module:
    """DDP around ``model`` under torchrun; the model itself alone or already ``shard``ed."""
    if not info.enabled or sharded:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The average over ranks of a scalar tensor (itself when not distributed)."""
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def from_main(value: float, info: DistInfo, device: torch.device) -> float:
    """Rank 0's value of a float, on every rank (keeps decisions such as the lr identical)."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def gather(obj, info: DistInfo) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def no_sync(run_model: torch.nn.Module, model: torch.nn.Module):
    """A context in which backward passes accumulate gradients without averaging them over the
    ranks (every micro-batch but the last): DDP's no_sync, FSDP's gradient-sync switch."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return run_model.no_sync()

    @contextlib.contextmanager
    def paused():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return paused()


# ---- --shard: FSDP2 ---------------------------------------------------------------------

def check_shard(cfg) -> None:
    """Refuse --shard where it cannot work: an optimizer that needs whole matrices, or one
    process (there is nothing to shard over; torchrun --nproc_per_node 1 is allowed)."""
    optimizer = getattr(cfg, "optimizer", "adamw")
    if optimizer in WHOLE_MATRIX_OPTIMIZERS:
        raise UserError(f"--shard cannot be used with --optimizer {optimizer}: it updates "
                        f"whole matrices, and each process holds only slices of them")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UserError("--shard splits the model over processes started by torchrun "
                        "(torchrun --nproc_per_node 2 -m minitransformer train ... --shard); "
                        "in one process, or to resume a sharded run in one, pass --shard false")


LORA_AND_SHARD = "LoRA (--lora_rank) and --shard do not combine; drop one"
SHARD_AND_FP16 = "--shard does not combine with float16 and its loss scaler; pass --dtype " \
    "bfloat16 or float32"


def check_launch(cfg, lora: bool) -> None:
    """What ``train`` would refuse about the processes that needs no data or device: said
    before a corpus is read or prepared. (``dtype auto`` picking float16 is caught later.)"""
    if cfg.shard:
        check_shard(cfg)
        if lora:
            raise UserError(LORA_AND_SHARD)
        if cfg.dtype == "float16":
            raise UserError(SHARD_AND_FP16)


def launched_world_size() -> int:
    """The process count torchrun announced (1 without it: RANK and WORLD_SIZE, as ``setup``
    reads them)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 1
    try:
        return max(1, int(os.environ["WORLD_SIZE"]))
    except ValueError:
        return 1


def shard(model: torch.nn.Module, info: DistInfo, device: torch.device) -> None:
    """Shard ``model`` in place over every rank: one FSDP unit per Transformer block, then the
    root (embeddings, the tied output head, the last norm). Call before building the
    optimizer: the parameters become DTensors holding this rank's rows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (info.world_size,))
    for module in list(model.modules()):
        if isinstance(module, (EncoderBlock, DecoderBlock)):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name in FORWARD_METHODS:
        if callable(getattr(model, name, None)):
            register_fsdp_forward_method(model, name)


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor (a collective: every rank calls it), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _aliases(model: torch.nn.Module) -> dict[str, str]:
    """{second name: first name} of each tied parameter (one tensor under several names)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on rank 0, on the CPU, each tied tensor once (as a plain model's
    checkpoint has it); {} on the other ranks. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True))
    for alias in _aliases(model):
        state.pop(alias, None)
    return state


def _param_names(model: torch.nn.Module, optimizer) -> list[str]:
    """The name of each of the optimizer's parameters in its state-dict numbering."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer's whole state on rank 0 ({} elsewhere), numbered as
    ``optimizer.state_dict()`` numbers a plain model's parameters. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    sd = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    if not sd:
        return {}
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    aliases = _aliases(model)
    groups = [{**g, "params": [index[aliases.get(n, n)] for n in g["params"]]}
              for g in sd["param_groups"]]
    state = {index[aliases.get(n, n)]: s for n, s in sd["state"].items()}
    return {"state": state, "param_groups": groups}


def set_full_state(model: torch.nn.Module, optimizer, weights: dict[str, torch.Tensor],
                   optim_state: dict, source: str) -> None:
    """Give each rank its shards of a full checkpoint (every rank has read the files)."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights = dict(weights)
    for alias, name in _aliases(model).items():
        if name in weights:
            weights.setdefault(alias, weights[name])
    names = _param_names(model, optimizer)
    try:
        by_name = {"state": {names[int(i)]: s for i, s in optim_state["state"].items()},
                   "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                                    for g in optim_state["param_groups"]]}
        set_model_state_dict(model, weights, options=_options())
        set_optimizer_state_dict(model, optimizer, by_name, options=_options())
    except (KeyError, IndexError, ValueError, RuntimeError) as e:
        raise UserError(f"{source}: the checkpoint does not fit the model ({e})") from None
