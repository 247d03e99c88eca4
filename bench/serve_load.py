"""Load on ``minitransformer serve``: many concurrent clients of short completions.

    python bench/serve_load.py [--clients 16] [--seconds 30] [--max_tokens 16] [--preset debug]
                               [--modes alone,equal,ragged] [--prompt_lengths 1-48]

Writes a GPT of a preset's sizes with random weights (nothing is downloaded or trained) as a
run folder, starts ``minitransformer serve`` on it in a subprocess (127.0.0.1, a free port)
once per mode, and lets ``--clients`` threads send unseeded completions back to back for
``--seconds`` (seeded requests are never batched), each client its own prompt lengths drawn
from ``--prompt_lengths`` (characters). Modes: ``alone`` (``--max_batch 1``, one request at a
time), ``equal`` (``--max_batch 16``, only prompts of one length batched together, the
server's rule before ragged batches), ``ragged`` (``--max_batch 16``, any lengths together).
Prints requests/s, tokens/s, p50/p99 latency and the failed requests (the goal: none).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from minitransformer.config import GPTConfig
from minitransformer.data.text import corpus_path
from minitransformer.models import GPT
from minitransformer.presets import GPT as GPT_PRESETS
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files

SIZE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size")


def write_run(folder: Path, preset: str) -> None:
    tokenizer = CharTokenizer.fit(corpus_path("shakespeare").read_text(encoding="utf-8"))
    sizes = {k: GPT_PRESETS[preset][k] for k in SIZE_FIELDS}
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, **sizes)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "bench"}}
    torch.manual_seed(0)
    write_model_files(folder, GPT(cfg), meta, tokenizer)


# the server with ragged batching switched off (only equal prompt lengths batched together)
EQUAL_ONLY = ("import sys; import minitransformer.serve.completions as c; c.RAGGED = False; "
              "from minitransformer.cli import main; sys.exit(main(sys.argv[1:]))")
MODES = {"alone": (1, True), "equal": (16, False), "ragged": (16, True)}


def start_server(folder: Path, max_queue: int, mode: str) -> tuple[subprocess.Popen, str]:
    batch, ragged = MODES[mode]
    launcher = ["-m", "minitransformer"] if ragged else ["-c", EQUAL_ONLY]
    proc = subprocess.Popen([sys.executable, *launcher, "serve", str(folder),
                             "--port", "0", "--max_queue", str(max_queue), "--max_batch",
                             str(batch)],
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if found:
            return proc, found.group(0)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the server did not start")


TEXT = ("ROMEO: But, soft! what light through yonder window breaks? It is the east, and "
        "Juliet is the sun. Arise, fair sun, and kill the envious moon.")


def client(url: str, model: str, max_tokens: int, stop_at: float, out: list,
           failures: list, lengths: tuple[int, int], seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        body = {"model": model, "prompt": TEXT[: rng.randint(*lengths)], "max_tokens": max_tokens}
        req = urllib.request.Request(url + "v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                answer = json.loads(r.read())
            out.append((time.perf_counter() - t0, answer["usage"]["completion_tokens"]))
        except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
            failures.append(repr(e))


def load(url: str, args) -> tuple[float, list, list]:
    results, failures = [], []
    stop_at = time.monotonic() + args.seconds
    lengths = tuple(int(n) for n in args.prompt_lengths.split("-"))
    threads = [threading.Thread(target=client, args=(url, "bench", args.max_tokens, stop_at,
                                                     results, failures, lengths, i))
               for i in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results, failures


def report(args, mode: str, wall: float, results: list, failures: list) -> None:
    latencies = sorted(r[0] for r in results) or [0.0]
    tokens = sum(r[1] for r in results)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(f"{mode:>6} (max_batch {MODES[mode][0]:>2}): {args.clients} clients, {wall:.1f} s, "
          f"max_tokens {args.max_tokens}, prompts {args.prompt_lengths} chars, preset "
          f"{args.preset}: {len(results)} requests "
          f"({len(results) / wall:.1f}/s), {tokens / wall:.0f} tokens/s, latency p50 "
          f"{statistics.median(latencies) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
          f"{len(failures)} failed", flush=True)
    if failures:
        print("  first failure:", failures[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max_tokens", type=int, default=16)
    ap.add_argument("--preset", default="debug", choices=sorted(GPT_PRESETS))
    ap.add_argument("--modes", default="alone,equal,ragged", help=", ".join(MODES))
    ap.add_argument("--prompt_lengths", default="1-48", help="MIN-MAX prompt characters")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bench"
        write_run(folder, args.preset)
        for mode in args.modes.split(","):
            proc, url = start_server(folder, max(64, 2 * args.clients), mode)
            try:
                report(args, mode, *load(url, args))
            finally:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
