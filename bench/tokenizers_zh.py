"""Which tokenizer suits Chinese? Characters, byte-level BPE and character-initial BPE on the
bundled Chinese corpora (``sayings``, ``tang``): tokens per character at equal vocabulary
sizes, then val bits per character after the same short training budget.

    python bench/tokenizers_zh.py                      # both tables (about 15 minutes)
    python bench/tokenizers_zh.py --iters 0            # tokens per character only (~2 min)

Tokens per character: each tokenizer fitted on the whole corpus (as ``train`` fits it), then
the corpus encoded, divided by its length in characters. ``bytes, lines`` is an ablation:
byte-level BPE whose pieces, like the character-initial ones, may cross punctuation (split
at line ends only); it separates what the pre-tokenizer gives from what starting at
characters gives.

Bits per character: ``train --preset debug --max_iters N`` with each tokenizer (a budget
of steps rather than seconds, so a busy shared machine does not change the figures), then the
best of four val losses along the way (nats per token, nanoGPT's measure) times the val
split's tokens per character, over ln 2. Every run has the same model, context in tokens,
batch and steps; a BPE step sees more text (a token holds more than one character) and costs
a little more (a larger output layer), so the seconds are reported beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from minitransformer.cli import main as cli
from minitransformer.data import load_text, split_ids
from minitransformer.tokenizers import fit_tokenizer, load_tokenizer
from minitransformer.tokenizers.bpe import BPETokenizer
from minitransformer.tokenizers.fitting import CHARS_FROM_VOCAB

CORPORA = ("sayings", "tang")
VOCABS = (1000, 1500, 2000, 3000, 4000, 8000)
SPECIALS = ["<|endoftext|>"]
KINDS = ("char", "bpe-bytes", "bpe-chars")


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


def val_tokens_per_char(run: Path, corpus: str) -> float:
    """Tokens per character of the run's val split (the last 10% of its tokens)."""
    tok = load_tokenizer(run / "tokenizer.json")
    ids = torch.tensor(tok.encode(load_text(corpus)), dtype=torch.long)
    val = split_ids(ids)[1]
    return len(val) / len(tok.decode(val.tolist()))


def bits_per_char(iters: int, vocab: int, preset: str = "debug", corpora=CORPORA,
                  kinds=KINDS) -> dict:
    """{corpus: {kind: {"val_loss", "tokens_per_char", "bpc", "seconds", "vocab"}}}."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for corpus in corpora:
            out[corpus] = {}
            for kind in kinds:
                run = Path(tmp) / f"{corpus}-{kind}"
                flags = [] if kind == "char" else ["--vocab_size", str(vocab)]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = cli(["train", "--data", corpus, "--tokenizer", kind, *flags,
                                "--preset", preset, "--time_budget", "none",
                                "--max_iters", str(iters), "--eval_iters", "50",
                                "--eval_interval", str(max(1, iters // 4)),
                                "--sample_tokens", "0", "--quiet", "--out", str(run)])
                if code:
                    raise SystemExit(f"training failed: {corpus} {kind}")
                meta = json.loads((run / "config.json").read_text())
                tpc = val_tokens_per_char(run, corpus)
                loss = meta["val_loss"]
                with open(run / "log.csv", newline="") as f:
                    seconds = max(float(r["elapsed_s"]) for r in csv.DictReader(f))
                out[corpus][kind] = {"val_loss": loss, "tokens_per_char": tpc,
                                     "bpc": loss * tpc / math.log(2), "seconds": seconds,
                                     "vocab": meta["model"]["vocab_size"]}
                print(corpus, kind, out[corpus][kind], flush=True)
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
        lines += ["", f"val bits per character after {iters:,} steps of {preset} training "
                  f"(BPE vocabulary {vocab:,}):", "",
                  "| corpus | tokenizer | vocabulary | val loss (nats/token) | tokens/char "
                  "(val) | bits/char | seconds |", "|---|---|---|---|---|---|---|"]
        for corpus, rows in bpc.items():
            for kind, r in rows.items():
                lines.append(f"| {corpus} | {kind} | {r['vocab']:,} | {r['val_loss']:.4f} | "
                             f"{r['tokens_per_char']:.3f} | {r['bpc']:.3f} | "
                             f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=1000,
                   help="training steps per run (0: tokens per character only)")
    p.add_argument("--vocab", type=int, default=8000, help="BPE vocabulary of the runs")
    p.add_argument("--preset", default="debug", help="the model and batch of the runs")
    p.add_argument("--corpora", default=",".join(CORPORA), help="corpora of the runs")
    p.add_argument("--kinds", default=",".join(KINDS), help="tokenizers of the runs")
    p.add_argument("--runs_only", action="store_true", help="skip the tokens-per-char table")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    a = p.parse_args()
    tpc = {} if a.runs_only else tokens_per_char()
    bpc = bits_per_char(a.iters, a.vocab, a.preset, a.corpora.split(","),
                        a.kinds.split(",")) if a.iters > 0 else None
    print(report(tpc, bpc, a.iters, a.vocab, a.preset))
    if a.json:
        figures = {"tokens_per_char": {c: {str(k): v for k, v in rows.items()}
                                       for c, rows in tpc.items()}, "bits_per_char": bpc}
        Path(a.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
