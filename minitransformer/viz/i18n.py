"""Message catalogues: every sentence, label and button of the pages, one JSON file per language.

The pages are the walkthrough, the worked example and ``serve``'s playground (its keys start
with ``play.``; the playground reuses the walkthrough's ``ui.`` labels where they fit).

A page description never holds an English sentence. It holds messages, ``{"m": key, "a":
{name: value}}``, and the page renders each one from the catalogue of the language chosen
(``assets/i18n/en.json``, ``assets/i18n/zh.json``), so the toggle on the page switches language
without touching the data. Numbers, formulas and the model's tokens are arguments or plain
strings and so stay the same in every language.

Templates use ``{name}`` for arguments. ``{layer}`` and ``{head}`` are left for the page to
fill with the reader's selection.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources

LANGS = ("en", "zh")
LANG_NAMES = {"en": "English", "zh": "中文"}
HTML_LANG = {"en": "en", "zh": "zh-CN"}
PAGE_SLOTS = frozenset({"layer", "head"})  # filled in the browser, never by an argument
PLACEHOLDER = re.compile(r"\{(\w+)\}")


@functools.cache
def catalogue(lang: str) -> dict[str, str]:
    """The messages of ``lang`` (key -> template)."""
    if lang not in LANGS:
        raise ValueError(f"no catalogue for language {lang!r}: choose {', '.join(LANGS)}")
    path = resources.files("minitransformer.viz").joinpath("assets", "i18n", f"{lang}.json")
    return json.loads(path.read_text("utf-8"))


def msg(key: str, **args) -> dict:
    """A message for the page: ``key`` of the catalogues with its arguments (numbers become
    strings here, so every language shows the same digits)."""
    if key not in catalogue("en"):
        raise KeyError(f"no message {key!r} in the catalogues")
    return {"m": key, "a": {k: v if isinstance(v, (dict, str)) else str(v)
                            for k, v in args.items()}}


def is_msg(value) -> bool:
    return isinstance(value, dict) and set(value) == {"m", "a"}


def render(value, lang: str = "en") -> str:
    """The text of a message (or a plain string) in ``lang``; {layer} and {head} stay."""
    if not is_msg(value):
        return str(value)
    args = {k: render(v, lang) for k, v in value["a"].items()}
    return PLACEHOLDER.sub(lambda m: args.get(m.group(1), m.group(0)),
                           catalogue(lang)[value["m"]])


def resolve(obj, lang: str = "en"):
    """``obj`` with every message rendered in ``lang`` (for tests, titles and plain text)."""
    if is_msg(obj):
        return render(obj, lang)
    if isinstance(obj, dict):
        return {k: resolve(v, lang) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve(v, lang) for v in obj]
    return obj


def problems() -> list[str]:
    """What is wrong with the catalogues: keys missing in a language, placeholders that
    differ between languages. Empty when they agree."""
    out = []
    base = catalogue("en")
    for lang in LANGS[1:]:
        other = catalogue(lang)
        out += [f"{lang}: missing {k}" for k in base.keys() - other.keys()]
        out += [f"{lang}: unknown {k}" for k in other.keys() - base.keys()]
        for k in base.keys() & other.keys():
            a, b = set(PLACEHOLDER.findall(base[k])), set(PLACEHOLDER.findall(other[k]))
            if a != b:
                out.append(f"{lang}: {k} has {sorted(b)}, en has {sorted(a)}")
    return out


def page_catalogues() -> dict:
    """What a page embeds: the languages, their names and every catalogue."""
    return {"langs": list(LANGS), "names": LANG_NAMES, "html": HTML_LANG,
            "messages": {lang: catalogue(lang) for lang in LANGS}}
