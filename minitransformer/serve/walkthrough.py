"""The playground's walkthrough button: the eight-step ``explain`` page of a text, computed live.

    POST /api/walkthrough   trace the model on a text (the family's ``explain``, on the worker
                            thread) and keep the page description; answers with its URL
    GET  /walkthrough/ID    that page: ``viz.page.render_page`` with its script and stylesheet
                            linked from /assets/ (the walkthrough's own files), never inline

The ID is a random token handed out by the POST, so opening the page in a new tab needs no
API key of its own (the POST did). Only the last ``KEEP`` pages are kept, as HTML text (far
smaller than the description's nested lists, and rendered on the worker thread, not the
event loop).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..errors import UserError
from ..families.base import data_label
from ..viz.i18n import msg
from ..viz.page import render_page
from ..viz.walkthrough import DISPLAY_TOKENS
from .errors import APIError
from .schemas import WalkthroughRequest

KEEP = 8


class Pages:
    """The last ``keep`` walkthrough pages by ID (touched on the event loop only)."""

    def __init__(self, keep: int = KEEP):
        self.keep, self._pages = keep, OrderedDict()

    def add(self, html: str) -> str:
        key = secrets.token_urlsafe(16)
        self._pages[key] = html
        while len(self._pages) > self.keep:
            self._pages.popitem(last=False)
        return key

    def get(self, key: str) -> str | None:
        return self._pages.get(key)


def check_choice(model, req: WalkthroughRequest) -> None:
    """The layer and head the page opens on, checked here so that a 400 names its own field
    (the walkthrough's own check speaks of the ``explain`` command's flags)."""
    cfg = model.config
    for name, value, n in (("layer", req.layer, cfg.n_layer), ("head", req.head, cfg.n_head)):
        if value >= n:
            raise APIError(400, f"{name} {value} is out of range: the model has {n} {name}s "
                                f"(0 to {n - 1})", name, "invalid_value")


def explain(run, req: WalkthroughRequest, lang: str) -> tuple[str, dict]:
    """The family's walkthrough of ``req.text`` as a served page (HTML text) opening in
    ``lang``, and what the API answers about it; a user error becomes a 400."""
    source = data_label(run.meta, run.folder.name)
    text, dropped = last_tokens(run, req.text) if req.tail else (req.text, 0)
    try:
        doc = run.family.explain(run.model, run.tokenizer, text, req.layer, req.head,
                                 req.top, msg("walk.trained_on", source=source))
    except UserError as e:  # text too long for the page, characters the tokenizer lacks
        raise APIError(400, f"text: {e}", "text", "bad_text") from None
    tokens = next(b["tokens"] for b in doc["steps"][0]["blocks"] if b["kind"] == "tokens")
    page = render_page(doc, lang, assets="/assets/", extra_css=("fonts.css",))
    return page, {"steps": len(doc["steps"]), "tokens": tokens, "dropped": dropped}


def last_tokens(run, text: str) -> tuple[str, int]:
    """(the end of ``text`` that fits the page and the model's window, tokens left out).
    The cut starts at a whole character: byte-level BPE may split one between tokens."""
    tok = run.tokenizer
    try:  # the page reads the text as a prompt: room for a start token such as Llama's <s>
        specials = len(tok.encode_prompt(""))
        limit = min(run.model.config.block_size, DISPLAY_TOKENS) - specials
        ids = tok.encode_prompt(text)[specials:]  # as a prompt (a char model's CRLF read as \n)
    except Exception:  # noqa: BLE001 - unseen characters: explain says so, naming them
        return text, 0
    kept, dropped = text, 0
    for _ in range(4):  # decoding a cut may spell its first token anew: cut again
        if len(ids) <= limit:
            break
        start = len(ids) - limit
        while start < len(ids) - 1 and tok.decode(ids[start:start + 1]) == "\ufffd" and \
                tok.decode(ids[start:]).startswith("\ufffd"):
            start += 1  # the rest of a character whose first bytes were cut off
        dropped += start
        kept = tok.decode(ids[start:])
        ids = tok.encode(kept)
    return kept, dropped


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
        check_choice(run.model, req)
        html, about = await worker.call(lambda job: explain(run, req, req.lang or lang))
        return {"url": f"/walkthrough/{pages.add(html)}", **about}

    @page_router.get("/walkthrough/{key}", response_class=HTMLResponse,
                     include_in_schema=False)
    async def walkthrough_page(key: str):
        html = pages.get(key)
        if html is None:
            raise APIError(404, "no such walkthrough (only the last few are kept): press the "
                                "walkthrough button again", None, "not_found")
        return HTMLResponse(html)
