"""The playground's walkthrough button: the eight-step ``explain`` page of a text, computed live.

    POST /api/walkthrough   trace the model on a text (the family's ``explain``, on the worker
                            thread) and keep the page description; answers with its URL
    GET  /walkthrough/ID    that page: ``viz.page.render_page`` with its script and stylesheet
                            linked from /assets/ (the walkthrough's own files), never inline

The ID is a random token handed out by the POST, so opening the page in a new tab needs no
API key of its own (the POST did). Only the last ``KEEP`` descriptions are kept.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..errors import UserError
from ..viz.i18n import msg
from ..viz.page import render_page
from .errors import APIError
from .schemas import WalkthroughRequest

KEEP = 16


class Pages:
    """The last ``keep`` walkthrough descriptions by ID (touched on the event loop only)."""

    def __init__(self, keep: int = KEEP):
        self.keep, self._docs = keep, OrderedDict()

    def add(self, doc: dict) -> str:
        key = secrets.token_urlsafe(16)
        self._docs[key] = doc
        while len(self._docs) > self.keep:
            self._docs.popitem(last=False)
        return key

    def get(self, key: str) -> dict | None:
        return self._docs.get(key)


def explain(run, req: WalkthroughRequest) -> dict:
    """The family's walkthrough of ``req.text`` (a user error becomes a 400)."""
    source = run.meta.get("data", {}).get("source") or run.folder.name
    try:
        return run.family.explain(run.model, run.tokenizer, req.text, req.layer, req.head,
                                  req.top, msg("walk.trained_on", source=source))
    except UserError as e:  # text too long for the page, characters the tokenizer lacks
        raise APIError(400, f"text: {e}", "text", "bad_text") from None


def add_routes(page_router: APIRouter, api: APIRouter, run, worker, lang: str) -> None:
    """The walkthrough's two routes: the page on ``page_router``, the POST on ``api``; a page
    opens in the language its request asked for, else ``lang`` (the server's)."""
    pages = Pages()

    @api.post("/walkthrough")
    async def walkthrough(req: WalkthroughRequest) -> dict:
        """Trace the model on ``text``; open ``url`` for the eight-step walkthrough."""
        if "explain" not in run.family.commands:
            raise APIError(400, f"{run.family.title} runs have no walkthrough", None,
                           "not_applicable")
        doc = await worker.call(lambda job: explain(run, req))
        key = pages.add({**doc, "lang": req.lang or lang})
        return {"url": f"/walkthrough/{key}", "steps": len(doc["steps"]),
                "tokens": next(b["tokens"] for b in doc["steps"][0]["blocks"]
                               if b["kind"] == "tokens")}

    @page_router.get("/walkthrough/{key}", response_class=HTMLResponse,
                     include_in_schema=False)
    async def walkthrough_page(key: str):
        doc = pages.get(key)
        if doc is None:
            raise APIError(404, "no such walkthrough (only the last few are kept): press the "
                                "walkthrough button again", None, "not_found")
        return HTMLResponse(render_page(doc, assets="/assets/"))
