"""Sampling and decoding: temperature, top-k, top-p (nucleus), KV-cached generation.

Shapes: B batch, T time, V vocabulary size.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the nucleus; (B, V) -> (B, V).

    top_p keeps the smallest set of most likely tokens whose probabilities add up to >= p
    (Holtzman et al. 2020).
    """
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the more likely tokens
        drop_sorted = mass_before >= top_p  # the set already reached p without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next token from last-position logits (B, V); returns (B, 1).

    temperature 0 is greedy argmax; otherwise softmax(logits / temperature) restricted to
    top-k / top-p, then one multinomial draw.
    """
    if temperature <= 0.0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


@torch.inference_mode()
def generate_tokens(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None,
                    seed: int | None = None, use_cache: bool = True):
    """Yield max_new_tokens tokens (B, 1) from a decoder-only ``model``.

    The model always sees the last ``block_size`` tokens, as in nanoGPT. With the KV cache,
    each step feeds only the newest token; once the text outgrows the context window the
    cache is rebuilt from the cropped window, so the result equals recomputing every step.
    """
    block = model.config.block_size
    generator = None
    if seed is not None:
        generator = torch.Generator(device=idx.device).manual_seed(seed)
    was_training = model.training
    model.eval()
    cache = None
    try:
        for _ in range(max_new_tokens):
            if use_cache and cache is not None and cache[0][0].length < block:
                logits, _ = model(idx[:, -1:], cache=cache)  # (B, 1, V): one new position
            else:
                cache = model.new_cache() if use_cache else None
                logits, _ = model(idx[:, -block:], cache=cache)  # (B, T, V)
            nxt = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
            yield nxt
    finally:
        model.train(was_training)
