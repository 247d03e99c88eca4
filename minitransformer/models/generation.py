"""Sampling and decoding: temperature, top-k, top-p (nucleus), KV-cached generation, and what
the model sees once the text outgrows its context window.

The window. A model trained on ``block_size`` positions sees at most that many tokens. When
the text grows past it, the oldest tokens must go:

- ``context_shift = 0``: the exact sliding window (nanoGPT's ``idx[:, -block_size:]``): every
  new token sees the last ``block_size`` tokens. With the KV cache this means rebuilding the
  cache from the cropped window for every token, the uncached cost again.
- ``context_shift = s > 0`` (the default, ``block_size // 4``): when the text outgrows the
  window, the oldest ``s`` tokens go at once and the window restarts from the last
  ``block_size - s`` tokens, so one rebuild serves the next ``s`` tokens (llama.cpp's context
  shift). A token then sees between ``block_size - s`` and ``block_size`` tokens.
- ``context_keep = k`` (default 0): the text's first ``k`` tokens never leave the window; the
  window is those, then the newest tokens that fit (``block_size - k`` of them, or
  ``block_size - k - s`` right after a shift). A model trained on texts that begin with a
  start token (Llama's ``<s>``) has always seen it first, and many such models put much of
  their attention on it (Xiao et al. 2023, "attention sinks"); ``sample`` keeps the start
  tokens its tokenizer puts before the prompt, as llama.cpp keeps ``<s>`` (its ``n_keep``).

How the window moves is one rule (``window_start``); two modes say what happens to the cache
when it moves:

- ``"recompute"`` (the default): the cache is rebuilt from the new window, so the result
  equals running the model on the window without any cache. Works for every position
  encoding.
- ``"roll"`` (RoPE, ALiBi, or no positions): the cache keeps its entries and drops the oldest
  (``KVCache.drop_front``); RoPE keys are re-rotated by ``-shift`` so that positions restart
  at the window's first token, ALiBi's bias follows cache indices and needs nothing. Nothing
  is recomputed, but it is an approximation: the kept tokens' keys and values were computed
  when the dropped tokens were still in view.

Shapes: B batch, T time, V vocabulary size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal

import torch

from ..nn.linear import packed_weights

ContextMode = Literal["recompute", "roll"]
ROLLABLE = ("rope", "alibi", "none")  # absolute positions are part of every cached key


def filter_logits(logits: torch.Tensor, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the nucleus; (B, V) -> (B, V).

    top_k 0 or None = off. top_p keeps the smallest set of most likely tokens whose
    probabilities add up to >= p (Holtzman et al. 2020); 1 or None = off.
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


Generators = torch.Generator | Sequence[torch.Generator] | None
TINY_TEMPERATURE = 1e-30  # below it logits of 3.4e8 and more overflow float32 when divided


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: Generators = None) -> torch.Tensor:
    """Pick the next token from last-position logits (B, V); returns (B, 1).

    temperature 0 is greedy argmax; otherwise softmax(logits / temperature) restricted to
    top-k / top-p, then one multinomial draw. ``generator``: one for the whole batch, or one
    per row (row i then draws exactly as it would alone, from its own generator).
    """
    if temperature <= 0.0:
        # the first largest logit; argmax gives the same, about three times slower on a CPU
        return logits.max(dim=-1, keepdim=True).indices  # (B, 1)
    logits = logits.float()
    if temperature < TINY_TEMPERATURE:  # logits / temperature would overflow to inf (a NaN
        # softmax): shifted to a largest logit of 0 first, the quotient stays <= 0; and at
        # most divided by TINY_TEMPERATURE (a smaller one rounds to 0 in float32: 0 / 0),
        # which already leaves only the largest logits (ties) any probability
        logits = logits - logits.max(dim=-1, keepdim=True).values
        temperature = TINY_TEMPERATURE
    logits = filter_logits(logits / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if isinstance(generator, Sequence):
        return race(probs, generator)  # (B, 1)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


def race(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One draw per row of probs (B, V), row i from ``generators[i]``; returns (B, 1).

    The exponential race: each token draws a time q ~ Exp(1) and the first to arrive, at
    q / p, wins: token t wins with probability p_t (argmax p / q; the Gumbel-max trick with
    exp applied). ``torch.multinomial`` draws one sample this way, so for the probabilities
    a softmax gives, a row drawn here equals the row drawn alone by ``torch.multinomial``
    with the same generator (tests hold them equal; it also refuses rows of zeros and
    infinities, which a softmax cannot give), and it is the same computation whether the row
    is drawn alone or in a batch: the times are drawn row by row, each from its row's
    generator, and the rest is one division and one argmax for the batch (eight
    ``torch.multinomial`` calls took 4x as long)."""
    if not bool((probs >= 0).all()):  # NaN logits: as torch.multinomial, an error
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    times = torch.empty_like(probs)  # (B, V)
    for row, g in zip(times, generators, strict=True):
        row.exponential_(generator=g)
    return (probs / times).argmax(dim=-1, keepdim=True)  # (B, 1)


def row_generators(seed: int | None, batch: int, device) -> list[torch.Generator] | None:
    """One generator per row, row i seeded ``seed + i``, so that any row can be reproduced
    alone (with ``seed + i`` and batch 1); None when there is no seed."""
    if seed is None:
        return None
    return [torch.Generator(device=device).manual_seed(seed + i) for i in range(batch)]


def default_context_shift(block_size: int) -> int:
    """Tokens dropped at once when the text outgrows the window: a quarter of it."""
    return block_size // 4


def default_context_keep(start_tokens: int, block_size: int, shift: int | None = None) -> int:
    """The tokens a text keeps in every window unless told: its start tokens (Llama's <s>),
    where the window has room for them beside ``shift`` (default ``block_size // 4``)."""
    shift = default_context_shift(block_size) if shift is None else shift
    return start_tokens if start_tokens + shift < block_size else 0


def check_context(block_size: int, shift: int, mode: str, pos_encoding: str,
                  keep: int = 0) -> None:
    """Raise ValueError for a keep outside 0 .. block_size - 1, a shift outside
    0 .. block_size - keep - 1 (a window after a shift holds at least one token past the kept
    ones) or a mode the model cannot use."""
    if not 0 <= keep < block_size:
        raise ValueError(f"context keep must be in 0 .. {block_size - 1} (block_size "
                         f"{block_size}), got {keep}")
    if not 0 <= shift < block_size - keep:
        kept = f", {keep} tokens kept" if keep else ""
        raise ValueError(f"context shift must be in 0 .. {block_size - keep - 1} (block_size "
                         f"{block_size}{kept}), got {shift}")
    if mode not in ("recompute", "roll"):
        raise ValueError(f"context mode must be 'recompute' or 'roll', got {mode!r}")
    if mode == "roll" and pos_encoding not in ROLLABLE:
        raise ValueError(f"rolling the cache needs relative positions ({', '.join(ROLLABLE)}); "
                         f"this model's {pos_encoding} positions are part of every cached key, "
                         f"so use context mode 'recompute'")


def window_start(length: int, start: int, block_size: int, shift: int, keep: int = 0) -> int:
    """First token after the kept ones of the model's window over a text of ``length`` tokens.

    The window is ``text[:keep] + text[start:]`` (``start`` >= ``keep``; ``start = keep`` is
    the whole text) while that fits in ``block_size``; when it would not, the part after the
    kept tokens restarts from the last ``block_size - keep - shift`` tokens (shift 0: the
    window is full again, the exact sliding window).
    """
    if min(keep, length) + length - start > block_size:
        return length - (block_size - keep - shift)
    return start


def window(idx: torch.Tensor, start: int, keep: int = 0) -> torch.Tensor:
    """The model's window ``idx[:, :keep] + idx[:, start:]`` (``window_start``): (B, T')."""
    if keep == 0:
        return idx[:, start:]
    if start <= keep:  # nothing dropped yet: the whole text
        return idx
    return torch.cat([idx[:, :keep], idx[:, start:]], dim=1)


def roll_cache(model, cache, n: int, keep: int = 0) -> None:
    """Drop the oldest ``n`` positions after the first ``keep`` from every self-attention
    cache of a decoder-only ``model`` (the later RoPE keys re-rotated by -n, see
    ``MultiHeadAttention.drop_front``)."""
    for layer, (self_cache, _) in zip(model.decoder.layers, cache, strict=True):
        layer.self_attn.drop_front(self_cache, n, after=keep)


def clear_cache(cache) -> None:
    """Empty every cache of a decoder-only model, keeping their storage (``KVCache.clear``),
    so that the window's prefill after a shift writes where the last one did."""
    for self_cache, _ in cache:
        self_cache.clear()


def decoding_weights(model, use_cache: bool = True):
    """The scope cached decoding runs in: ``model``'s weights packed for one-row products
    (``nn.linear.packed_weights``); the uncached reference path keeps the plain weights.
    An encoder-decoder's encoder is packed too: it runs once per batch, on whole sentences,
    but faster from the packed copies, which repays their packing within one batch
    (docs/BENCHMARKS.md, "Translation speed")."""
    return packed_weights(model) if use_cache else contextlib.nullcontext()


@contextlib.contextmanager
def inference_scope(model, use_cache: bool = True):
    """Decoding with ``model`` in one call: eval mode (the mode it had is restored at the
    end) inside ``decoding_weights``."""
    was_training = model.training
    if any(m.training for m in model.modules()):  # a call in eval mode sets nothing
        model.eval()
    try:
        with decoding_weights(model, use_cache):
            yield
    finally:
        if was_training:
            model.train()


@torch.inference_mode()
def generate_tokens(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None,
                    seed: int | None = None, use_cache: bool = True,
                    context_shift: int | None = None, context_mode: ContextMode = "recompute",
                    context_keep: int = 0):
    """Yield max_new_tokens tokens (B, 1) from a decoder-only ``model``; idx (B, T) the prompt.

    The model sees ``idx[:, :keep] + idx[:, start:]`` with ``start`` from ``window_start``
    (see the module docstring for ``context_shift``, default ``block_size // 4``,
    ``context_keep``, default 0, and ``context_mode``). With
    the KV cache each step feeds only the newest token; in "recompute" mode the cache is
    rebuilt whenever the window moves, so the result equals the uncached model on the same
    windows (``use_cache=False``). With ``seed``, row i samples from its own generator seeded
    ``seed + i``.

    Packed weights (``decoding_weights``) are the caller's to open, around the whole run as
    ``GPT.generate`` and ``sample`` do: a scope opened here would outlive every ``yield``,
    and a caller may change the weights while the generator waits (a training step between
    two tokens), which the packed copies would not see.
    """
    for nxt, _ in decode_steps(model, idx, max_new_tokens, temperature, top_k, top_p, seed,
                               use_cache, context_shift, context_mode, context_keep):
        yield nxt


@torch.inference_mode()
def decode_steps(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, use_cache: bool = True,
                 context_shift: int | None = None, context_mode: ContextMode = "recompute",
                 context_keep: int = 0):
    """``generate_tokens``, yielding each new token (B, 1) with the last position's logits it
    was sampled from (B, V) (the server's log-probabilities)."""
    c = model.config
    shift = default_context_shift(c.block_size) if context_shift is None else context_shift
    keep = context_keep
    check_context(c.block_size, shift, context_mode, c.pos_encoding, keep)
    generators = row_generators(seed, idx.shape[0], idx.device)
    cache, start = None, keep
    with inference_scope(model, use_cache=False):  # eval mode; packing is the caller's
        for _ in range(max_new_tokens):
            new_start = window_start(idx.shape[1], start, c.block_size, shift, keep)
            if not use_cache:
                logits, _ = model(window(idx, new_start, keep))  # (B, T, V): the whole window
            elif cache is None or (new_start != start and context_mode == "recompute"):
                if cache is None:  # storage for the whole window, made once
                    cache = model.new_cache(c.block_size)
                clear_cache(cache)
                # prefill: every position into the cache, the last one's logits (B, 1, V)
                logits, _ = model(window(idx, new_start, keep), cache=cache, logits_to_keep=1)
            else:
                if new_start != start:  # roll: forget the oldest, keep the rest as computed
                    roll_cache(model, cache, new_start - start, keep)
                logits, _ = model(idx[:, -1:], cache=cache)  # (B, 1, V): one new position
            start = new_start
            last = logits[:, -1, :]  # (B, V)
            nxt = sample_next(last, temperature, top_k, top_p, generators)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
            yield nxt, last
