"""Model families. ``FAMILIES`` maps a family name to its (config class, model class)."""

from ..config import EncoderConfig, GPTConfig, Seq2SeqConfig
from .encoder import EncoderModel
from .gpt import GPT
from .seq2seq import Seq2SeqTransformer

FAMILIES = {"gpt": (GPTConfig, GPT), "encoder": (EncoderConfig, EncoderModel),
            "seq2seq": (Seq2SeqConfig, Seq2SeqTransformer)}

__all__ = ["FAMILIES", "GPT", "EncoderConfig", "EncoderModel", "GPTConfig", "Seq2SeqConfig",
           "Seq2SeqTransformer"]
