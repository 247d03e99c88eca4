"""Flags built from the config dataclasses, and the small argument types every command shares.

One flag style, made here: every flag is registered once, under its ``_`` spelling (a config
field's own name: ``--n_layer``), and ``Parser`` reads ``--n-layer`` as the same flag, for
every command. Help lists that one spelling and ends each line with the default. A config
field's help is the docstring written under the field in its dataclass, so help text lives
beside the field it describes and nowhere else. Booleans read true/false, on/off, yes/no,
1/0 everywhere; a boolean flag given alone (--shard) is true. An argparse error is one line
on stderr and a pointer to ``--help``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import re
import sys
import textwrap
import typing
from functools import cache
from typing import Literal, get_args

from ..config import SEED_LIMIT, parse_duration
from ..errors import ConfigError
from ..models.decoding import MAX_LENGTH_PENALTY

SET_BY_TOKENIZER = {"pad_id", "bos_id", "eos_id", "mask_id"}  # never flags
NO_DEFAULT = {"vocab_size"}  # the tokenizer decides; the help says how
DEVICES = ["auto", "cpu", "cuda", "mps"]
ALIASES = {"--lr": "--learning_rate"}  # names people bring from other tools
HINT_CUTOFF = 0.7  # how alike a flag must be to be offered for a misspelt one (--foo: not --hf)


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _whole_number(text: str, smallest: int, too_small: str, limit: int | None = None,
                  too_large: str = "") -> int:
    """int(text) within [smallest, limit), else an argparse error with the message given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < smallest or (limit is not None and value >= limit):
        raise argparse.ArgumentTypeError(f"{too_small if value < smallest else too_large}, "
                                         f"got {value}")
    return value


def cli_text(value: str) -> str:
    """Text given on the command line. Bytes the terminal's encoding cannot decode reach
    Python as lone surrogates (U+DC80..U+DCFF): said here, not later as unseen characters."""
    if any(0xDC80 <= ord(ch) <= 0xDCFF for ch in value):
        raise argparse.ArgumentTypeError(
            f"not valid text in this terminal's encoding ({sys.getfilesystemencoding()}): "
            f"check the locale (LANG, such as C.UTF-8) and the bytes of the text")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "must be positive")


def nonneg_int(text: str) -> int:
    return _whole_number(text, 0, "must not be negative")


def seed(text: str) -> int:
    """A random seed: a whole number from 0 to 2**63 - 1."""
    return _whole_number(text, 0, "must not be negative", SEED_LIMIT, "must be less than 2**63")


MAX_PORT = 65535  # TCP ports are 16-bit


def port_number(text: str) -> int:
    """A TCP port: a whole number from 0 to 65535 (bind() would fail with an OverflowError)."""
    return _whole_number(text, 0, "must not be negative", MAX_PORT + 1,
                         f"a port is 0 to {MAX_PORT}")


def data_flag(given: list[str] | None) -> str | list[str] | None:
    """--data as the request holds it: one source a string (as config.json records it)."""
    if not given:
        return None
    return given[0] if len(given) == 1 else list(given)


def api_key(text: str) -> str:
    """A key clients can send as 'Authorization: Bearer KEY': visible ASCII characters, no
    spaces (an HTTP header's value is ASCII, and the server strips the token's ends)."""
    if not text or not all("!" <= ch <= "~" for ch in text):
        raise argparse.ArgumentTypeError("expected visible ASCII characters without spaces "
                                         "(clients send 'Authorization: Bearer KEY')")
    return text


def length_penalty(text: str) -> float:
    """GNMT's length penalty alpha: a number from 0 to ``MAX_LENGTH_PENALTY``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= MAX_LENGTH_PENALTY:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_LENGTH_PENALTY:g}, "
                                         f"got {text}")
    return value


def duration(text: str) -> float | None:
    """'120s', '5m', '1h', or 'none' (no time budget: max_iters decides)."""
    if str(text).strip().lower() in ("none", "off"):
        return None
    try:
        return parse_duration(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def on_off(text: str) -> str:
    """auto / on / off, where on and off take every boolean spelling (--compile=False)."""
    value = str(text).strip().lower()
    if value == "auto":
        return value
    try:
        return "on" if parse_bool(value) else "off"
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, on or off, got {text!r}") from None


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
        choices = list(get_args(hint))
        return (on_off if {"on", "off"} <= set(choices) else str), choices
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if base is bool:
        return parse_bool, None
    if base in (int, float):
        return base, None
    return str, None


def default_text(value) -> str:
    """' (default 500)', or '' when there is nothing to show."""
    if value in (None, dataclasses.MISSING, argparse.SUPPRESS):
        return ""
    return f" (default {value})"


def add_config_flags(parser: argparse.ArgumentParser, groups: list[tuple[type, str]],
                     shown: dict | None = None) -> None:
    """One flag per field of the given config classes (a field shared by several classes is
    added once, under the first); values stay unset unless given (argparse.SUPPRESS).
    ``shown`` overrides the defaults the help shows (a preset's values)."""
    shown = shown or {}
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
            default = "" if f.name in NO_DEFAULT else default_text(shown.get(f.name, f.default))
            bare = {"nargs": "?", "const": True} if kind is parse_bool else {}  # alone: true
            group.add_argument(f"--{f.name}", dest=f.name, type=kind, choices=choices,
                               default=argparse.SUPPRESS, metavar=None if choices else "V",
                               help=docs.get(f.name, f.name) + default, **bare)


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
    """--which; None when not given (best, except for a checkpoint folder, where a given
    --which is refused)."""
    parser.add_argument("--which", choices=["best", "last"], default=None,
                        help="best: the run folder's best model; last: its newest checkpoint "
                             "(default best)")


def add_device(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    parser.add_argument("--device", default=default, choices=DEVICES,
                        help=f"where to run (default {default}); auto: cuda if there is one, "
                             f"else mps, else cpu")


def add_tokenizer_flag(parser: argparse.ArgumentParser, seq2seq: bool = True) -> None:
    """--tokenizer, as train, compare and prepare take it (prepare: no seq2seq)."""
    from ..tokenizers import TOKENIZERS

    pairs = "; seq2seq always uses a joint BPE" if seq2seq else ""
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                        help="char: one id per character; bpe-bytes: GPT-2's byte-level BPE; "
                             "bpe-chars: BPE from whole characters, the rarest spelt in "
                             "bytes (for Chinese); bpe: bpe-chars for a mostly-CJK corpus and "
                             "--vocab_size >= 1500, else bpe-bytes; BPE learns --vocab_size "
                             f"entries (default 1024){pairs} (default char)")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """Beam search flags, for translate and for evaluate of an encoder-decoder."""
    g = parser.add_argument_group("decoding (encoder-decoder runs)")
    g.add_argument("--beam", type=positive_int, default=None,
                   help="beam size; 1 = greedy (default 4)")
    g.add_argument("--length_penalty", type=length_penalty, default=None,
                   help=f"GNMT length penalty alpha for beam search, 0 = off, at most "
                        f"{MAX_LENGTH_PENALTY:g} (default 0.6, as in the paper)")
    g.add_argument("--max_len", type=positive_int, default=None,
                   help="longest translation in tokens (default 1.5 x each sentence's source + "
                        "10; translate: or its --min_len where that is more)")


class HelpFormatter(argparse.HelpFormatter):
    """Wider help, so that flag names and their help read on one line where they fit."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=34, width=100)


# the destinations that hold paths (files, folders, run folders): none may be empty
PATH_FLAGS = {"data", "data_tgt", "out", "init_from", "dir", "hf", "input", "tokenizer_from"}


class Parser(argparse.ArgumentParser):
    """argparse with one flag style, one-line errors, and the closest flag for a misspelt one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # a prefix is not a flag: --lr is an alias
        super().__init__(*args, **kwargs)
        # a negative number, durations too (-5s), is a value for its flag to refuse, not a flag
        self._negative_number_matcher = re.compile(r"^-\d*\.?\d+[smh]?$")

    def spell(self, arg: str) -> str:
        """--n-layer -> --n_layer (and aliases such as --lr) where this parser knows it."""
        if not arg.startswith("--") or arg == "--":
            return arg
        flag, eq, value = arg.partition("=")
        underscored = "--" + flag[2:].replace("-", "_")
        for candidate in (flag, underscored, ALIASES.get(underscored)):
            if candidate in self._option_string_actions:
                return candidate + eq + value
        return arg

    def parse_known_args(self, args=None, namespace=None):
        import sys

        args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args([self.spell(str(a)) for a in args], namespace)

    def parse_args(self, args=None, namespace=None):
        """Unrecognized flags are reported by the subcommand they were given to. Words after
        a command's flags go to its list of words (``translate DIR --beam 4 "text"``), which
        argparse leaves out once a flag came between them and the folder."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            sub = self._subcommands().get(getattr(parsed, "command", None), self)
            words = sub.words_dest()
            if words is not None and not any(a.startswith("-") for a in extra):
                setattr(parsed, words, [*(getattr(parsed, words, None) or []), *extra])
                return parsed
            if owners := self._other_commands_flags(extra, parsed.command):
                sub.exit(2, f"{sub.prog}: error: {owners} (see {sub.prog} --help)\n")
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
        if (sub := self._subcommands().get(getattr(parsed, "command", None))) is not None:
            sub.refuse_empty_paths(parsed)
        return parsed

    def refuse_empty_paths(self, parsed) -> None:
        """An empty path (an unset shell variable: ``--out "$RUN"``) is an error: as a path
        it would mean the current folder, or no --data at all (the default corpus)."""
        for action in self._actions:
            value = getattr(parsed, action.dest, None) if action.dest in PATH_FLAGS else None
            if value == "" or (isinstance(value, list) and "" in value):
                name = max(action.option_strings, key=len, default=action.dest.upper())
                self.error(f"{name} is empty (an unset shell variable?): name a file or folder")

    def _other_commands_flags(self, extra: list[str], command: str) -> str:
        """'--context_mode is a flag of sample, not of train' for flags given to a command
        that another command takes; '' when none is."""
        notes, unknown = [], []
        for word in (w for w in extra if w.startswith("--")):
            name = word.split("=")[0]
            underscored = "--" + name[2:].replace("-", "_")
            spellings = {name, underscored, ALIASES.get(underscored)}
            owners = [n for n, p in self._subcommands().items()
                      if n != command and spellings & set(p._option_string_actions)]
            if owners:
                them = " and ".join([", ".join(owners[:-1]), owners[-1]] if owners[:-1] else owners)
                notes.append(f"{name} is a flag of {them}, not of {command}")
            else:
                unknown.append(name)
        if notes and unknown:
            notes.append(f"unrecognized: {' '.join(unknown)}")
        return "; ".join(notes)

    def words_dest(self) -> str | None:
        """The destination of this parser's positional list of words (nargs="*"), if any."""
        dests = [a.dest for a in self._actions if not a.option_strings and a.nargs == "*"]
        return dests[0] if len(dests) == 1 else None

    def canonicalise(self) -> None:
        """Show each flag under one spelling, the field name's (``--max_new_tokens``), where a
        command registered both; ``spell`` still reads either, here and in subcommands."""
        for parser in (self, *self._subcommands().values()):
            for action in parser._actions:
                longs = [o for o in action.option_strings if o.startswith("--")]
                if len(longs) > 1:
                    keep = next((o for o in longs if "-" not in o[2:]), longs[0])
                    action.option_strings = [o for o in action.option_strings
                                             if not o.startswith("--") or o == keep]

    def _subcommands(self) -> dict:
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                return dict(a.choices)
        return {}

    def error(self, message):
        if "unrecognized arguments" in message:
            message += self._suggestions(message)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _suggestions(self, message: str) -> str:
        given = message.split(":", 1)[1].split()
        if "--debug" in given:  # the program's flag, given after the command
            given.remove("--debug")
            return " (--debug goes before the command: minitransformer --debug COMMAND ...)" \
                + self._hints(given)
        return self._hints(given)

    def _hints(self, given: list[str]) -> str:
        """' (did you mean: --n_layr -> --n_layer?)' for the words of an unrecognized-arguments
        message; '' when none is close."""
        known = [s for a in self._actions for s in a.option_strings]
        for sub in self._subcommands().values():  # flags of the subcommands too
            known += [s for b in sub._actions for s in b.option_strings]
        known += [alias for alias, flag in ALIASES.items() if flag in known]
        # NAME=VALUE after a flag of another tool's (--set n_embd=256): the field's own flag
        pairs = [w.partition("=") for w in given if "=" in w and not w.startswith("-")]
        settings = [f"--{name} {value}" for name, _, value in pairs if f"--{name}" in known]
        if settings:
            return f" (did you mean: {', '.join(settings)}?)"
        words = [w for w in given if w.startswith("--")]
        hints = [difflib.get_close_matches("--" + w.split("=")[0][2:].replace("-", "_"), known,
                                           n=1, cutoff=HINT_CUTOFF) for w in words]
        hints = [f"{w} -> {h[0]}" for w, h in zip(words, hints, strict=True) if h]
        return f" (did you mean: {', '.join(hints)}?)" if hints else ""
