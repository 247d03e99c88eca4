"""``sample`` (continue a prompt) and ``translate`` (an encoder-decoder's sentences).

    minitransformer sample runs/shakespeare --prompt "ROMEO:" --temperature 0.8 --top-k 50
    minitransformer sample --hf path/to/gpt2 --prompt "Hello, I'm a language model,"
    minitransformer translate runs/en-es "In the beginning God created the heavens and the earth."
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from ..errors import UserError
from ..families import load_run
from ..interop import describe, load_hf, load_hf_tokenizer
from ..models import GPT
from ..tokenizers.streaming import stream_text
from ..training.device import decoding_threads, pick_device
from .flags import add_decoding_flags, add_device, add_which, positive_int


def add_sample(sub) -> None:
    s = sub.add_parser("sample", help="generate text from a trained model")
    s.add_argument("dir", nargs="?", help="run folder (or checkpoint folder)")
    s.add_argument("--hf", metavar="PATH", default=None,
                   help="a local Hugging Face GPT-2 folder instead of a run folder")
    s.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    s.add_argument("--max-new-tokens", "--max_new_tokens", type=positive_int, default=500,
                   help="tokens to generate (default 500)")
    s.add_argument("--temperature", type=float, default=0.8,
                   help="0 = greedy; higher = more random (default 0.8)")
    s.add_argument("--top-k", "--top_k", type=positive_int, default=None,
                   help="sample from the k most likely tokens only")
    s.add_argument("--top-p", "--top_p", type=float, default=None,
                   help="sample from the smallest set of tokens holding probability p")
    s.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    add_which(s)
    s.add_argument("--no-cache", "--no_cache", action="store_true",
                   help="recompute the context every token")
    add_device(s)
    s.set_defaults(func=cmd_sample)


def add_translate(sub) -> None:
    t = sub.add_parser("translate", help="translate sentences with an encoder-decoder run",
                       description="Translate with a trained encoder-decoder: sentences on "
                                   "the command line, or one per line from --input.")
    t.add_argument("dir", help="run folder (or checkpoint folder)")
    t.add_argument("text", nargs="*", help="sentence(s) to translate")
    t.add_argument("--input", default=None, metavar="FILE",
                   help="translate each line of FILE ('-' = standard input)")
    add_decoding_flags(t)
    t.add_argument("--batch-size", "--batch_size", type=positive_int, default=None,
                   help="sentences decoded together (default 32)")
    t.add_argument("--encoding", default="utf-8", help="text encoding of --input")
    add_which(t)
    add_device(t)
    t.set_defaults(func=cmd_translate)


def check_sampling_args(args) -> None:
    """The sampling flags, checked before anything heavy is loaded."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0 or not math.isfinite(args.temperature):
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if not args.prompt:
        raise UserError("--prompt is empty: give at least one character")


def _write_stream(model, tokenizer, ids: list[int], args, device) -> None:
    """The prompt, then each generated piece as soon as it is a whole character."""
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    tokens = model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed, use_cache=not args.no_cache)
    for piece in stream_text(tokens, tokenizer):  # whole characters, even from byte-level BPE
        out.write(piece)
        out.flush()
    out.write("\n")


def cmd_sample(args) -> int:
    check_sampling_args(args)
    device = pick_device(args.device)
    if args.hf:
        if args.dir:
            raise UserError("give a run folder or --hf PATH, not both")
        return _sample_hf(args, device)
    if not args.dir:
        raise UserError("give a run folder to sample from (or --hf PATH)")
    run = load_run(args.dir, args.which, device)
    run.family.require("sample")
    decoding_threads(run.model, device)
    _write_stream(run.model, run.tokenizer, run.tokenizer.encode(args.prompt), args, device)
    return 0


def _sample_hf(args, device) -> int:
    """``sample --hf PATH``: continue a prompt with a Hugging Face GPT-2 folder."""
    model = load_hf(args.hf, device)
    if not isinstance(model, GPT):
        raise UserError(f"{args.hf} holds a {type(model).__name__}; sample needs a GPT-2 folder")
    tokenizer = load_hf_tokenizer(args.hf)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise UserError("the prompt encodes to no tokens")
    if max(ids) >= model.config.vocab_size:
        raise UserError(f"the tokenizer in {args.hf} does not fit the model (token id "
                        f"{max(ids)} >= vocab_size {model.config.vocab_size})")
    print(describe(model), file=sys.stderr)
    _write_stream(model, tokenizer, ids, args, device)
    return 0


def _read_lines(args) -> list[str]:
    if args.input is None:
        if not args.text:
            raise UserError("nothing to translate: give a sentence or --input FILE")
        return list(args.text)
    if args.text:
        raise UserError("give the text or --input FILE, not both")
    if args.input == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(args.input).read_text(encoding=args.encoding).splitlines()
    except OSError as e:
        raise UserError(f"cannot read {args.input}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{args.input} is not valid {args.encoding}; pass --encoding") from None


def cmd_translate(args) -> int:
    options = {"beam": args.beam, "length_penalty": args.length_penalty,
               "max_len": args.max_len, "batch_size": args.batch_size}
    device = pick_device(args.device)
    run = load_run(args.dir, args.which, device)
    run.family.require("translate")
    lines = _read_lines(args)
    for line in run.family.translate(run.model, run.tokenizer, lines, options, device):
        print(line)
    return 0
