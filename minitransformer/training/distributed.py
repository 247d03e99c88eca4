"""Data-parallel training with ``torchrun`` and PyTorch's DistributedDataParallel.

``torchrun --nproc_per_node N -m minitransformer train ...`` starts N processes with RANK,
LOCAL_RANK and WORLD_SIZE set; each builds the same model, DDP averages the gradients after
every backward pass, and only rank 0 writes files. Without those variables everything here is
a no-op and training runs in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .device import pick_device


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


def wrap(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    if not info.enabled:
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
