"""Device, precision and compile choices, with ``auto`` picking what the hardware does well."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

import torch

from ..errors import UserError
from ..nn.linear import packed_weights


def pick_device(name: str = "auto") -> torch.device:
    """auto: CUDA, then MPS, then CPU. Asking for a device that is absent is a user error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but PyTorch sees no CUDA GPU here "
                        "(use --device auto or cpu)")
    if name == "mps" and not (getattr(torch.backends, "mps", None)
                              and torch.backends.mps.is_available()):
        raise UserError("--device mps was asked for, but MPS is not available here")
    return torch.device(name)


def cpu_has_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA GPUs that have it, fp16 (with a grad scaler) on older ones, bf16 on
    CPUs with native bf16 instructions (the matmuls run twice as fast; attention then takes
    the explicit path, see ``nn.attention.fused_kernel_pays``), fp32 everywhere else (MPS
    included)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_bf16():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward pass; weights stay fp32 (master weights)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_threads() -> None:
    """One intra-op thread per physical core (hyper-threads slow matmuls down on CPU)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    n = os.cpu_count() or 1
    torch.set_num_threads(max(1, min(n, torch.get_num_threads())))


class EagerFallback(torch.nn.Module):
    """Runs the compiled model; the first time it fails (compilation happens lazily, on the
    first call), says so once and runs the plain model from then on."""

    def __init__(self, compiled, eager: torch.nn.Module):
        super().__init__()
        self.eager = eager  # the one registered module: state_dict keys stay the plain ones
        self._compiled = [compiled]  # kept out of the module tree

    @property
    def config(self):
        return self.eager.config

    def forward(self, *args, **kwargs):
        if self._compiled:
            try:
                return self._compiled[0](*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - compile errors come in many types
                print(f"note: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); "
                      f"continuing without it", file=sys.stderr)
                self._compiled.clear()
        return self.eager(*args, **kwargs)


DECODING_PROBES = 7  # timed steps per thread count


def decoding_threads(model: torch.nn.Module, device: torch.device, batch: int = 1) -> int:
    """Pick the CPU thread count for decoding ``batch`` sequences together; returns it.

    Each decoding step runs many small kernels that read their weights once, so the step is
    bound by memory: on an idle machine every core reading its share is faster (1.3x with 2
    cores here). When other programs hold the cores, though, a second thread's share of
    each kernel waits for a core, and decoding gets several times slower than on one thread.
    So a few one-token steps are timed both ways, in turns (a few milliseconds for small
    models, about 0.1 s for a 6 x 384 one), and the faster median is kept. The steps are
    timed as generation runs them (``batch`` rows, packed weights), on oneDNN's packed copy
    for both counts: the kernel trials (``nn.kernels``) are left to generation, since these
    passes switch thread counts at every step and end with a scope of their own, whose MKL
    copies the next scope makes again. OMP_NUM_THREADS, when set, wins.
    """
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1 or "OMP_NUM_THREADS" in os.environ:
        return n
    idx = torch.zeros(batch, 1, dtype=torch.long, device=device)
    was_training = model.training
    model.eval()

    def step_seconds(threads: int) -> float:
        torch.set_num_threads(threads)
        model(idx)  # the first call after a switch also wakes or parks threads: not counted
        t0 = time.perf_counter()
        model(idx)
        return time.perf_counter() - t0

    times: dict[int, list[float]] = {n: [], 1: []}
    try:
        with packed_weights(model, measure=False), torch.inference_mode():
            for _ in range(DECODING_PROBES):  # in turns, so that a change of load hits both
                for threads in times:
                    times[threads].append(step_seconds(threads))
    finally:
        model.train(was_training)
    many, one = statistics.median(times[n]), statistics.median(times[1])
    best = n if many < one else 1
    torch.set_num_threads(best)
    return best


def maybe_compile(model, mode: str, device: torch.device):
    """torch.compile when asked (auto = on CUDA), falling back to eager mode if compilation
    fails now or on the first call; returns (model to call, compiled?)."""
    want = mode == "on" or (mode == "auto" and device.type == "cuda")
    if not want:
        return model, False
    try:
        compiled = EagerFallback(torch.compile(model), model)
    except Exception as e:  # noqa: BLE001 - any failure means: run eagerly
        print(f"note: torch.compile is unavailable ({type(e).__name__}: {e}); running eagerly",
              file=sys.stderr)
        return model, False
    if device.type == "cpu":
        print("note: torch.compile compiles the model during the first steps (half a minute or "
              "more on a CPU), and that time counts as training time (and against "
              "--time_budget); --compile off skips it", file=sys.stderr)
    return compiled, True
