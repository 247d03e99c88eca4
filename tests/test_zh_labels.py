"""BPE token labels show the text they stand for: whole characters as themselves, partial UTF-8
bytes as <0xE4>-style markers, never byte-level mojibake (ä», åº)."""

from __future__ import annotations

import re

import pytest

from minitransformer.data import load_text
from minitransformer.tokenizers import fit_tokenizer
from minitransformer.tokenizers.bpe import BPETokenizer
from minitransformer.viz.trace import bytes_label, token_labels

SENTENCE = "从前有座山"
MARKER = re.compile(r"<0x[0-9A-F]{2}>")


def test_bytes_label_by_hand():
    assert bytes_label("从".encode()) == "从"
    assert bytes_label(b"\xe4\xbb") == "<0xE4><0xBB>"  # the first two bytes of 从
    assert bytes_label("从".encode() + b"\xe5") == "从<0xE5>"
    assert bytes_label(b"\xbb\x8e") == "<0xBB><0x8E>"  # continuation bytes alone
    assert bytes_label(b"a b\xff") == "a b<0xFF>"


@pytest.mark.parametrize("vocab", [257, 600, 3000])
def test_byte_level_labels_spell_the_sentence(vocab):
    """Whatever the merges, the labels read as the sentence once markers are joined back."""
    tok = fit_tokenizer("bpe-bytes", load_text("tang"), vocab)
    ids = tok.encode(SENTENCE)
    labels = token_labels(tok, ids)
    assert not any(ch in "".join(labels) for ch in "äåæçèéİĵ")  # no GPT-2 byte alphabet
    joined = b"".join(bytes.fromhex(m[3:5]) if MARKER.fullmatch(m) else m.encode()
                      for lab in labels for m in re.split(f"({MARKER.pattern})", lab) if m)
    assert joined.decode() == SENTENCE
    if vocab == 257:  # bytes only: every label is a marker
        assert all(MARKER.fullmatch(lab) for lab in labels)


def test_whole_character_pieces_show_as_characters():
    tok = fit_tokenizer("bpe-bytes", load_text("tang"), 3000)
    labels = token_labels(tok, tok.encode("明月"))
    assert "".join(labels) == "明月"  # frequent in tang: whole pieces


def test_character_initial_labels_and_spaces():
    tok = fit_tokenizer("bpe-chars", load_text("tang"), 3000)
    labels = token_labels(tok, tok.encode("从前 吃"))
    assert labels[:2] == ["从", "前"] and "␣" in labels[2]
    assert labels[-2:] == ["<0xE5><0x90>", "<0x83>"]  # 吃 is not in tang: a prefix, a byte


def test_sentencepiece_style_keeps_the_visible_space():
    tok = BPETokenizer.train(["the cat sat on the mat"] * 20, 60)
    assert token_labels(tok, tok.encode("the cat"))[1].startswith("␣")
