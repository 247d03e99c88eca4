"""``prepare``: fit a tokenizer on the sources, then stream them into a DATA_DIR's shards.

    sources -> blocks of text (reading.py) -> pass 1: the char alphabet (every character),
    or BPE trained on a spread sample of lines (all of them up to ``bpe_sample`` bytes)
    -> pass 2: pieces cut where the tokenizer cuts anyway (encode.py), encoded by worker
    processes, in input order -> token file + manifest (shards.py)

Memory stays flat as the corpus grows: a block, a few pieces in flight, the BPE sample. A
prepare stopped at any moment (even killed) leaves no manifest, so the folder is never
read; running the same command again starts it over and writes the same bytes.
"""

from __future__ import annotations

import codecs
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..errors import UserError
from ..tokenizers import CharTokenizer
from ..tokenizers.fitting import GPT_SPECIALS, fit_bpe_lines
from .encode import choose_encoder, encoder_spec
from .reading import blocks, byte_blocks, sample_lines
from .shards import check_val_fraction, split_note, write_stream
from .sources import check_text_field, fingerprint, source_files
from .tables import counting_dropped

CHAR_SEPARATOR = "\n\n"  # between prepared documents, for a char tokenizer
DEFAULT_BPE_SAMPLE = 16_000_000  # bytes: every bundled corpus (8 MB at most) is seen whole
MAX_WORKERS = 8
PROBE_CHARS = 200_000  # of the corpus's start, on which tiktoken must agree with tokenizers


def default_workers() -> int:
    """The CPUs this process may use, at most MAX_WORKERS."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_WORKERS))


def _bar(total: int, desc: str):
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc,
                disable=not sys.stderr.isatty() or None)


def check_alphabet(data: bytes, known: set[str], path, decoder) -> None:
    """Text for a given char tokenizer: a character its alphabet lacks is named with its file
    (the encoder itself can only say that some piece held one). ``decoder``: the file's
    incremental UTF-8 decoder (a block may end inside a character)."""
    unseen = set(decoder.decode(data)) - known
    if unseen:
        shown = ", ".join(repr(c) for c in sorted(unseen)[:10])
        raise UserError(f"{path}: the text has {len(unseen)} character(s) the tokenizer never "
                        f"saw: {shown}")


def prepare_corpus(sources: list[str], out, kind: str | None, vocab: int | None,
                   special_tokens: tuple[str, ...] = (), bpe_separator: str = "\n\n",
                   text_field: str = "text", val_fraction: float = 0.1, encoding: str = "utf-8",
                   errors: str = "strict", echo=print, workers: int | None = None,
                   bpe_sample: int | None = None, tokenizer=None,
                   newline: str = "keep", start_from: str | None = None,
                   model: str | None = None) -> dict:
    """Fit the tokenizer on the sources (with the family's ``special_tokens``; documents
    apart by ``bpe_separator`` for BPE, a blank line for characters) and write ``out``.

    ``workers``: BPE encoding processes (default: the CPUs, at most 8; characters are looked
    up in this process, cheaper than sending them to another: 54 against 32 MB/s here);
    ``bpe_sample``: bytes of text BPE is trained on (default 16 MB); ``tokenizer``: encode
    with this one (a run's, a pretrained folder's) instead of fitting one; ``newline``:
    "normalize" reads CRLF and CR line ends as "\\n", as ``train --data FILE`` does (the
    ``prepare`` command's default), "keep" leaves them; ``start_from``: the model folder whose
    tokenizer this is, which the hint at the end trains from (``--init_from``); ``model``: the
    family the hint names (``--model``; None: train's default)."""
    check_val_fraction(val_fraction)
    files = source_files(sources, echo)
    check_text_field(files, text_field)
    read = {"text_field": text_field, "encoding": encoding, "errors": errors,
            "newline": newline}
    total = sum(p.stat().st_size for p in files)
    prints, start = fingerprint(files), time.perf_counter()
    fit = tokenizer is None
    if fit:
        fitted, head = fit_streamed(files, kind or "char", vocab, special_tokens, read,
                                    DEFAULT_BPE_SAMPLE if bpe_sample is None else bpe_sample,
                                    total, echo)
    else:
        fitted, head = tokenizer, text_head(files, read, total)
    spec, route = choose_encoder(encoder_spec(fitted), head[:PROBE_CHARS])
    separator = bpe_separator if fitted.kind != "char" else CHAR_SEPARATOR
    workers = default_workers() if workers is None else max(1, workers)
    if spec["kind"] == "char":
        workers = 1  # a table lookup costs less than sending the text to another process
    fitting = time.perf_counter() - start
    known = set(fitted.chars) if not fit and fitted.kind == "char" else None
    left_out: list[Path] = []  # by --errors skip, whole
    with _bar(total, "encode") as bar:
        def texts():
            for path in files:  # one at a time: a character a given alphabet lacks names it
                decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
                documents = False  # whether the file began one (an empty one counts)
                for new_doc, data, size in byte_blocks([path], **read):
                    if known is not None:
                        check_alphabet(data, known, path, decoder)
                    bar.update(size)
                    documents |= new_doc
                    yield new_doc, data
                if not documents:
                    left_out.append(path)
        with counting_dropped() as dropped:  # in this pass only: fitting read them too
            manifest = write_stream(texts(), fitted, out, prints, val_fraction, separator,
                                    workers, spec)
    encoding_s = time.perf_counter() - start - fitting
    echo(f"prepared {manifest['tokens']:,} tokens from {manifest['documents']:,} document(s) "
         f"of {len(files)} file(s) into {out} ({fitted.kind} tokenizer, "
         f"{fitted.vocab_size:,} ids, {manifest['dtype']}); reading{' and fitting' * fit} "
         f"{fitting:.1f} s, "
         f"encoding {encoding_s:.1f} s ({total / 1e6 / max(encoding_s, 1e-9):.1f} MB/s; {route}, "
         f"{workers} worker(s)); train on it: minitransformer train "
         f"{'' if model is None else f'--model {model} '}"
         f"{'' if start_from is None else f'--init_from {shlex.quote(str(start_from))} '}"
         f"--data {shlex.quote(str(out))} --out RUN")
    if left_out:
        echo(skipped_note(left_out, encoding))
    if dropped[0]:
        echo(f"note: --errors skip left out {dropped[0]:,} record(s) or row(s) without their "
             f"text (not JSON, without the text field, null, or not {encoding})")
    if note := split_note(manifest):
        echo(note)
    return manifest


def skipped_note(paths: list[Path], encoding: str) -> str:
    """What --errors skip left out whole: the files (the first three named), not text in
    ``encoding`` or with no record or row of text."""
    shown = ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more"
                                                    if len(paths) > 3 else "")
    return (f"note: --errors skip left out {len(paths)} file(s) with no {encoding} text "
            f"(binary or compressed, not {encoding}, or no record with its text): {shown}")


def text_head(files, read: dict, total_bytes: int) -> str:
    """The first ``PROBE_CHARS`` characters of the sources (what ``choose_encoder`` probes),
    after a pass over all of them, as fitting makes: its checks (a binary file, undecodable
    bytes) are what lets the encoding pass read UTF-8 files as raw bytes."""
    head: list[str] = []
    size = 0
    with _bar(total_bytes, "read") as bar:
        for _, text, n in blocks(files, **read):
            bar.update(n)
            if size < PROBE_CHARS:
                head.append(text)
                size += len(text)
    return "".join(head)


def fit_streamed(files, kind: str, vocab: int | None, special_tokens: tuple[str, ...],
                 read: dict, sample_bytes: int, total_bytes: int, echo=print):
    """(the tokenizer of the sources, the text's first characters): every character of
    every document, or BPE on a sample of their lines (all of them when the sources hold at
    most ``sample_bytes``: then it is ``fit_tokenizer``'s on the whole text)."""
    with _bar(total_bytes, "read") as bar:
        def texts():
            for block in blocks(files, **read):
                bar.update(block[2])
                yield block
        if kind == "char":
            chars, head = char_alphabet(texts())
            return CharTokenizer(chars), head
        lines, head, n = sample_lines(texts(), total_bytes, sample_bytes)
    if n == 0:
        raise UserError("the sources hold no text: nothing to prepare")
    return fit_bpe_lines(kind, lines, head, vocab, special_tokens or GPT_SPECIALS,
                         echo=echo), head


def char_alphabet(blocks_) -> tuple[list[str], str]:
    """(every character of the documents, with the separator's when there are several,
    sorted by code point; the first block's text), without a Python loop per character."""
    seen = np.zeros(0x110000, dtype=bool)
    documents, head = 0, ""
    for new_doc, text, _ in blocks_:
        documents += new_doc
        if text:
            head = head or text
            seen[np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)] = True
    if documents > 1:
        seen[[ord(c) for c in CHAR_SEPARATOR]] = True
    chars = [chr(int(c)) for c in np.flatnonzero(seen)]
    if not chars:
        raise UserError("the sources hold no text: nothing to prepare")
    return chars, head
