"""`train --model encoder`: masked-LM on Tiny Shakespeare beats always guessing the most
frequent character; the run folder loads back, evaluates, resumes and draws its attention."""

import json
import re

import pytest
import torch

from minitransformer import load_checkpoint
from minitransformer.cli import main
from minitransformer.data import load_text
from minitransformer.families.encoder import masked_ids
from minitransformer.models import EncoderModel
from minitransformer.viz.trace import token_labels


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlm") / "run"
    code = main(["train", "--model", "encoder", "--preset", "debug", "--data", "shakespeare",
                 "--out", str(out), "--eval_interval", "200", "--eval_iters", "5",
                 "--sample_tokens", "0", "--quiet"])
    assert code == 0
    return out


def test_debug_run_beats_the_most_frequent_token(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run), "--eval-iters", "20"]) == 0
    out = capsys.readouterr().out
    acc = float(re.search(r"masked-token accuracy\s+([\d.]+)%", out).group(1))
    base = float(re.search(r"most-frequent baseline\s+([\d.]+)%", out).group(1))
    assert 10.0 < base < 20.0  # a space is about 15% of Tiny Shakespeare's characters
    assert acc > base + 3.0, out


def test_run_folder_is_an_encoder_checkpoint(run):
    model, tokenizer = load_checkpoint(run)
    assert isinstance(model, EncoderModel)
    meta = json.loads((run / "config.json").read_text())
    assert meta["family"] == "encoder"
    c = model.config
    assert c.mask_id == tokenizer.vocab_size and c.vocab_size == tokenizer.vocab_size + 1
    assert c.norm_position == "post" and c.activation == "gelu" and c.pos_encoding == "learned"


def test_resume_and_attention(run, tmp_path, capsys):
    assert main(["train", "--model", "encoder", "--out", str(run), "--resume",
                 "--max_iters", "205", "--eval_interval", "200", "--eval_iters", "2",
                 "--quiet"]) == 0
    assert (run / "checkpoints" / "step_0000205").is_dir()
    png = tmp_path / "att.png"
    assert main(["attention", str(run), "--text", "To be, or not", "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "encoder" in err and "minitransformer fill" in err


def test_encoder_with_bpe(tmp_path, capsys):
    data = tmp_path / "c.txt"
    data.write_text(load_text("shakespeare")[:20_000], encoding="utf-8")
    out = tmp_path / "bpe"
    assert main(["train", "--model", "encoder", "--tokenizer", "bpe", "--vocab-size", "300",
                 "--preset", "debug", "--data", str(data), "--out", str(out), "--max_iters",
                 "4", "--eval_interval", "4", "--eval_iters", "1", "--block_size", "16",
                 "--quiet", "--mlm_head", "linear"]) == 0
    model, tokenizer = load_checkpoint(out)
    assert model.config.vocab_size == tokenizer.vocab_size == 300
    assert model.config.mask_id == tokenizer.token_to_id("<mask>")
    assert model.mlm_head.transform is None
    # a slot takes the space before it, as " be" is one token of the corpus' words
    mask = model.config.mask_id
    assert tokenizer.decode(tokenizer.encode(" be")) == " be"
    assert masked_ids(tokenizer, "not to [MASK]. [MASK]", mask, 16) == \
        tokenizer.encode("not to") + [mask] + tokenizer.encode(".") + [mask]
    # fill end to end: the slot's token joins "to" with its own space (or none)
    capsys.readouterr()
    assert main(["fill", str(out), "not to <mask>.", "--top", "2"]) == 0
    text, row, filled = capsys.readouterr().out.splitlines()
    (slot,) = reference_fill(model, tokenizer, ["not to", "."], 2)
    assert row.startswith("  [MASK] 1: ") and row.count("%") == 2
    best = tokenizer.decode(tokenizer.encode("not to") + [slot[0][0]] + tokenizer.encode("."))
    assert filled == "-> " + best.replace("\n", "\u23ce")


def test_flags_of_other_families_are_refused(tmp_path, capsys):
    code = main(["train", "--model", "encoder", "--out", str(tmp_path / "x"),
                 "--label_smoothing", "0.1", "--preset", "debug"])
    assert code == 2
    assert "label_smoothing" in capsys.readouterr().err


def reference_fill(model, tokenizer, pieces: list[str], top: int):
    """Each slot's ``top`` (id, probability) from the model's own forward pass: the pieces
    joined by [MASK] ids, the softmax over every id, [MASK] itself left out of the ranking."""
    ids = []
    for i, piece in enumerate(pieces):
        ids += ([model.config.mask_id] if i else []) + tokenizer.encode(piece)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids]))[0][0]  # (T, V)
    probs = logits.softmax(-1)
    probs[:, model.config.mask_id] = 0.0
    slots = [i for i, t in enumerate(ids) if t == model.config.mask_id]
    return [[(int(j), float(probs[i, j])) for j in probs[i].topk(top).indices] for i in slots]


def test_fill_shows_each_slots_likeliest_characters(run, capsys):
    model, tokenizer = load_checkpoint(run)
    capsys.readouterr()
    texts = ["To be, or not to b[MASK].", "[MASK]ing Ri[MASK]hard"]
    assert main(["fill", str(run), *texts, "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == texts[0] and lines[3] == texts[1] and len(lines) == 7
    for text, rows, filled in ((texts[0], lines[1:2], lines[2]),
                               (texts[1], lines[4:6], lines[6])):
        want = reference_fill(model, tokenizer, text.split("[MASK]"), 3)
        for n, (row, slot) in enumerate(zip(rows, want, strict=True), 1):
            shown = [c.rsplit(" ", 1) for c in row.split(f"[MASK] {n}: ")[1].split(" | ")]
            assert [float(p.rstrip("%")) for _, p in shown] == \
                pytest.approx([100 * p for _, p in slot], abs=0.051)
            assert [label for label, _ in shown] == token_labels(tokenizer, [i for i, _ in slot])
        best = iter(tokenizer.decode([slot[0][0]]) for slot in want)
        assert filled == "-> " + re.sub(r"\[MASK\]", lambda m: next(best), text)


def test_a_char_slot_leaves_the_space_before_it_and_any_spelling_is_a_slot(run):
    _, tokenizer = load_checkpoint(run)
    assert masked_ids(tokenizer, "to [MASK]", 99, 16) == tokenizer.encode("to ") + [99]
    assert masked_ids(tokenizer, "[mask]a<mask>", 99, 16) == [99, *tokenizer.encode("a"), 99]


def test_fill_checks_every_text_before_it_fills_one(run, capsys):
    capsys.readouterr()
    assert main(["fill", str(run), "To b[MASK]", "no slot"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "text 2: put at least one [MASK]" in err


def test_mask_is_never_offered_even_where_every_other_probability_underflows(make_encoder):
    from minitransformer.families.encoder import fill_mask

    model, tokenizer = make_encoder("abcdefgh")
    with torch.no_grad():
        model.mlm_head.bias[1:] = -1000.0  # softmax: 1 for id 0, exactly 0 for the rest
    (slot,) = fill_mask(model, tokenizer, "ab[MASK]", top=100)["slots"]
    ids = [p["id"] for p in slot["predictions"]]
    assert ids[0] == 0 and sorted(ids) == list(range(tokenizer.vocab_size))


@pytest.mark.parametrize("args, message", [
    (["no slot here"], "put at least one [MASK]"),
    (["x" * 300 + "[MASK]"], "this model reads at most"),
    (["\u00e9[MASK]"], "never saw"),
    (["a[MASK]", "--top", "0"], "--top"),
])
def test_fill_refuses_what_it_cannot_fill(run, capsys, args, message):
    capsys.readouterr()
    assert main(["fill", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_attention_reads_mask_slots_as_fill_does(run):
    from minitransformer.families.encoder import FAMILY

    model, tokenizer = load_checkpoint(run)
    mask = model.config.mask_id
    (view,) = FAMILY.attention_views(model, tokenizer, "To b[MASK], or")
    ids = tokenizer.encode("To b") + [mask] + tokenizer.encode(", or")
    assert view.key_labels[4] == view.query_labels[4] == "[MASK]" and len(view.key_labels) == 9
    with torch.no_grad():
        _, _, internals = model.eval()(torch.tensor([ids]), return_internals=True)
    torch.testing.assert_close(view.weights[0], internals.attentions[0][0])


def test_a_filled_line_break_shows_as_the_candidates_show_it(make_encoder):
    from minitransformer.families.encoder import FAMILY

    model, tokenizer = make_encoder("ab\n")
    with torch.no_grad():
        model.mlm_head.bias[tokenizer.encode("\n")[0]] = 100.0
    assert FAMILY.fill(model, tokenizer, ["a[MASK]b"], 1) == \
        ["a[MASK]b", "  [MASK] 1: \u23ce 100.0%", "-> a\u23ceb"]


def test_fill_names_the_pieces_a_wordpiece_vocabulary_lacks(capsys):
    """A BERT-style vocabulary reads a character it lacks as [UNK], which decoding drops from
    the filled line: a note names them, as translate's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from minitransformer.config import EncoderConfig
    from minitransformer.families.encoder import FAMILY
    from minitransformer.models import EncoderModel
    from minitransformer.tokenizers import BPETokenizer

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(["to be or not to be"] * 10, trainers.WordPieceTrainer(
        vocab_size=60, special_tokens=["[PAD]", "[UNK]", "[MASK]"], show_progress=False))
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=wp.get_vocab_size(), mask_id=wp.token_to_id("[MASK]"),
                        block_size=32, n_layer=1, n_head=2, n_embd=16)
    lines = FAMILY.fill(EncoderModel(cfg).eval(), BPETokenizer(wp), ["to [MASK] 日本 or ☃"], 1)
    assert len(lines) == 3
    err = capsys.readouterr().err
    assert err.startswith("note: the model's vocabulary has no ") and "'☃'" in err
    assert "read as <unk>" in err and "MASK" not in err
    FAMILY.fill(EncoderModel(cfg).eval(), BPETokenizer(wp), ["to [MASK] be"], 1)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", [["evaluate"], ["fill", "To be, or not to b[MASK]."]])
def test_a_config_without_its_mask_id_says_so(run, tmp_path, capsys, command):
    """config.json without model.mask_id (a head with no [MASK] id to fill) was an internal
    TypeError in evaluate, and fill called the model headless; both name what is missing
    (attention, which needs no [MASK], still draws such a model)."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    meta = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    del meta["model"]["mask_id"]
    (copy / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    assert main([command[0], str(copy), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "has no [MASK] id (config.json's model.mask_id)" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
