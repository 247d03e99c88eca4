"""The walkthrough's numbers: the traced forward pass against an independent recomputation
from the raw weights, the page description, safe JSON embedding, the worked example, and the
`explain` command's errors. (The page itself is tested in a real browser in
test_explain_browser.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from minitransformer.cli import main
from minitransformer.config import GPTConfig
from minitransformer.models import GPT
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files
from minitransformer.viz.i18n import resolve
from minitransformer.viz.page import embed_json, render_page
from minitransformer.viz.trace import trace_gpt
from minitransformer.viz.walkthrough import walkthrough_doc
from minitransformer.viz.worked import worked_example_doc, worked_numbers

TEXT = "to be or not"
CONFIGS = [("pre", "learned"), ("post", "sinusoidal"), ("pre", "rope"), ("post", "alibi"),
           ("pre", "none")]


def build(norm: str, pos: str, n_head: int = 2):
    tokenizer = CharTokenizer.fit("abcdefghijklmnopqrstuvwxyz .,\n")
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=n_head,
                    n_embd=16, norm_position=norm, pos_encoding=pos)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model, tokenizer


def reference_layer0(model, ids: list[int]):
    """Layer 0's Q, K, scores and attention weights, computed from the state dict alone with
    the formulas written out (no model code): embeddings, LayerNorm, projections, RoPE as a
    complex rotation, ALiBi slopes 2^(-8h/n), causal mask, softmax."""
    sd, c = model.state_dict(), model.config
    t, nh, hs = len(ids), c.n_head, c.n_embd // c.n_head
    x = sd["tok_emb.weight"][ids]  # (T, C)
    if c.pos_encoding == "learned":
        x = x + sd["pos_emb.weight"][:t]
    elif c.pos_encoding == "sinusoidal":
        pe = torch.zeros(t, c.n_embd)
        for pos in range(t):
            for i in range(0, c.n_embd, 2):
                pe[pos, i] = math.sin(pos / 10000 ** (i / c.n_embd))
                pe[pos, i + 1] = math.cos(pos / 10000 ** (i / c.n_embd))
        x = x + pe
    p = "decoder.layers.0."
    h = x
    if c.norm_position == "pre":
        h = F.layer_norm(x, (c.n_embd,), sd[p + "res_self.norm.weight"],
                         sd[p + "res_self.norm.bias"])

    def proj(name):
        y = h @ sd[p + f"self_attn.{name}.weight"].T + sd[p + f"self_attn.{name}.bias"]
        return y.view(t, nh, hs).transpose(0, 1)  # (nh, T, hs)

    q, k = proj("q_proj"), proj("k_proj")
    if c.pos_encoding == "rope":
        theta = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        rot = torch.polar(torch.ones(t, hs // 2, dtype=torch.float64),
                          torch.arange(t, dtype=torch.float64)[:, None] * theta)

        def rotate(z):
            zc = torch.complex(z[..., : hs // 2].double(), z[..., hs // 2:].double()) * rot
            return torch.cat([zc.real, zc.imag], -1).float()

        q, k = rotate(q), rotate(k)
    scores = q @ k.transpose(1, 2) / math.sqrt(hs)  # (nh, T, T)
    if c.pos_encoding == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / nh) for i in range(nh)])
        dist = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs()
        scores = scores - slopes[:, None, None] * dist
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(-1)
    return q, k, scores, weights


@pytest.mark.parametrize("norm, pos", CONFIGS)
def test_trace_matches_an_independent_recomputation(norm, pos):
    model, tokenizer = build(norm, pos)
    ids = tokenizer.encode(TEXT)
    trace = trace_gpt(model, tokenizer, TEXT)
    q, k, scores, weights = reference_layer0(model, ids)
    a = trace.layers[0].attn
    torch.testing.assert_close(a.q, q, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.k, k, atol=1e-5, rtol=1e-4)
    future = torch.ones(len(ids), len(ids), dtype=torch.bool).triu(1)
    torch.testing.assert_close(a.scores.masked_fill(future, 0), scores.masked_fill(future, 0),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.weights, weights, atol=1e-6, rtol=1e-5)
    assert torch.isinf(a.masked[:, future]).all() and (a.weights[:, future] == 0).all()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    torch.testing.assert_close(trace.logits, logits[0])
    top = trace.top_k(tokenizer, 5)
    ref = torch.softmax(logits[0, -1].double(), -1).topk(5)
    assert [i for i, _, _ in top] == ref.indices.tolist()
    assert [p for _, _, p in top] == pytest.approx(ref.values.tolist(), abs=1e-6)


@pytest.mark.parametrize("norm, pos", CONFIGS)
def test_walkthrough_has_eight_steps_of_the_models_numbers(norm, pos):
    model, tokenizer = build(norm, pos)
    trace = trace_gpt(model, tokenizer, TEXT)
    doc = walkthrough_doc(trace, tokenizer, model.config, layer=1, head=1)
    assert [s["id"] for s in doc["steps"]] == ["tokenize", "embed", "positions", "qkv",
                                               "attention", "residual", "ffn", "output"]
    blocks = {b["id"]: b for s in doc["steps"] for b in s["blocks"]}
    shown = torch.tensor(blocks["attn-weights"]["values"][1][0])
    torch.testing.assert_close(shown, trace.layers[1].attn.weights[0], atol=1e-6, rtol=1e-5)
    assert blocks["tokens"]["ids"] == tokenizer.encode(TEXT)
    assert ("q-raw" in blocks) == (pos == "rope")
    assert ("alibi-bias" in blocks) == (pos == "alibi")
    assert ("positions" in blocks) == (pos in ("learned", "sinusoidal"))
    residual = " ".join(resolve(doc)["steps"][5]["formulas"])
    assert ("LN\u2081(x + MultiHead(x))" in residual) == (norm == "post")
    json.loads(embed_json(doc))  # serialisable, masked scores included


@pytest.mark.parametrize("pos", ["sinusoidal", "rope"])
def test_scaled_embeddings_are_traced_and_shown(pos):
    """With scale_embeddings (the paper's section 3.4) the trace reads the scale from the
    model, E stays the raw table rows, X = E * sqrt(d_model) + PE is the model's own first
    block input, and the walkthrough shows the scaling step."""
    tokenizer = CharTokenizer.fit("abcdefghijklmnopqrstuvwxyz .,\n")
    torch.manual_seed(2)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2,
                    n_embd=16, pos_encoding=pos, scale_embeddings=True)
    model = GPT(cfg).eval()
    ids = tokenizer.encode(TEXT)
    trace = trace_gpt(model, tokenizer, TEXT)
    assert trace.embed_scale == math.sqrt(16) == model.emb_scale
    with torch.no_grad():
        _, _, internals = model(torch.tensor([ids]), return_internals=True)
        raw = model.tok_emb.weight[ids]  # (T, C) the table's rows, before the scale
    torch.testing.assert_close(trace.tok_emb, raw)
    torch.testing.assert_close(trace.x0, internals.hidden_states[0][0])
    pos_part = trace.pos_emb if trace.pos_emb is not None else 0.0
    torch.testing.assert_close(trace.x0, raw * 4.0 + pos_part)
    doc = resolve(walkthrough_doc(trace, tokenizer, model.config))
    steps = {s["id"]: s for s in doc["steps"]}
    embed = " ".join(steps["embed"]["formulas"])
    assert "\u221ad_model" in embed and "4" in embed
    blocks = {b["id"]: b for b in steps["embed"]["blocks"]}
    shown = torch.tensor(blocks["scaled-embeddings"]["values"], dtype=torch.float64)
    torch.testing.assert_close(shown, (raw * 4.0).double(), atol=1e-5, rtol=1e-5)
    assert "\u221ad_model" in " ".join(steps["positions"]["formulas"])
    # an unscaled model shows no scaling step
    plain, tokenizer = build("pre", pos)
    plain_doc = resolve(walkthrough_doc(trace_gpt(plain, tokenizer, TEXT), tokenizer,
                                        plain.config))
    plain_steps = {s["id"]: s for s in plain_doc["steps"]}
    assert "\u221ad_model" not in " ".join(plain_steps["embed"]["formulas"] +
                                            plain_steps["positions"]["formulas"])
    assert "scaled-embeddings" not in {b["id"] for b in plain_steps["embed"]["blocks"]}


def test_a_modern_model_is_shown_with_its_own_formulas():
    """RMSNorm, SwiGLU, QK-norm, grouped-query attention, soft-capping and no biases: each is
    named and written as this model computes it, never as the original Transformer's (a
    LayerNorm formula, a two-matrix FFN with biases, 'mean 0 and variance 1')."""
    tokenizer = CharTokenizer.fit("abcdefghijklmnopqrstuvwxyz .,\n")
    torch.manual_seed(3)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=4,
                    n_embd=16, pos_encoding="rope", norm="rmsnorm", activation="swiglu",
                    qk_norm=True, n_kv_head=2, logit_softcap=15.0, bias=False)
    model = GPT(cfg).eval()
    trace = trace_gpt(model, tokenizer, TEXT)
    doc = resolve(walkthrough_doc(trace, tokenizer, model.config))
    steps = {s["id"]: s for s in doc["steps"]}
    for feature in ("SwiGLU", "RMSNorm", "QK-norm", "key/value heads: 2",
                    "logit soft-cap 15", "no biases"):
        assert feature in doc["subtitle"], (feature, doc["subtitle"])
    said = {k: " ".join(v["formulas"] + v["text"]) for k, v in steps.items()}
    assert "RMSNorm(h W_Q)" in said["qkv"] and "each group of 2 query heads" in said["qkv"]
    titles = [b["title"] for b in steps["qkv"]["blocks"]]
    assert "Q after QK-norm, before RoPE (layer {layer}, head {head})" in titles
    assert "\u221a(mean(z\u00b2) + \u03b5)" in said["residual"]
    assert "mean(z)" not in said["residual"] and "variance 1" not in said["residual"]
    assert "FFN(z) = (SiLU(z W_gate) \u2299 (z W\u2081)) W\u2082" in said["ffn"]
    assert "b\u2081" not in said["ffn"]
    assert "c \u00b7 tanh(logits / c)" in said["output"] and "c = 15" in said["output"]
    # the formula's numbers are the model's: SwiGLU's hidden layer as the page shows it
    h = trace.layers[0].ffn.h
    ffn = model.decoder.layers[0].ffn
    expected = F.silu(h @ ffn.gate.weight.T) * (h @ ffn.fc.weight.T)
    shown = {b["id"]: b for b in steps["ffn"]["blocks"]}["ffn-hidden"]["values"][0]
    torch.testing.assert_close(torch.tensor(shown, dtype=torch.float64), expected.double(),
                               atol=1e-5, rtol=1e-5)
    assert doc == resolve(walkthrough_doc(trace, tokenizer, model.config), "en")
    resolve(walkthrough_doc(trace, tokenizer, model.config), "zh")  # every message exists
    biased = GPT(dataclasses.replace(cfg, bias=True)).eval()  # SwiGLU's three biases
    doc = resolve(walkthrough_doc(trace_gpt(biased, tokenizer, TEXT), tokenizer, biased.config))
    ffn = {s["id"]: s for s in doc["steps"]}["ffn"]
    gated = "SiLU(z W_gate + b_gate) \u2299 (z W\u2081 + b\u2081)"
    assert f"FFN(z) = ({gated}) W\u2082 + b\u2082" in ffn["formulas"][0]
    assert ffn["blocks"][1]["title"] == gated + " (layer {layer})"


def test_embedded_json_cannot_break_out_of_its_script_element():
    nasty = {"t": "</script><script>alert(1)</script> & <!-- \u2028\u2029 '\"",
             "v": [float("-inf"), 1.5]}
    text = embed_json(nasty)
    assert not set("<>&\u2028\u2029") & set(text)
    back = json.loads(text)
    assert back["t"] == nasty["t"] and back["v"] == [None, 1.5]
    page = render_page({"title": "<b>x</b>", "steps": [], **nasty})
    assert page.count("<script") == 2 and "<b>x</b>" not in page
    # Self-contained: every src/href is a data: URL, no http(s) anywhere.
    assert not re.search(r"https?://", page)
    assert all(u.startswith("data:") for u in re.findall(r'(?:src|href)=["(]?([^")\s>]+)',
                                                          page))


def test_worked_example_numbers():
    n = worked_numbers()
    e = math.exp(1 / math.sqrt(2))
    w11, w12 = e / (e + 1), 1 / (e + 1)  # 0.6698, 0.3302 by hand
    assert w11 == pytest.approx(0.6698, abs=1e-4)
    torch.testing.assert_close(n["weights"], torch.tensor([[w11, w12], [w12, w11]],
                                                          dtype=torch.float64))
    expected = [[10 * w11 + 30 * w12, 20 * w11 + 40 * w12],
                [10 * w12 + 30 * w11, 20 * w12 + 40 * w11]]
    torch.testing.assert_close(n["output"], torch.tensor(expected, dtype=torch.float64))
    assert n["output"][0].tolist() == pytest.approx([16.60, 26.60], abs=0.01)
    assert n["output"][1].tolist() == pytest.approx([23.40, 33.40], abs=0.01)
    doc = resolve(worked_example_doc())
    formulas = " ".join(f for s in doc["steps"] for f in s["formulas"])
    assert "0.6698" in formulas and "16.60" in formulas and "33.40" in formulas


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    model, tokenizer = build("pre", "learned")
    folder = tmp_path_factory.mktemp("run")
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(model.config), "data": {"source": "tiny"}}
    write_model_files(folder, model, meta, tokenizer)
    return folder


def test_explain_cli_writes_one_self_contained_file(run_dir, tmp_path):
    out = tmp_path / "walk.html"
    assert main(["explain", str(run_dir), "--text", TEXT, "--out", str(out), "--layer", "1",
                 "--head", "1", "--top-k", "3"]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and not re.search(r"https?://", page)
    data = re.search(r'<script type="application/json" id="explain-data">(.*?)</script>',
                     page, re.S).group(1)
    doc = json.loads(data)
    assert (doc["layer"], doc["head"], len(doc["steps"])) == (1, 1, 8)
    assert len(doc["steps"][7]["blocks"][1]["items"]) == 3
    assert main(["explain", "--worked-example", "--out", str(tmp_path / "w.html")]) == 0
    assert main(["explain", "--worked-example", "--out", str(tmp_path / "w.HTM")]) == 0
    assert "explain-data" in (tmp_path / "w.HTM").read_text(encoding="utf-8")


@pytest.mark.parametrize("command, name", [("explain", "walk.html"),
                                           ("attention", "attn.png")])
def test_a_file_of_the_users_own_is_not_written_over_unasked(run_dir, tmp_path, capsys,
                                                             command, name):
    """Running the command again replaces its own output; any other file at --out is
    refused without --force (a hand-written index.html used to be replaced silently)."""
    out = tmp_path / name
    args = [command, str(run_dir), "--text", TEXT, "--out", str(out)]
    assert main(args) == 0 and main(args) == 0  # its own output, again
    mine = b"<h1>my own page</h1>" if name.endswith(".html") else b"\x89PNG\r\n\x1a\nmine"
    out.write_bytes(mine)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--out {out} exists and does not carry this command's mark" in err
    assert "--force" in err and "Traceback" not in err and out.read_bytes() == mine
    assert main([*args, "--force"]) == 0 and out.read_bytes() != mine
    assert main(args) == 0  # ours again
    (tmp_path / f"dir{out.suffix}").mkdir()
    assert main([*args[:-1], str(tmp_path / f"dir{out.suffix}")]) == 2
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--text", TEXT, "--layer", "2"], "--layer 2 is out of range"),
    (["--text", TEXT, "--head", "2"], "--head 2 is out of range"),
    (["--text", "UPPER"], "never saw"),
    (["--text", "a" * 17], "at most 16"),
    ([], "--text"),
    (["--text", TEXT, "--worked-example"], "takes no checkpoint"),
])
def test_explain_user_errors(run_dir, tmp_path, capsys, args, message):
    out = tmp_path / "x.html"
    assert main(["explain", str(run_dir), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_explain_needs_a_folder_and_html(tmp_path, capsys):
    assert main(["explain", "--text", "x", "--out", str(tmp_path / "x.html")]) == 2
    assert main(["explain", "--worked-example", "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["explain", "--worked-example", "--out",
                 str(tmp_path / "no" / "such" / "x.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    for flag, value in (("--layer", "1"), ("--top_k", "3"), ("--which", "last"),
                        ("--which", "best")):  # a model's choices: the example has no model
        assert main(["explain", "--worked-example", "--out", str(tmp_path / "w.html"), flag,
                     value]) == 2
        assert f"{flag} picks what a model's page shows" in capsys.readouterr().err
    assert not (tmp_path / "w.html").exists()


def test_explain_says_which_families_it_covers(tmp_path, capsys):
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.tokenizers import BPETokenizer

    tok = BPETokenizer.train(["the cat sat", "el gato"] * 10, vocab_size=40)
    cfg = Seq2SeqConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                        n_embd=8)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(cfg)}
    write_model_files(tmp_path / "s2s", Seq2SeqTransformer(cfg), meta, tok)
    assert main(["explain", str(tmp_path / "s2s"), "--text", "the cat", "--out",
                 str(tmp_path / "x.html")]) == 2
    assert "minitransformer attention" in capsys.readouterr().err
