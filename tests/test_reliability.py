"""Crash safety: exact resume after SIGKILL, atomic saves, Ctrl-C, NaN, internal errors."""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minitransformer import load_checkpoint
from minitransformer.cli import main
from minitransformer.training import checkpoint as ckpt

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TINY = ["--preset", "debug", "--n_layer", "1", "--n_embd", "32", "--n_head", "2",
        "--block_size", "16", "--batch_size", "8", "--eval_iters", "2", "--log_interval", "1",
        "--sample_tokens", "0", "--quiet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    source = Path(__file__).resolve().parents[1] / "minitransformer/corpora/shakespeare.txt"
    path.write_text(source.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


def train_cmd(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "minitransformer", "train", "--data", str(corpus),
            "--out", str(out), *TINY, *extra]


def logged_step(out: Path) -> int:
    try:
        with open(out / "log.csv", newline="") as f:
            steps = [int(r["step"]) for r in csv.DictReader(f)]
        return max(steps, default=0)
    except (OSError, ValueError, KeyError):
        return 0


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.list_checkpoints(out)[-1] / ckpt.MODEL_FILE)


def test_sigkill_at_random_steps_then_resume_is_bit_identical(corpus, tmp_path):
    args = ["--max_iters", "40", "--eval_interval", "4"]
    ref = tmp_path / "ref"
    subprocess.run(train_cmd(corpus, ref, *args), env=ENV, check=True, capture_output=True)

    out = tmp_path / "killed"
    rng = random.Random(7)
    kills = sorted(rng.sample(range(6, 36), 3))
    first = True
    for kill_at in kills:
        cmd = train_cmd(corpus, out, *args, *([] if first else ["--resume"]))
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while logged_step(out) < kill_at and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, "training ended before it could be killed"
        first = False
    subprocess.run(train_cmd(corpus, out, *args, "--resume"), env=ENV, check=True,
                   capture_output=True)
    a, b = final_weights(ref), final_weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after kills at steps {kills}"


KILL_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys
    from minitransformer.training import checkpoint as ck
    real_save = ck.save_file
    calls = [0]
    def dying_save(tensors, path, *a, **k):
        calls[0] += 1
        if calls[0] == int(os.environ["DIE_AT_SAVE"]):
            with open(path, "wb") as f:
                f.write(b"half a file")
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(tensors, path, *a, **k)
    ck.save_file = dying_save
    from minitransformer.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("die_at", [4, 5])  # 4: the best model at the top; 5: checkpoints/
def test_killed_during_a_save_the_previous_checkpoint_still_loads(corpus, tmp_path, die_at):
    out = tmp_path / "run"
    cmd = [sys.executable, "-c", KILL_DURING_SAVE, *train_cmd(corpus, out)[3:],
           "--max_iters", "20", "--eval_interval", "5"]
    proc = subprocess.run(cmd, env={**ENV, "DIE_AT_SAVE": str(die_at)}, capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    model, tok = load_checkpoint(out)  # the best model written at step 5
    assert model(torch.zeros(1, 4, dtype=torch.long))[0].isfinite().all()
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_0000005"]
    load_checkpoint(out, which="last")
    resumed = subprocess.run(train_cmd(corpus, out, "--max_iters", "10", "--eval_interval", "5",
                                       "--resume"), env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_0000005", "step_0000010"]


def test_ctrl_c_saves_and_says_how_to_resume(corpus, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd(corpus, out, "--max_iters", "100000",
                                      "--eval_interval", "1000"),
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while logged_step(out) < 5 and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stdout and "Traceback" not in stderr
    saved = ckpt.list_checkpoints(out)
    assert saved and int(saved[-1].name.split("_")[1]) >= 5
    load_checkpoint(out, which="last")
    step = int(saved[-1].name.split("_")[1])  # a step never evaluated: not "val loss nan"
    resumed = subprocess.run(train_cmd(corpus, out, "--max_iters", str(step + 1),
                                       "--eval_interval", "1000", "--resume"),
                             env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"from step {step} (not evaluated at that step" in resumed.stdout
    assert "nan" not in resumed.stdout


class InfAfter:
    """Wraps a task so that its loss becomes inf from a given step on."""

    def __init__(self, task, bad_step):
        self.task, self.bad_step, self.calls = task, bad_step, 0
        self.block_size = task.block_size

    def batch(self, split, batch_size, gen):
        return self.task.batch(split, batch_size, gen)

    def loss(self, model, batch):
        loss = self.task.loss(model, batch)
        if model.training:
            self.calls += 1
            if self.calls > self.bad_step:
                return loss * float("inf")
        return loss

    def tokens(self, batch):
        return self.task.tokens(batch)

    def sample(self, *a):
        return ""


def test_inf_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    from minitransformer import GPT, GPTConfig, TrainConfig
    from minitransformer.tokenizers import CharTokenizer
    from minitransformer.training.trainer import LanguageModelTask, TrainingDiverged, train

    tok = CharTokenizer.fit("abcdefgh ")
    ids = torch.tensor(tok.encode("abc defgh " * 300))
    task = InfAfter(LanguageModelTask(ids[:2500], ids[2500:], 8), bad_step=12)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2,
                          n_embd=16))
    cfg = TrainConfig(batch_size=4, max_iters=50, eval_interval=10, eval_iters=2,
                      log_interval=5, sample_tokens=0)
    meta = {"family": "gpt", "model": vars(model.config)}
    with pytest.raises(TrainingDiverged, match="at step 15.* checkpoint, step_0000010, is kept"):
        train(model, tok, task, cfg, tmp_path, meta, progress=False, echo=lambda *a: None)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_0000010"]
    good, _ = load_checkpoint(tmp_path)
    assert all(p.isfinite().all() for p in good.parameters())
    early = InfAfter(LanguageModelTask(ids[:2500], ids[2500:], 8), bad_step=2)
    with pytest.raises(TrainingDiverged, match="at step 5.*No checkpoint had been saved yet"):
        train(model, tok, early, cfg, tmp_path / "early", meta, progress=False,
              echo=lambda *a: None)


def test_internal_error_is_one_line_and_exit_1_traceback_only_with_debug(monkeypatch, capsys,
                                                                         tmp_path):
    from minitransformer.cli import evaluate

    def broken(args):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(evaluate, "cmd_evaluate", broken)
    argv = ["evaluate", str(tmp_path)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" not in err
    assert "rerun as minitransformer --debug evaluate ..." in err  # where the flag goes
    with pytest.raises(RuntimeError):
        main(["--debug", *argv])


def test_malicious_pickle_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    import pickle

    run = tmp_path / "run"
    run.mkdir()
    (run / "model.safetensors").write_bytes(pickle.dumps(Evil()))
    (run / "config.json").write_text('{"family": "gpt", "model": {"vocab_size": 5, '
                                     '"block_size": 4, "n_layer": 1, "n_head": 1, '
                                     '"n_embd": 4}}')
    (run / "tokenizer.json").write_text('{"type": "char", "chars": ["a","b","c","d","e"]}')
    assert main(["sample", str(run), "--prompt", "ab", "--max-new-tokens", "2"]) == 2
    assert not marker.exists()
    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    assert not marker.exists()  # saving does not run it; loading must refuse it
    with pytest.raises(Exception):  # noqa: B017 - any refusal will do
        torch.load(tmp_path / "evil.pt", weights_only=True)
    assert not marker.exists()


def test_a_hugging_face_folder_with_a_malicious_pickle_fails_cleanly(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10, "n_positions":'
                                        ' 8, "n_embd": 8, "n_layer": 1, "n_head": 2}')
    torch.save({"wte.weight": Evil()}, folder / "pytorch_model.bin")
    from minitransformer.errors import UserError
    from minitransformer.interop import load_hf

    with pytest.raises(UserError):
        load_hf(folder)
    assert not marker.exists()
    assert main(["sample", "--hf", str(folder), "--prompt", "a"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert not marker.exists()


def test_a_run_folder_gets_the_usual_permissions(corpus, tmp_path):
    """Atomic writes go through temporary files and folders, which mkstemp and mkdtemp make
    private (0600, 0700); the run's files and checkpoint folders end with what the umask
    gives any other file and folder, so that others who may read the folder can read them."""
    out = tmp_path / "run"
    argv = train_cmd(corpus, out, "--max_iters", "2", "--eval_interval", "1")[3:]
    assert main(argv) == 0
    mask = os.umask(0)
    os.umask(mask)
    for path in [out, *out.rglob("*")]:
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        assert path.stat().st_mode & 0o777 == want, (path, oct(path.stat().st_mode))


def test_a_lost_process_of_a_distributed_run_is_not_called_a_bug(monkeypatch, capsys,
                                                                 tmp_path):
    """Under torchrun, another rank killed shows here as gloo's connection error: one line
    that says what happened and how to go on, exit 1, not "this is a bug"."""
    from minitransformer.cli import evaluate

    def lost(args):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:5001: "
                           "Connection reset by peer\nmore detail")

    monkeypatch.setattr(evaluate, "cmd_evaluate", lost)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["evaluate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "another process of this distributed run stopped" in err and "bug" not in err
    assert err.count("\n") == 1 and "train --out RUN --resume" in err
    monkeypatch.delenv("WORLD_SIZE")  # one process: the same error is a bug
    assert main(["evaluate", str(tmp_path)]) == 1
    assert "this is a bug" in capsys.readouterr().err
