"""What a first hour with the CLI runs into: the hint after training, refusals that say only
what is wrong, resumes that say what they do, aligned figures, CRLF files, the README."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minitransformer.cli import main
from minitransformer.tokenizers import load_tokenizer

DEBUG = ["--preset", "debug", "--max_iters", "4", "--warmup_iters", "1", "--eval_interval", "2",
         "--eval_iters", "2",
         "--sample_tokens", "0", "--quiet"]
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_text):
    root = tmp_path_factory.mktemp("newcomer")
    (root / "own.txt").write_text(tiny_text, encoding="utf-8")
    return root


def test_the_hint_samples_with_a_prompt_from_the_runs_own_corpus(run, capsys):
    assert main(["train", "--data", str(run / "own.txt"), "--out", str(run / "r"), *DEBUG]) == 0
    hint = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("sample from it: "))
    argv = shlex.split(hint.removeprefix("sample from it: "))
    assert argv[:2] == ["minitransformer", "sample"] and "ROMEO" not in hint
    assert argv[argv.index("--prompt") + 1] == "Line 0: the"  # where the corpus starts
    assert main([*argv[1:], "--max_new_tokens", "5", "--seed", "1"]) == 0


def test_a_refused_train_prints_nothing_but_the_refusal(run, capsys):
    assert main(["train", "--data", str(run / "own.txt"), "--out", str(run / "r"), *DEBUG]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--resume" in err and "--force" in err


def test_a_resume_with_nothing_to_do_says_so(run, capsys):
    assert main(["train", "--out", str(run / "r"), "--resume", "--max_iters", "4"]) == 0
    out = capsys.readouterr().out
    assert "nothing to train" in out and "step 4 of max_iters 4" in out
    assert "training for" not in out and "done:" not in out


def test_a_longer_resume_announces_the_new_schedule(run, capsys):
    assert main(["train", "--out", str(run / "r"), "--resume", "--max_iters", "8"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"max_iters 4 -> 8\): the learning rate at step 4 goes from ([0-9.e-]+) to "
                  r"([0-9.e-]+)", out)
    assert m, out
    assert float(m.group(2)) > float(m.group(1))  # the cosine now has further to go
    assert "done: 8 steps" in out


def test_a_resume_inside_the_warmup_says_it_is_still_warming_up(run, capsys):
    """Inside the warmup the rate does not depend on the run's length: no "goes from x to x"."""
    out_dir = run / "warm"
    flags = list(DEBUG)
    flags[flags.index("--warmup_iters") + 1] = "20"
    assert main(["train", "--data", str(run / "own.txt"), "--out", str(out_dir), *flags]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out_dir), "--resume", "--max_iters", "6"]) == 0
    out = capsys.readouterr().out
    assert "at step 4 the run is still warming up (to step 20" in out and "goes from" not in out


def test_evaluate_lines_are_aligned(run, capsys):
    assert main(["evaluate", str(run / "r")]) == 0
    *lines, where = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["val", "perplexity", "bits/character"]
    starts = {re.search(r"\d", line).start() for line in lines}
    assert len(starts) == 1, lines
    # then what the loss was measured on, its text in the same column
    assert where.startswith("measured on") and where.index("the val split") == starts.pop()


def test_evaluate_scores_another_text_whole_and_the_runs_own_by_its_val_split(run, capsys):
    """evaluate --data: a test file is scored as a whole, the windows drawn from all of it (the
    trainer's function on a task whose val split is the whole text); the run's own corpus,
    however named (a copy of it), by its val split, the figure training printed."""
    from minitransformer import load_checkpoint
    from minitransformer.training.evaluation import estimate_loss
    from minitransformer.training.lm_task import LanguageModelTask

    root = run / "scored"
    root.mkdir()
    (root / "own.txt").write_bytes((run / "own.txt").read_bytes())
    assert main(["train", "--data", str(root / "own.txt"), "--out", str(root / "r"),
                 *DEBUG]) == 0
    run = root
    model, tokenizer = load_checkpoint(run / "r")
    other = run / "other.txt"
    text = "".join(f"Line {i}: the lazy dog sat.\n" for i in range(40))
    other.write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", str(run / "r"), "--data", str(other), "--eval_iters", "3"]) == 0
    first, *_, where = capsys.readouterr().out.splitlines()
    ids = torch.tensor(tokenizer.encode(text))
    assert where.startswith(f"measured on     all of other.txt ({len(ids):,} tokens), 3 x ")
    task = LanguageModelTask(ids[:10], ids, model.config.block_size)
    want = estimate_loss(model, task, "val", 16, 3, torch.device("cpu"), torch.float32)
    assert float(first.split()[2]) == pytest.approx(want, abs=1e-4)

    assert main(["evaluate", str(run / "r")]) == 0
    own = capsys.readouterr().out
    (run / "copy.txt").write_bytes((run / "own.txt").read_bytes())
    assert main(["evaluate", str(run / "r"), "--data", str(run / "copy.txt")]) == 0
    copy = capsys.readouterr().out
    assert copy.splitlines()[:3] == own.splitlines()[:3]
    assert "the val split of copy.txt" in copy and "the val split of own.txt" in own


@pytest.mark.parametrize("newline, has_cr", [(None, False), ("keep", True)])
def test_crlf_text_trains_without_carriage_returns_unless_asked(run, tiny_text, newline,
                                                               has_cr, capsys):
    data = run / f"crlf-{newline}.txt"
    data.write_bytes(tiny_text.replace("\n", "\r\n").encode("utf-8"))
    out = run / f"crlf-{newline}"
    extra = ["--newline", newline] if newline else []
    argv = ["train", "--data", str(data), "--out", str(out), *DEBUG, *extra]
    assert main([a for a in argv if a != "--quiet"]) == 0
    chars = load_tokenizer(out / "tokenizer.json").chars
    assert ("\r" in chars) is has_cr
    said = "CRLF line ends read as" in capsys.readouterr().out
    assert said is not has_cr


def test_the_readme_python_snippet_runs_verbatim_after_a_demo_run(tmp_path):
    """The snippet loads runs/demo, the folder `make demo` writes (a debug run here)."""
    text = README.read_text(encoding="utf-8")
    snippet = re.search(r"From Python:\n\n```python\n(.*?)```", text, re.S).group(1)
    assert 'load_checkpoint("runs/demo")' in snippet
    assert main(["train", "--data", "shakespeare", "--out", str(tmp_path / "runs" / "demo"),
                 *DEBUG]) == 0
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ROMEO:")


def test_attention_says_which_map_it_drew(run, capsys):
    out = run / "one.png"
    assert main(["attention", str(run / "r"), "--text", "the cat", "--out", str(out),
                 "--layer", "1", "--head", "0"]) == 0
    said = capsys.readouterr().out
    assert "layer 1 and head 0 of self-attention: 2 layers x 2 heads" in said and out.is_file()


def test_presets_lists_every_family_and_shows_one_in_full(capsys):
    assert main(["presets"]) == 0
    listing = capsys.readouterr().out
    for family in ("gpt", "encoder", "seq2seq"):
        assert f"\n{family} (" in "\n" + listing
    assert main(["presets", "gpt", "cpu-small"]) == 0
    full = capsys.readouterr().out
    assert "--n_layer            3" in full and "(config default 6)" in full
    assert main(["presets", "gpt", "tiny"]) == 2
    assert "cpu-small" in capsys.readouterr().err
    # a preset name alone: that preset of each family having one
    assert main(["presets", "debug"]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if " preset " in line]
    assert [h.split()[0] for h in heads] == ["gpt", "encoder", "seq2seq"]
    assert main(["presets", "gpt2-124m"]) == 0
    assert capsys.readouterr().out.startswith("gpt preset gpt2-124m")
    assert main(["presets", "tiny"]) == 2
    assert "'tiny' is neither a family (gpt, encoder, seq2seq) nor a preset" in \
        capsys.readouterr().err


def test_the_readme_cli_at_a_glance_lists_every_command():
    from minitransformer.cli import COMMANDS

    text = README.read_text(encoding="utf-8")
    glance = text[text.index("## The CLI at a glance"):]
    glance = glance[:glance.index("```", glance.index("```bash") + 7)]
    listed = set(re.findall(r"^minitransformer (\w+)", glance, re.M))
    assert listed == set(COMMANDS)
