"""The playground of ``serve`` in real headless Chromium (Debian's package, driven by
playwright), against a live server on 127.0.0.1: type a prompt, Generate, watch the tokens
stream in, click one and read back the model's own probabilities and attention (computed
here from the checkpoint). Prompts and model output full of HTML render as text: no dialog,
no request but to the server, no console error.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request

import pytest
import torch

from minitransformer.config import GPTConfig
from minitransformer.families import load_run
from minitransformer.models import GPT
from minitransformer.serve import Settings, create_app, running
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files
from minitransformer.viz.i18n import catalogue, msg, render
from minitransformer.viz.page import embed_json
from minitransformer.viz.trace import token_labels

ATTACK = "<img src=x onerror=alert(1)><script>alert(2)</script>"
ALPHABET = "abcdefgh ROME:\n" + ATTACK
N_LAYER, N_HEAD = 2, 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A GPT whose alphabet is mostly markup (so its samples are too), far from uniform."""
    folder = tmp_path_factory.mktemp("play") / "markup"
    tokenizer = CharTokenizer.fit(ALPHABET)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=N_LAYER,
                    n_head=N_HEAD, n_embd=24)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(folder, model, meta, tokenizer)
    run = load_run(folder)
    with running(create_app(run, Settings(model_id="markup"))) as url:
        yield url, run



# Every page of a context reports what its CSP refused (the init script runs outside the CSP).
WATCH_CSP = ("window.refused = []; document.addEventListener('securitypolicyviolation', "
             "(e) => window.refused.push(e.violatedDirective + ' ' + e.blockedURI));")


@pytest.fixture
def page(browser, served):
    """The playground in a fresh context whose every page (popups too) is watched: console
    errors, page errors, dialogs, CSP refusals, and every request's URL."""
    url, _ = served
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.add_init_script(WATCH_CSP)
    page = ctx.new_page()
    page.requests, page.errors, page.dialogs = [], [], []
    ctx.on("request", lambda r: page.requests.append(r.url))
    ctx.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    ctx.on("weberror", lambda e: page.errors.append(str(e.error)))
    ctx.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    ctx.set_default_timeout(15000)
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    yield page
    for p in ctx.pages:
        assert p.evaluate("window.refused") == [], p.url
    assert not page.dialogs and not page.errors, (page.dialogs, page.errors)
    assert all(r.startswith("http://127.0.0.1:") for r in page.requests), page.requests
    ctx.close()


def _set(page, selector: str, value) -> None:
    page.eval_on_selector(selector, "(e, v) => { e.value = v; e.dispatchEvent("
                          "new Event('input')); }", str(value))


def generate(page, prompt: str, n: int, seed: int) -> str:
    page.fill("#prompt", prompt)
    _set(page, "#max_tokens", n)
    _set(page, "#temperature", 0.9)
    _set(page, "#top_k", 0)
    _set(page, "#top_p", 1)
    page.fill("#seed", str(seed))
    page.click("#generate")
    page.wait_for_selector(f"body[data-generated='{n}']")
    return page.inner_text("#output")


def test_the_page_is_strict_about_scripts(served):
    url, _ = served
    with urllib.request.urlopen(url, timeout=10) as r:
        csp, html = r.headers["Content-Security-Policy"], r.read().decode()
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    # two scripts, from /assets/; the third element is data (the catalogues), never run
    assert html.count("<script") == 3 and html.count('<script src="/assets/') == 2
    assert html.count('<script type="application/json" id="i18n">') == 1
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


def test_generate_streams_the_seeded_sample_and_markup_stays_text(page, served):
    _, run = served
    text = generate(page, "ROME" + ATTACK, 30, seed=3)
    idx = torch.tensor([run.tokenizer.encode("ROME" + ATTACK)])
    want = run.model.generate(idx, 30, 0.9, None, None, 3)[0].tolist()
    spans = page.eval_on_selector_all("#output .token", "s => s.map(e => e.textContent)")
    assert spans == [run.tokenizer.decode([i]) for i in want]
    assert page.text_content("#output") == run.tokenizer.decode(want)
    assert "<img" in text and page.query_selector("#output img, #output script") is None
    assert page.text_content("#status").startswith("done: 30 tokens")


def test_a_clicked_token_shows_the_models_probabilities_and_attention(page, served):
    _, run = served
    generate(page, "ROME:", 12, seed=1)
    full = page.text_content("#output")
    pos = 9
    page.click(f"#output .token[data-pos='{pos}']")
    page.wait_for_selector(f"#inspect[data-position='{pos}']")
    ids = torch.tensor([run.tokenizer.encode(full)])
    with torch.no_grad():
        logits, _, internals = run.model(ids, return_internals=True)
    probs = torch.softmax(logits[0, pos].float(), -1)
    top = torch.topk(probs, 10)
    shown = page.eval_on_selector_all("#probs td.prob", "c => c.map(e => Number(e.dataset.prob))")
    torch.testing.assert_close(torch.tensor(shown), top.values, atol=1e-5, rtol=1e-5)
    for layer in range(N_LAYER):
        for head in range(N_HEAD):
            page.select_option("#layer", str(layer))
            page.select_option("#head", str(head))
            got = page.eval_on_selector_all("#attention .weight",
                                            "c => c.map(e => Number(e.dataset.weight))")
            want = internals.attentions[layer][0, head, pos, :pos + 1]
            torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=1e-5)
    page.select_option("#head", "all")
    cells = page.eval_on_selector_all("#attention .cell", "c => c.length")
    assert cells == N_HEAD * (pos + 1)


def test_past_the_window_a_token_shows_what_its_generation_step_computed(page, served):
    """75 tokens after a 5-token prompt with block_size 64: the token at 72 was sampled from a
    window that the context shift (16) started at token 17, not the sliding window's 9. The
    probabilities shown are the ones GPT.generate's own step computed (caught on the model)."""
    _, run = served
    n, pos, prompt = 75, 72, "ROME:"
    generate(page, prompt, n, seed=5)
    page.click(f"#output .token[data-pos='{pos}']")
    page.wait_for_selector(f"#inspect[data-position='{pos}']")
    steps = []
    hook = run.model.register_forward_hook(lambda m, args, out: steps.append(out[0][0, -1]))
    try:
        idx = torch.tensor([run.tokenizer.encode(prompt)])
        out = run.model.generate(idx, n, 0.9, None, None, 5)
    finally:
        hook.remove()
    assert page.text_content("#output") == run.tokenizer.decode(out[0].tolist())
    probs = torch.softmax(steps[pos + 1 - idx.shape[1]].float(), -1)  # the step after pos
    shown = page.eval_on_selector_all("#probs td.prob", "c => c.map(e => Number(e.dataset.prob))")
    torch.testing.assert_close(torch.tensor(shown), torch.topk(probs, 10).values, atol=1e-5,
                               rtol=1e-5)
    assert page.get_attribute("#inspect", "data-offset") == "17"
    assert page.eval_on_selector_all("#attention .weight", "c => c.length") == pos - 17 + 1


def test_the_walkthrough_button_opens_the_live_walkthrough_of_the_text(page, served):
    """The eight steps of the text on the page, traced by the server: the walkthrough's own
    script and stylesheet from /assets/ (no inline script, nothing refused by the CSP), the
    same description ``explain`` writes, the text's tokens on step 1."""
    url, run = served
    text = "ROME:" + generate(page, "ROME:", 6, seed=2)[len("ROME:"):]
    with page.expect_popup() as opened:
        page.click("#walkthrough")
    walk = opened.value
    walk.wait_for_selector("body[data-ready=true]")
    ids = run.tokenizer.encode(text)
    assert walk.eval_on_selector_all("#tokens .token .text", "xs => xs.map(x => x.textContent)"
                                     ) == token_labels(run.tokenizer, ids)
    shown = json.loads(walk.text_content("#explain-data"))
    doc = run.family.explain(run.model, run.tokenizer, text, 0, 0, 10, "")
    assert shown["steps"] == json.loads(embed_json(doc))["steps"]
    walk.click('#dots button[data-goto="7"]')
    assert walk.is_visible("#topk li")
    html = walk.content()
    assert html.count("<script") == 2 and '<script src="/assets/explain.js">' in html
    assert "<style" not in html
    assert url + "assets/explain.js" in page.requests and url + "assets/explain.css" in \
        page.requests


# Three or more English words in a row: a sentence (or its start) the catalogue missed.
ENGLISH = re.compile(r"[A-Za-z]{2,}(?:[\s,;:'()-]+[A-Za-z]{2,}){2,}")
# The visible words of the page that are not the model's: tokens, prompts and ids left out.
VISIBLE_WORDS = """() => {
  const skip = "#output, .tok, textarea, #attention .label, code, a[href='/openapi.json']";
  const out = [], walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const e = walk.currentNode.parentElement, text = walk.currentNode.textContent.trim();
    if (text && e.checkVisibility() && !e.closest(skip)) out.push(text);
  }
  return out.join("\\n");
}"""
MARKED = """() => [...document.querySelectorAll("[data-i18n]")].map((e) => [e.dataset.i18n,
  e.textContent])"""


def _labels_are(page, lang: str) -> None:
    ui = catalogue(lang)
    assert [(k, x) for k, x in page.evaluate(MARKED) if x != ui[k]] == []
    for attr in ("title", "placeholder", "aria-label"):
        pairs = page.eval_on_selector_all(f"[data-i18n-{attr}]", f"xs => xs.map(x => ["
                                          f"x.dataset.i18n{attr.title().replace('-', '')}, "
                                          f"x.getAttribute('{attr}')])")
        assert pairs and [(k, x) for k, x in pairs if x != ui[k]] == [], attr
    assert page.title() == ui["play.title"]


def test_the_playground_in_chinese_and_its_toggle(page, served):
    """serve --lang zh: every word on the page is the zh catalogue's (no English sentence
    left); the toggle switches to English and back on the same document and the same data."""
    url, run = served
    with running(create_app(run, Settings(model_id="markup", lang="zh"))) as zh_url:
        page.goto(zh_url)
        page.wait_for_selector("body[data-ready=true]")
        assert page.get_attribute("html", "lang") == "zh-CN"
        generate(page, "ROME:", 8, seed=4)
        page.click("#output .token[data-pos='6']")
        page.wait_for_selector("#inspect[data-position='6']")
        _labels_are(page, "zh")
        zh = catalogue("zh")
        assert page.text_content("#status") == render(
            msg("play.done", n=8, reason=msg("play.finish.length")), "zh")
        assert page.text_content("#at-pos") == render(msg("play.at_pos", pos=6), "zh")
        words = page.evaluate(VISIBLE_WORDS)
        assert zh["play.click_hint"] in words and not ENGLISH.findall(words), words
        numbers = "#probs td.prob, #attention .weight, #output"
        before = page.eval_on_selector_all(numbers, "xs => xs.map(x => x.textContent)")
        page.evaluate("window.stillHere = 42")
        asked = len(page.requests)
        page.click("#lang")
        assert page.get_attribute("html", "lang") == "en" and page.inner_text("#lang") == "中文"
        _labels_are(page, "en")
        assert ENGLISH.findall(page.evaluate(VISIBLE_WORDS))  # the check finds English ones
        assert page.text_content("#status").startswith("done: 8 tokens")
        assert page.eval_on_selector_all(numbers, "xs => xs.map(x => x.textContent)") == before
        assert page.evaluate("window.stillHere") == 42 and len(page.requests) == asked
        page.click("#lang")
        _labels_are(page, "zh")
        assert page.inner_text("#lang") == "English"


@pytest.fixture(scope="module")
def served_seq2seq(tmp_path_factory):
    """An untrained encoder-decoder with a joint BPE fitted on a few sentences."""
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.tokenizers import BPETokenizer

    folder = tmp_path_factory.mktemp("play") / "en-es"
    texts = ["In the beginning God created the heavens.", "En el principio Dios creó los cielos.",
             "The earth was empty.", "La tierra estaba vacía."] * 4
    tokenizer = BPETokenizer.train(texts, 300)
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2,
                        n_embd=16, d_ff=32, dropout=0.0)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(folder, Seq2SeqTransformer(cfg), meta, tokenizer)
    run = load_run(folder)
    with running(create_app(run, Settings(model_id="en-es"))) as url:
        yield url, run


def test_the_translate_view_shows_the_translation_and_its_alignment(browser, served_seq2seq):
    url, run = served_seq2seq
    page = browser.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(15000)
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    assert page.is_visible("#seq2seq") and not page.is_visible("#gpt")
    source = "In the beginning <b>God</b>"
    page.fill("#source", source)
    page.fill("#beam", "2")
    page.click("#translate")
    page.wait_for_selector("#alignment .cell")
    device = torch.device("cpu")
    want = run.family.translate(run.model, run.tokenizer, [source], {"beam": 2}, device)[0]
    assert page.text_content("#translation") == want
    views = run.family.attention_views(run.model, run.tokenizer, source, want)
    cross = next(v for v in views if "cross" in v.name.lower())
    got = page.eval_on_selector_all("#alignment .cell", "c => c.map(e => Number(e.dataset.weight))")
    torch.testing.assert_close(torch.tensor(got), cross.weights.mean(dim=(0, 1)).flatten(),
                               atol=1e-5, rtol=1e-5)
    assert page.query_selector("#seq2seq b") is None and not errors
    assert all(r.startswith(url) for r in requests), requests
    page.close()


@pytest.fixture(scope="module")
def served_encoder(tmp_path_factory, make_encoder):
    """An untrained masked-LM encoder on characters ([MASK] = one id past them)."""
    folder = tmp_path_factory.mktemp("play") / "mlm"
    make_encoder("abcdefgh <>", 32, scale=0.5, folder=folder)
    run = load_run(folder)
    with running(create_app(run, Settings(model_id="mlm"))) as url:
        yield url, run


def test_the_fill_mask_view_shows_the_models_predictions(browser, served_encoder):
    url, run = served_encoder
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(15000)
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]")
    assert page.is_visible("#encoder") and not page.is_visible("#gpt")
    page.fill("#masked", "ab[MASK]d <b>")
    page.click("#fill")
    page.wait_for_selector("#slots[data-slots='1']")
    mask = run.model.config.mask_id
    ids = run.tokenizer.encode("ab") + [mask] + run.tokenizer.encode("d <b>")
    with torch.no_grad():
        logits, _ = run.model(torch.tensor([ids]))
    probs = torch.softmax(logits[0, 2], -1)
    probs[mask] = 0
    shown = page.eval_on_selector_all("#slots td.prob", "c => c.map(e => Number(e.dataset.prob))")
    torch.testing.assert_close(torch.tensor(shown), torch.topk(probs, 5).values)
    assert page.query_selector("#filled b") is None
    page.click("#filled .token[data-pos='0']")  # mask the first token too
    page.wait_for_selector("#slots[data-slots='2']")
    assert page.input_value("#masked") == "[MASK]b[MASK]d <b>" and not errors
    page.close()
