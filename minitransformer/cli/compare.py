"""``minitransformer compare``: train variants side by side (experiments/compare.py).

    minitransformer compare --data shakespeare --vary pos_encoding=sinusoidal,learned,rope,alibi \\
        --preset cpu-small --time_budget 45s --eval_lengths 64,128,256,512 --out runs/pos
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path
from typing import Literal, get_args

from ..config import TrainConfig, closest, config_from_dict, parse_duration
from ..errors import UserError
from ..experiments.autosize import autosize_for_train
from ..experiments.compare import check_out_dir, parse_vary, run_compare, write_results
from ..experiments.report import markdown_table
from ..experiments.runs import check_char_vocabulary, check_schedule_flags, split_for
from ..families import FAMILIES, get_family
from .flags import (
    ALIASES,
    add_config_flags,
    add_tokenizer_flag,
    config_values,
    parse_bool,
)
from .train import CONFIG_GROUPS, add_early_stop, preset_defaults


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare", help="train variants side by side: loss curves, table, extrapolation",
        usage="minitransformer compare --data CORPUS --vary FIELD=a,b,... --out DIR "
              "[--time_budget 60s | --max_iters N] [--preset NAME] [--eval_lengths 64,128,...] "
              "[--FIELD VALUE ...]",
        description="Train one model per combination of the --vary lists, each on the same "
                    "batches and from the same initial values for every parameter they share, "
                    "then write compare.png and results.md / results.csv in --out (one run "
                    "folder per variant beside them). Any config field is a flag. The defaults "
                    "shown are those of the default preset, cpu-small, of the GPT family "
                    "(fields of the other families: their own cpu-small), as in train; "
                    "--time_budget without --preset sizes the model to the budget instead. "
                    "A flag given wins over the preset.")
    c.add_argument("--data", default=None,
                   help="corpus: a bundled name or a path (default shakespeare; for seq2seq "
                        "bible_en_es)")
    c.add_argument("--out", required=True, help="folder for the runs and the results")
    c.add_argument("--vary", action="append", required=True, metavar="FIELD=a,b,...",
                   help="a setting and its values; repeat for a grid (their product)")
    c.add_argument("--model", default="gpt", choices=list(FAMILIES),
                   help="model family (default gpt)")
    c.add_argument("--preset", default=None,
                   help="named settings for every variant (default cpu-small; with "
                        "--time_budget and no preset the model is sized to the budget)")
    c.add_argument("--eval_lengths", default=None, metavar="N,N,...",
                   help="also evaluate each best model on windows of these lengths "
                        "(beyond the training context: length extrapolation)")
    add_tokenizer_flag(c)
    c.add_argument("--encoding", default="utf-8",
                   help="text encoding of the corpus (default utf-8)")
    c.add_argument("--force", action="store_true", help="replace runs already in --out")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    add_early_stop(c)
    add_config_flags(c, CONFIG_GROUPS, preset_defaults())
    c.set_defaults(func=cmd_compare)


# compare's flags that every variant shares: what --vary says of them
SHARED = {"tokenizer": "its tokenizer", "encoding": "its encoding", "data": "its corpus"}
SHARED_TIP = {"tokenizer": " (bits per character compares runs whose tokenizers differ)"}


def _converter(hints: dict):
    """(field, text) -> a value of the field's type, for --vary."""

    def convert(name: str, text: str):
        if name in SHARED:
            raise UserError(f"--vary {name}: every variant reads one corpus, prepared once, so "
                            f"{SHARED[name]} is the same for all (--{name}); run compare once "
                            f"for each{SHARED_TIP.get(name, '')}")
        if name not in hints:
            raise UserError(f"--vary {name}: no such setting{closest(name, hints)}")
        hint = hints[name]
        if typing.get_origin(hint) is Literal:
            if text not in get_args(hint):
                raise UserError(f"--vary {name}: {text!r} is not one of "
                                f"{', '.join(get_args(hint))}")
            return text
        if name == "time_budget":
            return parse_duration(text)
        kinds = [a for a in get_args(hint) if a is not type(None)] or [hint]
        if text.lower() == "none" and type(None) in get_args(hint):
            return None
        try:
            return parse_bool(text) if kinds[0] is bool else kinds[0](text)
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
        raise UserError(f"--eval_lengths {text!r}: write whole numbers, e.g. 64,128,256") \
            from None
    if not lengths or lengths[0] <= 0:
        raise UserError(f"--eval_lengths {text!r}: lengths must be positive")
    return lengths


def _base_settings(family, args, given: dict, variants):
    """(settings shared by every variant, the corpus read once). With the sizes known (no
    autosize), every variant's settings are checked first, before the corpus is read."""
    source = args.data or family.default_data
    if family.can_autosize and args.preset is None and "time_budget" in given:
        prepared = family.prepare(source, args.encoding, given, args.tokenizer)
        model_over, train_over = split_for(family, given)
        base = autosize_for_train(prepared.n_train_tokens, len(prepared.val_ids),
                                  prepared.tokenizer.vocab_size, model_over, train_over)
        return base, prepared
    base = family.preset(args.preset)
    if "max_iters" in given and "time_budget" not in given:
        base.pop("time_budget", None)  # --max_iters N: a run of N steps, not of a time
    for variant in variants:
        model_fields, train_fields = split_for(family, {**base, **given, **variant.fields})
        family.check_fields(model_fields)
        check_schedule_flags(config_from_dict(TrainConfig, train_fields),
                             {**given, **variant.fields})
    prepared = family.prepare(source, args.encoding, split_for(family, {**base, **given})[0],
                              args.tokenizer)
    return base, prepared


def _canonical(spec: str) -> str:
    """--vary lr=... as --vary learning_rate=...: the flag aliases name settings here too."""
    name, sep, values = spec.partition("=")
    flag = "--" + name.strip().lstrip("-").replace("-", "_")
    return ALIASES[flag][2:] + sep + values if flag in ALIASES else spec


def cmd_compare(args) -> int:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("compare trains its variants one after another in one process; run it "
                        "without torchrun")
    family = get_family(args.model)
    classes = [cls for cls, _ in CONFIG_GROUPS]
    given = config_values(args, classes)
    split_for(family, given)  # another family's setting is an error
    hints = {k: v for cls in classes for k, v in typing.get_type_hints(cls).items()}
    own = set(family.field_names()) | set(TrainConfig.__dataclass_fields__)
    variants = parse_vary([_canonical(spec) for spec in args.vary],
                          _converter({k: hints[k] for k in own}))
    clash = set(variants[0].fields) & set(given)
    if clash:
        raise UserError(f"{', '.join(sorted(clash))} is both varied and set; drop one")
    lengths = parse_lengths(args.eval_lengths)
    if lengths and not family.measures_lengths:
        raise UserError(f"--eval_lengths scores next-token loss on longer windows, which "
                        f"{family.a_title} has no measure of; drop the flag")
    check_char_vocabulary(family, args.data, args.tokenizer, "vocab_size" in given or
                          any("vocab_size" in v.fields for v in variants))
    check_out_dir(Path(args.out), variants, args.force)  # before the corpus is read
    base, prepared = _base_settings(family, args, given, variants)
    base.update(given)
    print(f"corpus {prepared.source}: {prepared.summary}; {len(variants)} variants into "
          f"{args.out}")
    results = run_compare(family, prepared, base, variants, Path(args.out), lengths,
                          args.early_stop, args.force,
                          progress=not args.quiet and sys.stderr.isatty() or None)
    varied = set(variants[0].fields)
    settings = {"data": prepared.source, "model": family.name, "vary": args.vary,
                "eval_lengths": lengths, "preset": args.preset, "base": base,
                "block_size": None if "block_size" in varied else base.get("block_size"),
                "time_budget": None if "time_budget" in varied else base.get("time_budget")}
    paths = write_results(results, Path(args.out), settings)
    print(markdown_table(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
