"""Seq2seq as a Task: every process and micro-step gets pairs, 2 processes x grad_accum 2 equal
one process with the whole bucket, and the val loss is the mean over target tokens.

The data is a slice of the bundled Bible corpus with a small joint BPE vocabulary, the model
a shrunken debug preset (dropout 0, fp32), built in Python rather than through the CLI. Run as
a script (under torchrun) this file is also the worker of the two-process test.
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
import torch.nn.functional as F
from safetensors.torch import load_file

from minitransformer.config import Seq2SeqConfig, TrainConfig
from minitransformer.data import encode_pairs, load_parallel, source_ids, split_indices
from minitransformer.errors import UserError
from minitransformer.models import Seq2SeqTransformer
from minitransformer.models.decoding import default_max_len, greedy_decode, pad_batch
from minitransformer.tokenizers import BPETokenizer, tokenizer_from_dict
from minitransformer.training import checkpoint as ckpt
from minitransformer.training.evaluation import estimate_loss
from minitransformer.training.health import HealthGuard
from minitransformer.training.seq2seq_task import Seq2SeqTask
from minitransformer.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 40  # tokens per side (the debug preset's train_max_len is 48)
BATCH_TOKENS = 1024  # the debug preset's: buckets of about 20-60 pairs here
STEPS = 4
LR = 2e-3


def bible_data(n_train: int = 1500, n_valid: int = 150, vocab: int = 1000):
    """(tokenizer, {"train": (src ids, tgt ids), "valid": ...}) from the bundled corpus."""
    corpus = load_parallel("bible_en_es")
    splits = split_indices(corpus.groups)
    picked = {"train": splits["train"][:n_train], "valid": splits["valid"][:n_valid]}
    texts = [side[i] for i in picked["train"] for side in (corpus.src, corpus.tgt)]
    tok = BPETokenizer.train(texts, vocab)
    encoded = {}
    for name, idx in picked.items():
        src, tgt = encode_pairs(tok, [corpus.src[i] for i in idx], [corpus.tgt[i] for i in idx],
                                tok.eos_id)
        keep = [i for i in range(len(src)) if len(src[i]) <= MAX_LEN + 1
                and len(tgt[i]) <= MAX_LEN]
        encoded[name] = ([src[i] for i in keep], [tgt[i] for i in keep])
    return tok, encoded


def make_model(tok) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                        n_embd=64, d_ff=128, dropout=0.0, pad_id=tok.pad_id, bos_id=tok.bos_id,
                        eos_id=tok.eos_id)
    return Seq2SeqTransformer(cfg)


class RecordingTask(Seq2SeqTask):
    """Records (pairs in the bucket, pairs in this part) of every split it makes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.splits_made: list[tuple[int, int]] = []

    def split(self, batch, rank, world_size, micro, grad_accum):
        part = super().split(batch, rank, world_size, micro, grad_accum)
        self.splits_made.append((batch[0].shape[0], part[0].shape[0]))
        return part


def train_run(tok, encoded, out: Path, grad_accum: int) -> RecordingTask:
    task = RecordingTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, BATCH_TOKENS, seed=0)
    cfg = TrainConfig(batch_size=64, max_iters=STEPS, eval_interval=2, eval_iters=2,
                      log_interval=1, learning_rate=LR, min_lr=2e-4, warmup_iters=2,
                      weight_decay=0.0, beta2=0.98, grad_accum=grad_accum, sample_tokens=0,
                      seed=3, device="cpu", dtype="float32", compile="off")
    model = make_model(tok)
    meta = {"family": "seq2seq", "model": vars(model.config)}
    train(model, tok, task, cfg, out, meta, progress=False, echo=lambda *a: None)
    return task


def worker(data_file: str, out: str) -> None:
    """One process of the torchrun test: train, then write the splits this rank made."""
    data = json.loads(Path(data_file).read_text(encoding="utf-8"))
    tok = tokenizer_from_dict(data["tokenizer"])
    encoded = {k: tuple(v) for k, v in data["encoded"].items()}
    task = train_run(tok, encoded, Path(out), grad_accum=2)
    rank = os.environ["RANK"]
    (Path(out) / f"splits_rank{rank}.json").write_text(json.dumps(task.splits_made))


@pytest.fixture(scope="module")
def bible():
    return bible_data()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_losses(out: Path) -> list[float]:
    with open(out / "log.csv", newline="") as f:
        return [float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]]


def test_every_bucket_gives_every_process_and_micro_step_pairs(bible):
    tok, encoded = bible
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, BATCH_TOKENS)
    task.check_split(64, 2, 2)
    buckets = task.batches("train", 64)
    sizes = {len(b) for b in buckets}
    assert len(sizes) > 1 and min(sizes) < 64  # token-bucketed: fewer rows than batch_size
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = task.batch("train", 64, gen)
        parts = [task.split(batch, r, 2, m, 2) for r in range(2) for m in range(2)]
        rows = [p[0].shape[0] for p in parts]
        assert min(rows) >= 1 and max(rows) - min(rows) <= 1 and sum(rows) == batch[0].shape[0]
        for i, t in enumerate(batch):  # in order, each row once
            assert torch.equal(torch.cat([p[i] for p in parts]), t)
        assert sum(task.target_tokens(p) for p in parts) == task.target_tokens(batch)


def test_a_bucket_too_small_to_split_is_a_clear_error(bible):
    tok, encoded = bible
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, 120)  # ~2-3 pairs a bucket
    with pytest.raises(UserError, match=r"--batch_tokens to at least \d+"):
        task.check_split(64, 2, 2)
    task.check_split(64, 1, 1)  # one part: any bucket will do


def test_a_short_leftover_bucket_joins_the_one_before():
    src = [[5] * n + [2] for n in range(1, 12)]  # 11 pairs, lengths 2..12
    tgt = [[6] * n for n in range(1, 12)]
    task = Seq2SeqTask({"train": (src, tgt), "valid": (src, tgt)}, 0, 1, 2, 10_000)
    assert [len(b) for b in task.batches("train", 5)] == [5, 5, 1]
    task.check_split(5, 2, 2)
    assert [len(b) for b in task.batches("train", 5)] == [5, 6]
    assert sorted(i for b in task.batches("train", 5) for i in b) == list(range(11))
    assert [len(b) for b in task.batches("val", 5)] == [5, 5, 1]  # val is never split


def test_two_processes_with_grad_accum_equal_one_process(bible, tmp_path):
    tok, encoded = bible
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"tokenizer": tok.to_dict(), "encoded": encoded}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), __file__,
         str(data), str(tmp_path / "ddp")], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    single = train_run(tok, encoded, tmp_path / "single", grad_accum=1)

    # every rank's part of every bucket held pairs, and the parts covered the bucket
    made = [json.loads((tmp_path / "ddp" / f"splits_rank{r}.json").read_text())
            for r in range(2)]
    assert all(len(m) == STEPS * 2 for m in made)  # 2 micro-steps a step
    for step in range(STEPS):
        parts = [m[2 * step + i] for m in made for i in range(2)]
        bucket = parts[0][0]
        assert bucket == single.splits_made[step][0]  # the same bucket as the single run
        assert all(rows >= 1 for _, rows in parts) and sum(r for _, r in parts) == bucket

    la, lb = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "single")
    assert len(la) == len(lb) == STEPS
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=0, atol=1e-5)
    wa = load_file(ckpt.list_checkpoints(tmp_path / "ddp")[-1] / ckpt.MODEL_FILE)
    wb = load_file(ckpt.list_checkpoints(tmp_path / "single")[-1] / ckpt.MODEL_FILE)
    assert wa.keys() == wb.keys()
    for k in wa:
        if k.endswith("k_proj.bias"):
            # A key bias adds the same q.b to every score of a query, which softmax ignores:
            # its gradient is 0 up to rounding, and Adam scales that noise up to lr-sized
            # steps of random sign (at most one lr a step from its initial 0 in either run).
            assert max(wa[k].abs().max(), wb[k].abs().max()) <= STEPS * LR, k
            continue
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5, msg=k)


def test_val_loss_is_the_plain_cross_entropy_per_target_token(bible):
    tok, encoded = bible
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, 400)
    model = make_model(tok)  # label_smoothing 0.1: the val loss must not use it
    model.train()
    got = estimate_loss(model, task, "val", 16, 6, torch.device("cpu"), torch.float32, seed=4)
    assert model.training  # left as it was

    gen = torch.Generator().manual_seed(4)
    model.eval()
    total, counts, means = 0.0, [], []
    with torch.no_grad():
        for _ in range(6):
            src, tgt_in, tgt_out = task.batch("val", 16, gen)
            logits = model(src, tgt_in)[0]  # (B, T, V)
            s = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1),
                                ignore_index=tok.pad_id, reduction="sum")
            n = int((tgt_out != tok.pad_id).sum())
            total, counts = total + s.item(), counts + [n]
            means.append(s.item() / n)
    assert len(set(counts)) > 1  # buckets of different sizes: the weighting matters
    assert got == pytest.approx(total / sum(counts), rel=1e-5)
    assert abs(got - sum(means) / len(means)) > 1e-3  # not the mean of per-batch means


def test_entropy_columns_name_the_three_kinds_of_attention(bible):
    tok, encoded = bible
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, BATCH_TOKENS)
    columns = HealthGuard().entropy_columns(make_model(tok), task, torch.device("cpu"))
    assert set(columns) == {f"{kind}_attn_entropy_{i}" for kind in ("enc", "dec", "cross")
                            for i in range(2)}



def test_the_training_sample_stays_inside_a_learned_position_table(bible):
    """sample_tokens past block_size - 1 (40 with block_size 32 here) once stopped a run at
    its first evaluation; the sample is cut to the table instead."""
    tok, encoded = bible
    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(
        vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32, d_ff=64,
        pos_encoding="learned", pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id))
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, BATCH_TOKENS,
                       sample_sources=["In the beginning."])
    text = task.sample(model.eval(), tok, 40, torch.device("cpu"))
    assert text.startswith("In the beginning.\n  -> ")



def test_the_training_sample_is_what_translate_prints(bible):
    """A young model that never writes </s> stops where `translate` would (1.5 x the source
    + 10 tokens), not after sample_tokens: at every evaluation that was 200 steps a sentence."""
    tok, encoded = bible
    torch.manual_seed(0)
    model = make_model(tok).eval()
    sources = ["In the beginning God created the heaven and the earth.", "And God saw."]
    task = Seq2SeqTask(encoded, tok.pad_id, tok.bos_id, tok.eos_id, BATCH_TOKENS,
                       sample_sources=sources)
    src = pad_batch(source_ids(tok, sources, tok.eos_id), tok.pad_id)
    expected = greedy_decode(model, src).tokens
    assert max(map(len, expected)) < 200
    text = task.sample(model, tok, 200, torch.device("cpu"))
    assert text == "\n".join(f"{s}\n  -> {tok.decode(o)}"
                             for s, o in zip(sources, expected, strict=True))
    limits = default_max_len(model, src).tolist()  # each sentence's own
    assert min(limits) < max(limits)
    for n in (3, (min(limits) + max(limits)) // 2):  # below both, between the two: each holds
        cut = task.sample(model, tok, n, torch.device("cpu"))
        assert cut == "\n".join(f"{s}\n  -> {tok.decode(o[:n])}"
                                for s, o in zip(sources, expected, strict=True))



def test_pieces_the_vocabulary_lacks_are_said_not_silently_read_as_unk(bible, capsys):
    """A SentencePiece-style joint BPE turns characters it never saw into <unk>: translate
    says which (it used to print an empty translation and nothing else)."""
    from minitransformer.families.seq2seq import encode_sources

    tok, _ = bible
    assert tok.unknown_pieces(["In the beginning.", "Y Dios dijo."]) == []
    assert tok.unknown_pieces(["你好 God", "好 ☃"]) == ["你", "好", "☃"]
    ids = encode_sources(make_model(tok), tok, ["你好 God"])
    assert ids[0].count(tok.unk_id) == 2
    assert capsys.readouterr().err == ("note: the model's vocabulary has no '你', '好': each is "
                                       "read as <unk>\n")


if __name__ == "__main__":
    worker(*sys.argv[1:3])
