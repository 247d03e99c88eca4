"""One training run: its state, and the named steps that ``train`` runs in a loop.

    setup              processes, run folder, seeds, optimizer                 once
    restore            weights, optimizer, random streams, counters            --resume
    start              log.csv, compile, DDP, the progress bar                 once
                       (--shard: FSDP2 in setup, before the optimizer; see distributed.py)
    get_lr             warmup + cosine (or the paper's noam) at this step
    train_step         global batch -> this rank's parts -> backward -> clip -> AdamW
    log_step           train loss (the one sync), log.csv, the bar, the NaN check
    evaluate_and_save  val loss, health, best model, checkpoint, sample
    save_state         a checkpoint in checkpoints/ with all that exact resume needs

The loss of a step is the sum of per-token losses over the global batch divided by its target
tokens N (see ``task.py``): each part's backward pass gets sum * world_size / N, because DDP
averages gradients over the ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import signal
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import TrainConfig
from ..errors import UserError
from ..io import check_folder_path, read_safetensors
from . import checkpoint as ckpt
from . import distributed
from .curves import plot_loss_curve
from .device import autocast, maybe_compile, pick_dtype, set_threads
from .evaluation import estimate_loss
from .health import HealthGuard
from .lora import ADAPTER_FILES
from .optim import make_optimizer
from .schedule import cosine_lr, noam_lr
from .state import CsvLog, capture_rng, restore_rng
from .task import Batch, Task, terminal_text


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


class StopFlag:
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


def check_out_dir(out_dir: Path, resume: bool, force: bool) -> bool:
    """Refuse a run folder that cannot be used as asked; returns whether it holds a run."""
    check_folder_path(out_dir := Path(out_dir))
    ckpt.refuse_other_output(out_dir)
    if (inside := ckpt.run_around(out_dir)) is not None:
        raise UserError(f"--out {out_dir} lies inside a run ({inside}); give the new run a "
                        f"folder of its own")
    has_run = ckpt.holds_run(out_dir)
    if resume and force:
        raise UserError("--resume continues the run in --out and --force replaces it: "
                        "give one of them")
    if resume and not ckpt.list_checkpoints(out_dir):
        raise UserError(f"nothing to resume in {out_dir}: {ckpt.why_no_checkpoint(out_dir)}")
    if not resume and has_run and not force:
        if ckpt.run_containing(out_dir) is None:  # another tool's model, or a damaged run
            raise UserError(f"{out_dir} already holds a model's files (config.json or "
                            f"checkpoints/) that are not a run to resume; give the run another "
                            f"folder, or pass --force to replace them")
        raise UserError(f"{out_dir} already holds a training run; pass --resume to continue it "
                        f"or --force to replace it")
    return has_run


def prepare_out_dir(out_dir: Path, resume: bool, force: bool) -> None:
    has_run = check_out_dir(out_dir := Path(out_dir), resume, force)
    if resume:
        for stale in (out_dir / ckpt.CHECKPOINTS).glob(".tmp-*"):  # a save cut short
            shutil.rmtree(stale, ignore_errors=True)
        return
    if has_run and force:  # the run's own files: anything else in the folder stays
        ckpt.remove_checkpoints(out_dir)
        for name in (ckpt.MODEL_FILE, ckpt.CONFIG_FILE, ckpt.TOKENIZER_FILE, "log.csv",
                     *ADAPTER_FILES):
            (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def learning_rate(cfg: TrainConfig, step: int, seconds: float, model) -> float:
    """The rate at ``step`` after ``seconds``: noam, or cosine over the nearer limit's share."""
    progress = max(step / cfg.max_iters, seconds / cfg.time_budget if cfg.time_budget else 0)
    if cfg.lr_schedule == "noam":  # the paper's schedule; learning_rate is unused
        return noam_lr(step + 1, ckpt.unwrap(model).config.n_embd, max(cfg.warmup_iters, 1))
    return cosine_lr(step, progress, cfg.learning_rate, cfg.min_lr, cfg.warmup_iters)


class TrainingRun:
    """The state of one run (counters, optimizer, generators, log, bar) and its steps."""

    def __init__(self, model, tokenizer, task: Task, cfg: TrainConfig, out_dir, meta: dict,
                 health: HealthGuard, echo, lora=None):
        self.model, self.tokenizer, self.task, self.cfg = model, tokenizer, task, cfg
        self.lora = lora  # LoRA (lora.py): only its adapters train; saves merge them
        self.out_dir, self.meta, self.health, self.echo = Path(out_dir), meta, health, echo
        self.step, self.train_time = 0, 0.0  # train_time: seconds, evaluation excluded
        self.best, self.last_val, self.last_eval = math.inf, math.nan, -1
        self.interrupted = False
        self.running_loss: float | None = None
        self.window_t, self.window_tokens = 0.0, 0  # since the last log point

    # ---- once per run ------------------------------------------------------------------

    def setup(self, resume: bool, force: bool) -> None:
        """Join the processes; check the batch splits; prepare the folder, seeds, optimizer."""
        cfg = self.cfg
        self.sharded = cfg.shard
        if self.sharded:
            distributed.check_shard(cfg)
            if self.lora:
                raise UserError(distributed.LORA_AND_SHARD)
        self.info, self.device = distributed.setup(cfg.device)
        self.main = self.info.is_main
        self.task.check_split(cfg.batch_size, self.info.world_size, cfg.grad_accum)
        if self.main:
            prepare_out_dir(self.out_dir, resume, force)
        distributed.barrier(self.info)
        set_threads()
        self.dtype = pick_dtype(cfg.dtype, self.device)
        if self.sharded and self.dtype == torch.float16:  # each rank would skip steps alone
            raise UserError(distributed.SHARD_AND_FP16)
        torch.manual_seed(cfg.seed + self.info.rank)  # dropout differs across ranks, as it should
        self.model.to(self.device)
        if self.sharded:  # before the optimizer, which then holds this rank's shards
            distributed.shard(self.model, self.info, self.device)
        self.optimizer = make_optimizer(self.model, cfg.learning_rate, cfg.weight_decay,
                                        (cfg.beta1, cfg.beta2), self.device.type,
                                        cfg.optimizer, cfg.muon_lr, cfg.muon_momentum)
        # the same on every rank: one global sampler, each rank taking its part of a batch
        self.batch_gen = torch.Generator().manual_seed(cfg.seed)
        self.scaler = torch.amp.GradScaler(self.device.type) \
            if self.dtype == torch.float16 else None

    def restore(self) -> None:
        """Continue from the last checkpoint: weights, optimizer, random streams, counters."""
        folder = ckpt.list_checkpoints(self.out_dir)[-1]
        if self.sharded:
            state, optimizer_state, rng = ckpt.read_training_state(folder)
            ckpt.check_optimizer_kind(folder, optimizer_state, self.optimizer)
            distributed.set_full_state(self.model, self.optimizer,
                                       read_safetensors(folder / ckpt.MODEL_FILE),
                                       optimizer_state, str(folder))
        elif self.lora:  # the merged weights, then each target's own W, b, A and B
            self.lora.load(folder)
            state, rng = ckpt.load_training_state(folder, self.optimizer)
        else:
            ckpt.load_weights(self.model, folder / ckpt.MODEL_FILE)
            state, rng = ckpt.load_training_state(folder, self.optimizer)
        rng["torch"] = rng.get(f"torch_rank{self.info.rank}", rng["torch"])
        restore_rng(state["rng"], rng, self.batch_gen)
        self.step, self.train_time = state["step"], state["train_seconds"]
        self.best, self.last_val = state["best_val_loss"], state["val_loss"]
        self.health.start_val = state.get("start_val_loss", math.inf)
        self.last_eval = self.step
        if self.main:
            self.echo(f"resuming {self.out_dir} from step {self.step} "
                      f"({self.health.resume_label(self.last_val, self.best)})")
            skipped = sorted(p.name for p in (self.out_dir / ckpt.CHECKPOINTS).glob("step_*")
                             if p.is_dir() and p.name > folder.name)
            if skipped:  # a later folder without its trainer_state.json: not a checkpoint
                self.echo(f"note: skipped {', '.join(skipped)}: incomplete (no "
                          f"{ckpt.STATE_JSON})")

    def start(self, resume: bool, progress: bool) -> None:
        """Open log.csv (one entropy column per attention map), compile, wrap in DDP."""
        cfg = self.cfg
        names = list(self.health.entropy_columns(self.model, self.task, self.device)) \
            if self.main or self.sharded else []  # sharded: a forward pass on every rank
        self.log = CsvLog(self.out_dir / "log.csv", self.step if resume else None, names,
                          tensorboard=cfg.log == "tensorboard") if self.main else None
        self.compiled, _ = maybe_compile(self.model, cfg.compile, self.device)
        self.run_model = distributed.wrap(self.compiled, self.info, self.device, self.sharded)
        budget = cfg.time_budget
        self.bar = tqdm(total=int(budget) if budget else cfg.max_iters,
                        initial=int(self.train_time) if budget else self.step,
                        disable=not (progress and self.main), unit="s" if budget else "it",
                        dynamic_ncols=True, leave=True)
        self.model.train()

    # ---- the loop's questions ----------------------------------------------------------

    def eval_due(self) -> bool:
        return self.step % self.cfg.eval_interval == 0 and self.last_eval != self.step

    def finished(self) -> bool:
        budget = self.cfg.time_budget
        return (self.step >= self.cfg.max_iters or self.health.stop_requested
                or (budget is not None and self.train_time >= budget))

    # ---- one optimizer step ------------------------------------------------------------

    def get_lr(self) -> float:
        return learning_rate(self.cfg, self.step, self.train_time, self.model)

    def train_step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """One optimizer step; returns (this rank's share of the loss, grad norm, log now?)."""
        cfg, info, device = self.cfg, self.info, self.device
        for group in self.optimizer.param_groups:  # Muon's groups run at their own peak
            group["lr"] = lr * group.get("lr_scale", 1.0)
        t0 = time.perf_counter()
        batch = self.task.batch("train", cfg.batch_size, self.batch_gen)  # the global batch
        self.window_tokens += self.task.tokens(batch)
        scale = info.world_size / max(self.task.target_tokens(batch), 1)
        loss = torch.zeros((), device=device)
        for micro in range(cfg.grad_accum):
            loss += self.backward(batch, micro, scale)
        grad_norm = self.update()
        self.step += 1
        at_log = self.step % cfg.log_interval == 0 or self.step == cfg.max_iters
        if device.type == "cuda" and at_log:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        self.train_time = distributed.from_main(self.train_time + dt, info, device) \
            if cfg.time_budget else self.train_time + dt
        self.window_t += dt
        return loss, grad_norm, at_log

    def backward(self, batch: Batch, micro: int, scale: float) -> torch.Tensor:
        """Forward and backward of this rank's part ``micro``: loss = sum * scale."""
        info, accum = self.info, self.cfg.grad_accum
        part = self.task.split(batch, info.rank, info.world_size, micro, accum)
        part = tuple(t.to(self.device, non_blocking=True) for t in part)
        last = micro == accum - 1
        sync = contextlib.nullcontext() if last or not info.enabled \
            else distributed.no_sync(self.run_model, self.model)  # reduce once, at the last
        with sync:
            with autocast(self.device, self.dtype):
                loss_sum, _ = self.task.loss_terms(self.run_model, part)
                loss = loss_sum * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        return loss.detach()

    def update(self) -> torch.Tensor:
        """Clip the gradient norm to grad_clip, take the AdamW step, clear the gradients."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        grad_norm = distributed.full_value(grad_norm)  # sharded: the norm over all ranks
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def log_step(self, loss: torch.Tensor, lr: float, grad_norm: torch.Tensor,
                 stop_requested: bool) -> None:
        """The global train loss (the one sync of a step), log.csv, the bar, the NaN check;
        under torchrun also rank 0's Ctrl-C, so that every rank stops at the same step."""
        info = self.info
        loss_value = distributed.mean(loss, info).item()
        if not math.isfinite(loss_value):
            self.bar.close()
            kept = ckpt.list_checkpoints(self.out_dir)
            raise TrainingDiverged(
                f"the loss became {loss_value} at step {self.step}; training stopped. "
                + (f"The last good checkpoint, {kept[-1].name}, is kept in {self.out_dir}"
                   if kept else "No checkpoint had been saved yet")
                + "; try a lower --learning_rate or --grad_clip 1.0")
        if info.enabled and distributed.from_main(float(stop_requested), info, self.device):
            self.interrupted = True
        self.health.on_train_loss(loss_value)
        self.running_loss = loss_value if self.running_loss is None else \
            0.9 * self.running_loss + 0.1 * loss_value
        tok_s = self.window_tokens / max(self.window_t, 1e-9)
        if self.main:
            self.log.write(step=self.step, train_loss=loss_value, lr=lr,
                           grad_norm=float(grad_norm), tokens_per_s=tok_s,
                           elapsed_s=self.train_time)
        self.bar.set_postfix(loss=f"{self.running_loss:.3f}", lr=f"{lr:.1e}",
                             tok_s=f"{tok_s:,.0f}", refresh=False)
        self.window_t, self.window_tokens = 0.0, 0

    def advance_bar(self) -> None:
        budget = self.cfg.time_budget
        self.bar.update(min(int(self.train_time), int(budget)) - self.bar.n if budget else 1)

    # ---- evaluation and checkpoints ----------------------------------------------------

    def full_meta(self, val_loss: float) -> dict:
        return {**self.meta, "train": dataclasses.asdict(self.cfg), "step": self.step,
                "val_loss": val_loss, "best_val_loss": min(self.best, val_loss)}

    def full_weights(self):
        """What the checkpoint writers take: the model, or under --shard its state gathered
        from every rank (on rank 0; every rank calls this); under LoRA the merged weights."""
        if self.lora:  # plain weights; the live model stays wrapped
            return self.lora.merged_state()
        return distributed.full_model_state(self.model) if self.sharded else self.model

    def save_state(self, val_loss: float) -> None:
        """A checkpoint in checkpoints/: weights, optimizer, counters, every random stream."""
        weights, optimizer = self.full_weights(), self.optimizer
        if self.sharded:
            optimizer = distributed.full_optimizer_state(self.model, self.optimizer)
        rng_info, tensors = capture_rng(self.batch_gen)
        for r, t in enumerate(distributed.gather(torch.get_rng_state(), self.info)):
            if self.info.enabled:
                tensors[f"torch_rank{r}"] = t
        if self.main:
            state = {"step": self.step, "train_seconds": self.train_time,
                     "best_val_loss": min(self.best, val_loss), "val_loss": val_loss,
                     "world_size": self.info.world_size, "rng": rng_info,
                     "start_val_loss": self.health.start_val}  # step 0's, for "best" labels
            ckpt.save_checkpoint(self.out_dir, self.step, weights, self.full_meta(val_loss),
                                 self.tokenizer, optimizer, state, tensors,
                                 self.cfg.keep_last,
                                 self.lora.checkpoint_files() if self.lora else None)
        distributed.barrier(self.info)

    def evaluate_and_save(self) -> None:
        """Val loss, health notes, the best model at the top, a checkpoint, a sample."""
        cfg, step, main = self.cfg, self.step, self.main
        # every rank evaluates the same batches (cheap, and no rank waits on another)
        self.last_val = val = estimate_loss(self.compiled, self.task, "val", cfg.batch_size,
                                            cfg.eval_iters, self.device, self.dtype)
        self.last_eval = step
        is_best = step > 0 and val < self.best
        notes = self.health.on_eval(step, val)
        # under --shard a forward pass is a collective: every rank takes part, rank 0 writes
        entropy = self.health.entropy_columns(self.model, self.task, self.device) \
            if main or self.sharded else {}
        weights = self.full_weights() if is_best else None
        if main:
            self.log.write(step=step, val_loss=val, elapsed_s=self.train_time, **entropy)
            if is_best:
                ckpt.write_model_files(self.out_dir, weights, self.full_meta(val),
                                       self.tokenizer)
                if self.lora:
                    self.lora.save_best(self.out_dir)  # the adapter alone, if asked for
        if step > 0:
            self.save_state(val)
            if main:
                plot_loss_curve(self.out_dir / "log.csv", self.out_dir / "loss.png")
            self.best = min(self.best, val)
        text = self.task.sample(self.model, self.tokenizer, cfg.sample_tokens, self.device) \
            if cfg.sample_tokens and (main or self.sharded) else ""
        if main:
            self.bar.write(f"step {step}: val loss {val:.4f}"
                           + (self.health.best_label(val) if is_best else ""))
            for note in notes:
                self.bar.write(note)
            if cfg.sample_tokens:
                self.bar.write("  sample: "
                               + terminal_text(text, 2000).replace("\n", "\n          "))

    def wrap_up(self) -> None:
        """After the loop: a checkpoint to resume from if interrupted, else a last evaluation."""
        if self.interrupted:
            self.save_state(self.last_val if self.last_eval == self.step else math.nan)
        elif self.last_eval != self.step:
            self.evaluate_and_save()

    def close(self) -> None:
        self.bar.close()
        log = getattr(self, "log", None)  # None on other ranks, unset before start
        if log is not None and log.tensorboard is not None:
            log.tensorboard.close()
        if self.interrupted and self.main:
            self.echo(f"interrupted at step {self.step}; saved a checkpoint in "
                      f"{self.out_dir / ckpt.CHECKPOINTS}. Resume with: {self.info.command} "
                      f"train --out {self.out_dir} --resume")
        distributed.teardown()
