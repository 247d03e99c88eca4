"""Random-number state and the logs (log.csv, TensorBoard): what exact resume needs beyond
model and optimizer."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError

LOG_FIELDS = ["step", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"]


def capture_rng(batch_generator: torch.Generator) -> tuple[dict, dict]:
    """(JSON-able state, tensor state) of every random stream training uses."""
    tensors = {"torch": torch.get_rng_state(), "batch": batch_generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state()
    py = random.getstate()
    np_state = np.random.get_state()
    info = {"python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]),
                      float(np_state[4])]}
    return info, tensors


def restore_rng(info: dict, tensors: dict, batch_generator: torch.Generator) -> None:
    torch.set_rng_state(tensors["torch"])
    batch_generator.set_state(tensors["batch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    py = info["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = info["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))


TENSORBOARD_DIR = "tensorboard"  # RUN/tensorboard/: event files, with --log tensorboard


class TensorBoardLog:
    """The same rows as TensorBoard scalars (``torch.utils.tensorboard``), in RUN/tensorboard/:
    ``tensorboard --logdir RUN`` (or the folder of a ``compare``, one curve per variant)."""

    def __init__(self, folder: Path, resume_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--log tensorboard needs the tensorboard package: pip install "
                            "'minitransformer[tensorboard]'") from None
        # on resume, events after the resumed step are hidden, as log.csv's rows are dropped
        self.writer = SummaryWriter(str(folder), purge_step=None if resume_step is None
                                    else resume_step + 1)
        self.last_step: dict[str, int] = {}  # a tag once per step (elapsed_s is in both rows)

    def write(self, step: int, **row) -> None:
        for name, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                tag = f"{'loss' if name.endswith('_loss') else 'train'}/{name}"
                if self.last_step.get(tag) != step:
                    self.writer.add_scalar(tag, value, step)
                    self.last_step[tag] = step
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class CsvLog:
    """log.csv beside the checkpoints; on resume, rows past the resumed step are dropped.

    ``extra`` names columns after LOG_FIELDS (e.g. the per-layer attention entropies).
    ``tensorboard``: every row also goes to TensorBoard event files (``TensorBoardLog``).
    """

    def __init__(self, path: Path, resume_step: int | None, extra: list[str] | tuple = (),
                 tensorboard: bool = False):
        self.path = Path(path)
        self.tensorboard = TensorBoardLog(self.path.parent / TENSORBOARD_DIR, resume_step) \
            if tensorboard else None
        self.fields = LOG_FIELDS + [name for name in extra if name not in LOG_FIELDS]
        rows = []
        if resume_step is not None and self.path.exists():
            with open(self.path, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, self.fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def write(self, **row) -> None:
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, self.fields, extrasaction="ignore").writerow(
                {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        if self.tensorboard is not None:
            self.tensorboard.write(**row)

    def rows(self) -> list[dict]:
        with open(self.path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
