"""The encoder-decoder's command line: ``translate``, and its flags on ``train`` / ``evaluate``.

``add_parsers(sub)`` is called by ``cli.build_parser`` after the core subcommands exist: it
adds the seq2seq-only config fields (and --data-tgt) to ``train``, the decoding flags to
``evaluate``, and the ``translate`` subcommand. Handlers live in ``commands_seq2seq``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from . import commands_seq2seq
from .config import Seq2SeqConfig
from .data import ParallelDataConfig

HELP = {
    "n_encoder_layer": "encoder layers (default n_layer)",
    "n_decoder_layer": "decoder layers (default n_layer)",
    "label_smoothing": "label smoothing epsilon of the training loss (the paper: 0.1)",
    "src": "source: TSV column name or 0-based index (default en, or column 0)",
    "tgt": "target: TSV column name or 0-based index (default es, or column 1)",
    "batch_tokens": "about this many source (and target) tokens per batch, padding included",
    "train_max_len": "drop training pairs with a side longer than this many tokens",
}
SKIP = {"pad_id", "bos_id", "eos_id"}  # set from the tokenizer


def _add_fields(parser: argparse.ArgumentParser, cls, title: str) -> None:
    """Flags for the fields of ``cls`` that the parser does not have yet."""
    from .cli import FIELD_HELP, _field_type

    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flags = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        if f.name in SKIP or any(s in parser._option_string_actions for s in flags):
            continue
        kind, choices = _field_type(hints[f.name])
        group.add_argument(*flags, dest=f.name, type=kind, choices=choices,
                           default=argparse.SUPPRESS, metavar=None if choices else "V",
                           help=HELP.get(f.name, FIELD_HELP.get(f.name, f.name))
                           + ("" if f.default is None else f" (default {f.default})"))


def _decoding_flags(parser: argparse.ArgumentParser, beam_default: int) -> None:
    g = parser.add_argument_group("decoding (encoder-decoder runs)")
    g.add_argument("--beam", type=int, default=beam_default,
                   help=f"beam size; 1 = greedy (default {beam_default})")
    g.add_argument("--length-penalty", "--length_penalty", type=float, default=0.6,
                   help="GNMT length penalty alpha for beam search, 0 = off (default 0.6, "
                        "as in the paper)")
    g.add_argument("--max-len", "--max_len", type=int, default=None,
                   help="longest translation in tokens (default 1.5 x source + 10)")


def add_parsers(sub) -> None:
    """Seq2seq flags on ``train`` and ``evaluate``; the ``translate`` subcommand."""
    from .cli import _positive_int

    train = sub.choices["train"]
    train.add_argument("--data-tgt", "--data_tgt", default=None, metavar="FILE",
                       help="seq2seq from two aligned files: --data has the source sentences, "
                            "--data-tgt the target sentences, one per line")
    _add_fields(train, Seq2SeqConfig, "encoder-decoder only (Seq2SeqConfig, --model seq2seq)")
    _add_fields(train, ParallelDataConfig, "parallel data (--model seq2seq)")

    ev = sub.choices["evaluate"]
    _decoding_flags(ev, beam_default=4)
    ev.add_argument("--split", choices=["test", "valid", "train"], default="test",
                    help="seq2seq: the split to score with BLEU (default test)")
    ev.add_argument("--limit", type=_positive_int, default=None,
                    help="seq2seq: score only the first N pairs of the split")
    ev.add_argument("--examples", type=int, default=3,
                    help="seq2seq: print this many example translations (default 3)")

    t = sub.add_parser("translate", help="translate sentences with an encoder-decoder run",
                       description="Translate with a trained encoder-decoder: sentences on "
                                   "the command line, or one per line from --input.")
    t.add_argument("dir", help="run folder (or checkpoint folder)")
    t.add_argument("text", nargs="*", help="sentence(s) to translate")
    t.add_argument("--input", default=None, metavar="FILE",
                   help="translate each line of FILE ('-' = standard input)")
    _decoding_flags(t, beam_default=4)
    t.add_argument("--batch-size", "--batch_size", type=_positive_int, default=None,
                   help="sentences decoded together (default 32)")
    t.add_argument("--encoding", default="utf-8", help="text encoding of --input")
    t.add_argument("--which", choices=["best", "last"], default="best",
                   help="best: the run folder's best model; last: the newest checkpoint")
    t.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "mps"])
    t.set_defaults(func=commands_seq2seq.cmd_translate)
