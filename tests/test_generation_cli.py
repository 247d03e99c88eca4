"""``sample`` with several samples and past the context window, from the command line."""

from __future__ import annotations

import pytest

from minitransformer import cli

PROMPT = "the "
SEPARATOR = "---------------\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_text):
    """The debug preset (block_size 32) trained for 10 steps on a few KB of text."""
    root = tmp_path_factory.mktemp("gen")
    corpus = root / "tiny.txt"
    corpus.write_text(tiny_text, encoding="utf-8")
    assert cli.main(["train", "--data", str(corpus), "--out", str(root / "run"), "--preset",
                     "debug", "--max_iters", "10", "--eval_interval", "10", "--quiet"]) == 0
    return root / "run"


def _sample(capsys, run, *flags) -> tuple[int, str, str]:
    code = cli.main(["sample", str(run), "--prompt", PROMPT, *map(str, flags)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_num_samples_writes_each_sample_as_its_seed_would_alone(run, capsys):
    code, out, _ = _sample(capsys, run, "--num-samples", 3, "--seed", 4,
                           "--max-new-tokens", 60)  # past block_size 32
    assert code == 0
    samples = out.split(SEPARATOR)
    assert samples[-1] == "" and len(samples) == 4
    for i, text in enumerate(samples[:3]):
        assert text.startswith(PROMPT) and len(text) == len(PROMPT) + 60 + 1
        code, alone, _ = _sample(capsys, run, "--seed", 4 + i, "--max-new-tokens", 60)
        assert code == 0 and alone == text, i
    assert len(set(samples[:3])) == 3


def test_top_k_zero_is_off_in_both_spellings(run, capsys):
    outs = [_sample(capsys, run, *flags, "--seed", 2, "--max-new-tokens", 30)[1]
            for flags in ([], ["--top-k", 0], ["--top_k", 0])]
    assert outs[0] == outs[1] == outs[2]
    assert _sample(capsys, run, "--top-k", 1, "--seed", 2, "--max-new-tokens", 30)[1] != outs[0]


def test_context_flags_in_both_spellings(run, capsys):
    outs = [_sample(capsys, run, flag, 0, "--temperature", 0, "--max-new-tokens", 50)[1]
            for flag in ("--context-shift", "--context_shift")]
    assert outs[0] == outs[1]
    no_cache = _sample(capsys, run, "--context-shift", 0, "--temperature", 0,
                       "--max-new-tokens", 50, "--no-cache")[1]
    assert no_cache == outs[0]


@pytest.mark.parametrize("flags, words", [
    (["--context-mode", "roll", "--no-cache"], ["--context_mode roll", "--no_cache"]),
    (["--seed", 2 ** 64], ["--seed", "2**63"]),
    (["--context-shift", 32], ["--context_shift", "block_size (32)"]),
    (["--context-shift", 99], ["--context_shift", "32"]),
    (["--context-shift", -1], ["--context", "negative"]),
    (["--num-samples", 0], ["--num", "positive"]),
    (["--num-samples", 3, "--seed", 2 ** 63 - 2], ["seed + i", str(2 ** 63 - 3)]),
    (["--context-mode", "roll"], ["--context_mode roll", "learned"]),
    (["--context-mode", "slide"], ["--context", "slide"]),
    (["--context-keep", 32], ["--context_keep", "block_size (32)"]),
    (["--context-keep", 25], ["--context_keep 25", "default context shift (8"]),
    (["--context-keep", 4, "--context-shift", 28], ["--context_shift", "less the 4 kept", "28"]),
    (["--context-keep", -1], ["--context", "negative"]),
])
def test_bad_window_and_batch_values_exit_2_with_one_line(run, capsys, flags, words):
    code, out, err = _sample(capsys, run, *flags)
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    if not flags[0].startswith(("--num", "--seed")) and flags[1] not in (-1, "slide") \
            or flags[0] == "--num-samples" and len(flags) == 4:  # ours
        assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
