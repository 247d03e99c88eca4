"""Does the fast path learn as well as the reference path? Config (a) trained on Tiny
Shakespeare for 2000 iterations both ways, from the same initial weights and batches.

    python bench/loss_parity.py [--iters 2000]

Config (a): 4 layers, 4 heads, 128 wide, context 64, batch 12; AdamW lr 2e-3 (warmup 100,
cosine to 2e-4 over the run), beta2 0.99, weight decay 0.1, no dropout. Val loss as nanoGPT
measures it: 200 random windows of the last 10%. The reference path is explicit softmax
attention in fp32; the fast path is what ``train`` does by default (``--dtype auto
--attn_impl auto``: bf16 autocast on a CPU with native bf16).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import tempfile
from pathlib import Path

from minitransformer.cli import main as cli

CONFIG_A = ["--n_layer", "4", "--n_head", "4", "--n_embd", "128", "--block_size", "64",
            "--batch_size", "12", "--learning_rate", "2e-3", "--min_lr", "2e-4",
            "--warmup_iters", "100", "--beta2", "0.99", "--weight_decay", "0.1",
            "--dropout", "0", "--eval_iters", "200", "--sample_tokens", "0"]
PATHS = {"reference: explicit softmax, fp32": ["--attn_impl", "reference", "--dtype", "float32"],
         "fast: --dtype auto --attn_impl auto": ["--attn_impl", "auto", "--dtype", "auto"]}


def compare(iters: int = 2000) -> dict:
    """{path: {"val_loss": ..., "seconds": ...}} after ``iters`` iterations."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, flags in PATHS.items():
            out = Path(tmp) / label.split(":")[0]
            with contextlib.redirect_stdout(io.StringIO()):  # the run's own report
                code = cli(["train", "--data", "shakespeare", "--preset", "debug", *CONFIG_A,
                            "--max_iters", str(iters), "--eval_interval", str(iters),
                            "--quiet", "--out", str(out), *flags])
            if code:
                raise SystemExit(f"training failed ({label})")
            meta = json.loads((out / "config.json").read_text())
            with open(out / "log.csv", newline="") as f:
                seconds = max(float(r["elapsed_s"]) for r in csv.DictReader(f))
            results[label] = {"val_loss": meta["val_loss"], "seconds": seconds}
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000)
    a = p.parse_args()
    results = compare(a.iters)
    for label, r in results.items():
        print(f"{label}: val loss {r['val_loss']:.4f} after {a.iters} iterations "
              f"({r['seconds']:.0f} s of training)")
    ref, fast = (r["val_loss"] for r in results.values())
    print(f"difference (fast - reference): {fast - ref:+.4f}")


if __name__ == "__main__":
    main()
