"""The HTML walkthrough in real headless Chromium (Debian's package, driven by playwright).

One browser for the module; three pages: a model's walkthrough, one for a text made of
HTML/JS injection attempts, and the worked example. Every page must make no request but the
one for its own file, log no console error, and show exactly the model's numbers.
"""

from __future__ import annotations

import dataclasses
import io
import math

import matplotlib.image
import pytest
import torch

from minitransformer.cli import main
from minitransformer.config import GPTConfig
from minitransformer.models import GPT
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files
from minitransformer.viz.page import write_page
from minitransformer.viz.trace import show_token
from minitransformer.viz.worked import worked_example_doc

TEXT = "我吃了一个红苹果, to be"
ATTACKS = ["<script>alert(1)</script>", "\"'><img src=x onerror=alert(1)>"]
STEP_IDS = ["tokenize", "embed", "positions", "qkv", "attention", "residual", "ffn", "output"]
N_LAYER, N_HEAD = 2, 3


def _save(folder, norm: str, pos: str, alphabet: str, seed: int):
    tokenizer = CharTokenizer.fit(alphabet)
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=48, n_layer=N_LAYER,
                    n_head=N_HEAD, n_embd=24, norm_position=norm, pos_encoding=pos)
    model = GPT(cfg).eval()
    with torch.no_grad():  # far from uniform attention, so switching heads visibly changes it
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(folder, model, meta, tokenizer)
    return model, tokenizer


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The three pages, written through the CLI and the page writer."""
    root = tmp_path_factory.mktemp("site")
    model, tokenizer = _save(root / "zh", "pre", "learned", TEXT + "abcdefg", 0)
    assert main(["explain", str(root / "zh"), "--text", TEXT, "--out",
                 str(root / "model.html")]) == 0
    _save(root / "xss", "post", "alibi", "".join(ATTACKS) + "xyz", 1)
    for i, attack in enumerate(ATTACKS):
        assert main(["explain", str(root / "xss"), "--text", attack, "--out",
                     str(root / f"xss{i}.html")]) == 0
    doc = worked_example_doc()
    doc["autoplay_ms"] = 150  # a quick autoplay for the test
    write_page(doc, root / "worked.html")
    return root, model, tokenizer



class Watched:
    """A page with every request, console error, page error and dialog recorded."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.url = path.as_uri()
        self.requests, self.errors, self.dialogs = [], [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready=true]")

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def goto_step(self, n: int):
        self.page.click(f'#dots button[data-goto="{n - 1}"]')
        assert self.page.get_attribute("#step", "data-step") == str(n)

    def matrix(self, block_id: str) -> torch.Tensor:
        rows = self.page.eval_on_selector(f"#{block_id}", """t => Array.from(
            t.querySelectorAll('tbody tr'), r => Array.from(r.querySelectorAll('td'),
            c => Number(c.dataset.value)))""")
        return torch.tensor(rows, dtype=torch.float64)

    def only_its_own_request(self):
        assert self.requests == [self.url], self.requests


@pytest.fixture(scope="module")
def model_page(browser, site):
    root, model, tokenizer = site
    return Watched(browser, root / "model.html")


def test_steps_through_all_eight_with_next(model_page):
    w = model_page
    w.goto_step(1)
    seen = []
    for n in range(1, 9):
        assert w.page.get_attribute("#step", "data-step") == str(n)
        seen.append(w.page.get_attribute("#step", "data-step-id"))
        assert w.page.is_disabled("#prev") == (n == 1)
        if n < 8:
            w.page.click("#next")
    assert seen == STEP_IDS
    assert w.page.is_disabled("#next")
    shot = matplotlib.image.imread(io.BytesIO(w.page.screenshot(full_page=True)))
    assert shot[..., :3].std() > 0.05  # not blank
    dark = (shot[..., :3].mean(-1) < 0.5).mean()
    assert dark > 0.005, "almost nothing drawn"
    w.page.click("#prev")
    assert w.page.get_attribute("#step", "data-step") == "7"
    assert w.errors == [] and w.dialogs == []
    w.only_its_own_request()


def test_shown_attention_is_the_models_for_every_layer_and_head(model_page, site):
    _, model, tokenizer = site
    w = model_page
    ids = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        _, _, internals = model(ids, return_internals=True)
    w.goto_step(5)
    shown = {}
    for layer in range(N_LAYER):
        for head in range(N_HEAD):
            w.page.select_option("#layer", str(layer))
            w.page.select_option("#head", str(head))
            table = w.page.query_selector("#attn-weights")
            assert (table.get_attribute("data-layer"), table.get_attribute("data-head")) == \
                (str(layer), str(head))
            shown[layer, head] = w.matrix("attn-weights")
            expected = internals.attentions[layer][0, head].double()
            torch.testing.assert_close(shown[layer, head], expected, atol=2e-6, rtol=1e-5)
            title = w.page.inner_text("#step-title")
            assert f"layer {layer}" in title
    assert not torch.allclose(shown[0, 0], shown[0, 1], atol=1e-3)  # switching switches
    assert not torch.allclose(shown[0, 0], shown[1, 0], atol=1e-3)
    tokens = w.page.eval_on_selector_all("#attn-weights tbody th", "hs => hs.map(h => "
                                         "h.textContent)")
    assert tokens == [show_token(ch) for ch in TEXT]
    assert w.errors == []
    w.only_its_own_request()


def test_top_k_probabilities_are_the_models(model_page, site):
    _, model, tokenizer = site
    w = model_page
    w.goto_step(8)
    items = w.page.eval_on_selector_all("#topk li", """ls => ls.map(l => [
        Number(l.dataset.tokenId), Number(l.dataset.prob), l.querySelector('.tok').textContent])""")
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokenizer.encode(TEXT)]))
    ref = torch.softmax(logits[0, -1].double(), -1).topk(10)
    assert [i for i, _, _ in items] == ref.indices.tolist()
    assert [p for _, p, _ in items] == pytest.approx(ref.values.tolist(), abs=1e-6)
    assert [t for _, _, t in items] == [show_token(tokenizer.decode([i]))
                                        for i in ref.indices.tolist()]
    w.only_its_own_request()


def test_autoplay_and_worked_example(browser, site):
    root, _, _ = site
    w = Watched(browser, root / "worked.html")
    assert w.page.is_hidden("#selectors")  # one layer, one head: nothing to choose
    w.goto_step(4)
    e = math.exp(1 / math.sqrt(2))  # softmax of the scores [1/sqrt(2), 0], by hand
    a, b = e / (e + 1), 1 / (e + 1)  # 0.6698, 0.3302
    weights = w.matrix("attn-weights")
    torch.testing.assert_close(weights, torch.tensor([[a, b], [b, a]], dtype=torch.float64),
                               atol=1e-5, rtol=0)
    w.goto_step(1)
    w.page.click("#play")
    w.page.wait_for_selector('#step[data-step="5"]', timeout=5000)
    w.page.wait_for_selector('#play[aria-pressed="false"]', timeout=5000)  # stops at the end
    out = w.matrix("output")
    expected = [[10 * a + 30 * b, 20 * a + 40 * b], [10 * b + 30 * a, 20 * b + 40 * a]]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), atol=1e-4,
                               rtol=0)
    assert out[0, 0].item() == pytest.approx(16.60, abs=0.005)
    assert w.errors == [] and w.dialogs == []
    w.only_its_own_request()


@pytest.mark.parametrize("i", range(len(ATTACKS)))
def test_injected_text_shows_as_text_and_never_runs(browser, site, i):
    root, _, _ = site
    w = Watched(browser, root / f"xss{i}.html")
    for n in range(1, 9):
        w.goto_step(n)
    w.goto_step(1)
    chips = w.page.eval_on_selector_all("#tokens .token .text", "s => s.map(x => x.textContent)")
    assert chips == [show_token(ch) for ch in ATTACKS[i]]
    assert ATTACKS[i] in w.page.inner_text("#title")
    assert w.page.title().endswith(f'"{ATTACKS[i]}"')
    assert w.page.eval_on_selector_all("img", "x => x.length") == 0
    assert w.page.eval_on_selector_all("script", "x => x.length") == 2
    assert w.dialogs == [] and w.errors == []
    w.only_its_own_request()
