"""The sources' documents a block at a time, so that no file is ever held whole in memory.

    blocks(files) -> (starts a document, text, source bytes it stands for), in input order

A plain text file is one document, decoded ``BLOCK_BYTES`` at a time by an incremental
decoder (a character cut between two blocks is joined again); its byte offset names the
place of bytes that do not decode. Every other kind of source (JSONL, and whatever
``sources.read_documents`` reads by rows) comes from ``read_documents``, one document a
block: those documents are records, small by nature.

Line ends: ``newline="normalize"`` reads Windows (CRLF) and old Mac (CR) line ends as "\\n",
as ``train`` reads a file (``text.normalize_newlines``), a CR at a block's end held back until
the next block shows whether an LF follows; ``"keep"`` leaves them.

``lines`` turns the blocks into the lines of the documents joined by "\\n", the same lines
``fit_tokenizer`` trains BPE on when given the whole text, and ``sample_lines`` keeps an
evenly spread share of them.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import UserError
from .sources import decodes, has_records, read_documents
from .text import (
    compression,
    looks_binary,
    normalize_newlines,
    refuse_binary,
    refuse_compressed,
    wide_encoding,
)

BLOCK_BYTES = 1 << 20
def is_text_file(path: Path) -> bool:
    """A file read whole as one text (not records: ``sources.has_records``)."""
    return path.is_file() and not has_records(path)


def blocks(files: list[Path], text_field: str = "text", encoding: str = "utf-8",
           errors: str = "strict", newline: str = "keep") -> Iterator[tuple[bool, str, int]]:
    """(starts a document, text, bytes of the source it stands for) over all ``files``."""
    for path in files:
        if is_text_file(path):
            yield from _text_blocks(path, encoding, errors, newline)
            continue
        done = 0
        for doc in read_documents([path], text_field, encoding, errors):
            size = len(doc.text)  # about its bytes, for the progress bar
            done += size
            yield True, normalize_newlines(doc.text, newline)[0], size
        try:
            rest = max(0, path.stat().st_size - done)
        except OSError:
            rest = 0
        yield False, "", rest  # the bar reaches the file's end


def _decoder(encoding: str, errors: str):
    try:
        return codecs.getincrementaldecoder(encoding)("replace" if errors == "replace"
                                                      else "strict")
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None


def _raw_blocks(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb") as f:
            while raw := f.read(BLOCK_BYTES):
                yield raw
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None


def _compressed(path: Path) -> bool:
    """Whether ``path`` begins as a compressed file does (gzip, zip, ...): its first bytes."""
    try:
        with open(path, "rb") as f:
            return compression(f.read(8)) is not None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None


def _binary(path: Path, encoding: str) -> bool:
    """Whether ``path`` ``looks_binary`` (never for UTF-16 or UTF-32 text, which holds NULs)."""
    if wide_encoding(encoding):
        return False
    return looks_binary(next(iter(_raw_blocks(path)), b""))


def fold_line_ends(chunk, held, final: bool, cr, lf):
    """(``held + chunk`` with CRLF and CR read as LF, the CR to hold for the next chunk): a
    CR at the end of a chunk that is not the last may be half of a CRLF. For str or bytes
    (UTF-8, whose multi-byte characters never hold the byte CR)."""
    chunk, held = held + chunk, chunk[:0]
    if not final and chunk.endswith(cr):
        chunk, held = chunk[:-1], cr
    return chunk.replace(cr + lf, lf).replace(cr, lf), held


def _text_blocks(path: Path, encoding: str, errors: str,
                 newline: str = "keep") -> Iterator[tuple[bool, str, int]]:
    if errors == "skip" and (_compressed(path) or not decodes(path, encoding)
                             or _binary(path, encoding)):
        return  # left out whole, as a binary file is (the skip note names it)
    refuse_compressed(path)
    decoder, offset, first, held = _decoder(encoding, errors), 0, True, ""
    wide = wide_encoding(encoding)
    for raw in _with_end(_raw_blocks(path)):
        if first and not wide:
            refuse_binary(path, raw)  # --errors replace would make text of an image
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: not valid {encoding} at byte {offset - pending + e.start}; "
                            f"pass --encoding, or --errors replace|skip") from None
        offset += len(raw)
        if first:
            text = text.removeprefix("\ufeff")
        if newline == "normalize":
            text, held = fold_line_ends(text, held, not raw, "\r", "\n")
        if first or text or raw:
            yield first, text, len(raw)
            first = False


def _with_end(raws: Iterator[bytes]) -> Iterator[bytes]:
    yield from raws
    yield b""  # the decoder's final call


def byte_blocks(files: list[Path], text_field: str = "text", encoding: str = "utf-8",
                errors: str = "strict", newline: str = "keep") -> Iterator[tuple[bool, bytes, int]]:
    """``blocks`` as UTF-8 bytes. A UTF-8 text file read strictly is passed on as read (its
    bytes were checked by the first pass; a BOM is dropped), not decoded and encoded again."""
    raw_ok = errors in ("strict", "skip") and _codec(encoding) == "utf-8"
    for path in files:
        if raw_ok and is_text_file(path):
            if errors == "skip" and (not decodes(path, encoding) or _binary(path, encoding)):
                continue
            first, held = True, b""
            for raw in _with_end(_raw_blocks(path)):
                data = raw.removeprefix(b"\xef\xbb\xbf") if first else raw
                if newline == "normalize":
                    data, held = fold_line_ends(data, held, not raw, b"\r", b"\n")
                if first or data or raw:
                    yield first, data, len(raw)
                first = False
            continue
        for new_doc, text, size in blocks([path], text_field, encoding, errors, newline):
            yield new_doc, text.encode("utf-8", "surrogatepass"), size


def _codec(encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None


def lines(blocks_: Iterable[tuple[bool, str, int]]) -> Iterator[str]:
    """The lines of the documents joined by "\\n" (``str.splitlines(keepends=True)`` of that
    text), from its blocks: a line cut between blocks is joined again, and a "\\r" at a
    block's end waits, since a "\\n" may follow it."""
    carry, started = "", False
    for new_doc, text, _ in blocks_:
        if new_doc and started:
            text = "\n" + text
        started = started or new_doc
        buf = carry + text
        if not buf:
            continue
        parts = buf.splitlines(keepends=True)
        last = parts[-1]
        if last.endswith("\r") or last == last.rstrip("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"):
            carry = parts.pop()
        else:
            carry = ""
        yield from parts
    if carry:
        yield carry


def sample_lines(blocks_: Iterable[tuple[bool, str, int]], total_bytes: int,
                 sample_bytes: int, head_chars: int = 1_000_000) -> tuple[list[str], str, int]:
    """(the lines BPE trains on, the text's first ``head_chars`` characters, characters read).

    Every line (``lines``) when the sources hold at most ``sample_bytes``; else about
    ``sample_bytes`` of them, spread evenly: a block's lines are kept while the kept share
    is behind ``sample_bytes / total_bytes`` of what has been read."""
    head: list[str] = []
    state = {"head": 0, "read": 0}

    def counted():
        for block in blocks_:
            text = block[1]
            state["read"] += len(text)
            if state["head"] < head_chars and text:
                head.append(text[:head_chars - state["head"]])
                state["head"] += len(head[-1])
            yield block

    if total_bytes <= sample_bytes:
        kept = list(lines(counted()))
    else:
        kept, n_kept = [], 0
        for _, text, _ in counted():
            if text and n_kept * total_bytes < sample_bytes * state["read"]:
                kept += text.splitlines(keepends=True)
                n_kept += len(text)
    return kept, "".join(head), state["read"]
