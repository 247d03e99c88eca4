"""Training loop, schedules, optimizer set-up and checkpoints."""

from .checkpoint import load_checkpoint

__all__ = ["load_checkpoint"]
