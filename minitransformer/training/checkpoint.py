"""Checkpoints: safetensors for tensors, JSON for everything else; every write is atomic.

A run folder looks like this::

    RUN/model.safetensors, config.json, tokenizer.json   the best model by val loss
    RUN/log.csv                                          losses, learning rate, speed
    RUN/checkpoints/step_0000500/                         the last few checkpoints, each
        model.safetensors config.json tokenizer.json      a loadable model plus
        trainer_state.safetensors trainer_state.json      the state to resume exactly

Files are written to a temporary name in the same folder, fsynced and renamed over the
target, so a crash mid-save leaves the previous file intact. Checkpoint folders are built
under a temporary name and renamed into place. Loading never unpickles anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..data.shards import MANIFEST, is_prepared
from ..errors import UserError
from ..io import (
    atomic_write,
    atomic_write_json,
    fsync_dir,
    is_run_config,
    read_json_object,
    usual_mode,
)
from ..io import load_weights as _load_weights
from ..tokenizers import tokenizer_from_dict
from .state import LOG_FIELDS

MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE = "model.safetensors", "config.json", "tokenizer.json"
STATE_TENSORS, STATE_JSON = "trainer_state.safetensors", "trainer_state.json"
CHECKPOINTS = "checkpoints"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside a DDP wrapper and/or torch.compile (no key prefixes)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module  # DistributedDataParallel
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod  # torch.compile
        elif hasattr(model, "_compiled") and isinstance(getattr(model, "eager", None),
                                                       torch.nn.Module):
            model = model.eager  # device.EagerFallback
        else:
            return model


def model_tensors(model) -> dict[str, torch.Tensor]:
    """The state dict with each shared (tied) tensor stored once, contiguous, on the CPU.
    ``model`` is a module, or a state dict already gathered from the ranks of a --shard run."""
    out, seen = {}, set()
    state = model if isinstance(model, dict) else unwrap(model).state_dict()
    for name, t in state.items():
        key = (t.data_ptr(), t.shape, t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().to("cpu").contiguous()
    return out


def write_model_files(folder: Path, model, meta: dict, tokenizer) -> None:
    """model.safetensors + config.json + tokenizer.json, each atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = model_tensors(model)
    atomic_write(folder / MODEL_FILE, lambda tmp: save_file(tensors, tmp, {"format": "pt"}))
    atomic_write_json(folder / TOKENIZER_FILE, tokenizer.to_dict())
    atomic_write_json(folder / CONFIG_FILE, meta)


def _flatten_optimizer(optimizer) -> tuple[dict, dict]:
    """``optimizer``: an optimizer, or its state dict (a --shard run's, gathered)."""
    sd = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    # format 2 names the optimizer; a state without "kind" (format 1) is AdamW's
    return tensors, {"format": 2, "kind": groups_kind(sd["param_groups"]),
                     "param_groups": sd["param_groups"]}


def groups_kind(param_groups: list[dict]) -> str:
    """"muon" for Muon + AdamW (``MuonWithAdamW`` marks its groups), else "adamw"."""
    return "muon" if any(g.get("optimizer") == "muon" for g in param_groups) else "adamw"


def check_optimizer_kind(folder: Path, saved_state: dict, optimizer) -> None:
    """Refuse to load one optimizer's saved state into the other."""
    saved = groups_kind(saved_state["param_groups"])
    wanted = groups_kind(optimizer.state_dict()["param_groups"])
    if saved != wanted:
        raise UserError(f"{folder} holds {saved}'s optimizer state; resume it with "
                        f"--optimizer {saved} (not {wanted})")


def _unflatten_optimizer(tensors: dict, info: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": info["param_groups"]}


def save_checkpoint(out_dir: Path, step: int, model, meta: dict, tokenizer, optimizer,
                    state: dict, state_tensors: dict, keep_last: int,
                    extra_files: dict | None = None) -> Path:
    """Write checkpoints/step_N (model + resume state) atomically; keep the newest keep_last.
    ``extra_files``: {file name: tensors} more safetensors files in the folder (LoRA's)."""
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-step_{step:07d}-"))
    os.chmod(tmp, usual_mode(folder=True))  # mkdtemp makes 0700
    try:
        write_model_files(tmp, model, meta, tokenizer)
        opt_tensors, opt_info = _flatten_optimizer(optimizer)
        all_tensors = {**opt_tensors, **{f"rng.{k}": v for k, v in state_tensors.items()}}
        atomic_write(tmp / STATE_TENSORS, lambda p: save_file(all_tensors, p))
        for name, extra in (extra_files or {}).items():
            atomic_write(tmp / name, lambda p, t=extra: save_file(t, p))
        atomic_write_json(tmp / STATE_JSON, {**state, "optimizer": opt_info})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(out_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def outputs_in(folder) -> list[str]:
    """The files a new run writes (besides config.json and checkpoints/) already in
    ``folder``: a user's own, which ``train --out`` must not write over unasked. A log.csv
    with a run's header (and its loss.png) is a run's that stopped before its first
    checkpoint: the same command may start again over it."""
    folder = Path(folder)
    names = [MODEL_FILE, TOKENIZER_FILE]
    try:
        with open(folder / "log.csv", encoding="utf-8") as f:
            ours = f.readline().startswith(",".join(LOG_FIELDS))
    except (OSError, UnicodeDecodeError):
        ours = False
    return [n for n in names + ([] if ours else ["log.csv", "loss.png"])
            if (folder / n).exists()]


def holds_run(folder) -> bool:
    """Whether ``folder`` holds a training run, or a model ``train --out`` would write over:
    a config.json (a run's or another one) or a checkpoints/ folder."""
    return (Path(folder) / CONFIG_FILE).exists() or (Path(folder) / CHECKPOINTS).exists()


COMPARISON_RESULTS = "results.json"  # what marks a folder written by compare


def refuse_other_output(out_dir: Path) -> None:
    """A run's --out must not be what ``prepare`` or ``compare`` wrote: prepared data, or a
    comparison (its results beside runs of its own)."""
    if (out_dir / MANIFEST).exists():
        raise UserError(f"--out {out_dir} holds prepared data ({MANIFEST}); give the run a "
                        f"folder of its own (train reads prepared data with --data "
                        f"{out_dir})")
    if (out_dir / COMPARISON_RESULTS).exists() and any(
            holds_run(sub) for sub in out_dir.iterdir() if sub.is_dir()):
        raise UserError(f"--out {out_dir} holds a comparison (its results and its runs); give "
                        f"the run a folder of its own")


def _is_run_or_checkpoint(folder: Path) -> bool:
    try:
        ours = is_run_config(json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):  # no config.json, or not JSON
        ours = False
    return ours or bool(list_checkpoints(folder)) or (folder / STATE_JSON).exists()


def run_containing(path) -> Path | None:
    """The minitransformer run (or checkpoint) folder that ``path`` is, or lies in the
    checkpoints/ of; None for any other path. A run: its config.json is one of ours or it
    has complete checkpoints; a checkpoint folder has its trainer_state.json."""
    folder = Path(path).resolve()
    if _is_run_or_checkpoint(folder):
        return folder
    for inner in (folder, *folder.parents):  # RUN/checkpoints(/...): the run it is in
        if inner.name == CHECKPOINTS and _is_run_or_checkpoint(inner.parent):
            return inner.parent
    return None


def run_around(path) -> Path | None:
    """The run that ``path`` lies inside (its checkpoints/, or a checkpoint folder in it);
    None for a run folder itself or any other path."""
    inside = run_containing(path)
    if inside is not None and inside.parent.name == CHECKPOINTS:  # a checkpoint folder
        return inside.parent.parent
    return inside if inside != Path(path).resolve() else None


def remove_checkpoints(out_dir: Path) -> None:
    """Remove a run's checkpoints (``step_*`` folders, saves cut short) and then
    ``checkpoints/`` itself where nothing else is in it (``train --force``): files of another
    kind there are not the run's to remove."""
    folder = Path(out_dir) / CHECKPOINTS
    for entry in folder.iterdir() if folder.is_dir() else []:
        if entry.is_dir() and entry.name.startswith(("step_", ".tmp-step_")):
            shutil.rmtree(entry, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and p.name.startswith("step_") and (p / STATE_JSON).exists()]
    return sorted(found, key=lambda p: p.name)


def why_no_checkpoint(out_dir: Path) -> str:
    """Why ``list_checkpoints`` finds none: no checkpoints/ folder, or none complete in it."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return f"it has no {CHECKPOINTS}/ folder"
    started = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not started:
        return f"its {CHECKPOINTS}/ folder is empty"
    return (f"its {CHECKPOINTS}/ folder holds no complete checkpoint ({', '.join(started[:3])} "
            f"{'has' if len(started) == 1 else 'have'} no {STATE_JSON}: a save cut short)")


# What every trainer_state.json holds (``save_checkpoint``), which a resume reads
STATE_KEYS = ("step", "train_seconds", "val_loss", "best_val_loss", "rng", "optimizer")


def read_state(folder: Path) -> dict:
    """trainer_state.json of a checkpoint folder (step, train_seconds, ...); damaged, the
    error says how to go back to the checkpoint before it."""
    try:
        state = read_json_object(Path(folder) / STATE_JSON)
    except UserError as e:
        raise UserError(f"{e}{_go_back(Path(folder))}") from None
    _check_state(state, Path(folder))
    return state


def _check_state(state, folder: Path) -> None:
    """A UserError for a trainer_state.json that is not an object or lacks a key."""
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else None
    if missing is None or missing:
        what = "is not a JSON object" if missing is None else f"lacks {', '.join(missing)}"
        raise UserError(f"{folder / STATE_JSON} {what}: the checkpoint is damaged"
                        f"{_go_back(folder)}")


def load_training_state(folder: Path, optimizer) -> tuple[dict, dict]:
    """Restore the optimizer in place; return (json state, rng tensors)."""
    state, optimizer_state, rng = read_training_state(folder)
    try:
        check_optimizer_kind(folder, optimizer_state, optimizer)
        optimizer.load_state_dict(optimizer_state)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise UserError(f"cannot load the optimizer's state in {folder} ({type(e).__name__}: "
                        f"{str(e)[:200]}): the checkpoint is damaged{_go_back(Path(folder))}") \
            from None
    return state, rng


def _check_groups(groups) -> None:
    """A ValueError unless ``groups`` reads as an optimizer's parameter groups: a list of
    objects, each with its parameters' indices. Both resumes read them, the single process's
    through ``load_state_dict`` and --shard's by name (``distributed.set_full_state``)."""
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"param_groups is {str(groups)[:40]!r}, not a list of groups")
    for g in groups:
        params = g.get("params") if isinstance(g, dict) else None
        if not isinstance(params, list) or not all(type(i) is int for i in params):
            raise ValueError(f"a parameter group is {str(g)[:40]!r}, without its params")


def read_training_state(folder: Path) -> tuple[dict, dict, dict]:
    """(json state, the optimizer's state dict, rng tensors) of a checkpoint folder."""
    folder = Path(folder)
    try:
        tensors = load_file(folder / STATE_TENSORS)
        with open(folder / STATE_JSON, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError, SafetensorError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read the training state in {folder}: {reason}"
                        f"{_go_back(folder)}") from None
    _check_state(state, folder)
    try:
        optimizer_state = _unflatten_optimizer(tensors, state.pop("optimizer"))
        _check_groups(optimizer_state["param_groups"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise UserError(f"cannot read the optimizer's state in {folder} ({type(e).__name__}: "
                        f"{e}): the checkpoint is damaged{_go_back(folder)}") from None
    rng = {k[len("rng."):]: v for k, v in tensors.items() if k.startswith("rng.")}
    return state, optimizer_state, rng


def load_weights(model, path) -> None:
    """A model file into ``model``; in a damaged checkpoint the error says how to go back."""
    try:
        _load_weights(model, Path(path))
    except UserError as e:
        raise UserError(f"{e}{_go_back(Path(path).parent)}") from None


def _go_back(folder: Path) -> str:
    """For a damaged checkpoint of a run: how to go back to the complete one before it."""
    folder = Path(folder)
    if folder.parent.name != CHECKPOINTS:
        return ""
    earlier = [p for p in list_checkpoints(folder.parent.parent) if p.name < folder.name]
    return (f"; remove that folder to go back to {earlier[-1].name}, the checkpoint before it"
            if earlier else "")


def resolve_model_dir(path, which: str | None = None) -> Path:
    """The folder to load: the run folder itself (best, the default when ``which`` is None)
    or its newest checkpoint (last). A checkpoint folder is loaded as it is: ``which`` given
    for one is an error, not ignored."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such checkpoint folder: {path}")
    if not path.is_dir():
        raise UserError(f"{path} is a file; give a run folder or a checkpoint folder")
    run = path.resolve().parent.parent  # the run, if path is one of its checkpoints
    if which == "best" and path.resolve() in [p.resolve() for p in list_checkpoints(run)]:
        raise UserError(f"{path} is one checkpoint of {run}, loaded as it is: drop --which "
                        f"(the run's best model is {run} itself)")
    if which == "last":
        found = list_checkpoints(path)
        if found:
            return found[-1]
        raise UserError(f"{path} holds no checkpoints/ folder to pick the last one from"
                        + ("; a checkpoint folder is loaded as it is: drop --which"
                           if (path / MODEL_FILE).exists() else ""))
    elif which not in (None, "best"):
        raise UserError(f"--which must be best or last, got {which!r}")
    if not (path / CONFIG_FILE).exists() and list_checkpoints(path):
        return list_checkpoints(path)[-1]  # training has not written a best model yet
    return path


def read_meta(folder: Path) -> dict:
    folder = Path(folder)
    if is_prepared(folder):
        raise UserError(f"{folder} holds prepared data, not a model: train --data {folder} "
                        f"--out RUN trains one on it")
    if folder.name == CHECKPOINTS and (steps := list_checkpoints(folder.parent)):
        raise UserError(f"{folder} holds a run's checkpoints: give the run folder "
                        f"{folder.parent} (its best model, or --which last) or one checkpoint "
                        f"in it, e.g. {steps[-1]}")
    for name in (CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE):
        if not (folder / name).exists():
            raise UserError(f"{folder} is not a complete checkpoint: {name} is missing"
                            f"{_go_back(folder)}")
    meta = read_json_object(folder / CONFIG_FILE)
    if "model_type" in meta and not is_run_config(meta):
        raise UserError(f"{folder} holds a Hugging Face model, not a minitransformer run: "
                        f"sample --hf reads it, train --init_from starts a run from it")
    if "model" not in meta or "family" not in meta:
        raise UserError(f"{folder / CONFIG_FILE} is not a minitransformer config")
    return meta


def read_tokenizer(folder: Path):
    """The tokenizer.json of a run or checkpoint folder; a damaged one is a user error."""
    path = Path(folder) / TOKENIZER_FILE
    try:
        with open(path, encoding="utf-8") as f:
            return tokenizer_from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
