"""The decoding loop the server runs: the tokens of ``GPT.stream``, with their log-probabilities.

``sample_steps`` is ``models.generation.generate_tokens`` (the same window rule, prefill and
cached steps, ``sample_next`` and one generator per row seeded ``seed + i``: its
``decode_steps``), so a seeded completion is the text ``minitransformer sample --seed`` writes;
it also hands back the log-softmax of each step's logits, which ``logprobs`` and the playground
show.

Shapes: B rows (the choices of one prompt), T time, V vocabulary size.
"""

from __future__ import annotations

import torch

from ..models.generation import decode_steps, default_context_keep
from ..tokenizers.specials import start_tokens


def kept_start(model, tokenizer) -> int:
    """The tokens every window keeps: the tokenizer's start tokens (Llama's <s>), where the
    window has room for them, as ``sample`` keeps them by default."""
    return default_context_keep(start_tokens(tokenizer), model.config.block_size)


@torch.inference_mode()
def sample_steps(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, want_logprobs: bool = False, context_keep: int = 0):
    """Yield (token (B, 1), log-probabilities (B, V) at temperature 1, or None) per new token.

    idx (B, T) is the prompt; past ``block_size`` tokens the window moves by the default
    context shift and the cache is rebuilt (``context_mode="recompute"``), the first
    ``context_keep`` tokens kept in it.
    """
    for nxt, last in decode_steps(model, idx, max_new_tokens, temperature, top_k, top_p, seed,
                                  context_keep=context_keep):
        yield nxt, (torch.log_softmax(last.float(), dim=-1) if want_logprobs else None)
