"""prepare: sources into memory-mapped token shards; train and evaluate read them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from minitransformer.cli import main
from minitransformer.data.shards import MANIFEST, TOKENS, TokenStream, joined, open_shards
from minitransformer.tokenizers import load_tokenizer

ENGLISH = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind.\n" * 30
CHINESE = "从前有座山，山里有座庙。\n我吃了一个红苹果。\n" * 40
DEBUG = ["--preset", "debug", "--block_size", "16", "--max_iters", "6", "--eval_interval", "3",
         "--eval_iters", "2", "--sample_tokens", "0", "--quiet"]


def _decode(folder) -> str:
    manifest, train, val = open_shards(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    ids = np.fromfile(folder / TOKENS, dtype=manifest["dtype"]).tolist()
    assert len(train) + len(val) == len(ids) == manifest["tokens"]
    return tok.decode(ids)


def test_a_folder_of_english_and_chinese_decodes_back_exactly(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text(ENGLISH, encoding="utf-8")
    (books / "b.txt").write_text(CHINESE, encoding="utf-8")
    assert main(["prepare", "--data", str(books), "--out", str(tmp_path / "dd")]) == 0
    assert _decode(tmp_path / "dd") == ENGLISH + "\n\n" + CHINESE
    manifest = json.loads((tmp_path / "dd" / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["documents"] == 2 and manifest["dtype"] == "uint16"
    assert manifest["val_start"] == len(ENGLISH)  # the last document is the val split
    assert sum(manifest["counts"]) == manifest["tokens"]
    assert all(s["path"].endswith(n) for s, n in zip(manifest["sources"], ["a.txt", "b.txt"],
                                                     strict=True))


def test_jsonl_with_bpe_decodes_back_exactly(tmp_path):
    rows = [{"text": ENGLISH[:500], "id": 1}, {"text": CHINESE[:300], "id": 2},
            {"text": ENGLISH[500:1500], "id": 3}]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n",
                    encoding="utf-8")
    assert main(["prepare", "--data", str(path), "--out", str(tmp_path / "dd"), "--tokenizer",
                 "bpe-bytes", "--vocab_size", "300"]) == 0
    manifest, _, _ = open_shards(tmp_path / "dd")
    tok = load_tokenizer(tmp_path / "dd" / "tokenizer.json")
    ids = np.fromfile(tmp_path / "dd" / TOKENS, dtype=manifest["dtype"]).tolist()
    eot = tok.token_to_id("<|endoftext|>")
    assert ids.count(eot) == 2  # GPT-2's end-of-text between documents
    pieces, cur = [], []
    for i in ids:
        if i == eot:
            pieces.append(tok.decode(cur))
            cur = []
        else:
            cur.append(i)
    pieces.append(tok.decode(cur))
    assert pieces == [r["text"] for r in rows]


def test_training_on_prepared_shards_equals_training_on_the_file(tmp_path, capsys):
    """One file: the same ids, the same split, the same batches, the same losses."""
    text = tmp_path / "t.txt"
    text.write_text(ENGLISH * 3, encoding="utf-8")
    assert main(["prepare", "--data", str(text), "--out", str(tmp_path / "dd")]) == 0
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "mem"), *DEBUG]) == 0
    assert main(["train", "--data", str(tmp_path / "dd"), "--out", str(tmp_path / "map"),
                 *DEBUG]) == 0
    log = [(tmp_path / r / "log.csv").read_text(encoding="utf-8").splitlines()
           for r in ("mem", "map")]
    strip = [[",".join(row.split(",")[:5]) for row in rows] for rows in log]  # no timings
    assert strip[0] == strip[1]
    capsys.readouterr()
    # resumed and evaluated from the run folder alone, whatever the working directory
    assert main(["train", "--out", str(tmp_path / "map"), "--resume", "--max_iters", "9",
                 "--quiet"]) == 0
    assert main(["evaluate", str(tmp_path / "map")]) == 0
    assert "val loss" in capsys.readouterr().out


def test_an_encoder_trains_on_shards(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(ENGLISH * 3, encoding="utf-8")
    capsys.readouterr()
    assert main(["prepare", "--model", "encoder", "--data", str(text), "--out",
                 str(tmp_path / "dd")]) == 0
    # the command it suggests trains an encoder (train's default family is GPT)
    hint = capsys.readouterr().out.split("train on it: ")[1].split()
    assert hint[:4] == ["minitransformer", "train", "--model", "encoder"], hint
    assert main([*hint[1:-1], str(tmp_path / "run"), *DEBUG]) == 0
    # scored on the folder's own val split; the text it was prepared from is another text,
    # scored whole (its own 90/10 split would not be the folder's)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    assert "the val split of dd" in capsys.readouterr().out.splitlines()[-1]
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(text)]) == 0
    assert "all of t.txt" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.parametrize("content, words", [
    ('{"text": "fine"}\nnot json\n', ["bad.jsonl:2", "not valid JSON"]),
    ('{"text": "fine"}\n["a list"]\n', ["bad.jsonl:2", "not a JSON object"]),
    ('{"body": "no text field"}\n', ["bad.jsonl:1", "'text'", "--text_field NAME"]),
    ('{"text": null}\n', ["bad.jsonl:1", "'text' is null", "--errors skip"]),
    ('{"text": 3}\n', ["bad.jsonl:1", "'text' holds int, not text"]),
])
def test_bad_jsonl_names_the_line(tmp_path, capsys, content, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    assert main(["prepare", "--data", str(path), "--out", str(tmp_path / "dd")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words), err
    assert not (tmp_path / "dd" / MANIFEST).exists()


def test_a_jsonl_file_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_text("\ufeff" + '{"text": "fine"}\n' * 40, encoding="utf-8")
    assert main(["prepare", "--data", str(path), "--out", str(tmp_path / "dd")]) == 0


def test_bad_folders_and_manifests_are_user_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["prepare", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "d")]) \
        == 2
    assert "empty folder" in capsys.readouterr().err
    (tmp_path / "cut" / ".partial").mkdir(parents=True)  # a prepare stopped halfway
    (tmp_path / "cut" / ".partial" / "tokens.bin").write_bytes(b"\0" * 8)
    for command in (["prepare", "--out", str(tmp_path / "d")], ["train", "--out",
                                                                str(tmp_path / "r")]):
        assert main([command[0], "--data", str(tmp_path / "cut"), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert "unfinished prepare" in err and err.count("\n") == 1, err
    text = tmp_path / "t.txt"
    text.write_text(ENGLISH, encoding="utf-8")
    assert main(["prepare", "--data", str(text), "--out", str(tmp_path / "dd")]) == 0
    assert main(["prepare", "--data", str(text), "--out", str(tmp_path / "dd")]) == 2
    assert "--force" in capsys.readouterr().err
    manifest = json.loads((tmp_path / "dd" / MANIFEST).read_text(encoding="utf-8"))
    (tmp_path / "dd" / MANIFEST).write_text(json.dumps({**manifest, "version": 99}),
                                            encoding="utf-8")
    assert main(["train", "--data", str(tmp_path / "dd"), "--out", str(tmp_path / "r"),
                 *DEBUG]) == 2
    assert "prepare it again" in capsys.readouterr().err
    for damage in ({"val_start": None}, {"tokens": "many"}, {"val_start": 10 ** 9}):
        changed = {**manifest, **damage}
        (tmp_path / "dd" / MANIFEST).write_text(json.dumps(
            {k: v for k, v in changed.items() if v is not None}), encoding="utf-8")
        assert main(["train", "--data", str(tmp_path / "dd"), "--out", str(tmp_path / "r"),
                     *DEBUG]) == 2  # was an internal error (KeyError: 'val_start')
        err = capsys.readouterr().err
        assert "manifest.json is damaged" in err and "prepare" in err, err


def test_a_data_dir_of_another_tokenizer_is_refused_for_resume_and_init_from(tmp_path, capsys):
    text, other = tmp_path / "t.txt", tmp_path / "other.txt"
    text.write_text(ENGLISH * 2, encoding="utf-8")
    other.write_text(ENGLISH.upper() * 2, encoding="utf-8")  # another alphabet
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *DEBUG,
                 "--max_iters", "2"]) == 0
    assert main(["prepare", "--data", str(other), "--out", str(tmp_path / "dd")]) == 0
    capsys.readouterr()
    for argv in (["--out", str(tmp_path / "run"), "--resume", "--max_iters", "4"],
                 ["--init_from", str(tmp_path / "run"), "--out", str(tmp_path / "ft")]):
        assert main(["train", *argv, "--data", str(tmp_path / "dd"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(tmp_path / "dd") in err, err
        assert "another tokenizer" in err and "char" in err, err
    assert main(["train", "--data", str(tmp_path / "dd"), str(text), "--out",
                 str(tmp_path / "both"), "--quiet"]) == 2
    assert "read alone" in capsys.readouterr().err


def test_joined_streams_read_the_whole_file_without_a_copy(tmp_path):
    ids = np.arange(1000, dtype=np.uint16)
    ids.tofile(tmp_path / "t.bin")
    mapped = np.memmap(tmp_path / "t.bin", dtype=np.uint16, mode="r")
    train, val = TokenStream(mapped[:900]), TokenStream(mapped[900:])
    whole = joined(train, val)
    assert len(whole) == 1000 and np.shares_memory(whole.array, mapped)
    assert whole[torch.tensor([[0, 899, 900, 999]])].tolist() == [[0, 899, 900, 999]]
    assert whole[:3].tolist() == [0, 1, 2]
    backwards = joined(val, train)  # not neighbours in that order: copied together
    assert not np.shares_memory(backwards.array, mapped)
    assert backwards.tolist() == list(range(900, 1000)) + list(range(900))
    assert joined(torch.tensor([1, 2]), torch.tensor([3])).tolist() == [1, 2, 3]
    # one token is "contiguous" whatever its stride: views that step are copied, never read
    # past as if they were a run of neighbours
    stepped = joined(TokenStream(mapped[9:20:50]), TokenStream(mapped[10:]))
    assert stepped.tolist() == list(range(9, 1000))
    backwards = joined(TokenStream(mapped[5:6][::-1]), TokenStream(mapped[6:]))
    assert backwards.tolist() == list(range(5, 1000))


def test_a_lopsided_split_is_noted(tmp_path, capsys, monkeypatch):
    """Two documents, the last 50 times the first: the split can only fall between them, so
    val holds 98% of the tokens; prepare and train's cache both say so. Evenly sized
    documents give no note."""
    from minitransformer.cli import main

    folder = tmp_path / "fold"
    folder.mkdir()
    (folder / "a.txt").write_text("x" * 61, encoding="utf-8")
    (folder / "b.txt").write_text("hello there. " * 230, encoding="utf-8")
    assert main(["prepare", "--data", str(folder), "--out", str(tmp_path / "d")]) == 0
    assert "note: the val split holds 98.0% of the tokens, not 10%" in capsys.readouterr().out
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--max_iters", "1", "--quiet", "--time_budget", "none",
                 "--sample_tokens", "0"]) == 0
    assert "note: the val split holds 98.0%" in capsys.readouterr().out
    # a second run on the cached text is told too (its split is the same)
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "run2"), "--preset",
                 "debug", "--max_iters", "1", "--time_budget", "none",
                 "--sample_tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert "using the prepared cache" in out and "note: the val split holds 98.0%" in out, out
    even = tmp_path / "even"
    even.mkdir()
    for i in range(20):
        (even / f"{i:02d}.txt").write_text(f"document {i} " * 40, encoding="utf-8")
    assert main(["prepare", "--data", str(even), "--out", str(tmp_path / "e")]) == 0
    assert "note:" not in capsys.readouterr().out
    # one short text: its split only rounds (1 of 4 tokens), never between documents
    (tmp_path / "s4.txt").write_text("山高月小", encoding="utf-8")
    assert main(["prepare", "--data", str(tmp_path / "s4.txt"), "--out", str(tmp_path / "s")]) \
        == 0
    assert "note:" not in capsys.readouterr().out


def test_our_own_folders_given_as_text_are_named_for_what_they_are(tmp_path, capsys):
    """A prepared folder given to prepare, one without its manifest (a stopped or damaged
    prepare) and a run folder: each said as such, not as "tokens.bin (or loss.png) looks
    like a binary file"."""
    import shutil

    text = tmp_path / "t.txt"
    text.write_text(ENGLISH, encoding="utf-8")
    dd = tmp_path / "dd"
    assert main(["prepare", "--data", str(text), "--out", str(dd)]) == 0
    assert main(["prepare", "--data", str(dd), "--out", str(tmp_path / "again")]) == 2
    assert "is prepared data already" in capsys.readouterr().err
    shutil.copytree(dd, tmp_path / "cut")
    (tmp_path / "cut" / MANIFEST).unlink()
    assert main(["train", "--data", str(tmp_path / "cut"), "--out", str(tmp_path / "r"),
                 *DEBUG]) == 2
    assert f"without its {MANIFEST}: a prepare that did not finish" in capsys.readouterr().err
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *DEBUG,
                 "--max_iters", "2"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--data", str(tmp_path / "run"), "--out", str(tmp_path / "p")]) == 2
    assert "is a training run (or a checkpoint), not text" in capsys.readouterr().err
