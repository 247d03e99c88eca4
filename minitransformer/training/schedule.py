"""Learning-rate schedules.

- ``cosine_lr``: linear warmup, then cosine decay to min_lr (GPT-2 / nanoGPT). The decay runs
  over a fraction of training ``progress`` in [0, 1], which is step / max_iters, or under a
  time budget the larger of that and elapsed time / time budget (the run ends at either).
- ``noam_lr``: the paper's schedule (section 5.3),
  lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
"""

from __future__ import annotations

import math


def cosine_lr(step: int, progress: float, learning_rate: float, min_lr: float,
              warmup_iters: int) -> float:
    """Warmup for ``warmup_iters`` steps, then cosine from learning_rate to min_lr."""
    if warmup_iters and step < warmup_iters:
        return learning_rate * (step + 1) / (warmup_iters + 1)
    progress = min(max(progress, 0.0), 1.0)
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 -> 0
    return min_lr + coeff * (learning_rate - min_lr)


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's eq.: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); step counts from 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
