"""prepare's pipeline: streamed fitting gives today's tokenizer, pieces cut where the
pre-tokenizer cuts give the whole text's ids, workers keep input order, tiktoken agrees with
tokenizers, and a prepare killed at a random moment then rerun writes the same bytes."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest

from minitransformer.cli import main
from minitransformer.data import encode, reading, shards
from minitransformer.data.encode import EncoderPool, choose_encoder, encoder_spec, make_encoder
from minitransformer.data.pieces import cut_mode, cut_pieces
from minitransformer.data.prepare import prepare_corpus
from minitransformer.data.reading import blocks, sample_lines
from minitransformer.data.shards import MANIFEST, PARTIAL, TOKENIZER, TOKENS
from minitransformer.tokenizers import CharTokenizer, fit_tokenizer, load_tokenizer
from minitransformer.tokenizers.fitting import GPT_SPECIALS

LINES = ["First Citizen:", "Before we proceed any further, hear me speak.", "",
         "  All:\tSpeak, speak.", "You are all resolved rather to die than to famish?",
         "It's 1,000 crowns -- they'll've gone!", "   ", "从前有座山，山里有座庙。",
         "naïve\u00a0café\r", "a\r\nb", "x\x0cy\u2028z", "  \n  "]


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        body = "\n".join(rng.choice(LINES) for _ in range(rng.randint(20, 60)))
        docs.append(body + rng.choice(["", "\n", "\r", "\n\n"]))
    return docs


def _folder(tmp_path, docs):
    folder = tmp_path / "books"
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i:02d}.txt").write_bytes(doc.encode("utf-8"))
    return folder


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks and pieces of a few dozen bytes: lines, characters and pieces cross them."""
    monkeypatch.setattr(reading, "BLOCK_BYTES", 37)
    monkeypatch.setattr(shards, "PIECE_BYTES", {k: 53 for k in shards.PIECE_BYTES})


@pytest.mark.parametrize("kind", ["bpe-bytes", "bpe-chars"])
def test_streamed_bpe_is_fit_tokenizer_on_the_whole_text(tmp_path, small_blocks, kind):
    docs = _docs(3)
    prepare_corpus([str(_folder(tmp_path, docs))], tmp_path / "dd", kind, 400,
                   special_tokens=GPT_SPECIALS, workers=1, echo=lambda _: None)
    whole = fit_tokenizer(kind, "\n".join(docs), 400, GPT_SPECIALS, echo=None)
    assert json.loads((tmp_path / "dd" / TOKENIZER).read_text("utf-8")) == whole.to_dict()


def test_streamed_lines_are_splitlines_of_the_joined_text(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "BLOCK_BYTES", 5)
    docs = _docs(4, seed=1)
    files = sorted(_folder(tmp_path, docs).iterdir())
    assert list(reading.lines(blocks(files))) == "\n".join(docs).splitlines(keepends=True)
    chars = prepare_corpus([str(tmp_path / "books")], tmp_path / "dd", "char", None,
                           workers=1, echo=lambda _: None)
    assert chars["documents"] == 4
    tok = load_tokenizer(tmp_path / "dd" / TOKENIZER)
    assert tok.chars == sorted(set("\n\n".join(docs)))  # the alphabet as it was fitted before


def test_a_sample_is_spread_over_the_whole_corpus():
    texts = [(True, f"{i:04d}" * 25 + "\n", 101) for i in range(1000)]  # 1000 documents
    kept, head, read = sample_lines(iter(texts), total_bytes=101_000, sample_bytes=10_100)
    assert read == 101_000 and head.startswith("0000")
    numbers = sorted(int(line[:4]) for line in kept)
    assert 95 <= len(numbers) <= 105 and numbers[0] < 20 and numbers[-1] > 980


@pytest.mark.parametrize("kind", ["bpe-bytes", "bpe-chars", "char"])
def test_pieces_cut_where_the_pretokenizer_cuts_give_the_whole_texts_ids(kind):
    text = "\n".join(_docs(6, seed=2))
    tok = fit_tokenizer(kind, text, 400, GPT_SPECIALS, echo=None)
    spec = {**encoder_spec(tok), "kind": "hf" if kind != "char" else "char"}
    data = text.encode("utf-8")
    blocks_ = [(i == 0, data[i:i + 29]) for i in range(0, len(data), 29)]  # cuts characters
    pieces = [p for _, p in cut_pieces(blocks_, cut_mode(tok), b"", 41)]
    assert len(pieces) > 20 and b"".join(pieces) == data
    ids = np.concatenate([make_encoder(spec)(p) for p in pieces])
    assert ids.tolist() == tok.encode(text)


def test_tiktoken_from_our_merges_gives_tokenizers_ids_or_is_not_used():
    text = "\n".join(_docs(8, seed=3))
    tok = fit_tokenizer("bpe-bytes", text, 500, GPT_SPECIALS, echo=None)
    spec, route = choose_encoder(encoder_spec(tok), text[:2000])
    assert spec["kind"] == "tiktoken", route
    with_eot = text + "<|endoftext|>" + text[:500]
    assert make_encoder(spec)(with_eot).tolist() == tok.encode(with_eot)
    chars = fit_tokenizer("bpe-chars", text, 500, GPT_SPECIALS, echo=None)
    assert choose_encoder(encoder_spec(chars), text)[0]["kind"] == "hf"  # its own pieces


def test_char_table_lookup_equals_the_tokenizer_and_names_an_unseen_character():
    text = "\n".join(_docs(2, seed=4))
    tok = CharTokenizer.fit(text)
    enc = make_encoder(encoder_spec(tok))
    assert enc(text).tolist() == tok.encode(text)
    with pytest.raises(encode.EncodeError, match="'Q'"):
        enc("abcQ")


def test_workers_give_the_bytes_of_one_process_in_input_order(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "PIECE_BYTES", {k: 97 for k in shards.PIECE_BYTES})
    folder = _folder(tmp_path, _docs(5, seed=5))
    out = {}
    for workers in (1, 3):
        prepare_corpus([str(folder)], tmp_path / f"w{workers}", "bpe-bytes", 400,
                       special_tokens=GPT_SPECIALS, workers=workers, echo=lambda _: None)
        out[workers] = (tmp_path / f"w{workers}" / TOKENS).read_bytes()
    assert out[1] == out[3] and len(out[1]) > 2000
    pool = EncoderPool({"kind": "char", "chars": list("ab"), "dtype": "uint16",
                        "vocab_size": 2}, 2)
    with pool:
        got = [(a.tolist(), c.tolist()) for a, c in pool.map([b"ab" * i + b"b"
                                                              for i in range(30)])]
        for worker in pool.workers:  # Ctrl-C reaches the workers too: the parent handles it
            os.kill(worker.proc.pid, signal.SIGINT)
        time.sleep(0.2)
        assert all(worker.proc.poll() is None for worker in pool.workers)  # no traceback
    assert got == [([0, 1] * i + [1], [i, i + 1]) for i in range(30)]


def _prepare(args):
    source, out = args
    prepare_corpus([source], out, "bpe-bytes", 300, special_tokens=GPT_SPECIALS, workers=2,
                   echo=lambda _: None, newline="normalize")  # as the command reads it


def test_a_prepare_killed_at_a_random_moment_then_rerun_writes_the_same_bytes(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(shards, "PIECE_BYTES", {k: 1 << 16 for k in shards.PIECE_BYTES})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_docs(400, seed=6)), encoding="utf-8")  # about 1 MB
    start = time.perf_counter()
    _prepare((str(corpus), tmp_path / "whole"))
    took = time.perf_counter() - start
    out = tmp_path / "killed"
    child = multiprocessing.get_context("fork").Process(target=_prepare,
                                                        args=((str(corpus), out),))
    child.start()
    time.sleep(random.Random(14).uniform(0.1, 0.9) * took)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    if (out / MANIFEST).exists():  # it had finished: then it is whole
        assert (out / TOKENS).read_bytes() == (tmp_path / "whole" / TOKENS).read_bytes()
    else:
        assert not (out / TOKENIZER).exists() or (out / PARTIAL).exists()
        assert main(["prepare", "--data", str(corpus), "--out", str(out), "--workers", "2",
                     "--tokenizer", "bpe-bytes", "--vocab_size", "300"]) == 0
    for name in (TOKENS, TOKENIZER):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    whole = json.loads((tmp_path / "whole" / MANIFEST).read_text("utf-8"))
    manifest = json.loads((out / MANIFEST).read_text("utf-8"))
    assert manifest.pop("family", "gpt") == "gpt"  # the command records it; the function not
    assert manifest == whole
    assert not (out / PARTIAL).exists()


def test_clear_cache_empties_the_cache_alone_or_before_a_prepare(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "tokens" / "k").mkdir(parents=True)
    (tmp_path / "cache" / "tokens" / "k" / TOKENS).write_bytes(b"\0" * 1000)
    assert main(["prepare", "--clear_cache"]) == 0
    assert not (tmp_path / "cache").exists() and "removed the cache" in capsys.readouterr().out
    assert main(["prepare", "--out", str(tmp_path / "dd")]) == 2
    assert "--data" in capsys.readouterr().err


@pytest.mark.parametrize("parts", [("config.json", "checkpoints/step_0000010/config.json"),
                                   ("checkpoints/step_0000010/config.json",)])
def test_prepare_never_writes_into_a_training_run(tmp_path, tiny_corpus, capsys, parts):
    run = tmp_path / "run"
    for part in (*parts, TOKENIZER):
        (run / part).parent.mkdir(parents=True, exist_ok=True)
        (run / part).write_text('{"format": "minitransformer"}', encoding="utf-8")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for force in ([], ["--force"]):
        assert main(["prepare", "--data", str(tiny_corpus), "--out", str(run), *force]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds a model or a training run" in err, err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("held", [("tokenizer.json",), ("notes.txt",),
                                  ("tokens.bin", "notes.txt")])
def test_prepare_never_writes_into_a_folder_of_other_files(tmp_path, tiny_corpus, capsys,
                                                            held):
    """A user's own tokenizer.json, a stray tokens.bin, the text folder itself: a folder
    with files but no prepared data is not prepare's to fill, --force or not."""
    out = tmp_path / "mine"
    out.mkdir()
    for name in held:
        (out / name).write_text("the user's own\n", encoding="utf-8")
    for force in ([], ["--force"]):
        assert main(["prepare", "--data", str(tiny_corpus), "--out", str(out), *force]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "not prepared data" in err, err
    assert sorted(p.name for p in out.iterdir()) == sorted(held)
    assert all((out / n).read_text(encoding="utf-8") == "the user's own\n" for n in held)
    if "notes.txt" in held:
        assert main(["prepare", "--data", str(out), "--out", str(out)]) == 2  # its own source


@pytest.mark.parametrize("left", [(".partial",), (".partial", "tokens.bin"),
                                  ("tokens.bin", "tokenizer.json")])
def test_prepare_starts_over_where_a_stopped_prepare_left_its_files(tmp_path, tiny_corpus,
                                                                    left):
    """What a prepare killed before its manifest leaves: the same command runs again."""
    out = tmp_path / "stopped"
    out.mkdir()
    for name in left:
        (out / name).mkdir() if name == ".partial" else (out / name).write_bytes(b"\x00\x01")
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(out)]) == 0
    assert (out / MANIFEST).is_file() and not (out / ".partial").exists()


def test_a_prepare_stopped_on_the_way_leaves_the_data_it_was_to_replace(tmp_path, tiny_corpus):
    """prepare --force stopped while it encodes (Ctrl-C, a kill) left a folder holding only
    .partial/: the old manifest, tokens and tokenizer went at the start."""
    out = tmp_path / "data"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(out)]) == 0
    before = {n: (out / n).read_bytes() for n in (MANIFEST, TOKENS, TOKENIZER)}
    tok = CharTokenizer.fit("abc")

    def pieces():
        yield True, np.array([0, 1, 2]), None
        raise KeyboardInterrupt  # stopped while encoding

    with pytest.raises(KeyboardInterrupt):
        shards.write_ids(pieces(), tok, out, sources=[])
    assert {n: (out / n).read_bytes() for n in before} == before
    assert main(["train", "--data", str(out), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--max_iters", "1", "--eval_iters", "1", "--sample_tokens", "0",
                 "--quiet"]) == 0  # the old data, whole


def test_data_prepared_for_one_family_is_refused_by_the_other(tmp_path, tiny_corpus, capsys):
    """A BPE folder prepared with --model encoder holds the encoder's specials (<mask>) and
    separators: a GPT trained on it without a word. Its manifest says whose it is; characters
    are the same ids for both, and a folder prepared before it was recorded still reads."""
    quick = ["--preset", "debug", "--max_iters", "1", "--eval_iters", "1", "--sample_tokens",
             "0", "--quiet"]
    for made, other in (("encoder", "gpt"), ("gpt", "encoder")):
        data = tmp_path / f"{made}-bpe"
        assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data), "--model", made,
                     "--tokenizer", "bpe", "--vocab_size", "300"]) == 0
        assert json.loads((data / MANIFEST).read_text(encoding="utf-8"))["family"] == made
        capsys.readouterr()
        assert main(["train", "--data", str(data), "--model", other, "--out",
                     str(tmp_path / f"refused-{made}"), *quick]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"was prepared for --model {made} runs: its tokenizer and the "
                            f"tokens between its documents are theirs; train with --model "
                            f"{made}, or prepare the text again with --model {other}"), err
        assert main(["train", "--data", str(data), "--model", made, "--out",
                     str(tmp_path / f"trained-{made}"), *quick]) == 0
    data = tmp_path / "encoder-char"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data), "--model",
                 "encoder"]) == 0
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "char-gpt"), *quick]) == 0


def test_bpe_flags_on_a_char_prepare_are_refused(tmp_path, tiny_corpus, capsys):
    for flag in (["--vocab_size", "300"], ["--bpe_sample", "4"], ["--workers", "3"],
                 ["--workers", "2", "--tokenizer", "char"]):
        assert main(["prepare", "--data", str(tiny_corpus), "--out", str(tmp_path / "d"),
                     *flag]) == 2
        assert f"{flag[0]} is for a BPE tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_prepared_data_is_never_written_over_by_train_or_export(tmp_path, tiny_corpus,
                                                                capsys):
    data = tmp_path / "data"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data)]) == 0
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    commands = [["train", "--data", "shakespeare", "--out", str(data), "--preset", "debug"],
                ["train", "--data", "shakespeare", "--out", str(data), "--force"],
                ["export", str(tmp_path / "any-run"), "--hf", str(data)],
                ["export", str(tmp_path / "any-run"), "--hf", str(data), "--force"]]
    for command in commands:  # refused before any run is read or trained
        capsys.readouterr()
        assert main(command) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "prepared data" in err, err
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before


def test_train_on_prepared_data_refuses_another_vocabulary_size(tmp_path, tiny_corpus,
                                                                capsys):
    data = tmp_path / "data"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data), "--tokenizer",
                 "bpe-bytes", "--vocab_size", "300"]) == 0
    run = tmp_path / "run"
    for extra in (["--vocab_size", "500"], ["--vocab_size", "500", "--tokenizer", "bpe"]):
        capsys.readouterr()
        assert main(["train", "--data", str(data), "--out", str(run), "--preset", "debug",
                     *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--vocab_size 500" in err, err
        assert not run.exists()
    size = load_tokenizer(data / TOKENIZER).vocab_size  # its own size is no contradiction
    assert main(["train", "--data", str(data), "--out", str(run), "--preset", "debug",
                 "--vocab_size", str(size), "--max_iters", "1", "--quiet"]) == 0


@pytest.mark.parametrize("flag", [["--newline", "keep"], ["--newline", "normalize"],
                                  ["--text_field", "body"]])
def test_train_on_prepared_data_refuses_how_to_read_text(tmp_path, tiny_corpus, capsys,
                                                          flag):
    """Its text was read when it was prepared (prepare --newline, --text_field): the flags
    that say how to read text are refused, not ignored."""
    data = tmp_path / "data"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data)]) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(run), "--preset", "debug",
                 *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and " ".join(flag) in err and "prepare" in err, err
    assert not run.exists()


@pytest.mark.parametrize("kind", ["char", "bpe-bytes"])
def test_prepare_reads_windows_line_ends_as_train_does(tmp_path, monkeypatch, kind):
    """CRLF and lone CR read as LF by prepare, streamed a few bytes at a time (a CRLF cut
    between two blocks too), equal train's cache of the same files, id for id; --newline keep
    keeps them."""
    from minitransformer.data.cache import prepare_cached
    from minitransformer.families import FAMILIES

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"First line\r\nsecond, \xc3\xa9t\xc3\xa9\r\n\r\nthird\r" * 30)
    (folder / "b.txt").write_bytes(b"plain\nlines\n" * 30 + b"last\r")
    (folder / "c.jsonl").write_text('{"text": "a record\\r\\nwith CRLF"}\n', encoding="utf-8")
    monkeypatch.setattr(reading, "BLOCK_BYTES", 5)
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "cache"))
    extra = ["--vocab_size", "300"] if kind != "char" else []
    out = tmp_path / "prepared"
    assert main(["prepare", "--data", str(folder), "--out", str(out), "--tokenizer", kind,
                 "--workers", "1", *extra]) == 0
    cached = prepare_cached([str(folder)], FAMILIES["gpt"].cache_family(), kind,
                            300 if kind != "char" else None, echo=lambda line: None)
    assert (out / TOKENS).read_bytes() == (cached.folder / TOKENS).read_bytes()
    assert "\r" not in load_tokenizer(out / TOKENIZER).decode(
        np.fromfile(out / TOKENS, dtype=np.uint16).tolist())
    kept = tmp_path / "kept"
    assert main(["prepare", "--data", str(folder), "--out", str(kept), "--tokenizer", kind,
                 "--workers", "1", "--newline", "keep", *extra]) == 0
    text = load_tokenizer(kept / TOKENIZER).decode(np.fromfile(kept / TOKENS,
                                                               dtype=np.uint16).tolist())
    assert text.count("\r") == 4 * 30 + 1 + 1  # every CR of the three files, kept


def test_prepared_ids_past_the_vocabulary_are_a_user_error(tmp_path, tiny_corpus, capsys):
    """A tokens.bin of the right size holding ids the tokenizer never gives (damaged, or
    another folder's): one line naming it, not the embedding's IndexError."""
    data = tmp_path / "d"
    assert main(["prepare", "--data", str(tiny_corpus), "--out", str(data)]) == 0
    manifest = json.loads((data / MANIFEST).read_text(encoding="utf-8"))
    ids = np.memmap(data / TOKENS, dtype=manifest["dtype"], mode="r+")
    ids[::50] = np.iinfo(ids.dtype).max
    ids.flush()
    del ids
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--max_iters", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "past the model's" in err and "prepare it again" in err, err


def test_a_character_a_given_char_tokenizer_lacks_names_its_file(tmp_path, capsys):
    """prepare --tokenizer_from a char run, on files with characters the run never saw: the
    error names the file (it used to name the characters only), also past the first block
    of a large file; train --init_from names its --data, as it did."""
    from minitransformer.cli import main

    run_text, other = tmp_path / "en.txt", tmp_path / "zh.txt"
    run_text.write_text("to be or not to be, that is the question.\n" * 80, encoding="utf-8")
    other.write_text("to be or not\n风吹草低见牛羊\n" * 20, encoding="utf-8")
    big = tmp_path / "big.txt"  # 1.5 MB: read in blocks that end inside a character
    big.write_text("你" * 500_000, encoding="utf-8")
    assert main(["train", "--data", str(run_text), "--out", str(tmp_path / "run"), "--preset",
                 "debug", "--max_iters", "1", "--eval_iters", "1", "--quiet"]) == 0
    capsys.readouterr()
    for argv in (["prepare", "--data", str(run_text), str(other), "--out",
                  str(tmp_path / "dd"), "--tokenizer_from", str(tmp_path / "run")],
                 ["train", "--init_from", str(tmp_path / "run"), "--data", str(other),
                  "--out", str(tmp_path / "ft"), "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{other}" in err and "never saw" in err and "'风'" in err, err
        assert err.count("\n") == 1, err
    assert main(["prepare", "--data", str(big), "--out", str(tmp_path / "d2"),
                 "--tokenizer_from", str(tmp_path / "run")]) == 2  # was a UnicodeDecodeError
    assert f"{big}: the text has 1 character(s)" in capsys.readouterr().err
