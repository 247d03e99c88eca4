"""The command line end to end on a tiny corpus, and its answers to user errors."""

from __future__ import annotations

import csv
import math

import pytest

from minitransformer import cli
from minitransformer.tokenizers import load_tokenizer

PROMPT = "the "


def _assert_user_error(code: int, stderr: str, *words: str) -> None:
    """Exit code 2, a short message naming the problem, no traceback."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert "error:" in stderr
    assert len(stderr.strip().splitlines()) <= 3, stderr
    for word in words:
        assert word in stderr, (word, stderr)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, run_cli, tiny_text):
    """Train the debug preset for 30 steps on a few KB of text, in a fresh interpreter."""
    root = tmp_path_factory.mktemp("cli")
    corpus = root / "tiny.txt"
    corpus.write_text(tiny_text, encoding="utf-8")
    proc = run_cli("train", "--data", corpus, "--out", root / "run", "--preset", "debug",
                   "--max_iters", "30", "--eval_interval", "15", "--quiet")
    return root / "run", proc


def test_train_end_to_end(tiny_run, tiny_text):
    run, proc = tiny_run
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "done: 30 steps" in proc.stdout
    for name in ("model.safetensors", "config.json", "tokenizer.json", "log.csv", "loss.png"):
        assert (run / name).is_file(), name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000015", "step_0000030"]
    assert load_tokenizer(run / "tokenizer.json").chars == sorted(set(tiny_text))


def test_sample_end_to_end(tiny_run, run_cli, capsys, tiny_text):
    run, _ = tiny_run
    proc = run_cli("sample", run, "--prompt", PROMPT, "--seed", "1", "--max-new-tokens", "40")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith(PROMPT) and text.endswith("\n")
    assert len(text) == len(PROMPT) + 40 + 1
    assert set(text) <= set(tiny_text)
    # The same seed in another process gives the same text; another seed, another text.
    assert cli.main(["sample", str(run), "--prompt", PROMPT, "--seed", "1",
                     "--max-new-tokens", "40"]) == 0
    assert capsys.readouterr().out == text
    assert cli.main(["sample", str(run), "--prompt", PROMPT, "--seed", "2",
                     "--max-new-tokens", "40"]) == 0
    assert capsys.readouterr().out != text


def test_greedy_sample_equals_top_k_one_and_no_cache(tiny_run, capsys):
    run, _ = tiny_run
    outs = []
    for extra in (["--temperature", "0"], ["--top-k", "1", "--seed", "3"],
                  ["--temperature", "0", "--no-cache"]):
        assert cli.main(["sample", str(run), "--prompt", PROMPT, "--max-new-tokens", "50",
                         *extra]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]


def test_evaluate(tiny_run, capsys):
    run, _ = tiny_run
    assert cli.main(["evaluate", str(run), "--eval-iters", "5"]) == 0
    out = capsys.readouterr().out
    loss = float(out.split("val loss")[1].split()[0])
    assert 0.5 < loss < 4.0  # trained a little: better than uniform over ~40 characters
    assert "perplexity" in out


# ---- user errors: exit 2, one short line, no traceback ----------------------------------

def test_unknown_flag(run_cli, tmp_path):
    proc = run_cli("train", "--out", tmp_path / "x", "--n_layers", "2")
    _assert_user_error(proc.returncode, proc.stderr, "--n_layers")


def _main(capsys, *argv) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_missing_corpus_file(tmp_path, capsys):
    code, err = _main(capsys, "train", "--data", tmp_path / "nope.txt", "--out", tmp_path / "x")
    _assert_user_error(code, err, "no such file", "nope.txt")


def test_empty_corpus(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    code, err = _main(capsys, "train", "--data", empty, "--out", tmp_path / "x",
                      "--preset", "debug")
    _assert_user_error(code, err, "empty")


def test_corpus_shorter_than_a_window(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("a short text that cannot fill a window of 33 tokens in validation",
                     encoding="utf-8")
    code, err = _main(capsys, "train", "--data", short, "--out", tmp_path / "x",
                      "--preset", "debug")
    _assert_user_error(code, err, "too short", "block_size")
    assert not (tmp_path / "x").exists()


def test_n_embd_not_divisible_by_n_head(tiny_corpus, tmp_path, capsys):
    code, err = _main(capsys, "train", "--data", tiny_corpus, "--out", tmp_path / "x",
                      "--preset", "debug", "--n_embd", "30", "--n_head", "4")
    _assert_user_error(code, err, "divisible")


def test_unknown_prompt_character(tiny_run, capsys):
    run, _ = tiny_run
    code, err = _main(capsys, "sample", run, "--prompt", "从前有座山")
    _assert_user_error(code, err, "'从'")


def test_missing_checkpoint_folder(tmp_path, capsys):
    code, err = _main(capsys, "sample", tmp_path / "no-run", "--prompt", "a")
    _assert_user_error(code, err, "no such checkpoint folder")
    code, err = _main(capsys, "evaluate", tmp_path / "no-run")
    _assert_user_error(code, err, "no such checkpoint folder")


def test_bad_sampling_values(tiny_run, capsys):
    run, _ = tiny_run
    code, err = _main(capsys, "sample", run, "--prompt", PROMPT, "--top-p", "1.5")
    _assert_user_error(code, err, "--top_p")
    code, err = _main(capsys, "sample", run, "--prompt", PROMPT, "--temperature", "-1")
    _assert_user_error(code, err, "--temperature")
    # greedy decoding draws nothing: a draw's settings, or several samples, are errors
    for extra, said in ((["--top_k", "5"], "--top_k would change nothing; drop it"),
                        (["--top_p", "0.5", "--seed", "3"], "--top_p and --seed would"),
                        (["--num_samples", "2"], "all 2 samples would be the same text")):
        code, err = _main(capsys, "sample", run, "--prompt", PROMPT, "--temperature", "0",
                          *extra)
        _assert_user_error(code, err, "--temperature 0 is greedy decoding", said)


def test_existing_run_needs_resume_or_force(tiny_run, tiny_corpus, capsys):
    run, _ = tiny_run
    code, err = _main(capsys, "train", "--data", tiny_corpus, "--out", run, "--preset", "debug")
    _assert_user_error(code, err, "--resume", "--force")


def test_force_replaces_the_runs_checkpoints_and_leaves_other_files(tiny_corpus, tmp_path,
                                                                     capsys):
    out = tmp_path / "mine"
    (out / "checkpoints" / "step_0000099").mkdir(parents=True)
    (out / "checkpoints" / "step_0000099" / "trainer_state.json").write_text("{}")
    (out / "checkpoints" / "mine.txt").write_text("x")
    (out / "notes.txt").write_text("p")
    code = cli.main(["train", "--data", str(tiny_corpus), "--out", str(out), "--preset", "debug",
                     "--time_budget", "none", "--max_iters", "2", "--eval_interval", "2",
                     "--eval_iters", "1", "--sample_tokens", "0", "--quiet", "--force"])
    assert code == 0, capsys.readouterr().err
    assert (out / "checkpoints" / "mine.txt").read_text() == "x"
    assert (out / "notes.txt").read_text() == "p"
    assert not (out / "checkpoints" / "step_0000099").exists()
    assert (out / "checkpoints" / "step_0000002").is_dir()


def test_time_budget_none_without_a_preset_lets_max_iters_decide(tiny_corpus, tmp_path, capsys):
    code = cli.main(["train", "--data", str(tiny_corpus), "--out", str(tmp_path / "run"),
                     "--time_budget", "none", "--max_iters", "3", "--eval_interval", "3",
                     "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--block_size", "8",
                     "--eval_iters", "1", "--sample_tokens", "0", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "done: 3 steps" in out.out


def test_max_iters_under_a_time_budget_ends_the_schedule_too(tiny_corpus, tmp_path, capsys):
    """A run stops at --max_iters or the time budget, whichever comes first; the learning
    rate decays to min_lr by the first too (it used to follow the hour's clock and end at
    its peak after 6 steps)."""
    run = tmp_path / "run"
    code = cli.main(["train", "--data", str(tiny_corpus), "--out", str(run), "--preset", "debug",
                     "--time_budget", "1h", "--max_iters", "6", "--eval_interval", "6",
                     "--warmup_iters", "0", "--lr", "0.01", "--min_lr", "0.001",
                     "--log_interval", "1", "--eval_iters", "1", "--sample_tokens", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "training for 3600s or 6 steps, whichever comes first" in out.out
    with open(run / "log.csv", newline="") as f:
        lrs = [float(r["lr"]) for r in csv.DictReader(f) if r["lr"]]
    assert len(lrs) == 6 and lrs[0] == pytest.approx(0.01)
    assert lrs[-1] == pytest.approx(0.001 + 0.0045 * (1 + math.cos(math.pi * 5 / 6)), rel=1e-3)


def test_the_header_leaves_out_a_step_cap_no_run_reaches(tiny_corpus, tmp_path, capsys):
    """Presets that the time budget ends (cpu-medium, seq2seq cpu-small, autosized runs) cap
    steps at 1,000,000: the header says the time alone, not "or 1,000,000 steps"."""
    from minitransformer.presets import GPT, NO_STEP_CAP, SEQ2SEQ

    assert GPT["cpu-medium"]["max_iters"] == SEQ2SEQ["cpu-small"]["max_iters"] == NO_STEP_CAP
    code = cli.main(["train", "--data", str(tiny_corpus), "--out", str(tmp_path / "run"),
                     "--preset", "debug", "--time_budget", "1", "--max_iters", str(NO_STEP_CAP),
                     "--eval_iters", "1", "--sample_tokens", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "training for 1s, " in out.out and "1,000,000" not in out.out


def test_the_sample_command_train_ends_with_runs_as_printed(tiny_corpus, tmp_path, capsys):
    """A corpus whose first line is "---" (YAML front matter, a Markdown rule): the printed
    command says --prompt=---, which parses (--prompt --- did not)."""
    import shlex

    from minitransformer.data import load_text

    data = tmp_path / "notes.txt"
    data.write_text("---\n" + load_text(str(tiny_corpus)), encoding="utf-8")
    assert cli.main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--preset",
                     "debug", "--max_iters", "2", "--eval_iters", "1", "--sample_tokens",
                     "0"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "sample from it" in ln)
    args = shlex.split(line.split("sample from it: minitransformer ", 1)[1])
    assert "--prompt=---" in args
    assert cli.main([*args, "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("---")


def test_a_run_shorter_than_the_presets_warmup_says_so(tiny_corpus, tmp_path, capsys):
    """--max_iters 6 with the debug preset's 20-step warmup: the rate never reaches its peak
    (a fine-tuning run of 20 steps under the finetune preset's 50 did so silently)."""
    args = ["train", "--data", str(tiny_corpus), "--preset", "debug", "--max_iters", "6",
            "--eval_iters", "1", "--sample_tokens", "0", "--time_budget", "none"]
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "6 steps end inside the preset's 20-step warmup: the learning rate never " \
        "reaches" in capsys.readouterr().out
    assert cli.main([*args, "--out", str(tmp_path / "b"), "--warmup_iters", "2"]) == 0
    assert "warmup" not in capsys.readouterr().out


def test_a_ctrl_c_while_pytorch_loads_is_an_interruption_not_a_traceback():
    """The package imports PyTorch only when a name needs it; the command's entry point
    answers a Ctrl-C during that import (a second or more) as it answers one later."""
    import subprocess
    import sys

    light = subprocess.run([sys.executable, "-c", "import sys, minitransformer; "
                            "print(minitransformer.__version__, 'torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert light.stdout.split() == ["0.1.0", "False"], light.stderr
    import minitransformer

    names = {"PRESETS", *minitransformer._WHERE}
    assert set(minitransformer.__all__) == names and len(minitransformer.__all__) == len(names)
    assert all(getattr(minitransformer, name) is not None for name in names)
    assert minitransformer.models.GPT is minitransformer.GPT  # subpackages, as before
    stop_at_torch = (
        "import sys\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
        "from minitransformer.__main__ import run\n"
        "sys.exit(run())\n")
    proc = subprocess.run([sys.executable, "-c", stop_at_torch, "presets"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr == "minitransformer: interrupted\n", \
        proc.stderr
