"""One flag style for every command: help with defaults, both spellings, the same booleans,
and argparse errors as one line with a pointer to --help."""

from __future__ import annotations

import argparse

import pytest

from minitransformer.cli import COMMANDS, build_parser, main
from minitransformer.cli.flags import (
    duration,
    length_penalty,
    nonneg_int,
    on_off,
    parse_bool,
    port_number,
    positive_int,
    seed,
)
from minitransformer.families import FAMILIES

# what each command needs before an optional flag can be tried on it
REQUIRED = {"train": ["--out", "o"], "compare": ["--out", "o", "--vary", "n_layer=1,2"],
            "embed": ["s", "--hf", "h"], "export": ["d", "--hf", "h"],
            "attention": ["d", "--text", "t", "--out", "o.png"], "evaluate": ["d"],
            "sample": ["d"], "translate": ["d"], "fill": ["d", "t"], "explain": ["--out", "o.html"],
            "presets": [], "toy": [], "prepare": ["--data", "d", "--out", "o"],
            "serve": ["d"]}
PARSER = build_parser()
SUBS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(command: str):
    return [a for a in SUBS[command]._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _value(action) -> str | None:
    """A valid value for an option taking one."""
    if action.nargs == 0:
        return None
    if action.choices:
        return str(list(action.choices)[-1])
    kind = action.type
    return {int: "3", positive_int: "3", nonneg_int: "3", float: "0.5", parse_bool: "true",
            duration: "10s", seed: "3", length_penalty: "0.5", port_number: "3",
            on_off: "on"}.get(kind, "x")


CASES = [(c, a.option_strings[0]) for c in COMMANDS for a in _options(c)]


def test_every_command_is_in_the_table_and_required_args_are_known():
    assert set(REQUIRED) == set(COMMANDS) == set(SUBS)


@pytest.mark.parametrize("command, flag", CASES)
def test_help_exists_and_shows_the_default(command, flag):
    action = SUBS[command]._option_string_actions[flag]
    assert action.help and len(action.help) > 8, (command, flag)
    if action.default not in (None, False, argparse.SUPPRESS):
        assert "default" in action.help, (command, flag, action.help)
    assert len(action.option_strings) == 1, "help lists one spelling"
    assert "-" not in flag[2:], "the canonical spelling is the field name, with _"


@pytest.mark.parametrize("command, flag", CASES)
def test_both_spellings_parse_to_the_same_value(command, flag):
    action = SUBS[command]._option_string_actions[flag]
    value = _value(action)
    tail = [] if value is None else [value]
    one = PARSER.parse_args([command, *REQUIRED[command], flag, *tail])
    other = PARSER.parse_args([command, *REQUIRED[command], flag.replace("_", "-"), *tail])
    assert getattr(one, action.dest) == getattr(other, action.dest)
    if value is not None:
        eq = PARSER.parse_args([command, *REQUIRED[command], f"{flag.replace('_', '-')}={value}"])
        assert getattr(eq, action.dest) == getattr(one, action.dest)


@pytest.mark.parametrize("spelling, expected", [
    ("true", True), ("True", True), ("on", True), ("yes", True), ("1", True),
    ("false", False), ("False", False), ("off", False), ("no", False), ("0", False)])
def test_booleans_read_the_same_spellings_everywhere(spelling, expected):
    args = PARSER.parse_args(["train", "--out", "o", "--bias", spelling, "--compile", spelling,
                              "--tie_weights", spelling])
    assert args.bias is expected and args.tie_weights is expected
    assert args.compile == ("on" if expected else "off")
    assert PARSER.parse_args(["train", "--out", "o", "--compile", "auto"]).compile == "auto"


def test_aliases_people_bring_from_other_tools():
    args = PARSER.parse_args(["train", "--out", "o", "--lr", "0.01"])
    assert args.learning_rate == 0.01


@pytest.mark.parametrize("argv, words", [
    (["tran"], ["invalid choice"]),
    ([], ["required"]),
    (["train"], ["--out"]),
    (["train", "--out", "o", "--n_layr", "3"], ["--n_layer"]),
    (["train", "--out", "o", "--n_layer", "three"], ["--n_layer"]),
    (["train", "--out", "o", "--bias", "maybe"], ["true or false"]),
    (["train", "--out", "o", "--pos_encoding", "spiral"], ["invalid choice"]),
    (["sample", "d", "--max_new_tokens", "0"], ["must be positive"]),
    (["train", "--out", "o", "--set", "n_embd=256", "n_head=4"],  # another tool's spelling
     ["did you mean: --n_embd 256, --n_head 4?"]),
    (["train", "--out", "o", "--time_budget", "-5s"], ["the duration '-5s' must not be negative"]),
    (["train", "--out", "o", "--compile", "maybe"], ["expected auto, on or off, got 'maybe'"]),
    (["train", "--out", "o", "--context-mode", "roll"],  # another command's flag
     ["--context-mode is a flag of sample, not of train"]),
    (["sample", "d", "--lr", "3"],  # another command's flag by its alias
     ["--lr is a flag of train and compare, not of sample"]),
    (["sample", "d", "--debug"], ["--debug goes before the command"]),
    (["sample", "d", "--beam", "4", "--top=3", "--bogus", "1"],
     ["--beam is a flag of translate and evaluate, not of sample; --top is a flag of fill",
      "; unrecognized: --bogus"]),
])
def test_argparse_errors_are_one_line_with_a_pointer_to_help(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert "--help" in err and "error:" in err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_help_shows_the_default_presets_values(command):
    # train and compare use cpu-small when no preset is named, so their help shows its
    # values (block_size 64, n_layer 3, relu, batch 32), not the bare dataclass defaults
    preset = FAMILIES["gpt"].preset(None)
    assert preset == FAMILIES["gpt"].preset("cpu-small")
    assert preset["block_size"] == 64 and preset["activation"] == "relu"  # != the defaults
    flags = SUBS[command]._option_string_actions
    for name, value in preset.items():
        action = flags.get(f"--{name}")
        if action is None or "(default" not in action.help:
            continue
        assert action.help.endswith(f"(default {value})"), (command, name, action.help)


def test_time_budget_none_lets_max_iters_decide():
    args = PARSER.parse_args(["train", "--out", "o", "--time_budget", "none"])
    assert args.time_budget is None
    assert PARSER.parse_args(["train", "--out", "o", "--time_budget", "2m"]).time_budget == 120


@pytest.mark.parametrize("argv", [["translate", "runs/mt", "--beam", "1", "Jesus wept."],
                                  ["translate", "runs/mt", "Jesus", "--beam", "1", "wept."],
                                  ["translate", "--beam", "1", "runs/mt", "Jesus", "wept."]])
def test_words_after_flags_are_the_sentences(argv):
    # argparse fills a folder and a list of words together, so words after a flag were left
    # over ("unrecognized arguments"); they are the sentences, in order.
    args = build_parser().parse_args(argv)
    assert args.dir == "runs/mt" and args.beam == 1
    assert " ".join(args.text) == "Jesus wept."


def test_a_stray_flag_after_the_words_is_still_an_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["translate", "runs/mt", "--beam", "1", "text", "--nope"])
    assert "unrecognized arguments: text --nope" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["sample", "run", "--prompt", "ab\udce6\udc98"],
                                  ["translate", "run", "ok", "b\udce6"],
                                  ["attention", "run", "--text", "\udce6", "--out", "a.png"]])
def test_text_the_terminal_could_not_decode_is_named_so(argv, capsys):
    """Undecodable argument bytes reach Python as lone surrogates: a one-line error about the
    terminal's encoding, not unseen characters '\\udce6' after the model has loaded."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not valid text in this terminal's encoding" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("word, hint", [("--temperatur", "--temperature"), ("--foo", None),
                                        ("--lr", None)])
def test_a_hint_names_another_flag_only_when_one_is_close(word, hint, capsys):
    assert main(["sample", "d", word, "3"]) == 2
    err = capsys.readouterr().err
    if hint is None:  # --foo is not --hf; --lr is train's, not a misspelt --lr
        assert "did you mean" not in err, err
    else:
        assert f"{word} -> {hint}" in err, err
