"""Character-level tokenizer: one id per distinct Unicode character of the corpus."""

from __future__ import annotations

import json

from ..errors import UserError


class UnknownCharactersError(UserError):
    """Text holds characters the tokenizer was never fitted on."""


class CharTokenizer:
    """Maps each character of a fixed alphabet to an id (ids follow sorted code points)."""

    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        if len(set(self.chars)) != len(self.chars) or not all(len(c) == 1 for c in self.chars):
            raise ValueError("a char tokenizer needs distinct single characters")
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of ``text`` that are not in the alphabet, in order of use."""
        return list(dict.fromkeys(ch for ch in text if ch not in self.stoi))

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            shown = ", ".join(repr(ch) for ch in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            crlf = "; '\\r' is half of a Windows line end: end lines with \\n alone, as the " \
                "training text was read" if "\r" in missing else ""
            raise UnknownCharactersError(
                f"the text has {len(missing)} character(s) this model never saw in training: "
                f"{shown}{more}{crlf}")
        return [self.stoi[ch] for ch in text]

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids (no special tokens begin a text). Where the alphabet has no '\\r',
        the training text's line ends were read as '\\n' (or it had no others): a prompt's
        Windows line ends ('\\r\\n', or a lone '\\r') are read so too, not refused."""
        if "\r" in text and "\r" not in self.stoi:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return self.encode(text)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"type": self.kind, "chars": self.chars}

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        return cls(d["chars"])
