"""One self-contained HTML file: inline CSS and JavaScript, the data as embedded JSON.

The page makes no network request of any kind: no CDN, no fonts, no images from elsewhere, and
a Content-Security-Policy that forbids them, so it works offline and from an email attachment.
A server renders the same page with ``assets="/assets/"``: its script and stylesheet are then
links to the server's copies of the same files (``ASSETS``), so its CSP can forbid inline script.
The data sits in a ``<script type="application/json">`` element with ``<``, ``>`` and ``&``
written as ``\\u003c`` etc., so no text in it (a prompt such as ``</script><script>...``) can
end the element or be read as markup; the script builds the page with ``textContent`` only.

Every sentence, label and button comes from the message catalogues (``i18n.py``); the page
embeds them all, opens in the document's ``lang`` and switches language with its toggle.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from importlib import resources
from pathlib import Path

from ..errors import UserError
from ..io import atomic_write
from .fonts import cjk_webfont
from .i18n import HTML_LANG, LANG_NAMES, LANGS, msg, page_catalogues, render

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")
SERVED_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
              "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'")
ASSETS = {"explain.js": "text/javascript", "explain.css": "text/css"}  # what a server serves
WEBFONT = "minitransformer-cjk"  # the family name of the embedded CJK subset

GENERATOR = '<meta name="generator" content="minitransformer">'  # how explain knows its pages
TEMPLATE = """<!DOCTYPE html>
<html lang="{html_lang}">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
{generator}
{icon}<title>{title}</title>
{styles}
</head>
<body>
<header><h1 id="title"></h1><p id="subtitle"></p></header>
<nav id="toolbar" aria-label="{ui[toolbar]}">
  <button type="button" id="prev">{ui[prev]}</button>
  <button type="button" id="next" class="primary">{ui[next]}</button>
  <button type="button" id="play" aria-pressed="false">{ui[autoplay]}</button>
  <span id="counter"></span>
  <span id="selectors">
    <label for="layer" id="layer-label">{ui[layer]}</label> <select id="layer"></select>
    <label for="head" id="head-label">{ui[head]}</label> <select id="head"></select>
  </span>
  <button type="button" id="lang" title="{ui[switch]}">{other}</button>
  <span id="dots"></span>
</nav>
<main id="stage"><noscript>{ui[noscript]}</noscript></main>
<script type="application/json" id="explain-data">{data}</script>
{script}
</body>
</html>
"""


def asset(name: str) -> str:
    """The text of one of the page's files (``ASSETS``), from the package."""
    return resources.files("minitransformer.viz").joinpath("assets", name).read_text("utf-8")


def _finite(obj):
    """Replace non-finite floats by None (JSON has no infinity; the page shows None as -inf)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def embed_json(data) -> str:
    """JSON that is safe inside a <script> element: <, >, &, U+2028, U+2029 escaped."""
    text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def font_face(doc: dict) -> str:
    """An @font-face rule embedding the CJK characters the page shows, or ''."""
    font = cjk_webfont("".join(_strings(doc)))
    if font is None:
        return ""
    data = base64.b64encode(font).decode("ascii")
    return (f"@font-face {{ font-family: \"{WEBFONT}\"; "
            f"src: url(data:font/woff;base64,{data}) format(\"woff\"); }}\n")


def _check_lang(lang: str) -> str:
    if lang not in LANGS:
        raise UserError(f"--lang {lang}: choose {' or '.join(LANGS)}")
    return lang


def _inline(doc: dict) -> dict:
    return {"csp": CSP, "icon": '<link rel="icon" href="data:,">\n',
            "styles": f"<style>\n{font_face(doc)}{asset('explain.css')}\n</style>",
            "script": f"<script>\n{asset('explain.js')}\n</script>"}


def _linked(base: str, extra_css: tuple[str, ...]) -> dict:
    base = html.escape(base)
    links = [f'<link rel="stylesheet" href="{base}{html.escape(name)}">'
             for name in ("explain.css", *extra_css)]
    return {"csp": SERVED_CSP, "icon": "", "styles": "\n".join(links),
            "script": f'<script src="{base}explain.js"></script>'}


def render_page(doc: dict, lang: str | None = None, assets: str | None = None,
                extra_css: tuple[str, ...] = ()) -> str:
    """The HTML text of a walkthrough described by ``doc`` (title, steps, blocks), opening in
    ``lang`` (default: the doc's own, else English).

    ``assets``: a URL prefix such as ``"/assets/"`` from which the page loads ``explain.css``
    and ``explain.js`` (a served page, under a CSP without inline script or style), and the
    stylesheets named in ``extra_css`` from there too (the server's font faces: CJK text then
    takes the font stack, not an embedded subset). Default: all inline, one self-contained
    file."""
    lang = _check_lang(lang or doc.get("lang") or "en")
    other = next(x for x in LANGS if x != lang)
    doc = {**doc, "lang": lang, "i18n": page_catalogues()}
    ui = {k: html.escape(render(msg(f"ui.{k}"), lang)) for k in
          ("toolbar", "prev", "next", "autoplay", "layer", "head", "noscript")}
    ui["switch"] = html.escape(render(msg("ui.switch", name=LANG_NAMES[other]), lang))
    parts = _inline(doc) if assets is None else _linked(assets, extra_css)
    return TEMPLATE.format(title=html.escape(render(doc.get("title", "walkthrough"), lang)),
                           generator=GENERATOR, html_lang=HTML_LANG[lang], ui=ui,
                           other=LANG_NAMES[other], data=embed_json(doc), **parts)


def write_page(doc: dict, out, lang: str | None = None) -> Path:
    """Write the page atomically to ``out`` (opening in ``lang``, see ``render_page``)."""
    out = Path(out)
    if not out.parent.exists():
        raise UserError(f"cannot write {out}: the folder {out.parent} does not exist")
    text = render_page(doc, lang)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    try:
        atomic_write(out, write)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(out, 0o644 & ~umask)  # a page to share, not a private temporary file
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    return out
