"""Corpora, the train/val split and batches of random windows (as nanoGPT samples them)."""

from __future__ import annotations

import codecs
from importlib import resources
from pathlib import Path

import torch

from ..errors import UserError

BUNDLED = {
    "shakespeare": "shakespeare.txt",  # Tiny Shakespeare (public domain)
    "tang": "tang.txt",  # Tang and Song poems (public domain)
    "sayings": "sayings.txt",  # Chinese sayings and classics (public domain)
    "bible_en_es": "bible_en_es.tsv",  # English-Spanish parallel Bible (public domain)
}


def corpus_path(source: str) -> Path:
    """A bundled corpus name (shakespeare, tang, sayings, ...) or a file path."""
    if source in BUNDLED:
        return Path(str(resources.files("minitransformer.corpora").joinpath(BUNDLED[source])))
    path = Path(source)
    if not path.exists():
        raise UserError(f"no such file: {source} (bundled corpora: {', '.join(BUNDLED)})")
    if path.is_dir():
        raise UserError(f"{source} is a folder; pass a text file")
    return path


COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
              b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}  # magic bytes -> format


def compression(head: bytes) -> str | None:
    """The compressed format a file's first bytes announce, or None."""
    return next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)


def refuse_compressed(path, head: bytes | None = None) -> None:
    """A compressed file is not read through its compression: say so, not "binary".
    ``head``: its first bytes, read here when not given (an unreadable file passes: the
    reading says why)."""
    if head is None:
        try:
            with open(path, "rb") as f:
                head = f.read(8)
        except OSError:
            return
    kind = compression(head)
    if kind is not None:
        raise UserError(f"{path} is {kind}-compressed; decompress it first and pass the text "
                        f"(or JSONL) inside")


def wide_encoding(encoding: str) -> bool:
    """Whether text in ``encoding`` holds NUL bytes (UTF-16, UTF-32); an unknown encoding is
    said where the text is decoded."""
    try:
        return codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))
    except LookupError:
        return False


def looks_binary(raw: bytes) -> bool:
    """Whether bytes have a NUL in their first 64 KiB (an image, an archive, a model's
    weights): text in a one-byte or UTF-8 encoding never holds one."""
    return b"\x00" in raw[:65536]


def refuse_binary(source, raw: bytes) -> None:
    """A UserError for bytes that ``looks_binary``."""
    if not looks_binary(raw):
        return
    hint = " (UTF-16 text? pass --encoding utf-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") \
        else f" (UTF-16 text without a byte-order mark? pass --encoding {wide})" \
        if (wide := _utf16_order(raw[:4096])) else \
        "; leave it out of --data (a glob such as 'FOLDER/**/*.txt' names only the text)"
    raise UserError(f"{source} looks like a binary file (it holds NUL bytes), not text{hint}")


def _utf16_order(head: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" where ``head`` reads as such text, else None. Its ASCII
    characters (spaces, line ends) put their NUL bytes second (LE) or first (BE), and the
    whole decodes to printable characters and whitespace, as binary data almost never does."""
    head = head[:len(head) // 2 * 2]
    name = "utf-16-le" if head[1::2].count(0) > head[0::2].count(0) else "utf-16-be"
    text = head.decode(name, errors="replace")
    good = sum(ch.isprintable() or ch in "\n\r\t" for ch in text)
    return name if text and good >= 0.98 * len(text) else None


def same_encoding(a: str, b: str) -> bool:
    """Whether two names are one codec (utf8, UTF-8 and utf-8 are; gbk and cp936 are not)."""
    try:
        return codecs.lookup(a).name == codecs.lookup(b).name
    except LookupError:
        return a == b


def check_encoding_applies(sources: str | list[str], encoding: str | None) -> None:
    """--encoding reads the user's own text files: a bundled corpus is the package's UTF-8
    text, and a prepared folder holds token ids, decoded when it was prepared."""
    if encoding is None:
        return
    try:
        utf8 = codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    if utf8:
        return
    from .shards import is_prepared  # shards reads text too: imported here, not at the top

    for source in [sources] if isinstance(sources, str) else sources:
        if source in BUNDLED:
            raise UserError(f"--encoding {encoding}: {source} is a bundled corpus, stored as "
                            f"utf-8; --encoding is for your own files")
        if is_prepared(source):
            raise UserError(f"--encoding {encoding}: {source} holds prepared token ids, "
                            f"decoded when it was prepared (prepare --encoding)")


def load_text(source: str, encoding: str = "utf-8", empty_ok: bool = False) -> str:
    """Read a corpus as text, refusing empty (unless ``empty_ok``: one file of several, an
    empty document as prepare reads it), binary and wrongly decoded files with a message."""
    path = corpus_path(source)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {source}: {e.strerror}") from None
    if not raw.strip() and not empty_ok:
        raise UserError(f"{source} is empty (or only whitespace): it holds no text")
    try:
        wide = codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    refuse_compressed(source, raw[:8])
    if not wide:
        refuse_binary(source, raw)
    try:
        text = raw.decode(encoding)
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    except UnicodeDecodeError as e:
        advice = "if it is GBK, Latin-1 or another encoding, pass --encoding, e.g. --encoding " \
            "gbk" if codecs.lookup(encoding).name == "utf-8" else \
            "pass the file's own encoding with --encoding (utf-8, gbk, big5, latin-1, ...)"
        raise UserError(f"{source} is not valid {encoding} (byte {e.start}); {advice}") \
            from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


def normalize_newlines(text: str, mode: str = "normalize") -> tuple[str, int]:
    """(text, how many CRLF / CR line ends became '\n'); mode "keep" leaves the text as is.

    Windows files end lines with '\r\n'; kept, the '\r' becomes a vocabulary entry that
    the model must learn to emit before every newline."""
    if mode == "keep":
        return text, 0
    if mode != "normalize":
        raise UserError(f"--newline must be normalize or keep, got {mode!r}")
    n = text.count("\r")
    return (text.replace("\r\n", "\n").replace("\r", "\n") if n else text), n


def split_ids(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """First 90% for training, the last 10% for validation (nanoGPT's split)."""
    n = int(len(ids) * (1 - val_fraction))
    return ids[:n], ids[n:]


def check_length(train: torch.Tensor, val: torch.Tensor, block_size: int, source: str) -> None:
    need = block_size + 1
    for name, part in (("training", train), ("validation", val)):
        if len(part) < need:
            raise UserError(
                f"{source} is too short: its {name} part has {len(part)} tokens but a window "
                f"of block_size + 1 = {need} is needed; use a longer text (or, to train, "
                f"a smaller --block_size)")


def get_batch(data: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator | None = None):
    """batch_size random windows: x (B, T) and targets y (B, T) shifted by one token."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = torch.arange(block_size + 1)  # (T+1,)
    windows = data[starts[:, None] + offsets]  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]  # (B, T), (B, T)
