"""The walkthrough and worked-example pages in Chinese, in real headless Chromium.

With ``--lang zh`` every visible string is the zh catalogue's (checked element by element
against the page's own data rendered in Python, and no English sentence is left anywhere); the
toggle switches language without reloading or touching the data, and the numbers are the same
in both languages; BPE token chips of a Chinese sentence read as its characters.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import typing

import pytest
import torch

from minitransformer.cli import main
from minitransformer.config import GPTConfig
from minitransformer.data import load_text
from minitransformer.models import GPT
from minitransformer.nn.positional import PosEncoding
from minitransformer.tokenizers import CharTokenizer, fit_tokenizer
from minitransformer.training.checkpoint import write_model_files
from minitransformer.viz.i18n import catalogue, msg, problems, render

TEXT = "从前有座山，山里有座庙。"
POEM = "床前明月光，疑是地上霜。"
# Three or more English words in a row: a sentence (or its start) the catalogue missed.
ENGLISH = re.compile(r"[A-Za-z]{2,}(?:[\s,;:'()-]+[A-Za-z]{2,}){2,}")


def _save(folder, tokenizer, seed: int = 0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2,
                    n_embd=16, pos_encoding="rope")
    model = GPT(cfg).eval()
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "tang"}}
    write_model_files(folder, model, meta, tokenizer)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("zh_site")
    _save(root / "char", CharTokenizer.fit(TEXT + "abc"))
    for lang in ("zh", "en"):
        assert main(["explain", str(root / "char"), "--text", TEXT, "--out",
                     str(root / f"walk-{lang}.html"), "--lang", lang]) == 0
    assert main(["explain", "--worked_example", "--out", str(root / "worked-zh.html"),
                 "--lang", "zh"]) == 0
    _save(root / "bpe", fit_tokenizer("bpe-bytes", load_text("tang"), 2000))
    assert main(["explain", str(root / "bpe"), "--text", POEM, "--out",
                 str(root / "bpe.html"), "--lang", "zh"]) == 0
    return root



def page_data(path) -> dict:
    """The data the page itself embeds (its JSON script element)."""
    text = path.read_text(encoding="utf-8")
    raw = re.search(r'id="explain-data">(.*?)</script>', text, re.S).group(1)
    return json.loads(html.unescape(raw) if "&quot;" in raw else raw)


class Page:
    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.url = path.as_uri()
        self.requests, self.errors = [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready=true]")

    def goto(self, n: int):
        self.page.click(f'#dots button[data-goto="{n - 1}"]')

    def texts(self, selector: str) -> list[str]:
        return self.page.eval_on_selector_all(selector, "xs => xs.map(x => x.textContent)")

    def numbers(self) -> list:
        """Every number of the current step: cell values and texts, top-k probabilities."""
        return self.page.eval_on_selector_all(
            "#stage td, #topk li", "xs => xs.map(x => [x.dataset.value || x.dataset.prob, "
            "x.textContent.replace(/[^0-9.\u2212%-]/g, '')])")


def _fill(text: str, layer: int = 0, head: int = 0) -> str:
    return text.replace("{layer}", str(layer)).replace("{head}", str(head))


def check_against_catalogue(p: Page, data: dict, lang: str) -> None:
    """Each step's every string is the catalogue's rendering of the page's data."""
    ui = catalogue(lang)
    assert p.page.inner_text("#title") == render(data["title"], lang)
    assert p.page.inner_text("#subtitle") == render(data["subtitle"], lang)
    assert [p.page.inner_text(f"#{b}") for b in ("prev", "next", "play")] == \
        [ui["ui.prev"], ui["ui.next"], ui["ui.autoplay"]]
    for n, step in enumerate(data["steps"], 1):
        p.goto(n)
        assert p.page.inner_text("#step-title") == f"{n}. {_fill(render(step['title'], lang))}"
        assert p.page.inner_text("#counter") == render(
            {"m": "ui.counter", "a": {"i": str(n), "n": str(len(data["steps"]))}}, lang)
        assert p.texts("#formulas") == ["\n".join(render(f, lang) for f in step["formulas"])]
        assert p.texts("#step > p") == [render(t, lang) for t in step["text"]]
        shown = [b for b in step["blocks"] if b["kind"] == "topk"] + \
            [b for b in step["blocks"] if b["kind"] != "topk"]  # probabilities first
        titles = [_fill(render(b["title"], lang)) for b in shown if b.get("title")]
        assert p.texts(".block h3") == titles
        notes = [render(b["note"], lang) for b in step["blocks"] if b.get("note")]
        assert p.texts(".block .note") == notes
        body = p.page.inner_text("body")
        if lang == "zh":
            assert not ENGLISH.findall(body), (step["id"], ENGLISH.findall(body))
        else:  # the same check finds the English sentences on the English side
            assert ENGLISH.findall(body), step["id"]


def test_catalogues_agree():
    assert problems() == []
    en, zh = catalogue("en"), catalogue("zh")
    untranslated = [k for k in en if en[k] == zh[k] and ENGLISH.search(en[k])]
    assert untranslated == []


@pytest.mark.parametrize("pe", typing.get_args(PosEncoding))
def test_every_position_encoding_is_named_in_chinese(pe):
    """The walkthrough's subtitle names the model's positions from the catalogue (it once
    showed the config's own word: "learned 位置编码")."""
    zh = render(msg(f"pe.{pe}"), "zh")
    assert pe not in zh and re.search("[\u4e00-\u9fff]", zh)
    assert render(msg("walk.subtitle", source="", layers=1, heads=1, d=8, norm="Pre-LN",
                      pos=msg(f"pe.{pe}")), "zh").count(zh) == 1


def test_walkthrough_in_chinese_comes_from_the_catalogue(browser, site):
    p = Page(browser, site / "walk-zh.html")
    assert p.page.get_attribute("html", "lang") == "zh-CN"
    check_against_catalogue(p, page_data(site / "walk-zh.html"), "zh")
    assert p.page.inner_text("#lang") == "English"
    assert p.page.title() == render(page_data(site / "walk-zh.html")["title"], "zh")
    assert p.errors == [] and p.requests == [p.url]


def test_toggle_switches_without_reloading_and_keeps_the_numbers(browser, site):
    p = Page(browser, site / "walk-zh.html")
    data = page_data(site / "walk-zh.html")
    p.page.evaluate("window.stillHere = 42")
    zh_numbers = {}
    for n in range(1, 9):
        p.goto(n)
        zh_numbers[n] = p.numbers()
    p.goto(5)
    p.page.click("#lang")
    assert p.page.get_attribute("html", "lang") == "en"
    assert p.page.evaluate("window.stillHere") == 42  # the same document, not reloaded
    assert p.page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert p.page.get_attribute("#step", "data-step") == "5"  # where the reader was
    assert p.page.inner_text("#lang") == "中文"
    check_against_catalogue(p, data, "en")
    for n in range(1, 9):
        p.goto(n)
        assert p.numbers() == zh_numbers[n], n
    # the English page written with --lang en is this page's English side
    assert page_data(site / "walk-en.html")["steps"] == data["steps"]
    p.page.click("#lang")
    assert p.page.get_attribute("html", "lang") == "zh-CN"
    assert p.errors == [] and p.requests == [p.url]


def test_worked_example_in_chinese(browser, site):
    p = Page(browser, site / "worked-zh.html")
    data = page_data(site / "worked-zh.html")
    check_against_catalogue(p, data, "zh")
    p.goto(4)
    zh = p.numbers()
    p.page.click("#lang")
    check_against_catalogue(p, data, "en")
    p.goto(4)
    assert p.numbers() == zh and any("0.67" in text for _, text in zh)
    assert p.errors == [] and p.requests == [p.url]


def test_bpe_token_chips_read_as_the_characters(browser, site):
    """Byte-level BPE (vocabulary 2,000 on tang): the chips show 床, 前, 明月 ..., not åº."""
    p = Page(browser, site / "bpe.html")
    p.goto(1)
    chips = p.texts("#tokens .token .text")
    assert "".join(chips) == POEM
    assert len(chips) < len(POEM)  # some merged into words: these are BPE tokens
    assert not re.search(r"[\u00c0-\u017f]", "".join(chips))
    p.goto(2)
    rows = p.texts("#token-embeddings tbody th")
    assert rows == chips
    assert p.errors == []
