"""Train variants side by side so that only the varied setting differs between them.

    variants   the cartesian product of the --vary lists, e.g. pos_encoding x norm_position
    fairness   every variant reads the same batches (the trainer's data generator is seeded
               by ``seed``; varying batch_size or block_size changes the windows, of course)
               and starts from the same value for every parameter it shares with the others
               (``seeding.reseed_parameters``: one generator per parameter name)
    each run   the normal trainer writes DIR/<variant>/ (best model on top, checkpoints/,
               log.csv, loss.png), health guard included
    results    final and best val loss, tokens/s, parameters, and the val loss at each
               --eval_lengths window (the best model), in results.md / results.csv / .json

The family (``families/``) supplies the corpus, the model and the task; nothing here knows
what a GPT is.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import TrainConfig, config_from_dict
from ..errors import UserError
from ..families.base import CannotEvaluate, Prepared
from ..io import atomic_write_json, check_folder_path
from ..presets import with_preset
from ..training import checkpoint as ckpt
from ..training.device import pick_device
from ..training.health import HealthGuard
from ..training.trainer import train
from .runs import split_for
from .seeding import reseed_parameters


@dataclass
class Variant:
    """One combination of varied settings, e.g. {"pos_encoding": "rope"}."""

    name: str  # its folder under DIR
    fields: dict

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fields.items())


@dataclass
class VariantResult:
    variant: Variant
    final_val_loss: float
    best_val_loss: float
    tokens_per_s: float
    parameters: int
    steps: int
    train_seconds: float
    stopped_early: bool = False
    warnings: list[str] = field(default_factory=list)
    lengths: dict[int, float | str] = field(default_factory=dict)  # eval length -> loss/reason


def parse_vary(specs: list[str], convert) -> list[Variant]:
    """["pos_encoding=rope,alibi", "norm_position=pre,post"] -> the product of the lists.

    ``convert(field, text)`` turns a value into the field's type (raising UserError).
    Folder names are the values joined by "-" (``rope-pre``).
    """
    axes: dict[str, list] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not name or not items:
            raise UserError(f"--vary {spec!r}: write FIELD=a,b,... (e.g. "
                            f"pos_encoding=sinusoidal,rope)")
        if name in axes:
            raise UserError(f"--vary names {name} twice; list all its values once")
        if len(set(items)) < len(items):
            raise UserError(f"--vary {spec!r} repeats a value")
        axes[name] = [convert(name, v) for v in items]
    combos = list(itertools.product(*axes.values()))
    if len(combos) < 2:
        raise UserError("--vary gives a single variant: list at least two values to compare")
    variants = []
    for combo in combos:
        fields = dict(zip(axes, combo, strict=True))
        name = "-".join(_slug(v) for v in combo)
        variants.append(Variant(name, fields))
    return variants


def _slug(value) -> str:
    text = str(value).lower()
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text)


def check_out_dir(out_dir: Path, variants: list[Variant], force: bool) -> None:
    """Refuse an --out that holds a training run itself (always), or, unless ``force``, an
    earlier comparison: its results files or runs of the same names."""
    check_folder_path(out_dir)
    if ckpt.holds_run(out_dir):
        raise UserError(f"{out_dir} holds a training run; give the comparison a folder of its "
                        f"own")
    taken = [v.name for v in variants if ckpt.holds_run(out_dir / v.name)]
    if (out_dir / ckpt.COMPARISON_RESULTS).exists() and not force:
        raise UserError(f"{out_dir} already holds a comparison's results; pass --force to "
                        f"replace them or choose another --out")
    if taken and not force:
        raise UserError(f"{out_dir} already holds runs ({', '.join(taken)}); pass --force to "
                        f"replace them or choose another --out")


def tokens_per_second(log_path: Path) -> float:
    """Training throughput over the whole run: the harmonic mean of the logged windows
    (each covers the same number of steps, so this is total tokens / total time)."""
    with open(log_path, newline="", encoding="utf-8") as f:
        speeds = [float(r["tokens_per_s"]) for r in csv.DictReader(f) if r.get("tokens_per_s")]
    speeds = [s for s in speeds if s > 0]
    return len(speeds) / sum(1 / s for s in speeds) if speeds else math.nan


def run_compare(family, prepared: Prepared, base: dict, variants: list[Variant], out_dir,
                eval_lengths: list[int] = (), early_stop: bool = False, force: bool = False,
                progress: bool = True, echo=print) -> list[VariantResult]:
    """Train every variant into ``out_dir/<variant>``; return their results (also written as
    results.md, results.csv, results.json and compare.png in ``out_dir``)."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, variants, force)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for i, variant in enumerate(variants, 1):
        model_fields, train_fields = split_for(family, with_preset(base, variant.fields))
        train_cfg = config_from_dict(TrainConfig, train_fields)
        torch.manual_seed(train_cfg.seed)
        built = family.build(prepared, model_fields, train_cfg.seed)
        reseed_parameters(built.model, train_cfg.seed, built.config.init, built.init_depth)
        built.meta["compare"] = {"variant": variant.name, "fields": variant.fields}
        n_params = built.model.num_params()
        budget = f"{train_cfg.max_iters:,} steps"  # whichever limit comes first ends it
        if train_cfg.time_budget:
            budget = f"{train_cfg.time_budget:g}s or {budget}"
        echo(f"[{i}/{len(variants)}] {variant.label}: {n_params:,} parameters, {budget}")
        run_dir = out_dir / variant.name
        health = HealthGuard(early_stop=early_stop)
        result = train(built.model, prepared.tokenizer, built.task, train_cfg, run_dir,
                       built.meta, force=force, progress=progress, echo=echo, health=health)
        if result.interrupted:
            raise KeyboardInterrupt
        lengths = {}
        if eval_lengths:
            device = pick_device(train_cfg.device)
            ckpt.load_weights(built.model, run_dir / ckpt.MODEL_FILE)  # the best model
            built.model.to(device)
            for length in eval_lengths:
                try:
                    lengths[length] = family.loss_at_length(built.model, prepared, length,
                                                            device)
                except CannotEvaluate as e:
                    lengths[length] = str(e)
        results.append(VariantResult(
            variant, result.val_loss, result.best_val_loss,
            tokens_per_second(run_dir / "log.csv"), n_params, result.step,
            result.train_seconds, result.stopped_early, list(health.warnings), lengths))
        echo(f"    val loss {result.val_loss:.4f} (best {result.best_val_loss:.4f}) after "
             f"{result.step} steps" + "".join(
                 f"; @{k}: {v:.4f}" if isinstance(v, float) else f"; @{k}: {v}"
                 for k, v in lengths.items()))
    return results


def write_results(results: list[VariantResult], out_dir, settings: dict) -> list[Path]:
    """results.md, results.csv, results.json and compare.png in ``out_dir``; returns paths."""
    from .report import markdown_table, plot_comparison, table_rows

    out_dir = Path(out_dir)
    header, rows = table_rows(results)
    with open(out_dir / "results.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    (out_dir / "results.md").write_text(markdown_table(results) + "\n", encoding="utf-8")
    payload = {"settings": settings, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
               "results": [{**dataclasses.asdict(r), "variant": dataclasses.asdict(r.variant),
                            "lengths": {str(k): v for k, v in r.lengths.items()}}
                           for r in results]}
    atomic_write_json(out_dir / "results.json", payload)
    png = out_dir / "compare.png"
    plot_comparison(results, out_dir, png, block_size=settings.get("block_size"),
                    x_axis="time" if settings.get("time_budget") else "step")
    return [out_dir / "results.md", out_dir / "results.csv", out_dir / "results.json", png]
