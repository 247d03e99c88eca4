"""Character-initial BPE for Chinese: lossless (the rarest characters in bytes), fewer tokens
per character than byte-level BPE on the bundled corpora at a vocabulary of 8,000, and the
automatic choice."""

from __future__ import annotations

import json

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from minitransformer.data import load_text
from minitransformer.errors import UserError
from minitransformer.tokenizers import fit_tokenizer, tokenizer_from_dict
from minitransformer.tokenizers.bpe import CHAR_PIECES, BPETokenizer, _char_counts, _covering_counts
from minitransformer.tokenizers.fitting import CHARS_FROM_VOCAB, choose_bpe, cjk_share

SAMPLES = [
    "从前有座山，山里有座庙。",
    "我吃了一个红苹果",  # 吃 and 个 are not in tang: they must come back through bytes
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "mixed 中文 and English, tabs\tand  double  spaces\n\n",
    "never seen: Ωμέγα, emoji 🙂, ümlaut, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, a literal <0xE4> and ▁",
    " leading and trailing spaces ",
]


@pytest.fixture(scope="module")
def tang():
    return load_text("tang")


@pytest.fixture(scope="module")
def chars(tang):
    return fit_tokenizer("bpe-chars", tang, 3000, echo=None)


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_lossless(chars, text):
    ids = chars.encode(text)
    assert chars.decode(ids) == text
    assert max(ids) < chars.vocab_size


def test_vocabulary_layout(chars):
    """Specials first, then the 256 bytes, then the spelling tokens and the merges."""
    assert chars.mode == "chars" and chars.vocab_size == 3000
    assert chars.id_to_token(0) == "<|endoftext|>"
    assert [chars.token_bytes(1 + b) for b in (0, 0xE4, 0xFF)] == [b"\x00", b"\xe4", b"\xff"]
    assert len(chars.tokens("山")) == 1  # a common character is one symbol, not three bytes
    # 吃 (E5 90 83) is not in tang: a prefix its Unicode block shares, then its last byte
    assert [chars.token_bytes(i) for i in chars.encode("吃")] == [b"\xe5\x90", b"\x83"]
    assert chars.token_to_id(chars.tokens("吃")[0]) < chars.token_to_id(chars.tokens("山")[0])


def test_rare_characters_are_spelt_as_bytes():
    """The alphabet covers ``char_coverage`` of the text: a character making up less of it
    than what is left out is spelt in bytes (云 is U+4E91: E4 BA 91), its leading two as one
    token."""
    text = "山" * 60 + "水" * 38 + "云" * 2  # 云 is 2% of the characters
    tok = BPETokenizer.train_chars([text], 400, special_tokens=["<s>"], char_coverage=0.98)
    assert [tok.token_bytes(i) for i in tok.encode("云水")] == [b"\xe4\xba", b"\x91",
                                                              "水".encode()]
    assert tok.decode(tok.encode("云水山")) == "云水山"
    tok = BPETokenizer.train_chars([text], 400, special_tokens=["<s>"], char_coverage=1.0)
    assert len(tok.tokens("云")) == 1


def test_a_prefix_seen_once_takes_no_slot():
    """A prefix stands in the text for the characters left out of the alphabet: kept, as a
    merge is, when they occur ``min_frequency`` times. 1,300 characters seen once, each in a
    block of its own (U+20000 + 64 i: F0 A0..AA, then a third byte of its own), keep the
    prefixes they share (F0 A0 ...) and take no slot for their own three-byte ones, so a
    vocabulary too small for 1,300 prefixes still fits; a prefix the alphabet needs stays."""
    rare = "".join(chr(0x20000 + 64 * i) for i in range(1300))
    text = "山水云" * 10_000 + rare  # 4% of the text: left out of the alphabet
    tok = BPETokenizer.train_chars([text], 700, special_tokens=["<s>"])  # not 1,300 + 256
    spelt = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    assert sum(b is not None and b[:1] == b"\xf0" and len(b) == 3 for b in spelt) == 0
    assert len(tok.tokens("山")) == 1
    lone = chr(0x20000 + 64 * 7)  # F0 A0 87 80
    assert [tok.token_bytes(i) for i in tok.encode(lone)] == [b"\xf0\xa0", b"\x87", b"\x80"]
    assert tok.decode(tok.encode(text)) == text
    # the alphabet's characters keep their prefixes even when seen once
    once = BPETokenizer.train_chars(["山水\n" * 5 + "云"], 400, special_tokens=["<s>"],
                                    char_coverage=1.0)
    assert len(once.tokens("云")) == 1


def test_the_training_cut_is_never_a_character_of_the_alphabet():
    """Training text is cut at characters left out of the alphabet, with a character the
    alphabet lacks: even when the usual ones (NUL, U+FFFE, U+10FFFE) are in it."""
    text = "\x00\ufffe\U0010fffe" * 50 + "山"
    tok = BPETokenizer.train_chars([text], 400, special_tokens=["<s>"], char_coverage=0.9)
    assert len(tok.tokens("\ufffe")) == 1 and tok.decode(tok.encode(text + "水")) == text + "水"


def test_ties_in_the_alphabet_go_by_the_character_and_the_size_is_exact():
    """Among equally frequent characters the alphabet keeps the first by code point (the
    trainer's own choice changes from one process to the next), and the vocabulary is the
    size asked for."""
    text = "乙甲丙丁" * 20  # equally frequent: 丁 U+4E01, 丙 U+4E19, 乙 U+4E59, 甲 U+7532
    tok = BPETokenizer.train_chars([text], 300, special_tokens=["<s>"], alphabet_share=0.05,
                                   min_frequency=1000)  # room for two characters, no merges
    assert [len(tok.tokens(ch)) for ch in "丁丙乙甲"] == [1, 1, 3, 3]  # and no prefix of theirs
    full = BPETokenizer.train_chars([load_text("tang")], 2000, special_tokens=["<s>"])
    assert full.vocab_size == 2000


def test_no_merge_is_learnt_across_a_character_left_in_bytes():
    """山 and 水 only ever meet with a rare character between them, which stays in bytes when
    encoded: counting them as a pair would spend a merge that can never apply."""
    text = "".join(f"山{chr(0x4E00 + i)}水\n" for i in range(200))  # each middle one once
    tok = BPETokenizer.train_chars([text], 600, special_tokens=["<s>"], char_coverage=0.75)
    assert len(tok.tokens("山水")) == 2 and len(tok.tokens("山")) == 1
    assert tok.decode(tok.encode(text)) == text


def test_merges_between_characters_start_from_whole_characters():
    """Underneath, byte-level BPE: the merges that spell each character come first, so a
    word is cut as the same BPE over characters would cut it."""
    text = "学而时习之，不亦说乎。\n" * 30 + "有朋自远方来，不亦乐乎。\n" * 20
    tok = BPETokenizer.train_chars([text], 400, special_tokens=["<s>"])
    assert [tok.decode([i]) for i in tok.encode("学而时习之")] == ["学而时习之"]  # one token
    assert [tok.decode([i]) for i in tok.encode("不亦说乎。")] == ["不亦说乎", "。"]


def test_earlier_byte_fallback_tokenizers_still_work():
    """Runs saved before the rare characters went to byte-level prefixes hold a BPE with
    ``<0xE4>``-style byte-fallback tokens: they load, encode and label as they did."""
    vocab = {"<s>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "山": 257}
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(CHAR_PIECES), behavior="isolated")
    hf.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    old = tokenizer_from_dict({"type": "bpe", "tokenizer": hf.to_str()})
    assert old.mode == "chars" and old.tokens("山吃") == ["山", "<0xE5>", "<0x90>", "<0x83>"]
    assert [old.token_bytes(i) for i in old.encode("吃")] == [b"\xe5", b"\x90", b"\x83"]
    assert old.decode(old.encode("山吃山")) == "山吃山"


def test_coverage_counts_characters_and_keeps_ties():
    assert _covering_counts(_char_counts(["aabbc"]), 0.5) == 2  # a, then b: 4 of 5 >= 2.5
    assert _covering_counts(_char_counts(["aabbc"]), 0.9) == 3
    # a alone covers it, but b and c are as frequent
    assert _covering_counts(_char_counts(["abc"]), 0.3) == 3
    assert _covering_counts(_char_counts([]), 0.975) == 0


def test_saved_and_rebuilt(chars):
    again = tokenizer_from_dict(json.loads(json.dumps(chars.to_dict())))
    assert again.mode == "chars"
    for text in SAMPLES:
        assert again.encode(text) == chars.encode(text)


def test_byte_level_pieces_know_their_bytes(tang):
    b = BPETokenizer.train(tang.splitlines(keepends=True), 300, special_tokens=["<s>"],
                           byte_level=True)
    assert b.mode == "bytes"
    ids = b.encode("从前 a")
    assert b"".join(b.token_bytes(i) for i in ids) == "从前 a".encode()
    assert b.token_bytes(b.token_to_id("<s>")) is None


@pytest.mark.parametrize("corpus", ["sayings", "tang"])
def test_fewer_tokens_per_character_than_byte_level_at_8000(corpus):
    text = load_text(corpus)
    lines = text.splitlines(keepends=True)
    byte_level = BPETokenizer.train(lines, 8000, special_tokens=["<|endoftext|>"],
                                    byte_level=True)
    chars = BPETokenizer.train_chars(lines, 8000, special_tokens=["<|endoftext|>"])
    n_bytes, n_chars = len(byte_level.encode(text)), len(chars.encode(text))
    # 0.769 against 0.807 on sayings, 0.812 against 0.851 on tang (docs/BENCHMARKS.md)
    assert n_chars < n_bytes, (corpus, n_chars / len(text), n_bytes / len(text))
    assert chars.decode(chars.encode(text)) == text


def test_automatic_choice(tang):
    assert cjk_share(tang) > 0.9 and cjk_share("hear me speak, 从前") < 0.5
    assert choose_bpe("hear me speak", 8000) == ("bytes", None)  # nothing said for English
    mode, why = choose_bpe(tang, CHARS_FROM_VOCAB)
    assert mode == "chars" and "characters" in why and "bpe-bytes" in why
    mode, why = choose_bpe(tang, CHARS_FROM_VOCAB - 1)
    assert mode == "bytes" and "bpe-chars" in why
    said = []
    tok = fit_tokenizer("bpe", tang, CHARS_FROM_VOCAB, echo=said.append)
    assert tok.mode == "chars" and len(said) == 1
    assert fit_tokenizer("bpe", tang, 600, echo=None).mode == "bytes"
    assert fit_tokenizer("bpe-bytes", tang, 4000, echo=said.append).mode == "bytes"
    assert len(said) == 1  # an explicit choice is not announced


def test_too_small_and_unknown_kinds_are_user_errors(tang):
    with pytest.raises(UserError, match="too small"):
        fit_tokenizer("bpe-chars", tang, 200)
    with pytest.raises(UserError, match="unknown tokenizer"):
        fit_tokenizer("bpe-unigram", tang, 2000)
