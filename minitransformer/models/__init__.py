"""Model families. ``FAMILIES`` maps a family name to its (config class, model class)."""

from ..config import EncoderConfig, GPTConfig
from .encoder import EncoderModel
from .gpt import GPT

FAMILIES = {"gpt": (GPTConfig, GPT), "encoder": (EncoderConfig, EncoderModel)}

__all__ = ["FAMILIES", "GPT", "EncoderConfig", "EncoderModel", "GPTConfig"]
