"""Flags built from the config dataclasses, and the small argument types every command shares.

A config field is a flag under its own name (``--n_layer`` and ``--n-layer`` both work); its
help is the docstring written under the field in its dataclass, so help text lives beside
the field it describes and nowhere else.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import textwrap
import typing
from functools import cache
from typing import Literal, get_args

from ..config import parse_duration
from ..errors import ConfigError

SET_BY_TOKENIZER = {"pad_id", "bos_id", "eos_id", "mask_id"}  # never flags
DEVICES = ["auto", "cpu", "cuda", "mps"]


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def names(flag: str) -> list[str]:
    """['--max_iters', '--max-iters']: both spellings of a flag."""
    return [f"--{flag}"] + ([f"--{flag.replace('_', '-')}"] if "_" in flag else [])


@cache
def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a dataclass (attribute docstrings, as PEP 257)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and \
                isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def field_type(hint):
    """argparse (type, choices) for a dataclass field's type hint."""
    if typing.get_origin(hint) is Literal:
        return str, list(get_args(hint))
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if base is bool:
        return parse_bool, None
    if base in (int, float):
        return base, None
    return str, None


def add_config_flags(parser: argparse.ArgumentParser, groups: list[tuple[type, str]]) -> None:
    """One flag per field of the given config classes (a field shared by several classes is
    added once, under the first); values stay unset unless given (argparse.SUPPRESS)."""
    seen = set(SET_BY_TOKENIZER)
    for cls, title in groups:
        fields = [f for f in dataclasses.fields(cls) if f.name not in seen]
        if not fields:
            continue
        group = parser.add_argument_group(title)
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in fields:
            seen.add(f.name)
            kind, choices = field_type(hints[f.name])
            if f.name == "time_budget":
                kind = duration
            default = "" if f.default in (None, dataclasses.MISSING) else \
                f" (default {f.default})"
            group.add_argument(*names(f.name), dest=f.name, type=kind, choices=choices,
                               default=argparse.SUPPRESS, metavar=None if choices else "V",
                               help=docs.get(f.name, f.name) + default)


def config_values(args: argparse.Namespace, classes) -> dict:
    """The config fields given on the command line (of any of ``classes``)."""
    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in known}


def add_run_dir(parser: argparse.ArgumentParser, which: bool = True) -> None:
    """The run folder argument and --which, as every command that loads a model has them."""
    parser.add_argument("dir", help="run folder (or checkpoint folder)")
    if which:
        add_which(parser)


def add_which(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--which", choices=["best", "last"], default="best",
                        help="best: the run folder's best model; last: its newest checkpoint "
                             "(default best)")


def add_device(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    parser.add_argument("--device", default=default, choices=DEVICES,
                        help=f"where to run: auto picks cuda, then mps, then cpu (default "
                             f"{default})")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """Beam search flags, for translate and for evaluate of an encoder-decoder."""
    g = parser.add_argument_group("decoding (encoder-decoder runs)")
    g.add_argument("--beam", type=int, default=None, help="beam size; 1 = greedy (default 4)")
    g.add_argument("--length-penalty", "--length_penalty", type=float, default=None,
                   help="GNMT length penalty alpha for beam search, 0 = off (default 0.6, "
                        "as in the paper)")
    g.add_argument("--max-len", "--max_len", type=int, default=None,
                   help="longest translation in tokens (default 1.5 x source + 10)")


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
