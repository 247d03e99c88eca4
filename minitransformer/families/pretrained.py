"""Where ``train --init_from PATH`` starts: a pretrained folder, read once.

PATH is either

- a Hugging Face folder: config.json, the weights (model.safetensors, read without
  unpickling) and the tokenizer files (tokenizer.json, or GPT-2's vocab.json + merges.txt, or
  BERT's vocab.txt). GPT-2, Llama and Qwen3 become our GPT, BERT our encoder
  (``interop.load_hf``); the tokenizer is kept as it is, inside our ``BPETokenizer`` wrapper,
  so the run folder saves it like any other;
- one of our run folders (or a checkpoint folder), of any family: its best model and its
  own tokenizer.

The family then builds the run's model with the same architecture and copies the weights in
(``Family.start_from`` in base.py); the run's config.json records the source under
``init_from``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..interop import hf_model_class, load_hf, load_hf_tokenizer
from ..interop.tokenizer import as_char_tokenizer
from ..io import read_json_object
from ..tokenizers import BPETokenizer
from ..training import checkpoint as ckpt
from . import FAMILIES, load_run
from .base import Family, chain_start


@dataclass
class Source:
    """A pretrained model to start from."""

    path: Path
    kind: str  # "hf" (a Hugging Face folder) or "run" (one of ours)
    family: Family  # the family whose model it is
    config: Any  # that family's model config
    state: dict[str, torch.Tensor]  # the weights, in our names
    tokenizer: Any  # ours: CharTokenizer or BPETokenizer
    meta: dict  # a run's config.json; a Hugging Face folder's {"model_type": ...}

    @property
    def origin(self) -> dict:
        """What the new run's config.json records under "init_from"."""
        out = {"path": str(self.path.resolve()), "kind": self.kind, "family": self.family.name}
        if self.kind == "hf":
            out["model_type"] = self.meta.get("model_type")
        else:
            out["step"] = self.meta.get("step")
        start = {"special_tokens": self.meta.get("special_tokens"),
                 "positions": self.config.block_size} if self.kind == "hf" \
            else chain_start(self.meta)
        return {**out, **{k: v for k, v in start.items() if v}}

    def describe(self) -> str:
        if self.kind == "hf":
            return (f"Hugging Face {self.meta.get('model_type')} folder {self.path} "
                    f"({self.tokenizer.vocab_size:,}-id tokenizer)")
        return (f"{self.family.title} run {self.path} (step {self.meta.get('step', '?')}, "
                f"{self.tokenizer.kind} tokenizer)")


def read_source(path) -> Source:
    """The folder ``--init_from`` names; anything that is not a model is a UserError."""
    folder, meta = _model_folder(path, "--init_from")
    return _run_source(folder) if meta is None else _hf_source(folder, meta)


def read_tokenizer_source(path, flag: str = "--tokenizer_from") -> tuple[Family, Any, str]:
    """(family, tokenizer, description) of the model folder ``path`` (what ``--init_from``
    takes), without its weights: ``prepare --tokenizer_from`` encodes a corpus with the
    tokenizer a fine-tuning run from that folder will use."""
    folder, meta = _model_folder(path, flag)
    if meta is None:
        found = ckpt.resolve_model_dir(folder)
        family = FAMILIES[ckpt.read_meta(found)["family"]]
        tokenizer = ckpt.read_tokenizer(found)
        return family, tokenizer, f"the {family.title} run {folder}"
    try:
        model_class = hf_model_class(folder)
        tokenizer = load_hf_tokenizer(folder)
    except UserError as e:
        raise UserError(f"{flag} {folder}: {' '.join(str(e).split())}") from None
    family = next(f for f in FAMILIES.values() if f.model_class is model_class)
    return family, _ours(tokenizer), f"the Hugging Face {meta.get('model_type')} folder {folder}"


def _model_folder(path, flag: str) -> tuple[Path, dict | None]:
    """(the folder, its Hugging Face config; None for one of our runs or checkpoints)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{flag} {folder} is a file; give the folder of a run, a checkpoint "
                        f"or a Hugging Face model")
    if not folder.is_dir():
        raise UserError(f"{flag} {folder}: no such folder")
    config = folder / ckpt.CONFIG_FILE
    if not config.exists():
        if ckpt.list_checkpoints(folder):  # a run that has not saved a best model yet
            return folder, None
        raise UserError(f"{flag} {folder} is not a model folder: it has no config.json")
    meta = read_json_object(config)
    if meta.get("format") == "minitransformer":
        return folder, None
    if meta.get("model_type") is None and not meta.get("architectures"):
        raise UserError(f"{flag} {folder} is not a model folder: its config.json names "
                        f"no model_type")
    return folder, meta


def _ours(tokenizer):
    """A Hugging Face folder's tokenizer as ours (a char run's export reads as its run did)."""
    return as_char_tokenizer(tokenizer) or BPETokenizer(tokenizer.tokenizer)


def _run_source(folder: Path) -> Source:
    run = load_run(folder)
    state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    return Source(folder, "run", run.family, run.model.config, state, run.tokenizer, run.meta)


def _hf_source(folder: Path, meta: dict) -> Source:
    try:
        model = load_hf(folder)
        tokenizer = load_hf_tokenizer(folder)
    except UserError as e:  # on one line, whatever the libraries below it said
        raise UserError(f"--init_from {folder}: {' '.join(str(e).split())}") from None
    family = next((f for f in FAMILIES.values() if isinstance(model, f.model_class)), None)
    if family is None:
        raise UserError(f"--init_from {folder}: a {type(model).__name__} cannot be trained")
    return Source(folder, "hf", family, dataclasses.replace(model.config),
                  dict(model.state_dict()), _ours(tokenizer),
                  {"model_type": meta.get("model_type"), "special_tokens": tokenizer.roles})


__all__ = ["Source", "read_source", "read_tokenizer_source"]
