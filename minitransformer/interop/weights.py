"""Reading a Hugging Face checkpoint folder: config.json and the weights, without unpickling.

Weights come from ``model.safetensors`` (or a sharded ``model.safetensors.index.json``); an
old ``pytorch_model.bin`` is read only through ``torch.load(weights_only=True)``, which
refuses anything but tensors and plain containers.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import UserError
from ..io import load_tensors, read_json_object


def hf_folder(path) -> Path:
    """The folder, checked to exist and to hold a config.json."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file; give the Hugging Face model folder it lies in "
                        f"(config.json, the weights and the tokenizer files)")
    if not folder.is_dir():
        raise UserError(f"no such Hugging Face model folder: {folder}")
    if not (folder / "config.json").exists():
        raise UserError(f"{folder} is not a Hugging Face model folder: config.json is missing")
    return folder


def read_hf_config(folder: Path) -> dict:
    return read_json_object(folder / "config.json")


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (OSError, SafetensorError, ValueError) as e:
        raise UserError(f"{path} is not a readable safetensors file ({e})") from None


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint, converted to float32 (integer buffers kept as they are)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        tensors = _safetensors(single)
    elif index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                .values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"cannot read {index}: {e}") from None
        tensors = {}
        for shard in shards:
            tensors.update(_safetensors(folder / shard))
    elif (folder / "pytorch_model.bin").exists():
        try:
            tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu",
                                 weights_only=True)
        except Exception as e:  # noqa: BLE001 - any failure here means an unusable file
            if isinstance(e, pickle.UnpicklingError) and \
                    (found := re.search(r"GLOBAL ([\w.]+)", str(e))):  # not a plain tensor
                raise UserError(f"cannot read {folder / 'pytorch_model.bin'} as plain tensors: "
                                f"it holds other objects ({found.group(1)}), which are never "
                                f"unpickled; convert it to model.safetensors where it comes "
                                f"from") from None
            with open(folder / "pytorch_model.bin", "rb") as f:
                if f.read(40).startswith(b"version https://git-lfs"):
                    raise UserError(f"{folder / 'pytorch_model.bin'} is a Git LFS pointer, not "
                                    f"the weights: fetch them (git lfs pull)") from None
            reason = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
            raise UserError(f"cannot read {folder / 'pytorch_model.bin'} as plain tensors "
                            f"({type(e).__name__}: {reason[0] if reason else ''})") from None
        if not isinstance(tensors, dict):
            raise UserError(f"{folder / 'pytorch_model.bin'} does not hold a state dict")
    else:
        raise UserError(f"{folder} holds no weights: expected model.safetensors "
                        f"(or pytorch_model.bin)")
    return {k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()}


def load_mapped(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``tensors`` (already renamed to our names) into ``model``, with the checks our own
    checkpoints get."""
    load_tensors(model, tensors, source)


class TensorTaker:
    """Hands out a checkpoint's tensors by name, each at most once (``take(name)``), then
    ``check_all_used`` refuses a checkpoint with tensors the model would not use. ``what``
    names the checkpoint's format in the messages ("GPT-2", "Llama")."""

    def __init__(self, tensors: dict[str, torch.Tensor], what: str):
        self.tensors, self.what, self.used = tensors, what, set()

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise UserError(f"the {self.what} checkpoint lacks {name}")
        self.used.add(name)
        return self.tensors[name]

    def check_all_used(self, ignore: tuple[str, ...] = ("lm_head.weight",)) -> None:
        """``ignore``: by default a saved copy of a tied embedding."""
        left = sorted(set(self.tensors) - self.used - set(ignore))
        if left:
            raise UserError(f"the {self.what} checkpoint has weights this model would not "
                            f"use: {left[:5]}")
