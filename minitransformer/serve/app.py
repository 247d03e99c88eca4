"""The ASGI app of ``minitransformer serve``: ``create_app(run)`` (testable without a socket).

    GET  /v1/models             the one model this server holds
    POST /v1/completions        OpenAI's completions API (GPT runs), SSE streaming
    POST /v1/chat/completions   an OpenAI-shaped error: these are not chat models (it says
                                what does work for the run)
    GET  /                      the playground page; /assets/NAME its scripts and styles
    GET  /api/info, POST /api/inspect, /api/tokenize, /api/translate, /api/fill-mask,
         /api/walkthrough: the page; GET /walkthrough/ID the walkthrough it opens

FastAPI's /docs and /redoc load scripts from a CDN, so they are off; /openapi.json stays.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..nn.linear import packed_weights
from . import completions as cmpl
from . import playground
from .errors import APIError, error_body, install_handlers
from .guards import BodyLimit, SecurityHeaders, check_key
from .schemas import CompletionRequest
from .worker import Worker


@dataclass
class Settings:
    """The server's limits (the ``serve`` flags)."""

    model_id: str = "model"
    api_key: str | None = None
    max_queue: int = 64  # requests waiting or running; one more is a 429
    max_tokens: int = 1024  # the cap on a request's max_tokens
    max_body: int = 1 << 20  # bytes of a request body; more is a 413
    max_prompt_tokens: int = 8192
    max_batch: int = 16  # unseeded requests decoded together; 1 = one at a time
    lang: str = "en"  # the language the pages open in (en or zh)


def create_app(run, settings: Settings | None = None) -> FastAPI:
    """The app serving one loaded ``families.Run``; its worker thread starts here."""
    settings = settings or Settings(model_id=run.folder.name or "model")
    worker = Worker(settings.max_queue, settings.max_batch,
                    scope=lambda: packed_weights(run.model))
    worker.start()

    @asynccontextmanager
    async def lifespan(app):
        yield
        worker.stop()

    app = FastAPI(title="minitransformer", docs_url=None, redoc_url=None, lifespan=lifespan,
                  summary=f"{run.family.title} run {settings.model_id}")
    app.state.run, app.state.settings, app.state.worker = run, settings, worker
    install_handlers(app)

    async def authorized(authorization: str | None = Header(None)) -> None:
        check_key(settings.api_key, authorization)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorized)])
    _add_v1(v1, run, settings, worker)
    app.include_router(v1)
    app.include_router(playground.router(run, settings, worker, authorized))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body)
    app.add_middleware(SecurityHeaders)
    return app


def _model_card(settings: Settings, run) -> dict:
    return {"id": settings.model_id, "object": "model", "created": _created(run),
            "owned_by": "minitransformer"}


def _created(run) -> int:
    try:
        return int(run.folder.stat().st_mtime)
    except OSError:
        return 0


def _check_model(settings: Settings, name: str) -> None:
    if name != settings.model_id:
        raise APIError(404, f"the model {name!r} does not exist; this server holds "
                            f"{settings.model_id!r}", "model", "model_not_found")


def _add_v1(v1: APIRouter, run, settings: Settings, worker: Worker) -> None:
    end = run.family.end_tokens(run.tokenizer, run.meta)  # where a completion stops, if any

    @v1.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(settings, run)]}

    @v1.get("/models/{name}")
    async def model(name: str) -> dict:
        _check_model(settings, name)
        return _model_card(settings, run)

    @v1.post("/completions")
    async def completions(req: CompletionRequest, request: Request):
        _check_model(settings, req.model)
        if not playground.abilities(run)["completions"]:
            raise APIError(400, f"completions need a GPT run; {settings.model_id} does not "
                                f"continue text: {_instead(run)}", "model",
                           "not_a_completion_model")
        plan = cmpl.plan_completion(req, run.tokenizer, settings.max_tokens,
                                    settings.max_prompt_tokens, end)
        job = worker.submit(lambda job: cmpl.run_plan(job, run.model, run.tokenizer, plan),
                            cmpl.batch_key(plan) if settings.max_batch > 1 else None,
                            lambda jobs: cmpl.run_batch(jobs, run.model, run.tokenizer), plan)
        if req.stream:
            return StreamingResponse(_sse(worker, job, settings.model_id, plan),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return JSONResponse(await _gather(worker, job, request, settings.model_id, plan))

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> dict:
        try:  # a model of another name is unknown here first, as /v1/completions says
            name = (await request.json()).get("model")
        except (ValueError, AttributeError):
            name = None
        if isinstance(name, str):
            _check_model(settings, name)
        raise APIError(400, f"{settings.model_id} is not a chat model: {_instead(run)}",
                       "model", "not_a_chat_model")


# What each ability of a run is asked for with (``playground.abilities``' keys).
ENDPOINTS = {"completions": "POST /v1/completions with a prompt",
             "translate": 'POST /api/translate with {"text": "a sentence"}',
             "fill_mask": 'POST /api/fill-mask with {"text": "a [MASK] to fill"}'}


def _instead(run) -> str:
    """Where to go for what this run does (by its abilities, never its family's name), for a
    request it cannot answer: its endpoints, and the playground page."""
    ways = [ENDPOINTS[name] for name, able in playground.abilities(run).items() if able]
    return f"for {run.family.title} runs, use {', or '.join([*ways, 'the playground at /'])}"


async def _gather(worker: Worker, job, request: Request, model_id: str, plan) -> dict:
    """Wait for a whole completion; a client that hangs up cancels it."""
    pieces, usage = [], None
    events = worker.events(job)
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        async for kind, value in events:
            if kind == "pieces":
                pieces.extend(value)
            elif kind == "result":
                usage = value
    finally:
        watcher.cancel()
    return cmpl.completion_body(cmpl.new_id(), model_id, plan, pieces, usage or {})


async def _watch_disconnect(request: Request, job) -> None:
    while not job.cancelled.is_set():
        if await request.is_disconnected():
            job.cancelled.set()
            return
        await asyncio.sleep(0.25)


async def _sse(worker: Worker, job, model_id: str, plan: cmpl.Plan):
    """Server-sent events: one chunk per choice and step with new text, the usage chunk if
    ``plan.include_usage``, then [DONE]. The response closing early (a client gone) ends
    ``events``, which cancels the job."""
    cid, created = cmpl.new_id(), int(time.time())

    def event(piece: dict | None, usage: dict | None = None) -> str:
        chunk = cmpl.chunk_body(cid, created, model_id, plan, piece, usage)
        return f"data: {json.dumps(chunk)}\n\n"

    try:
        async for kind, value in worker.events(job):
            if kind == "result" and plan.include_usage:  # the job's last event
                yield event(None, value)
            if kind != "pieces":
                continue
            # one write a step for all choices: a client gone is then seen at the next step,
            # not after one failed write per choice (each logged by asyncio)
            chunks = "".join(event(piece) for piece in value
                             if piece["text"] or piece["finish_reason"] or piece["logprobs"])
            if chunks:
                yield chunks
    except APIError as e:  # after the headers have gone, an error is one more event
        yield f"data: {json.dumps(error_body(e.status, e.message, e.param, e.code))}\n\n"
    yield "data: [DONE]\n\n"
