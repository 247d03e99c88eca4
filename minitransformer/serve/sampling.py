"""The decoding loop the server runs: the tokens of ``GPT.stream``, with their log-probabilities.

``sample_steps`` follows ``models.generation.generate_tokens`` step for step (the same window
rule, prefill and cached steps, ``sample_next`` and one generator per row seeded ``seed + i``),
so a seeded completion is the text ``minitransformer sample --seed`` writes; it also hands back
the log-softmax of each step's logits, which ``logprobs`` and the playground show.

Shapes: B rows (the choices of one prompt), T time, V vocabulary size.
"""

from __future__ import annotations

import torch

from ..models.generation import default_context_shift, row_generators, sample_next, window_start


@torch.inference_mode()
def sample_steps(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, want_logprobs: bool = False):
    """Yield (token (B, 1), log-probabilities (B, V) at temperature 1, or None) per new token.

    idx (B, T) is the prompt; past ``block_size`` tokens the window moves by the default
    context shift and the cache is rebuilt (``context_mode="recompute"``).
    """
    c = model.config
    shift = default_context_shift(c.block_size)
    generators = row_generators(seed, idx.shape[0], idx.device)
    cache, start = None, 0
    for _ in range(max_new_tokens):
        new_start = window_start(idx.shape[1], start, c.block_size, shift)
        if cache is None or new_start != start:
            cache = model.new_cache()
            # prefill: every position into the cache, the last one's logits (B, 1, V)
            logits, _ = model(idx[:, new_start:], cache=cache, logits_to_keep=1)
        else:
            logits, _ = model(idx[:, -1:], cache=cache)  # (B, 1, V): one new position
        start = new_start
        last = logits[:, -1, :]  # (B, V)
        nxt = sample_next(last, temperature, top_k, top_p, generators)  # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)
        yield nxt, (torch.log_softmax(last.float(), dim=-1) if want_logprobs else None)
