"""The training loop: AdamW, warmup + cosine, clipping, evaluation, checkpoints, exact resume.

What one optimizer step does (nanoGPT's loop, written out):
    lr <- schedule(step)                     warmup, then cosine over max_iters or the time budget
    x, y <- batch_size random windows        drawn from a dedicated, checkpointed generator
    loss <- cross-entropy(model(x), y)       split into grad_accum micro-steps
    clip ||grad|| to grad_clip; AdamW step
Every eval_interval steps: val loss (nanoGPT's estimate), a sample, a checkpoint in
checkpoints/, and the best model so far at the top of the run folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import TrainConfig
from ..data import get_batch
from ..errors import UserError
from . import checkpoint as ckpt
from . import distributed
from .curves import plot_loss_curve
from .device import autocast, maybe_compile, pick_dtype, set_threads
from .health import HealthGuard
from .optim import make_optimizer
from .schedule import cosine_lr, noam_lr
from .state import CsvLog, capture_rng, restore_rng


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    best_val_loss: float
    val_loss: float
    train_seconds: float
    interrupted: bool = False
    stopped_early: bool = False  # the health guard's early stop


class LanguageModelTask:
    """Next-token prediction on one token stream: batches, loss, sample.

    The trainer sees a task only through these methods, so other model families plug in
    with a task of their own: ``batch`` returns a tuple of batch-first tensors, ``loss``
    maps (model, batch) to a scalar, ``tokens`` counts the tokens of a batch (host side,
    from shapes: no device sync), ``sample`` returns a short text to print.
    """

    family = "gpt"

    def __init__(self, train_ids: torch.Tensor, val_ids: torch.Tensor, block_size: int):
        self.data = {"train": train_ids, "val": val_ids}
        self.block_size = block_size

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        return get_batch(self.data[split], batch_size, self.block_size, generator)

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return model(x, y)[1]

    def tokens(self, batch) -> int:
        return batch[0].numel()

    def sample(self, model, tokenizer, n_tokens: int, device) -> str:
        try:  # start from a newline where the tokenizer has one, else from a val token
            ids = tokenizer.encode("\n")
        except UserError:
            ids = []
        idx = torch.tensor([ids or self.data["val"][:1].tolist()], device=device)  # (1, T)
        out = model.generate(idx, n_tokens, temperature=0.8, top_k=50, seed=0)
        return tokenizer.decode(out[0, idx.shape[1]:].tolist())


@torch.no_grad()
def estimate_loss(model, task, split: str, batch_size: int, eval_iters: int, device, dtype,
                  seed: int = 0) -> float:
    """Mean cross-entropy (nats/token) over eval_iters random batches, as nanoGPT measures it.

    Uses its own generator (fixed seed), so evaluating never shifts the training data order.
    """
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for _ in range(eval_iters):
        batch = tuple(t.to(device) for t in task.batch(split, batch_size, gen))
        with autocast(device, dtype):
            loss = task.loss(model, batch)
        total += loss.float()
    model.train(was_training)
    return (total / eval_iters).item()


class _StopFlag:
    """Turns Ctrl-C into a request to stop after the current step (never mid-update)."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self._old = None
        return self

    def _handle(self, signum, frame):
        if self.requested:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def prepare_out_dir(out_dir: Path, resume: bool, force: bool) -> None:
    out_dir = Path(out_dir)
    has_run = (out_dir / ckpt.CONFIG_FILE).exists() or (out_dir / ckpt.CHECKPOINTS).exists()
    if resume:
        if not ckpt.list_checkpoints(out_dir):
            raise UserError(f"nothing to resume in {out_dir}: it has no checkpoints/ folder")
        for stale in (out_dir / ckpt.CHECKPOINTS).glob(".tmp-*"):  # a save cut short
            shutil.rmtree(stale, ignore_errors=True)
        return
    if has_run and not force:
        raise UserError(f"{out_dir} already holds a training run; pass --resume to continue it "
                        f"or --force to replace it")
    if has_run and force:
        shutil.rmtree(out_dir / ckpt.CHECKPOINTS, ignore_errors=True)
        for name in (ckpt.MODEL_FILE, ckpt.CONFIG_FILE, ckpt.TOKENIZER_FILE, "log.csv"):
            (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def train(model, tokenizer, task, cfg: TrainConfig, out_dir, meta: dict, resume: bool = False,
          force: bool = False, progress: bool = True, echo=print,
          health: HealthGuard | None = None) -> TrainResult:
    """Train ``model`` on ``task``; write the run folder ``out_dir``; return a summary.

    ``meta`` is stored in every config.json (family, model config, data source). Under
    torchrun every process calls this; ``cfg.batch_size`` stays the global batch of one
    optimizer step, each rank taking its slice of it. ``health`` (default: warnings only)
    watches for overfitting and logs attention entropy at each evaluation.
    """
    out_dir = Path(out_dir)
    info, device = distributed.setup(cfg.device)
    main = info.is_main
    health = health if health is not None else HealthGuard()
    if main:
        prepare_out_dir(out_dir, resume, force)
    distributed.barrier(info)
    set_threads()
    dtype = pick_dtype(cfg.dtype, device)
    per_rank, rem = divmod(cfg.batch_size, info.world_size * cfg.grad_accum)
    if rem or per_rank == 0:
        raise UserError(f"batch_size ({cfg.batch_size}) must be a multiple of processes x "
                        f"grad_accum ({info.world_size} x {cfg.grad_accum})")
    rows = slice(info.rank * per_rank * cfg.grad_accum, (info.rank + 1) * per_rank * cfg.grad_accum)
    torch.manual_seed(cfg.seed + info.rank)  # dropout differs across ranks, as it should
    model.to(device)
    optimizer = make_optimizer(model, cfg.learning_rate, cfg.weight_decay,
                               (cfg.beta1, cfg.beta2), device.type)
    batch_gen = torch.Generator().manual_seed(cfg.seed)  # same on every rank: one global sampler
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None

    step, train_time, best, last_val = 0, 0.0, math.inf, math.nan
    if resume:
        folder = ckpt.list_checkpoints(out_dir)[-1]
        ckpt.load_weights(model, folder / ckpt.MODEL_FILE)
        state, rng = ckpt.load_training_state(folder, optimizer)
        rng["torch"] = rng.get(f"torch_rank{info.rank}", rng["torch"])
        restore_rng(state["rng"], rng, batch_gen)
        step, train_time = state["step"], state["train_seconds"]
        best, last_val = state["best_val_loss"], state["val_loss"]
        if main:
            echo(f"resuming {out_dir} from step {step} (val loss {last_val:.4f})")
    entropy_names = list(health.entropy_columns(model, task, device)) if main else []
    log = CsvLog(out_dir / "log.csv", step if resume else None, entropy_names) if main else None
    last_eval = step if resume else -1
    compiled_model, _ = maybe_compile(model, cfg.compile, device)
    run_model = distributed.wrap(compiled_model, info, device)

    def full_meta(val_loss: float) -> dict:
        return {**meta, "train": dataclasses.asdict(cfg), "step": step,
                "val_loss": val_loss, "best_val_loss": min(best, val_loss)}

    def save_state(val_loss: float) -> None:
        rng_info, tensors = capture_rng(batch_gen)
        for r, t in enumerate(distributed.gather(torch.get_rng_state(), info)):
            if info.enabled:
                tensors[f"torch_rank{r}"] = t
        if main:
            state = {"step": step, "train_seconds": train_time,
                     "best_val_loss": min(best, val_loss), "val_loss": val_loss,
                     "world_size": info.world_size, "rng": rng_info}
            ckpt.save_checkpoint(out_dir, step, model, full_meta(val_loss), tokenizer,
                                 optimizer, state, tensors, cfg.keep_last)
        distributed.barrier(info)

    def evaluate_and_save() -> None:
        nonlocal best, last_val, last_eval
        # every rank evaluates the same batches (cheap, and no rank waits on another)
        last_val = estimate_loss(compiled_model, task, "val", cfg.batch_size, cfg.eval_iters,
                                 device, dtype)
        last_eval = step
        is_best = step > 0 and last_val < best
        notes = health.on_eval(step, last_val)
        if main:
            log.write(step=step, val_loss=last_val, elapsed_s=train_time,
                      **health.entropy_columns(model, task, device))
            if is_best:
                ckpt.write_model_files(out_dir, model, full_meta(last_val), tokenizer)
        if step > 0:
            save_state(last_val)
            if main:
                plot_loss_curve(out_dir / "log.csv", out_dir / "loss.png")
        best = min(best, last_val) if step > 0 else best
        if main:
            bar.write(f"step {step}: val loss {last_val:.4f}"
                      + (" (best so far, saved)" if is_best else ""))
            for note in notes:
                bar.write(note)
            if cfg.sample_tokens:
                text = task.sample(model, tokenizer, cfg.sample_tokens, device)
                bar.write("  sample: " + text.replace("\n", "\n          ")[:2000])

    budget = cfg.time_budget
    bar = tqdm(total=int(budget) if budget else cfg.max_iters,
               initial=int(train_time) if budget else step, disable=not (progress and main),
               unit="s" if budget else "it", dynamic_ncols=True, leave=True)
    running_loss, interrupted = None, False
    window_t, window_steps, window_tokens = 0.0, 0, 0
    model.train()
    with _StopFlag() as stop:
        while True:
            if step % cfg.eval_interval == 0 and last_eval != step:
                evaluate_and_save()
            if step >= cfg.max_iters or (budget is not None and train_time >= budget) \
                    or health.stop_requested:
                break
            if stop.requested and not info.enabled:
                interrupted = True
                break
            progress_frac = train_time / budget if budget else step / cfg.max_iters
            lr = learning_rate(cfg, step, progress_frac, model)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            batch = tuple(t[rows].to(device, non_blocking=True)
                          for t in task.batch("train", cfg.batch_size, batch_gen))
            window_tokens += task.tokens(batch) * info.world_size
            loss_sum = torch.zeros((), device=device)
            for m in range(cfg.grad_accum):
                part = tuple(t[m * per_rank:(m + 1) * per_rank] for t in batch)
                last_micro = m == cfg.grad_accum - 1
                sync = contextlib.nullcontext() if last_micro or not info.enabled \
                    else run_model.no_sync()  # all-reduce gradients once, after the last
                with sync:
                    with autocast(device, dtype):
                        loss = task.loss(run_model, part) / cfg.grad_accum
                    (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.detach()
            if scaler:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            at_log = step % cfg.log_interval == 0 or step == cfg.max_iters
            if device.type == "cuda" and at_log:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            train_time = distributed.from_main(train_time + dt, info, device) if budget \
                else train_time + dt
            window_t += dt
            window_steps += 1
            if at_log:
                loss_value = distributed.mean(loss_sum, info).item()  # the one sync, here
                if not math.isfinite(loss_value):
                    bar.close()
                    raise TrainingDiverged(
                        f"the loss became {loss_value} at step {step}; training stopped. The "
                        f"last good checkpoint is kept in {out_dir}; try a lower "
                        f"--learning_rate or --grad_clip 1.0")
                if info.enabled and distributed.from_main(float(stop.requested), info, device):
                    interrupted = True
                health.on_train_loss(loss_value)
                running_loss = loss_value if running_loss is None else \
                    0.9 * running_loss + 0.1 * loss_value
                tok_s = window_tokens / max(window_t, 1e-9)
                if main:
                    log.write(step=step, train_loss=loss_value, lr=lr,
                              grad_norm=float(grad_norm), tokens_per_s=tok_s,
                              elapsed_s=train_time)
                bar.set_postfix(loss=f"{running_loss:.3f}", lr=f"{lr:.1e}",
                                tok_s=f"{tok_s:,.0f}", refresh=False)
                window_t, window_steps, window_tokens = 0.0, 0, 0
                if interrupted:
                    break
            bar.update(min(int(train_time), int(budget)) - bar.n if budget else 1)
        if interrupted:
            save_state(last_val if last_eval == step else math.nan)
        elif last_eval != step:
            evaluate_and_save()
    bar.close()
    if interrupted and main:
        echo(f"interrupted at step {step}; saved a checkpoint in {out_dir / ckpt.CHECKPOINTS}."
             f" Resume with: minitransformer train --out {out_dir} --resume")
    distributed.teardown()
    return TrainResult(out_dir, step, best, last_val, train_time, interrupted,
                       health.stop_requested)


def learning_rate(cfg: TrainConfig, step: int, progress: float, model) -> float:
    if cfg.lr_schedule == "noam":  # the paper's schedule; learning_rate is unused
        return noam_lr(step + 1, ckpt.unwrap(model).config.n_embd, max(cfg.warmup_iters, 1))
    return cosine_lr(step, progress, cfg.learning_rate, cfg.min_lr, cfg.warmup_iters)
