"""Which tokenizer suits Chinese? Characters, byte-level BPE and character-initial BPE on the
bundled Chinese corpora (``sayings``, ``tang``): tokens per character at equal vocabulary
sizes, then val bits per character after the same short training budget.

    python bench/tokenizers_zh.py                      # both tables (about 20 minutes)
    python bench/tokenizers_zh.py --iters 0            # tokens per character only (~2 min)

Tokens per character: each tokenizer fitted on the whole corpus (as ``train`` fits it), then
the corpus encoded, divided by its length in characters. ``bytes, lines`` is an ablation:
byte-level BPE whose pieces may cross punctuation (split at line ends only); it shows how much
shorter merges across punctuation would encode.

Bits per character: the last 10% of each corpus (cut at a line start) is held out; every
tokenizer is fitted on the rest only, and ``train --preset debug --max_iters N`` trains on
the rest (a budget of steps rather than seconds, so a busy shared machine does not change
the figures; the run keeps its best model by its own val split). Then the total negative
log-likelihood of the held-out text under that model, in bits, divided by its number of
characters: the same text for every tokenizer, every token scored once with at least half a
window of context. Every run has the same model, context in tokens, batch and steps; a BPE
step sees more text (a token holds more than one character) and costs a little more (a
larger output layer), so the seconds are reported beside it. Where the bits go: each token's
bits are put on the last character it covers, and the held-out characters grouped by how
often they occur in the training text (never, 1-4, 5-49, 50 or more times).

Why held out: fitted on the whole corpus, as ``train`` fits it, a tokenizer learns pieces
that occur only in the val split, which the model then meets untrained (9% of the val tokens
of character-initial BPE on sayings, 6% of byte-level's), and the val split, the last 10% of
the tokens, is not the same text for two tokenizers.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import math
import os
import statistics
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from minitransformer.cli import main as cli
from minitransformer.data import load_text
from minitransformer.families import load_run
from minitransformer.tokenizers import fit_tokenizer
from minitransformer.tokenizers.bpe import BPETokenizer
from minitransformer.tokenizers.fitting import CHARS_FROM_VOCAB

CORPORA = ("sayings", "tang")
VOCABS = (1000, 1500, 2000, 3000, 4000, 8000)
SPECIALS = ["<|endoftext|>"]
KINDS = ("char", "bpe-bytes", "bpe-chars")
HELD_OUT = 0.1  # the share of each corpus, at its end, that bits per character is measured on


def bytes_lines(text: str, vocab: int) -> BPETokenizer:
    """The ablation: byte-level BPE pre-tokenized at line ends only."""
    lines = text.splitlines(keepends=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n"), behavior="merged_with_previous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer, length=len(lines))
    return BPETokenizer(tok)


def fit(kind: str, text: str, vocab: int):
    if kind == "bytes, lines":
        return bytes_lines(text, vocab)
    return fit_tokenizer(kind, text, vocab, echo=None)


def tokens_per_char(vocabs=VOCABS) -> dict:
    """{corpus: {"char": (t/c, vocab), vocab: {kind: (t/c, actual vocab)}}}."""
    out = {}
    for corpus in CORPORA:
        text = load_text(corpus)
        char = fit_tokenizer("char", text)
        out[corpus] = {"char": (1.0, char.vocab_size)}
        for vocab in vocabs:
            row = {}
            for kind in ("bpe-bytes", "bpe-chars", "bytes, lines"):
                tok = fit(kind, text, vocab)
                ids = tok.encode(text)
                assert tok.decode(ids) == text, (corpus, kind, vocab)  # lossless
                row[kind] = (len(ids) / len(text), tok.vocab_size)
            out[corpus][vocab] = row
            print(corpus, vocab, {k: f"{v[0]:.3f}" for k, v in row.items()}, flush=True)
    return out


def held_out_split(text: str, fraction: float = HELD_OUT) -> tuple[str, str]:
    """(training text, held-out text): the last ``fraction`` of the characters, cut at a line
    start. Nothing of the held-out text reaches a tokenizer's training or the model's."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - fraction))) + 1
    return text[:cut], text[cut:]


@torch.no_grad()
def held_out_bits(run: Path, text: str, batch: int = 256) -> tuple[float, int, list[float]]:
    """(total negative log-likelihood of ``text`` in bits, its number of tokens, the bits of
    each of its characters) under the run's best model. Every token after the first is
    predicted: windows of ``block_size`` tokens advance by half a window, and each token is
    scored once, in the first window that gives it at least half a window of context (all of
    them in the first window). A token's bits go to the last character it covers."""
    loaded = load_run(run)
    model, tok = loaded.model, loaded.tokenizer
    t = loaded.meta["model"]["block_size"]
    ids, ends = token_ends(tok, "\n" + text)  # the line end before the held-out text, as context
    assert tok.decode(ids[:1]) == "\n" and tok.decode(ids[1:]) == text
    ids = torch.tensor(ids, dtype=torch.long)
    n, stride = len(ids), t // 2
    xs, ys, done = [], [], 0  # done: targets ids[1 .. done] are scored
    for begin in range(0, n - 1, stride):
        end = min(begin + t, n - 1)
        y = ids[begin + 1:end + 1].clone()
        y[:len(y) - (end - done)] = -1  # scored by an earlier window
        xs.append(ids[begin:end])
        ys.append(y)
        done = end
        if end == n - 1:
            break
    assert sum(int((y >= 0).sum()) for y in ys) == n - 1  # every target once
    per_token = torch.zeros(n)  # nats of each token (the first, context only, stays 0)
    starts = [i * stride for i in range(len(xs))]
    for same in ((slice(0, len(xs) - 1)), slice(len(xs) - 1, len(xs))):  # full, then the last
        group = range(len(xs))[same]
        for i in range(0, len(group), batch):
            rows = group[i:i + batch]
            x, y = torch.stack([xs[r] for r in rows]), torch.stack([ys[r] for r in rows])
            logits = model(x)[0]  # (B, T, V)
            nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1,
                                  reduction="none").view(y.shape)  # (B, T)
            for r, row_nll, row_y in zip(rows, nll, y, strict=True):
                scored = (row_y >= 0).nonzero().flatten()
                per_token[starts[r] + 1 + scored] = row_nll[scored]
    per_char = [0.0] * len(text)
    for k in range(1, n):
        per_char[ends[k] - 2] += float(per_token[k]) / math.log(2)  # -1: the "\n" in front
    return float(per_token.sum()) / math.log(2), n - 1, per_char


def token_ends(tok, text: str) -> tuple[list[int], list[int]]:
    """(ids of ``text``, the end of the last character each token covers)."""
    if getattr(tok, "kind", "") == "char":
        return tok.encode(text), list(range(1, len(text) + 1))
    enc = tok.hf.encode(text, add_special_tokens=False)
    return enc.ids, [end for _, end in enc.offsets]


FREQUENCY_CLASSES = ((0, 0, "never seen in training"), (1, 4, "seen 1-4 times"),
                     (5, 49, "seen 5-49 times"), (50, None, "seen 50 times or more"))


def by_frequency(per_char: list[float], held_out: str, train: str) -> dict:
    """{class: (characters, bits per character)}: the held-out characters grouped by how
    often they occur in the training text."""
    seen = Counter(train)
    out = {}
    for lo, hi, name in FREQUENCY_CLASSES:
        bits = [b for b, ch in zip(per_char, held_out, strict=True)
                if seen[ch] >= lo and (hi is None or seen[ch] <= hi)]
        out[name] = (len(bits), statistics.fmean(bits) if bits else 0.0)
    return out


def train_file(kind: str, train: str, held_out: str, folder: Path) -> Path:
    """The training text as a file for ``train --data``. Char-level cannot encode a character
    it has never seen, so for it the held-out characters missing from the training text are
    added as one last line: it lands in the run's own val split, so they are known to the
    alphabet but never trained (as a run's val-only characters are)."""
    path = folder / f"{kind}.txt"
    missing = sorted(set(held_out) - set(train))
    path.write_text(train + ("".join(missing) + "\n" if kind == "char" and missing else ""),
                    encoding="utf-8")
    return path


def bits_per_char(iters: int, vocab: int, preset: str = "debug", corpora=CORPORA,
                  kinds=KINDS, seeds=(1337,), evals: int = 10) -> dict:
    """{corpus: {kind: [{"bpc", "tokens_per_char", "bits_per_token", "seconds", "vocab",
    "seed"} per seed]}}, measured on the held-out tenth of each corpus."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MINITRANSFORMER_CACHE"] = tmp  # the runs' prepared tokens go with them
        for corpus in corpora:
            train, held_out = held_out_split(load_text(corpus))
            out[corpus] = {kind: [] for kind in kinds}
            for kind, seed in itertools.product(kinds, seeds):
                run = Path(tmp) / f"{corpus}-{kind}-{seed}"
                flags = [] if kind == "char" else ["--vocab_size", str(vocab)]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = cli(["train", "--data", str(train_file(kind, train, held_out,
                                                                  Path(tmp))),
                                "--tokenizer", kind, *flags, "--preset", preset,
                                "--seed", str(seed), "--time_budget", "none",
                                "--max_iters", str(iters), "--eval_iters", "50",
                                "--eval_interval", str(max(1, iters // evals)),
                                "--sample_tokens", "0", "--quiet", "--out", str(run)])
                if code:
                    raise SystemExit(f"training failed: {corpus} {kind}")
                bits, n_tokens, per_char = held_out_bits(run, held_out)
                meta = json.loads((run / "config.json").read_text())
                with open(run / "log.csv", newline="") as f:
                    seconds = max(float(r["elapsed_s"]) for r in csv.DictReader(f))
                r = {"bpc": bits / len(held_out), "tokens_per_char": n_tokens / len(held_out),
                     "bits_per_token": bits / n_tokens, "seconds": seconds, "seed": seed,
                     "vocab": meta["model"]["vocab_size"],
                     "by_frequency": by_frequency(per_char, held_out, train)}
                out[corpus][kind].append(r)
                print(corpus, kind, r, flush=True)
    return out


def report(tpc: dict, bpc: dict | None, iters: int, vocab: int, preset: str) -> str:
    lines = ["tokens per character (lower is shorter):", "",
             "| corpus | vocabulary | byte-level BPE | character-initial BPE | "
             "bytes, lines (ablation) |", "|---|---|---|---|---|"]
    for corpus, rows in tpc.items():
        c, size = rows["char"]
        lines.append(f"| {corpus} | char: {size:,} | | | (char-level: {c:.2f}) |")
        for v, row in rows.items():
            if v == "char":
                continue
            cells = [f"{t:.3f}" + (f" ({n:,})" if n < v else "") for t, n in row.values()]
            lines.append(f"| {corpus} | {v:,} | " + " | ".join(cells) + " |")
    lines.append(f"\nthe automatic choice (--tokenizer bpe) starts from characters from a "
                 f"vocabulary of {CHARS_FROM_VOCAB:,} on a mostly-CJK corpus")
    if bpc:
        lines += ["", f"bits per character of the held-out last {HELD_OUT:.0%} of each corpus "
                  f"after {iters:,} steps of {preset} training (BPE vocabulary {vocab:,}; "
                  f"mean over the seeds, then each seed):", "",
                  "| corpus | tokenizer | vocabulary | tokens/char (held out) | bits/token | "
                  "bits/char | per seed | seconds |", "|---|---|---|---|---|---|---|---|"]
        for corpus, rows in bpc.items():
            for kind, runs in rows.items():
                mean = {k: statistics.fmean(r[k] for r in runs)
                        for k in ("tokens_per_char", "bits_per_token", "bpc", "seconds")}
                seeds = ", ".join(f"{r['bpc']:.3f}" for r in runs)
                lines.append(f"| {corpus} | {kind} | {runs[0]['vocab']:,} | "
                             f"{mean['tokens_per_char']:.3f} | {mean['bits_per_token']:.3f} | "
                             f"{mean['bpc']:.3f} | {seeds} | {mean['seconds']:.0f} |")
        lines += ["", "where the bits go: bits per held-out character by how often the "
                  "character occurs in the training text (a token's bits on the last "
                  "character it covers; mean over the seeds):", "",
                  "| corpus | characters | count | " + " | ".join(
                      k for k in next(iter(bpc.values()))) + " |",
                  "|---|---|---:|" + "---:|" * len(next(iter(bpc.values())))]
        for corpus, rows in bpc.items():
            for _, _, name in FREQUENCY_CLASSES:
                count = next(iter(rows.values()))[0]["by_frequency"][name][0]
                cells = [f"{statistics.fmean(r['by_frequency'][name][1] for r in runs):.2f}"
                         for runs in rows.values()]
                lines.append(f"| {corpus} | {name} | {count:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=1000,
                   help="training steps per run (0: tokens per character only)")
    p.add_argument("--vocab", type=int, default=8000, help="BPE vocabulary of the runs")
    p.add_argument("--preset", default="debug", help="the model and batch of the runs")
    p.add_argument("--corpora", default=",".join(CORPORA), help="corpora of the runs")
    p.add_argument("--kinds", default=",".join(KINDS), help="tokenizers of the runs")
    p.add_argument("--seeds", default="1337", help="seeds of the runs, comma-separated")
    p.add_argument("--evals", type=int, default=10,
                   help="evaluations per run; each run keeps the model of its best one")
    p.add_argument("--runs_only", action="store_true", help="skip the tokens-per-char table")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    a = p.parse_args()
    tpc = {} if a.runs_only else tokens_per_char()
    bpc = bits_per_char(a.iters, a.vocab, a.preset, a.corpora.split(","),
                        a.kinds.split(","), [int(x) for x in a.seeds.split(",")], a.evals
                        ) if a.iters > 0 else None
    print(report(tpc, bpc, a.iters, a.vocab, a.preset))
    if a.json:
        figures = {"tokens_per_char": {c: {str(k): v for k, v in rows.items()}
                                       for c, rows in tpc.items()}, "bits_per_char": bpc}
        Path(a.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
