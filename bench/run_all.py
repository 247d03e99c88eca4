"""`make bench`: the fast paths against the readable reference path, measured in one run.

Reference path = the foundation's tested implementation unchanged: explicit softmax attention,
fp32, no KV cache. Every figure is printed in absolute terms and as a ratio to that path.
The paths take turns (``--rounds`` rounds, medians reported), so a change in the machine's
load during the run falls on all of them alike.

    python bench/run_all.py [--quick] [--compile] [--rounds N] [--skip-parity]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generation  # noqa: E402
import loss_parity  # noqa: E402
import translate_speed  # noqa: E402
from common import matmul_peak  # noqa: E402
from train_throughput import measure  # noqa: E402

# GPT-2's layer (GELU, Pre-LN, learned positions: GPTConfig's defaults) at two sizes
CONFIGS = {
    "a": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, activation="gelu"),
    "b": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=16, activation="gelu"),
}
TARGETS = {"a": 1.2, "b": 1.5}  # training speed-ups the fast path must reach
# (label, attn_impl, dtype, compile): the last non-compiled one is what `train` runs by default
PATHS = [("reference: explicit softmax", "reference", "float32", "off"),
         ("fast, --dtype float32 (fused attention kernel)", "auto", "float32", "off"),
         ("fast, --dtype auto (what train does)", "auto", "auto", "off")]


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


def training_table(iters: int, rounds: int, with_compile: bool, peaks: dict) -> dict:
    paths = PATHS + ([("fast + torch.compile", "auto", "auto", "on")] if with_compile else [])
    print("| config | path | dtype | ms/iter | tokens/s | MFU | vs reference |")
    print("|---|---|---|---:|---:|---:|---:|")
    speedups = {}
    for name, cfg in CONFIGS.items():
        times = {label: [] for label, *_ in paths}
        results = {}
        for _ in range(rounds):
            for label, impl, dtype, comp in paths:
                r = measure("cpu-small", impl, "cpu", dtype, comp, iters=iters, warmup=3,
                            peak=peaks["float32"], **cfg)
                times[label].append(r["ms_per_iter"])
                results[label] = r
        base = statistics.median(times[paths[0][0]])
        for label, *_ in paths:
            r, ms = results[label], statistics.median(times[label])
            tok_s = cfg["batch_size"] * cfg["block_size"] / (ms / 1e3)
            mfu = tok_s * r["flops_per_token"] / peaks[r["dtype"]]
            print(f"| ({name}) {cfg['n_layer']}L {cfg['n_embd']}w T={cfg['block_size']} "
                  f"B={cfg['batch_size']} | {label} | {r['dtype']} | {ms:.1f} | {tok_s:,.0f} | "
                  f"{100 * mfu:.1f}% | {base / ms:.2f}x |", flush=True)
        speedups[name] = base / statistics.median(times[PATHS[-1][0]])
    return speedups


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations and tokens")
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    p.add_argument("--rounds", type=int, default=None, help="turns each path takes (3)")
    p.add_argument("--skip-parity", action="store_true",
                   help="skip the 2000-iteration val-loss comparison (about 3 minutes)")
    a = p.parse_args()
    iters = 10 if a.quick else 20
    rounds = a.rounds or (2 if a.quick else 3)
    cpu = torch.device("cpu")
    peaks = {"float32": matmul_peak(cpu, torch.float32),
             "bfloat16": matmul_peak(cpu, torch.bfloat16)}
    print(f"machine: {machine()}")
    print(f"measured matmul peak (2048^3): fp32 {peaks['float32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {peaks['bfloat16'] / 1e9:.0f} GFLOP/s\n")
    speedups = training_table(iters, rounds, a.compile, peaks)

    n = 100 if a.quick else 500
    print()
    g = generation.compare(n, rounds=1 if a.quick else 2)
    b = generation.batched(n, 8, rounds=1 if a.quick else 2)
    gen_ratios = generation.report(g, b, n)

    print("\ntranslation against Hugging Face's MarianMTModel.generate (same sizes, random "
          "weights, same work):")
    tr = {}
    for preset in ("cpu-small", "base"):
        r = translate_speed.compare(preset, rounds=1 if a.quick else 3)
        for beam, v in r.items():
            tr[(preset, beam)] = v["ours"] / v["hf"]
            print(f"| {preset} | {'greedy' if beam == 1 else f'beam {beam}'} | "
                  f"{v['ours']:,.0f} | {v['hf']:,.0f} tokens/s | {tr[(preset, beam)]:.2f}x |",
                  flush=True)

    parity = None
    if not a.skip_parity:
        iters_parity = 300 if a.quick else 2000
        print(f"\nval loss after {iters_parity} iterations on Tiny Shakespeare, config (a):")
        parity = loss_parity.compare(iters_parity)
        for label, r in parity.items():
            print(f"| {label} | {r['val_loss']:.4f} | {r['seconds']:.0f} s of training |")

    print("\ntargets" + (" (--quick runs are shorter: the targets are for the full run)"
                          if a.quick else "") + ":")
    for name, target in TARGETS.items():
        print(f"- training ({name}) fast/reference {speedups[name]:.2f}x (>= {target}x)")
    for name, value in gen_ratios.items():
        print(f"- generation {name.replace('_', ' ')} {value:.2f}x (>= "
              f"{generation.TARGETS[name]}x)")
    for (preset, beam), value in tr.items():
        print(f"- translation {preset} {'greedy' if beam == 1 else f'beam {beam}'} ours/HF "
              f"{value:.2f}x (>= {translate_speed.TARGETS[preset]}x)")
    if parity:
        ref, fast = (r["val_loss"] for r in parity.values())
        print(f"- val loss fast - reference {fast - ref:+.4f} (within 0.02)")


if __name__ == "__main__":
    main()
