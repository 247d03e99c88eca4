"""`minitransformer attention`: the layers x heads grid of heatmaps, labelled with the tokens,
Chinese labels drawn with a real CJK font."""

from __future__ import annotations

import dataclasses
import warnings

import matplotlib.image
import matplotlib.pyplot as plt
import pytest
import torch

from minitransformer.cli import main
from minitransformer.config import GPTConfig
from minitransformer.data import load_text
from minitransformer.errors import UserError
from minitransformer.families import FAMILIES
from minitransformer.models import GPT
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files
from minitransformer.viz import fonts
from minitransformer.viz.heatmap import attention_figure, figure_texts, plot_context

SENTENCE = "我吃了一个红苹果"  # the tutorials' example; every character is in the sayings corpus
N_LAYER, N_HEAD = 3, 2  # not square, so rows and columns cannot be swapped unnoticed


@pytest.fixture(scope="module")
def zh_run(tmp_path_factory):
    """A tiny GPT whose vocabulary comes from the bundled sayings corpus, saved as a run."""
    text = load_text("sayings")
    assert set(SENTENCE) <= set(text)
    tokenizer = CharTokenizer.fit(text)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=N_LAYER,
                    n_head=N_HEAD, n_embd=16)
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than at init, so attention is far from uniform
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    folder = tmp_path_factory.mktemp("zh_run")
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "sayings"}}
    write_model_files(folder, model, meta, tokenizer)
    return folder, model, tokenizer


def _panels(fig):
    return {ax.get_gid(): ax for ax in fig.axes if (ax.get_gid() or "").startswith("attn:")}


def test_cli_writes_a_png_grid(zh_run, tmp_path, capsys):
    folder, _, _ = zh_run
    out = tmp_path / "attn.png"
    assert main(["attention", str(folder), "--text", SENTENCE, "--out", str(out)]) == 0
    assert f"{N_LAYER} layers x {N_HEAD} heads" in capsys.readouterr().out
    image = matplotlib.image.imread(out)  # (H, W, 4)
    assert image.shape[0] > 300 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_grid_is_layers_by_heads_labelled_with_tokens(zh_run):
    folder, model, tokenizer = zh_run
    views = FAMILIES["gpt"].attention_views(model, tokenizer, SENTENCE)
    with plot_context(figure_texts(views)):
        fig = attention_figure(views)
    panels = _panels(fig)
    assert set(panels) == {f"attn:self-attention:{layer}:{head}"
                           for layer in range(N_LAYER) for head in range(N_HEAD)}
    ids = torch.tensor([tokenizer.encode(SENTENCE)])
    with torch.no_grad():
        _, _, internals = model(ids, return_internals=True)
    for gid, ax in panels.items():
        layer, head = map(int, gid.split(":")[2:])
        assert [t.get_text() for t in ax.get_xticklabels()] == list(SENTENCE)
        assert [t.get_text() for t in ax.get_yticklabels()] == list(SENTENCE)
        shown = torch.tensor(ax.get_images()[0].get_array())
        torch.testing.assert_close(shown, internals.attentions[layer][0, head])
        assert ax.get_title() == f"layer {layer}, head {head}"
    plt.close(fig)


def test_labels_in_chinese_draw_with_no_missing_glyph(zh_run, tmp_path):
    """attention --lang zh: panel titles, axis names and the colour bar from the zh catalogue."""
    folder, model, tokenizer = zh_run
    views = FAMILIES["gpt"].attention_views(model, tokenizer, SENTENCE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with plot_context(figure_texts(views, lang="zh")):
            fig = attention_figure(views, lang="zh")
            fig.canvas.draw()
    assert [str(w.message) for w in caught] == []
    panels = _panels(fig)
    assert panels["attn:self-attention:2:1"].get_title() == "第 2 层，头 1"
    assert panels["attn:self-attention:0:0"].get_ylabel() == "自注意力\n查询"
    assert panels["attn:self-attention:2:0"].get_xlabel() == "键"
    assert "注意力权重" in [ax.get_ylabel() for ax in fig.axes]  # the colour bar
    plt.close(fig)
    out = tmp_path / "zh.png"
    assert main(["attention", str(folder), "--text", SENTENCE, "--out", str(out),
                 "--lang", "zh"]) == 0 and out.stat().st_size > 1000


def _draw_warnings(views, families=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = figure_texts(views)
        ctx = plot_context(texts) if families is None else plt.rc_context(
            {"font.family": families})
        with ctx:
            fig = attention_figure(views)
            fig.canvas.draw()
        plt.close(fig)
    return [str(w.message) for w in caught]


def test_chinese_labels_render_with_no_missing_glyph(zh_run):
    folder, model, tokenizer = zh_run
    views = FAMILIES["gpt"].attention_views(model, tokenizer, SENTENCE)
    families = fonts.font_families(SENTENCE)
    assert len(families) == 2, "a CJK font should be chosen as the fallback"
    assert _draw_warnings(views) == []
    # The check above can fail: with DejaVu Sans alone, matplotlib reports the missing glyphs.
    plain = _draw_warnings(views, families=["DejaVu Sans"])
    assert any("missing from font" in m for m in plain)


def test_plot_context_hides_only_the_glyphs_it_named(zh_run, monkeypatch):
    """A chain that claims a font it cannot load: matplotlib's glyph warnings still show
    (plot_context silences only the characters font_chain itself warned about)."""
    _, model, tokenizer = zh_run
    views = FAMILIES["gpt"].attention_views(model, tokenizer, SENTENCE)
    monkeypatch.setattr(fonts, "_family_of", lambda path: "No Such Font Family")
    assert any("missing from font" in m for m in _draw_warnings(views))


def test_no_cjk_font_gives_a_warning_not_silent_boxes(zh_run, monkeypatch):
    monkeypatch.setattr(fonts, "_candidates", lambda: ())
    with pytest.warns(fonts.MissingGlyphWarning, match="红"):
        fonts.font_families([SENTENCE])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fonts.font_families(["plain ASCII"]) == ["DejaVu Sans"]


def test_emoji_get_their_own_warning_once_and_joiners_need_no_glyph(zh_run, tmp_path,
                                                                     monkeypatch, capsys):
    """An emoji sequence: the zero-width joiners and the variation selector draw nothing (no
    warning for them); the emoji themselves are named once, without CJK advice that cannot
    help; the command prints that as one line, not Python's file:line and source line."""
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u2764\ufe0f"
    with pytest.warns(fonts.MissingGlyphWarning) as caught:
        fonts.font_families([family])
    message = str(caught[0].message)
    assert "\u200d" not in message and "\ufe0f" not in message and "CJK" not in message
    assert "\U0001F468" in message and "No font found here has them" in message
    monkeypatch.setattr(fonts, "_candidates", lambda: ())  # no CJK font: a warning to print
    folder, _, _ = zh_run
    assert main(["attention", str(folder), "--text", SENTENCE, "--out",
                 str(tmp_path / "a.png")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: no font here has the characters") and "CJK font" in err
    assert len(err.strip().splitlines()) == 1 and "heatmap.py" not in err, err


def test_layer_and_head_pick_one_panel(zh_run, tmp_path):
    folder, model, tokenizer = zh_run
    views = FAMILIES["gpt"].attention_views(model, tokenizer, SENTENCE)
    with plot_context(figure_texts(views)):
        fig = attention_figure(views, layer=2, head=1)
    assert list(_panels(fig)) == ["attn:self-attention:2:1"]
    plt.close(fig)
    out = tmp_path / "one.png"
    assert main(["attention", str(folder), "--text", "红苹果", "--out", str(out),
                 "--layer", "1"]) == 0
    assert out.exists()


@pytest.mark.parametrize("args, message", [
    (["--layer", "3"], "--layer 3 is out of range"),
    (["--head", "5"], "--head 5 is out of range"),
    (["--text", "我吃☃"], "never saw"),
    (["--text", "吃" * 17], "at most 16"),
    (["--text", ""], "empty"),
])
def test_user_errors_exit_2_with_one_line(zh_run, tmp_path, capsys, args, message):
    folder, _, _ = zh_run
    argv = ["attention", str(folder), "--text", SENTENCE, "--out", str(tmp_path / "x.png")]
    assert main(argv + args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_missing_checkpoint_and_bad_suffix(tmp_path, zh_run, capsys):
    assert main(["attention", str(tmp_path / "nope"), "--text", "x", "--out",
                 str(tmp_path / "a.png")]) == 2
    assert main(["attention", str(zh_run[0]), "--text", "红", "--out",
                 str(tmp_path / "a.jpg")]) == 2
    assert "should end in .png" in capsys.readouterr().err


def _save_family(folder, family: str, cfg, model, tokenizer):
    meta = {"format": "minitransformer", "version": 1, "family": family,
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(folder, model, meta, tokenizer)


@pytest.fixture(scope="module")
def bpe():
    from minitransformer.tokenizers import BPETokenizer

    lines = ["the cat sat on the mat", "el gato se sento en la alfombra",
             "the dog ran", "el perro corrio"] * 20
    return BPETokenizer.train(lines, vocab_size=60)


def test_seq2seq_shows_encoder_decoder_and_cross_attention(bpe, tmp_path):
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer

    torch.manual_seed(0)
    cfg = Seq2SeqConfig(vocab_size=bpe.vocab_size, block_size=24, n_encoder_layer=2,
                        n_decoder_layer=3, n_head=2, n_embd=16, dropout=0.0)
    model = Seq2SeqTransformer(cfg).eval()
    _save_family(tmp_path / "s2s", "seq2seq", cfg, model, bpe)
    views = FAMILIES["seq2seq"].attention_views(model, bpe, "the cat sat", target="el gato")
    assert [v.name for v in views] == ["encoder self-attention", "decoder self-attention",
                                       "cross-attention"]
    enc, dec, cross = views
    assert enc.query_labels[-1] == "</s>" and dec.query_labels[0] == "<s>"
    assert cross.query_labels == dec.query_labels and cross.key_labels == enc.key_labels
    src = torch.tensor([bpe.encode("the cat sat") + [cfg.eos_id]])
    tgt = torch.tensor([[cfg.bos_id] + bpe.encode("el gato")])
    with torch.no_grad():
        _, _, internals = model(src, tgt, return_internals=True)
    assert cross.weights.shape == (3, 2, tgt.shape[1], src.shape[1])
    for layer in range(3):
        torch.testing.assert_close(cross.weights[layer], internals.decoder.cross_attentions[
            layer][0])
    assert enc.weights.shape[0] == 2
    with plot_context(figure_texts(views)):
        fig = attention_figure(views)
    assert len(_panels(fig)) == (2 + 3 + 3) * 2
    plt.close(fig)
    # a layer only the deeper stacks have: the decoder's and cross-attention's panels
    with plot_context(figure_texts(views)):
        fig = attention_figure(views, layer=2)
    assert sorted(g.rsplit(":", 2)[0] for g in _panels(fig)) == \
        ["attn:cross-attention"] * 2 + ["attn:decoder self-attention"] * 2
    plt.close(fig)
    with pytest.raises(UserError, match="--layer 3 is out of range: the deepest stack has 3"):
        attention_figure(views, layer=3)
    out = tmp_path / "s2s.png"
    # Without --target the decoder side is the model's own greedy translation.
    assert main(["attention", str(tmp_path / "s2s"), "--text", "the dog", "--out",
                 str(out)]) == 0
    assert out.exists()


def test_encoder_attention_sees_both_ways(bpe, tmp_path):
    from minitransformer.config import EncoderConfig
    from minitransformer.models import EncoderModel

    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=bpe.vocab_size, block_size=16, n_layer=2, n_head=2,
                        n_embd=16)
    model = EncoderModel(cfg).eval()
    _save_family(tmp_path / "enc", "encoder", cfg, model, bpe)
    (view,) = FAMILIES["encoder"].attention_views(model, bpe, "the cat sat")
    assert view.weights.shape[:2] == (2, 2)
    assert view.weights[0, 0].triu(1).sum() > 0.1  # looks at later tokens too: no causal mask
    assert view.query_labels[1].startswith("\u2423")  # "▁cat": the word-initial space shows
    assert main(["attention", str(tmp_path / "enc"), "--text", "the cat", "--out",
                 str(tmp_path / "enc.png")]) == 0
