"""Training: it learns, weight decay reaches matrices only, checkpoints load, resume is exact."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from minitransformer import cli, load_checkpoint
from minitransformer.config import GPTConfig
from minitransformer.experiments import runs
from minitransformer.models import GPT
from minitransformer.training import checkpoint as ckpt
from minitransformer.training.optim import param_groups


def _train(out, *flags: str) -> None:
    assert cli.main(["train", "--preset", "debug", "--out", str(out), "--quiet", *flags]) == 0


def _log(run) -> list[dict]:
    with open(run / "log.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_debug_preset_learns_shakespeare(tmp_path, capsys):
    """200 steps of the debug preset take the val loss from ~ln(65) = 4.17 below 2.6 nats."""
    _train(tmp_path / "run", "--data", "shakespeare", "--max_iters", "200",
           "--sample_tokens", "0")
    val = [(int(r["step"]), float(r["val_loss"])) for r in _log(tmp_path / "run") if r["val_loss"]]
    assert val[0][0] == 0 and val[0][1] > 3.9  # untrained: close to uniform over 65 chars
    assert val[-1][0] == 200 and val[-1][1] < 2.6
    meta = json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    assert meta["best_val_loss"] == pytest.approx(min(v for s, v in val if s > 0), abs=1e-4)
    assert "done: 200 steps" in capsys.readouterr().out


# ---- weight decay -----------------------------------------------------------------------

@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_weight_decay_reaches_matrices_only(pos):
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8,
                          pos_encoding=pos))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}  # tied weight listed once
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    per_layer = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.out_proj.weight", "ffn.fc.weight", "ffn.proj.weight"]
    expected = {"tok_emb.weight"} | {f"decoder.layers.{i}.{n}" for i in range(2)
                                     for n in per_layer}
    assert decayed == expected  # lm_head.weight is tok_emb.weight: once, in the decayed group
    assert not_decayed == set(names.values()) - expected
    assert all(n.endswith(".bias") or "norm" in n or n == "pos_emb.weight"
               for n in not_decayed)
    if pos == "learned":
        assert "pos_emb.weight" in not_decayed
    count = len(decay["params"]) + len(no_decay["params"])
    assert count == len(list(model.parameters()))
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == model.num_params()


# ---- checkpoints and resume -------------------------------------------------------------

@pytest.fixture(scope="module")
def run40(tmp_path_factory):
    """A 40-step debug run (eval every 20) and the model object the trainer held."""
    out = tmp_path_factory.mktemp("run40")
    held = {}
    real_train = runs.train

    def spy(model, *args, **kwargs):
        held["model"] = model
        return real_train(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "train", spy)
        _train(out, "--max_iters", "40", "--eval_interval", "20")
    return out, held["model"]


def test_checkpoint_round_trip_gives_identical_logits(run40):
    out, model = run40
    model.eval()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    with torch.no_grad():
        expected, _ = model(idx)
    loaded, tokenizer = load_checkpoint(out, which="last")
    assert loaded.config == model.config
    assert tokenizer.vocab_size == model.config.vocab_size
    with torch.no_grad():
        got, _ = loaded(idx)
    assert torch.equal(got, expected)
    assert loaded.lm_head.weight is loaded.tok_emb.weight  # tying survives the round trip
    # The run folder's top level holds the best model; checkpoints/ the last ones.
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_0000020", "step_0000040"]
    best, _ = load_checkpoint(out)
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    src = out / "checkpoints" / f"step_{meta['step']:07d}" / "model.safetensors"
    for name, tensor in load_file(src).items():
        assert torch.equal(best.state_dict()[name], tensor)


def test_resumed_run_follows_the_uninterrupted_one(run40, tmp_path):
    full, _ = run40
    part = tmp_path / "part"
    _train(part, "--max_iters", "20", "--eval_interval", "20")
    assert [p.name for p in ckpt.list_checkpoints(part)] == ["step_0000020"]
    assert cli.main(["train", "--out", str(part), "--resume", "--max_iters", "40",
                     "--quiet"]) == 0

    def curve(run):
        return [(r["step"], r["train_loss"], r["val_loss"], r["lr"], r["grad_norm"])
                for r in _log(run)]

    assert curve(part) == curve(full)
    assert any(r["train_loss"] for r in _log(part) if int(r["step"]) > 20)
    a = load_file(full / "checkpoints" / "step_0000040" / "model.safetensors")
    b = load_file(part / "checkpoints" / "step_0000040" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa = load_file(full / "checkpoints" / "step_0000040" / "trainer_state.safetensors")
    sb = load_file(part / "checkpoints" / "step_0000040" / "trainer_state.safetensors")
    for name in sa:
        if name.startswith("optim."):
            assert torch.equal(sa[name], sb[name]), name


def test_resume_restores_the_dropout_random_stream(tmp_path):
    """With dropout the global torch generator matters too: it must resume where it was."""
    flags = ("--dropout", "0.1", "--sample_tokens", "0", "--eval_interval", "20")
    _train(tmp_path / "full", "--max_iters", "40", *flags)
    _train(tmp_path / "part", "--max_iters", "20", *flags)
    assert cli.main(["train", "--out", str(tmp_path / "part"), "--resume", "--max_iters", "40",
                     "--quiet"]) == 0
    losses = [[r["train_loss"] for r in _log(tmp_path / run)] for run in ("full", "part")]
    assert losses[0] == losses[1]
    a, b = (load_file(tmp_path / run / "checkpoints" / "step_0000040" / "model.safetensors")
            for run in ("full", "part"))
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_preset_width_kept_under_a_new_n_embd_is_noted():
    # seq2seq cpu-small fixes d_ff 512 (4 x its 128); --n_embd 256 keeps it: 2 x the width.
    from minitransformer.presets import SEQ2SEQ

    notes = []
    runs._note_kept_width("cpu-small", SEQ2SEQ["cpu-small"], {"n_embd": 256}, notes.append)
    assert notes == ["note: preset cpu-small keeps its d_ff 512 under --n_embd 256 (2 x n_embd, "
                     "where 4 x is the default); pass --d_ff 1024 for that"]
    runs._note_kept_width("cpu-small", SEQ2SEQ["cpu-small"], {"n_embd": 96}, notes.append)
    assert "(5.33 x n_embd" in notes.pop()
    for given in ({"n_embd": 256, "d_ff": 1024}, {"n_embd": 128}, {"n_layer": 2}):
        runs._note_kept_width("cpu-small", SEQ2SEQ["cpu-small"], given, notes.append)
    runs._note_kept_width("gpt cpu-small", {"n_embd": 128}, {"n_embd": 256}, notes.append)
    assert len(notes) == 1


def test_a_sample_with_control_bytes_prints_them_as_escapes(tmp_path, capsys, monkeypatch):
    # an untrained byte-level model can sample ESC or a carriage return: shown, not obeyed
    from minitransformer.training import lm_task, task

    assert task.terminal_text("a\x1b[2Jb\tc\nd\r\x7f\x85é中") == \
        "a\\x1b[2Jb\tc\nd\\x0d\\x7f\\x85é中"
    # a right-to-left override would show the rest of the line backwards; U+2028 breaks it
    assert task.terminal_text("ab\u202ecd\u2028e\u2066f") == "ab\\u202ecd\\u2028e\\u2066f"
    assert task.terminal_text("abc\x1bdef", limit=4) == "abc\\x1b"  # cut, then escaped
    monkeypatch.setattr(lm_task.LanguageModelTask, "sample",
                        lambda self, *a, **k: "ab\x1b[2Jc\rd")
    _train(tmp_path / "run", "--data", "shakespeare", "--max_iters", "1", "--sample_tokens", "4")
    out = capsys.readouterr().out
    assert "sample: ab\\x1b[2Jc\\x0dd" in out and "\x1b" not in out and "\r" not in out


def test_a_resume_on_text_prepared_otherwise_says_it_is_not_exact(tmp_path, capsys):
    """The run records its split's sizes; where its text, prepared again (its cache removed,
    another version), holds other tokens, resume says it will not continue exactly."""
    import json

    from minitransformer.cli import main

    data = tmp_path / "t.txt"
    data.write_text("to be or not to be, that is the question.\n" * 120, encoding="utf-8")
    run = tmp_path / "run"
    args = ["--preset", "debug", "--eval_iters", "1", "--sample_tokens", "0", "--quiet",
            "--time_budget", "none"]
    assert main(["train", "--data", str(data), "--out", str(run), "--max_iters", "2",
                 *args]) == 0
    config = json.loads((run / "config.json").read_text())
    train_n, val_n = config["data"]["split"]
    assert train_n + val_n == len("to be or not to be, that is the question.\n" * 120)
    assert main(["train", "--out", str(run), "--resume", "--max_iters", "3", *args]) == 0
    assert "prepared again" not in capsys.readouterr().err  # the same text, the same split
    config["data"]["split"] = [train_n - 5, val_n + 5]  # as an older version would have split
    (run / "config.json").write_text(json.dumps(config))
    for folder in (run / "checkpoints").iterdir():
        (folder / "config.json").write_text(json.dumps(config))
    assert main(["train", "--out", str(run), "--resume", "--max_iters", "4", *args]) == 0
    assert "prepared again, holds" in capsys.readouterr().err
    for damaged in ([], ["4536", "504"]):  # not two counts: not compared, no internal error
        config["data"]["split"] = damaged
        (run / "config.json").write_text(json.dumps(config))
        assert main(["evaluate", str(run), "--which", "last"]) == 0
        assert "prepared again" not in capsys.readouterr().err
    config["data"]["split"] = [train_n - 5, val_n + 5]
    (run / "config.json").write_text(json.dumps(config))
    with data.open("a", encoding="utf-8") as f:  # another text under the run's name: read as
        f.write("not to be, or to be the question.\n" * 20)  # it is now, not "prepared again"
    assert main(["evaluate", str(run), "--which", "last", "--data", str(data)]) == 0
    err = capsys.readouterr().err
    assert "prepared again" not in err and f"note: {data} changed since the run read it" in err
    data.rename(tmp_path / "elsewhere.txt")  # gone: its error alone, no note before it
    assert main(["evaluate", str(run), "--which", "last", "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "changed since" not in err, err
