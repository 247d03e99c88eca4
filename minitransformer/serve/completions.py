"""``POST /v1/completions`` for GPT runs: a request checked, decoded on the worker, answered.

    plan_completion   the request against the model and the server's limits -> a Plan (or 400)
    run_plan          on the worker thread: each prompt's n choices decoded together as one
                      batch (choice j seeded seed + j), emitting ("pieces", [...]) per step
    run_batch         several unseeded requests of one ``batch_key`` (prompts of any
                      lengths) decoded as one ragged batch, each row leaving when it is done
    completion_body   the events gathered into OpenAI's ``text_completion`` object
    chunk_body        one streamed event as OpenAI's chunk (or the last one, of the usage)
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from ..config import SEED_LIMIT
from ..errors import UserError
from ..models.generation import sample_next
from ..models.ragged import RaggedBatch
from .choices import Choice, logprobs_body
from .errors import APIError
from .sampling import kept_start, sample_steps
from .schemas import MAX_CHOICES, MAX_PROMPTS, MAX_STOPS, CompletionRequest

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the completions API


@dataclass
class Plan:
    """A checked completion request: token ids per prompt and the sampling settings."""

    prompts: list[str]
    ids: list[list[int]]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    n: int
    stops: list[str]
    seed: int | None
    logprobs: int | None
    include_usage: bool = False  # stream_options: a last chunk with the usage
    end: frozenset[int] = frozenset()  # the model's end-of-text ids: a choice stops at one


def _encode(tokenizer, prompt: str, i: int | None, max_prompt_tokens: int) -> list[int]:
    param = "prompt" if i is None else f"prompt.{i}"
    try:
        ids = tokenizer.encode_prompt(prompt)  # Llama's <s> first ("" is <s> alone)
    except (UserError, ValueError, KeyError) as e:  # a char tokenizer's unseen characters
        raise APIError(400, f"{param}: {e}", param, "unknown_characters") from None
    if not prompt and not ids:
        raise APIError(400, "the prompt is empty: give at least one character", param,
                       "empty_prompt")
    if not ids:
        raise APIError(400, f"{param} encodes to no tokens", param, "empty_prompt")
    if len(ids) > max_prompt_tokens:
        raise APIError(400, f"{param} has {len(ids)} tokens; this server reads at most "
                            f"{max_prompt_tokens}", param, "context_length_exceeded")
    return ids


def _token_ids(tokenizer, ids: list[int], i: int | None, max_prompt_tokens: int) -> list[int]:
    """A prompt given as token ids (OpenAI's other form), checked against the vocabulary."""
    param = "prompt" if i is None else f"prompt.{i}"
    if not ids:
        raise APIError(400, f"{param} has no token ids", param, "empty_prompt")
    bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"{param}: token id {bad} is not in the vocabulary (0 to "
                            f"{tokenizer.vocab_size - 1})", param, "invalid_token")
    if len(ids) > max_prompt_tokens:
        raise APIError(400, f"{param} has {len(ids)} tokens; this server reads at most "
                            f"{max_prompt_tokens}", param, "context_length_exceeded")
    return list(ids)


def plan_completion(req: CompletionRequest, tokenizer, max_tokens_cap: int,
                    max_prompt_tokens: int, end: frozenset[int] = frozenset()) -> Plan:
    """Check a request beyond its types; every problem is a 400 naming its field. ``end``:
    the ids that end a choice (``Family.end_tokens``), as OpenAI's models stop at theirs."""
    options = req.stream_options
    asked = {"echo": req.echo, "suffix": req.suffix is not None,
             "best_of": req.best_of not in (None, req.n), "logit_bias": bool(req.logit_bias),
             "presence_penalty": req.presence_penalty != 0,
             "frequency_penalty": req.frequency_penalty != 0,
             "stream_options.include_obfuscation": bool(options and options.include_obfuscation)}
    for name in (name for name, used in asked.items() if used):
        raise APIError(400, f"{name} is not supported", name, "unsupported")
    if options is not None and not req.stream:  # as OpenAI answers it
        raise APIError(400, "stream_options is only allowed when stream is true",
                       "stream_options", "invalid_value")
    single = isinstance(req.prompt, str) or \
        bool(req.prompt) and all(isinstance(t, int) for t in req.prompt)  # one text or ids
    prompts = [req.prompt] if single else list(req.prompt)
    if not prompts or len(prompts) > MAX_PROMPTS:
        raise APIError(400, f"give 1 to {MAX_PROMPTS} prompts, got {len(prompts)}", "prompt")
    if len(prompts) * req.n > MAX_CHOICES:  # one request should not hold the server for long
        raise APIError(400, f"{len(prompts)} prompts x n {req.n} = {len(prompts) * req.n} "
                            f"choices; this server writes at most {MAX_CHOICES} a request",
                       "n", "too_many_choices")
    if req.seed is not None and req.seed + req.n - 1 >= SEED_LIMIT:
        raise APIError(400, f"choice i draws with seed + i, which must stay under 2**63: with n "
                            f"{req.n}, give a seed of at most {SEED_LIMIT - req.n}", "seed")
    ids = [_encode(tokenizer, p, None if single else i, max_prompt_tokens)
           if isinstance(p, str) else _token_ids(tokenizer, p, None if single else i,
                                                  max_prompt_tokens)
           for i, p in enumerate(prompts)]
    prompts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    max_tokens = req.max_tokens
    if "max_tokens" not in req.model_fields_set or max_tokens is None:  # not asked for
        max_tokens = min(DEFAULT_MAX_TOKENS, max_tokens_cap)
    if max_tokens > max_tokens_cap:
        raise APIError(400, f"max_tokens is {max_tokens}; this server allows at most "
                            f"{max_tokens_cap}", "max_tokens", "max_tokens_exceeded")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise APIError(400, f"stop: give at most {MAX_STOPS} non-empty strings", "stop")
    return Plan(prompts, ids, max_tokens, req.temperature, req.top_k, req.top_p, req.n, stops,
                req.seed, req.logprobs, bool(options and options.include_usage), end)


def _piece(choice: Choice, logprobs: int | None) -> dict:
    text, entries = choice.take()
    return {"index": choice.index, "text": text, "finish_reason": choice.finish,
            "logprobs": None if logprobs is None else logprobs_body(entries, choice.offset)}


@dataclass
class Row:
    """One choice of one request in a decoding batch."""

    job: Any
    plan: Plan
    choice: Choice
    prompt_ids: list[int]
    produced: int = 0


def _emit(rows: list[Row]) -> None:
    """Each request's new pieces, as one event per request."""
    by_job: dict[int, list[Row]] = {}
    for row in rows:
        by_job.setdefault(id(row.job), []).append(row)
    for group in by_job.values():
        group[0].job.emit(("pieces", [_piece(r.choice, r.plan.logprobs) for r in group]))


def _step(row: Row, step: int, token: int, lp, tokenizer) -> None:
    row.produced += 1
    if token in row.plan.end:  # the end of the text: finish_reason "stop", the token unshown
        row.choice.end(tokenizer, "stop")
        return
    row.choice.add(token, lp, row.plan.logprobs or 0, tokenizer)
    if step + 1 == row.plan.max_tokens:
        row.choice.end(tokenizer)


def _decode(model, tokenizer, rows: list[Row], seed: int | None) -> None:
    """Decode rows that share a prompt length and sampling settings as one batch; each stops
    at its own max_tokens or stop string, or when its request is cancelled."""
    plan = rows[0].plan
    for row in rows:
        if row.plan.max_tokens == 0:  # nothing asked for: the choice ends empty at once
            row.choice.end(tokenizer)
    if any(r.plan.max_tokens == 0 for r in rows):
        _emit([r for r in rows if r.plan.max_tokens == 0])
    device = next(model.parameters()).device
    idx = torch.tensor([r.prompt_ids for r in rows], dtype=torch.long, device=device)  # (B, T)
    steps = sample_steps(model, idx, max(r.plan.max_tokens for r in rows), plan.temperature,
                         plan.top_k, plan.top_p, seed, plan.logprobs is not None,
                         kept_start(model, tokenizer))  # Llama's <s> stays in every window
    for step, (nxt, lp) in enumerate(steps):
        live = [(i, r) for i, r in enumerate(rows)
                if r.choice.finish is None and not r.job.cancelled.is_set()]
        if not live:
            return
        for i, r in live:
            _step(r, step, int(nxt[i, 0]), None if lp is None else lp[i], tokenizer)
        _emit([r for _, r in live])


def _decode_ragged(model, tokenizer, rows: list[Row]) -> None:
    """Decode unseeded rows of any prompt lengths (one sampling setting) as one ragged batch
    (``models/ragged.py``); a row leaves the batch when it finishes or its request is
    cancelled."""
    plan = rows[0].plan
    batch = RaggedBatch(model, [r.prompt_ids for r in rows],
                        context_keep=kept_start(model, tokenizer))  # Llama's <s> in every window
    gone = [i for i, r in enumerate(rows) if r.plan.max_tokens == 0]
    for i in gone:  # nothing asked for: the choice ends empty at once
        rows[i].choice.end(tokenizer)
    if gone:
        _emit([rows[i] for i in gone])
    batch.finish(gone)
    step = 0
    while batch.rows:
        logits = batch.next_logits()  # (B, V)
        nxt = sample_next(logits, plan.temperature, plan.top_k, plan.top_p)  # (B, 1)
        lps = torch.log_softmax(logits.float(), dim=-1) if plan.logprobs is not None else None
        batch.push(nxt)
        live = [rows[r] for r in batch.rows]
        for b, r in enumerate(live):
            _step(r, step, int(nxt[b, 0]), None if lps is None else lps[b], tokenizer)
        _emit(live)
        step += 1
        batch.finish(i for i in batch.rows
                     if rows[i].choice.finish is not None or rows[i].job.cancelled.is_set())


def _rows(job, plan: Plan, p: int) -> list[Row]:
    return [Row(job, plan, Choice(p * plan.n + j, plan.stops, offset=len(plan.prompts[p]),
                                  before=plan.ids[p]), plan.ids[p]) for j in range(plan.n)]


def _usage(plan: Plan, rows: list[Row]) -> dict:
    """Each prompt's tokens counted once, whatever ``n`` (as OpenAI's API counts them)."""
    prompt = sum(len(i) for i in plan.ids)
    completion = sum(r.produced for r in rows)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def run_plan(job, model, tokenizer, plan: Plan) -> dict:
    """One request alone (on the worker thread): each prompt's n choices as one batch, choice
    j seeded seed + j; returns the usage."""
    done = []
    for p in range(len(plan.ids)):
        rows = _rows(job, plan, p)
        _decode(model, tokenizer, rows, plan.seed)
        done += rows
    return _usage(plan, done)


RAGGED = True  # batch prompts of different lengths together (False: equal lengths only)


def batch_key(plan: Plan) -> tuple | None:
    """Requests that may be decoded together: one prompt (of any length: ragged batches), the
    same sampling settings, and no seed (a seeded request is decoded alone, so that its text
    is the same whatever else the server is doing: batched float kernels may differ in the
    last bits)."""
    if plan.seed is not None or len(plan.ids) != 1:
        return None
    return (None if RAGGED else len(plan.ids[0]), plan.temperature, plan.top_k, plan.top_p,
            plan.logprobs is not None)


def run_batch(jobs: list, model, tokenizer) -> list[dict]:
    """Several requests of one ``batch_key`` decoded as one ragged batch; the usage of each."""
    rows = [_rows(job, job.payload, 0) for job in jobs]
    _decode_ragged(model, tokenizer, [r for group in rows for r in group])
    return [_usage(job.payload, group) for job, group in zip(jobs, rows, strict=True)]


def new_id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:24]


def chunk_body(cid: str, created: int, model_id: str, plan: Plan, piece: dict | None,
               usage: dict | None = None) -> dict:
    """One piece of one choice as OpenAI's chunk; ``piece`` None: the last chunk that
    ``stream_options.include_usage`` asks for (no choices, the usage). With that option every
    chunk has a ``usage`` field (null but on the last), without it none has."""
    body = {"id": cid, "object": "text_completion", "created": created, "model": model_id,
            "choices": [] if piece is None else [piece], "system_fingerprint": None}
    if plan.include_usage:
        body["usage"] = usage
    return body


def completion_body(cid: str, model_id: str, plan: Plan, pieces: list[dict],
                    usage: dict) -> dict:
    """OpenAI's ``text_completion`` object from every piece a job emitted."""
    n = len(plan.ids) * plan.n
    texts = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    lps = [{"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
           for _ in range(n)]
    for piece in pieces:
        i = piece["index"]
        texts[i].append(piece["text"])
        finish[i] = piece["finish_reason"] or finish[i]
        if piece["logprobs"] is not None:
            for key, values in piece["logprobs"].items():
                lps[i][key].extend(values)
    choices = [{"text": "".join(texts[i]), "index": i, "finish_reason": finish[i] or "length",
                "logprobs": lps[i] if plan.logprobs is not None else None} for i in range(n)]
    return {"id": cid, "object": "text_completion", "created": int(time.time()),
            "model": model_id, "choices": choices, "usage": usage, "system_fingerprint": None}
