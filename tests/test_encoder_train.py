"""`train --model encoder`: masked-LM on Tiny Shakespeare beats always guessing the most
frequent character; the run folder loads back, evaluates, resumes and draws its attention."""

import json
import re

import pytest

from minitransformer import load_checkpoint
from minitransformer.cli import main
from minitransformer.data import load_text
from minitransformer.models import EncoderModel


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlm") / "run"
    code = main(["train", "--model", "encoder", "--preset", "debug", "--data", "shakespeare",
                 "--out", str(out), "--eval_interval", "200", "--eval_iters", "5",
                 "--sample_tokens", "0", "--quiet"])
    assert code == 0
    return out


def test_debug_run_beats_the_most_frequent_token(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run), "--eval-iters", "20"]) == 0
    out = capsys.readouterr().out
    acc = float(re.search(r"masked-token accuracy\s+([\d.]+)%", out).group(1))
    base = float(re.search(r"most-frequent baseline\s+([\d.]+)%", out).group(1))
    assert 10.0 < base < 20.0  # a space is about 15% of Tiny Shakespeare's characters
    assert acc > base + 3.0, out


def test_run_folder_is_an_encoder_checkpoint(run):
    model, tokenizer = load_checkpoint(run)
    assert isinstance(model, EncoderModel)
    meta = json.loads((run / "config.json").read_text())
    assert meta["family"] == "encoder"
    c = model.config
    assert c.mask_id == tokenizer.vocab_size and c.vocab_size == tokenizer.vocab_size + 1
    assert c.norm_position == "post" and c.activation == "gelu" and c.pos_encoding == "learned"


def test_resume_and_attention(run, tmp_path, capsys):
    assert main(["train", "--model", "encoder", "--out", str(run), "--resume",
                 "--max_iters", "205", "--eval_interval", "200", "--eval_iters", "2",
                 "--quiet"]) == 0
    assert (run / "checkpoints" / "step_0000205").is_dir()
    png = tmp_path / "att.png"
    assert main(["attention", str(run), "--text", "To be, or not", "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "x"]) == 2
    assert "encoder" in capsys.readouterr().err


def test_encoder_with_bpe(tmp_path):
    data = tmp_path / "c.txt"
    data.write_text(load_text("shakespeare")[:20_000], encoding="utf-8")
    out = tmp_path / "bpe"
    assert main(["train", "--model", "encoder", "--tokenizer", "bpe", "--vocab-size", "300",
                 "--preset", "debug", "--data", str(data), "--out", str(out), "--max_iters",
                 "4", "--eval_interval", "4", "--eval_iters", "1", "--block_size", "16",
                 "--quiet", "--mlm_head", "linear"]) == 0
    model, tokenizer = load_checkpoint(out)
    assert model.config.vocab_size == tokenizer.vocab_size == 300
    assert model.config.mask_id == tokenizer.token_to_id("<mask>")
    assert model.mlm_head.transform is None


def test_flags_of_other_families_are_refused(tmp_path, capsys):
    code = main(["train", "--model", "encoder", "--out", str(tmp_path / "x"),
                 "--label_smoothing", "0.1", "--preset", "debug"])
    assert code == 2
    assert "label_smoothing" in capsys.readouterr().err
