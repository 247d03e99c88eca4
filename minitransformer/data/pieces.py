"""Where a text may be cut into pieces that encode, one by one, to the ids of the whole.

    (starts a document, UTF-8 bytes) blocks -> cut_pieces -> (starts a document, piece)

A byte-level BPE's pre-tokenizer (GPT-2's pattern) never joins two sides of a newline that
stands between two non-space characters; a line-splitting one never joins across a newline;
characters join nothing. Cutting there changes no id (``tests/test_prepare_pipeline.py``
checks the pieces' ids against the whole text's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def cut_mode(tokenizer) -> str:
    """Where ``tokenizer``'s pieces may be cut (``safe_cut``'s mode)."""
    if tokenizer.kind == "char":
        return "any"
    return {"bytes": "bytes", "chars": "lines"}.get(tokenizer.mode, "never")


_ASCII_SPACE = frozenset(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")  # str.isspace in ASCII


def _char_end(data: bytes) -> int:
    """The end of the last whole UTF-8 character of ``data``."""
    k = len(data)
    while k > 0 and len(data) - k < 3 and data[k - 1] & 0xC0 == 0x80:
        k -= 1  # back over continuation bytes
    if k == 0:
        return 0
    lead = data[k - 1]
    need = 0 if lead < 0x80 else 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3
    return len(data) if len(data) - k >= need else k - 1


def safe_cut(data: bytes, mode: str) -> int:
    """The last position where UTF-8 ``data`` can be cut without changing its ids (0: none).

    "any": characters, between any two. "lines": after a newline (a pre-tokenizer splitting
    at line ends). "bytes": GPT-2's pattern; after a newline between two ASCII non-space
    characters, where the pattern always ends one piece and starts the next (a byte >= 0x80
    might be a space such as U+00A0, so it is never taken). "never": another pre-tokenizer."""
    if mode == "any":
        return _char_end(data)
    if mode == "lines":
        return data.rfind(b"\n") + 1
    if mode == "never":
        return 0
    end = len(data) - 1
    while True:
        i = data.rfind(b"\n", 0, end)
        if i <= 0:
            return 0
        before, after = data[i - 1], data[i + 1]
        if before < 0x80 and after < 0x80 and before not in _ASCII_SPACE and \
                after not in _ASCII_SPACE:
            return i + 1
        end = i


def cut_pieces(blocks: Iterable[tuple[bool, bytes]], mode: str, separator: bytes,
               size: int) -> Iterator[tuple[bool, bytes]]:
    """(starts a document, piece) from (starts a document, UTF-8 bytes) blocks: each
    document (``separator`` before every one but the first) in pieces of about ``size``
    bytes, cut only where ``safe_cut`` allows (or at 8 ``size`` when there is no such place,
    at a character's end)."""
    parts: list[bytes] = []
    n, flag, started = 0, False, False
    for new_doc, data in blocks:
        if new_doc:
            if started:
                yield flag, b"".join(parts)
            parts, flag = ([separator] if started and separator else []), True
            n, started = len(separator) if parts else 0, True
        if data:
            parts.append(data)
            n += len(data)
        if n >= size:
            buf = b"".join(parts)
            cut = safe_cut(buf, mode) or (_char_end(buf) if len(buf) >= 8 * size else 0)
            parts = [buf[cut:]] if cut else [buf]
            if cut:
                yield flag, buf[:cut]
                flag, n = False, len(buf) - cut
    if started:
        yield flag, b"".join(parts)
