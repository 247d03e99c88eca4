"""Byte-pair encoding (Sennrich et al. 2016) through Hugging Face ``tokenizers``.

BPE starts from single characters (or bytes) and repeatedly merges the most frequent adjacent
pair into a new symbol until the vocabulary has ``vocab_size`` entries; frequent words become
one token, rare words split into pieces, so no word is ever out of vocabulary.

Two ways to cut text before the merges:

- ``byte_level=False`` (default): SentencePiece-style. Unicode NFC, spaces become the visible
  mark ``▁`` glued to the next word, punctuation stands alone. Characters never seen in
  training become ``<unk>``. Good for translation with a small vocabulary.
- ``byte_level=True``: GPT-2 style. Text is cut into UTF-8 bytes first, so any string
  encodes without ``<unk>`` and decodes back exactly.

Use::

    tok = BPETokenizer.train(texts, vocab_size=4000)      # specials <pad> <s> </s> <unk>
    ids = tok.encode("In the beginning")                  # [..] no specials added
    tok.decode(ids)                                       # "In the beginning"
    tok.pad_id, tok.bos_id, tok.eos_id                     # 0, 1, 2
    BPETokenizer.from_dict(tok.to_dict())                 # what tokenizer.json holds
    BPETokenizer.from_file("tokenizer.json")              # any Hugging Face tokenizer file
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ..errors import UserError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3 after training


class BPETokenizer:
    """A thin, documented wrapper around a Hugging Face ``tokenizers.Tokenizer``."""

    kind = "bpe"

    def __init__(self, tokenizer: Tokenizer):
        self.hf = tokenizer

    # ---- building ---------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int,
              special_tokens: Iterable[str] = SPECIAL_TOKENS, byte_level: bool = False,
              min_frequency: int = 2) -> BPETokenizer:
        """Learn merges from ``texts`` until the vocabulary holds ``vocab_size`` entries.

        Special tokens take the first ids, in the order given. A vocabulary smaller than the
        alphabet keeps just the alphabet (the trainer never drops characters).
        """
        special_tokens = list(special_tokens)
        unk = "<unk>" if "<unk>" in special_tokens and not byte_level else None
        tok = Tokenizer(models.BPE(unk_token=unk))
        if byte_level:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            alphabet = pre_tokenizers.ByteLevel.alphabet()
        else:
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
                pre_tokenizers.Punctuation(behavior="isolated")])
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
            alphabet = []
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=special_tokens, initial_alphabet=alphabet,
                                      show_progress=False)
        texts = list(texts)
        tok.train_from_iterator(texts, trainer, length=len(texts))
        return cls(tok)

    @classmethod
    def from_file(cls, path) -> BPETokenizer:
        """Load a Hugging Face ``tokenizer.json`` (e.g. GPT-2's)."""
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exceptions
            raise UserError(f"cannot read the tokenizer {path}: {e}") from None

    # ---- using ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no special tokens are added."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for many texts at once (parallel in Rust)."""
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens (<pad>, <s>, ...) are left out unless asked for."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def tokens(self, text: str) -> list[str]:
        """The pieces ``text`` is cut into (``▁`` marks a preceding space)."""
        return self.hf.encode(text, add_special_tokens=False).tokens

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.hf.id_to_token(int(i))

    @property
    def pad_id(self) -> int | None:
        return self.hf.token_to_id("<pad>")

    @property
    def bos_id(self) -> int | None:
        return self.hf.token_to_id("<s>")

    @property
    def eos_id(self) -> int | None:
        return self.hf.token_to_id("</s>")

    @property
    def unk_id(self) -> int | None:
        return self.hf.token_to_id("<unk>")

    # ---- saving -----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """{"type": "bpe", "tokenizer": the Hugging Face JSON string} (a checkpoint's file)."""
        return {"type": self.kind, "tokenizer": self.hf.to_str()}

    @classmethod
    def from_dict(cls, d: dict) -> BPETokenizer:
        try:
            return cls(Tokenizer.from_str(d["tokenizer"]))
        except Exception as e:  # noqa: BLE001
            raise UserError(f"cannot rebuild the BPE tokenizer: {e}") from None

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)
