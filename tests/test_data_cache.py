"""The implicit cache: where it is, what keys it, and clearing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minitransformer.cli import main
from minitransformer.data.cache import cache_dir, cache_root, clear_cache
from minitransformer.data.shards import TokenStream
from minitransformer.families import FAMILIES

FP = [{"path": "/a/b.txt", "bytes": 3, "sha256": "00" * 32}]


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("MINITRANSFORMER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "minitransformer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "minitransformer"


def test_every_part_of_the_key_moves_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path))
    tok, fam = {"kind": "char"}, {"name": "gpt", "special": []}
    base = cache_dir(FP, tok, fam, 1)
    assert base == cache_dir([dict(FP[0])], dict(tok), dict(fam), 1)  # stable
    assert base.parent == tmp_path / "tokens"
    changed = [cache_dir([{**FP[0], "sha256": "11" * 32}], tok, fam, 1),
               cache_dir(FP, {"kind": "bpe", "vocab_size": 300}, fam, 1),
               cache_dir(FP, tok, {"name": "encoder", "special": ["<mask>"]}, 1),
               cache_dir(FP, tok, fam, 2)]
    assert len({base, *changed}) == 5


def test_a_given_tokenizers_folder_from_an_older_separator_encoding_is_not_reused(
        monkeypatch, tmp_path):
    # a run's own tokenizer (resume, evaluate, --init_from): documents and separators encoded
    # as ids since SEPARATOR_VERSION 2, so a folder prepared before is prepared again
    from minitransformer.data import cache
    from minitransformer.tokenizers import CharTokenizer

    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "t.txt"
    text.write_text(ENGLISH, encoding="utf-8")
    family = {"name": "gpt", "special_tokens": [], "separator": ""}
    tok = CharTokenizer.fit(ENGLISH)
    folders = []
    for version in (1, cache.SEPARATOR_VERSION, cache.SEPARATOR_VERSION):
        monkeypatch.setattr(cache, "SEPARATOR_VERSION", version)
        got = cache.prepare_cached([str(text)], family, "char", tokenizer=tok,
                                   echo=lambda line: None)
        folders.append((got.folder, got.reused))
    assert folders[0][0] != folders[1][0] == folders[2][0]
    assert [reused for _, reused in folders] == [False, False, True]


def test_clear_cache_removes_it_and_says_what_it_freed(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "c"))
    lines: list[str] = []
    assert clear_cache(lines.append) == 0 and "nothing to remove" in lines[-1]
    folder = tmp_path / "c" / "tokens" / "k"
    folder.mkdir(parents=True)
    (folder / "tokens.bin").write_bytes(b"\0" * 2_000_000)
    assert clear_cache(lines.append) == 2_000_000
    assert not (tmp_path / "c").exists() and "2.0 MB freed" in lines[-1]


def test_clear_cache_alone_refuses_the_flags_of_a_prepare(monkeypatch, tmp_path, capsys):
    """prepare --clear_cache --force (or --tokenizer ...) emptied the cache and ignored the
    rest; half a prepare (--data without --out) emptied it, then stopped."""
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "c"))
    folder = tmp_path / "c" / "tokens" / "k"
    folder.mkdir(parents=True)
    (folder / "tokens.bin").write_bytes(b"\0" * 10)
    for extra, said in ((["--force"], "--force belong(s) to a prepare"),
                        (["--tokenizer", "bpe", "--workers", "2"], "--tokenizer, --workers"),
                        (["--data", "x.txt"], "needs --data SOURCE and --out DATA_DIR")):
        assert main(["prepare", "--clear_cache", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err
        assert (folder / "tokens.bin").exists()  # the cache as it was
    assert main(["prepare", "--clear_cache"]) == 0 and not (tmp_path / "c").exists()


# ---- train --data FILE: prepared into the cache, the same losses as the in-memory path -------

ENGLISH = "To be, or not to be: that is the question.\r\nWhether 'tis nobler in the mind.\r\n" * 60
DEBUG = ["--preset", "debug", "--block_size", "16", "--max_iters", "6", "--eval_interval", "3",
         "--eval_iters", "2", "--sample_tokens", "0", "--quiet"]


def _losses(run) -> list[str]:
    rows = (run / "log.csv").read_text(encoding="utf-8").splitlines()
    return [",".join(row.split(",")[:5]) for row in rows]  # no timings


def _in_memory(monkeypatch):
    """Yesterday's path, as the reference: the whole text read, newlines normalised, the
    tokenizer fitted on it, ids in a tensor, split 90/10 by split_ids."""
    import torch

    from minitransformer.data import load_text, normalize_newlines, split_ids
    from minitransformer.families.base import Prepared
    from minitransformer.families.streams import StreamFamily
    from minitransformer.tokenizers import fit_tokenizer

    def prepare(self, source, encoding, fields, kind, source_tgt=None, newline=None,
                text_field=None):
        text, _ = normalize_newlines(load_text(source, encoding), newline or "normalize")
        tok = fit_tokenizer(kind or "char", text, fields.get("vocab_size"), self.special_tokens)
        train, val = split_ids(torch.tensor(tok.encode(text), dtype=torch.long))
        return Prepared(source, encoding, tok, {"source": source, "tokenizer": tok.kind},
                        train, val, extra=self.tokenizer_extras(tok))

    monkeypatch.setattr(StreamFamily, "prepare", prepare)


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_file_trains_from_the_cache_as_it_trained_in_memory(tmp_path, capsys, monkeypatch,
                                                              tokenizer):
    text = tmp_path / "t.txt"
    text.write_bytes(ENGLISH.encode("utf-8"))  # CRLF: read as \n, as before
    flags = [*DEBUG, "--tokenizer", tokenizer, *(["--vocab_size", "300"] if tokenizer == "bpe"
                                                 else [])]
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "map"), *flags]) == 0
    said = capsys.readouterr().out
    assert f"into {cache_root()}" in said and "reusing it next time" in said
    prepared = FAMILIES["gpt"].prepare(str(text), "utf-8", {"vocab_size": 300}, tokenizer)
    assert "using the prepared cache" in capsys.readouterr().out  # the second time: read
    assert isinstance(prepared.train_ids, TokenStream)
    with monkeypatch.context() as m:
        _in_memory(m)
        assert main(["train", "--data", str(text), "--out", str(tmp_path / "mem"), *flags]) == 0
    assert _losses(tmp_path / "map") == _losses(tmp_path / "mem")
    tokens = [json.loads((tmp_path / r / "tokenizer.json").read_text(encoding="utf-8"))
              for r in ("map", "mem")]
    assert tokens[0] == tokens[1]


def test_a_run_on_a_file_resumes_and_evaluates_anywhere_and_names_a_moved_source(
        tmp_path, capsys, monkeypatch):
    text = tmp_path / "data" / "t.txt"
    text.parent.mkdir()
    text.write_text(ENGLISH.replace("\r\n", "\n"), encoding="utf-8")
    monkeypatch.chdir(text.parent)
    assert main(["train", "--data", "t.txt", "--out", str(tmp_path / "run"), *DEBUG]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))["data"]
    assert saved["source"] == str(text) and saved["sources"][0]["path"] == str(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    first = capsys.readouterr()
    assert first.out.startswith("val loss") and not first.err  # read from the cache, silently
    clear_cache(lambda line: None)  # a cleared cache is prepared again, the same ids
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    again = capsys.readouterr()
    assert again.out == first.out and "prepared" in again.err
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--max_iters", "7",
                 "--quiet"]) == 0
    capsys.readouterr()
    moved = tmp_path / "moved.txt"
    text.rename(moved)
    for argv in (["evaluate", str(tmp_path / "run")],
                 ["train", "--out", str(tmp_path / "run"), "--resume", "--max_iters", "8"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert str(text) in err and "--data" in err and err.count("\n") == 1, err
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(moved)]) == 0
    capsys.readouterr()
    moved.write_text(ENGLISH.replace("\r\n", "\n").upper(), encoding="utf-8")
    moved.rename(text)
    assert main(["evaluate", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{text} changed" in err and "--data" in err and err.count("\n") == 1, err
    # named with --data, the changed file is read as it is now: another text, scored whole,
    # and a resume trains on it (and records it: no --data needed after)
    text.write_text(ENGLISH.replace("\r\n", "\n") * 2, encoding="utf-8")  # its own letters
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(text)]) == 0, \
        capsys.readouterr().err
    assert "all of" in capsys.readouterr().out
    for extra in (["--data", str(text)], []):
        assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--max_iters", "9",
                     "--quiet", *extra]) == 0, capsys.readouterr().err


def test_several_sources_are_prepared_together_in_order(tmp_path, capsys):
    from minitransformer.cli import build_parser
    from minitransformer.cli.train import data_flag

    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl"
    a.write_text(ENGLISH.replace("\r\n", "\n"), encoding="utf-8")
    b.write_text("".join(json.dumps({"text": "从前有座山，山里有座庙。\n" * 20}, ensure_ascii=False)
                         + "\n" for _ in range(3)), encoding="utf-8")
    parse = build_parser().parse_args
    for argv in (["--data", str(a), str(b)], ["--data", str(a), "--data", str(b)]):
        assert data_flag(parse(["train", *argv, "--out", "x"]).data) == [str(a), str(b)]
    assert data_flag(parse(["train", "--data", str(a), "--out", "x"]).data) == str(a)
    assert main(["train", "--data", str(a), str(b), "--out", str(tmp_path / "run"),
                 *DEBUG]) == 0
    assert f"of {a}, {b} into" in capsys.readouterr().out
    data = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))["data"]
    assert data["source"] == [str(a), str(b)]  # several: a list; one stays a string
    assert [s["path"] for s in data["sources"]] == [str(a), str(b)]
    prepared = FAMILIES["gpt"].prepare([str(a), str(b)], "utf-8", {}, None)
    assert "using the prepared cache" in capsys.readouterr().out
    ids = prepared.train_ids.tolist() + prepared.val_ids.tolist()
    docs = [ENGLISH.replace("\r\n", "\n"), *["从前有座山，山里有座庙。\n" * 20] * 3]
    assert prepared.tokenizer.decode(ids) == "\n\n".join(docs)
    val = prepared.tokenizer.decode(prepared.val_ids.tolist())  # whole documents, the last too
    assert val in {"".join("\n\n" + d for d in docs[i:]) for i in (1, 2, 3)}
    assert main(["evaluate", str(tmp_path / "run")]) == 0


def test_text_field_reads_another_field_and_the_run_keeps_it(tmp_path, capsys, monkeypatch):
    """train --text_field NAME reads that field of each JSONL record: the same tokens as a
    file of field "text" holding the same documents; the run records it, and resume and
    evaluate read it again; where it does not apply it is an error, never ignored."""
    lines = ENGLISH.replace("\r\n", "\n").splitlines()
    docs = ["\n".join(lines[i:i + 8]) for i in range(0, len(lines), 8)]
    body, text = tmp_path / "body.jsonl", tmp_path / "text.jsonl"
    body.write_text("".join(json.dumps({"id": i, "body": d, "rev": d[::-1]}) + "\n"
                            for i, d in enumerate(docs)), encoding="utf-8")
    text.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "--data", str(body), "--text_field", "body", "--out", str(run),
                 *DEBUG]) == 0
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "ref"), *DEBUG]) == 0
    assert _losses(run) == _losses(tmp_path / "ref")
    data = json.loads((run / "config.json").read_text(encoding="utf-8"))["data"]
    assert data["text_field"] == "body"
    ref = json.loads((tmp_path / "ref" / "config.json").read_text(encoding="utf-8"))["data"]
    assert "text_field" not in ref and ref["cache"] != data["cache"]
    capsys.readouterr()
    clear_cache(lambda line: None)  # prepared again from the recorded field
    assert main(["evaluate", str(run)]) == 0
    own = capsys.readouterr().out
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(body.read_bytes())
    assert main(["evaluate", str(run), "--data", str(copy)]) == 2  # another file: "text"...
    assert "no text field 'text'" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--data", str(copy), "--text_field", "body"]) == 0
    out = capsys.readouterr().out  # ... unless another is named: the run's own, by its split
    assert out.splitlines()[:-1] == own.splitlines()[:-1] and "val split of copy" in out
    assert main(["evaluate", str(run), "--data", str(text)]) == 0
    assert "all of text.jsonl" in capsys.readouterr().out  # the same text, another file: whole
    assert main(["evaluate", str(run), "--data", str(body), "--text_field", "id"]) == 2
    assert "holds int, not text" in capsys.readouterr().err  # not the run's cached "body"
    assert main(["evaluate", str(run), "--data", str(body), "--text_field", "rev"]) == 0
    assert "all of body.jsonl" in capsys.readouterr().out  # its own file, another text
    monkeypatch.chdir(tmp_path)  # the run's own file named relatively: still its own field
    assert main(["evaluate", str(run), "--data", body.name]) == 0
    assert capsys.readouterr().out == own
    moved = tmp_path / "moved.jsonl"
    body.rename(moved)  # resumed from where it moved to: the same field, still recorded
    assert main(["train", "--out", str(run), "--resume", "--data", str(moved), "--max_iters",
                 "7", "--quiet"]) == 0
    saved = json.loads((run / "config.json").read_text(encoding="utf-8"))["data"]
    assert saved["text_field"] == "body" and saved["source"] == str(moved)
    moved.rename(body)
    assert main(["train", "--out", str(run), "--resume", "--data", str(body), "--max_iters",
                 "8", "--quiet"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--data", str(text), "--text_field",
                 "text", "--max_iters", "9", "--quiet"]) == 0  # new text, another field
    saved = json.loads((run / "config.json").read_text(encoding="utf-8"))["data"]
    assert "text_field" not in saved and saved["source"] == str(text)
    capsys.readouterr()
    plain = tmp_path / "plain.txt"
    plain.write_text(ENGLISH, encoding="utf-8")
    assert main(["prepare", "--data", str(body), "--text_field", "body", "--out",
                 str(tmp_path / "dd")]) == 0
    capsys.readouterr()
    for argv, said in [
            (["train", "--data", str(tmp_path / "dd"), "--text_field", "body", "--out",
              str(tmp_path / "r1"), *DEBUG], "is prepared"),
            (["train", "--data", str(body), "--out", str(tmp_path / "r2"), *DEBUG],
             "no text field 'text'; its fields are id, body"),
            (["train", "--data", str(plain), "--text_field", "body", "--out",
              str(tmp_path / "r3"), *DEBUG], "plain.txt is plain text"),
            (["train", "--out", str(run), "--resume", "--text_field", "id"],
             "by its --text_field (text); another field is for a new --data"),
            (["train", "--data", "bible_en_es", "--text_field", "body", "--out",
              str(tmp_path / "r4"), *DEBUG], "--src and --tgt"),
            (["prepare", "--data", str(plain), "--text_field", "body", "--out",
              str(tmp_path / "d")], "plain text"),
            (["evaluate", str(run), "--text_field", "body"], "names the text of --data")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "r3").exists() and not (tmp_path / "d").exists()


def test_json_lines_in_json_and_ndjson_files_are_records(tmp_path, capsys):
    """datasets' to_json writes JSON Lines to .json: read by records, as .jsonl and .ndjson;
    a .json file holding one document over several lines stays one text."""
    from minitransformer.data.sources import read_documents

    docs = ["the first record", "the second,\nover two lines"]
    lines = "".join(json.dumps({"content": d}) + "\n" for d in docs)
    for name in ("a.jsonl", "a.ndjson", "a.json"):
        (tmp_path / name).write_text(lines, encoding="utf-8")
        got = [d.text for d in read_documents([tmp_path / name], "content")]
        assert got == docs, name
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"content": "x"}, indent=2), encoding="utf-8")
    assert [d.text for d in read_documents([pretty], "content")] == [pretty.read_text()]
    assert main(["train", "--data", str(tmp_path / "a.json"), "--text_field", "content",
                 "--out", str(tmp_path / "run"), *DEBUG[:2], "--block_size", "4",
                 "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
                 "--sample_tokens", "0", "--quiet"]) == 0
    capsys.readouterr()


def test_a_compressed_file_is_named_as_compressed(tmp_path, capsys):
    """A .gz (or bzip2, xz, zstd, zip) file is refused as compressed, not as "binary"."""
    import gzip

    packed = tmp_path / "d.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"text": "hello"}\n' * 50))
    for argv in (["train", "--data", str(packed), "--out", str(tmp_path / "r"), *DEBUG],
                 ["train", "--data", str(packed), "--text_field", "body", "--out",
                  str(tmp_path / "r"), *DEBUG],
                 ["prepare", "--data", str(packed), "--out", str(tmp_path / "d")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "d.jsonl.gz is gzip-compressed; decompress it" in err and err.count("\n") == 1


def test_torchruns_other_ranks_wait_while_local_rank_0_prepares(tmp_path, monkeypatch):
    import threading

    from minitransformer.data import cache

    for env, waits in (({"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, True),
                       ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, False), ({}, False)):
        for key in ("WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert cache._waiting_rank() is waits
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "t.txt"
    text.write_text(ENGLISH, encoding="utf-8")
    family = {"name": "gpt", "special_tokens": [], "separator": ""}
    monkeypatch.setattr(cache, "_waiting_rank", lambda: threading.current_thread().name == "r1")
    got = {}
    other = threading.Thread(name="r1", target=lambda: got.setdefault(
        "r1", cache.prepare_cached([str(text)], family, "char", echo=print)))
    other.start()
    other.join(0.6)
    assert other.is_alive() and not list((cache_root() / "tokens").glob("*/manifest.json"))
    first = cache.prepare_cached([str(text)], family, "char", echo=lambda line: None)
    other.join(5)
    assert not other.is_alive() and got["r1"].folder == first.folder
    assert got["r1"].reused and not first.reused and got["r1"].crlf == first.crlf == 120


def test_documents_reach_the_bpe_sample_in_blocks():
    """The sample keeps or skips whole blocks: a large file as one block would put every one
    of its lines into the fit."""
    from minitransformer.data.cache import _blocks
    from minitransformer.data.sources import Document

    docs = [Document("abcdefg", "a"), Document("", "b"), Document("hi", "c")]
    assert list(_blocks(docs, 3)) == [(True, "abc", 3), (False, "def", 3), (False, "g", 1),
                                      (True, "", 0), (True, "hi", 2)]


def test_a_damaged_cache_is_prepared_again_not_an_error(tmp_path, capsys):
    """The cache is the program's, not the user's: a tokens file cut short (a full disk, a
    copy stopped) is made again, with a note, and gives the same ids and loss."""
    from minitransformer.data.cache import cache_root

    text = tmp_path / "t.txt"
    text.write_text(ENGLISH.replace("\r\n", "\n"), encoding="utf-8")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *DEBUG]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    first = capsys.readouterr().out
    # the run's own text, named: its cache, not a second one
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(text)]) == 0
    named = capsys.readouterr()
    assert named.out == first and "prepared" not in named.err, named.err
    key = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))["data"][
        "cache"]
    tokens = cache_root() / "tokens" / key / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    assert main(["evaluate", str(tmp_path / "run")]) == 0
    again = capsys.readouterr()
    assert again.out == first and "prepared" in again.err, (again, first)
    tokens.write_bytes(tokens.read_bytes()[:-2])  # and a new run on the same text
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run2"), *DEBUG]) == 0
    assert "damaged; preparing it again" in capsys.readouterr().out
