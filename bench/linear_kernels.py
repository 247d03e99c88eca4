"""One projection of a decoding step: BLAS's ``F.linear``, oneDNN's packed weights, MKL's.

    python bench/linear_kernels.py [--rounds 15]

Decoding feeds 1 row per sequence (8 for ``--num-samples 8``, 32 for a batch of sentences)
through each projection; the product reads every weight once. A model larger than the
last-level cache reads them from memory, so each shape is timed cycling through enough
copies of its weight (64 MB) that none stays in a cache of up to 64 MB (a larger L3, one
VM's 480 MiB, still holds them): microseconds per call, medians, for 1 and 2 threads.
The shapes are config (b)'s (6 x 384: q/k/v/out, the stacked q|k|v, the FFN's two), two of
GPT-2 small's, and two small ones below ``nn.linear.PACK_MIN_ELEMENTS``. MKL's packed GEMM
(``nn.packing.MKLPacked``, where this build has it) is packed for the row count timed.
Decoding does not go by these figures: each model times the kernels where they run
(``nn.kernels.measured_product``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minitransformer.nn.linear import PACK_MIN_ELEMENTS
from minitransformer.nn.packing import MKLPacked, mkl_works, pack, packed_linear, packing_works

ROWS = (1, 8, 32)

SHAPES = ((128, 128), (384, 128), (384, 384), (1152, 384), (1536, 384), (384, 1536),
          (768, 768), (3072, 768))  # (out, in)


def per_call(fn, calls: int, rounds: int) -> float:
    """Median microseconds per call of ``fn``, which makes ``calls`` calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / calls * 1e6


@torch.inference_mode()
def measure(m: int, k: int, rows: int, rounds: int) -> tuple[float, float, float | None]:
    """Microseconds per call: F.linear, oneDNN's packed copy, MKL's (None where it is
    missing)."""
    n = max(4, int(64e6 / (m * k * 4)))  # copies: 64 MB of weights, past the cache
    weights = [torch.randn(m, k) for _ in range(n)]
    packed = [pack(w) for w in weights]
    b, x = torch.randn(m), torch.randn(rows, 1, k)
    blas = per_call(lambda: [F.linear(x, w, b) for w in weights], n, rounds)
    onednn = per_call(lambda: [packed_linear(x, p, b) for p in packed], n, rounds)
    if not mkl_works():
        return blas, onednn, None
    mkl = [MKLPacked(w, b) for w in weights]
    return blas, onednn, per_call(lambda: [p(x) for p in mkl], n, rounds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    if not packing_works():
        raise SystemExit("this PyTorch build has no oneDNN packed linear")
    print("| threads | W (out x in) | MB | packed? | "
          + " | ".join(f"{r} {'row' if r == 1 else 'rows'}: F.linear | oneDNN | MKL"
                       for r in ROWS)
          + " |\n|---:|---|---:|---|" + "---:|" * (3 * len(ROWS)))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for m, k in SHAPES:
            cells = [f"{t:.0f}" if t is not None else "-"
                     for rows in ROWS for t in measure(m, k, rows, a.rounds)]
            print(f"| {threads} | {m} x {k} | {m * k * 4 / 1e6:.2f} | "
                  f"{'yes' if m * k >= PACK_MIN_ELEMENTS else 'no'} | {' | '.join(cells)} |",
                  flush=True)


if __name__ == "__main__":
    main()
