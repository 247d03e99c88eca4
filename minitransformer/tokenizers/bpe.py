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
- ``train_chars``: character-initial, for Chinese (and Japanese) text. Each character
  starts as one symbol: underneath it is byte-level BPE whose first merges spell out every
  character of the alphabet from its UTF-8 bytes, so merges between characters start at once.
  The rarest characters are left out of the alphabet (SentencePiece's character coverage) and
  stay in bytes, each spelt as a learnt prefix of its leading bytes plus its last byte
  (``åĲ`` + ``ĥ`` for 吃): the prefix is shared by the characters of a Unicode block, so a
  character never seen in training is still two tokens the model knows. Any string encodes
  and decodes back exactly. Chinese has no spaces, so the pieces merges work within are
  runs of letters and digits (a space before them joined on) and runs of the rest
  (punctuation, spaces), which end at a line end: ``子曰``, ``：``, ``学而时习之``, ``。\n``.
  Letting pieces run across punctuation encodes shorter but predicts worse
  (docs/BENCHMARKS.md, "Chinese tokenizers"). (Earlier versions spelt the rare characters
  as three ``<0xE4>``-style byte-fallback tokens; their saved tokenizers still load.)

Use::

    tok = BPETokenizer.train(texts, vocab_size=4000)      # specials <pad> <s> </s> <unk>
    ids = tok.encode("In the beginning")                  # [..] no specials added
    tok.decode(ids)                                       # "In the beginning"
    tok.pad_id, tok.bos_id, tok.eos_id                     # 0, 1, 2
    BPETokenizer.from_dict(tok.to_dict())                 # what tokenizer.json holds
    BPETokenizer.from_file("tokenizer.json")              # any Hugging Face tokenizer file
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ..errors import UserError
from .specials import prompt_ids, unknown_id

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3 after training
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # the byte-fallback vocabulary
# Share of the non-byte vocabulary the character-initial alphabet may fill; the rest is left
# to merges. bench/tokenizers_zh.py measured 0.6-0.8 best on the bundled Chinese corpora.
ALPHABET_SHARE = 0.7
# The share of the text's characters the alphabet must cover, most frequent first
# (SentencePiece's character_coverage); the rarest are spelt in bytes, sharing their Unicode
# block's byte tokens. bench/tokenizers_zh.py measured 0.95 best of 0.95, 0.975 and 0.99 (lower
# ones encode longer than byte-level BPE); it leaves out characters seen under about 10 times
# in sayings, 3 in tang.
CHAR_COVERAGE = 0.95
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
_BYTE_CHAR = {b: ch for ch, b in GPT2_BYTES.items()}  # byte -> its stand-in character


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
        """Character-initial BPE, byte-level underneath (see the module docstring).

        ids: the special tokens, the 256 bytes, the spelling tokens (the leading bytes of
        multi-byte characters, ``_leading_bytes``, then the alphabet's characters), then the
        merges; ``vocab_size`` counts them all. The alphabet keeps the most frequent
        characters that cover ``char_coverage`` of the text (``_covering_counts``), at most
        ``alphabet_share`` of what is left for characters and merges.
        """
        special_tokens, texts = list(special_tokens), list(texts)
        counts = _char_counts(texts)
        by_count = sorted(counts, key=lambda ch: (-counts[ch], ch))
        fixed = len(BYTE_TOKENS) + len(special_tokens)

        def fits(n: int) -> bool:  # the n most frequent, with their prefixes, in the share
            prefixes = _leading_bytes(counts, set(by_count[:n]), min_frequency)
            return n <= alphabet_share * (vocab_size - fixed - len(prefixes))

        lo, hi = 1, max(1, _covering_counts(counts, char_coverage))
        while lo < hi:  # the largest alphabet that fits (more characters, more prefixes)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        alphabet = by_count[:lo]
        prefixes = _leading_bytes(counts, set(alphabet), min_frequency)
        budget = vocab_size - fixed - len(prefixes)
        if budget < 1:
            raise UserError(f"--vocab_size {vocab_size} is too small for character-initial "
                            f"BPE on this text: it needs more than {vocab_size - budget} (256 "
                            f"bytes, {len(prefixes)} leading-byte prefixes, "
                            f"{len(special_tokens)} special)")
        ascii_chars = sum(ch.isascii() for ch in alphabet)  # bytes already: no symbol more
        on_chars = _train_on_characters(_between(texts, counts, set(alphabet)),
                                        budget + len(special_tokens) + ascii_chars,
                                        special_tokens, min_frequency, alphabet)
        return cls(_spelt_in_bytes(on_chars, special_tokens, prefixes))

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

    def encode_prompt(self, text: str) -> list[int]:  # after the leading specials (specials.py)
        return prompt_ids(self.hf, text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` for many texts at once (parallel in Rust)."""
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def unknown_pieces(self, texts: list[str]) -> list[str]:
        """The distinct pieces of ``texts`` that encode to <unk> (characters a SentencePiece-
        style vocabulary never saw), in order of use; empty where every piece is known."""
        unk = self.unk_id
        if unk is None:
            return []
        return list(dict.fromkeys(
            text[a:b] for text, e in zip(texts, self.hf.encode_batch(list(texts),
                                                                     add_special_tokens=False),
                                         strict=True)
            for i, (a, b) in zip(e.ids, e.offsets, strict=True) if i == unk))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens (<pad>, <s>, ...) are left out unless asked for."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def tokens(self, text: str) -> list[str]:
        """The pieces ``text`` is cut into (``▁`` marks a preceding space)."""
        return self.hf.encode(text, add_special_tokens=False).tokens

    @property
    def mode(self) -> str:
        """How the merges start: "bytes" (GPT-2's byte level), "chars" (character-initial:
        whole characters, the rarest in bytes) or "words" (SentencePiece-style, ``<unk>`` for
        unseen)."""
        if not hasattr(self, "_mode"):
            self._mode = "words"
            if self._byte_fallback:  # character-initial as earlier versions saved it
                self._mode = "chars"
            elif self._byte_level:
                pre = json.loads(self.hf.to_str()).get("pre_tokenizer") or {}
                first = (pre.get("pretokenizers") or [{}])[0]
                ours = first.get("type") == "Split" and \
                    (first.get("pattern") or {}).get("Regex") == CHAR_PIECES
                self._mode = "chars" if ours else "bytes"
        return self._mode

    @property
    def _byte_level(self) -> bool:
        return isinstance(self.hf.decoder, decoders.ByteLevel)

    @property
    def _byte_fallback(self) -> bool:
        return bool(getattr(self.hf.model, "byte_fallback", False))

    def token_bytes(self, i: int) -> bytes | None:
        """The UTF-8 bytes token ``i`` stands for, or None for a special token.

        A byte-level piece such as GPT-2's ``ä»`` is the first two bytes of 从: decoding it
        alone gives U+FFFD, while its bytes still say what it holds.
        """
        raw = self.hf.id_to_token(int(i))
        if raw is None or raw in self._specials():
            return None
        if raw in BYTE_TOKENS and self._byte_fallback:
            return bytes([int(raw[3:5], 16)])
        if self._byte_level and all(ch in GPT2_BYTES for ch in raw):
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
        return unknown_id(self.hf)  # WordPiece's [UNK], SentencePiece's <unk>

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


def _char_counts(texts: Iterable[str]) -> Counter:
    counts = Counter()
    for text in texts:
        counts.update(text)
    return counts


def _covering_counts(counts: Counter, coverage: float) -> int:
    """How many characters the alphabet keeps: the most frequent ones, until they make up
    ``coverage`` of all ``counts``, and every character as frequent as the last one kept (so
    that which characters are kept never depends on the order of ties)."""
    seen, total = 0, sum(counts.values()) * coverage
    for n in sorted(counts.values(), reverse=True):
        seen += n
        if seen >= total:
            return sum(1 for m in counts.values() if m >= n)
    return len(counts)


def _leading_bytes(counts: Counter, alphabet: set[str], min_frequency: int) -> list[bytes]:
    """The prefixes to spell characters with: the leading bytes, two or more, of a multi-byte
    character (E5 90 of 吃's E5 90 83), shorter ones first, then by how often they occur.

    Every prefix of an ``alphabet`` character is kept (it spells the character). A prefix of
    the other characters only stands in the encoded text for them, so it is kept, as any
    merge of BPE is, when they occur ``min_frequency`` times or more: a character seen once,
    in a block of its own, would otherwise take a vocabulary slot for nothing. (A kept
    prefix's own prefixes, which spell it, are kept too: they lead at least its characters.)
    """
    led, rare, needed = Counter(), Counter(), set()
    for ch, n in counts.items():
        b = ch.encode("utf-8")
        for k in range(2, len(b)):
            led[b[:k]] += n
            if ch in alphabet:
                needed.add(b[:k])
            else:
                rare[b[:k]] += n
    kept = needed | {p for p, n in rare.items() if n >= min_frequency}
    return sorted(kept, key=lambda p: (len(p), -led[p], p))


def _between(texts: list[str], counts: Counter, alphabet: set[str]) -> list[str]:
    """The stretches of ``texts`` between characters outside the ``alphabet``. Encoded, such a
    character sits between its neighbours as bytes, so no merge can join them across it: the
    character-level BPE must not count those pairs either (its trainer would drop the
    character and count its two neighbours as adjacent)."""
    rare = [ch for ch in counts if ch not in alphabet]
    if not rare:
        return texts
    cut = next(chr(c) for c in itertools.chain((0, 0xFFFE), range(0x10FFFE, -1, -1))
               if chr(c) not in alphabet)  # none is in an alphabet as large as the text
    table = str.maketrans(dict.fromkeys(rare, cut))
    return [part for text in texts for part in text.translate(table).split(cut) if part]


def _train_on_characters(texts: list[str], vocab_size: int, special_tokens: list[str],
                         min_frequency: int, alphabet: list[str]) -> Tokenizer:
    """BPE over characters, within ``CHAR_PIECES``: ``alphabet``, then merges up to
    ``vocab_size`` (characters outside the alphabet are skipped in training). The alphabet is
    chosen here, ties broken by the character, since the trainer's own choice among equally
    frequent characters changes from one process to the next."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(CHAR_PIECES), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet))
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def _spelt_in_bytes(on_chars: Tokenizer, special_tokens: list[str],
                    prefixes: list[bytes]) -> Tokenizer:
    """The byte-level BPE that encodes as ``on_chars`` does on its alphabet: the specials, the
    256 bytes, merges that spell each prefix and each character of the alphabet from its
    bytes, then ``on_chars``' merges written in bytes. The spelling merges come first and
    never reach across two characters (a lead byte joins only its continuation bytes), so
    every character is one symbol before the first merge between characters; a character
    outside the alphabet stays its longest prefix plus its last byte."""
    d = json.loads(on_chars.to_str())["model"]
    char_vocab = sorted(d["vocab"].items(), key=lambda kv: kv[1])
    alphabet = [t for t, _ in char_vocab if len(t) == 1 and t not in special_tokens]
    merges = [tuple(m) for m in d["merges"]]  # pairs (a string "a b" could not hold " 子")
    vocab = {t: i for i, t in enumerate(special_tokens)}
    vocab.update({_BYTE_CHAR[b]: len(special_tokens) + b for b in range(256)})
    pairs: list[tuple[str, str]] = []
    spelling = [*prefixes, *(ch.encode("utf-8") for ch in alphabet)]
    for b in spelling:
        if len(b) > 1:  # ASCII characters are bytes already
            pairs.append((_in_bytes(b[:-1]), _BYTE_CHAR[b[-1]]))
    pairs += [(_in_bytes(a.encode("utf-8")), _in_bytes(b.encode("utf-8"))) for a, b in merges]
    for a, b in pairs:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CHAR_PIECES), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special_tokens)
    return tok


def _in_bytes(b: bytes) -> str:
    """UTF-8 bytes as byte-level BPE writes them (GPT-2's stand-in character per byte)."""
    return "".join(_BYTE_CHAR[x] for x in b)
