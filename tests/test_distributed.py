"""Data-parallel training: 2 processes on CPU (gloo, loopback) equal one process.

Launches are slow (each process imports torch), so this module runs few, tiny trainings and
shares them between tests.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minitransformer import GPT, GPTConfig, load_checkpoint
from minitransformer.training import checkpoint as ckpt

COMMON = ["--preset", "debug", "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
          "--log_interval", "1", "--dropout", "0", "--batch_size", "8", "--quiet",
          "--sample_tokens", "0", "--n_layer", "1", "--n_embd", "32", "--block_size", "16",
          # fp32: bf16 rounding depends on the micro-batch shape, and these tests compare
          # runs split differently to 1e-5
          "--dtype", "float32"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kw):
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=240, **kw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def train_single(out: Path, *extra: str):
    """One process: this one (a fresh interpreter would add seconds of imports)."""
    from minitransformer.cli import main

    assert main(["train", *COMMON, "--out", str(out), *extra]) == 0


def train_ddp(out: Path, *extra: str, nproc: int = 2):
    return run([*TORCHRUN, "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), "-m", "minitransformer", "train", *COMMON,
         "--out", str(out), *extra])


def train_losses(out: Path) -> list[float]:
    with open(out / "log.csv", newline="") as f:
        return [float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]]


def last_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.list_checkpoints(out)[-1] / ckpt.MODEL_FILE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    # The DDP run reads a DATA_DIR (prepare's shards of the text the single runs read from
    # the file, through the cache), so the tests below also show that 2 ranks mapping one
    # DATA_DIR equal 1 process; the resumed and two-node runs read the file, local rank 0
    # preparing it into the cache while the other rank waits.
    from minitransformer.cli import main

    assert main(["prepare", "--data", "shakespeare", "--out", str(root / "dd")]) == 0
    train_ddp(root / "ddp", "--data", str(root / "dd"))
    train_single(root / "single")
    train_single(root / "accum", "--grad_accum", "2")
    return root


def assert_same_run(a: Path, b: Path):
    la, lb = train_losses(a), train_losses(b)
    assert len(la) == len(lb) == 6
    assert torch.allclose(torch.tensor(la), torch.tensor(lb), atol=1e-5), (la, lb)
    wa, wb = last_weights(a), last_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k


def test_two_processes_equal_one_process_with_the_same_global_batch(runs):
    assert_same_run(runs / "ddp", runs / "single")


def test_grad_accum_equals_one_big_batch(runs):
    assert_same_run(runs / "accum", runs / "single")


def test_ddp_checkpoint_loads_and_samples_in_one_process(runs):
    model, tok = load_checkpoint(runs / "ddp")
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in model.state_dict())
    proc = run([sys.executable, "-m", "minitransformer", "sample", str(runs / "ddp"),
                "--prompt", "The", "--max-new-tokens", "20", "--seed", "1"])
    assert proc.stdout.startswith("The") and len(proc.stdout.strip()) >= 20


def test_ddp_run_stopped_and_resumed_continues_the_same_curve(runs, tmp_path):
    out = tmp_path / "resumed"
    said = train_ddp(out, "--max_iters", "3").stdout
    assert said.count("best model:") == 1, said  # rank 0 speaks for the run
    train_ddp(out, "--resume", "--max_iters", "6")
    assert_same_run(out, runs / "ddp")
    with pytest.raises(AssertionError) as refused:  # a user error, said once
        train_ddp(out, "--max_iters", "9")
    assert str(refused.value).count("already holds a training run") == 1


def test_two_nodes_on_one_machine_train_together(runs, tmp_path):
    port = free_port()
    out = tmp_path / "two_nodes"
    agents = [subprocess.Popen(
        [*TORCHRUN, "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1",
         "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "t",
         "-m", "minitransformer", "train", *COMMON, "--out", str(out)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    outputs = [a.communicate(timeout=240)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), outputs
    # two nodes of one process each are the same computation as 2 processes on one node
    assert_same_run(out, runs / "ddp")


def test_compiled_model_checkpoint_loads_in_a_plain_model(tmp_path):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg)
    compiled = torch.compile(model)  # wrapping is lazy: nothing is compiled here
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())

    class Tok:
        def to_dict(self):
            return {"type": "char", "chars": [chr(65 + i) for i in range(20)]}

    meta = {"family": "gpt", "model": cfg.__dict__}
    ckpt.write_model_files(tmp_path, compiled, meta, Tok())
    plain, _ = load_checkpoint(tmp_path)
    idx = torch.randint(0, 20, (2, 8))
    assert torch.equal(plain(idx)[0], model.eval()(idx)[0])


def test_the_resume_hint_starts_the_run_as_it_was_started():
    """A run under torchrun is resumed under torchrun (a sharded one cannot resume alone
    without --shard false): the interrupted run's hint says so."""
    from minitransformer.training.distributed import DistInfo

    assert DistInfo().command == "minitransformer"
    assert DistInfo(1, 2, 1).command == "torchrun --nproc_per_node 2 -m minitransformer"
