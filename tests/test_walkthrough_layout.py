"""The walkthrough page as a learner sees it at 1,360 px: a colour legend beside every heatmap,
no horizontal scroll, the next-token probabilities of step 8 above the fold, and Chinese text
drawn with a CJK font in the title, the formula box and the token cards."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minitransformer.cli import main
from minitransformer.config import GPTConfig
from minitransformer.models import GPT
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files

TEXT = "从前有座山，山里有座庙"  # 11 tokens: every matrix of the page, 64 channels wide
CJK_FONTS = ("minitransformer-cjk", "Noto Sans CJK", "Noto Serif CJK", "WenQuanYi",
             "Source Han", "Droid Sans Fallback", "AR PL")


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    return _walkthrough(root, CharTokenizer.fit(TEXT + "。"), TEXT, n_layer=2, n_head=4,
                        n_embd=64)


def _walkthrough(root, tok, text: str, **sizes):
    """A random GPT run folder in root/run with ``tok``, and its walkthrough of ``text``
    (root/w.html), written by the command."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, **sizes)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(root / "run", GPT(cfg).eval(), meta, tok)
    assert main(["explain", str(root / "run"), "--text", text, "--out",
                 str(root / "w.html")]) == 0
    return root / "w.html"


@pytest.fixture(scope="module", params=["en", "zh"])
def page(page_file, browser, request):
    html = page_file.with_name(f"w-{request.param}.html")
    if not html.exists():  # the same page opening in each language
        assert main(["explain", str(page_file.parent / "run"), "--text", TEXT, "--out",
                     str(html), "--lang", request.param]) == 0
    pg = browser.new_page(viewport={"width": 1360, "height": 900})
    pg.goto(html.as_uri())
    pg.wait_for_selector("#step")
    yield pg
    pg.close()


def _steps(page):
    n = page.evaluate("document.querySelectorAll('#dots button').length")
    for i in range(n):
        page.click(f"#dots button >> nth={i}")
        page.wait_for_selector(f"#step[data-step='{i + 1}']")
        yield i + 1


def test_every_heatmap_has_a_legend_and_nothing_scrolls_sideways(page):
    seen = 0
    for step in _steps(page):
        tables = page.evaluate("document.querySelectorAll('table.matrix').length")
        legends = page.evaluate(
            "[...document.querySelectorAll('table.matrix')]"
            ".filter(t => t.parentElement.querySelector('.legend .bar')).length")
        assert legends == tables, step
        seen += tables
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], (step, width)
        clipped = page.evaluate(
            "[...document.querySelectorAll('.block')].filter(b => b.scrollWidth > "
            "b.clientWidth + 1).length")
        assert clipped == 0, step  # no card needs its own horizontal scroll either
    assert seen > 10


def test_step_8_shows_the_probabilities_above_the_fold(page):
    page.click("#dots button >> nth=7")
    page.wait_for_selector("#step[data-step='8']")
    top = page.evaluate("document.querySelector('ol.topk').getBoundingClientRect().top")
    assert 0 < top < page.evaluate("window.innerHeight")


def _fonts(page, selector: str) -> list[str]:
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    return [f["familyName"] for f in fonts if f["glyphCount"] > 0]


@pytest.mark.parametrize("selector", ["#step-title", ".token .text", "header h1", ".step .formula"])
def test_chinese_text_is_drawn_with_a_cjk_font(page, selector):
    page.click("#dots button >> nth=0")
    page.wait_for_selector("#step[data-step='1']")
    text = page.evaluate(f"document.querySelector({selector!r}).textContent")
    families = _fonts(page, selector)
    if any("\u4e00" <= ch <= "\u9fff" for ch in text):
        assert any(f.startswith(CJK_FONTS) for f in families), (selector, text, families)
    else:
        assert families, selector


def test_vertical_headers_keep_chinese_upright(browser, tmp_path):
    """Columns named by longer tokens turn their labels to read upwards; Chinese ones stand
    upright (vertical-rl unturned), not upside down."""
    from minitransformer.tokenizers.bpe import BPETokenizer

    text = "从前有座山，山里有座庙 abc def"
    tok = BPETokenizer.train_chars(["从前有座山，山里有座庙。" * 50 + "abc def ghi " * 20], 400)
    html = _walkthrough(tmp_path, tok, text, n_layer=1, n_head=2, n_embd=32)
    pg = browser.new_page(viewport={"width": 1360, "height": 900})
    try:
        pg.goto(html.as_uri())
        pg.wait_for_selector("#step")
        turns = {}
        for _ in _steps(pg):
            turns.update(pg.evaluate("""() => Object.fromEntries(Array.from(
                document.querySelectorAll('table.matrix.vertical thead th[scope=col]'),
                th => [th.textContent, getComputedStyle(th).transform]))"""))
        assert turns.get("从前有座山") == "none", turns
        assert turns.get("␣abc", turns.get(" abc")) not in (None, "none"), turns
    finally:
        pg.close()
