"""The ``compare`` subcommand, and train's ``--early_stop``.

    minitransformer compare --data shakespeare --vary pos_encoding=sinusoidal,learned,rope,alibi \\
        --preset cpu-small --time-budget 45s --eval-lengths 64,128,256,512 --out runs/pos
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Literal, get_args

from ..config import (
    GPTConfig,
    TrainConfig,
    closest,
    field_names,
    get_preset,
    parse_duration,
    split_fields,
)
from ..errors import ConfigError, UserError

DEFAULT_PRESET = "cpu-small"


def add_parsers(sub) -> None:
    """Add ``compare``; give ``train`` its ``--early_stop`` flag."""
    from ..cli import add_config_flags

    train = sub.choices.get("train")
    if train is not None:
        _add_early_stop(train)

    c = sub.add_parser(
        "compare", help="train variants side by side: loss curves, table, extrapolation",
        usage="minitransformer compare --data CORPUS --vary FIELD=a,b,... --out DIR "
              "[--time-budget 60s | --max-iters N] [--preset NAME] [--eval-lengths 64,128,...] "
              "[--FIELD VALUE ...]",
        description="Train one model per combination of the --vary lists, each on the same "
                    "batches and from the same initial values for every parameter they share, "
                    "then write compare.png and results.md / results.csv in --out (one run "
                    "folder per variant beside them). Any config field is a flag.")
    c.add_argument("--data", default=None,
                   help="corpus: a bundled name or a path (default shakespeare; for seq2seq "
                        "bible_en_es)")
    c.add_argument("--out", required=True, help="folder for the runs and the results")
    c.add_argument("--vary", action="append", required=True, metavar="FIELD=a,b,...",
                   help="a setting and its values; repeat for a grid (their product)")
    c.add_argument("--model", default="gpt", choices=["gpt", "seq2seq"], help="model family")
    c.add_argument("--preset", default=None,
                   help=f"named settings for every variant (default {DEFAULT_PRESET}; with "
                        f"--time-budget and no preset the model is sized to the budget)")
    c.add_argument("--eval-lengths", "--eval_lengths", default=None, metavar="N,N,...",
                   help="also evaluate each best model on windows of these lengths "
                        "(beyond the training context: length extrapolation)")
    c.add_argument("--tokenizer", choices=["char", "bpe"], default="char",
                   help="char (default) or byte-level BPE with --vocab_size entries")
    c.add_argument("--encoding", default="utf-8", help="text encoding of the corpus")
    c.add_argument("--force", action="store_true", help="replace runs already in --out")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_early_stop(c)
    add_config_flags(c, GPTConfig, "model (GPTConfig)")
    add_config_flags(c, TrainConfig, "training (TrainConfig)")
    _add_seq2seq_fields(c)
    c.set_defaults(func=cmd_compare)


def _add_seq2seq_fields(parser: argparse.ArgumentParser) -> None:
    """The encoder-decoder's own fields (--label_smoothing, --batch_tokens, ...)."""
    from ..config import Seq2SeqConfig
    from ..data import ParallelDataConfig
    from ..translate_cli import _add_fields

    _add_fields(parser, Seq2SeqConfig, "encoder-decoder only (Seq2SeqConfig, --model seq2seq)")
    _add_fields(parser, ParallelDataConfig, "sentence pairs (--model seq2seq)")


def _add_early_stop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--early_stop", "--early-stop", action="store_true",
                        help="stop when val loss has risen while train loss fell for 3 "
                             "evaluations in a row (the best model is kept either way)")


def _convert(hints: dict):
    """(field, text) -> a value of the field's type, for --vary."""
    from ..cli import parse_bool

    def convert(name: str, text: str):
        if name not in hints:
            raise UserError(f"--vary {name}: no such setting{closest(name, hints)}")
        hint = hints[name]
        if typing.get_origin(hint) is Literal:
            allowed = get_args(hint)
            if text not in allowed:
                raise UserError(f"--vary {name}: {text!r} is not one of {', '.join(allowed)}")
            return text
        if name == "time_budget":
            return parse_duration(text)
        kinds = [a for a in get_args(hint) if a is not type(None)] or [hint]
        if text.lower() == "none" and type(None) in get_args(hint):
            return None
        try:
            if kinds[0] is bool:
                return parse_bool(text)
            return kinds[0](text)
        except (ValueError, argparse.ArgumentTypeError):
            raise UserError(f"--vary {name}: cannot read {text!r} as "
                            f"{kinds[0].__name__}") from None

    return convert


def parse_lengths(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        lengths = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UserError(f"--eval-lengths {text!r}: write whole numbers, e.g. 64,128,256") \
            from None
    if not lengths or lengths[0] <= 0:
        raise UserError(f"--eval-lengths {text!r}: lengths must be positive")
    return lengths


def cmd_compare(args) -> int:
    from ..config import Seq2SeqConfig
    from ..data import ParallelDataConfig
    from .compare import parse_vary, run_compare, split_train_fields, write_results
    from .families import get_family

    family = get_family(args.model, args.tokenizer)
    classes = (GPTConfig, Seq2SeqConfig, ParallelDataConfig, TrainConfig)
    hints = {k: v for cls in classes for k, v in typing.get_type_hints(cls).items()}
    known = set(family.field_names()) | set(field_names(TrainConfig))
    given = {k: v for k, v in vars(args).items() if k in hints}
    foreign = sorted(set(given) - known)
    if foreign:
        raise UserError(f"--{foreign[0]} is not a {family.name} setting (--model "
                        f"{'gpt' if family.name != 'gpt' else 'seq2seq'} has it)")
    variants = parse_vary(args.vary, _convert(hints))
    clash = set(variants[0].fields) & set(given)
    if clash:
        raise UserError(f"{', '.join(sorted(clash))} is both varied and set; drop one")
    lengths = parse_lengths(args.eval_lengths)
    echo = print  # --quiet only hides the progress bars, as for train

    source = args.data or family.default_data
    if args.preset is None and "time_budget" in given and family.name == "gpt":
        from .autosize import autosize_for_train

        prepared = family.prepare(source, args.encoding, given)
        model_over, train_over = split_fields(given, GPTConfig, TrainConfig)
        base = autosize_for_train(prepared.n_train_tokens, len(prepared.val_ids),
                                  prepared.tokenizer.vocab_size, model_over, train_over, echo)
    else:
        try:
            base = get_preset(family.name, args.preset or DEFAULT_PRESET)
        except ConfigError as e:
            raise UserError(str(e)) from None
        if "max_iters" in given and "time_budget" not in given:
            base.pop("time_budget", None)  # --max-iters N: a run of N steps, not of a time
        prepared = family.prepare(source, args.encoding,
                                  split_train_fields({**base, **given}, family)[0])
    base.update(given)
    echo(f"corpus {source}: {prepared.summary}; {len(variants)} variants into {args.out}")
    results = run_compare(family, prepared, base, variants, Path(args.out), lengths,
                          args.early_stop, args.force,
                          progress=not args.quiet and sys.stderr.isatty() or None, echo=echo)
    varied = set(variants[0].fields)
    settings = {"data": source, "model": family.name, "vary": args.vary,
                "eval_lengths": lengths, "preset": args.preset, "base": base,
                "block_size": None if "block_size" in varied else base.get("block_size"),
                "time_budget": None if "time_budget" in varied else base.get("time_budget")}
    paths = write_results(results, Path(args.out), settings)
    from .report import markdown_table

    print(markdown_table(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
