"""The playground: the page at ``/``, its package assets, and the JSON endpoints it calls.

Only the files named in ``ASSETS`` are served, read once from the package (no path from a URL
reaches the file system); the walkthrough's script and stylesheet are among them, for the
walkthrough pages of ``walkthrough.py``. The page's words are the messages of the walkthrough's
catalogues (``viz/i18n.py``), embedded in it as JSON; it opens in the server's ``--lang``.

What a run offers follows its family's commands: a run that samples (GPT) gets tokenize and
inspect (next-token probabilities and attention at one position), a run that translates gets
translate (with the cross-attention of the result), a masked-LM encoder gets fill-mask.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, HTMLResponse, Response

from ..data.sources import is_json_lines, read_documents, source_files
from ..errors import UserError
from ..families.encoder import fills_masks
from ..tokenizers.streaming import continuation
from ..viz import page as walk_page
from ..viz.fonts import cjk_font_file
from ..viz.i18n import HTML_LANG, page_catalogues
from ..viz.trace import token_labels
from . import walkthrough
from .errors import APIError
from .probes import encode, fill_mask, inspect, translate
from .schemas import FillMaskRequest, InspectRequest, TranslateRequest

TABLE_LIKE = (".jsonl", ".ndjson", ".json", ".parquet", ".arrow", ".tsv")  # no first line of text
ASSETS = {"playground.js": "text/javascript", "playground-words.js": "text/javascript",
          "playground.css": "text/css", "fonts.css": "text/css", **walk_page.ASSETS}
FONT = "cjk.otf"  # the packaged CJK font, for machines with none of their own
# Where the font face applies: CJK, Hangul, full-width forms (Latin text keeps its own font).
CJK_RANGE = "U+2E80-9FFF, U+AC00-D7AF, U+F900-FAFF, U+FE30-FE4F, U+FF00-FFEF, U+20000-2FFFF"


def fonts_css() -> str:
    """The font face of the pages' stacks that holds Chinese characters: the packaged CJK
    font, fetched by a browser only for characters no font before it in the stack has."""
    if cjk_font_file() is None:
        return "/* no CJK font in this install: the system's own fonts are used */\n"
    return (f'@font-face {{ font-family: "{walk_page.WEBFONT}"; src: url("/assets/{FONT}") '
            f'format("opentype"); unicode-range: {CJK_RANGE}; }}\n')


def _read(name: str) -> str:
    if name in walk_page.ASSETS:  # the walkthrough's own files, as the offline page inlines
        return walk_page.asset(name)
    if name == "fonts.css":
        return fonts_css()
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


HEAD_BYTES = 4096  # how much of a corpus ``corpus_line`` reads
PROMPT = "ROMEO:"  # the page's own first prompt, where the run's corpus says nothing better


def corpus_line(run, longest: int = 16) -> str | None:
    """The first line of the run's own corpus (of its first file's first few KB, or first
    record's text), at most ``longest`` characters cut at a space, as ``train``'s "sample from
    it" hint takes it; None where the corpus is not readable here (or is sentence pairs) or
    the model cannot read the line."""
    data = run.meta.get("data") if isinstance(run.meta.get("data"), dict) else {}
    source = data.get("source")
    source = source[0] if isinstance(source, list) and source else source
    if not isinstance(source, str) or Path(source).suffix.lower() == ".tsv":
        return None
    encoding = data.get("encoding") or "utf-8"
    try:
        first = source_files([source])[0]  # a folder's first file
        if first.suffix.lower() in TABLE_LIKE or is_json_lines(first):
            doc = next(read_documents([first], data.get("text_field", "text"), encoding), None)
            text = doc.text[:HEAD_BYTES] if doc is not None else ""
        else:
            with open(first, "rb") as f:
                text = f.read(HEAD_BYTES).decode(encoding, errors="ignore")
    except (UserError, OSError, LookupError, ValueError, IndexError):  # gone, unreadable
        return None
    text = text.removeprefix("\ufeff")  # a byte order mark, as train reads past it
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if len(line) > longest:
        line = line[:longest].rsplit(" ", 1)[0] or line[:longest]
    return line if line and readable(run.tokenizer, line) else None


def readable(tokenizer, text: str) -> bool:
    try:
        return bool(tokenizer.encode(text))
    except Exception:  # noqa: BLE001 - characters a char tokenizer never saw, in any form
        return False


def starting_texts(run) -> dict[str, str]:
    """What the page's boxes open with: a prompt from the run's corpus (else ROMEO: where
    the model can read it), and for a masked-LM encoder the same line, its end masked."""
    line = corpus_line(run)
    prompt = line or (PROMPT if readable(run.tokenizer, PROMPT) else None)
    out = {"prompt": prompt} if prompt else {}
    if line and len(line) > 1:
        out["masked"] = line[:-1] + "[MASK]"
    return out


def render_playground(lang: str) -> str:
    """The page opening in ``lang``, with every catalogue embedded for its toggle."""
    return (_read("playground.html").replace("{{html_lang}}", HTML_LANG[lang])
            .replace("{{lang}}", lang).replace("{{i18n}}", walk_page.embed_json(page_catalogues())))


def abilities(run) -> dict[str, bool]:
    """What a run's model does, by its family's commands and its model (never the family's
    name): the page's sections, and where the API's refusals send a request instead."""
    commands = run.family.commands
    return {"completions": "sample" in commands, "translate": "translate" in commands,
            "fill_mask": fills_masks(run.model)}


def router(run, settings, worker, authorized) -> APIRouter:
    """The page, its assets, and /api/... for one loaded run."""
    r = APIRouter()
    page, assets = render_playground(settings.lang), {name: _read(name) for name in ASSETS}
    texts = starting_texts(run)
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
        if name == FONT and cjk_font_file() is not None:  # a package's file, never the URL's
            return FileResponse(cjk_font_file(), media_type="font/otf",
                                headers={"Cache-Control": "max-age=86400"})
        if name not in assets:
            raise APIError(404, f"no asset {name!r}", None, "not_found")
        return Response(assets[name], media_type=ASSETS[name])

    @api.get("/info")
    async def info() -> dict:
        cfg = run.model.config
        return {"model": settings.model_id, "family": run.family.name,
                "title": run.family.title, **abilities(run), "max_tokens": settings.max_tokens,
                "block_size": getattr(cfg, "block_size", None),
                "n_layer": getattr(cfg, "n_layer", None), "n_head": getattr(cfg, "n_head", None),
                "auth": settings.api_key is not None, **texts}

    def need(command: str) -> None:
        if command not in commands:
            raise APIError(400, f"{run.family.title} runs do not {command}", None,
                           "not_applicable")

    @api.post("/tokenize")
    async def tokenize(req: InspectRequest) -> dict:
        need("sample")
        ids = encode(run.tokenizer, req.text)
        return {"ids": ids, "tokens": token_labels(run.tokenizer, ids),
                "texts": [continuation(run.tokenizer, [i]) for i in ids]}

    @api.post("/inspect")
    async def inspect_(req: InspectRequest) -> dict:
        need("sample")
        return await worker.call(lambda job: inspect(run.model, run.tokenizer, req.text,
                                                     req.position, req.top, req.prompt))

    @api.post("/translate")
    async def translate_(req: TranslateRequest) -> dict:
        need("translate")
        return await worker.call(lambda job: translate(run, req.text, req.beam))

    @api.post("/fill-mask")
    async def fill_mask_(req: FillMaskRequest) -> dict:
        if not fills_masks(run.model):
            raise APIError(400, f"{run.family.title} runs do not fill masks", None,
                           "not_applicable")
        return await worker.call(lambda job: fill_mask(run.model, run.tokenizer, req.text,
                                                       req.top))

    walkthrough.add_routes(r, api, run, worker, settings.lang)
    r.include_router(api)
    return r
