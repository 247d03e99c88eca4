"""Decoding an encoder-decoder: greedy search and beam search, batched, with the KV cache.

Both encode the source once. With ``use_cache`` each step feeds the decoder only the newest
token: self-attention keys/values of earlier positions and the cross-attention keys/values of
the source (computed at the first step, once per sentence) come from ``KVCache``; without it
every step recomputes the whole prefix (same result, slower; the tests hold them equal). Beam
search keeps its self-attention keys in a ``BeamCache`` (``nn/beam_cache.py``), where a
sentence's beams share one store and each reads its own ancestors' keys through a mask, so
that no key moves when beams swap.

Rules shared by both, so that beam size 1 is greedy search (greedy search ranks the logits,
beam search the log-probabilities, which can only differ where two tokens tie to within
rounding):
- <pad> and <s> are never produced; after ``max_len`` tokens the only choice is </s>, so every
  translation ends with </s> and is scored with its probability. Without ``max_len`` each
  sentence has its own limit, 1.5 x its source + 10 tokens, so a translation never depends on
  the sentences batched with it. Before ``min_len`` tokens </s> is never produced (the limit
  wins where they clash), so ``min_len = max_len`` makes every translation exactly that long
  (for benchmarks that need equal work).
- A translation's score is log P(y_1 .. y_n </s> | x) / lp(n + 1), with GNMT's length penalty
  lp(L) = ((5 + L) / 6) ** alpha (Wu et al. 2016; the paper used alpha = 0.6, beam 4);
  alpha = 0 scores by log-probability alone.

Beam search keeps, per sentence, the K best unfinished prefixes. Each step it ranks all their
one-token extensions; an extension ending in </s> becomes a finished translation when it ranks
among the top K (as in fairseq and Hugging Face), the best K others become the new beam. A
sentence stops when it has K finished translations and the best of them beats every live
prefix scored at its current length (with alpha = 0 no live prefix can catch up any more).
At the first step a sentence has one prefix, <s>, so it is decoded once, not K times.

Shapes: B sentences, K beam size, S source length, T target length so far, V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..nn.kv_cache import StoragePool
from .generation import inference_scope


@dataclass
class Decoded:
    """tokens: per sentence, the translation's ids without <s> / </s>; scores: its score
    (None where greedy search was asked for the tokens alone)."""

    tokens: list[list[int]]
    scores: list[float] | None


def default_max_len(model, src: torch.Tensor, min_len: int = 0) -> torch.Tensor:
    """Each sentence's limit: 1.5 x its source + 10 tokens, or ``min_len`` if that is more,
    within the learned position table if there is one (``longest_output``); (B,)."""
    lengths = (src != model.config.pad_id).sum(dim=1)  # (B,)
    limits = (lengths * 3 // 2 + 10).clamp(min=min_len)
    limit = longest_output(model)
    return limits if limit is None else limits.clamp(max=limit)


def output_limit(model, src: torch.Tensor, max_len: int | None,
                 min_len: int = 0) -> torch.Tensor:
    """The most tokens each sentence's translation may have, (B,): ``max_len`` for all, or
    the default when None; one past the learned position table is a ValueError (the command
    line checks it first, as a user error)."""
    if max_len is None:
        return default_max_len(model, src, min_len)
    limit = longest_output(model)
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len {max_len} is past the learned position table: at most "
                         f"{limit} tokens")
    return torch.full((src.shape[0],), max_len, dtype=torch.long, device=src.device)


def longest_output(model) -> int | None:
    """The most tokens a translation can have: the decoder's input <s> y_1 .. y_n must fit
    the learned position table; None when the positions have no end."""
    c = model.config
    return c.block_size - 1 if c.pos_encoding == "learned" else None


# Largest length penalty alpha the commands take. The paper used 0.6, and Wu et al. searched
# 0 to 1; far past that lp(L) overflows for long outputs (alpha 1e308), to no use.
MAX_LENGTH_PENALTY = 10.0


def length_penalty_factor(length: int, alpha: float) -> float:
    """GNMT's lp(L) = ((5 + L) / 6) ** alpha; 1 when alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


def _next_logits(model, tokens: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                 cache) -> torch.Tensor:
    """The decoder's logits for the next token of each row: (N, V), fp32."""
    if cache is not None:
        logits, _ = model.decode(tokens[:, -1:], memory, src_mask, cache)  # (N, 1, V)
    else:
        logits, _ = model.decode(tokens, memory, src_mask)  # (N, T, V)
    return logits[:, -1].float()  # (N, V)


def _apply_rules(scores: torch.Tensor, config, step: int, limits: torch.Tensor,
                 min_len: int, lowest: int = 0) -> torch.Tensor:
    """The shared rules on (N, V) scores, logits or log-probabilities alike, in place: -inf
    where a token may not come next. ``limits`` (N,): each row's most tokens; ``lowest``: a
    number no limit is below (the smallest, where the caller keeps it), before which no row
    can be out of room and the rules are the same for every row, one write."""
    eos_id = config.eos_id
    if step >= lowest:
        full = step >= limits  # (N,) out of room: only </s> may follow
        if bool(full.any()):
            eos = scores[:, eos_id].clone()
            scores[full] = float("-inf")
            scores[full, eos_id] = eos[full]
            if step < min_len:  # too short yet: anything but </s>, where there is room
                scores[~full, eos_id] = float("-inf")
            return scores.index_fill_(1, _columns((config.pad_id, config.bos_id),
                                                  scores.device), float("-inf"))
    banned = (config.pad_id, config.bos_id) + ((eos_id,) if step < min_len else ())
    return scores.index_fill_(1, _columns(banned, scores.device), float("-inf"))


@functools.lru_cache(maxsize=64)
def _columns(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """These token ids as an index tensor, made once (a plain tensor, for use in and out of
    inference mode)."""
    with torch.inference_mode(False):
        return torch.tensor(ids, dtype=torch.long, device=device)


def _next_logprobs(model, tokens: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                   cache, step: int, limits: torch.Tensor, min_len: int = 0,
                   lowest: int = 0) -> torch.Tensor:
    """log p(next token | prefix, source) for each row: (N, V), with the shared rules applied;
    ``limits`` (N,): each row's most tokens, none below ``lowest``."""
    logp = torch.log_softmax(_next_logits(model, tokens, memory, src_mask, cache), dim=-1)
    return _apply_rules(logp, model.config, step, limits, min_len, lowest)


@contextlib.contextmanager
def _caches(model, use_cache: bool, storage: StoragePool | None, beams: int = 1):
    """``model``'s caches for one decoding call (None without the cache), whose storage goes
    back to ``storage`` at the end, however the call ends; ``beams`` > 1: a beam search's."""
    cache = model.new_cache(storage=storage, beams=beams) if use_cache else None
    try:
        yield cache
    finally:
        for self_cache, cross_cache in cache or ():
            self_cache.release()
            cross_cache.release()


def _select_rows(rows: torch.Tensor, cache, sentences: torch.Tensor | None = None) -> None:
    """Keep these ``rows`` of every self-attention cache, and these ``sentences`` of every
    cross-attention cache (None: the cross caches stay as they are)."""
    if cache is not None:
        for self_cache, cross_cache in cache:
            self_cache.reorder(rows)
            if sentences is not None:
                cross_cache.reorder(sentences)


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, max_len: int | None = None,
                  use_cache: bool = True, min_len: int = 0, scores: bool = True,
                  storage: StoragePool | None = None) -> Decoded:
    """Pick the most likely token at every step; src (B, S) right-padded with pad_id.

    Sentences that have produced </s> leave the batch, so the rest run faster.
    The most likely token is the one with the largest allowed logit. Scores are its
    log-probabilities, summed (no length penalty); ``scores=False`` leaves them out, and
    with them the log-softmax over the vocabulary, about 4% of a small model's step
    (``translate`` keeps only the tokens). Beam search ranks log-probabilities, so where two
    tokens tie to within rounding after the log-softmax, beam size 1 may break the tie
    otherwise. ``storage``: the self-attention caches' storage, kept from call to call
    (``translate_many`` keeps one for all its batches); None: new for this call.
    """
    c = model.config
    with inference_scope(model, use_cache), _caches(model, use_cache, storage) as cache:
        b = src.shape[0]
        limits = output_limit(model, src, max_len, min_len)  # (B,)
        memory, src_mask, _ = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        tokens = torch.full((b, 1), c.bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        alive = torch.arange(b, device=src.device)  # which sentence each row is
        total = torch.zeros(b, device=src.device)  # (B,) log-probability so far
        out: list[list[int]] = [[] for _ in range(b)]
        found = [0.0] * b
        lowest = int(limits.min()) if b else 0  # no row is out of room before this step
        specials = {c.pad_id, c.bos_id, c.eos_id}  # never allowed before min_len
        for step in range(int(limits.max()) + 1 if b else 0):
            logits = _next_logits(model, tokens, memory, src_mask, cache)  # (N, V)
            # the most likely allowed token: the largest allowed logit (a copy: the rules
            # write -inf, and the logits are the model's own output)
            allowed = _apply_rules(logits.clone(), c, step, limits, min_len, lowest)  # (N, V)
            nxt = allowed.max(dim=-1).indices  # (N,) (argmax: the same, three times slower)
            if scores:  # its log-probability
                logp = torch.log_softmax(logits, dim=-1)  # (N, V)
                total = total + logp.gather(1, nxt[:, None]).squeeze(1)  # (N,)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (N, T + 1)
            if step < min_len and step < lowest and logits.shape[-1] > len(specials):
                continue  # </s> was barred in every row, and some other token allowed
            done = nxt == c.eos_id  # (N,)
            if not bool(done.any()):
                continue
            for r in done.nonzero().flatten().tolist():
                out[int(alive[r])] = tokens[r, 1:-1].tolist()
                found[int(alive[r])] = float(total[r])
            keep = (~done).nonzero().flatten()  # (N',)
            if keep.numel() == 0:
                break
            tokens, alive, total, limits = tokens[keep], alive[keep], total[keep], limits[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            lowest = int(limits.min())
            _select_rows(keep, cache, keep)
        return Decoded(out, found if scores else None)


@torch.no_grad()
def beam_search(model, src: torch.Tensor, beam_size: int = 4, max_len: int | None = None,
                length_penalty: float = 0.0, use_cache: bool = True,
                min_len: int = 0, storage: StoragePool | None = None) -> Decoded:
    """Beam search with K = beam_size beams per sentence; src (B, S) right-padded.

    Scores are log-probabilities divided by lp(length) (see the module docstring).
    ``storage``: the self-attention caches' storage, as for ``greedy_decode``.
    """
    c = model.config
    k = beam_size
    if k < 1:
        raise ValueError(f"beam size must be at least 1, got {k}")
    with inference_scope(model, use_cache), _caches(model, use_cache, storage, k) as cache:
        b, dev = src.shape[0], src.device
        limits = output_limit(model, src, max_len, min_len)  # (B,) per sentence
        memory, src_mask, _ = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        if cache is not None:  # cross-attention keys/values: once per sentence, not per beam
            for layer, (_, cross_cache) in zip(model.decoder.layers, cache, strict=True):
                layer.cross_attn.fill_cache(cross_cache, memory)
        # At the first step a sentence has one prefix, <s>, decoded once rather than K times:
        # kb, the live prefixes per sentence, is 1, then K; rows i*kb .. i*kb+kb-1 are
        # sentence i's (and without the cache each row carries its source).
        tokens = torch.full((b, 1), c.bos_id, dtype=torch.long, device=dev)  # (B*kb, 1)
        scores = torch.zeros(b, 1, device=dev)  # (B, kb) log P of each live prefix
        alive = torch.arange(b, device=dev)  # which sentence each group of kb rows is
        n_done = torch.zeros(b, dtype=torch.long, device=dev)  # finished translations so far
        best = torch.full((b,), float("-inf"), device=dev)  # best finished score
        out: list[list[int]] = [[] for _ in range(b)]
        # Kept between steps, made again where sentences stop or the beams widen: each row's
        # limit, the smallest and largest limit, the first row of each sentence.
        row_limits = limits  # (n*kb,)
        lowest, highest = (int(limits.min()), int(limits.max())) if b else (0, -1)
        first_rows = torch.arange(b, device=dev)  # (n,) = i * kb
        rank = None  # (2K,) 0, 1, ..., once the vocabulary is known
        for step in range(highest + 1):
            n, kb = scores.shape
            logp = _next_logprobs(model, tokens, memory, src_mask, cache, step, row_limits,
                                  min_len, lowest)
            v = logp.shape[-1]
            # (n, kb*V) the extended prefixes, written over logp (this step's own tensor)
            cand = logp.add_(scores.reshape(-1, 1)).view(n, kb * v)
            width = min(2 * k, k * v)  # K non-</s> candidates are always among the top 2K
            top, idx = cand.topk(min(width, kb * v), dim=1)  # (n, 2K), best first
            if top.shape[1] < width:  # fewer candidates than K: the rest are -inf (<pad>)
                top = F.pad(top, (0, width - top.shape[1]), value=float("-inf"))
                idx = F.pad(idx, (0, width - idx.shape[1]), value=c.pad_id)
            origin, tok = idx // v, idx % v  # which beam each came from; its new token
            if rank is None:
                rank = torch.arange(width, device=dev)  # (2K,)
                among_k = rank < k  # (2K,)
            is_eos = tok == c.eos_id  # (n, 2K)

            # Extensions ending in </s> within the top K are finished translations (none while
            # every row is too short for </s> and has room for more).
            finish = None if step < min_len and step < lowest else \
                is_eos & among_k & torch.isfinite(top)  # (n, 2K)
            if finish is not None and bool(finish.any()):
                norm = (top / length_penalty_factor(step + 1, length_penalty)) \
                    .masked_fill(~finish, float("-inf"))  # (n, 2K)
                n_done[alive] += finish.sum(dim=1)
                cand_best, which = norm.max(dim=1)  # (n,)
                for i in (cand_best > best[alive]).nonzero().flatten().tolist():
                    row = i * kb + int(origin[i, which[i]])
                    best[alive[i]] = cand_best[i]
                    out[int(alive[i])] = tokens[row, 1:].tolist()
            if step >= highest:  # every live sentence is out of room
                break

            # The best K extensions that do not end the sentence form the next beam.
            order = (is_eos.long() * width + rank).argsort(dim=1)[:, :k]  # (n, K)
            scores = top.gather(1, order)  # (n, K)
            tok_k, origin_k = tok.gather(1, order), origin.gather(1, order)  # (n, K)
            scores = scores.masked_fill(tok_k == c.eos_id, float("-inf"))
            rows = (first_rows[:, None] + origin_k).view(-1)  # (n*K,)
            tokens = torch.cat([tokens[rows], tok_k.view(-1, 1)], dim=1)  # (n*K, T + 1)
            _select_rows(rows, cache)  # beams move within their sentence: cross K/V stay
            if kb < k:  # from one prefix to K per sentence
                if cache is not None:  # a sentence's K beams: the queries of one attention
                    for _, cross_cache in cache:
                        cross_cache.group = k
                else:
                    memory, src_mask = memory[rows], src_mask[rows]  # (n*K, S, C), (n*K, ...)
                row_limits, first_rows = limits[alive].repeat_interleave(k), first_rows * k

            # Sentences whose live prefixes can no longer beat their best translation stop.
            live_best = scores.max(dim=1).values  # (n,)
            bound = live_best / length_penalty_factor(step + 1, length_penalty)
            stop = ((n_done[alive] >= k) & (best[alive] >= bound)) | torch.isinf(live_best)
            if bool(stop.any()):
                keep = (~stop).nonzero().flatten()  # (n',)
                if keep.numel() == 0:
                    break
                keep_rows = (keep[:, None] * k + torch.arange(k, device=dev)).view(-1)
                tokens, scores, alive = tokens[keep_rows], scores[keep], alive[keep]
                by = keep if cache is not None else keep_rows  # memory per sentence or beam
                memory, src_mask = memory[by], src_mask[by]
                _select_rows(keep_rows, cache, keep)
                row_limits = limits[alive].repeat_interleave(k)  # (n'*K,)
                lowest, highest = int(limits[alive].min()), int(limits[alive].max())
                first_rows = first_rows[: len(keep)]
        return Decoded(out, best.tolist())


def pad_batch(seqs: list[list[int]], pad_id: int, device=None) -> torch.Tensor:
    """Right-pad lists of ids into a (B, T) tensor."""
    t = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(t, 1)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device) if device is not None else out


@torch.no_grad()
def translate_many(model, sources: list[list[int]], beam_size: int = 1,
                   max_len: int | None = None, length_penalty: float = 0.0,
                   batch_size: int = 64, device=None, progress=None,
                   min_len: int = 0) -> list[list[int]]:
    """Translate many encoded sources (each ending in </s>), batched by length, in order.

    ``progress`` (optional) is called with the number of sentences done after each batch.
    """
    device = device or next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    storage = StoragePool()  # the caches' storage, allocated once for every batch
    with inference_scope(model):  # the weights packed once for every batch
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = pad_batch([sources[i] for i in chunk], model.config.pad_id, device)  # (B, S)
            if beam_size <= 1:
                decoded = greedy_decode(model, src, max_len, min_len=min_len, scores=False,
                                        storage=storage)
            else:
                decoded = beam_search(model, src, beam_size, max_len, length_penalty,
                                      min_len=min_len, storage=storage)
            for i, toks in zip(chunk, decoded.tokens, strict=True):
                results[i] = toks
            if progress is not None:
                progress(len(chunk))
    return results


__all__ = ["MAX_LENGTH_PENALTY", "Decoded", "beam_search", "default_max_len", "greedy_decode",
           "length_penalty_factor", "longest_output", "pad_batch", "translate_many"]
