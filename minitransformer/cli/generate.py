"""``sample`` (continue a prompt), ``translate`` (an encoder-decoder's sentences) and ``fill``
(a masked-LM encoder's [MASK] slots).

    minitransformer sample runs/shakespeare --prompt "ROMEO:" --temperature 0.8 --top-k 50
    minitransformer sample runs/shakespeare --num-samples 8 --seed 1 --max-new-tokens 200
    minitransformer sample --hf path/to/gpt2 --prompt "Hello, I'm a language model,"
    minitransformer translate runs/en-es "In the beginning God created the heavens and the earth."
    minitransformer fill runs/mlm "To be, or not to b[MASK]." --top 5
"""

from __future__ import annotations

import locale
import math
import sys
from pathlib import Path

import torch

from ..config import SEED_LIMIT
from ..errors import UserError
from ..families import load_run
from ..interop import describe, load_hf, load_hf_tokenizer
from ..interop.tokenizer import as_char_tokenizer
from ..models import GPT
from ..models.generation import (
    ROLLABLE,
    decoding_weights,
    default_context_keep,
    default_context_shift,
)
from ..tokenizers import BPETokenizer
from ..tokenizers.specials import start_tokens
from ..tokenizers.streaming import stream_text
from ..training.device import decoding_threads, pick_device
from .flags import (
    add_decoding_flags,
    add_device,
    add_which,
    cli_text,
    nonneg_int,
    positive_int,
    seed,
)

WINDOW_HELP = """\
past the context window: a model sees at most block_size tokens. --context_shift N: when the
text outgrows the window, the oldest tokens go at once and the window restarts from the last
block_size - N tokens, so each token sees between block_size - N and block_size tokens (one
cache rebuild per N tokens); 0 = the exact sliding window (every token sees the last
block_size; the cache is rebuilt every token). --context_mode recompute rebuilds the cache
from the new window: the model sees exactly that window, as if it had never seen more.
--context_mode roll (rope, alibi or no positions) keeps the cache and drops its oldest
entries instead: nothing is recomputed, but the kept tokens' keys and values still carry what
they saw of the dropped text (an approximation). --context_keep K: the text's first K tokens
never leave the window (the prompt's, or the first generated ones after a shorter prompt);
by default the start tokens the tokenizer puts before every prompt where the window has room
for them beside the shift (Llama's <s>: a model trained on texts that begin with it expects it
first; none for char and GPT-2 tokenizers). With kept tokens, the shift is at most block_size
- K - 1, and roll drops the oldest entries after them."""


def add_sample(sub) -> None:
    s = sub.add_parser("sample", help="generate text from a trained model", epilog=WINDOW_HELP,
                       description="Continue a prompt with a trained GPT (or a Hugging Face "
                                   "GPT-2, Llama or Qwen3 folder).")
    s.add_argument("dir", nargs="?", help="run folder (or checkpoint folder)")
    s.add_argument("--hf", metavar="PATH", default=None,
                   help="a local Hugging Face GPT-2, Llama or Qwen3 folder instead of a run "
                        "folder (default none)")
    s.add_argument("--prompt", default="\n", type=cli_text,
                   help="text to continue (default a newline); a tokenizer that starts "
                        "every text with a token, as Llama's <s>, puts it first (and \"\" "
                        "is that token alone)")
    s.add_argument("--max-new-tokens", "--max_new_tokens", type=positive_int, default=500,
                   help="tokens to generate per sample (default 500)")
    s.add_argument("--num-samples", "--num_samples", type=positive_int, default=1,
                   help="samples generated together in one batch; sample i draws with seed + "
                        "i, so --seed S+i --num_samples 1 gives it alone (to fp32 rounding: "
                        "a batch's products may differ from one row's in the last bits, which "
                        "can flip a token at a near-tie, rarely; in fp64 exactly) (default 1)")
    s.add_argument("--temperature", type=float, default=0.8,
                   help="0 = greedy; higher = more random (default 0.8)")
    s.add_argument("--top-k", "--top_k", type=nonneg_int, default=0,
                   help="sample from the k most likely tokens only; 0 = off (default 0)")
    s.add_argument("--top-p", "--top_p", type=float, default=1.0,
                   help="sample from the smallest set of tokens holding probability p; 1 = "
                        "off (default 1)")
    s.add_argument("--seed", type=seed, default=None,
                   help="seed for reproducible samples, 0 to 2**63 - 1 (default none: new "
                        "text every run); on a CPU, MINITRANSFORMER_KERNEL=packed, blas or mkl "
                        "makes them repeat to the last bit across runs (docs/BENCHMARKS.md)")
    s.add_argument("--context-shift", "--context_shift", type=nonneg_int, default=None,
                   help="tokens dropped at once when the text outgrows the context window; "
                        "0 = exact sliding window; see below (default block_size // 4)")
    s.add_argument("--context-mode", "--context_mode", choices=["recompute", "roll"],
                   default="recompute",
                   help="recompute the cache from the new window, or roll it (rope / alibi "
                        "only; an approximation); see below (default recompute)")
    s.add_argument("--context-keep", "--context_keep", type=nonneg_int, default=None,
                   help="the text's first tokens that never leave the window; see below "
                        "(default: the tokenizer's start tokens, as Llama's <s>, else 0)")
    add_which(s)
    s.add_argument("--no-cache", "--no_cache", action="store_true",
                   help="recompute the whole window every token, the same text slower "
                        "(default off: the KV cache)")
    add_device(s)
    s.set_defaults(func=cmd_sample)


def add_translate(sub) -> None:
    t = sub.add_parser("translate", help="translate sentences with an encoder-decoder run",
                       description="Translate with a trained encoder-decoder: sentences on "
                                   "the command line, or one per line from --input.")
    t.add_argument("dir", help="run folder (or checkpoint folder)")
    t.add_argument("text", nargs="*", type=cli_text, help="sentence(s) to translate")
    t.add_argument("--input", default=None, metavar="FILE",
                   help="translate each line of FILE ('-' = standard input) (default none: "
                        "the sentences given)")
    add_decoding_flags(t)
    t.add_argument("--min-len", "--min_len", type=nonneg_int, default=0,
                   help="shortest translation in tokens: no </s> before it (default 0)")
    t.add_argument("--batch-size", "--batch_size", type=positive_int, default=None,
                   help="sentences decoded together (default 32)")
    t.add_argument("--encoding", default=None,
                   help="text encoding of --input (default utf-8 for a file, the locale's "
                        "for standard input)")
    add_which(t)
    add_device(t)
    t.set_defaults(func=cmd_translate)


def add_fill(sub) -> None:
    f = sub.add_parser("fill", help="fill in the [MASK] slots of a text with a masked-LM encoder",
                       description="The likeliest tokens for each [MASK] of a text, from a "
                                   "masked-LM encoder run (train --model encoder): all slots "
                                   "predicted together, in one pass, as BERT is trained. "
                                   "minitransformer attention DIR --text '...[MASK]...' draws "
                                   "the attention that fills them.")
    f.add_argument("dir", help="run folder (or checkpoint folder)")
    f.add_argument("text", nargs="+", type=cli_text,
                   help="text(s) with one or more [MASK] slots ([mask] and <mask> work "
                        "too); with a char tokenizer a slot is one character, with BPE one "
                        "token, the space before it included ('to [MASK].' can give 'to be.')")
    f.add_argument("--top", type=positive_int, default=5,
                   help="tokens shown per slot, likeliest first (default 5)")
    add_which(f)
    add_device(f)
    f.set_defaults(func=cmd_fill)


def cmd_fill(args) -> int:
    device = pick_device(args.device)
    run = load_run(args.dir, args.which, device)
    run.family.require("fill")
    for line in run.family.fill(run.model, run.tokenizer, args.text, args.top):
        print(line)
    return 0


def check_sampling_args(args) -> None:
    """The sampling flags, checked before anything heavy is loaded."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top_p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0 or not math.isfinite(args.temperature):
        raise UserError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.temperature == 0:  # greedy: nothing is drawn, so nothing of a draw applies
        asked = [flag for flag, on in (("--top_k", args.top_k), ("--top_p", args.top_p < 1),
                                       ("--seed", args.seed is not None)) if on]
        if asked:
            raise UserError(f"--temperature 0 is greedy decoding, which draws nothing, so "
                            f"{' and '.join(asked)} would change nothing; drop "
                            f"{'it' if len(asked) == 1 else 'them'} or give a temperature "
                            f"above 0")
        if args.num_samples > 1:
            raise UserError(f"--temperature 0 is greedy decoding: all {args.num_samples} "
                            f"samples would be the same text; give a temperature above 0 or "
                            f"drop --num_samples")
    if args.seed is not None and args.seed + args.num_samples - 1 >= SEED_LIMIT:
        raise UserError(f"--seed {args.seed} with --num_samples {args.num_samples}: sample i "
                        f"draws with seed + i, which must stay under 2**63, so give a seed of "
                        f"at most {SEED_LIMIT - args.num_samples}")


def check_window_args(args, model, keep: int) -> None:
    """--context_shift, --context_mode and the context keep against the loaded model."""
    block, pos = model.config.block_size, model.config.pos_encoding
    if keep >= block:
        raise UserError(f"--context_keep must be less than the model's block_size ({block}), "
                        f"got {keep}")
    room = block - keep  # the positions a shift may free
    if args.context_shift is not None and args.context_shift >= room:
        what = f"block_size ({block})" if not keep else \
            f"block_size ({block}) less the {keep} kept token(s), {room}"
        raise UserError(f"--context_shift must be less than the model's {what}, got "
                        f"{args.context_shift}")
    if args.context_shift is None and default_context_shift(block) >= room:
        raise UserError(f"--context_keep {keep} leaves no room for the default context shift "
                        f"({default_context_shift(block)} of block_size {block}): keep fewer "
                        f"or give a smaller --context_shift")
    if args.context_mode == "roll" and args.no_cache:
        raise UserError("--context_mode roll rolls the KV cache, and --no_cache has none (it "
                        "recomputes every window, as recompute does): drop one of them")
    if args.context_mode == "roll" and pos not in ROLLABLE:
        raise UserError(f"--context_mode roll needs rope, alibi or no positions; this model "
                        f"has {pos} positions (part of every cached key): use recompute")


def _write_samples(model, tokenizer, ids: list[int], args, device) -> None:
    """One sample: the prompt, then each piece as soon as it is a whole character. Several:
    generated together in one batch, then each written out, nanoGPT's separator after each.
    An empty prompt is the tokenizer's start token alone, where it has one (Llama's <s>)."""
    if not ids:
        raise UserError("--prompt is empty: give at least one character (this model's "
                        "tokenizer has no start token to begin from)" if not args.prompt else
                        "the prompt encodes to no tokens")
    keep = args.context_keep if args.context_keep is not None else default_context_keep(
        start_tokens(tokenizer), model.config.block_size, args.context_shift)
    check_window_args(args, model, keep)
    with decoding_weights(model, use_cache=not args.no_cache):  # packed for the whole run
        _stream_samples(model, tokenizer, ids, args, device, keep)


def _stream_samples(model, tokenizer, ids: list[int], args, device, keep: int) -> None:
    n = args.num_samples
    idx = torch.tensor([ids] * n, dtype=torch.long, device=device)  # (N, T)
    tokens = model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed, use_cache=not args.no_cache,
                          context_shift=args.context_shift, context_mode=args.context_mode,
                          context_keep=keep)
    out = sys.stdout
    if n == 1:
        out.write(args.prompt)
        out.flush()
        for piece in stream_text(tokens, tokenizer, ids):  # whole characters, even byte-level
            out.write(piece)
            out.flush()
        out.write("\n")
        return
    new = torch.cat(list(tokens), dim=1)  # (N, max_new_tokens)
    for row in new:
        out.write(args.prompt + "".join(stream_text(row.view(-1, 1, 1), tokenizer, ids)) + "\n")
        out.write("---------------\n")
    out.flush()


def cmd_sample(args) -> int:
    check_sampling_args(args)
    device = pick_device(args.device)
    if args.hf:
        if args.dir:
            raise UserError("give a run folder or --hf PATH, not both")
        if args.which is not None:
            raise UserError("--which picks a run folder's checkpoint; a Hugging Face folder "
                            "holds one model: drop it")
        return _sample_hf(args, device)
    if not args.dir:
        raise UserError("give a run folder to sample from (or --hf PATH)")
    run = load_run(args.dir, args.which, device)
    run.family.require("sample")
    decoding_threads(run.model, device, args.num_samples)
    ids = run.tokenizer.encode_prompt(args.prompt)  # Llama's <s> first, as transformers does
    _write_samples(run.model, run.tokenizer, ids, args, device)
    return 0


def _sample_hf(args, device) -> int:
    """``sample --hf PATH``: continue a prompt with a Hugging Face GPT-2, Llama or Qwen3 folder."""
    model = load_hf(args.hf, device)
    if not isinstance(model, GPT):
        raise UserError(f"{args.hf} holds a {type(model).__name__}; sample needs a GPT-2, "
                        f"Llama or Qwen3 folder")
    hf_tokenizer = load_hf_tokenizer(args.hf)
    # as a run started from the folder reads it: a char run's export refuses unseen
    # characters, and special tokens (</s>, <|endoftext|>) are left out of what is written
    tokenizer = as_char_tokenizer(hf_tokenizer) or BPETokenizer(hf_tokenizer.tokenizer)
    ids = tokenizer.encode_prompt(args.prompt)  # Llama's <s> first, as transformers does
    if ids and max(ids) >= model.config.vocab_size:
        raise UserError(f"the tokenizer in {args.hf} does not fit the model (token id "
                        f"{max(ids)} >= vocab_size {model.config.vocab_size})")
    print(describe(model), file=sys.stderr)
    _write_samples(model, tokenizer, ids, args, device)
    return 0


def _read_lines(args) -> list[str]:
    if args.input is None:
        if args.encoding is not None:
            raise UserError("--encoding is the encoding of --input; there is none")
        if not args.text:
            raise UserError("nothing to translate: give a sentence or --input FILE")
        empty = [i for i, text in enumerate(args.text, 1) if not text.strip()]
        if len(args.text) == 1 and empty:
            raise UserError("the sentence is empty: give some text to translate")
        if empty:
            raise UserError(f"sentence {empty[0]} of {len(args.text)} is empty: give some text "
                            f"to translate (--input FILE keeps a file's empty lines empty)")
        return list(args.text)
    if args.text:
        raise UserError("give the text or --input FILE, not both")
    stdin = args.input == "-"
    shown = "standard input" if stdin else args.input
    encoding = args.encoding or (locale.getpreferredencoding(False) if stdin else "utf-8")
    try:
        raw = sys.stdin.buffer.read() if stdin else Path(args.input).read_bytes()
        return raw.decode(encoding).removeprefix("\ufeff").splitlines()  # BOM: as training
    except OSError as e:
        raise UserError(f"cannot read {shown}: {e.strerror}") from None
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    except UnicodeDecodeError:
        raise UserError(f"{shown} is not valid {encoding}; pass --encoding") from None


def cmd_translate(args) -> int:
    options = {"beam": args.beam, "length_penalty": args.length_penalty,
               "max_len": args.max_len, "min_len": args.min_len, "batch_size": args.batch_size}
    lines = _read_lines(args)  # a bad input fails before the model loads
    device = pick_device(args.device)
    run = load_run(args.dir, args.which, device)
    run.family.require("translate")
    for line in run.family.translate(run.model, run.tokenizer, lines, options, device):
        print(line)
    return 0
