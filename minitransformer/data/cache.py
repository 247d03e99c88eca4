"""The implicit cache: where ``train --data file.txt`` keeps the shards it prepared.

    CACHE/                      $MINITRANSFORMER_CACHE, else $XDG_CACHE_HOME/minitransformer,
                                else ~/.cache/minitransformer
    CACHE/tokens/KEY/           one DATA_DIR (tokens.bin, tokenizer.json, manifest.json)

KEY is a hash of what decides the shards: each source's fingerprint (absolute path, size,
SHA-256), the tokenizer asked for (kind, vocabulary size, how the text is read; or a given
tokenizer, a run's own, with ``SEPARATOR_VERSION``: how documents and separators encode), the
family's special tokens and separator, the shard format version and ``FIT_VERSION`` (how
tokenizers are fitted: raised when a fit changes, e.g. character-initial BPE's character
coverage). The
same file trained on again finds its folder; a changed file, another tokenizer or another
family gets a new one.
``prepare --clear_cache`` removes CACHE with ``clear_cache``.

``prepare_cached`` reads the sources as ``train`` always read a text file (``load_text``,
``normalize_newlines``; the tokenizer fitted on the whole text: the sorted alphabet or
``fit_tokenizer``'s BPE), so a run from the cache has the losses of the in-memory path.
Under torchrun each machine's local rank 0 prepares (holding ``KEY.lock``) while the other
ranks wait for the manifest. ``check_sources`` tells a resumed run that its text moved or
changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import UserError
from ..io import atomic_write_json, read_json_object
from ..tokenizers import CharTokenizer
from ..tokenizers.fitting import GPT_SPECIALS, fit_bpe_lines
from .prepare import CHAR_SEPARATOR, DEFAULT_BPE_SAMPLE, char_alphabet, default_workers
from .reading import BLOCK_BYTES, sample_lines
from .shards import (
    FORMAT_VERSION,
    MANIFEST,
    TOKENIZER,
    is_intact,
    is_prepared,
    split_note,
    write_stream,
)
from .sources import (
    Document,
    check_text_field,
    fingerprint,
    has_records,
    is_json_lines,
    read_documents,
    source_files,
)
from .text import BUNDLED, load_text, normalize_newlines

try:
    import fcntl
except ImportError:  # Windows: no lock (torchrun's ranks still wait for local rank 0)
    fcntl = None

ENV = "MINITRANSFORMER_CACHE"
TOKENS_DIR = "tokens"
WORKERS_FROM = 32_000_000  # bytes of text from which encoding uses prepare's worker processes
NOTE = "cache.json"  # beside the shards: what was asked for, and the CRLF count
FIT_VERSION = 6  # part of the key: raise it when a tokenizer kind fits other merges
# part of the key of a given tokenizer's folders (a run's own, a Hugging Face folder's): raise
# it when documents and their separator encode to other ids. 2: a separator of special tokens
# goes in as their ids, each document encoded alone (a Llama tokenizer's ids changed)
SEPARATOR_VERSION = 2


def cache_root() -> Path:
    """The cache folder: $MINITRANSFORMER_CACHE, $XDG_CACHE_HOME/minitransformer, or
    ~/.cache/minitransformer (nothing is created here)."""
    moved = os.environ.get(ENV)
    if moved:
        return Path(moved).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "minitransformer"


def cache_key(fingerprints: list[dict], tokenizer: dict, family: dict, version: int) -> str:
    """A short hash of everything that decides a prepared folder's bytes.

    ``fingerprints``: each source's {path, bytes, sha256}; ``tokenizer``: what was asked for
    (kind, vocab size, newline handling ...); ``family``: its name, special tokens and
    separator; ``version``: the shard format."""
    spec = {"sources": [{k: f[k] for k in ("path", "bytes", "sha256")} for f in fingerprints],
            "tokenizer": tokenizer, "family": family, "version": version}
    blob = json.dumps(spec, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:24]


def cache_dir(fingerprints: list[dict], tokenizer: dict, family: dict, version: int) -> Path:
    """The DATA_DIR in the cache for these sources, tokenizer, family and format."""
    return cache_root() / TOKENS_DIR / cache_key(fingerprints, tokenizer, family, version)


def _size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total


def clear_cache(echo=print) -> int:
    """Remove the cache folder; says what it freed. Returns the bytes freed (0 if none)."""
    root = cache_root()
    if not root.exists():
        echo(f"the cache {root} is empty: nothing to remove")
        return 0
    if not root.is_dir():
        raise UserError(f"the cache {root} is a file, not a folder (set ${ENV} elsewhere)")
    freed = _size(root)
    try:
        shutil.rmtree(root)
    except OSError as e:
        raise UserError(f"cannot remove the cache {root}: {e.strerror}") from None
    echo(f"removed the cache {root}: {freed / 1e6:,.1f} MB freed")
    return freed


# ---- preparing into the cache (train --data file.txt) -------------------------------------

@dataclass
class Cached:
    """A DATA_DIR in the cache: where it is, the CRLF line ends read as \\n, whether it was
    there already."""

    folder: Path
    crlf: int
    reused: bool


def recorded_source(sources: list[str]) -> str | list[str]:
    """What a run records as its data: bundled names as they are, paths and globs absolute
    (so --resume and evaluate find them from any folder); one source stays a string."""
    out = [s if s in BUNDLED else os.path.abspath(s) for s in sources]
    return out[0] if len(out) == 1 else out


def read_texts(files: list[Path], encoding: str, newline: str, counted: list[int],
               progress=None, text_field: str = "text"):
    """The documents as ``train`` reads them: a text file whole (``load_text``: empty,
    binary and undecodable files refused), JSONL and tables a row each (its ``text_field``);
    line ends as ``normalize_newlines`` leaves them (``counted`` gets each one's CR count)."""
    for path in files:
        if has_records(path):
            docs = read_documents([path], text_field, encoding=encoding)
        else:
            docs = [Document(load_text(str(path), encoding, len(files) > 1), str(path))]
        for doc in docs:
            text, crs = normalize_newlines(doc.text, newline)
            counted.append(crs)
            yield Document(text, doc.where)
        if progress is not None:
            progress(path.stat().st_size)


def _fit(files, encoding, newline, kind, vocab, special_tokens, tokenizer, text_field):
    """(tokenizer, CR count): ``train``'s own fit (the sorted alphabet; BPE on every line as
    ``fit_tokenizer`` on the whole text, or on prepare's spread sample beyond
    ``DEFAULT_BPE_SAMPLE`` bytes), or a run's ``tokenizer`` checked on the text."""
    counted: list[int] = []
    docs = read_texts(files, encoding, newline, counted, text_field=text_field)
    if tokenizer is not None and tokenizer.kind == "char":
        known = set(tokenizer.chars)
        for doc in docs:
            if not set(doc.text) <= known:
                tokenizer.encode(doc.text)  # raises UnknownCharactersError, naming them
    elif tokenizer is not None:
        for _ in docs:
            pass
    elif kind == "char":  # prepare's own pass: every character, sorted by code point
        tokenizer = CharTokenizer(char_alphabet(_blocks(docs))[0])
    else:  # every line up to DEFAULT_BPE_SAMPLE bytes: fit_tokenizer's fit on the whole text
        total = sum(p.stat().st_size for p in files)
        lines, head, n = sample_lines(_blocks(docs), total, DEFAULT_BPE_SAMPLE)
        if n == 0:
            raise UserError("the sources hold no text: nothing to prepare")
        tokenizer = fit_bpe_lines(kind, lines, head, vocab, special_tokens or GPT_SPECIALS)
    return tokenizer, sum(counted)


def _blocks(docs, size: int = BLOCK_BYTES):
    """(starts a document, text, its size) in blocks of ``size`` characters: the BPE sample
    keeps or skips a block's lines at a time, and the encoder cuts a piece per block, so a
    document is never one block."""
    for doc in docs:
        for start in range(0, max(len(doc.text), 1), size):
            piece = doc.text[start:start + size]
            yield start == 0, piece, len(piece)


def _waiting_rank() -> bool:
    """Whether this process is one of torchrun's ranks that wait while local rank 0
    prepares (each machine's rank 0 prepares into its own cache folder)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and \
        os.environ.get("LOCAL_RANK", "0") != "0"


@contextlib.contextmanager
def _locked(folder: Path):
    """Hold ``folder``'s lock file (two runs, or two machines sharing the cache, prepare one
    folder once); a no-op where ``fcntl`` is missing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


def prepare_cached(sources: list[str], family: dict, kind: str, vocab: int | None = None,
                   encoding: str = "utf-8", newline: str = "normalize", tokenizer=None,
                   echo=print, say_reused: bool = True, text_field: str = "text") -> Cached:
    """The cache's DATA_DIR for ``sources`` read as ``train`` reads them, prepared now unless
    it is there. ``family``: {name, special_tokens, separator (between BPE documents)};
    ``tokenizer``: a run's own (resume, evaluate, --init_from) instead of a fresh fit;
    ``say_reused``: whether to say that the folder was there; ``text_field``: the field of
    JSONL records and table rows that holds the text (part of the key when not "text")."""
    files = source_files(sources, echo)
    check_text_field(files, text_field)
    prints = fingerprint(files)
    asked = {"kind": kind, "vocab_size": vocab, "sample": DEFAULT_BPE_SAMPLE * (kind != "char"),
             "fit": FIT_VERSION} \
        if tokenizer is None else \
        {"json": hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True)
                                .encode("utf-8")).hexdigest(), "separator": SEPARATOR_VERSION}
    read = {"encoding": encoding, "newline": newline}
    if text_field != "text":  # the key of a default read stays what it was
        read["text_field"] = text_field
    if any(p.suffix.lower() != ".jsonl" and is_json_lines(p) for p in files):
        read["json_lines"] = 1  # .json / .ndjson, read as text before they were records
    folder = cache_dir(prints, {**asked, **read}, family, FORMAT_VERSION)
    if _waiting_rank():
        while not is_intact(folder):  # rank 0 may be making it, or remaking a damaged one
            time.sleep(0.2)
        return Cached(folder, _crlf(folder), True)
    with _locked(folder):
        if is_intact(folder):
            if say_reused:
                echo(f"using the prepared cache {folder}")
                if note := split_note(read_json_object(folder / MANIFEST)):
                    echo(note)  # as when it was prepared: the split is this run's too
            return Cached(folder, _crlf(folder), True)
        if is_prepared(folder):  # a cache, not the user's: made again, not an error
            echo(f"note: the prepared cache {folder} is damaged; preparing it again")
            shutil.rmtree(folder)
        fitted, crlf = _fit(files, encoding, newline, kind, vocab,
                            tuple(family.get("special_tokens", ())), tokenizer, text_field)
        separator = CHAR_SEPARATOR if fitted.kind == "char" else family.get("separator", "")
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / NOTE, {"sources": sources, "crlf": crlf})
        total = sum(p.stat().st_size for p in files)
        with tqdm(total=total, unit="B", unit_scale=True,
                  desc="prepare", disable=not sys.stderr.isatty() or None) as bar:
            texts = read_texts(files, encoding, newline, [], bar.update, text_field)
            blocks = ((first, piece.encode("utf-8", "surrogatepass"))  # pieces are cut in
                      for first, piece, _ in _blocks(texts))        # blocks, not whole files
            workers = default_workers() if total > WORKERS_FROM else 1  # spawning costs
            manifest = write_stream(blocks, fitted, folder, prints, separator=separator,
                                    workers=workers)
    echo(f"prepared {manifest['tokens']:,} tokens of {', '.join(sources)} into {folder}; "
         f"reusing it next time")
    if note := split_note(manifest):
        echo(note)
    return Cached(folder, crlf, False)


def _crlf(folder: Path) -> int:
    try:
        return int(read_json_object(folder / NOTE).get("crlf", 0))
    except (UserError, TypeError, ValueError):
        return 0


def find_cached(key: str | None, tokenizer) -> Cached | None:
    """The cached folder a run recorded (``cache`` in its config.json), if it is still there
    and holds the run's tokenizer; else None (it is prepared again)."""
    if not key:
        return None
    folder = cache_root() / TOKENS_DIR / key
    if not is_intact(folder):
        return None
    try:
        if read_json_object(folder / TOKENIZER) != tokenizer.to_dict():
            return None
    except UserError:
        return None
    return Cached(folder, _crlf(folder), True)


def check_sources(data: dict, sources: list[str]) -> None:
    """The sources a run recorded are where they were, as they were; else a UserError naming
    the one that moved or changed (and --data to point at it)."""
    recorded = data.get("sources")
    if not recorded:
        return  # a run from before fingerprints were recorded
    try:
        files = source_files(sources)
    except UserError:
        if all(Path(s).exists() or s in BUNDLED for s in sources):  # there, but not readable
            raise
        raise UserError(f"this run was trained on {', '.join(sources)}, which is not there "
                        f"any more (moved?); pass --data to point at it") from None
    now = fingerprint(files)
    old_paths = [r.get("path") for r in recorded]
    for path in old_paths:
        if path not in {n["path"] for n in now}:
            if path and Path(path).is_file():  # there, but a folder no longer reads it
                raise UserError(f"this run was trained on {path}, which its folder no longer "
                                f"reads (hidden files and the runs, models and prepared data "
                                f"inside a folder are skipped); pass --data naming the files "
                                f"it was trained on")
            raise UserError(f"this run was trained on {path}, which is not there any more; "
                            f"pass --data to point at it")
    for old, new in zip(recorded, now, strict=False):
        if (old.get("bytes"), old.get("sha256")) != (new["bytes"], new["sha256"]):
            size = f"{old.get('bytes')} bytes then, {new['bytes']} now" \
                if old.get("bytes") != new["bytes"] else "another SHA-256"
            raise UserError(f"{new['path']} changed since this run was trained on it ({size}); "
                            f"pass --data to point at the text it was trained on")
    if len(now) != len(recorded):
        raise UserError(f"{', '.join(sources)} now holds {len(now)} files, the run was trained "
                        f"on {len(recorded)}; pass --data to point at the text it was "
                        f"trained on")
