"""Shared pieces of the benchmarks: the matmul peak, FLOP counts, timing."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None,
                repeat: int = 10) -> float:
    """Measured FLOP/s of one large square matmul on this device in this dtype."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        a @ b
    sync(device)
    return 2 * n ** 3 * repeat / (time.perf_counter() - t0)


def flops_per_token(n_params: int, n_layer: int, n_embd: int, block_size: int) -> float:
    """Training FLOPs per token: 6N for the weights plus 12 L T C for attention (PaLM, app. B)."""
    return 6 * n_params + 12 * n_layer * n_embd * block_size
