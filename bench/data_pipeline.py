"""prepare and train on big corpora: memory, throughput and start-up, ratios in one run.

    python bench/data_pipeline.py                          # 100 MB and 1 GB, every part
    python bench/data_pipeline.py --sizes 100 --only char  # a quick run

It builds its corpora itself (the bundled corpora's lines shuffled once, then repeated to
the size; written under /tmp and removed at the end), then measures:

- prepare (the CLI, a subprocess): peak anonymous memory (RssAnon from /proc/PID/status,
  summed over prepare and its encoding workers, sampled every 50 ms: file-backed pages
  such as the memory map are not counted), wall time and the encoding MB/s it reports, for
  char and byte-level BPE at each size;
- the char table lookup alone, in-process, on prepare's pieces (64 MB);
- BPE against ``tokenizers``: the pieces prepare cuts from the corpus's first --bpe_mb MB,
  encoded by prepare's workers and by ``encode_batch`` (its own Rust threads on), alternately,
  and the ids of both against prepare's tokens.bin;
- train (--only train): Tiny Shakespeare alone repeated to the largest size and prepared
  (char: the model and vocabulary of Tiny Shakespeare), against Tiny Shakespeare in memory:
  time from start to the first optimizer step, peak anonymous memory, and tokens/s
  (whole runs alternated; and, steadier on a loaded machine, blocks of training steps fed
  from each alternated in one process, medians).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CORPORA = ("shakespeare.txt", "tang.txt", "sayings.txt")


def build_corpus(path: Path, megabytes: int, seed: int = 0, corpora=CORPORA) -> None:
    """The bundled corpora's lines, shuffled once, repeated to ``megabytes``."""
    lines = []
    for name in corpora:
        lines += (ROOT / "minitransformer" / "corpora" / name).read_text("utf-8").splitlines()
    random.Random(seed).shuffle(lines)
    block = ("\n".join(lines) + "\n").encode("utf-8")
    target = megabytes * 10**6
    with open(path, "wb") as f:
        written = 0
        while written < target:
            part = block[:target - written]
            f.write(part)
            written += len(part)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(argv: list[str], watch: Path | None = None) -> dict:
    """Run ``argv``; its peak summed RssAnon (MB), wall time, output, and the time at which
    ``watch`` (a log.csv) first held an optimizer step."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    peak, first_step, done = [0], [None], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], sum(_anon_kb(p) for p in _tree(proc.pid)))
            if watch is not None and first_step[0] is None and watch.exists():
                rows = watch.read_text().splitlines()[1:]
                if any(r.split(",")[1] for r in rows):
                    first_step[0] = time.perf_counter() - start
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out = proc.communicate()[0]
    done.set()
    thread.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out}")
    return {"peak_mb": peak[0] / 1024, "wall_s": time.perf_counter() - start, "out": out,
            "first_step_s": first_step[0]}


def cli(*args: str) -> list[str]:
    return [PY, "-m", "minitransformer", *args]


def bench_prepare(corpus: Path, out: Path, kind: str, workers: int | None) -> dict:
    extra = ["--tokenizer", kind] + (["--vocab_size", "4096"] if kind != "char" else [])
    extra += ["--workers", str(workers)] if workers else []
    r = run_measured(cli("prepare", "--data", str(corpus), "--out", str(out), "--force", *extra))
    m = re.search(r"encoding ([\d.]+) s \(([\d.]+) MB/s; ([^,]+(?:,[^,]+)?), (\d+) worker",
                  r["out"])
    r.update(encode_s=float(m[1]), encode_mb_s=float(m[2]), route=m[3], workers=int(m[4]))
    return r


def bench_bpe_vs_batch(corpus: Path, data_dir: Path, megabytes: int, workers: int,
                       rounds: int = 3) -> dict:
    """prepare's workers against tokenizers' encode_batch on the same pieces, alternately."""
    import numpy as np

    from minitransformer.data import shards
    from minitransformer.data.encode import EncoderPool, choose_encoder, encoder_spec
    from minitransformer.data.pieces import cut_mode, cut_pieces
    from minitransformer.data.reading import byte_blocks
    from minitransformer.tokenizers import load_tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    tok = load_tokenizer(data_dir / "tokenizer.json")
    mode, budget, pieces = cut_mode(tok), megabytes * 10**6, []
    for _, piece in cut_pieces(((a, b) for a, b, _ in byte_blocks([corpus])), mode, b"",
                               shards.PIECE_BYTES[mode]):
        pieces.append(piece)
        budget -= len(piece)
        if budget <= 0:
            break
    spec, route = choose_encoder(encoder_spec(tok), pieces[0][:200_000].decode("utf-8", "ignore"))
    size = sum(map(len, pieces)) / 1e6
    texts = [p.decode("utf-8") for p in pieces]  # encode_batch takes str
    ours, theirs = [], []
    with EncoderPool(spec, workers) as pool:
        for _ in range(rounds):
            t = time.perf_counter()
            ids = np.concatenate([ids for ids, _ in pool.map(pieces)])
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            batch = tok.hf.encode_batch(texts, add_special_tokens=False)
            theirs.append(time.perf_counter() - t)
    ref = np.concatenate([np.array(e.ids, dtype=ids.dtype) for e in batch])
    written = np.fromfile(data_dir / "tokens.bin", dtype=ids.dtype, count=len(ref))
    return {"mb": size, "ours_mb_s": size / statistics.median(ours),
            "batch_mb_s": size / statistics.median(theirs), "route": route,
            "ids_equal": bool(np.array_equal(ids, ref) and np.array_equal(written, ref))}


def bench_char_encode(corpus: Path, data_dir: Path, megabytes: int = 64) -> dict:
    """The char table lookup alone (in this process), on the pieces prepare cuts."""
    from minitransformer.data import shards
    from minitransformer.data.encode import encoder_spec, make_counting_encoder
    from minitransformer.data.pieces import cut_pieces
    from minitransformer.data.reading import byte_blocks
    from minitransformer.tokenizers import load_tokenizer

    tok = load_tokenizer(data_dir / "tokenizer.json")
    budget, pieces = megabytes * 10**6, []
    for _, piece in cut_pieces(((a, b) for a, b, _ in byte_blocks([corpus])), "any", b"",
                               shards.PIECE_BYTES["any"]):
        pieces.append(piece)
        budget -= len(piece)
        if budget <= 0:
            break
    encode, size, times = make_counting_encoder(encoder_spec(tok)), sum(map(len, pieces)), []
    for _ in range(3):
        t = time.perf_counter()
        for piece in pieces:
            encode(piece)
        times.append(time.perf_counter() - t)
    return {"mb": size / 1e6, "mb_s": size / 1e6 / statistics.median(times)}


def bench_step_rate(data_dir: Path, blocks: int = 20, steps: int = 20) -> dict:
    """Training steps of the debug model fed from the memory map and from Tiny Shakespeare's
    in-memory tensor, alternately in one process (blocks of ``steps``): tokens/s of each."""
    import torch

    from minitransformer.config import GPTConfig
    from minitransformer.data import get_batch, load_text, split_ids
    from minitransformer.data.shards import open_shards
    from minitransformer.models import GPT
    from minitransformer.tokenizers import CharTokenizer

    torch.set_num_threads(1)
    text = load_text("shakespeare")
    tok = CharTokenizer.fit(text)
    mem = split_ids(torch.tensor(tok.encode(text), dtype=torch.long))[0]
    mapped = open_shards(data_dir)[1]
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2,
                          n_embd=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen, rates = torch.Generator().manual_seed(0), {"map": [], "mem": []}
    for i in range(2 * blocks):
        name, data = ("mem", mem) if i % 2 == 0 else ("map", mapped)
        t = time.perf_counter()
        for _ in range(steps):
            x, y = get_batch(data, 16, 32, gen)
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        rates[name].append(steps * 16 * 32 / (time.perf_counter() - t))
    med = {n: statistics.median(r) for n, r in rates.items()}
    return {**{f"{n}_tokens_s": v for n, v in med.items()}, "ratio": med["map"] / med["mem"],
            "blocks": blocks, "steps": steps}


def bench_train(data_dir: Path, work: Path, iters: int, rounds: int) -> dict:
    """The same model on the prepared corpus and on Tiny Shakespeare in memory."""
    flags = ["--preset", "debug", "--max_iters", str(iters), "--eval_interval", "100000",
             "--eval_iters", "1", "--log_interval", "1", "--sample_tokens", "0", "--quiet",
             "--seed", "0"]
    runs: dict[str, list[dict]] = {"map": [], "mem": []}
    for i in range(rounds):
        for name, data in (("map", data_dir), ("mem", "shakespeare")):
            out = work / f"run-{name}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            r = run_measured(cli("train", "--data", str(data), "--out", str(out), *flags),
                             watch=out / "log.csv")
            with open(out / "log.csv") as f:
                rates = [float(row["tokens_per_s"]) for row in csv.DictReader(f)
                         if row["tokens_per_s"]]
            r["tokens_s"] = statistics.median(rates[1:] or rates)
            runs[name].append(r)
            shutil.rmtree(out, ignore_errors=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in
               ("first_step_s", "peak_mb", "tokens_s")} for n, rs in runs.items()}
    return {**med, "tokens_ratio": med["map"]["tokens_s"] / med["mem"]["tokens_s"]}


def train_part(work: Path, size: int, args) -> dict:
    """Tiny Shakespeare's lines shuffled and repeated to ``size`` MB (so that the model, its
    vocabulary included, is the one trained on Tiny Shakespeare), prepared, then trained on."""
    corpus, dd = work / f"shakespeare-{size}mb.txt", work / f"dd-shakespeare-{size}"
    build_corpus(corpus, size, corpora=("shakespeare.txt",))
    r = bench_prepare(corpus, dd, "char", None)  # characters: looked up in one process
    out = {f"prepare char {size} MB (Shakespeare alone: ASCII)":
           {**{k: r[k] for k in ("peak_mb", "wall_s", "encode_s", "encode_mb_s")},
            "table_lookup_alone": bench_char_encode(corpus, dd)}}
    print(json.dumps(out), flush=True)
    corpus.unlink()
    out[f"train on {size} MB"] = bench_train(dd, work, args.train_iters, args.train_rounds)
    out[f"train on {size} MB"]["steps_alternated"] = bench_step_rate(dd)
    print(json.dumps({f"train on {size} MB": out[f"train on {size} MB"]}), flush=True)
    shutil.rmtree(dd)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000", help="corpus sizes in MB (default 100,1000)")
    ap.add_argument("--only", default="char,bpe,train",
                    help="parts: char, bpe (prepare and the encode_batch comparison), train")
    ap.add_argument("--workers", type=int, default=None, help="prepare --workers (default its)")
    ap.add_argument("--bpe_mb", type=int, default=8,
                    help="MB of pieces for the BPE comparison (default 8)")
    ap.add_argument("--train_iters", type=int, default=150)
    ap.add_argument("--train_rounds", type=int, default=2)
    ap.add_argument("--work", default="/tmp/minitransformer-data-bench")
    args = ap.parse_args()
    sizes, parts = [int(s) for s in args.sizes.split(",")], set(args.only.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # train --data prepares into the cache: keep it in the work folder, removed at the end
    os.environ["MINITRANSFORMER_CACHE"] = str(work / "cache")
    results: dict = {"load_before": os.getloadavg()[0]}
    try:
        for size in sizes:
            corpus = work / f"corpus-{size}mb.txt"
            build_corpus(corpus, size)
            for kind in [k for k in ("char", "bpe") if k in parts]:
                dd = work / f"dd-{kind}-{size}"
                r = bench_prepare(corpus, dd, "char" if kind == "char" else "bpe-bytes",
                                  args.workers)
                line = {k: r[k] for k in ("peak_mb", "wall_s", "encode_s", "encode_mb_s",
                                          "route", "workers")}
                if kind == "char":
                    line["table_lookup_alone"] = bench_char_encode(corpus, dd)
                if kind == "bpe":
                    line["vs_encode_batch"] = bench_bpe_vs_batch(corpus, dd, args.bpe_mb,
                                                                 r["workers"])
                results[f"prepare {kind} {size} MB"] = line
                print(json.dumps({f"prepare {kind} {size} MB": line}), flush=True)
            corpus.unlink()
            if "train" in parts and size == max(sizes):
                results.update(train_part(work, size, args))
            for dd in work.glob(f"dd-*-{size}"):
                shutil.rmtree(dd)
    finally:
        results["load_after"] = os.getloadavg()[0]
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
