"""The character tokenizer: round trips (English, Chinese), JSON files, unknown characters."""

from __future__ import annotations

import json

import pytest

from minitransformer.data import load_text
from minitransformer.errors import UserError
from minitransformer.tokenizers import CharTokenizer, UnknownCharactersError, load_tokenizer

ENGLISH = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
CHINESE = ["从前有座山", "我吃了一个红苹果"]


def test_round_trip_english():
    tok = CharTokenizer.fit(ENGLISH)
    ids = tok.encode(ENGLISH)
    assert len(ids) == len(ENGLISH)
    assert tok.decode(ids) == ENGLISH
    assert tok.vocab_size == len(set(ENGLISH))
    # ids follow sorted code points: "\n" (10) < " " (32) < "," ... < "w"
    assert tok.chars == sorted(set(ENGLISH))
    assert tok.encode("\n ") == [0, 1]


def test_round_trip_chinese():
    text = "".join(CHINESE)
    tok = CharTokenizer.fit(text)
    assert tok.vocab_size == len(set(text)) == 13
    for sentence in CHINESE:
        ids = tok.encode(sentence)
        assert len(ids) == len(sentence)  # one id per character, not per UTF-8 byte
        assert tok.decode(ids) == sentence


def test_bundled_chinese_corpus_covers_the_example_sentences():
    tok = CharTokenizer.fit(load_text("sayings"))
    for sentence in CHINESE:
        assert tok.decode(tok.encode(sentence)) == sentence


def test_save_and_load_json(tmp_path):
    tok = CharTokenizer.fit(ENGLISH + "".join(CHINESE))
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == {"type": "char", "chars": tok.chars}
    assert "从" in path.read_text(encoding="utf-8")  # stored as readable UTF-8
    again = load_tokenizer(path)
    assert again.chars == tok.chars
    assert again.encode(CHINESE[1]) == tok.encode(CHINESE[1])


def test_unknown_characters_are_named():
    tok = CharTokenizer.fit(ENGLISH)
    with pytest.raises(UnknownCharactersError) as err:
        tok.encode("hear me, 从前 Zoë!")
    message = str(err.value)
    for ch in ("从", "前", "Z", "ë", "!"):
        assert repr(ch) in message
    assert "'h'" not in message  # known characters are not listed
    assert isinstance(err.value, UserError)


def test_broken_tokenizer_file_is_a_user_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="cannot read the tokenizer"):
        load_tokenizer(path)
    path.write_text('{"type": "bpe-from-the-future"}', encoding="utf-8")
    with pytest.raises(UserError, match="unknown tokenizer type"):
        load_tokenizer(path)


def test_rejects_duplicate_or_multi_character_entries():
    with pytest.raises(ValueError):
        CharTokenizer(["a", "a"])
    with pytest.raises(ValueError):
        CharTokenizer(["ab"])


@pytest.mark.parametrize("kind", ["bpe-bytes", "bpe-chars"])
def test_bpe_says_when_a_small_text_gives_fewer_entries_than_asked(kind):
    from minitransformer.tokenizers.fitting import fit_tokenizer

    said: list[str] = []
    text = "the cat sat on the mat. " * 20
    tok = fit_tokenizer(kind, text, 2000, echo=said.append)
    assert tok.vocab_size < 2000
    assert said == [f"note: BPE learned {tok.vocab_size:,} entries, not 2,000: by then no pair "
                    f"of entries occurred twice in the text (a small text)"]
    said.clear()
    big = fit_tokenizer(kind, load_text("shakespeare")[:200_000], 300, echo=said.append)
    assert big.vocab_size == 300 and said == []
