"""Training health, checked at every evaluation of every training run.

    overfitting   since the previous evaluation the val loss rose while the mean train loss
                  fell, ``patience`` evaluations in a row: a warning, and with ``early_stop``
                  the end of training (the best model by val loss is already the run
                  folder's top level, so stopping loses nothing)
    attention     H = -sum_j p_ij ln p_ij, the entropy in nats of query i's attention over the
                  keys j, averaged over batch, heads and queries: one log.csv column per layer.
                  0 = every query looks at one key; ln(T) = uniform attention over T keys
    divergence    a NaN or infinite loss is the trainer's own check (TrainingDiverged)

The trainer holds one ``HealthGuard`` and calls it at its log points (``on_train_loss``)
and evaluation points (``on_eval``, ``entropy_columns``); it stops when ``stop_requested``.
The task says which val batch to measure and which attention maps the model's internals
hold (``Task.health_batch``, ``Task.attention_maps``); nothing here asks for a family.

Shapes: B batch, nh heads, Tq query length, Tk key length.
"""

from __future__ import annotations

import math

import torch

ENTROPY_TOKENS = 2048  # B * T of the val batch whose attention maps are measured


def attention_entropy(weights: torch.Tensor) -> float:
    """Mean entropy (nats) of the attention rows of ``weights`` (B, nh, Tq, Tk).

    Rows that are all zero (a query with every key masked) count as 0.
    """
    p = weights.float()  # (B, nh, Tq, Tk)
    h = -torch.special.xlogy(p, p).sum(dim=-1)  # (B, nh, Tq)
    return h.mean().item()


class HealthGuard:
    """Watches val and train loss for overfitting and measures attention entropy."""

    def __init__(self, patience: int = 3, early_stop: bool = False):
        if patience < 1:
            raise ValueError(f"patience must be at least 1, got {patience}")
        self.patience = patience
        self.early_stop = early_stop
        self.stop_requested = False
        self.streak = 0  # evaluations in a row with val up and train down
        self.warnings: list[str] = []
        self.best_val = math.inf
        self.start_val = math.inf  # step 0's val loss (never saved as the best model)
        self._window: list[float] = []  # train losses logged since the last evaluation
        self._prev: tuple[float, float | None] | None = None  # (val, mean train) last time

    def on_train_loss(self, loss: float) -> None:
        """A train loss from a log point (already averaged over processes)."""
        self._window.append(loss)

    def on_eval(self, step: int, val_loss: float) -> list[str]:
        """Record an evaluation; return the messages to show (empty when all is well)."""
        train = sum(self._window) / len(self._window) if self._window else None
        self._window = []
        if self._prev is not None and train is not None and self._prev[1] is not None:
            rising, falling = val_loss > self._prev[0], train < self._prev[1]
            self.streak = self.streak + 1 if rising and falling else 0
        self._prev = (val_loss, train)
        if step > 0:
            self.best_val = min(self.best_val, val_loss)
        else:
            self.start_val = val_loss
        if self.streak < self.patience:
            return []
        if self.streak > self.patience and not self.early_stop:  # said in full already
            return [f"warning: val loss still rising while train loss falls ({self.streak} "
                    f"evaluations in a row)"]
        message = (f"warning: overfitting? val loss rose {self.streak} evaluations in a row "
                   f"(now {val_loss:.4f}, best {self.best_val:.4f}) while train loss fell "
                   f"(now {train:.4f}); the best model stays at the top of the run folder")
        if self.early_stop:
            self.stop_requested = True
            message += "; stopping early (early_stop)"
        else:
            message += "; --early_stop would stop here"
        self.warnings.append(f"step {step}: {message}")
        return [message]

    def best_label(self, val_loss: float) -> str:
        """What the eval line adds for a new best model, which is said against step 0's loss
        too: fine-tuning can make the starting weights worse before it makes them better."""
        if val_loss < self.start_val:
            return " (best so far, saved)"
        return f" (best since step 0, saved; step 0 had {self.start_val:.4f})"

    @staticmethod
    def resume_label(val_loss: float, best: float) -> str:
        """The val loss a resumed run starts from, where that step was evaluated (a run
        stopped by Ctrl-C saves a step it never evaluated: then the best so far)."""
        if not math.isnan(val_loss):
            return f"val loss {val_loss:.4f}"
        best_said = f"; best val loss {best:.4f}" if math.isfinite(best) else ""
        return f"not evaluated at that step{best_said}"

    @torch.no_grad()
    def entropy_columns(self, model, task, device) -> dict[str, float]:
        """Per-layer attention entropy on one fixed val batch: {"attn_entropy_0": H, ...}.

        The batch is ``task.health_batch(ENTROPY_TOKENS)`` (the same one at every evaluation)
        and goes through ``model(*batch, return_internals=True)``, which every family's model
        accepts; ``task.attention_maps`` names the maps. A val split too short for a batch,
        or a model without ``return_internals``, gives {}.
        """
        try:
            batch = task.health_batch(ENTROPY_TOKENS)
        except (KeyError, TypeError, ValueError):  # a val split that cannot give one
            return {}
        was_training = model.training
        model.eval()
        try:
            out = model(*(t.to(device) for t in batch), return_internals=True)
            maps = task.attention_maps(out[-1])
        except (TypeError, AttributeError):  # no return_internals: nothing to measure
            return {}
        finally:
            model.train(was_training)
        return {f"{prefix}attn_entropy_{i}": attention_entropy(w)
                for prefix, layers in maps.items() for i, w in enumerate(layers)
                if w is not None}
