"""The ``minitransformer`` command line: train, sample, evaluate.

Flags for config fields are generated from the dataclasses, so every field of ``GPTConfig``
and ``TrainConfig`` is a flag under its own name (``--n_layer`` and ``--n-layer`` both work).
Exit codes: 0 success, 2 a user error (one line on stderr), 1 an internal error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import typing
from typing import Literal, get_args

from . import translate_cli
from .config import (
    PRESETS,
    GPTConfig,
    TrainConfig,
    config_from_dict,
    field_names,
    get_preset,
    parse_duration,
    split_fields,
)
from .errors import ConfigError, UserError
from .experiments import cli as experiments_cli
from .interop import cli as interop_cli
from .viz import cli as viz_cli

FIELD_HELP = {
    "vocab_size": "vocabulary size (set from the tokenizer when training)",
    "block_size": "context length T in tokens",
    "n_layer": "number of Transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "model width d_model (divisible by n_head)",
    "d_ff": "feed-forward width (default 4 * n_embd)",
    "dropout": "dropout probability (0 = none)",
    "bias": "biases in linear layers and LayerNorms",
    "pos_encoding": "how positions enter the model",
    "norm_position": "LayerNorm before (pre, GPT) or after (post, the paper) each sublayer",
    "activation": "feed-forward activation",
    "attn_impl": "attention path: reference (explicit softmax), fast (PyTorch's fused kernel), "
                 "or auto (whichever is faster for the device and dtype)",
    "init": "weight initialisation: GPT-2 normal(0.02) or the paper's Xavier uniform",
    "tie_weights": "share the token embedding with the output layer",
    "layer_norm_eps": "LayerNorm epsilon",
    "scale_embeddings": "multiply token embeddings by sqrt(n_embd) (the paper)",
    "batch_size": "sequences per optimizer step (global)",
    "max_iters": "optimizer steps to train for",
    "eval_interval": "evaluate, sample and checkpoint every N steps",
    "eval_iters": "batches averaged for the val loss",
    "log_interval": "log train loss every N steps",
    "learning_rate": "peak learning rate",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup_iters": "linear warmup steps",
    "weight_decay": "AdamW weight decay (matrices only)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the gradient norm to this (0 = off)",
    "grad_accum": "split each step into this many micro-batches",
    "seed": "random seed (weights, data order, dropout)",
    "lr_schedule": "cosine: warmup + cosine decay; noam: the paper's d^-0.5 min(s^-0.5, s w^-1.5)",
    "time_budget": "train for this long (e.g. 120s, 5m), evaluation excluded",
    "keep_last": "recent checkpoints kept in checkpoints/",
    "sample_tokens": "length of the sample printed at each evaluation (0 = none)",
    "device": "auto picks cuda, then mps, then cpu",
    "dtype": "auto: bf16 autocast on GPUs and CPUs with native bf16, fp16 on older GPUs, "
             "fp32 elsewhere (weights stay fp32)",
    "compile": "torch.compile the model (auto = on CUDA)",
}


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _field_type(hint):
    """argparse (type, choices) for a dataclass field's type hint."""
    if typing.get_origin(hint) is Literal:
        return str, list(get_args(hint))
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if base is bool:
        return parse_bool, None
    if base is int:
        return int, None
    if base is float:
        return float, None
    return str, None


def add_config_flags(parser: argparse.ArgumentParser, cls, title: str) -> None:
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, choices = _field_type(hints[f.name])
        if f.name == "time_budget":
            kind = _duration
        flags = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        default = f.default if f.default is not dataclasses.MISSING else None
        group.add_argument(*flags, dest=f.name, type=kind, choices=choices,
                           default=argparse.SUPPRESS, metavar=None if choices else "V",
                           help=f"{FIELD_HELP.get(f.name, f.name)} (default {default})")


class Parser(argparse.ArgumentParser):
    """argparse that suggests the closest flag for a misspelt one."""

    def error(self, message):
        if "unrecognized arguments" in message:
            known = [s for a in self._actions for s in a.option_strings]
            for a in self._actions:  # flags of the subcommands too
                for sub in (getattr(a, "choices", None) or {}).values():
                    if isinstance(sub, argparse.ArgumentParser):
                        known += [s for b in sub._actions for s in b.option_strings]
            words = message.split(":", 1)[1].split()
            hints = [difflib.get_close_matches(w.split("=")[0], known, n=1) for w in words]
            hints = [f"{w} -> {h[0]}" for w, h in zip(words, hints, strict=True) if h]
            if hints:
                message += f" (did you mean: {', '.join(hints)}?)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="minitransformer",
                    description="The Transformer of 'Attention Is All You Need', from scratch.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    add_core_parsers(sub)
    interop_cli.add_parsers(sub)  # embed
    viz_cli.add_parsers(sub)  # attention, explain
    experiments_cli.add_parsers(sub)  # compare; train's --early_stop
    translate_cli.add_parsers(sub)  # translate; seq2seq flags on train and evaluate
    return parser


def add_core_parsers(sub) -> None:
    """train, sample, evaluate. Other modules add their subcommands beside these, each
    parser naming its handler with ``set_defaults(func=...)``."""
    from . import commands, commands_encoder

    t = sub.add_parser("train", help="train a model on a corpus",
                       usage="minitransformer train --data CORPUS --out DIR [--preset NAME] "
                             "[--FIELD VALUE ...]",
                       description="Train a model. Any config field is a flag: --n_layer 4 ...")
    t.add_argument("--data", help="corpus: a bundled name (shakespeare, tang, sayings) or a "
                   "path (default shakespeare; on --resume, the run's own corpus)")
    t.add_argument("--out", required=True, help="run folder to write")
    t.add_argument("--model", default="gpt", choices=["gpt", "encoder", "seq2seq"],
                   help="model family (a .tsv corpus implies seq2seq)")
    t.add_argument("--preset", default=None,
                   help="named settings; default cpu-small. " + "; ".join(
                       f"{family}: {', '.join(names)}" for family, names in PRESETS.items()))
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--force", action="store_true", help="replace a run already in --out")
    t.add_argument("--encoding", default="utf-8", help="text encoding of the corpus")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_flags(t, GPTConfig, "model (GPTConfig)")
    add_config_flags(t, TrainConfig, "training (TrainConfig)")
    commands_encoder.add_train_flags(t)  # --tokenizer, encoder-only fields
    t.set_defaults(func=commands.cmd_train)

    s = sub.add_parser("sample", help="generate text from a trained model")
    s.add_argument("dir", nargs="?", help="run folder (or checkpoint folder)")
    s.add_argument("--hf", metavar="PATH", default=None,
                   help="a local Hugging Face GPT-2 folder instead of a run folder")
    s.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    s.add_argument("--max-new-tokens", "--max_new_tokens", type=_positive_int, default=500)
    s.add_argument("--temperature", type=float, default=0.8,
                   help="0 = greedy; higher = more random")
    s.add_argument("--top-k", "--top_k", type=_positive_int, default=None,
                   help="sample from the k most likely tokens only")
    s.add_argument("--top-p", "--top_p", type=float, default=None,
                   help="sample from the smallest set of tokens holding probability p")
    s.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    s.add_argument("--which", choices=["best", "last"], default="best",
                   help="best: the run folder's best model; last: the newest checkpoint")
    s.add_argument("--no-cache", action="store_true", help="recompute the context every token")
    s.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "mps"])
    s.set_defaults(func=commands.cmd_sample)

    e = sub.add_parser("evaluate", help="val loss, perplexity and bits per token")
    e.add_argument("dir", help="run folder (or checkpoint folder)")
    e.add_argument("--data", default=None, help="corpus (default: the one it was trained on)")
    e.add_argument("--encoding", default=None)
    e.add_argument("--which", choices=["best", "last"], default="best")
    e.add_argument("--eval-iters", "--eval_iters", type=_positive_int, default=200)
    e.add_argument("--batch-size", "--batch_size", type=_positive_int, default=None)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "mps"])
    e.set_defaults(func=commands.cmd_evaluate)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage + error (code 2) or help (code 0)
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"minitransformer: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("minitransformer: error: out of memory: the model or batch is too large for "
              "this machine; try smaller sizes", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - a bug: one line unless --debug
        if args.debug:
            raise
        print(f"minitransformer: internal error: {type(e).__name__}: {e}\n"
              f"(this is a bug; rerun with --debug for the traceback)", file=sys.stderr)
        return 1


def config_overrides(args) -> tuple[dict, dict]:
    """The model and training fields given on the command line."""
    given = {k: v for k, v in vars(args).items()
             if k in field_names(GPTConfig) or k in field_names(TrainConfig)}
    return tuple(split_fields(given, GPTConfig, TrainConfig))


__all__ = ["build_parser", "config_from_dict", "config_overrides", "get_preset", "main"]
