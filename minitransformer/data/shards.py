"""Prepared corpora: a token stream written once to disk, read back as a memory map.

    DATA_DIR/tokens.bin      every token id of the corpus, flat, uint16 (or uint32 when the
                             vocabulary does not fit), documents in input order
    DATA_DIR/tokenizer.json  the tokenizer that made them
    DATA_DIR/manifest.json   format version, dtype, token and document counts, where the val
                             split starts, per-token counts, the sources and their fingerprints

The val split is the last ``val_fraction`` of the ids (nanoGPT's and ``split_ids``' split) for
one document; for several, it starts at the first document boundary at or after that point,
so no document is cut in two (the last document always goes to val). ``manifest.json`` is
written last, atomically: a folder without it is an unfinished prepare and is never read.

Training reads random windows through ``TokenStream`` (no copy of the corpus in memory, and
every process under torchrun maps the same file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..io import atomic_write_json, read_json_object

FORMAT_VERSION = 1
MANIFEST, TOKENS, TOKENIZER = "manifest.json", "tokens.bin", "tokenizer.json"
CHUNK_CHARS = 1 << 22  # about 4 MB of text per encoding step


def is_prepared(path) -> bool:
    """Whether ``path`` is a DATA_DIR written by ``prepare`` (a complete one)."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


# ---- encoding --------------------------------------------------------------------------------

def char_table(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(sorted code points, their ids) of a char tokenizer, for vectorised encoding."""
    codes = np.array([ord(c) for c in tokenizer.chars], dtype=np.uint32)
    order = np.argsort(codes)
    return codes[order], order.astype(np.int64)


def encode_chars(text: str, table) -> np.ndarray:
    """Char ids of ``text`` without a Python loop per character (a code-point array looked up
    in the sorted alphabet); an unseen character is a UserError naming it."""
    codes, ids = table
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    pos = np.searchsorted(codes, points).clip(max=len(codes) - 1)
    bad = codes[pos] != points
    if bad.any():
        raise UserError(f"the text has a character the tokenizer never saw: "
                        f"{chr(int(points[bad][0]))!r}")
    return ids[pos]


def encode_text(tokenizer, text: str, table=None) -> np.ndarray:
    if table is not None:
        return encode_chars(text, table)
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def _chunks(text: str) -> Iterator[str]:
    """Pieces of about CHUNK_CHARS characters, cut after a newline where there is one."""
    start = 0
    while start < len(text):
        end = min(len(text), start + CHUNK_CHARS)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut > start else end
        yield text[start:end]
        start = end


# ---- writing and reading -----------------------------------------------------------------

def write_shards(documents, tokenizer, out_dir, sources: list[dict], val_fraction: float = 0.1,
                 separator: str = "", progress=None) -> dict:
    """Encode ``documents`` (an iterable of Document) into ``out_dir``; returns the manifest.

    ``separator`` is text put between documents (an end-of-text token for BPE, e.g.)."""
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val_fraction must be in (0, 1), got {val_fraction}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # from now on the folder reads as unfinished
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    table = char_table(tokenizer) if getattr(tokenizer, "kind", "") == "char" else None
    counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    starts, n = [], 0
    tmp = out / f".{TOKENS}.tmp"
    with open(tmp, "wb") as f:
        for i, doc in enumerate(documents):
            starts.append(n)
            for piece in _chunks((separator if i and separator else "") + doc.text):
                ids = encode_text(tokenizer, piece, table)
                f.write(ids.astype(dtype).tobytes())
                counts += np.bincount(ids, minlength=tokenizer.vocab_size)
                n += len(ids)
                if progress is not None:
                    progress(len(piece.encode("utf-8")))
        f.flush()
        os.fsync(f.fileno())
    if n == 0:
        tmp.unlink(missing_ok=True)
        raise UserError("the sources hold no text: nothing to prepare")
    os.replace(tmp, out / TOKENS)
    atomic_write_json(out / TOKENIZER, tokenizer.to_dict())
    manifest = {"format": "minitransformer-tokens", "version": FORMAT_VERSION,
                "dtype": np.dtype(dtype).name, "tokens": n, "documents": len(starts),
                "val_start": val_start(n, starts, val_fraction), "val_fraction": val_fraction,
                "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                "counts": counts.tolist(), "sources": sources}
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def val_start(n: int, doc_starts: list[int], val_fraction: float) -> int:
    """Where the val split starts: split_ids' point for one document, else the first document
    boundary at or after it (the last document at least)."""
    point = int(n * (1 - val_fraction))
    if len(doc_starts) <= 1:
        return point
    after = [s for s in doc_starts[1:] if s >= point]
    return after[0] if after else doc_starts[-1]


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


def open_shards(data_dir) -> tuple[dict, TokenStream, TokenStream]:
    """(manifest, train ids, val ids) of a DATA_DIR, memory-mapped."""
    folder = Path(data_dir)
    manifest = read_json_object(folder / MANIFEST)
    if manifest.get("format") != "minitransformer-tokens" or \
            manifest.get("version") != FORMAT_VERSION:
        raise UserError(f"{folder / MANIFEST} is not a version {FORMAT_VERSION} token manifest "
                        f"(prepare it again)")
    path = folder / TOKENS
    expected = manifest["tokens"] * np.dtype(manifest["dtype"]).itemsize
    if not path.is_file() or path.stat().st_size != expected:
        raise UserError(f"{path} is missing or has the wrong size: prepare {folder} again")
    ids = np.memmap(path, dtype=manifest["dtype"], mode="r")
    cut = manifest["val_start"]
    return manifest, TokenStream(ids[:cut]), TokenStream(ids[cut:])


def token_counts(ids, vocab_size: int, chunk: int = 1 << 22) -> torch.Tensor:
    """How often each id occurs (V,), reading a memory-mapped stream a chunk at a time."""
    if isinstance(ids, TokenStream):
        counts = np.zeros(vocab_size, dtype=np.int64)
        for start in range(0, len(ids), chunk):
            counts += np.bincount(ids.array[start:start + chunk], minlength=vocab_size)
        return torch.from_numpy(counts)
    return torch.bincount(ids, minlength=vocab_size)
