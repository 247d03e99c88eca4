"""``POST /v1/completions`` for GPT runs: a request checked, decoded on the worker, answered.

    plan_completion   the request against the model and the server's limits -> a Plan (or 400)
    run_plan          on the worker thread: each prompt's n choices decoded together as one
                      batch (choice j seeded seed + j), emitting ("pieces", [...]) per step
    completion_body   the events gathered into OpenAI's ``text_completion`` object
    chunk_body        one streamed event as OpenAI's chunk
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import torch

from ..errors import UserError
from .choices import Choice, logprobs_body
from .errors import APIError
from .sampling import sample_steps
from .schemas import MAX_PROMPTS, MAX_STOPS, CompletionRequest

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


def _encode(tokenizer, prompt: str, i: int | None, max_prompt_tokens: int) -> list[int]:
    param = "prompt" if i is None else f"prompt.{i}"
    if not prompt:
        raise APIError(400, "the prompt is empty: give at least one character", param,
                       "empty_prompt")
    try:
        ids = tokenizer.encode(prompt)
    except (UserError, ValueError, KeyError) as e:  # a char tokenizer's unseen characters
        raise APIError(400, f"{param}: {e}", param, "unknown_characters") from None
    if not ids:
        raise APIError(400, f"{param} encodes to no tokens", param, "empty_prompt")
    if len(ids) > max_prompt_tokens:
        raise APIError(400, f"{param} has {len(ids)} tokens; this server reads at most "
                            f"{max_prompt_tokens}", param, "context_length_exceeded")
    return ids


def plan_completion(req: CompletionRequest, tokenizer, max_tokens_cap: int,
                    max_prompt_tokens: int) -> Plan:
    """Check a request beyond its types; every problem is a 400 naming its field."""
    if req.echo:
        raise APIError(400, "echo is not supported", "echo", "unsupported")
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not prompts or len(prompts) > MAX_PROMPTS:
        raise APIError(400, f"give 1 to {MAX_PROMPTS} prompts, got {len(prompts)}", "prompt")
    single = isinstance(req.prompt, str)
    ids = [_encode(tokenizer, p, None if single else i, max_prompt_tokens)
           for i, p in enumerate(prompts)]
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if max_tokens > max_tokens_cap:
        raise APIError(400, f"max_tokens is {max_tokens}; this server allows at most "
                            f"{max_tokens_cap}", "max_tokens", "max_tokens_exceeded")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise APIError(400, f"stop: give at most {MAX_STOPS} non-empty strings", "stop")
    return Plan(prompts, ids, max_tokens, req.temperature, req.top_k, req.top_p, req.n, stops,
                req.seed, req.logprobs)


def _piece(choice: Choice, logprobs: int | None) -> dict:
    text, entries = choice.take()
    return {"index": choice.index, "text": text, "finish_reason": choice.finish,
            "logprobs": None if logprobs is None else logprobs_body(entries, choice.offset)}


def _decode_prompt(job, model, tokenizer, plan: Plan, p: int, device) -> int:
    """The n choices of prompt p, decoded as one batch; returns the tokens generated."""
    prompt_ids = plan.ids[p]
    choices = [Choice(p * plan.n + j, plan.stops, offset=len(plan.prompts[p]))
               for j in range(plan.n)]
    idx = torch.tensor([prompt_ids] * plan.n, dtype=torch.long, device=device)  # (n, T)
    steps = sample_steps(model, idx, plan.max_tokens, plan.temperature, plan.top_k,
                         plan.top_p, plan.seed, plan.logprobs is not None)
    produced = 0
    for step, (nxt, lp) in enumerate(steps):
        if job.cancelled.is_set():
            return produced
        live = [c for c in choices if c.finish is None]
        for c in live:
            row = c.index - p * plan.n
            c.add(int(nxt[row, 0]), None if lp is None else lp[row], plan.logprobs or 0,
                  tokenizer)
            produced += 1
            if step + 1 == plan.max_tokens:
                c.end(tokenizer)
        job.emit(("pieces", [_piece(c, plan.logprobs) for c in live]))
        if all(c.finish is not None for c in choices):
            return produced
    if plan.max_tokens == 0:  # nothing asked for: each choice ends empty at once
        for c in choices:
            c.end(tokenizer)
        job.emit(("pieces", [_piece(c, plan.logprobs) for c in choices]))
    return produced


def run_plan(job, model, tokenizer, plan: Plan) -> dict:
    """Decode every prompt's choices in turn (on the worker thread); returns the usage."""
    device = next(model.parameters()).device
    completion = 0
    for p in range(len(plan.ids)):
        completion += _decode_prompt(job, model, tokenizer, plan, p, device)
    prompt = sum(len(i) for i in plan.ids) * plan.n
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def new_id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:24]


def chunk_body(cid: str, created: int, model_id: str, piece: dict) -> dict:
    return {"id": cid, "object": "text_completion", "created": created, "model": model_id,
            "choices": [piece], "system_fingerprint": None}


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
