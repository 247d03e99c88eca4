"""Property tests: tokenizer round trips, and random flag values never crash the CLI."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minitransformer.cli import main
from minitransformer.tokenizers import CharTokenizer, tokenizer_from_dict


@given(st.text(min_size=1))
def test_char_tokenizer_round_trips_any_unicode_it_was_fitted_on(text):
    tok = CharTokenizer.fit(text)
    assert tok.decode(tok.encode(text)) == text
    again = tokenizer_from_dict(tok.to_dict())
    assert again.encode(text) == tok.encode(text)


@given(st.text(min_size=2), st.data())
def test_any_substring_of_the_fitted_text_round_trips(text, data):
    tok = CharTokenizer.fit(text)
    i = data.draw(st.integers(0, len(text) - 1))
    j = data.draw(st.integers(i, len(text)))
    assert tok.decode(tok.encode(text[i:j])) == text[i:j]


TINY = ["--preset", "debug", "--n_layer", "1", "--n_embd", "16", "--n_head", "2",
        "--block_size", "8", "--batch_size", "4", "--max_iters", "2", "--eval_interval", "2",
        "--eval_iters", "1", "--sample_tokens", "0", "--quiet"]
TRAIN_FLAGS = ["--n_layer", "--n_head", "--n_embd", "--block_size", "--dropout", "--d_ff",
               "--batch_size", "--max_iters", "--eval_interval", "--eval_iters",
               "--learning_rate", "--min_lr", "--warmup_iters", "--weight_decay", "--beta1",
               "--beta2", "--grad_clip", "--grad_accum", "--seed", "--time_budget",
               "--pos_encoding", "--norm_position", "--activation", "--attn_impl", "--init",
               "--bias", "--tie_weights", "--dtype", "--keep_last", "--log_interval",
               "--layer_norm_eps", "--preset", "--encoding"]
VALUES = st.one_of(st.integers(-3, 40).map(str), st.floats(-2, 2).map(str),
                   st.sampled_from(["", "nan", "inf", "-0", "1e9", "true", "rope", "post",
                                    "gelu", "fast", "bfloat16", "utf-16", "abc", "10s"]),
                   st.text(max_size=4))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "text.txt"
    path.write_text("to be or not to be, that is the question. " * 40, encoding="utf-8")
    return path


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(TRAIN_FLAGS), value=VALUES)
def test_random_train_flag_values_exit_0_or_2(corpus, capsys, flag, value):
    out = Path(tempfile.mkdtemp()) / "run"
    code = main(["train", "--data", str(corpus), "--out", str(out), *TINY, flag, value])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def run_dir(corpus):
    out = Path(tempfile.mkdtemp()) / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), *TINY]) == 0
    return out


SAMPLE_FLAGS = ["--temperature", "--top-k", "--top-p", "--seed", "--max-new-tokens",
                "--prompt", "--which", "--device"]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(SAMPLE_FLAGS), value=VALUES)
def test_random_sample_flag_values_exit_0_or_2(run_dir, capsys, flag, value):
    code = main(["sample", str(run_dir), "--max-new-tokens", "5", flag, value])
    err = capsys.readouterr().err
    assert code in (0, 2), err
    assert "Traceback" not in err
