"""minitransformer: the Transformer of "Attention Is All You Need", written from scratch.

    from minitransformer import GPT, GPTConfig, load_checkpoint
    model, tokenizer = load_checkpoint("runs/shakespeare")

The names below are imported when first used (PEP 562), so that ``import minitransformer``
and the ``minitransformer`` command start without PyTorch until something needs it (the
command can then say "interrupted" to a Ctrl-C during that import, not print a traceback).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> the module (relative to this package) that defines it
_WHERE = {
    "EncoderConfig": ".config", "GPTConfig": ".config", "Seq2SeqConfig": ".config",
    "TrainConfig": ".config", "UserError": ".errors", "FAMILIES": ".families",
    "load_checkpoint": ".families", "load_run": ".families", "load_hf": ".interop",
    "save_hf": ".interop", "GPT": ".models", "EncoderModel": ".models.encoder",
    "Seq2SeqTransformer": ".models.seq2seq", "MultiHeadAttention": ".nn",
    "scaled_dot_product_attention": ".nn", "BPETokenizer": ".tokenizers",
    "CharTokenizer": ".tokenizers",
}

__all__ = ["FAMILIES", "GPT", "PRESETS", "BPETokenizer", "CharTokenizer", "EncoderConfig",
           "EncoderModel", "GPTConfig", "MultiHeadAttention", "Seq2SeqConfig",
           "Seq2SeqTransformer", "TrainConfig", "UserError", "load_checkpoint", "load_hf",
           "load_run", "save_hf", "scaled_dot_product_attention"]  # _WHERE's names, PRESETS


# the modules a plain ``import minitransformer`` once loaded with the names above: still
# reachable as attributes (``minitransformer.models.GPT``)
_MODULES = {"config", "data", "errors", "families", "interop", "io", "models", "nn", "presets",
            "tokenizers", "training", "viz"}


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)  # sets the attribute itself
    if name == "PRESETS":  # every family's named settings: {family: {preset: fields}}
        value = {n: family.presets for n, family in __getattr__("FAMILIES").items()}
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what editors and type checkers see
    from .config import EncoderConfig, GPTConfig, Seq2SeqConfig, TrainConfig
    from .errors import UserError
    from .families import FAMILIES, load_checkpoint, load_run
    from .interop import load_hf, save_hf
    from .models import GPT
    from .models.encoder import EncoderModel
    from .models.seq2seq import Seq2SeqTransformer
    from .nn import MultiHeadAttention, scaled_dot_product_attention
    from .tokenizers import BPETokenizer, CharTokenizer

    PRESETS: dict[str, dict[str, dict]]
