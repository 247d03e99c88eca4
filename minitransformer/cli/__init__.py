"""The ``minitransformer`` command line: one table of commands, one module per group.

Exit codes: 0 success, 2 a user error (one line on stderr), 1 an internal error (one line,
the traceback with --debug), 130 interrupted. Nothing in the package imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import warnings

import torch

from ..errors import UserError
from ..nn.kernels import kernel_setting_problem
from . import compare, evaluate, generate, hf, inspect, prepare, presets, serve, toy, train
from .flags import Parser

# what torch.distributed's backends say when another process of the run is gone
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
             "NCCL communicator was aborted", "Socket Timeout")

# command -> the function that adds its parser (each parser names its handler as ``func``)
COMMANDS = {
    "train": train.add_parser,
    "sample": generate.add_sample,
    "translate": generate.add_translate,
    "fill": generate.add_fill,
    "evaluate": evaluate.add_parser,
    "attention": inspect.add_attention,
    "explain": inspect.add_explain,
    "compare": compare.add_parser,
    "embed": hf.add_embed,
    "export": hf.add_export,
    "prepare": prepare.add_parser,
    "presets": presets.add_parser,
    "toy": toy.add_parser,
    "serve": serve.add_parser,
}


def build_parser() -> Parser:
    parser = Parser(prog="minitransformer",
                    description="The Transformer of 'Attention Is All You Need', from scratch.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for add in COMMANDS.values():
        add(sub)
    parser.canonicalise()
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The package's own warnings as one line (not Python's file:line and source line)."""
    if category.__module__.startswith("minitransformer"):
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        _PYTHON_SHOW_WARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOW_WARNING = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return _run(argv)
    finally:
        warnings.showwarning = shown  # as it was: a program calling main keeps its own


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage + error (code 2) or help (code 0)
        return e.code if isinstance(e.code, int) else 2
    prog = f"minitransformer {args.command}"  # as argparse names its own errors
    rank = int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    try:
        if (problem := kernel_setting_problem()) is not None:
            raise UserError(f"{problem} (unset it to let each model measure)")
        with open(os.devnull, "w") as null, \
                contextlib.redirect_stdout(null) if rank else contextlib.nullcontext():
            return args.func(args) or 0  # under torchrun, rank 0 speaks for the run
    except UserError as e:
        if not rank:  # every rank reads the same flags and files, and fails alike
            print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            return internal_error(e, args)
        print(f"{prog}: error: out of memory{asked(e)}: the model, batch or sequence length "
              f"is too large for this machine; try smaller sizes", file=sys.stderr)  # any rank
        return 2
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return internal_error(e, args)
        where = f" writing {e.filename}" if e.filename else ""
        print(f"{prog}: error: no space left on the disk{where} ({e.strerror}); free some "
              f"space or write elsewhere", file=sys.stderr)  # files are written atomically
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: one line unless --debug
        return internal_error(e, args)


def out_of_memory(e: BaseException) -> bool:
    """Python's MemoryError, a GPU's, or PyTorch's CPU allocator refusing a tensor."""
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or \
        "can't allocate memory" in str(e)


def asked(e: BaseException) -> str:
    """' (a tensor of 80.0 GB)' from the allocator's message, or ''."""
    m = re.search(r"tried to allocate (\d+) bytes", str(e))
    return f" (a tensor of {int(m.group(1)) / 1e9:.1f} GB)" if m else ""


def internal_error(e: BaseException, args) -> int:
    """A bug: one line unless --debug (then the traceback)."""
    prog = f"minitransformer {args.command}"
    if args.debug:
        raise e
    if "WORLD_SIZE" in os.environ and isinstance(e, RuntimeError) and \
            any(s in str(e) for s in PEER_LOST):
        print(f"{prog}: error: another process of this distributed run stopped or lost its "
              f"connection ({str(e).splitlines()[0][:160]}); the run folder keeps its last "
              f"checkpoint: train --out RUN --resume continues it", file=sys.stderr)
        return 1
    print(f"minitransformer: internal error: {type(e).__name__}: {e}\n"
          f"(this is a bug; rerun as minitransformer --debug {args.command} ... for the "
          f"traceback)", file=sys.stderr)
    return 1


__all__ = ["COMMANDS", "build_parser", "main"]
