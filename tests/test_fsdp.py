"""--shard (FSDP2): 2 CPU processes (gloo) holding half of every parameter each train as DDP.

The same 20 steps of a tiny GPT run in one process with the global batch (which equals DDP:
tests/test_distributed.py) and under --shard in two halves (10 steps, then --resume with
--grad_accum 2, which must not change the numbers), so one sharded run also checks the resume
and the accumulation without a gradient sync: losses, weights and optimizer state must equal
the reference's, and the checkpoint loads in one process. Launches are slow (each process
imports torch): two, of two processes each.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minitransformer import load_checkpoint
from minitransformer.cli import build_parser, main
from minitransformer.config import TrainConfig
from minitransformer.errors import UserError
from minitransformer.training import checkpoint as ckpt
from minitransformer.training import distributed

STEPS = 20
COMMON = ["--preset", "debug", "--max_iters", str(STEPS), "--eval_interval", "10",
          "--eval_iters", "2", "--log_interval", "1", "--dropout", "0", "--batch_size", "8",
          "--quiet", "--sample_tokens", "8", "--n_layer", "2", "--n_embd", "32",
          "--block_size", "16", "--dtype", "float32"]  # fp32: the two runs agree to 1e-5
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "minitransformer", "train", *COMMON, "--out", str(out), *extra]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def train_losses(out: Path) -> list[float]:
    with open(out / "log.csv", newline="") as f:
        return [float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    # the reference: one process with the same global batch, which equals DDP's run
    # (tests/test_distributed.py), without a third launch
    assert main(["train", *COMMON, "--out", str(root / "ddp")]) == 0
    torchrun(root / "shard", "--shard", "--max_iters", str(STEPS // 2))
    torchrun(root / "shard", "--shard", "--resume", "--grad_accum", "2")
    return root


def assert_close_tensors(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, sorted(set(a) ^ set(b)))
    for k in a:
        assert a[k].shape == b[k].shape and torch.allclose(a[k], b[k], atol=1e-5), (what, k)


def test_sharded_run_equals_ddp_and_writes_the_same_checkpoints(runs):
    ddp, shard = runs / "ddp", runs / "shard"
    la, lb = train_losses(ddp), train_losses(shard)
    assert len(la) == len(lb) == STEPS
    assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5), (la, lb)
    names = [p.name for p in ckpt.list_checkpoints(ddp)]
    assert [p.name for p in ckpt.list_checkpoints(shard)] == names == \
        ["step_0000010", "step_0000020"]
    for name in names:  # the weights and the optimizer state, file for file
        a, b = ddp / ckpt.CHECKPOINTS / name, shard / ckpt.CHECKPOINTS / name
        assert_close_tensors(load_file(a / ckpt.MODEL_FILE), load_file(b / ckpt.MODEL_FILE),
                             name)
        sa, sb = load_file(a / ckpt.STATE_TENSORS), load_file(b / ckpt.STATE_TENSORS)
        optim = {k for k in sa if k.startswith("optim.")}
        assert optim and optim == {k for k in sb if k.startswith("optim.")}
        assert_close_tensors({k: sa[k] for k in optim}, {k: sb[k] for k in optim}, name)
        ja, jb = (json.loads((f / ckpt.STATE_JSON).read_text()) for f in (a, b))
        assert ja["optimizer"] == jb["optimizer"] and ja["step"] == jb["step"]
    # the best model at the top of the folder too; one process loads and samples from it
    assert_close_tensors(load_file(ddp / ckpt.MODEL_FILE), load_file(shard / ckpt.MODEL_FILE),
                         "best")
    model, tok = load_checkpoint(shard)
    ref, _ = load_checkpoint(ddp)
    idx = torch.tensor([tok.encode("The")])
    assert torch.equal(model.generate(idx, 12, seed=0), ref.generate(idx, 12, seed=0))
    assert json.loads((shard / ckpt.CONFIG_FILE).read_text())["train"]["shard"] is True


def test_shard_is_a_bare_flag():
    parser = build_parser()
    assert parser.parse_args(["train", "--out", "o", "--shard"]).shard is True
    assert parser.parse_args(["train", "--out", "o", "--shard", "off"]).shard is False
    assert TrainConfig().shard is False


def test_shard_without_torchrun_is_one_clear_line(tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    code = main(["train", "--out", str(tmp_path / "run"), "--shard", "--preset", "debug",
                 "--max_iters", "1", "--quiet", "--sample_tokens", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "torchrun" in err, err
    assert not (tmp_path / "run" / ckpt.CHECKPOINTS).exists()


def test_shard_refuses_an_optimizer_that_needs_whole_matrices(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun: the optimizer is the reason
    with pytest.raises(UserError, match="muon") as e:
        distributed.check_shard(TrainConfig(shard=True, optimizer="muon"))
    assert "\n" not in str(e.value)
    distributed.check_shard(TrainConfig(shard=True, optimizer="adamw"))


@pytest.mark.parametrize("extra, env, said", [
    (["--shard"], {}, "processes started by torchrun"),
    (["--shard", "--lora_rank", "4"], {"RANK": "0", "WORLD_SIZE": "2"},
     "LoRA (--lora_rank) and --shard do not combine"),
    (["--shard", "--dtype", "float16"], {"RANK": "0", "WORLD_SIZE": "2"}, "loss scaler"),
    (["--batch_size", "3"], {"RANK": "0", "WORLD_SIZE": "2"},
     "batch_size (3) must be a multiple of processes x grad_accum (2 x 1)"),
])
def test_process_refusals_come_before_the_data_is_read(tmp_path, capsys, monkeypatch, extra,
                                                       env, said):
    """The corpus named does not exist: each refusal is said first, not after preparing."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["train", "--data", str(tmp_path / "no-such.txt"), "--out",
                 str(tmp_path / "run"), "--preset", "debug", "--quiet", *extra])
    err = capsys.readouterr().err
    assert code == 2 and said in err and err.count("\n") == 1, err


def test_world_size_without_rank_is_one_process(tmp_path, capsys, monkeypatch):
    """WORLD_SIZE alone (no RANK) is not torchrun: one process, whose batch need not split."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(["train", "--data", str(tmp_path / "no-such.txt"), "--out",
                 str(tmp_path / "run"), "--preset", "debug", "--quiet", "--batch_size", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "multiple of processes" not in err and "no-such.txt" in err, err
