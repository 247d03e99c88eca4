"""Every source shape prepare reads decodes back to its exact text, English and Chinese, with
characters and byte-level BPE; bad Parquet and dataset folders are one-line user errors."""

from __future__ import annotations

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


def test_a_parquet_file_without_the_column_lists_its_columns(shapes, tmp_path, capsys):
    root, _ = shapes
    err = _prepare_fails(root / "rows.parquet", capsys, tmp_path, "--text_field", "body")
    assert "rows.parquet" in err and "'body'" in err and "id, text" in err
    err = _prepare_fails(root / "rows.parquet", capsys, tmp_path, "--text_field", "id")
    assert "not text" in err


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
