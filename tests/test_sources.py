"""Every source shape prepare reads decodes back to its exact text, English and Chinese, with
characters and byte-level BPE; bad Parquet and dataset folders are one-line user errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minitransformer.cli import main
from minitransformer.data.shards import MANIFEST, TOKENS, open_shards
from minitransformer.tokenizers import load_tokenizer

DOCS = ["To be, or not to be: that is the question.\nWhether 'tis nobler in the mind.\n" * 4,
        "从前有座山，山里有座庙。\n庙里有个老和尚。\n" * 5,
        "",  # an empty row is still a document
        "The cat sat on the mat.\n\n" * 3 + "床前明月光，疑是地上霜。",
        "A last line without its newline"]


def _documents(folder) -> list[str]:
    """The prepared text cut at the separator (BPE: the end-of-text id; char: a blank line,
    which the documents above never hold at their edges)."""
    manifest, _, _ = open_shards(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    ids = np.fromfile(folder / TOKENS, dtype=manifest["dtype"]).tolist()
    if tok.kind == "char":
        return [tok.decode(ids)]
    eot = tok.token_to_id("<|endoftext|>")
    cuts = [i for i, t in enumerate(ids) if t == eot]
    return [tok.decode(ids[a + 1:b]) for a, b in zip([-1, *cuts], [*cuts, len(ids)],
                                                      strict=True)]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """source -> the documents it holds, one folder of each shape."""
    datasets = pytest.importorskip("datasets", reason="datasets is in the test extra")
    root = tmp_path_factory.mktemp("sources")
    (root / "one.txt").write_text(DOCS[0] + DOCS[1], encoding="utf-8")
    (root / "books").mkdir()
    for i, doc in enumerate(DOCS):
        (root / "books" / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    (root / "export.jsonl").write_text("".join(json.dumps({"text": d, "id": i},
                                                          ensure_ascii=False) + "\n"
                                               for i, d in enumerate(DOCS)), encoding="utf-8")
    table = pa.table({"id": list(range(len(DOCS))), "text": DOCS})
    pq.write_table(table, root / "rows.parquet", row_group_size=2)  # three row groups
    ds = datasets.Dataset.from_dict({"text": DOCS, "id": list(range(len(DOCS)))})
    ds.save_to_disk(str(root / "saved"), num_shards=2)  # two Arrow files
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(root / "dict"))
    return root, {"one.txt": [DOCS[0] + DOCS[1]], "books": DOCS, "export.jsonl": DOCS,
                  "rows.parquet": DOCS, "saved": DOCS, "dict": DOCS}


@pytest.mark.parametrize("name", ["one.txt", "books", "export.jsonl", "rows.parquet", "saved",
                                  "dict"])
@pytest.mark.parametrize("tokenizer", ["char", "bpe-bytes"])
def test_each_source_shape_decodes_back_exactly(shapes, tmp_path, name, tokenizer):
    root, expected = shapes
    out = tmp_path / "dd"
    extra = ["--vocab_size", "300"] if tokenizer != "char" else []
    extra += ["--workers", "1"]  # in this process: the sources are what is tested here
    assert main(["prepare", "--data", str(root / name), "--out", str(out), "--tokenizer",
                 tokenizer, *extra]) == 0
    docs = expected[name]
    want = ["\n\n".join(docs)] if tokenizer == "char" else docs
    assert _documents(out) == want
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["documents"] == len(docs)
    if name == "saved":  # both Arrow files, each fingerprinted, in row order
        assert [s["path"].rsplit("/", 1)[1] for s in manifest["sources"]] == \
            ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]


def _prepare_fails(source, capsys, tmp_path, *flags) -> str:
    assert main(["prepare", "--data", str(source), "--out", str(tmp_path / "dd"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    assert not (tmp_path / "dd" / MANIFEST).exists()
    return err


def _prepare_bpe(source, out, *flags) -> None:
    """prepare with a small byte-level BPE, in this process (the sources are what is tested)."""
    assert main(["prepare", "--data", str(source), "--out", str(out), "--tokenizer",
                 "bpe-bytes", "--vocab_size", "300", "--workers", "1", *flags]) == 0


def test_a_parquet_file_without_the_column_lists_its_columns(shapes, tmp_path, capsys):
    root, _ = shapes
    err = _prepare_fails(root / "rows.parquet", capsys, tmp_path, "--text_field", "body")
    assert "rows.parquet" in err and "'body'" in err and "id, text" in err
    err = _prepare_fails(root / "rows.parquet", capsys, tmp_path, "--text_field", "id")
    assert "not text" in err


@pytest.mark.parametrize("shape", ["rows.parquet", "saved", "export.jsonl"])
def test_null_texts_stop_prepare_unless_skipped(tmp_path, capsys, shape):
    """A row or record whose text is null (common in Hugging Face data) names its place and
    the way out; --errors skip reads the rest, the documents of the file without them."""
    datasets = pytest.importorskip("datasets", reason="datasets is in the test extra")
    texts = [DOCS[0], None, DOCS[1], None]
    source = tmp_path / shape
    if shape == "rows.parquet":
        pq.write_table(pa.table({"text": texts}), source, row_group_size=2)
    elif shape == "saved":
        datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(source))
    else:
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts),
                          encoding="utf-8")
    capsys.readouterr()  # datasets' own progress bar
    err = _prepare_fails(source, capsys, tmp_path)
    where = {"rows.parquet": "row group 0, row 1", "saved": "record batch 0, row 1",
             "export.jsonl": "export.jsonl:2"}[shape]
    assert where in err and "null" in err and "prepare --errors skip" in err, err
    out = tmp_path / "dd"
    _prepare_bpe(source, out, "--errors", "skip")
    assert _documents(out) == [DOCS[0], DOCS[1]]
    assert "--errors skip left out 2 record(s) or row(s) without their text" \
        in capsys.readouterr().out  # counted once, though fitting read them too


def test_errors_skip_leaves_out_json_lines_records_without_their_text(tmp_path, capsys):
    """Messy exports: a record without the field, one whose text is a number, a line that is
    not JSON, one that is not an object. Each stops prepare naming its line and the way
    out; --errors skip reads the documents around them (it used to skip null text only)."""
    source = tmp_path / "messy.jsonl"
    lines = [json.dumps({"text": DOCS[0]}), json.dumps({"title": "no text"}),
             json.dumps({"text": 12345}), "{not json", json.dumps(["a", "list"]),
             json.dumps({"text": DOCS[1]})]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for bad, said in ((2, "no text field 'text'"), (3, "field 'text' holds int, not text"),
                      (4, "not valid JSON"), (5, "not a JSON object")):
        source.write_text("\n".join(lines[:1] + lines[bad - 1:bad]) + "\n", encoding="utf-8")
        err = _prepare_fails(source, capsys, tmp_path)
        assert "messy.jsonl:2: " + said in err and "--errors skip" in err, err
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "dd"
    capsys.readouterr()
    _prepare_bpe(source, out, "--errors", "skip")
    assert _documents(out) == [DOCS[0], DOCS[1]]
    assert "--errors skip left out 4 record(s) or row(s) without their text (not JSON, " \
        "without the text field, null, or not utf-8)" in capsys.readouterr().out


def test_a_dataset_repository_folder_reads_its_train_split_alone(tmp_path, capsys):
    """A Hugging Face dataset repository as cloned: README.md (YAML front matter) and
    data/{train,test}-*.parquet. It used to train on all of it, the README and the test
    split too; now the train split's Parquet files, with a note naming what is left out."""
    repo = tmp_path / "hub"
    (repo / "data").mkdir(parents=True)
    (repo / "README.md").write_text("---\nlicense: mit\n---\n# My dataset\n")
    pq.write_table(pa.table({"text": DOCS[:2]}), repo / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"text": DOCS[3:]}), repo / "data" / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"text": ["held out"]}), repo / "data" / "test-00000-of-00001.parquet")
    out = tmp_path / "dd"
    _prepare_bpe(repo, out)
    said = capsys.readouterr().out
    assert "reads as a dataset repository: its train split's 2 Parquet file(s); left out 2 " \
        "other file(s): README.md, data/test-00000-of-00001.parquet" in said
    assert _documents(out) == [*DOCS[:2], *DOCS[3:]]
    (repo / "data" / "test-00000-of-00001.parquet").unlink()  # no splits named but train
    _prepare_bpe(repo, tmp_path / "d2")
    assert "2 Parquet file(s); left out 1 other file(s): README.md" in capsys.readouterr().out
    (repo / "README.md").write_text("# My notes, no dataset card\n")  # an ordinary folder
    _prepare_bpe(repo, tmp_path / "d3")
    assert "dataset repository" not in capsys.readouterr().out
    assert "# My notes" in _documents(tmp_path / "d3")[0]  # every file read, as before


def test_a_damaged_parquet_file_names_the_file_and_row_group(shapes, tmp_path, capsys):
    root, _ = shapes
    raw = (root / "rows.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(raw[: len(raw) // 2])
    assert "cut.parquet: not a readable Parquet file" in _prepare_fails(cut, capsys, tmp_path)
    plain = tmp_path / "plain.parquet"  # uncompressed, so a byte flipped is a byte of text
    pq.write_table(pa.table({"text": ["abcdefgh" * 40, "ijklmnop" * 40]}), plain,
                   row_group_size=1, compression="none")
    raw = bytearray(plain.read_bytes())
    at = raw.index(b"ijklmnop")
    raw[at:at + 8] = b"\xff" * 8
    plain.write_bytes(bytes(raw))
    err = _prepare_fails(plain, capsys, tmp_path)
    assert "plain.parquet: row group 1 cannot be read" in err


def test_bad_dataset_folders_say_what_is_wrong(shapes, tmp_path, capsys):
    root, _ = shapes
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "state.json").write_text(json.dumps({"_data_files": []}), encoding="utf-8")
    (bare / "dataset_info.json").write_text("{}", encoding="utf-8")
    assert "holds no .arrow file" in _prepare_fails(bare, capsys, tmp_path)
    splits = tmp_path / "splits"
    splits.mkdir()
    (splits / "dataset_dict.json").write_text(json.dumps({"splits": ["test", "validation"]}),
                                              encoding="utf-8")
    err = _prepare_fails(splits, capsys, tmp_path)
    assert "test, validation" in err and "no train split" in err and "splits/test" in err


def test_a_dictionary_encoded_text_column_reads_as_its_text(tmp_path):
    """pandas' category columns (and many writers) store text dictionary-encoded."""
    texts = ["the cat sat\n", "on the mat\n", "the cat sat\n"] * 20
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    pq.write_table(pa.table({"text": texts}), plain)
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), coded)
    assert pq.read_schema(coded).field("text").type.value_type == pa.string()
    for source in (plain, coded):
        assert main(["prepare", "--data", str(source), "--out", str(tmp_path / source.stem),
                     "--val_fraction", "0.2"]) == 0
    assert (tmp_path / "plain" / TOKENS).read_bytes() == (tmp_path / "coded" / TOKENS).read_bytes()


def test_a_folder_skips_hidden_files_and_the_runs_and_prepared_data_inside_it(tmp_path):
    """``--data .`` from a notes folder that holds runs, a prepared folder, .git: only the
    text is read, the same files before and after a run is trained into it."""
    from minitransformer.data.sources import source_files

    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.txt").write_text("first notes\n" * 50, encoding="utf-8")
    (notes / "sub" / "b.txt").write_text("second notes\n" * 50, encoding="utf-8")
    (notes / ".hidden.txt").write_text("not read\n", encoding="utf-8")
    (notes / ".git" / "objects").mkdir(parents=True)
    (notes / ".git" / "objects" / "ab").write_bytes(b"\x00\x01binary")
    saved = notes / "exported"  # a saved model: config.json beside model.safetensors
    saved.mkdir()
    (saved / "config.json").write_text("{}", encoding="utf-8")
    (saved / "model.safetensors").write_bytes(b"\x00" * 8)
    (notes / "cmp").mkdir()  # what compare writes beside its runs
    (notes / "cmp" / "results.json").write_text("{}", encoding="utf-8")
    (notes / "cmp" / "compare.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    (notes / "code").mkdir()  # a config.json alone is text like any other
    (notes / "code" / "config.json").write_text('{\n  "a": 1\n}\n', encoding="utf-8")
    texts = [notes / "a.txt", notes / "code" / "config.json", notes / "sub" / "b.txt"]
    assert source_files([str(notes)]) == texts
    run = ["train", "--data", str(notes), "--out", str(notes / "runs" / "mine"), "--preset",
           "debug", "--max_iters", "2", "--eval_interval", "1", "--eval_iters", "1",
           "--quiet", "--time_budget", "none", "--sample_tokens", "0"]
    assert main(run) == 0
    assert main(["prepare", "--data", str(notes / "a.txt"), "--out",
                 str(notes / "sub" / "prepared")]) == 0
    assert source_files([str(notes)]) == texts  # neither the run nor the prepared folder
    assert main(["evaluate", str(notes / "runs" / "mine"), "--eval_iters", "1"]) == 0
    assert main(["train", "--out", str(notes / "runs" / "mine"), "--resume", "--max_iters", "3",
                 "--quiet", "--time_budget", "none", "--sample_tokens", "0"]) == 0


def test_a_file_gone_between_listing_and_reading_is_a_user_error(tmp_path):
    """A folder that changes while it is read (a temporary file, a rotated log)."""
    from minitransformer.data.sources import fingerprint, source_files
    from minitransformer.errors import UserError

    (tmp_path / "a.txt").write_text("kept\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("gone\n", encoding="utf-8")
    files = source_files([str(tmp_path)])
    (tmp_path / "b.txt").unlink()
    with pytest.raises(UserError, match="cannot read .*b.txt: No such file"):
        fingerprint(files)


def test_a_binary_file_in_a_folder_is_refused_by_name_by_prepare_and_train(tmp_path, capsys):
    """The same refusal from both (--errors replace would make text of an image); --errors
    skip leaves it out with the other files that do not decode."""
    folder = tmp_path / "notes"
    (folder / "img").mkdir(parents=True)
    (folder / "a.txt").write_text("hello world text\n" * 50, encoding="utf-8")
    (folder / "img" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 20)
    (folder / "img" / "z.dat").write_bytes(b"abc\x00def\x00" * 20)  # binary, yet valid UTF-8
    for errors in ("strict", "replace"):
        err = _prepare_fails(folder, capsys, tmp_path, "--errors", errors)
        assert "logo.png looks like a binary file" in err and "leave it out of --data" in err
    assert main(["train", "--data", str(folder), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--max_iters", "1", "--quiet"]) == 2
    assert "logo.png looks like a binary file" in capsys.readouterr().err
    assert main(["prepare", "--data", str(folder), "--out", str(tmp_path / "dd"), "--errors",
                 "skip"]) == 0
    out = capsys.readouterr().out
    assert "1 document(s) of 3 file(s)" in out
    # the files left out are named, so that a reader can tell a typo from an image
    assert f"left out 2 file(s) with no utf-8 text (binary or compressed, not utf-8, or no " \
           f"record with its text): {folder / 'img' / 'logo.png'}, {folder / 'img' / 'z.dat'}" \
           in out, out
    # a compressed file is left out as a binary one is (without skip it is refused by name)
    (folder / "img" / "notes.txt.gz").write_bytes(gzip.compress(b"some text\n"))
    assert main(["prepare", "--data", str(folder), "--out", str(tmp_path / "dz"), "--errors",
                 "skip"]) == 0
    assert "left out 3 file(s)" in capsys.readouterr().out


def test_an_empty_last_file_of_a_folder_is_no_val_split(tmp_path, capsys):
    """An empty file that sorts last was the last document, so the whole val split: prepare
    wrote a folder that train then refused, and train refused the folder outright. Both now
    read it as an empty document (as an empty JSONL row) and split where val gets text; a
    blank file named alone is still refused."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world text\n" * 200, encoding="utf-8")
    (folder / "b.txt").write_text("another text here\n" * 60, encoding="utf-8")
    (folder / "z.txt").write_text("", encoding="utf-8")
    assert main(["prepare", "--data", str(folder), "--out", str(tmp_path / "dd")]) == 0
    manifest, _, val = open_shards(tmp_path / "dd")
    assert manifest["documents"] == 3 and len(val) >= len("another text here\n" * 60)
    for data in (folder, tmp_path / "dd"):
        assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--preset",
                     "debug", "--max_iters", "1", "--eval_iters", "1", "--sample_tokens",
                     "0", "--force", "--quiet"]) == 0
    assert main(["train", "--data", str(folder / "z.txt"), "--out", str(tmp_path / "r2"),
                 "--preset", "debug", "--quiet"]) == 2
    assert "z.txt is empty" in capsys.readouterr().err
    (folder / "a.txt").write_text("")
    (folder / "b.txt").write_text(" \n")
    for command in ("prepare", "train"):
        assert main([command, "--data", str(folder), "--out", str(tmp_path / "r3")]) == 2
        assert "every file of --data is empty" in capsys.readouterr().err


def test_val_start_leaves_val_text_where_the_last_document_is_empty_or_short():
    from minitransformer.data.shards import val_start

    assert val_start(1000, [0, 600, 950], 0.1) == 950  # the boundary after the point
    assert val_start(1000, [0, 600, 1000], 0.1) == 600  # an empty last document
    assert val_start(1000, [0, 600, 990], 0.1) == 600  # 1% where 10% was asked
    assert val_start(1000, [0, 990], 0.1) == 900  # nothing earlier: split_ids' point
    assert val_start(1000, [0], 0.1) == 900


def test_a_file_read_twice_is_refused(tmp_path):
    """Given twice (or in a folder given too), a file's text would be in both splits."""
    from minitransformer.data.sources import source_files
    from minitransformer.errors import UserError

    (tmp_path / "notes").mkdir()
    a = tmp_path / "notes" / "a.txt"
    a.write_text("some text\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("other text\n", encoding="utf-8")
    assert source_files([str(a), str(tmp_path / "b.txt")]) == [a, tmp_path / "b.txt"]
    for sources in ([str(a), str(a)], [str(tmp_path / "notes"), str(a)],
                    [str(a), str(tmp_path / "notes" / "*.txt")]):
        with pytest.raises(UserError, match="a.txt twice"):
            source_files(sources)


def test_a_run_whose_folder_no_longer_reads_a_file_says_so(tmp_path, capsys):
    """A run recorded before folders skipped hidden files read notes/.drafts/a.txt; it is
    there, so the message says the folder no longer reads it, not that it is gone."""
    import json

    notes = tmp_path / "notes"
    (notes / ".drafts").mkdir(parents=True)
    (notes / "b.txt").write_text("some notes to read\n" * 40, encoding="utf-8")
    (notes / ".drafts" / "a.txt").write_text("a hidden draft\n" * 40, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "--data", str(notes), "--out", str(run), "--preset", "debug",
                 "--max_iters", "1", "--quiet", "--time_budget", "none"]) == 0
    meta = json.loads((run / "config.json").read_text(encoding="utf-8"))
    hidden = str((notes / ".drafts" / "a.txt").resolve())
    meta["data"]["sources"].insert(0, {**meta["data"]["sources"][0], "path": hidden})
    (run / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", str(run), "--eval_iters", "1"]) == 2
    assert f"trained on {hidden}, which its folder no longer reads" in capsys.readouterr().err


def test_a_json_lines_line_that_does_not_decode_is_named_or_left_out_alone(tmp_path, capsys):
    """A JSONL file with bytes that are not UTF-8 was an internal UnicodeDecodeError, with
    --errors skip too; then it was refused by its name alone, or left out whole, its good
    records with it. Now the line is named, or left out alone as a record without its text
    is; a JSONL file without a record of text is named, and an empty text file is not."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world text\n" * 50, encoding="utf-8")
    (folder / "b.jsonl").write_bytes(b'{"text": "fine"}\r\n{"text": "caf\xe9"}\n'
                                     b'{"text": "also fine"}\n')  # line 2: Latin-1
    (folder / "c.jsonl").write_text('{"body": "no text field"}\n', encoding="utf-8")
    (folder / "d.txt").write_text("", encoding="utf-8")
    err = _prepare_fails(folder / "b.jsonl", capsys, tmp_path)
    assert err.strip().endswith("b.jsonl:2: not valid utf-8 at character 14 of the line; pass "
                                "--encoding, or --errors replace|skip"), err
    assert main(["prepare", "--data", str(folder), "--out", str(tmp_path / "dd"), "--errors",
                 "skip"]) == 0
    out = capsys.readouterr().out
    assert f"left out 1 file(s) with no utf-8 text (binary or compressed, not utf-8, or no " \
           f"record with its text): {folder / 'c.jsonl'}" in out, out
    assert "4 document(s) of 4 file(s)" in out, out  # a.txt, b's two good records, d.txt
    assert "left out 2 record(s) or row(s)" in out, out  # b's line 2, c's one record
    assert main(["prepare", "--data", str(folder / "b.jsonl"), "--out", str(tmp_path / "dl"),
                 "--encoding", "latin-1"]) == 0  # its own encoding: every line reads
    assert "3 document(s)" in capsys.readouterr().out
