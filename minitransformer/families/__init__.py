"""The model families, registered once: every command reaches a family through here.

    FAMILIES       name -> family object (gpt, encoder, seq2seq)
    get_family     a name from the command line or a config.json
    choose_family  --model, or what the data implies (sentence pairs: seq2seq)
    load_run       a run or checkpoint folder -> Run(model, tokenizer, meta, family)

Adding a family: one module beside these with a ``FAMILY`` object (``base.Family``), imported
here and added to the tuple ``FAMILIES`` is built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..io import load_weights
from ..training import checkpoint as ckpt
from . import encoder, gpt, seq2seq
from .base import Built, CannotEvaluate, Family, NotApplicable, Prepared

FAMILIES: dict[str, Family] = {f.name: f for f in (gpt.FAMILY, encoder.FAMILY, seq2seq.FAMILY)}


def get_family(name: str | None) -> Family:
    if name not in FAMILIES:
        raise UserError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def choose_family(name: str | None, source: str | None = None,
                  source_tgt: str | None = None) -> Family:
    """--model NAME, else the family the data implies, else GPT."""
    if name is not None:
        return get_family(name)
    for family in FAMILIES.values():
        if family.claims(source, source_tgt):
            return family
    return FAMILIES["gpt"]


def family_of(meta: dict) -> Family:
    """The family a config.json names (the one dispatch key for loading)."""
    name = meta.get("family")
    if name not in FAMILIES:
        raise UserError(f"unknown model family {name!r} in config.json")
    return FAMILIES[name]


@dataclass
class Run:
    """A loaded run folder (its best model) or checkpoint folder."""

    model: torch.nn.Module
    tokenizer: Any
    meta: dict
    family: Family
    folder: Path


def load_run(path, which: str | None = None, device: str | torch.device = "cpu") -> Run:
    """Load a run folder's best model (``which`` "best", or None) or newest checkpoint
    ("last"); ``which`` given for a checkpoint folder is an error."""
    folder = ckpt.resolve_model_dir(path, which)
    meta = ckpt.read_meta(folder)
    family = family_of(meta)
    model = family.build_model(meta)
    load_weights(model, folder / ckpt.MODEL_FILE)
    tokenizer = ckpt.read_tokenizer(folder)
    model.to(device).eval()
    return Run(model, tokenizer, meta, family, folder)


def load_checkpoint(path, which: str | None = None, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a run folder or checkpoint folder."""
    run = load_run(path, which, device)
    return run.model, run.tokenizer


__all__ = ["FAMILIES", "Built", "CannotEvaluate", "Family", "NotApplicable", "Prepared", "Run",
           "choose_family", "family_of", "get_family", "load_checkpoint", "load_run"]
