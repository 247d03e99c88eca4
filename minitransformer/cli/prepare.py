"""``minitransformer prepare``: a corpus tokenized once into memory-mapped shards.

    minitransformer prepare --data books/ --out data/books                 (characters)
    minitransformer prepare --data export.jsonl --text_field body --tokenizer bpe --out data/x
    minitransformer train --data data/books --out runs/books               (reads the shards)
"""

from __future__ import annotations

from pathlib import Path

from ..data.cache import clear_cache
from ..data.shards import MANIFEST, PARTIAL, TOKENIZER, TOKENS
from ..data.text import check_encoding_applies
from ..errors import UserError
from ..families import FAMILIES, get_family
from ..families.pretrained import read_tokenizer_source
from ..io import check_folder_path
from ..training.checkpoint import holds_run, run_containing
from .flags import add_tokenizer_flag, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "prepare", help="tokenize a corpus once into memory-mapped shards (DATA_DIR)",
        description="Read text files, folders of them, globs, JSONL (one document per line, "
                    "its --text_field), Parquet or Arrow files and datasets save_to_disk "
                    "folders (one document per row), fit the tokenizer, and write DATA_DIR: "
                    "tokens.bin, "
                    "tokenizer.json, manifest.json. train --data DATA_DIR then reads windows "
                    "from the memory map, whatever the corpus size.")
    p.add_argument("--data", action="extend", nargs="+", metavar="SOURCE",
                   help="a bundled corpus, a file, a folder or a glob; several (--data A B, or "
                        "--data A --data B) are prepared together, in that order")
    p.add_argument("--out", help="the DATA_DIR to write")
    p.add_argument("--model", default=None, choices=PREPARED_FAMILIES,
                   help="the family that will train on it (its special tokens; default gpt, or "
                        "the --tokenizer_from folder's)")
    add_tokenizer_flag(p, seq2seq=False)
    p.add_argument("--tokenizer_from", default=None, metavar="PATH",
                   help="encode with the tokenizer of a model folder (a run, a checkpoint or a "
                        "Hugging Face folder: what train --init_from takes) instead of fitting "
                        "one, so that a run fine-tuned from that folder can train on DATA_DIR")
    p.add_argument("--vocab_size", type=positive_int, default=None,
                   help="BPE vocabulary size (default 1024)")
    p.add_argument("--text_field", default="text",
                   help="the field of each JSONL record, or the column of a Parquet file or "
                        "datasets folder, that holds its text (default text)")
    p.add_argument("--val_fraction", type=float, default=0.1,
                   help="the share of tokens at the end that is the val split (default 0.1)")
    p.add_argument("--encoding", default="utf-8", help="text encoding (default utf-8)")
    p.add_argument("--newline", choices=["normalize", "keep"], default="normalize",
                   help="Windows (CRLF) and old Mac (CR) line ends: read as \\n, as train "
                        "--data FILE reads them (normalize, the default), or kept as they are")
    p.add_argument("--errors", choices=["strict", "replace", "skip"], default="strict",
                   help="undecodable bytes: stop (strict), replace them, or skip the file; "
                        "skip also leaves out binary files, table rows whose text is null, "
                        "and JSON Lines records without their text (not JSON, no such field, "
                        "null, a number) (default strict)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="processes that encode BPE, in parallel, output in input order; "
                        "characters are looked up in this process (default: the CPU count, "
                        "at most 8)")
    p.add_argument("--bpe_sample", type=positive_int, default=None, metavar="MB",
                   help="megabytes of text BPE is trained on, spread evenly over the sources; "
                        "a corpus this size or smaller is seen whole (default 16)")
    p.add_argument("--force", action="store_true",
                   help="replace a DATA_DIR already there (never a training run's folder)")
    p.add_argument("--clear_cache", action="store_true",
                   help="empty the cache that train --data FILE prepares into, first (alone: "
                        "only that)")
    p.set_defaults(func=cmd_prepare)
    p.set_defaults(given_alone=vars(p.parse_args([])))  # every flag's default: --clear_cache's


# the families prepare writes for (not the encoder-decoder's sentence pairs)
PREPARED_FAMILIES = [n for n, f in FAMILIES.items() if "char" in f.tokenizers]


def cmd_prepare(args) -> int:
    if args.clear_cache and args.data is None and args.out is None:
        others = [f"--{k}" for k, v in args.given_alone.items()
                  if k not in ("func", "clear_cache", "given_alone") and getattr(args, k) != v]
        if others:  # they would be ignored
            raise UserError(f"--clear_cache alone only empties the cache; {', '.join(others)} "
                            f"belong(s) to a prepare: give --data and --out too")
        clear_cache(echo=print)
        return 0
    if args.data is None or args.out is None:
        raise UserError("prepare needs --data SOURCE and --out DATA_DIR (or --clear_cache "
                        "alone)")
    check_folder_path(out := Path(args.out))
    if holds_run(out) or run_containing(out) is not None:
        raise UserError(f"--out {out} holds a model or a training run (a config.json or "
                        f"checkpoints/), whose tokenizer.json prepare would replace; give "
                        f"prepare a folder of its own (--force does not change this)")
    if (out / MANIFEST).exists() and not args.force:
        raise UserError(f"{out} already holds prepared data; pass --force to replace it")
    if out.is_dir() and not (out / MANIFEST).exists() and not stopped_prepare(out):
        raise UserError(f"--out {out} already holds files that are not prepared data, which "
                        f"prepare could replace; give it a new or empty folder (--force does "
                        f"not change this)")
    family, tokenizer = get_family(args.model or "gpt"), None
    if args.tokenizer_from is not None:
        family, tokenizer = tokenizer_from(args)
    if args.tokenizer is not None and args.tokenizer not in family.tokenizers:
        raise UserError(f"--tokenizer {args.tokenizer} does not apply to {family.title} runs")
    for flag, value in (("--vocab_size", args.vocab_size), ("--bpe_sample", args.bpe_sample)):
        if value is not None and args.tokenizer in (None, "char"):
            raise UserError(f"{flag} is for a BPE tokenizer; add --tokenizer bpe")
    kind = tokenizer.kind if tokenizer is not None else args.tokenizer or "char"
    if (args.workers or 1) > 1 and kind == "char":  # it would run in one process, unsaid
        raise UserError("--workers is for a BPE tokenizer: characters are looked up in this "
                        "process")
    check_encoding_applies(args.data, args.encoding)
    if args.clear_cache:  # first, once the command is known to be a whole one
        clear_cache(echo=print)
    family.prepare_dir(args.data, out, args.tokenizer, args.vocab_size,
                       text_field=args.text_field, val_fraction=args.val_fraction,
                       encoding=args.encoding, errors=args.errors, workers=args.workers,
                       bpe_sample=None if args.bpe_sample is None else args.bpe_sample * 10**6,
                       tokenizer=tokenizer, newline=args.newline, start_from=args.tokenizer_from,
                       # the hint's train command names the family --model named, where
                       # --init_from does not name it already
                       model=args.model if args.tokenizer_from is None else None)
    return 0


def stopped_prepare(out: Path) -> bool:
    """Whether ``out`` is empty or holds only what a stopped prepare leaves (its PARTIAL
    folder, or tokens.bin and tokenizer.json before the manifest that ends a prepare): a
    folder prepare may write into. A tokenizer.json alone is someone's own."""
    names = {p.name for p in out.iterdir()}
    return names <= {PARTIAL, TOKENS, TOKENIZER} and names != {TOKENIZER}


def tokenizer_from(args):
    """(family, tokenizer) of ``--tokenizer_from``: the folder's, which no BPE flag changes."""
    for flag in ("tokenizer", "vocab_size", "bpe_sample"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag} does not apply with --tokenizer_from: the folder's "
                            f"tokenizer is used as it is")
    family, tokenizer, described = read_tokenizer_source(args.tokenizer_from)
    if family.name not in PREPARED_FAMILIES:
        raise UserError(f"--tokenizer_from {args.tokenizer_from} holds {family.a_title} model: "
                        f"prepare writes data for {' and '.join(PREPARED_FAMILIES)} runs")
    if args.model is not None and args.model != family.name:
        raise UserError(f"--tokenizer_from {args.tokenizer_from} holds {family.a_title} model, "
                        f"not {get_family(args.model).a_title} one: drop --model")
    print(f"encoding with the tokenizer of {described} ({tokenizer.kind}, "
          f"{tokenizer.vocab_size:,} ids)")
    return family, tokenizer
