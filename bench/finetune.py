"""Does pretraining help? A byte-level BPE GPT pretrained on Tiny Shakespeare, fine-tuned on
the English side of the bundled Bible, against the same architecture from random weights.

    python bench/finetune.py                       # about 20 minutes on 2 busy CPU cores
    python bench/finetune.py --pretrain_iters 300 --iters 100     # a quick look

1. Pretrain: ``train --data shakespeare --tokenizer bpe-bytes --vocab_size 1024 --preset
   cpu-small`` for a fixed number of steps (``--time_budget none``: steps, not the clock,
   decide, so a busy machine does not change the figures).
2. Fine-tune: ``train --init_from PRETRAINED --data bible_en.txt`` (the ``finetune`` preset:
   lr 3e-4, 50 warmup steps, cosine decay, batch 16) for N steps.
3. From scratch, the same N steps, batch and data, the same architecture and the same
   tokenizer (only the weights differ: a run folder holding the pretrained run's model with
   freshly initialised weights, started from with ``--init_from``), twice: with the
   fine-tuning settings, and with the from-scratch settings of cpu-small (lr 5e-3, 100
   warmup steps), which suit random weights better.

Every run evaluates the same val batches of the Bible's last 10% (nats per token of the
Shakespeare BPE); the bench prints each curve and the best val loss of each.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import tempfile
import time
from pathlib import Path

import torch

from minitransformer.cli import main as cli
from minitransformer.data import load_parallel
from minitransformer.families import load_run
from minitransformer.training import checkpoint as ckpt

SCRATCH_OWN = ["--learning_rate", "5e-3", "--min_lr", "1e-4", "--warmup_iters", "100"]


def bible_english(path: Path) -> int:
    """Write the English side of bible_en_es (one verse a line); returns its characters."""
    corpus = load_parallel("bible_en_es", None, "en", "es")
    text = "\n".join(corpus.src) + "\n"
    path.write_text(text, encoding="utf-8")
    return len(text)


def train(args: list[str], quiet: bool = True) -> float:
    """Run ``minitransformer train``; the seconds it took."""
    t0 = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
        code = cli(["train", *args, "--sample_tokens", "0", "--quiet"])
    if code:
        raise SystemExit(f"training failed ({code}): {' '.join(args)}\n{out.getvalue()}")
    return time.perf_counter() - t0


def val_curve(run: Path) -> list[tuple[int, float]]:
    with open(run / "log.csv", newline="") as f:
        return [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(f)
                if r.get("val_loss")]


def random_copy(run: Path, out: Path, seed: int) -> None:
    """A run folder with ``run``'s architecture and tokenizer and fresh random weights."""
    source = load_run(run)
    torch.manual_seed(seed)
    model = source.family.build_model(source.meta)  # the init scheme of a new run
    out.mkdir(parents=True)
    meta = {**source.meta, "step": 0, "note": "random weights, for comparison"}
    ckpt.write_model_files(out, model, meta, source.tokenizer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrain_iters", type=int, default=2000,
                   help="pretraining steps on Tiny Shakespeare (cpu-small shapes)")
    p.add_argument("--iters", type=int, default=600, help="steps on the Bible, N")
    p.add_argument("--eval_interval", type=int, default=50, help="val loss every N steps")
    p.add_argument("--eval_iters", type=int, default=50, help="val batches per evaluation")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        chars = bible_english(tmp / "bible_en.txt")
        pre = tmp / "pretrained"
        seconds = {"pretrain": train(
            ["--data", "shakespeare", "--tokenizer", "bpe-bytes", "--vocab_size", "1024",
             "--preset", "cpu-small", "--time_budget", "none", "--max_iters",
             str(a.pretrain_iters), "--eval_interval", str(max(1, a.pretrain_iters // 4)),
             "--eval_iters", "50", "--out", str(pre)])}
        pre_val = json.loads((pre / "config.json").read_text())["best_val_loss"]
        print(f"pretrained {a.pretrain_iters} steps on shakespeare in {seconds['pretrain']:.0f}s:"
              f" val loss {pre_val:.4f} (nats per BPE token)", flush=True)
        random_copy(pre, tmp / "random", seed=1337)
        common = ["--data", str(tmp / "bible_en.txt"), "--max_iters", str(a.iters),
                  "--eval_interval", str(a.eval_interval), "--eval_iters", str(a.eval_iters)]
        variants = {"fine-tuned": [str(pre)], "scratch, fine-tuning lr": [str(tmp / "random")],
                    "scratch, cpu-small lr": [str(tmp / "random"), *SCRATCH_OWN]}
        curves = {}
        for name, (source, *extra) in variants.items():
            run = tmp / name.replace(" ", "_").replace(",", "")
            seconds[name] = train(["--init_from", source, *common, *extra, "--out", str(run)])
            curves[name] = val_curve(run)
            print(f"{name}: best val loss {min(v for _, v in curves[name]):.4f} "
                  f"({seconds[name]:.0f}s)", flush=True)
    names = list(curves)
    print(f"\nval loss on the Bible's English side ({chars:,} characters; nats per token of "
          f"the Shakespeare BPE), batch 16 x 64 tokens:\n")
    print("| step | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for i, (step, _) in enumerate(curves[names[0]]):
        print(f"| {step} | " + " | ".join(f"{curves[n][i][1]:.4f}" for n in names) + " |")
    best = {n: min(v for _, v in c) for n, c in curves.items()}
    print("| best | " + " | ".join(f"{best[n]:.4f}" for n in names) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps({"pretrain_iters": a.pretrain_iters,
                                            "pretrain_val_loss": pre_val, "iters": a.iters,
                                            "curves": curves, "best": best,
                                            "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
