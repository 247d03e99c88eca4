"""Byte-pair encoding (Sennrich et al. 2016) through Hugging Face ``tokenizers``.

BPE starts from single characters (or bytes) and repeatedly merges the most frequent adjacent
pair into a new symbol until the vocabulary has ``vocab_size`` entries; frequent words become
one token, rare words split into pieces, so no word is ever out of vocabulary.

Three ways to start:

- ``byte_level=False`` (default): SentencePiece-style. Unicode NFC, spaces become the visible
  mark ``▁`` glued to the next word, punctuation stands alone. Characters never seen in
  training become ``<unk>``. Good for translation with a small vocabulary.
- ``byte_level=True``: GPT-2 style. Text is cut into UTF-8 bytes first, so any string
  encodes without ``<unk>`` and decodes back exactly. A Chinese character is three bytes, so
  two merges go into rebuilding each one before any merge can join characters into words.
- ``train_chars``: character-initial, for Chinese (and Japanese) text. Each character starts
  as one symbol; the rarest characters are left out of the alphabet and spelt as their UTF-8
  bytes (``<0xE4>``-style tokens, byte fallback as in SentencePiece and Llama), so any string
  still encodes and decodes back exactly. Chinese has no spaces, so the pieces merges work
  within are runs of letters and digits (a space before them joined on) and runs of the
  rest (punctuation, spaces), which end at a line end: ``子曰``, ``：``, ``学而时习之``,
  ``。\n``. Letting pieces run across punctuation encodes shorter but predicts worse
  (docs/BENCHMARKS.md, "Chinese tokenizers").

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
from collections import Counter
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ..errors import UserError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3 after training
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # the byte-fallback vocabulary
# Share of the non-byte vocabulary the character-initial alphabet may fill; the rest is left
# to merges. bench/tokenizers_zh.py measured 0.6-0.8 best on the bundled Chinese corpora.
ALPHABET_SHARE = 0.7
# The share of the training text's characters that the alphabet must cover, the most frequent
# characters first (SentencePiece's character_coverage); the rarest characters, making up the
# rest, are spelt as bytes, whose tokens every rare character shares, instead of each taking a
# symbol trained on a handful of examples. bench/tokenizers_zh.py measured it: 0.975 leaves
# out the characters seen under 5 times in sayings, once in tang.
CHAR_COVERAGE = 0.975
# The pieces of character-initial BPE: a run of letters, marks and digits (one space before
# it joined on), or a run of anything else up to and including a line end. A newline always
# ends a piece, so text may be cut after one without changing an id (data/pieces.py).
CHAR_PIECES = r" ?[\p{L}\p{M}\p{N}]+|[^\p{L}\p{M}\p{N}\n]*\n|[^\p{L}\p{M}\p{N}\n]+"


def _gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's printable stand-in character of each byte (``Ġ`` for the space) -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


GPT2_BYTES = _gpt2_byte_chars()


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
    def train_chars(cls, texts: Iterable[str], vocab_size: int,
                    special_tokens: Iterable[str] = SPECIAL_TOKENS, min_frequency: int = 2,
                    alphabet_share: float = ALPHABET_SHARE,
                    char_coverage: float = CHAR_COVERAGE) -> BPETokenizer:
        """Character-initial BPE with byte fallback (see the module docstring).

        ids: the special tokens, then the 256 byte tokens, then the alphabet and the merges;
        ``vocab_size`` counts them all. The alphabet keeps the most frequent characters that
        cover ``char_coverage`` of the text (``_covering``), at most ``alphabet_share`` of
        what is left after the specials and the bytes.
        """
        special_tokens, texts = list(special_tokens), list(texts)
        budget = vocab_size - len(BYTE_TOKENS) - len(special_tokens)
        if budget < 1:
            raise UserError(f"--vocab-size {vocab_size} is too small for character-initial "
                            f"BPE: it needs more than {vocab_size - budget} (256 bytes + "
                            f"{len(special_tokens)} special)")
        n_chars = _covering(texts, char_coverage)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(CHAR_PIECES), behavior="isolated")
        trainer = trainers.BpeTrainer(
            vocab_size=budget + len(special_tokens), min_frequency=min_frequency,
            special_tokens=special_tokens, show_progress=False,
            limit_alphabet=max(1, min(n_chars, int(budget * alphabet_share))))
        tok.train_from_iterator(texts, trainer, length=len(texts))
        return cls(_with_byte_fallback(tok, len(special_tokens)))

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

    @property
    def mode(self) -> str:
        """How the merges start: "bytes" (GPT-2's byte level), "chars" (character-initial
        with byte fallback) or "words" (SentencePiece-style, ``<unk>`` for unseen)."""
        if isinstance(self.hf.decoder, decoders.ByteLevel):
            return "bytes"
        return "chars" if getattr(self.hf.model, "byte_fallback", False) else "words"

    def token_bytes(self, i: int) -> bytes | None:
        """The UTF-8 bytes token ``i`` stands for, or None for a special token.

        A byte-level piece such as GPT-2's ``ä»`` is the first two bytes of 从: decoding it
        alone gives U+FFFD, while its bytes still say what it holds.
        """
        raw = self.hf.id_to_token(int(i))
        if raw is None or raw in self._specials():
            return None
        if raw in BYTE_TOKENS and self.mode == "chars":
            return bytes([int(raw[3:5], 16)])
        if self.mode == "bytes" and all(ch in GPT2_BYTES for ch in raw):
            return bytes(GPT2_BYTES[ch] for ch in raw)
        return raw.replace("\u2581", " ").encode("utf-8")

    def _specials(self) -> frozenset[str]:
        if not hasattr(self, "_special_set"):
            self._special_set = frozenset(
                t.content for t in self.hf.get_added_tokens_decoder().values() if t.special)
        return self._special_set

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


def _covering(texts: list[str], coverage: float) -> int:
    """How many characters the alphabet keeps: the most frequent ones, until they make up
    ``coverage`` of the characters of ``texts``, and every character as frequent as the last
    one kept (so that which characters are kept never depends on the order of ties)."""
    counts = Counter()
    for text in texts:
        counts.update(text)
    seen, total = 0, sum(counts.values()) * coverage
    for n in sorted(counts.values(), reverse=True):
        seen += n
        if seen >= total:
            return sum(1 for m in counts.values() if m >= n)
    return len(counts)


def _with_byte_fallback(tok: Tokenizer, n_special: int) -> Tokenizer:
    """``tok`` with the 256 byte tokens after its specials and byte fallback switched on.

    The trainer cannot add them itself: as special tokens they would be matched in the text
    and dropped by ``decode``. So the trained model's vocabulary is shifted by 256 and
    rebuilt; merges name tokens by their text, so they stay as they are.
    """
    d = json.loads(tok.to_str())
    vocab = {t: (i if i < n_special else i + len(BYTE_TOKENS))
             for t, i in d["model"]["vocab"].items()}
    vocab.update({t: n_special + b for b, t in enumerate(BYTE_TOKENS)})
    d["model"]["vocab"] = vocab
    d["model"]["byte_fallback"] = True
    d["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
    return Tokenizer.from_str(json.dumps(d))
