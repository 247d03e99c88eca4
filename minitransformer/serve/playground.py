"""The playground: the page at ``/``, its package assets, and the JSON endpoints it calls.

Only the files named in ``ASSETS`` are served, read once from the package (no path from a URL
reaches the file system). What a run offers follows its family's commands: a run that
samples (GPT) gets tokenize and inspect (next-token probabilities and attention at one
position), a run that translates gets translate (with the cross-attention of the result).
"""

from __future__ import annotations

from importlib import resources

import torch
from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from ..errors import UserError
from ..viz.trace import token_labels
from .errors import APIError
from .schemas import InspectRequest, TranslateRequest

ASSETS = {"playground.js": "text/javascript", "playground.css": "text/css"}


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _encode(tokenizer, text: str) -> list[int]:
    try:
        ids = tokenizer.encode(text)
    except (UserError, ValueError, KeyError) as e:
        raise APIError(400, f"text: {e}", "text", "unknown_characters") from None
    if not ids:
        raise APIError(400, "text encodes to no tokens", "text", "empty_prompt")
    return ids


@torch.inference_mode()
def inspect(model, tokenizer, text: str, position: int, top: int) -> dict:
    """Top next-token probabilities and every head's attention at one position of ``text``,
    seen as the model sees it: through the window of at most ``block_size`` tokens that ends
    there (``offset``: the tokens before that window)."""
    ids = _encode(tokenizer, text)
    pos = position if position >= 0 else len(ids) + position
    if not 0 <= pos < len(ids):
        raise APIError(400, f"position {position} is outside the text's {len(ids)} tokens",
                       "position", "bad_position")
    offset = max(0, pos + 1 - model.config.block_size)
    window = ids[offset:pos + 1]
    idx = torch.tensor([window], device=next(model.parameters()).device)  # (1, T)
    logits, _, internals = model(idx, return_internals=True)  # (1, T, V)
    probs = torch.softmax(logits[0, -1].float(), dim=-1)  # (V,)
    best = torch.topk(probs, min(top, probs.numel()))
    return {"offset": offset, "position": pos, "tokens": token_labels(tokenizer, window),
            "top": [{"token": label, "id": int(i), "prob": float(p)} for label, i, p in
                    zip(token_labels(tokenizer, best.indices.tolist()), best.indices,
                        best.values, strict=True)],
            "attention": [[row.tolist() for row in a[0, :, -1, :].float()]
                          for a in internals.attentions]}  # [layer][head][key]


def translate(run, text: str, beam: int) -> dict:
    """The translation of one sentence and the cross-attention that produced it."""
    device = next(run.model.parameters()).device
    try:
        out = run.family.translate(run.model, run.tokenizer, [text], {"beam": beam}, device)[0]
    except UserError as e:  # a sentence longer than the model reads, say
        raise APIError(400, f"text: {e}", "text", "bad_text") from None
    views = {v.name: v for v in run.family.attention_views(run.model, run.tokenizer, text, out)}
    cross = next((v for name, v in views.items() if "cross" in name.lower()), None)
    body = {"translation": out}
    if cross is not None:
        body["cross_attention"] = {"weights": cross.weights.mean(dim=(0, 1)).tolist(),
                                   "source": cross.key_labels, "target": cross.query_labels}
    return body


def router(run, settings, worker, authorized) -> APIRouter:
    """The page, its assets, and /api/... for one loaded run."""
    r = APIRouter()
    page, assets = _read("playground.html"), {name: _read(name) for name in ASSETS}
    commands = run.family.commands
    api = APIRouter(prefix="/api", dependencies=[Depends(authorized)])

    @r.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(page)

    @r.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return Response(status_code=204)  # no icon, and no 404 in the browser's console

    @r.get("/assets/{name}", include_in_schema=False)
    async def asset(name: str):
        if name not in assets:
            raise APIError(404, f"no asset {name!r}", None, "not_found")
        return Response(assets[name], media_type=ASSETS[name])

    @api.get("/info")
    async def info() -> dict:
        cfg = run.model.config
        return {"model": settings.model_id, "family": run.family.name,
                "title": run.family.title, "completions": "sample" in commands,
                "translate": "translate" in commands, "max_tokens": settings.max_tokens,
                "block_size": getattr(cfg, "block_size", None),
                "n_layer": getattr(cfg, "n_layer", None), "n_head": getattr(cfg, "n_head", None),
                "auth": settings.api_key is not None}

    def need(command: str) -> None:
        if command not in commands:
            raise APIError(400, f"{run.family.title} runs do not {command}", None,
                           "not_applicable")

    @api.post("/tokenize")
    async def tokenize(req: InspectRequest) -> dict:
        need("sample")
        ids = _encode(run.tokenizer, req.text)
        return {"ids": ids, "tokens": token_labels(run.tokenizer, ids),
                "texts": [run.tokenizer.decode([i]) for i in ids]}

    @api.post("/inspect")
    async def inspect_(req: InspectRequest) -> dict:
        need("sample")
        return await worker.call(lambda job: inspect(run.model, run.tokenizer, req.text,
                                                     req.position, req.top))

    @api.post("/translate")
    async def translate_(req: TranslateRequest) -> dict:
        need("translate")
        return await worker.call(lambda job: translate(run, req.text, req.beam))

    r.include_router(api)
    return r
