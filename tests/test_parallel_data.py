"""Parallel corpora, the chapter split, BPE, bucketed batches, and the seq2seq CLI."""

from __future__ import annotations

import json

import pytest
import torch

from minitransformer.cli import main
from minitransformer.data.parallel_corpus import (
    bucket_batches,
    chapter_of,
    collate,
    load_parallel,
    read_tsv,
    split_indices,
)
from minitransformer.errors import UserError
from minitransformer.tokenizers import BPETokenizer, tokenizer_from_dict
from minitransformer.training.seq2seq_task import Seq2SeqTask

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def bible():
    return load_parallel("bible_en_es")


def test_bundled_corpus_and_chapter_split(bible):
    assert len(bible) == 30189 and (bible.src_lang, bible.tgt_lang) == ("en", "es")
    assert bible.src[0].startswith("In the beginning")
    assert bible.tgt[0].startswith("En el principio")
    assert bible.groups[0] == "Gen 1" and chapter_of("1 John 5:7") == "1 John 5"
    splits = split_indices(bible.groups)
    assert splits == split_indices(bible.groups)  # deterministic
    every = sorted(splits["train"] + splits["valid"] + splits["test"])
    assert every == list(range(len(bible)))
    chapters = {name: {bible.groups[i] for i in idx} for name, idx in splits.items()}
    assert not chapters["train"] & chapters["valid"]
    assert not chapters["train"] & chapters["test"]
    assert not chapters["valid"] & chapters["test"]
    for name in ("valid", "test"):
        assert 0.03 <= len(splits[name]) / len(bible) < 0.035
        assert len({c.rsplit(" ", 1)[0] for c in chapters[name]}) > 10  # spread over books


def test_tsv_columns_by_name_index_and_without_header(tmp_path):
    with_header = tmp_path / "h.tsv"
    with_header.write_text("id\tfr\tde\n1\tbonjour\thallo\n2\tmerci\tdanke\n", encoding="utf-8")
    c = read_tsv(str(with_header), "de", "fr")
    assert (c.src, c.tgt, c.src_lang) == (["hallo", "danke"], ["bonjour", "merci"], "de")
    c = read_tsv(str(with_header), "1", "2")
    assert c.src == ["bonjour", "merci"]
    with pytest.raises(UserError, match="no column named 'en'"):
        read_tsv(str(with_header))
    bare = tmp_path / "b.tsv"
    bare.write_text("Good morning.\tBuenos días.\n\nThank you.\tGracias.\n", encoding="utf-8")
    c = read_tsv(str(bare))
    assert c.src == ["Good morning.", "Thank you."] and c.tgt == ["Buenos días.", "Gracias."]
    assert read_tsv(str(bare), "1", "0").src == ["Buenos días.", "Gracias."]
    one = tmp_path / "one.txt"  # plain text: no column flags could make pairs of it
    one.write_text("Good morning.\nThank you.\n", encoding="utf-8")
    with pytest.raises(UserError, match="one column, not sentence pairs"):
        read_tsv(str(one))
    three = tmp_path / "three.tsv"
    three.write_text("1\tGood morning.\tBuenos días.\n", encoding="utf-8")
    with pytest.raises(UserError, match="3 columns and no header; say which to use"):
        read_tsv(str(three))


def test_a_header_is_known_by_its_names(tmp_path):
    """A column asked for that is not in the header is an error listing the header (not "it
    has no header"), and columns named in Chinese make a header, not a training pair."""
    en_zh = tmp_path / "en_zh.tsv"
    en_zh.write_text("en\tzh\nI love cats.\t我爱猫。\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"no column named 'fr' for the tgt \(its header has "
                                        r"en, zh; name a column: --tgt zh\)"):
        read_tsv(str(en_zh), tgt="fr")
    named = tmp_path / "named.tsv"
    named.write_text("英文\t中文\nI love cats.\t我爱猫。\nThank you.\t谢谢。\n", encoding="utf-8")
    c = read_tsv(str(named), "英文", "中文")
    assert (c.src_lang, c.tgt_lang, c.tgt) == ("英文", "中文", ["我爱猫。", "谢谢。"])
    with pytest.raises(UserError, match="its header has 英文, 中文; name a column: --src 英文"):
        read_tsv(str(named))
    pairs = tmp_path / "pairs.tsv"  # short Chinese sentences are still sentences
    pairs.write_text("你好。\tHello.\n谢谢\tThanks\n", encoding="utf-8")
    assert read_tsv(str(pairs)).src == ["你好。", "谢谢"]


def test_two_aligned_files(tmp_path):
    a, b = tmp_path / "a.en", tmp_path / "b.es"
    a.write_text("one\ntwo\nthree\n", encoding="utf-8")
    b.write_text("uno\ndos\ntres\n", encoding="utf-8")
    c = load_parallel(str(a), str(b))
    assert c.src == ["one", "two", "three"] and c.tgt == ["uno", "dos", "tres"]
    assert len(set(c.groups)) == 3  # small corpus: blocks of one line
    assert (c.src_lang, c.tgt_lang) == ("a", "b")  # names that differ: the names
    (tmp_path / "train.en").write_bytes(a.read_bytes())
    (tmp_path / "train.es").write_bytes(b.read_bytes())
    c = load_parallel(str(tmp_path / "train.en"), str(tmp_path / "train.es"))
    assert (c.src_lang, c.tgt_lang) == ("en", "es")  # only the suffixes differ: them
    a.write_text("one\ttwo\nthree\nfour\n", encoding="utf-8")  # a stray tab: a sentence's
    b.write_text("uno\ndos\ntres\n", encoding="utf-8")
    assert load_parallel(str(a), str(b)).src == ["one\ttwo", "three", "four"]


BAD_INPUTS = [
    ("cols.tsv", "en\tes\nHello.\tHola.\nOops, no tab here\nBye.\tAdiós.\n", None,
     "cols.tsv:3: expected 2 tab-separated columns, found 1"),
    ("empty.tsv", "en\tes\nHello.\tHola.\nBye.\t  \n", None, "empty.tsv:3: the es side is empty"),
    ("a.txt", "one\ntwo\nthree\n", ("b.txt", "uno\ndos\n"),
     "b.txt:3: the file ends here, but a.txt goes on to line 3"),
    # a TSV given with --data_tgt: its lines were read whole as source sentences
    ("pairs.tsv", "Hello.\nHi.\tHola.\nBye.\tAdiós.\n", ("b.txt", "Hola.\nHola.\nAdiós.\n"),
     "pairs.tsv:2: 2 of its 3 lines hold a tab between two texts, as a TSV of "
     "source<TAB>target pairs does: give such a file alone as --data, without --data_tgt"),
]


@pytest.mark.parametrize("name,text,other,message", BAD_INPUTS)
def test_bad_parallel_input_is_one_line_exit_2(tmp_path, capsys, name, text, other, message):
    (tmp_path / name).write_text(text, encoding="utf-8")
    argv = ["train", "--model", "seq2seq", "--data", str(tmp_path / name),
            "--out", str(tmp_path / "run"), "--preset", "debug", "--quiet"]
    if other:
        (tmp_path / other[0]).write_text(other[1], encoding="utf-8")
        argv += ["--data-tgt", str(tmp_path / other[0])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert message in err.replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize("block, flags", [("49", "--block_size and --train_max_len"),
                                          ("200", "--train_max_len"), ("20", "--block_size")])
def test_pairs_all_too_long_name_the_limits_to_raise(tmp_path, capsys, block, flags):
    """Training pairs are cut at the lower of block_size - 1 and train_max_len (48): the
    refusal names the flag that sets it, both where they are equal."""
    words = " ".join(f"w{i}" for i in range(60))
    pairs = tmp_path / "long.tsv"
    pairs.write_text("".join(f"{words} {i}\t{words} {i}\n" for i in range(200)), encoding="utf-8")
    assert main(["train", "--data", str(pairs), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--vocab_size", "300", "--block_size", block, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"every train pair is longer than {min(int(block) - 1, 48)} tokens; "
                        f"raise {flags}"), err


def test_bad_input_through_the_real_cli(tmp_path, run_cli):
    bad = tmp_path / "bad.tsv"
    bad.write_text("ref\ten\tes\nGen 1:1\tIn the beginning\tEn el principio\nGen 1:2\tx\n",
                   encoding="utf-8")
    r = run_cli("train", "--data", bad, "--out", tmp_path / "run", "--preset", "debug")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().endswith(f"{bad}:3: expected 3 tab-separated columns, found 2")
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_bpe_tokenizer(tmp_path, bible):
    tok = BPETokenizer.train(bible.src[:3000] + bible.tgt[:3000], vocab_size=800)
    assert tok.vocab_size == 800
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    for text in bible.src[5000:5050] + bible.tgt[5000:5050]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([tok.bos_id, *tok.encode("Dios"), tok.eos_id]) == "Dios"
    assert tok.tokens("中") == ["▁", "<unk>"]  # never seen in training
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(bible.src[7]) == tok.encode(bible.src[7])
    path = tmp_path / "hf.json"
    path.write_text(tok.to_dict()["tokenizer"], encoding="utf-8")  # a plain HF tokenizer.json
    assert BPETokenizer.from_file(path).encode("God said") == tok.encode("God said")
    byte = BPETokenizer.train(bible.tgt[:2000], vocab_size=400, byte_level=True)
    for text in ["¿Qué? ¡Sí! Jehová", "中文 and emoji 🙂", "  two  spaces"]:
        assert byte.decode(byte.encode(text)) == text  # bytes: nothing is unknown


def test_bucketed_batches_and_collate():
    g = torch.Generator().manual_seed(0)
    src_lens = torch.randint(2, 60, (500,), generator=g).tolist()
    tgt_lens = [max(1, s + int(d)) for s, d in zip(src_lens, torch.randint(-3, 4, (500,),
                                                                          generator=g),
                                                    strict=True)]
    batches = bucket_batches(src_lens, tgt_lens, max_sentences=32, max_tokens=400)
    assert sorted(i for b in batches for i in b) == list(range(500))
    padded = real = 0
    for b in batches:
        longest = max(max(src_lens[i], tgt_lens[i] + 1) for i in b)
        assert len(b) <= 32 and (len(b) * longest <= 400 or len(b) == 1)
        padded += len(b) * max(src_lens[i] for i in b)
        real += sum(src_lens[i] for i in b)
    assert real / padded > 0.9  # length buckets: little padding
    src, tgt_in, tgt_out = collate([[5, 6, EOS], [7, EOS]], [[8, 9], [10]], PAD, BOS, EOS)
    assert src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert tgt_in.tolist() == [[BOS, 8, 9], [BOS, 10, PAD]]
    assert tgt_out.tolist() == [[8, 9, EOS], [10, EOS, PAD]]


def test_task_batches_are_reproducible_and_val_loss_is_plain():
    src = [[3 + i % 5, 4, EOS] for i in range(40)]
    tgt = [[5, 6 + i % 3] for i in range(40)]
    task = Seq2SeqTask({"train": (src, tgt), "valid": (src[:8], tgt[:8])}, PAD, BOS, EOS,
                       batch_tokens=40)
    a = task.batch("train", 16, torch.Generator().manual_seed(1))
    b = task.batch("train", 16, torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a[0].shape[0] <= 16 and a[0].shape[0] * a[0].shape[1] <= 40
    assert task.batch("val", 16, torch.Generator())[0].shape[0] <= 8


def test_train_translate_evaluate_resume(tmp_path, run_cli, bible, capsys):
    corpus = tmp_path / "mini.tsv"
    rows = ["ref\ten\tes"] + [f"Gen {1 + i // 20}:{1 + i % 20}\t{s}\t{t}"
                              for i, (s, t) in enumerate(zip(bible.src[:600], bible.tgt[:600],
                                                             strict=True))]
    corpus.write_text("\n".join(rows) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    r = run_cli("train", "--data", corpus, "--out", run, "--preset", "debug", "--max_iters",
                "6", "--eval_interval", "3", "--vocab_size", "300", "--quiet")
    assert r.returncode == 0, r.stderr
    meta = json.loads((run / "config.json").read_text(encoding="utf-8"))
    assert meta["family"] == "seq2seq" and meta["model"]["vocab_size"] == 300
    # in this process from here (each command in a fresh one costs seconds of imports)
    capsys.readouterr()
    assert main(["translate", str(run), "God said.", "--beam", "2", "--max-len", "5"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["evaluate", str(run), "--limit", "8", "--max-len", "5", "--examples",
                 "1"]) == 0
    out = capsys.readouterr().out
    assert "greedy   BLEU" in out and "beam 4   BLEU" in out
    assert f"{corpus}: 8 test pairs" in out, out

    def evaluate(*args) -> str:
        assert main(["evaluate", str(run), *map(str, args), "--max-len", "5", "--beam", "1",
                     "--examples", "0"]) == 0
        return capsys.readouterr().out

    # the run's own pairs under another name (a copy, a moved file): still its test split
    copy = tmp_path / "copy.tsv"
    copy.write_bytes(corpus.read_bytes())
    assert f"{copy}: 8 test pairs" in evaluate("--data", copy, "--limit", "8")
    # another corpus is a test set: all of its pairs are scored, not a 3% split of them
    other = tmp_path / "other.tsv"
    other.write_text("\n".join(rows[:41]) + "\n", encoding="utf-8")
    out = evaluate("--data", other)
    assert "(batches drawn from all 40 pairs)" in out and f"{other}: all 40 pairs" in out, out
    greedy = next(line for line in out.splitlines() if line.startswith("greedy"))
    # the same test set as two aligned files: the same pairs, the same BLEU
    for i, name in ((1, "test.en"), (2, "test.es")):
        (tmp_path / name).write_text("\n".join(row.split("\t")[i] for row in rows[1:41]) + "\n",
                                     encoding="utf-8")
    out = evaluate("--data", tmp_path / "test.en", "--data_tgt", tmp_path / "test.es")
    assert "all 40 pairs en -> es" in out and greedy in out, out
    assert main(["train", "--out", str(run), "--resume", "--max_iters", "9", "--quiet"]) == 0
    assert json.loads((run / "checkpoints" / "step_0000009" / "config.json")
                      .read_text(encoding="utf-8"))["step"] == 9
