"""Initial values that depend on a parameter's name, not on the order modules were built in.

Two variants of a model (say learned positions vs RoPE) build different modules, so the
global random stream reaches the shared ones in a different state and their initial values
differ. To compare only what was varied, every parameter is drawn again from its own
generator, seeded by (seed, parameter name), with the scheme of ``nn/init.py``:

    gpt2     Linear / Embedding weights ~ N(0, 0.02); residual projections (attention W^O, the
             FFN's second layer) ~ N(0, 0.02 / sqrt(2 n_layer)); biases 0
    xavier   Xavier/Glorot uniform on every matrix; biases 0
    both     LayerNorm weight 1, bias 0; a model built with ``scale_embeddings`` (its config
             says) has its token embedding ~ N(0, d_model^-0.5), as its own __init__ draws it

So ``decoder.layers.0.self_attn.q_proj.weight`` starts equal in every variant that has it.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from ..config import SEED_LIMIT
from ..nn.init import RESIDUAL_PROJECTIONS
from ..nn.norm import NORMS
from ..nn.positional import LearnedPositionalEmbedding


def name_seed(seed: int, name: str) -> int:
    """A 63-bit seed from (seed, name), stable across runs and machines (not Python's hash)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (SEED_LIMIT - 1)


def _owner(model: nn.Module, name: str) -> tuple[str, nn.Module]:
    module_name, _, _ = name.rpartition(".")
    return module_name, model.get_submodule(module_name) if module_name else model


@torch.no_grad()
def reseed_parameters(model: nn.Module, seed: int, scheme: str, n_layer: int) -> None:
    """Re-initialise every parameter of ``model`` in place from a generator seeded by its name.

    Tied parameters are drawn once, under their first name (``tok_emb.weight`` for a GPT's
    tied output layer). Parameters of modules the schemes do not cover keep their values.
    """
    if scheme not in ("gpt2", "xavier"):
        raise ValueError(f"unknown init {scheme!r}: choose gpt2 or xavier")
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    # The model's config, not the values, says whether its token embedding is scaled; GPT and
    # Seq2SeqTransformer then redraw ``tok_emb`` from N(0, d^-0.5) after init_weights, under
    # either scheme (tensor2tensor's choice: E * sqrt(d) has unit variance).
    config = getattr(model, "config", None)
    scaled_emb = getattr(model, "tok_emb", None) \
        if getattr(config, "scale_embeddings", False) else None
    for name, param in model.named_parameters():  # each tied tensor once
        module_name, module = _owner(model, name)
        leaf = name.rpartition(".")[2]
        gen = torch.Generator().manual_seed(name_seed(seed, name))  # CPU: same on any device
        value = torch.empty(param.shape, dtype=param.dtype)  # (same shape as param)
        if isinstance(module, NORMS):
            nn.init.ones_(value) if leaf == "weight" else nn.init.zeros_(value)
        elif scaled_emb is not None and module is scaled_emb:
            nn.init.normal_(value, 0.0, config.n_embd ** -0.5, generator=gen)
        elif isinstance(module, (nn.Linear, nn.Embedding, LearnedPositionalEmbedding)):
            if leaf == "bias":
                nn.init.zeros_(value)
            elif scheme == "xavier":
                nn.init.xavier_uniform_(value, generator=gen)
            else:
                residual = isinstance(module, nn.Linear) and \
                    module_name.endswith(RESIDUAL_PROJECTIONS)
                nn.init.normal_(value, 0.0, residual_std if residual else 0.02, generator=gen)
        else:
            continue
        param.copy_(value)
