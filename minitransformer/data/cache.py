"""The implicit cache: where ``train --data file.txt`` keeps the shards it prepared.

    CACHE/                      $MINITRANSFORMER_CACHE, else $XDG_CACHE_HOME/minitransformer,
                                else ~/.cache/minitransformer
    CACHE/tokens/KEY/           one DATA_DIR (tokens.bin, tokenizer.json, manifest.json)

KEY is a hash of what decides the shards: each source's fingerprint (absolute path, size,
SHA-256), the tokenizer asked for (kind, vocabulary size, how the text is read), the family's
special tokens and separator, and the shard format version. The same file trained on again
finds its folder; a changed file, another tokenizer or another family gets a new one.
``prepare --clear_cache`` removes CACHE with ``clear_cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..errors import UserError

ENV = "MINITRANSFORMER_CACHE"
TOKENS_DIR = "tokens"


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
