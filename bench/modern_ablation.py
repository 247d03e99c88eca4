"""From 2017 to 2026, one change at a time: the ablation of docs/modern.md.

Starts from the GPT-2-style `cpu-small` preset (LayerNorm, learned positions, ReLU, biases,
AdamW) and adds the changes of later models one after another, each run on the same corpus,
seed and budget. Prints, per step of the chain: val loss (nanoGPT's measure), its gain over
the step before, the optimizer steps taken, seconds per step, and the KV cache per token.

    python bench/modern_ablation.py --budget 120 --out runs/ablation          # the clock decides
    python bench/modern_ablation.py --steps 1500 --out runs/ablation-steps    # fixed steps
    python bench/modern_ablation.py --only cpu-small,cpu-small-modern --repeat 3 --alternate

``--alternate`` runs the chain's variants round-robin ``--repeat`` times (on a machine whose
speed drifts, alternating keeps the comparison fair) and prints each variant's median.
The figures of a run are written to --out/results.json and --out/ablation.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, what it adds, the flags of the whole chain up to and including it)
CHAIN: list[tuple[str, str, dict]] = [
    ("base", "GPT-2 style: LayerNorm, learned positions, ReLU, biases, AdamW", {}),
    ("+rmsnorm", "RMSNorm instead of LayerNorm", dict(norm="rmsnorm")),
    ("+rope", "RoPE instead of learned positions", dict(pos_encoding="rope")),
    ("+no-bias", "no biases in the linear layers", dict(bias=False)),
    ("+qk_norm", "RMSNorm on queries and keys", dict(qk_norm=True)),
    ("+swiglu", "SwiGLU in the FFN", dict(activation="swiglu")),
    ("+muon", "Muon for the hidden matrices (= cpu-small-modern)", dict(optimizer="muon")),
]
# what else can be measured along the chain, off it (added to the last variant)
EXTRA: dict[str, tuple[str, dict]] = {
    "relu2": ("ReLU^2 instead of SwiGLU", dict(activation="relu2")),
    "gqa": ("2 key/value heads of 4", dict(n_kv_head=2)),
    "softcap": ("logits soft-capped at 15", dict(logit_softcap=15.0)),
}


def variants(only: list[str] | None, extra: list[str]) -> list[tuple[str, str, dict]]:
    out, flags = [], {}
    for name, what, add in CHAIN:
        flags = {**flags, **add}
        out.append((name, what, dict(flags)))
    for name in extra:
        what, add = EXTRA[name]
        out.append((f"+{name}", what, {**flags, **add}))
    if only:
        named = {n.lstrip("+"): v for v in out for n in [v[0]]}
        named["modern"] = out[len(CHAIN) - 1]
        # a preset by its own name: what `train --preset NAME` trains
        out = [named[n.lstrip("+")] if n.lstrip("+") in named else
               (n, f"the {n} preset", {"preset": n}) for n in only]
    return out


def as_flags(fields: dict) -> list[str]:
    return [a for k, v in fields.items() for a in (f"--{k}", str(v))]


def kv_bytes_per_token(config: dict) -> int:
    """K and V of every layer for one position, in fp32."""
    heads = config.get("n_kv_head") or config["n_head"]
    return 2 * config["n_layer"] * heads * (config["n_embd"] // config["n_head"]) * 4


def run_one(out: Path, fields: dict, args) -> dict:
    fields = dict(fields)
    preset = fields.pop("preset", args.preset)
    cmd = [sys.executable, "-m", "minitransformer", "train", "--data", args.data,
           "--preset", preset, "--out", str(out), "--force", "--quiet",
           "--sample_tokens", "0", "--seed", str(args.seed), *as_flags(fields)]
    if args.steps:
        cmd += ["--time_budget", "none", "--max_iters", str(args.steps),
                "--eval_interval", str(args.steps)]
    elif args.budget:
        cmd += ["--time_budget", f"{args.budget}s"]  # else the preset's own
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    meta = json.loads((out / "config.json").read_text())
    states = sorted((out / "checkpoints").glob("step_*/trainer_state.json"))
    state = json.loads(states[-1].read_text()) if states else {}
    seconds = state.get("train_seconds", float("nan"))
    steps = state.get("step", meta["step"])  # the last checkpoint's (the best may be earlier)
    return {"val_loss": meta["best_val_loss"], "steps": steps,
            "s_per_step": seconds / max(steps, 1), "wall_s": time.time() - t0,
            "params": None, "kv_bytes_per_token": kv_bytes_per_token(meta["model"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    p.add_argument("--data", default="shakespeare")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds of training a run (default: the preset's, 120 s for cpu-small)")
    p.add_argument("--steps", type=int, default=0, help="fixed steps instead of a budget")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--preset", default="cpu-small", help="the chain's starting preset")
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--extra", default="", help=f"also: {','.join(EXTRA)}")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--alternate", action="store_true")
    p.add_argument("--set", default="", help="FIELD=VALUE,... applied to every variant")
    args = p.parse_args()
    chosen = variants([s for s in args.only.split(",") if s] or None,
                      [s for s in args.extra.split(",") if s])
    common = dict(kv.split("=", 1) for kv in args.set.split(",") if kv)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in chosen}
    order = [(r, v) for r in range(args.repeat) for v in chosen] if args.alternate else \
        [(r, v) for v in chosen for r in range(args.repeat)]
    for r, (name, _, fields) in order:
        slug = name.strip("+").replace(" ", "-")
        res = run_one(args.out / f"{slug}-{r}", {**fields, **common}, args)
        results[name].append(res)
        print(f"{name:10s} run {r}: val {res['val_loss']:.4f}  steps {res['steps']:6d}  "
              f"{1000 * res['s_per_step']:.1f} ms/step", flush=True)
    print()
    print("| variant | adds | val loss (median) | gain | steps | ms/step | KV cache / token |")
    print("|---|---|---:|---:|---:|---:|---:|")
    prev, rows = None, []
    for name, what, _ in chosen:
        runs = results[name]
        val = statistics.median(r["val_loss"] for r in runs)
        row = {"name": name, "adds": what, "val_loss": val, "runs": runs,
               "steps": statistics.median(r["steps"] for r in runs),
               "ms_per_step": 1000 * statistics.median(r["s_per_step"] for r in runs),
               "kv_bytes_per_token": runs[0]["kv_bytes_per_token"]}
        gain = "" if prev is None else f"{prev - val:+.3f}"
        print(f"| {name} | {what} | {val:.3f} | {gain} | {row['steps']:.0f} | "
              f"{row['ms_per_step']:.1f} | {row['kv_bytes_per_token']:,} B |")
        prev = val
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.out / "ablation.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["name"] for r in rows]
    vals = [r["val_loss"] for r in rows]
    ax.plot(range(len(rows)), vals, marker="o")
    for i, r in enumerate(rows):
        for run in r["runs"]:
            ax.plot(i, run["val_loss"], ".", color="gray")
    ax.set_xticks(range(len(rows)), names, rotation=20)
    ax.set_ylabel("val loss (nats / char)")
    ax.set_title("2017 -> 2026, one change at a time (Tiny Shakespeare, same budget)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
