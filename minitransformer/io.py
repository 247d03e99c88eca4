"""Files at the side of the layers: atomic writes, and weights read into a model with checks.

Every file the package writes goes through ``atomic_write``: it is written to a temporary
name in the same folder, fsynced and renamed over the target, so a crash mid-write leaves
the previous file intact. Weights are read from safetensors only (nothing is unpickled) and
copied into a model only when every name and shape fits.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .errors import UserError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once: os.umask can only be read by setting it


def usual_mode(folder: bool = False) -> int:
    """The permissions a new file (0666) or folder (0777) gets under the process's umask."""
    return (0o777 if folder else 0o666) & ~_UMASK


def check_folder_path(path, flag: str = "--out") -> None:
    """Refuse ``path`` as a folder to write into where it, or a folder above it, is a file
    (``mkdir`` would fail half-way, after the work that comes first)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; give a folder")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{flag} {path} cannot be made: {above} is a file, not a folder")


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path), fsync the file and rename it onto ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, usual_mode())  # mkstemp makes 0600; give the usual permissions
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj) -> None:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
    atomic_write(path, write)


RUN_FORMAT = {"format": "minitransformer", "version": 1}  # the head of a run's config.json


def is_run_config(meta) -> bool:
    """Whether a config.json's content is a minitransformer run's (not a Hugging Face one)."""
    return isinstance(meta, dict) and meta.get("format") == RUN_FORMAT["format"]


def read_json_object(path: Path) -> dict:
    """A JSON file holding an object; unreadable or another shape is a UserError."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a JSON object")
    return value


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure as a PNG, atomically."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a damaged file is a UserError, never a crash."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError, ValueError) as e:
        raise UserError(f"{path} is not a readable safetensors file ({e}); it may be "
                        f"truncated or corrupt") from None


def load_tensors(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy named tensors into ``model``: every parameter must be there with the right shape,
    except that of tied parameters (one storage, several names) any one name will do."""
    expected = model.state_dict()
    owners: dict[int, list[str]] = {}
    for name, t in expected.items():
        owners.setdefault(t.data_ptr(), []).append(name)
    missing = [names[0] for names in owners.values() if not any(n in tensors for n in names)]
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise UserError(f"{source}: the weights do not fit the model its config describes "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise UserError(f"{source}: {name} has shape {tuple(t.shape)}, the config says "
                            f"{tuple(expected[name].shape)}")
    model.load_state_dict(tensors, strict=False)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a safetensors file into ``model`` with the checks of ``load_tensors``."""
    load_tensors(model, read_safetensors(path), str(path))
