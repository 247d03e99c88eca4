"""Every bad input ends in one line on stderr and exit code 2, never a traceback, and leaves
existing files as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minitransformer import GPT, GPTConfig
from minitransformer.cli import main

TINY = ["--preset", "debug", "--n_layer", "1", "--n_embd", "16", "--n_head", "2",
        "--block_size", "8", "--max_iters", "4", "--eval_interval", "2", "--eval_iters", "1",
        "--sample_tokens", "0", "--quiet"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    corpus = root / "text.txt"
    corpus.write_text("hello world, the quick brown fox. " * 60, encoding="utf-8")
    assert main(["train", "--data", str(corpus), "--out", str(root / "run"), *TINY]) == 0
    return root / "run"


def files(tmp: Path) -> dict[str, Path]:
    out = {}
    for name, data in {
        "empty.txt": b"",
        "blank.txt": b"  \n\t \n",
        "binary.bin": bytes(range(256)) * 4,
        "gbk.txt": "我吃了一个红苹果。从前有座山。".encode("gbk") * 50,
        "latin1.txt": "caf\xe9 na\xefve d\xe9j\xe0 vu. ".encode("latin-1") * 50,
        "short.txt": b"tiny",
        "ok.txt": b"hello world, the quick brown fox. " * 60,
    }.items():
        path = tmp / name
        path.write_bytes(data)
        out[name] = path
    return out


def check_user_error(capsys, argv, *words):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, err  # argparse adds a usage line; ours are one line
    for word in words:
        assert word.lower() in err.lower(), (word, err)


CORPUS_CASES = {
    "missing": ("missing.txt", ["no such file"]),
    "empty": ("empty.txt", ["empty"]),
    "whitespace only": ("blank.txt", ["empty"]),
    "binary": ("binary.bin", ["binary"]),
    "gbk": ("gbk.txt", ["--encoding"]),
    "latin-1": ("latin1.txt", ["--encoding"]),
    "shorter than block_size + 1": ("short.txt", ["too short", "block_size"]),
}


@pytest.mark.parametrize("case", list(CORPUS_CASES))
def test_bad_corpus(case, tmp_path, capsys):
    name, words = CORPUS_CASES[case]
    f = files(tmp_path)
    data = f.get(name, tmp_path / name)
    check_user_error(capsys, ["train", "--data", data, "--out", tmp_path / "o", *TINY], *words)


def test_other_encodings_work_when_named(tmp_path, capsys):
    f = files(tmp_path)
    assert main(["train", "--data", str(f["gbk.txt"]), "--encoding", "gbk", "--out",
                 str(tmp_path / "o"), *TINY, "--block_size", "4"]) == 0


BAD_FLAGS = {
    "n_embd not divisible by n_head": (["--n_embd", "30", "--n_head", "4"], ["divisible"]),
    "zero size": (["--n_layer", "0"], ["positive"]),
    "negative size": (["--block_size", "-3"], ["positive"]),
    "negative learning rate": (["--learning_rate", "-1"], ["positive"]),
    "dropout out of range": (["--dropout", "1.5"], ["dropout"]),
    "unknown preset": (["--preset", "cpu-smal"], ["cpu-small"]),
    "unknown flag": (["--n_layr", "2"], ["--n_layer"]),
    "bad choice": (["--pos_encoding", "spiral"], ["invalid choice"]),
    "not a number": (["--n_layer", "two"], ["invalid"]),
    "cuda without cuda": (["--device", "cuda"], ["cuda"]),
    "bad duration": (["--time_budget", "soon"], ["duration"]),
    "a decay that rises": (["--learning_rate", "1e-3", "--min_lr", "1e-2"],
                           ["--min_lr 0.01 is above the learning rate 0.001"]),
    "a BPE size for characters": (["--vocab_size", "500"], ["--vocab_size", "--tokenizer bpe"]),
    "a rate the paper's schedule never reads": (
        ["--lr_schedule", "noam", "--lr", "0.5", "--min_lr", "0"],
        ["--learning_rate and --min_lr would change nothing: --lr_schedule noam"]),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_flags(case, tmp_path, capsys):
    if case == "cuda without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    extra, words = BAD_FLAGS[case]
    f = files(tmp_path)
    check_user_error(capsys, ["train", "--data", f["ok.txt"], "--out", tmp_path / "o", *TINY,
                              *extra], *words)
    assert not (tmp_path / "o" / "model.safetensors").exists()


def test_output_folder_with_another_run_is_refused_unless_resume_or_force(run_dir, tmp_path,
                                                                         capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    before = (copy / "model.safetensors").read_bytes()
    check_user_error(capsys, ["train", "--data", "shakespeare", "--out", copy, *TINY],
                     "--resume", "--force")
    assert (copy / "model.safetensors").read_bytes() == before


def test_a_run_over_a_comparison_is_refused(run_dir, tmp_path, capsys):
    """compare's --out holds its results and its runs, one folder each: a run written over it
    would leave compare refusing its own folder ("holds a training run"), --force or not."""
    cmp = tmp_path / "cmp"
    shutil.copytree(run_dir, cmp / "a")
    (cmp / "results.json").write_text("{}", encoding="utf-8")
    before = {p: p.read_bytes() for p in cmp.rglob("*") if p.is_file()}
    for extra in ([], ["--force"]):
        check_user_error(capsys, ["train", "--data", "shakespeare", "--out", cmp, *TINY,
                                  *extra], "holds a comparison")
    assert {p: p.read_bytes() for p in cmp.rglob("*") if p.is_file()} == before


def test_a_run_inside_another_run_or_over_its_own_start_is_refused(run_dir, tmp_path, capsys):
    """--out in a run's checkpoints/ would nest a run among its checkpoints; --out equal to
    --init_from would write over the model the run starts from, --force or not."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    newest = sorted((copy / "checkpoints").iterdir())[-1]
    for out in (copy / "checkpoints", copy / "checkpoints" / "new", newest):
        for extra in ([], ["--force"], ["--resume"]):
            check_user_error(capsys, ["train", "--data", "shakespeare", "--out", out, *TINY,
                                      *extra], "lies inside a run")
    check_user_error(capsys, ["train", "--init_from", copy, "--data", "shakespeare", "--out",
                              copy, "--force", *TINY], "is the --init_from folder")
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_unknown_prompt_characters_are_named(run_dir, capsys):
    check_user_error(capsys, ["sample", run_dir, "--prompt", "hello 😀 ZZ"], "'😀'", "'Z'")


def broken_copies(run_dir: Path, tmp: Path) -> dict[str, Path]:
    cases = {}

    def copy(name):
        dst = tmp / name
        shutil.copytree(run_dir, dst)
        return dst

    d = copy("missing_file")
    (d / "tokenizer.json").unlink()
    cases["a file missing"] = d
    d = copy("truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated safetensors"] = d
    d = copy("garbage")
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    cases["corrupt safetensors"] = d
    for label, change in {"unknown key": {"n_layers": 3}, "impossible value": {"n_head": 5},
                          "negative size": {"n_embd": -16}}.items():
        d = copy(label.replace(" ", "_"))
        meta = json.loads((d / "config.json").read_text())
        meta["model"].update(change)
        (d / "config.json").write_text(json.dumps(meta))
        cases[f"config.json with {label}"] = d
    d = copy("not_json")
    (d / "config.json").write_text("{not json")
    cases["config.json not JSON"] = d
    return cases


def test_broken_checkpoints(run_dir, tmp_path, capsys):
    for label, folder in broken_copies(run_dir, tmp_path).items():
        for cmd in (["sample", folder, "--prompt", "he", "--max-new-tokens", "3"],
                    ["evaluate", folder, "--eval-iters", "1"]):
            code = main([str(a) for a in cmd])
            err = capsys.readouterr().err
            assert code == 2 and "Traceback" not in err and err.count("\n") <= 2, (label, err)


def test_missing_checkpoint_folder(tmp_path, capsys):
    check_user_error(capsys, ["sample", tmp_path / "nope", "--prompt", "a"], "no such")
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    check_user_error(capsys, ["sample", tmp_path / "a.txt"], "is a file", "run folder")


def test_which_last_on_a_checkpoint_folder_is_an_error_not_ignored(run_dir, tmp_path,
                                                                     monkeypatch, capsys):
    newest = sorted((run_dir / "checkpoints").iterdir())[-1]
    assert main(["sample", str(newest), "--prompt", "he", "--max-new-tokens", "2"]) == 0
    capsys.readouterr()
    check_user_error(capsys, ["sample", newest, "--prompt", "he", "--which", "last"],
                     "no checkpoints/", "drop --which")
    for command in (["sample", newest, "--prompt", "he"], ["evaluate", newest]):
        check_user_error(capsys, [*command, "--which", "best"], "drop --which")
    assert main(["sample", str(run_dir), "--prompt", "he", "--max-new-tokens", "2",
                 "--which", "best"]) == 0
    monkeypatch.chdir(newest)  # named as "." the checkpoint is the same folder
    check_user_error(capsys, ["sample", ".", "--prompt", "he", "--which", "best"],
                     "drop --which")
    kept = tmp_path / "checkpoints" / "myrun"  # a run kept in a folder of that name is a run
    shutil.copytree(run_dir, kept)
    assert main(["sample", str(kept), "--prompt", "he", "--max-new-tokens", "2",
                 "--which", "best"]) == 0


def test_a_runs_checkpoints_folder_points_at_the_run_and_its_checkpoints(run_dir, capsys):
    newest = sorted((run_dir / "checkpoints").iterdir())[-1]
    check_user_error(capsys, ["sample", run_dir / "checkpoints", "--prompt", "he"],
                     "holds a run's checkpoints", str(newest))


@pytest.mark.parametrize("damaged", ["trainer_state.safetensors", "model.safetensors",
                                     "trainer_state.json"])
def test_a_damaged_newest_checkpoint_names_the_one_to_go_back_to(run_dir, tmp_path, capsys,
                                                                 damaged):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    *older, newest = sorted((copy / "checkpoints").iterdir())
    state = newest / damaged  # its model file too (the hint was the training state's only)
    state.write_bytes(state.read_bytes()[:10 if damaged.endswith(".json") else 500])
    resume = ["train", "--out", copy, "--resume", "--max_iters", "6", "--quiet",
              "--time_budget", "none"]
    check_user_error(capsys, resume, str(newest),
                     f"remove that folder to go back to {older[-1].name}")
    shutil.rmtree(newest)  # as the message says: the run resumes from the one before
    assert main([str(a) for a in resume]) == 0


@pytest.mark.parametrize("change", ["optimizer", "rng", "step", "groups", "no groups",
                                    "a word for groups", "a number for a group"])
def test_a_training_state_that_reads_but_lacks_its_parts_is_a_damaged_checkpoint(
        run_dir, tmp_path, capsys, change):
    """Valid JSON without a key the resume reads, or an optimizer state without its parts,
    was an internal KeyError; it is a damaged checkpoint, named with the one to go back to."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    *older, newest = sorted((copy / "checkpoints").iterdir())
    path = newest / "trainer_state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    if change == "groups":
        state["optimizer"] = {"kind": "adamw"}  # its parameter groups gone
    elif change == "no groups":
        state["optimizer"]["param_groups"] = []
    elif change == "a word for groups":
        state["optimizer"]["param_groups"] = "x"
    elif change == "a number for a group":
        state["optimizer"]["param_groups"] = [1]
    else:
        del state[change]
    path.write_text(json.dumps(state), encoding="utf-8")
    check_user_error(capsys, ["train", "--out", copy, "--resume", "--max_iters", "6",
                              "--quiet", "--time_budget", "none"],
                     str(newest), "damaged", f"remove that folder to go back to {older[-1].name}")


@pytest.mark.parametrize("groups", [[], "x", [1], [{"lr": 1.0}], [{"params": "ab"}],
                                    [{"params": [0, "1"]}]])
def test_malformed_parameter_groups_are_refused_where_both_resumes_read_them(run_dir, tmp_path,
                                                                             groups):
    """--shard's resume reads the optimizer's state by name (``read_training_state``, then
    ``distributed.set_full_state``), without ``load_state_dict``'s checks: the groups are
    checked as they are read, so a malformed one is a damaged checkpoint there too."""
    from minitransformer.errors import UserError
    from minitransformer.training import checkpoint as ckpt

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    newest = ckpt.list_checkpoints(copy)[-1]
    assert ckpt.read_training_state(newest)[1]["param_groups"]  # as saved: it reads
    path = newest / "trainer_state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    state["optimizer"]["param_groups"] = groups
    path.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(UserError, match="the checkpoint is damaged"):
        ckpt.read_training_state(newest)


def test_resume_and_force_together_are_refused(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    before = (copy / "model.safetensors").read_bytes()
    check_user_error(capsys, ["train", "--out", copy, "--resume", "--force", "--quiet"],
                     "give one of them")
    assert (copy / "model.safetensors").read_bytes() == before


def test_resume_names_a_later_folder_it_skips(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    newest = sorted((copy / "checkpoints").iterdir())[-1]
    damaged = newest.with_name("step_9999999")
    shutil.copytree(newest, damaged)
    (damaged / "trainer_state.json").unlink()  # as if its save had been cut short
    assert main(["train", "--out", str(copy), "--resume", "--max_iters", "5", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "from step 4" in out and "skipped step_9999999: incomplete" in out, out
    assert "done: 5 steps (1 now) in " in out, out  # the run's steps, and this call's


def test_sequence_longer_than_a_learned_position_table():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match="longer than the learned position table"):
        model(torch.zeros(1, 9, dtype=torch.long))
    # generation crops the context instead, so it never hits the limit
    assert model.generate(torch.zeros(1, 1, dtype=torch.long), 20).shape == (1, 21)


def test_an_impossible_model_setting_fails_before_the_data_is_read(tmp_path, capsys):
    # the data is never opened (it does not even exist): the setting is refused first
    for flags, words in ((["--n_layer", "0"], ["n_layer"]),
                         (["--n_embd", "30", "--n_head", "4"], ["n_embd", "n_head"])):
        check_user_error(capsys, ["train", "--data", tmp_path / "missing.txt", "--out",
                                  tmp_path / "o", "--preset", "debug", *flags], *words)
    assert not (tmp_path / "o").exists()


def test_seeds_run_from_0_to_2_63_minus_1_everywhere(tmp_path, capsys):
    import argparse

    from minitransformer.cli.flags import seed
    from minitransformer.config import SEED_LIMIT, TrainConfig
    from minitransformer.errors import ConfigError

    assert TrainConfig(seed=SEED_LIMIT - 1).seed == seed(str(SEED_LIMIT - 1)) == 2 ** 63 - 1
    for bad in (SEED_LIMIT, -1):
        with pytest.raises(ConfigError, match="seed"):
            TrainConfig(seed=bad)
        with pytest.raises(argparse.ArgumentTypeError):
            seed(str(bad))
    check_user_error(capsys, ["train", "--data", tmp_path / "missing.txt", "--out",
                              tmp_path / "o", "--preset", "debug", "--seed", 2 ** 64], "seed")


def test_utf16_text_is_named_and_an_unknown_encoding_comes_first(tmp_path, capsys):
    path = tmp_path / "wide.txt"
    path.write_text("hello world, the quick brown fox. " * 60, encoding="utf-16")
    train = ["train", "--data", path, "--out", tmp_path / "o", *TINY]
    check_user_error(capsys, train, "binary", "--encoding utf-16")
    check_user_error(capsys, [*train, "--encoding", "no-such"], "unknown encoding")
    assert main([str(a) for a in [*train, "--encoding", "utf-16"]]) == 0
    # without a byte-order mark the order is read from where the NULs fall, Chinese too
    for name in ("utf-16-le", "utf-16-be"):
        path.write_text("床前明月光，疑是地上霜。\n举头望明月, low head.\n" * 40, encoding=name)
        check_user_error(capsys, [*train[:3], "--out", tmp_path / name, *TINY],
                         "without a byte-order mark", f"--encoding {name}")


def test_the_worked_example_refuses_a_models_page_settings(tmp_path, capsys):
    out = tmp_path / "w.html"
    for flag in ("--layer", "--head", "--top_k"):
        check_user_error(capsys, ["explain", "--worked_example", "--out", out, flag, "1"],
                         flag, "worked example")
    assert not out.exists()
    assert main(["explain", "--worked_example", "--out", str(out)]) == 0 and out.exists()


def test_compare_never_writes_over_a_run_or_another_comparison(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    vary = ["compare", "--vary", "seed=1,2", "--max-iters", "1", "--out"]
    check_user_error(capsys, [*vary, copy, "--force"], "holds a training run")
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
    earlier = tmp_path / "cmp"
    earlier.mkdir()
    (earlier / "results.json").write_text("[]", encoding="utf-8")
    check_user_error(capsys, [*vary, earlier], "comparison's results", "--force")
    assert (earlier / "results.json").read_text(encoding="utf-8") == "[]"


def test_a_kernel_setting_that_is_not_one_is_refused(run_dir, monkeypatch, capsys):
    monkeypatch.setenv("MINITRANSFORMER_KERNEL", "BLAS")
    check_user_error(capsys, ["sample", run_dir, "--max_new_tokens", 2],
                     "MINITRANSFORMER_KERNEL='BLAS' is not one of", "blas")
    monkeypatch.setenv("MINITRANSFORMER_KERNEL", "blas")
    assert main(["sample", str(run_dir), "--max_new_tokens", "2", "--seed", "0",
                 "--prompt", "h"]) == 0


def test_messages_name_what_was_given(run_dir, tmp_path, capsys):
    """Each refusal says what the input is: a family with its article, a file where a folder
    is expected, prepared data where a model is, an empty text (not "nothing to train on")."""
    f = files(tmp_path)
    check_user_error(capsys, ["train", "--out", run_dir, "--resume", "--model", "encoder"],
                     "holds a GPT run, not an encoder run")
    check_user_error(capsys, ["train", "--out", run_dir, "--resume", "--encoding", "gbk"],
                     "--resume reads the run's own data in its encoding (utf-8)")
    # its data settings, not its data: --resume --data DIR may go on with other text
    check_user_error(capsys, ["train", "--out", run_dir, "--resume", "--n_layer", "3"],
                     "--resume keeps the run's model and data settings; n_layer differ(s)")
    for argv in (["train", "--data", "sayings", "--out", tmp_path / "o"],
                 ["evaluate", run_dir, "--data", "sayings"],
                 ["prepare", "--data", "sayings", "--out", tmp_path / "d"]):
        check_user_error(capsys, [*argv, "--encoding", "gbk"],
                         "--encoding gbk: sayings is a bundled corpus, stored as utf-8")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9 " * 200 + b"\x80")  # neither utf-8 nor gbk
    from minitransformer.data.text import load_text
    from minitransformer.errors import UserError
    with pytest.raises(UserError, match="pass the file's own encoding with --encoding"):
        load_text(str(latin), "gbk")
    with pytest.raises(UserError, match="if it is GBK, Latin-1 or another encoding"):
        load_text(str(latin), "utf-8")
    check_user_error(capsys, ["train", "--data", f["ok.txt"], "--data_tgt", f["ok.txt"],
                              "--model", "encoder", "--out", tmp_path / "o"],
                     "an encoder reads one text")
    check_user_error(capsys, ["train", "--init_from", f["ok.txt"], "--data", f["ok.txt"],
                              "--out", tmp_path / "o"], "ok.txt is a file")
    check_user_error(capsys, ["sample", run_dir, "--temperature", "inf"], "finite")
    check_user_error(capsys, ["evaluate", run_dir, "--data", f["empty.txt"]],
                     "empty.txt is empty", "holds no text")
    assert main(["prepare", "--data", str(f["ok.txt"]), "--out", str(tmp_path / "dd")]) == 0
    check_user_error(capsys, ["sample", tmp_path / "dd"], "holds prepared data, not a model")
    check_user_error(capsys, ["train", "--data", tmp_path / "dd", "--out", tmp_path / "o",
                              "--encoding", "latin-1"], "holds prepared token ids")
    from minitransformer.data.text import same_encoding
    assert same_encoding("UTF8", "utf-8") and same_encoding("GBK", "gbk")
    assert not same_encoding("gbk", "utf-8")


def test_a_preset_min_lr_above_a_given_learning_rate_follows_it_down(tmp_path, capsys):
    """--learning_rate 1e-4 under debug's min_lr of 3e-4: the decay would rise, so min_lr
    goes to a tenth of the rate, said in a note (a --min_lr given above it is an error)."""
    import json

    f = files(tmp_path)
    out = tmp_path / "o"
    assert main([str(a) for a in ["train", "--data", f["ok.txt"], "--out", out, *TINY,
                                  "--learning_rate", "1e-4"]]) == 0
    assert "note: min_lr 0.0003 is above --learning_rate 0.0001: the rate decays to 1e-05" \
        in capsys.readouterr().out
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert meta["train"]["learning_rate"] == 1e-4 and meta["train"]["min_lr"] == 1e-5
    meta["train"]["min_lr"] = 1e-3  # a run written before: still evaluates and resumes
    for folder in (out, *(out / "checkpoints").iterdir()):
        (folder / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    assert main(["evaluate", str(out), "--eval_iters", "1"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--max_iters", "6", "--quiet"]) == 0


def test_running_out_of_memory_is_a_user_error_with_the_size(run_dir, monkeypatch, capsys):
    """A context or batch too large for the machine: PyTorch's CPU allocator refuses the
    tensor with a RuntimeError; one line with the size asked, exit 2. Another RuntimeError
    stays an internal error (exit 1)."""
    from minitransformer.models import gpt

    def refuse(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 80000000000 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(gpt.GPT, "forward", refuse)
    assert main(["sample", str(run_dir), "--prompt", "the", "--max_new_tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory (a tensor of 80.0 GB)" in err, err
    monkeypatch.setattr(gpt.GPT, "forward", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("something else")))
    assert main(["sample", str(run_dir), "--prompt", "the", "--max_new_tokens", "2"]) == 1
    assert "internal error: RuntimeError: something else" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["train", "--out", ""], "--out"), (["train", "--data", "", "--out", "o"], "--data"),
    (["evaluate", ""], "DIR"), (["export", "RUN", "--hf", ""], "--hf"),
    (["sample", "--hf", ""], "--hf"),
    (["compare", "--vary", "n_layer=1,2", "--out", ""], "--out"),
    (["prepare", "--data", "a.txt", "--data", "", "--out", "o"], "--data"),
    (["translate", "RUN", "--input", ""], "--input")])
def test_an_empty_path_is_refused_not_taken_as_here(argv, flag, tmp_path, monkeypatch, capsys):
    """An unset shell variable (--out "$RUN") would be the current folder, or no --data at
    all (the default corpus): an error naming the flag, and nothing written."""
    monkeypatch.chdir(tmp_path)
    check_user_error(capsys, argv, f"{flag} is empty")
    assert not any(tmp_path.iterdir())


def test_several_sources_are_given_to_evaluate_and_prepare_as_to_train(tmp_path, capsys):
    """--data A B and --data A --data B: evaluate scores a run on both (its own two, here the
    same figures as without --data), prepare prepares both, as train reads them."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("hello world, the quick brown fox. " * 60, encoding="utf-8")
    b.write_text("the lazy dog jumps over it again. " * 60, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "--data", str(a), str(b), "--out", str(run), *TINY]) == 0
    capsys.readouterr()
    scores = []
    for extra in ([], ["--data", str(a), str(b)], ["--data", str(a), "--data", str(b)]):
        assert main(["evaluate", str(run), *extra]) == 0
        scores.append(capsys.readouterr().out.splitlines()[0])
    assert scores[0].startswith("val loss") and len(set(scores)) == 1, scores
    for name, extra in (("p1", [str(a), str(b)]), ("p2", [str(a), "--data", str(b)])):
        assert main(["prepare", "--data", *extra, "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "p1" / "tokens.bin").read_bytes() == \
        (tmp_path / "p2" / "tokens.bin").read_bytes()


def test_a_run_in_its_data_folder_itself_is_refused(tmp_path, capsys, monkeypatch):
    """--data books --out books: the run's files would join the text the next time the
    folder is read (a run in a folder inside it is skipped); refused, nothing written."""
    books = tmp_path / "books"
    books.mkdir()
    (books / "ch1.txt").write_text("hello world, the quick brown fox. " * 60, encoding="utf-8")
    for out in (books, books / ".." / "books"):
        check_user_error(capsys, ["train", "--data", books, "--out", out, *TINY],
                         f"--out {out} is the --data folder")
    assert sorted(p.name for p in books.iterdir()) == ["ch1.txt"]
    # a bundled corpus's name is not a folder, even where one of that name is the run
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--force"]):
        assert main(["train", "--data", "shakespeare", "--out", "shakespeare", *TINY,
                     *extra]) == 0


def test_resume_with_init_from_says_drop_it(run_dir, capsys):
    """--resume continues the run; --init_from (even naming the run itself) starts another."""
    for source in (run_dir, run_dir.parent / "elsewhere"):
        check_user_error(capsys, ["train", "--out", run_dir, "--resume", "--init_from", source],
                         "drop --init_from")


def test_a_negative_learning_rate_is_only_refused_not_first_followed(tmp_path, capsys):
    """The preset's min_lr above a rate of -1 would be "followed down" to -0.1 in a note: the
    rate's own error comes alone."""
    assert main(["train", "--data", "shakespeare", "--out", str(tmp_path / "o"), *TINY,
                 "--learning_rate", "-1"]) == 2
    out, err = capsys.readouterr()
    assert "min_lr" not in out + err and "learning_rate must be positive" in err, (out, err)


def test_a_folder_with_files_a_run_writes_is_not_written_over_unasked(tmp_path, capsys):
    """--out a folder of the user's own that holds a log.csv (or a model.safetensors ...):
    refused, the file kept; --force writes the run there."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "log.csv").write_text("my numbers\n", encoding="utf-8")
    check_user_error(capsys, ["train", "--data", "shakespeare", "--out", folder, *TINY],
                     "holds log.csv, which the run would write over")
    assert (folder / "log.csv").read_text(encoding="utf-8") == "my numbers\n"
    assert main(["train", "--data", "shakespeare", "--out", str(folder), *TINY,
                 "--force"]) == 0
    # a run's own log.csv, left by a run stopped before its first checkpoint: started over
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "log.csv").write_text((folder / "log.csv").read_text(encoding="utf-8")
                                     .splitlines()[0] + "\n", encoding="utf-8")
    assert main(["train", "--data", "shakespeare", "--out", str(stopped), *TINY]) == 0


@pytest.mark.parametrize("command", ["train", "prepare", "compare"])
def test_an_out_folder_that_is_or_lies_under_a_file_is_refused(command, tmp_path, capsys):
    """`mkdir` failed there after the corpus was read: an internal error, exit 1."""
    text = files(tmp_path)["ok.txt"]
    extra = {"train": TINY, "prepare": [],
             "compare": [*TINY, "--vary", "pos_encoding=rope,alibi"]}[command]
    for out, said in ((text, "is a file; give a folder"),
                      (text / "sub", f"cannot be made: {text} is a file")):
        check_user_error(capsys, [command, "--data", text, "--out", out, *extra], said)
    assert text.read_bytes() == b"hello world, the quick brown fox. " * 60


def test_evaluating_new_characters_with_a_character_model_says_what_reads_them(run_dir,
                                                                               tmp_path, capsys):
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("jumpy zebras " * 40, encoding="utf-8")
    check_user_error(capsys, ["evaluate", run_dir, "--data", held_out],
                     "never saw in training: 'j', 'm', 'p', 'y', 'z'",
                     "--tokenizer bpe-chars or bpe-bytes")


def test_noam_with_muon_takes_a_learning_rate_which_scales_muons(tmp_path, capsys):
    """Muon's rate is noam's times muon_lr / learning_rate: there --learning_rate counts."""
    text = files(tmp_path)["ok.txt"]
    argv = ["train", "--data", text, "--out", tmp_path / "o", *TINY, "--lr_schedule", "noam",
            "--optimizer", "muon", "--learning_rate", "0.01"]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    check_user_error(capsys, ["train", "--data", text, "--out", tmp_path / "p", *TINY,
                              "--lr_schedule", "noam", "--optimizer", "muon", "--min_lr", "0"],
                     "--min_lr would change nothing")


def test_nothing_to_resume_says_why(tmp_path, capsys):
    """No checkpoints/ folder, an empty one, one whose only checkpoint was cut short: each
    said as it is (an empty checkpoints/ folder was "no checkpoints/ folder")."""
    out = tmp_path / "run"
    resume = ["train", "--out", out, "--resume", "--quiet"]
    out.mkdir()
    check_user_error(capsys, resume, "nothing to resume", "it has no checkpoints/ folder")
    (out / "checkpoints").mkdir()
    check_user_error(capsys, resume, "its checkpoints/ folder is empty")
    (out / "checkpoints" / "step_0000010").mkdir()
    check_user_error(capsys, resume, "holds no complete checkpoint (step_0000010 has no "
                                     "trainer_state.json: a save cut short)")


def test_a_full_disk_is_the_machine_not_a_bug(run_dir, monkeypatch, capsys):
    """Writing to a full disk (`sample ... > /dev/full`) is one line and exit 2, not an
    internal error."""
    import errno
    import io

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("sys.stdout", Full())
    code = main(["sample", str(run_dir), "--prompt", "he", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "internal error" not in err and "no space left" in err.lower(), err
    assert len(err.strip().splitlines()) == 1


def test_a_windows_line_end_in_a_prompt_is_read_as_the_training_text_was(tmp_path, capsys):
    """A prompt pasted with CRLF line ends, for a character model that never saw '\\r' (its
    text's line ends were read as '\\n'): read as '\\n' too, where it was refused. Text that
    is not a prompt still names the '\\r' as half of a Windows line end, with the way out."""
    from minitransformer.errors import UserError
    from minitransformer.training.checkpoint import read_tokenizer

    corpus = tmp_path / "lines.txt"
    corpus.write_bytes(b"hello world,\r\nthe quick brown fox.\r\n" * 60)  # read as \n
    run_dir = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(run_dir), *TINY]) == 0
    capsys.readouterr()
    argv = ["sample", str(run_dir), "--max-new-tokens", "8", "--seed", "3", "--prompt"]
    assert main([*argv, "he\nhe"]) == 0
    lf = capsys.readouterr().out
    for prompt in ("he\r\nhe", "he\rhe"):  # the prompt printed as given, then the same text
        assert main([*argv, prompt]) == 0
        out = capsys.readouterr().out
        assert out.startswith(prompt) and out.replace("\r\n", "\n").replace("\r", "\n") == lf
    with pytest.raises(UserError, match="half of a Windows line end: end lines with \\\\n"):
        read_tokenizer(run_dir).encode("he\r\nhe")
