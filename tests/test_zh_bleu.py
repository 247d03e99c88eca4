"""BLEU for Chinese targets: sacreBLEU's zh tokenizer when the references are mostly CJK, so a
perfect en->zh translation scores 100 (13a, which cuts at spaces, scores it near 0)."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import BLEU

from minitransformer.cli import main
from minitransformer.families import seq2seq
from minitransformer.families.seq2seq import bleu_tokenizer

SUBJECTS = [("I", "我"), ("you", "你"), ("he", "他"), ("she", "她"), ("we", "我们"),
            ("they", "他们")]
VERBS = [("love", "爱"), ("see", "看见"), ("want", "想要")]
OBJECTS = [("cats", "猫"), ("dogs", "狗"), ("apples", "苹果"), ("the mountain", "山"),
           ("the river", "河")]
PAIRS = [(f"{s} {v} {o}.", f"{zs}{zv}{zo}。") for s, zs in SUBJECTS for v, zv in VERBS
         for o, zo in OBJECTS]


def test_the_issue_case_and_the_choice():
    refs = [zh for _, zh in PAIRS]
    assert BLEU(tokenize="13a").corpus_score(refs, [refs]).score < 1  # one "word" a sentence
    assert BLEU(tokenize="zh").corpus_score(refs, [refs]).score == pytest.approx(100)
    assert bleu_tokenizer(refs)[0] == "zh"
    assert bleu_tokenizer([en for en, _ in PAIRS])[0] == "13a"
    assert bleu_tokenizer(refs, "13a") == ("13a", "as --bleu_tokenize asked")
    japanese = ["わたしはねこがすきです。", "やまにのぼりました。"]
    assert bleu_tokenizer(japanese)[0] in ("ja-mecab", "char")


@pytest.fixture(scope="module")
def en_zh_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("en_zh")
    tsv = root / "en_zh.tsv"
    rows = [f"c{i % 9} {i}\t{en}\t{zh}" for i, (en, zh) in enumerate(PAIRS)]
    tsv.write_text("ref\ten\tzh\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = root / "run"
    assert main(["train", "--data", str(tsv), "--tgt", "zh", "--out", str(out), "--preset",
                 "debug", "--max_iters", "4", "--eval_interval", "4", "--eval_iters", "1"]) == 0
    return out


def test_evaluate_perfect_translations_score_100_with_zh(en_zh_run, capsys, monkeypatch):
    """The model's translations replaced by the references: BLEU 100, tokenizer zh, said."""
    from minitransformer.tokenizers import load_tokenizer

    tok = load_tokenizer(en_zh_run / "tokenizer.json")
    answer = {tuple(tok.encode(en)): tok.encode(zh) for en, zh in PAIRS}

    def perfect(model, sources, *args, **kwargs):
        if kwargs.get("progress"):
            kwargs["progress"](len(sources))
        return [answer[tuple(s[:-1])] for s in sources]  # s ends in </s>

    monkeypatch.setattr(seq2seq, "translate_many", perfect)
    capsys.readouterr()
    assert main(["evaluate", str(en_zh_run), "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert "BLEU tokenizer zh" in out and "tok:zh" in out
    assert out.count("BLEU 100.00") == 2, out  # greedy and beam 2
    capsys.readouterr()
    assert main(["evaluate", str(en_zh_run), "--beam", "2", "--bleu_tokenize", "13a"]) == 0
    out = capsys.readouterr().out
    assert "tok:13a" in out and "BLEU 100.00" not in out


def test_evaluate_runs_the_real_model(en_zh_run, capsys):
    assert main(["evaluate", str(en_zh_run), "--beam", "1", "--limit", "3",
                 "--max_len", "8"]) == 0
    assert "tok:zh" in capsys.readouterr().out
