"""Choosing the tokenizer a training run fits on its corpus: characters or byte-level BPE.

``--tokenizer char`` (default) gives one id per distinct character; ``--tokenizer bpe
--vocab-size N`` trains a byte-level BPE (GPT-2's kind, through Hugging Face ``tokenizers``)
on the training corpus; the model's vocabulary size then follows the tokenizer's.
"""

from __future__ import annotations

from ..errors import UserError
from .bpe import BPETokenizer
from .char import CharTokenizer

TOKENIZERS = ("char", "bpe")
DEFAULT_BPE_VOCAB = 1024
GPT_SPECIALS = ("<|endoftext|>",)  # GPT-2's one special token


def fit_tokenizer(kind: str, text: str, vocab_size: int | None = None,
                  special_tokens: tuple[str, ...] = GPT_SPECIALS):
    """A tokenizer fitted on ``text``: ``CharTokenizer`` or a byte-level ``BPETokenizer``."""
    if kind == "char":
        return CharTokenizer.fit(text)
    if kind != "bpe":
        raise UserError(f"unknown tokenizer {kind!r}: choose {' or '.join(TOKENIZERS)}")
    size = vocab_size or DEFAULT_BPE_VOCAB
    floor = 256 + len(special_tokens)  # every byte, plus the special tokens
    if size < floor:
        raise UserError(f"--vocab-size {size} is too small for byte-level BPE: it needs at "
                        f"least {floor} (256 bytes + {len(special_tokens)} special)")
    lines = text.splitlines(keepends=True) or [text]
    return BPETokenizer.train(lines, size, special_tokens=special_tokens, byte_level=True)

