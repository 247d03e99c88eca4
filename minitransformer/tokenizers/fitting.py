"""Choosing the tokenizer a training run fits on its corpus: characters or BPE.

``--tokenizer char`` (default) gives one id per distinct character. ``--tokenizer bpe
--vocab-size N`` trains a BPE (through Hugging Face ``tokenizers``) on the training corpus,
and picks how its merges start:

- ``bpe-bytes``: byte-level, GPT-2's kind. Right for English and code.
- ``bpe-chars``: character-initial, the rarest characters in bytes (``train_chars``). Right
  for Chinese or Japanese once the vocabulary is large enough to hold the common characters.
- ``bpe``: the second when the corpus is mostly CJK and N >= ``CHARS_FROM_VOCAB``, else the
  first; it says which on the console when the corpus is mostly CJK.

The model's vocabulary size then follows the tokenizer's.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError
from .bpe import BPETokenizer
from .char import CharTokenizer

TOKENIZERS = ("char", "bpe", "bpe-bytes", "bpe-chars")
DEFAULT_BPE_VOCAB = 1024
GPT_SPECIALS = ("<|endoftext|>",)  # GPT-2's one special token
# From this vocabulary size on, character-initial BPE cuts the bundled Chinese corpora into
# clearly fewer tokens than byte-level BPE (bench/tokenizers_zh.py: 3% fewer at 1,500, 4-7%
# from 2,000 on; at 1,000, under 1%, the 256 bytes and the leading-byte prefixes taking
# most of the vocabulary).
CHARS_FROM_VOCAB = 1500
CJK_MAJORITY = 0.5  # "mostly CJK": over half of the non-space characters
CJK_RANGES = ((0x2E80, 0x9FFF),    # radicals, CJK punctuation, kana, ideographs
              (0xAC00, 0xD7AF),    # Hangul syllables
              (0xF900, 0xFAFF),    # compatibility ideographs
              (0xFF00, 0xFFEF),    # full-width punctuation and forms (，：！)
              (0x20000, 0x3FFFF))  # ideograph extensions B and on


def is_cjk(ch: str) -> bool:
    """Whether ``ch`` is a Chinese, Japanese or Korean character or CJK punctuation."""
    o = ord(ch)
    return any(lo <= o <= hi for lo, hi in CJK_RANGES)


def cjk_share(text: str, sample: int = 1_000_000) -> float:
    """The share of CJK characters among the non-space characters of ``text`` (its first
    ``sample`` characters: enough to tell, and fast on a large corpus)."""
    chars = [ch for ch in text[:sample] if not ch.isspace()]
    return sum(map(is_cjk, chars)) / len(chars) if chars else 0.0


def choose_bpe(text: str, vocab_size: int) -> tuple[str, str | None]:
    """("bytes" or "chars", a line saying why, or None when the corpus is not mostly CJK)."""
    share = cjk_share(text)
    if share <= CJK_MAJORITY:
        return "bytes", None
    if vocab_size >= CHARS_FROM_VOCAB:
        return "chars", (f"tokenizer: the corpus is {share:.0%} CJK and the vocabulary "
                         f"{vocab_size:,} >= {CHARS_FROM_VOCAB:,}, so BPE starts from "
                         f"characters (the rarest in bytes); --tokenizer bpe-bytes "
                         f"for GPT-2's byte level")
    return "bytes", (f"tokenizer: the corpus is {share:.0%} CJK, but a vocabulary of "
                     f"{vocab_size:,} is below {CHARS_FROM_VOCAB:,}, where starting from "
                     f"characters begins to pay; byte-level BPE (--vocab_size "
                     f"{CHARS_FROM_VOCAB} or more, or --tokenizer bpe-chars, to change it)")


def fit_tokenizer(kind: str, text: str, vocab_size: int | None = None,
                  special_tokens: tuple[str, ...] = GPT_SPECIALS,
                  echo: Callable[[str], object] | None = print):
    """A tokenizer fitted on ``text``: ``CharTokenizer`` or a ``BPETokenizer`` (see the module
    docstring for the kinds). ``echo`` receives the line about the automatic choice."""
    if kind == "char":
        return CharTokenizer.fit(text)
    if kind not in TOKENIZERS:
        raise UserError(f"unknown tokenizer {kind!r}: choose {', '.join(TOKENIZERS)}")
    return fit_bpe_lines(kind, text.splitlines(keepends=True) or [text], text, vocab_size,
                         special_tokens, echo)


def fit_bpe_lines(kind: str, lines: list[str], head: str, vocab_size: int | None = None,
                  special_tokens: tuple[str, ...] = GPT_SPECIALS,
                  echo: Callable[[str], object] | None = print):
    """A BPE of ``kind`` (bpe, bpe-bytes, bpe-chars) trained on ``lines``; ``head``, the text's
    start, decides ``bpe``'s choice. ``fit_tokenizer`` on a text is this on its lines, so a
    corpus streamed line by line gets the tokenizer the whole text gets."""
    size = vocab_size or DEFAULT_BPE_VOCAB
    mode = kind.removeprefix("bpe-")
    if kind == "bpe":
        mode, why = choose_bpe(head, size)
        if why and echo is not None:
            echo(why)
    if mode == "chars":
        fitted = BPETokenizer.train_chars(lines, size, special_tokens=special_tokens)
    else:
        floor = 256 + len(special_tokens)  # every byte, plus the special tokens
        if size < floor:
            raise UserError(f"--vocab_size {size} is too small for byte-level BPE: it needs at "
                            f"least {floor} (256 bytes + {len(special_tokens)} special)")
        fitted = BPETokenizer.train(lines, size, special_tokens=special_tokens, byte_level=True)
    if fitted.vocab_size < size and echo is not None:  # the text ran out of pairs to merge
        echo(f"note: BPE learned {fitted.vocab_size:,} entries, not {size:,}: by then no pair "
             f"of entries occurred twice in the text (a small text)")
    return fitted
