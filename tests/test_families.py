"""Every command, for every family it applies to, through the same code path; exit 2 with a
clear line where a command does not apply. One tiny run per family, trained once."""

from __future__ import annotations

import io
import json
import locale
import re
import sys

import pytest

from minitransformer.cli import main
from minitransformer.corpora import __file__ as corpora_init
from minitransformer.families import FAMILIES
from minitransformer.training import checkpoint as ckpt

FAST = ["--max_iters", "4", "--eval_interval", "2", "--eval_iters", "2", "--sample_tokens", "0",
        "--quiet"]


def _pairs(path) -> str:
    """The first 400 verses of the bundled Bible (a few chapters: enough for the split)."""
    from pathlib import Path

    lines = (Path(corpora_init).parent / "bible_en_es.tsv").read_text(encoding="utf-8")
    path.write_text("\n".join(lines.splitlines()[:401]) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_text):
    root = tmp_path_factory.mktemp("families")
    text = root / "tiny.txt"
    text.write_text(tiny_text, encoding="utf-8")
    data = {"gpt": str(text), "encoder": str(text), "seq2seq": _pairs(root / "pairs.tsv")}
    extra = {"gpt": [], "encoder": [], "seq2seq": ["--vocab_size", "300", "--batch_tokens",
                                                   "600"]}
    out = {}
    for name in FAMILIES:
        out[name] = root / name
        code = main(["train", "--model", name, "--data", data[name], "--out", str(out[name]),
                     "--preset", "debug", *extra[name], *FAST])
        assert code == 0, name
    return out, data


def _user_error(capsys, *words):
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_writes_a_run_that_names_its_family(runs, family):
    out, _ = runs
    meta = json.loads((out[family] / ckpt.CONFIG_FILE).read_text(encoding="utf-8"))
    assert meta["family"] == family and meta["format"] == "minitransformer"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_resume_finds_the_family_itself(runs, family, capsys):
    """No --model needed to resume any family (an encoder run used to need it)."""
    out, _ = runs
    assert main(["train", "--out", str(out[family]), "--resume", "--max_iters", "6",
                 "--quiet"]) == 0
    assert "done: 6 steps" in capsys.readouterr().out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_evaluate_reports_the_val_loss_training_measured(runs, family, capsys):
    """The same function, batches and precision as the trainer: the newest checkpoint's
    recorded val loss comes back from ``evaluate --which last``."""
    out, _ = runs
    last = ckpt.list_checkpoints(out[family])[-1]
    recorded = json.loads((last / ckpt.CONFIG_FILE).read_text(encoding="utf-8"))["val_loss"]
    args = ["--limit", "4"] if family == "seq2seq" else []
    assert main(["evaluate", str(out[family]), "--which", "last", *args]) == 0
    printed = capsys.readouterr().out
    loss = float(re.search(r"val loss\s+([0-9.]+)", printed).group(1))
    assert loss == pytest.approx(recorded, abs=2e-4), printed


@pytest.mark.parametrize("family, command", [
    ("gpt", ["sample", "--prompt", "the ", "--max-new-tokens", "5", "--seed", "1"]),
    ("gpt", ["explain", "--text", "the cat", "--out", "{tmp}/w.html"]),
    ("seq2seq", ["translate", "In the beginning"]),
] + [(f, ["attention", "--text", "the cat", "--out", "{tmp}/a.png"]) for f in FAMILIES])
def test_command_works_where_it_applies(runs, family, command, tmp_path):
    out, _ = runs
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main([args[0], str(out[family]), *args[1:]]) == 0


@pytest.mark.parametrize("family, command, words", [
    ("seq2seq", ["sample", "--prompt", "In"], ["sample does not apply", "translate"]),
    ("encoder", ["sample", "--prompt", "the"], ["sample does not apply", "fill"]),
    ("gpt", ["fill", "the [MASK]"], ["fill does not apply", "sample", "--model encoder"]),
    ("seq2seq", ["fill", "the [MASK]"], ["fill does not apply", "translate"]),
    ("gpt", ["translate", "hello"], ["translate does not apply", "sample"]),
    ("encoder", ["translate", "hello"], ["translate does not apply"]),
    ("encoder", ["explain", "--text", "the", "--out", "{tmp}/w.html"], ["explain", "attention"]),
    ("seq2seq", ["explain", "--text", "In", "--out", "{tmp}/w.html"], ["explain", "attention"]),
    ("encoder", ["export", "--hf", "{tmp}/hf"], ["export does not apply", "load_checkpoint"]),
    ("seq2seq", ["export", "--hf", "{tmp}/hf"], ["export does not apply", "load_checkpoint"]),
    ("gpt", ["evaluate", "--beam", "4"], ["--beam does not apply"]),
    ("encoder", ["evaluate", "--split", "test"], ["--split does not apply"]),
    ("gpt", ["evaluate", "--data_tgt", "b.txt"], ["--data_tgt does not apply"]),
    ("seq2seq", ["evaluate", "--data_tgt", "b.txt"], ["--data_tgt is the target file", "both"]),
])
def test_command_that_does_not_apply_is_a_user_error(runs, family, command, words, tmp_path,
                                                    capsys):
    out, _ = runs
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main([args[0], str(out[family]), *args[1:]]) == 2
    _user_error(capsys, *words)


@pytest.mark.parametrize("command, words", [
    (["translate", "hello", "--beam", "0"], ["--beam", "positive"]),
    (["translate", "hello", "--length_penalty", "nan"], ["--length_penalty", "0 to 10"]),
    (["translate", "hello", "--length_penalty", "1e308"], ["--length_penalty", "0 to 10"]),
    (["translate", "hello", "--encoding", "latin-1"], ["--encoding", "--input"]),
    (["translate", "--input", "{tmp}/in.txt", "--encoding", "no-such"], ["unknown encoding"]),
    (["translate", " "], ["empty"]),
    (["evaluate", "--beam", "0"], ["--beam", "positive"]),
    (["evaluate", "--examples", "-1"], ["--examples", "negative"]),
    (["evaluate", "--encoding", "latin-1"], ["--encoding", "--data"]),
    (["evaluate", "--beam", "1", "--length_penalty", "2"], ["--length_penalty", "greedy"]),
    (["translate", "hi", "--beam", "1", "--length_penalty", "2"], ["--length_penalty"]),
])
def test_bad_decoding_values_are_user_errors(runs, command, words, tmp_path, capsys):
    out, _ = runs
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main([args[0], str(out["seq2seq"]), *args[1:]]) == 2
    _user_error(capsys, *words)


def test_evaluate_reads_the_columns_asked_of_another_tsv(runs, tmp_path, capsys):
    out, data = runs
    rows = open(data["seq2seq"], encoding="utf-8").read().splitlines()[1:]  # no header
    other = tmp_path / "other.tsv"
    other.write_text("\n".join(rows) + "\n", encoding="utf-8")  # ref, en, es: 3 columns
    run = str(out["seq2seq"])
    assert main(["evaluate", run, "--data", str(other), "--limit", "2"]) == 2
    _user_error(capsys, "--src 0 --tgt 1")
    assert main(["evaluate", run, "--src", "1", "--tgt", "2", "--limit", "2"]) == 2
    _user_error(capsys, "--src", "--data")
    assert main(["evaluate", run, "--data", str(other), "--src", "1", "--tgt", "2", "--limit",
                 "2", "--examples", "0", "--beam", "2"]) == 0
    assert "BLEU" in capsys.readouterr().out
    # another corpus split as the run's was: its val loss is its own valid split's
    part = tmp_path / "part.tsv"
    part.write_text("\n".join(rows[: len(rows) // 2]) + "\n", encoding="utf-8")
    assert main(["evaluate", run, "--data", str(part), "--src", "1", "--tgt", "2", "--limit",
                 "2", "--examples", "0", "--split", "test"]) == 0
    said = capsys.readouterr().out
    assert f"(the valid split of {part})" in said and "as in training" not in said, said
    assert main(["evaluate", run, "--split", "test", "--limit", "2", "--examples", "0"]) == 0
    assert "(valid split, as in training)" in capsys.readouterr().out


def test_translate_reads_its_input_in_the_encoding_asked(runs, tmp_path, capsys,
                                                        monkeypatch):
    out, _ = runs
    (tmp_path / "in.txt").write_bytes("caf\xe9 na\xefve".encode("latin-1"))
    assert main(["translate", str(out["seq2seq"]), "--input", str(tmp_path / "in.txt"),
                 "--encoding", "latin-1", "--beam", "1"]) == 0
    latin = capsys.readouterr().out
    assert main(["translate", str(out["seq2seq"]), "café naïve", "--beam", "1"]) == 0
    assert capsys.readouterr().out == latin
    # a UTF-8 file that starts with a BOM (Notepad's): left out, as training leaves it out
    (tmp_path / "bom.txt").write_bytes("\ufeffcafé naïve\r\n".encode("utf-8"))
    assert main(["translate", str(out["seq2seq"]), "--input", str(tmp_path / "bom.txt"),
                 "--beam", "1"]) == 0
    assert capsys.readouterr().out == latin
    for texts, said in ((["   "], "the sentence is empty"),
                        (["café", "", "naïve"], "sentence 2 of 3 is empty")):
        assert main(["translate", str(out["seq2seq"]), *texts]) == 2
        _user_error(capsys, said)
    for encoding in ("latin-1", None):  # standard input: the locale's encoding by default
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
            "caf\xe9 na\xefve\n".encode("latin-1")), encoding="utf-8"))
        monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "utf-8")
        code = main(["translate", str(out["seq2seq"]), "--input", "-", "--beam", "1",
                     *(["--encoding", encoding] if encoding else [])])
        if encoding:
            assert code == 0 and capsys.readouterr().out == latin
        else:
            assert code == 2
            _user_error(capsys, "standard input is not valid utf-8")


@pytest.mark.parametrize("flag, value, owner", [
    ("--label_smoothing", "0.2", "seq2seq"),
    ("--batch_tokens", "512", "seq2seq"),
    ("--mlm_head", "linear", "encoder"),
])
def test_another_familys_flag_is_an_error_not_ignored(runs, flag, value, owner, tmp_path,
                                                      capsys):
    """A GPT run given a seq2seq or encoder setting refuses it, naming the family it is for."""
    _, data = runs
    assert main(["train", "--data", data["gpt"], "--out", str(tmp_path / "r"), "--preset",
                 "debug", flag, value, *FAST]) == 2
    _user_error(capsys, flag, owner)
    assert not (tmp_path / "r").exists()


def test_gpt_flag_on_seq2seq_and_tokenizer_that_does_not_apply(runs, tmp_path, capsys):
    _, data = runs
    assert main(["train", "--data", data["seq2seq"], "--out", str(tmp_path / "r"),
                 "--tokenizer", "char", *FAST]) == 2
    _user_error(capsys, "--tokenizer char")
    assert main(["train", "--model", "encoder", "--data", data["gpt"], "--out",
                 str(tmp_path / "r"), "--scale_embeddings", "true", *FAST]) == 2
    _user_error(capsys, "--scale_embeddings", "gpt")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_compare_runs_every_family(runs, family, tmp_path, capsys):
    _, data = runs
    extra = ["--vocab_size", "300", "--batch_tokens", "600"] if family == "seq2seq" else []
    code = main(["compare", "--model", family, "--data", data[family], "--out",
                 str(tmp_path / "cmp"), "--vary", "n_layer=1,2", "--preset", "debug",
                 "--max-iters", "2", "--eval_interval", "2", "--eval_iters", "1",
                 "--sample_tokens", "0", "--quiet", *extra])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "cmp" / "results.md").is_file()


@pytest.mark.parametrize("damage", ["tokenizer", "train", "model"])
def test_resume_of_a_damaged_seq2seq_run_is_a_user_error(runs, damage, tmp_path, capsys):
    """A broken tokenizer.json or config.json in the newest checkpoint: exit 2, one line."""
    import shutil

    out, _ = runs
    run = tmp_path / "run"
    shutil.copytree(out["seq2seq"], run)
    last = ckpt.list_checkpoints(run)[-1]
    if damage == "tokenizer":
        (last / ckpt.TOKENIZER_FILE).write_text("{not json", encoding="utf-8")
    else:
        meta = json.loads((last / ckpt.CONFIG_FILE).read_text(encoding="utf-8"))
        meta[damage] = "garbled" if damage == "train" else {"n_layer": "two", "bogus": 1}
        (last / ckpt.CONFIG_FILE).write_text(json.dumps(meta), encoding="utf-8")
    assert main(["train", "--out", str(run), "--resume", "--max_iters", "8", "--quiet"]) == 2
    _user_error(capsys)


def test_pages_name_the_corpus_by_its_file_names():
    from minitransformer.families.base import data_label

    assert data_label({"data": {"source": "/home/me/books/input.txt"}}, "run") == "input.txt"
    assert data_label({"data": {"source": ["/a/x.txt", "/b/y.jsonl"]}}, "run") == "x.txt, y.jsonl"
    assert data_label({"data": {"source": "shakespeare"}}, "run") == "shakespeare"
    assert data_label({}, "runs/mine") == "runs/mine"


def test_a_token_cap_below_the_longest_pair_says_those_pairs_come_alone(tmp_path, capsys):
    """--batch_tokens under a pair's length cannot hold it: such a pair is a batch of its own,
    and the summary says so instead of claiming a cap no batch keeps."""
    assert main(["train", "--data", _pairs(tmp_path / "pairs.tsv"), "--out",
                 str(tmp_path / "mt"), "--preset", "debug", "--vocab_size", "300",
                 "--batch_tokens", "5", "--max_iters", "1", "--eval_iters", "1",
                 "--sample_tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"<= 5 tokens \(a pair longer, up to \d+, alone\)", out), out


def test_pairs_left_out_by_block_size_are_counted_with_the_limit_that_left_them_out(
        tmp_path, capsys):
    """A block_size under train_max_len drops training pairs at block_size - 1 tokens, and
    valid pairs too: the summary named train_max_len's 48 and said nothing of the valid ones."""
    assert main(["train", "--data", _pairs(tmp_path / "pairs.tsv"), "--out",
                 str(tmp_path / "mt"), "--preset", "debug", "--vocab_size", "300",
                 "--block_size", "40", "--max_iters", "1", "--eval_iters", "1",
                 "--sample_tokens", "0", "--warmup_iters", "0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\d+ training pairs longer than 39 tokens dropped, \d+ kept; \d+ valid "
                     r"pairs longer than 39 left out", out), out


def test_several_sources_to_evaluate_are_refused_where_they_cannot_be_read(runs, tmp_path,
                                                                         capsys):
    """Sentence pairs come from one --data; a prepared folder is read alone: one line each,
    not an internal error or a prepared folder's files read as text."""
    out, data = runs
    assert main(["evaluate", str(out["seq2seq"]), "--data", data["seq2seq"],
                 data["seq2seq"]]) == 2
    _user_error(capsys, "one --data")
    assert main(["prepare", "--data", data["gpt"], "--out", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out["gpt"]), "--data", str(tmp_path / "d"),
                 data["gpt"]]) == 2
    _user_error(capsys, "is a prepared folder: it is read alone")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_answers_each_command_of_the_protocol(name):
    """The Family protocol's per-command methods exist on every family: a family without the
    command refuses it (NotApplicable, a user error) rather than lacking the method."""
    from minitransformer.families import NotApplicable

    family = FAMILIES[name]
    calls = {"fill": lambda: family.fill(None, None, ["a [MASK]"], 1),
             "translate": lambda: family.translate(None, None, ["a"], {}, "cpu"),
             "explain": lambda: family.explain(None, None, "a", 0, 0, 1, "a")}
    for command, call in calls.items():
        if command not in family.commands:
            with pytest.raises(NotApplicable, match=f"{command} does not apply"):
                call()
