"""The Task protocol for window tasks (GPT, masked LM): the split, the per-token loss, the one
val-loss function, and tasks written to the earlier four-method interface."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitransformer.config import EncoderConfig, GPTConfig, TrainConfig
from minitransformer.errors import UserError
from minitransformer.models import GPT, EncoderModel
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training import trainer
from minitransformer.training.evaluation import estimate_loss
from minitransformer.training.lm_task import LanguageModelTask
from minitransformer.training.mlm import MaskedLMTask
from minitransformer.training.seq2seq_task import Seq2SeqTask
from minitransformer.training.task import LegacyTask, Task, as_task, split_rows

TEXT = "the quick brown fox jumps over the lazy dog; " * 60
CPU = torch.device("cpu")


@pytest.fixture
def chars():
    tok = CharTokenizer.fit(TEXT)
    ids = torch.tensor(tok.encode(TEXT))
    return tok, ids[:2400], ids[2400:]


def test_the_three_tasks_are_tasks_and_the_trainer_still_exports_its_names(chars):
    _, train_ids, val_ids = chars
    assert isinstance(LanguageModelTask(train_ids, val_ids, 8), Task)
    assert isinstance(MaskedLMTask(train_ids, val_ids, 8, 0, 30), Task)
    pair = ([[3, 2]], [[4]])
    assert isinstance(Seq2SeqTask({"train": pair, "valid": pair}, 0, 1, 2, 64), Task)
    for name in ("LanguageModelTask", "train", "estimate_loss", "TrainingDiverged"):
        assert hasattr(trainer, name)


@pytest.mark.parametrize("rows,world,accum", [(8, 2, 2), (12, 3, 1), (7, 2, 2), (5, 1, 5)])
def test_split_rows_gives_every_part_rows_in_order(rows, world, accum):
    batch = (torch.arange(rows * 3).view(rows, 3), torch.arange(rows))
    parts = [split_rows(batch, r, world, m, accum) for r in range(world) for m in range(accum)]
    sizes = [p[0].shape[0] for p in parts]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    for i, t in enumerate(batch):
        assert torch.equal(torch.cat([p[i] for p in parts]), t)


def test_window_batch_size_must_divide_by_the_parts(chars):
    _, train_ids, val_ids = chars
    task = LanguageModelTask(train_ids, val_ids, 8)
    task.check_split(8, 2, 2)
    with pytest.raises(UserError, match=r"multiple of processes x grad_accum \(2 x 3\)"):
        task.check_split(8, 2, 3)


def test_gpt_val_loss_is_unchanged_the_mean_of_equal_batches(chars):
    tok, train_ids, val_ids = chars
    task = LanguageModelTask(train_ids, val_ids, 16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                          n_embd=16))
    got = estimate_loss(model, task, "val", 4, 5, CPU, torch.float32, seed=2)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # nanoGPT's estimate: the mean of the batches' mean losses
        means = [model.eval()(*task.batch("val", 4, gen))[1].item() for _ in range(5)]
    assert got == pytest.approx(sum(means) / 5, rel=1e-6)


def test_masked_lm_counts_only_the_masked_positions(chars):
    tok, train_ids, val_ids = chars
    mask_id = tok.vocab_size
    task = MaskedLMTask(train_ids, val_ids, 16, mask_id, tok.vocab_size + 1)
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size + 1, block_size=16, n_layer=1,
                                       n_head=2, n_embd=16, mask_id=mask_id))
    x, y = task.batch("train", 4, torch.Generator().manual_seed(0))
    chosen = int((y != -1).sum())
    assert 4 <= chosen < y.numel() and task.target_tokens((x, y)) == chosen
    total, n = task.loss_terms(model.eval(), (x, y))
    logits = model(x)[0]
    keep = y != -1
    expected = F.cross_entropy(logits[keep], y[keep], reduction="sum")
    assert int(n) == chosen and total.item() == pytest.approx(expected.item(), rel=1e-5)


def _train_mlm(chars, tmp_path, grad_accum):
    tok, train_ids, val_ids = chars
    mask_id = tok.vocab_size
    task = MaskedLMTask(train_ids, val_ids, 16, mask_id, tok.vocab_size + 1)
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=tok.vocab_size + 1, block_size=16, n_layer=1, n_head=2,
                        n_embd=16, mask_id=mask_id)
    model = EncoderModel(cfg)
    train_cfg = TrainConfig(batch_size=8, max_iters=3, eval_interval=3, eval_iters=1,
                            log_interval=1, grad_accum=grad_accum, sample_tokens=0,
                            device="cpu", dtype="float32", compile="off")
    trainer.train(model, tok, task, train_cfg, tmp_path / f"accum{grad_accum}",
                  {"family": "encoder", "model": vars(cfg)}, progress=False,
                  echo=lambda *a: None)
    return model.state_dict()


def test_masked_lm_grad_accum_normalises_by_the_masked_tokens_of_the_whole_batch(chars,
                                                                                tmp_path):
    """Micro-batches hold different numbers of masked positions: averaging their means would
    weigh tokens unequally, and grad_accum 2 would train another model than grad_accum 1."""
    one, two = _train_mlm(chars, tmp_path, 1), _train_mlm(chars, tmp_path, 2)
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=0, atol=1e-6, msg=k)


class FourMethods:
    """A task written to the earlier interface: batch, loss (a mean), tokens, sample."""

    def __init__(self, task):
        self.task = task

    def batch(self, split, batch_size, gen):
        return self.task.batch(split, batch_size, gen)

    def loss(self, model, batch):
        return self.task.loss(model, batch)

    def tokens(self, batch):
        return self.task.tokens(batch)

    def sample(self, *a):
        return ""


def test_a_four_method_task_still_trains_and_evaluates(chars, tmp_path):
    tok, train_ids, val_ids = chars
    inner = LanguageModelTask(train_ids, val_ids, 8)
    legacy = FourMethods(inner)
    adapted = as_task(legacy)
    assert isinstance(adapted, LegacyTask) and as_task(inner) is inner
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2,
                          n_embd=16))
    a = estimate_loss(model, legacy, "val", 4, 3, CPU, torch.float32)
    b = estimate_loss(model, inner, "val", 4, 3, CPU, torch.float32)
    assert a == pytest.approx(b, rel=1e-6)
    cfg = TrainConfig(batch_size=4, max_iters=2, eval_interval=2, eval_iters=1,
                      log_interval=1, sample_tokens=0, device="cpu", dtype="float32")
    result = trainer.train(model, tok, legacy, cfg, tmp_path / "run",
                           {"family": "gpt", "model": vars(model.config)}, progress=False,
                           echo=lambda *a: None)
    assert result.step == 2 and result.val_loss == result.val_loss  # not NaN
