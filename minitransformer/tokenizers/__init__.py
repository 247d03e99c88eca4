"""Tokenizers: ``CharTokenizer`` (ours); subword ones come from Hugging Face ``tokenizers``."""

import json

from ..errors import UserError
from .bpe import BPETokenizer
from .char import CharTokenizer, UnknownCharactersError
from .fitting import DEFAULT_BPE_VOCAB, TOKENIZERS, fit_tokenizer


def tokenizer_from_dict(d: dict):
    """Rebuild a tokenizer saved by ``save`` (its ``type`` field picks the class)."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char":
        return CharTokenizer.from_dict(d)
    if kind == "bpe":
        return BPETokenizer.from_dict(d)
    raise UserError(f"unknown tokenizer type {kind!r} in tokenizer.json")


def load_tokenizer(path):
    try:
        with open(path, encoding="utf-8") as f:
            return tokenizer_from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot read the tokenizer {path}: {e}") from None


__all__ = ["DEFAULT_BPE_VOCAB", "TOKENIZERS", "BPETokenizer", "CharTokenizer",
           "UnknownCharactersError", "fit_tokenizer", "load_tokenizer", "tokenizer_from_dict"]
