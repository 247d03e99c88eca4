"""`train --tokenizer bpe`: byte-level BPE fitted on the corpus, lossless, saved with the run."""

import json
import re

import pytest
import torch

from minitransformer.cli import main
from minitransformer.data import load_text
from minitransformer.errors import UserError
from minitransformer.tokenizers import fit_tokenizer, tokenizer_from_dict
from minitransformer.tokenizers.streaming import stream_text

SAMPLES = [
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
    "从前有座山 我吃了一个红苹果",
    "mixed 中文 and English, tabs\tand  double  spaces\n\n",
    "never seen: Ωμέγα, emoji 🙂, ümlaut, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    " leading and trailing spaces ",
]


@pytest.fixture(scope="module")
def corpus():
    return load_text("shakespeare")[:30_000] + load_text("tang")[:10_000]


@pytest.fixture(scope="module")
def bpe(corpus):
    return fit_tokenizer("bpe", corpus, 600)


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_lossless(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert max(ids) < bpe.vocab_size


def test_merges_were_learned(bpe):
    assert bpe.vocab_size == 600
    english = "Before we proceed any further, hear me speak."
    assert len(bpe.encode(english)) < 0.6 * len(english.encode("utf-8"))  # subwords, not bytes
    assert len(bpe.encode("明月")) < len("明月".encode())  # frequent Chinese bytes merged


def test_saved_and_rebuilt(bpe):
    again = tokenizer_from_dict(json.loads(json.dumps(bpe.to_dict())))
    for text in SAMPLES:
        assert again.encode(text) == bpe.encode(text)


def test_vocab_too_small_is_a_user_error(corpus):
    with pytest.raises(UserError, match="too small"):
        fit_tokenizer("bpe", corpus, 100)


def test_stream_text_never_splits_a_character():
    """Byte-level ids arrive one at a time; printed pieces are whole characters."""
    tok = fit_tokenizer("bpe", "abc", 257)  # bytes only: 3 ids per CJK character
    text = "你好, world 🙂"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    pieces = list(stream_text((torch.tensor([[i]]) for i in ids), tok))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_train_bpe_from_the_cli_then_sample(tmp_path, corpus, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text(corpus, encoding="utf-8")
    out = tmp_path / "run"
    common = ["--data", str(data), "--out", str(out), "--preset", "debug", "--quiet",
              "--block_size", "16", "--batch_size", "8", "--eval_iters", "2",
              "--sample_tokens", "8", "--eval_interval", "10"]
    assert main(["train", "--tokenizer", "bpe", "--vocab-size", "400", "--max_iters", "10",
                 *common]) == 0
    meta = json.loads((out / "config.json").read_text())
    saved = json.loads((out / "tokenizer.json").read_text())
    assert saved["type"] == "bpe" and meta["data"]["tokenizer"] == "bpe"
    assert meta["model"]["vocab_size"] == tokenizer_from_dict(saved).vocab_size == 400
    assert main(["train", "--resume", "--max_iters", "20", *common]) == 0
    assert json.loads((out / "config.json").read_text())["step"] == 20
    capsys.readouterr()
    assert main(["sample", str(out), "--prompt", "ROMEO: 明月", "--max-new-tokens", "12",
                 "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ROMEO: 明月") and len(text) > len("ROMEO: 明月\n")
    # evaluate: per token, and per character through the val text's tokens per character
    assert main(["evaluate", str(out)]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    per_token = float(rows["bits/token"])
    per_char, ratio = re.fullmatch(r"(\S+) \((\S+) tokens per character of the text scored\)",
                                   rows["bits/character"]).groups()
    tail = corpus[-1500:]  # within the val split, the last 10% of the tokens (Chinese)
    expected = len(tokenizer_from_dict(saved).encode(tail)) / len(tail)
    assert float(ratio) == pytest.approx(expected, rel=0.1)
    assert float(per_char) == pytest.approx(per_token * float(ratio), abs=1e-2)  # rounded
