"""Model families. ``FAMILIES`` maps a family name to its (config class, model class)."""

from ..config import GPTConfig
from .gpt import GPT

FAMILIES = {"gpt": (GPTConfig, GPT)}

__all__ = ["FAMILIES", "GPT", "GPTConfig"]
