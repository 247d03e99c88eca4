"""Text from a stream of generated token ids, piece by piece, never cutting a character.

What new ids add to a text is decoded after the last ids of the prompt they continue (or a
probe token), whose text is then cut off (``continuation``): a SentencePiece-style decoder
(Llama 1-2's, Mistral's) drops the space a text's first token begins with, so ``▁is`` decoded
alone is ``is``, while after ``The model`` it is `` is``, and after a prompt of ``<s>`` alone
(no text) it is ``is`` again. transformers' text-generation pipeline decodes the prompt and
its continuation together and cuts the prompt's text off, to the same effect.
"""

from __future__ import annotations

import weakref

PROBES = ("a", "0", ".", "\u7684")  # texts that are one ordinary token in most vocabularies
CONTEXT = 4  # prompt ids decoded before new ones: enough for a decoder's view of a boundary
_probes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _probe(tokenizer) -> list[int]:
    """Ids of the first of ``PROBES`` that decodes back to itself ([] where none does)."""
    if tokenizer not in _probes:
        found: list[int] = []
        for text in PROBES:
            try:
                ids = tokenizer.encode(text)
            except Exception:  # noqa: BLE001 - a character the tokenizer never saw
                continue
            if ids and tokenizer.decode(ids) == text:
                found = ids
                break
        _probes[tokenizer] = found
    return _probes[tokenizer]


def continuation(tokenizer, ids, before=None) -> str:
    """The text ``ids`` add after the text before them (their leading space kept): after
    ``before`` (the prompt's ids; its last ``CONTEXT``) where given, else after a probe."""
    ids = [int(i) for i in ids]
    probe = [int(i) for i in before[-CONTEXT:]] if before is not None else _probe(tokenizer)
    if not probe:
        return tokenizer.decode(ids)
    head, text = tokenizer.decode(probe), tokenizer.decode([*probe, *ids])
    return text[len(head):] if text.startswith(head) else tokenizer.decode(ids)


def stream_text(tokens, tokenizer, prompt=None):
    """Turn a stream of token ids (each (1, 1)) into text pieces, holding back a piece while
    it ends inside a multi-byte character (byte-level BPE splits UTF-8 sequences);
    ``prompt``: the ids they continue."""
    ids, shown = [], ""
    for tok in tokens:
        ids.extend(tok[0].tolist())
        text = continuation(tokenizer, ids, prompt)
        if text.endswith("\ufffd"):
            continue  # wait for the rest of the character
        yield text[len(shown):]
        shown = text
    text = continuation(tokenizer, ids, prompt)
    if len(text) > len(shown):
        yield text[len(shown):]
