"""The training loop: AdamW, warmup + cosine, clipping, evaluation, checkpoints, exact resume.

What one optimizer step does (nanoGPT's loop, written out; the steps are ``TrainingRun``'s):
    lr <- get_lr()                           warmup, then cosine over max_iters or the time budget
    batch <- task.batch("train", ...)        drawn from a dedicated, checkpointed generator
    loss <- sum of token losses / N          over the parts of every rank and micro-step, N the
                                             batch's target tokens (see task.py)
    clip ||grad|| to grad_clip; AdamW step
Every eval_interval steps: val loss (``estimate_loss``, per target token), a sample, a
checkpoint in checkpoints/, and the best model so far at the top of the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig
from .evaluation import estimate_loss
from .health import HealthGuard
from .lm_task import LanguageModelTask
from .run import StopFlag, TrainingDiverged, TrainingRun, learning_rate, prepare_out_dir
from .task import as_task


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    best_val_loss: float
    val_loss: float
    train_seconds: float
    interrupted: bool = False
    stopped_early: bool = False  # the health guard's early stop
    start_step: int = 0  # where this call began: a resumed run's checkpoint step


def train(model, tokenizer, task, cfg: TrainConfig, out_dir, meta: dict, resume: bool = False,
          force: bool = False, progress: bool = True, echo=print,
          health: HealthGuard | None = None, lora=None) -> TrainResult:
    """Train ``model`` on ``task``; write the run folder ``out_dir``; return a summary.

    ``meta`` is stored in every config.json (family, model config, data source). Under
    torchrun every process calls this; ``cfg.batch_size`` stays the global batch of one
    optimizer step, each rank taking its part of it (``Task.split``). ``health`` (default:
    warnings only) watches for overfitting and logs attention entropy at each evaluation.
    ``lora`` (a ``lora.Lora`` holding ``model``): only its adapters train, and every save
    writes the merged weights.
    """
    run = TrainingRun(model, tokenizer, as_task(task), cfg, out_dir, meta,
                      health if health is not None else HealthGuard(), echo, lora)
    run.setup(resume, force)
    if resume:
        run.restore()
    start_step = run.step
    run.start(resume, progress)
    with StopFlag() as stop:
        while True:
            if run.eval_due():
                run.evaluate_and_save()
            if run.finished():
                break
            if stop.requested and not run.info.enabled:  # one process: stop right here
                run.interrupted = True
                break
            lr = run.get_lr()
            loss, grad_norm, at_log = run.train_step(lr)
            if at_log:
                run.log_step(loss, lr, grad_norm, stop.requested)
                if run.interrupted:
                    break
            run.advance_bar()
        run.wrap_up()
    run.close()
    return TrainResult(run.out_dir, run.step, run.best, run.last_val, run.train_time,
                       run.interrupted, run.health.stop_requested, start_step)


__all__ = ["LanguageModelTask", "StopFlag", "TrainResult", "TrainingDiverged", "estimate_loss",
           "learning_rate", "prepare_out_dir", "train"]
