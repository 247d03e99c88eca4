"""One choice of a completion as it grows: its text, its stop strings, its log-probabilities.

Text leaves in whole characters only (byte-level BPE can split one), and never while it may
turn out to be the start of a stop string: a streamed chunk never shows text that a later
token would have cut away. A token's log-probability entry leaves with the chunk that
completes its text.

Where the tokenizer knows each token's bytes (our BPE), the tokens' bytes run through one
UTF-8 decoder: it tells a character still being spelled from bytes that can never form one
(shown as U+FFFD, as decoding shows them, and shown at once). A token's ``text_offset`` is the
length of the text decoded before it, so a token that ends or continues a character is placed
at that character. A token holding only part of a character is named ``bytes:\\xe4\\xbb`` in
``tokens`` and ``top_logprobs``, as OpenAI names such tokens.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

import torch

from ..tokenizers.streaming import continuation


def token_bytes(tokenizer, token: int) -> bytes | None:
    """The bytes ``token`` stands for, where the tokenizer can say (else None)."""
    if not hasattr(tokenizer, "token_bytes"):
        return None
    data = tokenizer.token_bytes(token)
    return tokenizer.decode([token]).encode("utf-8") if data is None else data  # a special


def token_label(tokenizer, token: int, before: list[int] | None = None) -> str:
    """A token as logprobs name it: the text it adds after ``before`` (None: inside a text,
    after a probe; []: decoded alone, as the first word of a text), or ``bytes:\\xNN...`` when
    it holds only part of a character (decoding gives U+FFFD, the same for every such token),
    or its vocabulary entry for a special token that decoding drops."""
    # " s" for Llama's "▁s" inside a text; "s" as a text's first word
    text = continuation(tokenizer, [token], before)
    data = token_bytes(tokenizer, token) if "\ufffd" in text else None
    if data is not None:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    special = hasattr(tokenizer, "token_bytes") and tokenizer.token_bytes(token) is None
    if not text and special and hasattr(tokenizer, "id_to_token"):
        return tokenizer.id_to_token(token) or text
    return text


@dataclass
class TokenInfo:
    text: str  # the token as logprobs name it (``token_label``)
    start: int  # where its text begins in the completion
    logprob: float
    top: dict[str, float]
    end: int | None = None  # where it ends, once its character is whole


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest end of ``text`` that is the start of a stop string."""
    longest = max((len(s) for s in stops), default=0)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0


@dataclass
class Choice:
    """The state of one choice; ``add`` a token, then ``take`` what may be shown."""

    index: int
    stops: list[str]
    offset: int = 0  # text_offset of the completion's first character (the prompt's length)
    before: list[int] | None = None  # the prompt's ids, which the text continues
    ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far, whole characters
    sent: int = 0  # characters already handed out
    tokens: list[TokenInfo] = field(default_factory=list)
    tokens_sent: int = 0
    finish: str | None = None
    cut: int | None = None  # where a stop string begins

    utf8: codecs.IncrementalDecoder = field(  # is a character being spelled? (byte tokens)
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def add(self, token: int, logprobs: torch.Tensor | None, k: int, tokenizer) -> None:
        """One new token; ``logprobs`` (V,) when log-probabilities are asked for, with the
        ``k`` most likely tokens (and the one drawn, as OpenAI adds it) in ``top``."""
        self.ids.append(token)
        data, start = token_bytes(tokenizer, token), len(self.text)
        if data is not None:
            self.utf8.decode(data)
        if logprobs is not None:
            best = torch.topk(logprobs, min(k, logprobs.numel()))  # k = 0: the drawn one only
            pairs = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
            if token not in best.indices.tolist():
                pairs.append((token, float(logprobs[token])))
            # the first word of a text that has none yet (a prompt of <s> alone): named as it
            # reads there, without the leading space a SentencePiece decoder drops
            at_start = len(self.ids) == 1 and self.before is not None and \
                not tokenizer.decode(self.before)
            context = [] if at_start else None
            top = {token_label(tokenizer, i, context): v
                   for i, v in sorted(pairs, key=lambda p: -p[1])}
            self.tokens.append(TokenInfo(token_label(tokenizer, token, context), start,
                                         float(logprobs[token]), top))
        text = continuation(tokenizer, self.ids, self.before)  # Llama's ▁: its space kept
        spelling = bool(self.utf8.getstate()[0]) if data is not None else \
            text.endswith("\ufffd")
        if spelling:
            return  # the rest of the character is still to come
        self.text = text
        for t in self.tokens:
            if t.end is None:
                t.end = len(text)
        found = [i for i in (text.find(s, self.sent) for s in self.stops) if i >= 0]
        if found:
            self.cut, self.finish = min(found), "stop"

    def end(self, tokenizer, reason: str = "length") -> None:
        """No more tokens (max_tokens reached, or the model's end of text: ``reason``
        "stop"): what is left, an unfinished character too."""
        if self.finish is None:
            self.finish = reason
            self.text = continuation(tokenizer, self.ids, self.before)

    def take(self) -> tuple[str, list[TokenInfo]]:
        """The text and token entries that may be shown now (and are then counted as sent)."""
        if self.finish is not None:
            stop = len(self.text) if self.cut is None else self.cut
        else:
            stop = len(self.text) - held_back(self.text[self.sent:], self.stops)
        stop = max(stop, self.sent)
        piece, self.sent = self.text[self.sent:stop], stop
        ready = self.tokens_sent
        while ready < len(self.tokens):
            t = self.tokens[ready]
            done = t.end is not None and t.end <= self.sent
            if not done and not (self.finish is not None and t.start < stop):
                break
            ready += 1
        entries, self.tokens_sent = self.tokens[self.tokens_sent:ready], ready
        return piece, entries


def logprobs_body(entries: list[TokenInfo], offset: int) -> dict:
    """OpenAI's ``logprobs`` object of a completion choice (or of one streamed chunk)."""
    return {"tokens": [t.text for t in entries],
            "token_logprobs": [t.logprob for t in entries],
            "top_logprobs": [t.top for t in entries],
            "text_offset": [offset + t.start for t in entries]}
