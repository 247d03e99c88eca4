"""Prepared corpora: a token stream written once to disk, read back as a memory map.

    DATA_DIR/tokens.bin      every token id of the corpus, flat, uint16 (or uint32 when the
                             vocabulary does not fit), documents in input order
    DATA_DIR/tokenizer.json  the tokenizer that made them
    DATA_DIR/manifest.json   format version, dtype, token and document counts, where the val
                             split starts, per-token counts, the sources and their fingerprints

The val split is the last ``val_fraction`` of the ids (nanoGPT's and ``split_ids``' split) for
one document; for several, it starts at the first document boundary at or after that point,
so no document is cut in two (the last document always goes to val).

Writing is kill-safe: the ids grow in DATA_DIR/.partial/ (with each document's start), and
only at the end are tokens.bin and tokenizer.json moved into place, .partial removed, and
``manifest.json`` written, last and atomically. A folder without it is an unfinished
prepare and is never read; the next prepare into it (no --force needed) starts it over.

Training reads random windows through ``TokenStream`` (no copy of the corpus in memory, and
every process under torchrun maps the same file).
"""

from __future__ import annotations

import os
import shutil
from array import array
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..io import atomic_write_json, fsync_dir, read_json_object
from .encode import EncodeError, EncoderPool, encoder_spec
from .pieces import cut_mode, cut_pieces

FORMAT_VERSION = 1
MANIFEST, TOKENS, TOKENIZER = "manifest.json", "tokens.bin", "tokenizer.json"
PARTIAL = ".partial"  # an unfinished prepare's files, never read; the next prepare removes it
STARTS = "starts.bin"  # in PARTIAL: where each document starts (int64), for the val split
# bytes per encoded piece, by where a piece may be cut (encode.safe_cut)
PIECE_BYTES = {"any": 1 << 22, "bytes": 1 << 20, "lines": 1 << 20, "never": 1 << 20}


def is_prepared(path) -> bool:
    """Whether ``path`` is a DATA_DIR written by ``prepare`` (a complete one)."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


def check_val_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val_fraction must be in (0, 1), got {val_fraction}")


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


# ---- writing --------------------------------------------------------------------------------

class ShardWriter:
    """Token ids appended piece by piece under DATA_DIR/.partial; ``finish`` moves them into
    place and writes the manifest last, so a stopped prepare never looks complete. The data a
    prepare --force replaces stays whole until then: a prepare stopped on the way leaves it."""

    def __init__(self, out_dir, tokenizer):
        self.out, self.tokenizer = Path(out_dir), tokenizer
        self.out.mkdir(parents=True, exist_ok=True)
        self.partial = self.out / PARTIAL
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir()
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
        self.n, self.documents, self.starts = 0, 0, array("q")
        self.tokens_file = open(self.partial / TOKENS, "wb")
        self.starts_file = open(self.partial / STARTS, "wb")

    def add(self, ids: np.ndarray, new_document: bool, counts: np.ndarray | None = None) -> None:
        """Append ``ids`` (N,); ``new_document``: they begin a document; ``counts``: how often
        each id occurs in them (V,), when the encoder counted already."""
        if new_document:
            self.starts.append(self.n)
            self.documents += 1
            if len(self.starts) >= 1 << 16:
                self._flush_starts()
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        self.tokens_file.write(memoryview(ids).cast("B"))
        self.counts += np.bincount(ids, minlength=len(self.counts))[:len(self.counts)] \
            if counts is None else counts
        self.n += len(ids)

    def _flush_starts(self) -> None:
        self.starts.tofile(self.starts_file)
        self.starts = array("q")

    def close(self) -> None:
        for f in (self.tokens_file, self.starts_file):
            if not f.closed:
                f.close()

    def finish(self, sources: list[dict], val_fraction: float) -> dict:
        """Move the tokens into place, write tokenizer.json, then the manifest; returns it."""
        self._flush_starts()
        for f in (self.tokens_file, self.starts_file):
            f.flush()
            os.fsync(f.fileno())
        self.close()
        if self.n == 0:
            shutil.rmtree(self.partial, ignore_errors=True)
            raise UserError("the sources hold no text: nothing to prepare")
        starts = np.fromfile(self.partial / STARTS, dtype=np.int64)
        manifest = {"format": "minitransformer-tokens", "version": FORMAT_VERSION,
                    "dtype": np.dtype(self.dtype).name, "tokens": self.n,
                    "documents": self.documents,
                    "val_start": val_start(self.n, starts, val_fraction),
                    "val_fraction": val_fraction, "tokenizer": self.tokenizer.kind,
                    "vocab_size": self.tokenizer.vocab_size, "counts": self.counts.tolist(),
                    "sources": sources}
        del starts
        (self.out / MANIFEST).unlink(missing_ok=True)  # the old data's, first: now unfinished
        os.replace(self.partial / TOKENS, self.out / TOKENS)
        atomic_write_json(self.out / TOKENIZER, self.tokenizer.to_dict())
        shutil.rmtree(self.partial, ignore_errors=True)
        fsync_dir(self.out)
        atomic_write_json(self.out / MANIFEST, manifest)
        return manifest


def write_ids(pieces: Iterable[tuple[bool, np.ndarray, np.ndarray | None]], tokenizer, out_dir,
              sources: list[dict], val_fraction: float = 0.1) -> dict:
    """Write ``pieces`` ((begins a document, ids, their counts or None) in order) as
    ``out_dir``; returns the manifest."""
    check_val_fraction(val_fraction)
    writer = ShardWriter(out_dir, tokenizer)
    try:
        for new_document, ids, counts in pieces:
            writer.add(ids, new_document, counts)
    except BaseException:
        writer.close()  # the partial folder stays, unread, until the next prepare
        raise
    return writer.finish(sources, val_fraction)


def special_ids(tokenizer, text: str) -> np.ndarray | None:
    """The ids of ``text`` where it is one or more of the tokenizer's special tokens written
    out (<|endoftext|>, </s><s>), else None (a blank line, or a char tokenizer)."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None or not text:
        return None
    specials = {t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    ids, rest = [], text
    while rest:
        token = next((t for t in sorted(specials, key=len, reverse=True)
                      if rest.startswith(t)), None)
        if token is None:
            return None
        ids.append(specials[token])
        rest = rest[len(token):]
    return np.array(ids, dtype=np.int64)


def write_stream(texts: Iterable[tuple[bool, bytes]], tokenizer, out_dir, sources: list[dict],
                 val_fraction: float = 0.1, separator: str = "", workers: int = 1,
                 spec: dict | None = None) -> dict:
    """Encode ``texts`` ((begins a document, UTF-8 bytes) blocks in order; ``separator`` before
    every document but the first) with ``workers`` processes into ``out_dir``; the manifest.

    ``spec``: the encoder (``encode.choose_encoder``'s), else the tokenizer's own. A separator
    of special tokens alone (<|endoftext|>, Llama's </s><s>) goes in as their ids, and each
    document is encoded on its own: a tokenizer that marks only a text's first word (Metaspace
    "first") marks a document's, as the tokenizer reads a document alone."""
    check_val_fraction(val_fraction)
    mode, flags = cut_mode(tokenizer), deque()
    between = special_ids(tokenizer, separator)
    text_separator = b"" if between is not None else separator.encode("utf-8")

    def pieces():
        for new_document, piece in cut_pieces(texts, mode, text_separator, PIECE_BYTES[mode]):
            flags.append(new_document)
            yield piece

    def with_separators(encoded):
        first = True
        for ids, counts in encoded:
            new_document = flags.popleft()
            if new_document and not first and between is not None:
                ids = np.concatenate([between.astype(ids.dtype), ids])
                counts = None if counts is None else \
                    counts + np.bincount(between, minlength=len(counts))[:len(counts)]
            first = first and not new_document
            yield new_document, ids, counts

    try:
        with EncoderPool(spec or encoder_spec(tokenizer), workers) as pool:
            return write_ids(with_separators(pool.map(pieces())), tokenizer, out_dir, sources,
                             val_fraction)
    except EncodeError as e:
        raise UserError(str(e)) from None


def write_shards(documents, tokenizer, out_dir, sources: list[dict], val_fraction: float = 0.1,
                 separator: str = "", progress=None, workers: int = 1) -> dict:
    """Encode ``documents`` (an iterable of Document) into ``out_dir``; returns the manifest.

    ``separator`` is text put between documents (an end-of-text token for BPE, e.g.);
    ``progress`` is called with each document's size in characters."""
    def texts():
        for doc in documents:
            if progress is not None:
                progress(len(doc.text))
            yield True, doc.text.encode("utf-8", "surrogatepass")
    return write_stream(texts(), tokenizer, out_dir, sources, val_fraction, separator, workers)


def split_note(manifest: dict) -> str | None:
    """A note when the val split, cut at a document boundary, is far from ``val_fraction`` of
    the tokens (a few documents of very different lengths); None when it is close."""
    n, asked = manifest["tokens"], manifest["val_fraction"]
    if manifest.get("documents", 2) <= 1:  # one text splits at the fraction (a short one
        return None  # only rounds: 1 of 4 tokens is 25%), never between documents
    share = (n - manifest["val_start"]) / max(n, 1)
    if asked / 2 <= share <= max(2 * asked, asked + 0.05):
        return None
    return (f"note: the val split holds {share:.1%} of the tokens, not {asked:.0%}: the split "
            f"falls between documents (the last one always goes to val), and these "
            f"{manifest['documents']:,} are few or of uneven length; more files of even length, "
            f"or one file, split closer")


def val_start(n: int, doc_starts, val_fraction: float) -> int:
    """Where the val split starts: split_ids' point for one document, else the first document
    boundary at or after it (the last document at least). Where that leaves val under half
    the fraction asked (a last document that is empty or short), the last boundary that
    leaves at least that much; split_ids' point where there is none (one long document)."""
    point = int(n * (1 - val_fraction))
    starts = np.asarray(doc_starts, dtype=np.int64)
    if len(starts) <= 1:
        return point
    i = int(np.searchsorted(starts[1:], point, side="left"))
    cut = int(starts[1 + i]) if i < len(starts) - 1 else int(starts[-1])
    least = n * val_fraction / 2
    if n - cut >= least:
        return cut
    earlier = starts[1:][n - starts[1:] >= least]
    return int(earlier[-1]) if len(earlier) else point


class TokenStream:
    """A read-only window onto a memory-mapped token file that indexes like a 1-D LongTensor:
    ``len``, slices (another TokenStream, no copy) and index tensors (copied, as int64)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return TokenStream(self.array[index])
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        return torch.from_numpy(np.asarray(self.array[index], dtype=np.int64))

    def tolist(self) -> list[int]:
        return self.array.astype(np.int64).tolist()


def joined(first, second):
    """Two token streams as one, ``first`` then ``second`` (a corpus' train and val splits:
    the whole text). The two splits of one memory-mapped file become one window onto it, no
    copy; streams that are not neighbours, and tensors, are copied together."""
    if isinstance(first, TokenStream) and isinstance(second, TokenStream):
        a, b = first.array, second.array
        step = (a.itemsize,)  # each a run of neighbouring tokens, read forwards
        neighbours = (a.dtype == b.dtype and a.strides == b.strides == step
                      and a.base is not None and a.base is b.base
                      and a.ctypes.data + a.nbytes == b.ctypes.data)
        if neighbours:  # b's tokens follow a's in the one mapping both are views of
            return TokenStream(np.lib.stride_tricks.as_strided(
                a, shape=(len(a) + len(b),), strides=a.strides, writeable=False))
        return TokenStream(np.concatenate([a, b]))
    return torch.cat([first, second])  # tensors (a text encoded in memory)


def is_intact(path) -> bool:
    """Whether ``path`` is a DATA_DIR (``is_prepared``) whose manifest reads and whose tokens
    file has the size it records."""
    if not is_prepared(path):
        return False
    try:
        open_shards(path)
    except (UserError, KeyError, TypeError, ValueError):
        return False
    return True


def record_family(data_dir, family: str) -> dict:
    """Write into a DATA_DIR's manifest (whole again, atomically) which family's runs it was
    prepared for: their special tokens are in its tokenizer and between its documents.
    Returns the manifest."""
    path = Path(data_dir) / MANIFEST
    manifest = {**read_json_object(path), "family": family}
    atomic_write_json(path, manifest)
    return manifest


def open_shards(data_dir) -> tuple[dict, TokenStream, TokenStream]:
    """(manifest, train ids, val ids) of a DATA_DIR, memory-mapped."""
    folder = Path(data_dir)
    manifest = read_json_object(folder / MANIFEST)
    if manifest.get("format") != "minitransformer-tokens" or \
            manifest.get("version") != FORMAT_VERSION:
        raise UserError(f"{folder / MANIFEST} is not a version {FORMAT_VERSION} token manifest "
                        f"(prepare it again)")
    path = folder / TOKENS
    try:
        n, dtype, cut = int(manifest["tokens"]), np.dtype(manifest["dtype"]), \
            int(manifest["val_start"])
    except (KeyError, TypeError, ValueError) as e:  # a hand-edited or damaged manifest
        raise UserError(f"{folder / MANIFEST} is damaged ({type(e).__name__}: {e}): prepare "
                        f"{folder} again") from None
    if not path.is_file() or path.stat().st_size != n * dtype.itemsize:
        raise UserError(f"{path} is missing or has the wrong size: prepare {folder} again")
    if not 0 <= cut <= n:
        raise UserError(f"{folder / MANIFEST} is damaged (val_start {cut} of {n} tokens): "
                        f"prepare {folder} again")
    ids = np.memmap(path, dtype=dtype, mode="r")
    return manifest, TokenStream(ids[:cut]), TokenStream(ids[cut:])


def token_counts(ids, vocab_size: int, chunk: int = 1 << 22) -> torch.Tensor:
    """How often each id occurs (V,), reading a memory-mapped stream a chunk at a time."""
    if isinstance(ids, TokenStream):
        counts = np.zeros(vocab_size, dtype=np.int64)
        for start in range(0, len(ids), chunk):
            counts += np.bincount(ids.array[start:start + chunk], minlength=vocab_size)
        return torch.from_numpy(counts)
    return torch.bincount(ids, minlength=vocab_size)
