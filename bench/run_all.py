"""`make bench`: the fast paths against the readable reference path, measured in one run.

Reference path = the foundation's tested implementation unchanged: explicit softmax attention,
fp32, no KV cache. Every figure is printed in absolute terms and as a ratio to that path.

    python bench/run_all.py [--quick] [--compile]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generation  # noqa: E402
from common import matmul_peak  # noqa: E402
from train_throughput import measure  # noqa: E402

CONFIGS = {
    "a": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12),
    "b": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=16),
}


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name"))
        flags = next(line.split(":", 1)[1].split() for line in out.splitlines()
                     if line.startswith("Flags"))
        keep = [f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512f", "avx2"))]
    except (OSError, StopIteration):
        model, keep = platform.processor(), []
    return (f"{model}, {torch.get_num_threads()} threads, flags {' '.join(keep)}; "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations and tokens")
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    a = p.parse_args()
    iters = 10 if a.quick else 30
    cpu = torch.device("cpu")
    peak32 = matmul_peak(cpu, torch.float32)
    peak16 = matmul_peak(cpu, torch.bfloat16)
    print(f"machine: {machine()}")
    print(f"measured matmul peak: fp32 {peak32 / 1e9:.0f} GFLOP/s, "
          f"bf16 {peak16 / 1e9:.0f} GFLOP/s\n")
    print("| config | path | ms/iter | tokens/s | MFU | vs reference |")
    print("|---|---|---:|---:|---:|---:|")
    for name, cfg in CONFIGS.items():
        paths = [("reference (explicit softmax, fp32)", "reference", "float32", "off", peak32),
                 ("fast: fused attention, fp32", "fast", "float32", "off", peak32),
                 ("fast: fused attention, bf16 autocast", "fast", "bfloat16", "off", peak16)]
        if a.compile:
            paths.append(("fast + torch.compile, bf16", "fast", "bfloat16", "on", peak16))
        base = None
        for label, impl, dtype, comp, peak in paths:
            r = measure("cpu-small", impl, "cpu", dtype, comp, iters=iters, warmup=3, peak=peak,
                        **cfg)
            base = base or r["tokens_per_s"]
            print(f"| ({name}) {cfg['n_layer']}L {cfg['n_embd']}w T={cfg['block_size']} "
                  f"B={cfg['batch_size']} | {label} | {r['ms_per_iter']:.1f} | "
                  f"{r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
                  f"{r['tokens_per_s'] / base:.2f}x |", flush=True)
    n = 100 if a.quick else 500
    slow = generation.measure(n, use_cache=False, attn_impl="reference")
    fast = generation.measure(n, use_cache=True, attn_impl="fast")
    print(f"\ngeneration, config (b) with block_size 512, batch 1, {n} new tokens from a "
          f"1-token prompt:")
    print("| path | tokens/s | vs reference |\n|---|---:|---:|")
    print(f"| reference: no cache, explicit softmax | {slow:.1f} | 1.00x |")
    print(f"| KV cache + fused attention | {fast:.1f} | {fast / slow:.2f}x |")


if __name__ == "__main__":
    main()
