"""Hugging Face tokenizers: read one from a model folder, or write ours for ``transformers``.

Reading (``load_hf_tokenizer``) looks in this order: ``tokenizer.json`` (any model),
``vocab.json`` + ``merges.txt`` (GPT-2's byte-level BPE), ``vocab.txt`` (BERT's WordPiece).
Nothing is downloaded.

Writing (``exported_tokenizer(tok).files(block_size)``) gives tokenizer.json with our ids, plus
tokenizer_config.json and special_tokens_map.json, so that ``AutoTokenizer.from_pretrained``
builds a fast tokenizer that encodes and decodes as ours does::

    tokenizer.json            the tokenizers-library pipeline (vocabulary, pre-tokenizer, decoder)
    tokenizer_config.json     tokenizer_class PreTrainedTokenizerFast, model_max_length,
                              clean_up_tokenization_spaces false (" ," stays " ,"), specials
    special_tokens_map.json   the special tokens by role (bos_token, eos_token, ...)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from ..errors import UserError
from ..tokenizers import CharTokenizer
from ..tokenizers.specials import leading_specials, prompt_ids, special_tokens


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` behind the small interface our commands use."""

    kind = "hf"

    def __init__(self, tokenizer: Tokenizer, max_length: int | None = None,
                 roles: dict[str, str] | None = None):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.roles = roles or {}  # {"bos_token": "<s>", ...}: the folder's, as it names them

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, special_tokens: bool = False) -> list[int]:
        """Ids of ``text``; ``special_tokens`` adds the model's own ([CLS] ... [SEP] for BERT)."""
        return self.tokenizer.encode(text, add_special_tokens=special_tokens).ids

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of ``text`` to continue: after the leading specials of a post-processor."""
        return prompt_ids(self.tokenizer, text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def over_length(self, texts: list[str]) -> list[tuple[int, int]]:
        """(index, full length with special tokens) of each text ``batch`` would cut."""
        if not self.max_length:
            return []
        rows = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        return [(i, len(e.ids)) for i, e in enumerate(rows) if len(e.ids) > self.max_length]

    def batch(self, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """Encode sentences with special tokens, truncated to ``max_length`` and right-padded:
        returns (ids, attention_mask), each a list of equal-length rows."""
        if self.max_length:  # the library's truncation keeps the special tokens
            self.tokenizer.enable_truncation(self.max_length)
        try:
            rows = [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]
        finally:
            self.tokenizer.no_truncation()
        width = max(len(r) for r in rows)
        pad = self.tokenizer.token_to_id("[PAD]") or 0
        ids = [r + [pad] * (width - len(r)) for r in rows]
        mask = [[1] * len(r) + [0] * (width - len(r)) for r in rows]
        return ids, mask


# What an exported char tokenizer writes for a character its vocabulary lacks: the first of
# these the vocabulary has, else its first character (id 0). Never a new entry: every id must
# stay below the model's vocab_size.
CHAR_STAND_INS = ("?", "\uff1f", "\ufffd", " ")

# The roles transformers gives special tokens, by the names tokenizers commonly use for them.
# GPT-2's <|endoftext|> both starts and ends a text.
SPECIAL_ROLES = {
    "<|endoftext|>": ("bos_token", "eos_token"), "<s>": ("bos_token",), "</s>": ("eos_token",),
    "<pad>": ("pad_token",), "<unk>": ("unk_token",), "<mask>": ("mask_token",),
    "[PAD]": ("pad_token",), "[UNK]": ("unk_token",), "[CLS]": ("cls_token",),
    "[SEP]": ("sep_token",), "[MASK]": ("mask_token",),
}
ROLES = ("bos_token", "eos_token", "pad_token", "unk_token", "cls_token", "sep_token",
         "mask_token")


def char_stand_in(chars: list[str]) -> str:
    """The character an exported char tokenizer encodes unknown characters as."""
    return next((c for c in CHAR_STAND_INS if c in chars), chars[0])


def char_tokenizer_as_hf(chars: list[str]) -> Tokenizer:
    """Our character tokenizer as a ``tokenizers.Tokenizer`` (same ids): every character is a
    word of a WordLevel vocabulary, and decoding joins them with nothing in between. A
    character outside the vocabulary becomes ``char_stand_in(chars)`` instead of an error."""
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)},
                                     unk_token=char_stand_in(chars)))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def exported_chars(tok: Tokenizer) -> list[str] | None:
    """The alphabet of a character tokenizer as ``char_tokenizer_as_hf`` writes it (a
    WordLevel vocabulary of single characters with ids 0 .. n-1), in id order; None for any
    other tokenizer. Read back as our ``CharTokenizer``, a model exported from a char run
    refuses characters it never saw and separates documents by a blank line, as the run did."""
    model = json.loads(tok.to_str()).get("model") or {}
    vocab = model.get("vocab") or {}
    if model.get("type") != "WordLevel" or not vocab or \
            not all(len(c) == 1 for c in vocab) or \
            sorted(vocab.values()) != list(range(len(vocab))):
        return None
    return sorted(vocab, key=vocab.get)


def as_char_tokenizer(tokenizer: HFTokenizer) -> CharTokenizer | None:
    """A char run's export (``exported_chars``) as our ``CharTokenizer``, or None."""
    chars = exported_chars(tokenizer.tokenizer)
    return CharTokenizer(chars) if chars else None


@dataclass(frozen=True)
class ExportedTokenizer:
    """A tokenizer as ``transformers`` will load it: the ``tokenizers.Tokenizer`` and its
    special tokens by role ({"bos_token": "<|endoftext|>", ...}; empty for a char tokenizer)."""

    tokenizer: Tokenizer
    specials: dict[str, str]

    def token_id(self, role: str) -> int | None:
        """The id of the special token of ``role`` ("bos_token", ...), or None."""
        token = self.specials.get(role)
        return None if token is None else self.tokenizer.token_to_id(token)

    def files(self, model_max_length: int) -> dict[str, str | dict]:
        """{file name: text or JSON object} for a Hugging Face folder."""
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": False,  # decode gives the text back as it was
            "model_input_names": ["input_ids", "attention_mask"],
            **self.specials,
        }
        return {"tokenizer.json": self.tokenizer.to_str(), "tokenizer_config.json": config,
                "special_tokens_map.json": dict(self.specials)}


def _special_roles(tok: Tokenizer, given: dict[str, str] | None = None) -> dict[str, str]:
    """Role -> token for the special tokens ``tok`` declares: the roles ``given`` (a source
    folder's) where their token is one of them, then the post-processor's leading token as
    bos_token (Llama 3's <|begin_of_text|>), then by name (``SPECIAL_ROLES``), lowest id first."""
    specials = special_tokens(tok)
    roles = {role: token for role, token in (given or {}).items() if token in specials}
    lead = leading_specials(tok)
    if lead:
        roles.setdefault("bos_token", tok.id_to_token(lead[0]))
    for _, added in sorted(tok.get_added_tokens_decoder().items()):
        if added.special:
            for role in SPECIAL_ROLES.get(added.content, ()):
                roles.setdefault(role, added.content)
    return roles


def folder_roles(folder: Path) -> dict[str, str]:
    """{role: token} as a Hugging Face folder names its special tokens (tokenizer_config.json,
    then special_tokens_map.json); a token may be written as {"content": token, ...}."""
    roles: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            found = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for role in ROLES if isinstance(found, dict) else ():
            token = found.get(role)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and token:
                roles.setdefault(role, token)
    return roles


def exported_tokenizer(tokenizer, roles: dict[str, str] | None = None) -> ExportedTokenizer:
    """Ours (char, BPE) or one read by ``load_hf_tokenizer``, ready to write for transformers;
    ``roles``: the special tokens' roles in the folder a run started from (``folder_roles``).

    Only tokens the tokenizer already marks special get a role: a char tokenizer has none (its
    stand-in for unknown characters is an ordinary character, which ``decode(...,
    skip_special_tokens=True)`` must not drop).
    """
    if getattr(tokenizer, "kind", "") == "char":
        return ExportedTokenizer(char_tokenizer_as_hf(tokenizer.chars), {})
    inner = getattr(tokenizer, "tokenizer", None) or getattr(tokenizer, "hf", None)
    if not isinstance(inner, Tokenizer):
        raise UserError(f"a {type(tokenizer).__name__} cannot be written as a Hugging Face "
                        f"tokenizer.json")
    return ExportedTokenizer(inner, _special_roles(inner, roles or getattr(tokenizer, "roles",
                                                                           None)))


def _gpt2_bpe(vocab: Path, merges: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id("<|endoftext|>") is not None:  # GPT-2's one special token
        tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _wordpiece(vocab: Path, lowercase: bool) -> Tokenizer:
    tok = Tokenizer(models.WordPiece.from_file(str(vocab), unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is not None and sep_id is not None:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
    tok.decoder = decoders.WordPiece()
    return tok


def _max_length(folder: Path) -> int | None:
    """sentence-transformers' max_seq_length, else tokenizer_config's model_max_length."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and 0 < value < 1_000_000:
            return value
    return None


def load_hf_tokenizer(path, max_length: int | None = None) -> HFTokenizer:
    """The tokenizer of a local Hugging Face folder. ``max_length`` caps the encoded length
    (default: the folder's own setting)."""
    folder = Path(path)
    limit = _max_length(folder)
    if max_length is not None:
        limit = min(limit, max_length) if limit else max_length
    try:
        if (folder / "tokenizer.json").exists():
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            tok.no_truncation()  # we truncate ourselves, to the model's limit
            tok.no_padding()
        elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            tok = _gpt2_bpe(folder / "vocab.json", folder / "merges.txt")
        elif (folder / "vocab.txt").exists():
            try:
                cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                cfg = {}
            tok = _wordpiece(folder / "vocab.txt", bool(cfg.get("do_lower_case", True)))
        elif (folder / "tokenizer.model").exists():
            raise UserError(f"{folder} has only SentencePiece's tokenizer.model, which is not "
                            f"read here: write its tokenizer.json with transformers "
                            f"(AutoTokenizer.from_pretrained(folder).save_pretrained(folder))")
        else:
            raise UserError(f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json "
                            f"+ merges.txt, or vocab.txt")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise UserError(f"cannot read the tokenizer in {folder}: {e}") from None
    return HFTokenizer(tok, limit, folder_roles(folder))
