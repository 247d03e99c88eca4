"""The one val loss: what training logs, what ``evaluate`` reports, what picks the best model.

    val loss = sum_i -log p(y_i) / N      over the target tokens i of eval_iters random batches

(nats per target token; nanoGPT's estimate, which averages equal-sized batches, is the same
number for windows). Padding never counts, and seq2seq's is the plain cross-entropy (no label
smoothing). The caller passes the dtype: the trainer its training dtype, ``evaluate`` the
dtype the run trained in, so that both report the same number for the same weights.
"""

from __future__ import annotations

import torch

from .device import autocast
from .task import as_task


@torch.no_grad()
def estimate_loss(model, task, split: str, batch_size: int, eval_iters: int, device, dtype,
                  seed: int = 0) -> float:
    """Mean cross-entropy (nats per target token) over eval_iters random batches of ``split``.

    Uses its own generator (fixed seed), so evaluating never shifts the training data order,
    and every call sees the same batches.
    """
    task = as_task(task)
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    count = torch.zeros((), device=device, dtype=torch.long)
    for _ in range(eval_iters):
        batch = tuple(t.to(device) for t in task.batch(split, batch_size, gen))
        with autocast(device, dtype):
            loss_sum, n = task.loss_terms(model, batch)
        total += loss_sum.float()
        count += n
    model.train(was_training)
    return (total / count.clamp(min=1)).item()
