"""GPT-2 small against its modern twin on one GPU: tokens/s, MFU and val loss at a token budget.

One prepared script for a lent GPU (about 5 minutes with the three compiles):

    python bench/gpu_modern.py --tokens 6_000_000           # on the GPU machine
    python bench/gpu_modern.py --smoke                      # seconds on a CPU: the script runs

For each of the presets `gpt2-124m` and `gpt2-124m-modern` (the latter with AdamW too, to
tell the architecture's cost from Muon's) it trains on the bundled Tiny
Shakespeare (GPT-2's byte-level BPE fitted to it, context 1024) in bf16 with torch.compile,
for the same number of tokens, and prints tokens/s (the median of the logged intervals, so
not the compile; and over the whole run), MFU against the GPU's measured bf16 matmul peak (not
the datasheet's), and the best and the last of `--evals` val losses (Tiny Shakespeare is about
300,000 tokens of this BPE: a 124M model overfits it within a few epochs, so the best is the
figure to compare). MFU counts 6 N + 12 L T C
FLOPs per token (N parameters without embeddings; the attention term of the PaLM paper's
appendix B).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# GPT-2 small, its modern twin with GPT-2's AdamW (the architecture alone), and with Muon
RUNS = ("gpt2-124m", "gpt2-124m-modern:optimizer=adamw", "gpt2-124m-modern")


def measured_peak_flops(device: str, dtype=torch.bfloat16, n: int = 8192) -> float:
    """FLOP/s of one large bf16 matmul, the best of a few."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 10 * 2 * n ** 3 / (time.perf_counter() - t))
    return best


def flops_per_token(meta: dict) -> float:
    m = meta["model"]
    L, C, T = m["n_layer"], m["n_embd"], m["block_size"]
    kv = (m.get("n_kv_head") or m["n_head"]) / m["n_head"]
    width = m.get("d_ff") or (-(-(8 * C) // 24) * 8 if m.get("activation") == "swiglu" else 4 * C)
    mats = 3 if m.get("activation") == "swiglu" else 2
    n = L * (C * C * (2 + 2 * kv) + mats * C * width)  # attention + FFN matrices
    return 6 * n + 12 * L * T * C


def run(variant: str, out: Path, args) -> dict:
    """One training run of ``variant``: a preset, or ``preset:field=value,...`` (fields
    changed on top of it, as ``gpt2-124m-modern:optimizer=adamw``)."""
    preset, _, changes = variant.partition(":")
    if any("=" not in c for c in filter(None, changes.split(","))):
        sys.exit(f"--runs {variant}: write the changes as preset:field=value,field=value")
    fields = [a for c in filter(None, changes.split(",")) for a in ("--" + c.split("=")[0],
                                                                      c.split("=", 1)[1])]
    tokens_per_step = args.batch_size * args.block_size
    steps = max(1, args.tokens // tokens_per_step)
    cmd = [sys.executable, "-m", "minitransformer", "train", "--data", "shakespeare",
           "--tokenizer", "bpe-bytes", "--vocab_size", str(args.vocab_size), "--preset", preset,
           "--out", str(out), "--force", "--quiet", "--sample_tokens", "0",
           "--block_size", str(args.block_size), "--batch_size", str(args.batch_size),
           "--max_iters", str(steps), "--eval_interval", str(max(1, steps // args.evals)),
           "--log_interval", str(max(1, steps // 40)), "--eval_iters",
           str(args.eval_iters), "--warmup_iters", str(min(200, steps // 10)),
           "--time_budget", "none", "--dtype", args.dtype, "--compile", args.compile, *fields]
    if args.smoke:
        cmd += ["--n_layer", "2", "--n_embd", "64", "--n_head", "4"]
    t = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.time() - t
    meta = json.loads((out / "config.json").read_text())
    state = json.loads(sorted((out / "checkpoints").glob("step_*/trainer_state.json"))[-1]
                       .read_text())
    rows = list(csv.DictReader((out / "log.csv").open()))
    logged = sorted(float(r["tokens_per_s"]) for r in rows if r["tokens_per_s"])[2:]
    vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    best_step, best = min(vals, key=lambda v: v[1])
    return {"preset": variant, "steps": steps, "tokens": steps * tokens_per_step,
            "best_val_loss": best, "best_step": best_step, "last_val_loss": vals[-1][1],
            "tokens_per_s": logged[len(logged) // 2] if logged else float("nan"),
            "tokens_per_s_whole": steps * tokens_per_step / state["train_seconds"],
            "wall_s": wall, "flops_per_token": flops_per_token(meta)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=6_000_000, help="training tokens a run")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--eval_iters", type=int, default=20)
    p.add_argument("--evals", type=int, default=8, help="val losses over the run")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--compile", default="on")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-modern")
    p.add_argument("--runs", nargs="+", default=list(RUNS),
                   help="presets, or preset:field=value,... (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on a CPU, no MFU")
    args = p.parse_args()
    if args.smoke:
        args.tokens, args.batch_size, args.block_size = 4096, 4, 64
        args.vocab_size, args.eval_iters, args.dtype, args.compile = 512, 2, "float32", "off"
    peak = None if args.smoke or not torch.cuda.is_available() else measured_peak_flops("cuda")
    rows = [run(v, args.out / v.replace(":", "_").replace("=", "-").replace(",", "_"), args)
            for v in args.runs]
    print(f"measured bf16 matmul peak: {peak / 1e12:.0f} TFLOP/s" if peak else "no GPU: no MFU")
    print("| preset | tokens | tokens/s (whole run) | MFU | best val loss (step) | last |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        mfu = f"{100 * r['tokens_per_s'] * r['flops_per_token'] / peak:.1f}%" if peak else "-"
        print(f"| {r['preset']} | {r['tokens']:,} | {r['tokens_per_s']:,.0f} "
              f"({r['tokens_per_s_whole']:,.0f}) | {mfu} | {r['best_val_loss']:.3f} "
              f"({r['best_step']}) | {r['last_val_loss']:.3f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"peak_flops": peak, "runs": rows},
                                                      indent=1))


if __name__ == "__main__":
    main()
