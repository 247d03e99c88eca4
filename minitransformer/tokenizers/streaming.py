"""Text from a stream of generated token ids, piece by piece, never cutting a character."""

from __future__ import annotations


def stream_text(tokens, tokenizer):
    """Turn a stream of token ids (each (1, 1)) into text pieces, holding back a piece while
    it ends inside a multi-byte character (byte-level BPE splits UTF-8 sequences)."""
    ids, shown = [], ""
    for tok in tokens:
        ids.extend(tok[0].tolist())
        text = tokenizer.decode(ids)
        if text.endswith("\ufffd"):
            continue  # wait for the rest of the character
        yield text[len(shown):]
        shown = text
    text = tokenizer.decode(ids)
    if len(text) > len(shown):
        yield text[len(shown):]
