"""`minitransformer export RUN --hf OUT` as a transformers user meets it: AutoTokenizer and
AutoModelForCausalLM load the folder, the tokenizer keeps our ids for English and Chinese, and
greedy generate writes what `sample --temperature 0` writes. Tiny runs trained here."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from minitransformer.cli import main  # noqa: E402
from minitransformer.interop import load_hf, load_hf_tokenizer, save_hf  # noqa: E402
from minitransformer.tokenizers import load_tokenizer  # noqa: E402

BLOCK = 32
TEXTS = ["ROMEO: But soft", "从前有座山", "ROMEO: But soft, what light?\n从前有座山，山里有座庙。"]
CORPUS = ("ROMEO: But soft, what light through yonder window breaks?\n"
          "JULIET: O Romeo, Romeo! wherefore art thou Romeo?\n"
          "从前有座山，山里有座庙，庙里有个老和尚在给小和尚讲故事。\n"
          "床前明月光，疑是地上霜。举头望明月，低头思故乡。\n") * 40
KINDS = {"char": [], "bpe-bytes": ["--vocab-size", "300"], "bpe-chars": ["--vocab-size", "360"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """kind -> (run folder, exported folder, our tokenizer): a tiny run, trained once."""
    done = {}

    def get(kind):
        if kind not in done:
            root = tmp_path_factory.mktemp(kind)
            corpus = root / "corpus.txt"
            corpus.write_text(CORPUS, encoding="utf-8")
            run, out = root / "run", root / "hf"
            assert main(["train", "--data", str(corpus), "--out", str(run), "--preset", "debug",
                         "--tokenizer", kind, *KINDS[kind], "--n_layer", "1", "--n_embd", "32",
                         "--n_head", "2", "--block_size", str(BLOCK), "--max_iters", "150",
                         "--eval_interval", "150", "--eval_iters", "1", "--sample_tokens", "0",
                         "--quiet"]) == 0
            assert main(["export", str(run), "--hf", str(out)]) == 0
            done[kind] = run, out, load_tokenizer(run / "tokenizer.json")
        return done[kind]

    return get


@pytest.fixture(params=list(KINDS))
def exported(request, runs):
    return runs(request.param)


def test_auto_tokenizer_keeps_our_ids_and_text(exported):
    _, out, ours = exported
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.is_fast and type(tok).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert tok.model_max_length == BLOCK
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == ours.encode(text), text
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special_tokens=True) == text
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_special_tokens_are_the_runs_own(exported):
    _, out, ours = exported
    tok = transformers.AutoTokenizer.from_pretrained(out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["model_type"] == "gpt2"
    if ours.kind == "char":  # no special tokens in a char vocabulary
        assert tok.eos_token is None and tok.bos_token is None
        assert config["eos_token_id"] is None and generation["eos_token_id"] is None
        return
    end = ours.token_to_id("<|endoftext|>")
    assert end is not None
    assert tok.eos_token == tok.bos_token == "<|endoftext|>"
    assert tok.eos_token_id == config["eos_token_id"] == generation["eos_token_id"] == end
    assert tok("a<|endoftext|>b")["input_ids"] == ours.encode("a<|endoftext|>b")


def test_char_tokenizer_maps_unknown_characters_to_a_stand_in(runs, capsys):
    run, out, ours = runs("char")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("ROMEO: 🙂 oЖ")["input_ids"]  # 🙂 and Ж are not in the corpus
    stand_in = ours.encode("?")[0]
    assert ids == ours.encode("ROMEO: ") + [stand_in] + ours.encode(" o") + [stand_in]
    assert tok.decode(ids) == "ROMEO: ? o?"
    assert max(ids) < ours.vocab_size
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "🙂", "--max-new-tokens", "2"]) == 2
    assert "never saw" in capsys.readouterr().err


@pytest.mark.parametrize("prompt", ["ROMEO:", "从前"])
def test_greedy_generate_writes_what_sample_writes(exported, prompt, capsys):
    run, out, ours = exported
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "GPT2LMHeadModel"
    n = BLOCK - len(ours.encode(prompt))  # generate stops at the context window
    inputs = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        got = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    assert got.shape[1] == BLOCK  # every token asked for: no early end
    new = got[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(set(new)) > 2  # trained enough to write more than one token over and over
    text = tok.decode(got[0], skip_special_tokens=True)
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", prompt, "--temperature", "0",
                 "--max-new-tokens", str(n)]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_a_gpt2_folders_tokenizer_exports_too(runs, tmp_path):
    """A GPT-2-style folder (vocab.json + merges.txt) read by load_hf_tokenizer, written back
    with its model: AutoTokenizer gives the same ids, <|endoftext|> its bos and eos."""
    _, out, ours = runs("bpe-bytes")
    assert ours.mode == "bytes"
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    ours.hf.model.save(str(gpt2))  # vocab.json, merges.txt
    (gpt2 / "config.json").write_text((out / "config.json").read_text(encoding="utf-8"))
    hf_tok = load_hf_tokenizer(gpt2)
    again = save_hf(load_hf(out), tmp_path / "again", hf_tok)
    tok = transformers.AutoTokenizer.from_pretrained(again)
    for text in TEXTS:
        assert tok(text)["input_ids"] == hf_tok.encode(text) == ours.encode(text)
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.eos_token == tok.bos_token == "<|endoftext|>"



def _tiny_gpt(vocab_size):
    from minitransformer import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8))


@pytest.mark.parametrize("chars, stand_in", [("\nab?？ ", "?"), ("\n山？ ", "？"), ("\nab ", " "),
                                             ("ab", "a")])
def test_the_stand_in_is_an_existing_character(tmp_path, chars, stand_in):
    """No new id for unknown characters: the first of '?', '？', U+FFFD, ' ' the vocabulary
    has, else its first character."""
    from minitransformer.tokenizers import CharTokenizer

    ours = CharTokenizer(list(chars))
    tok = transformers.AutoTokenizer.from_pretrained(
        save_hf(_tiny_gpt(ours.vocab_size), tmp_path / "hf", ours))
    ids = tok(chars[-1] + "🙂")["input_ids"]
    assert ids == [ours.stoi[chars[-1]], ours.stoi[stand_in]]
    assert tok.decode(ids) == chars[-1] + stand_in


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path):
    from minitransformer.errors import UserError
    from minitransformer.tokenizers import CharTokenizer

    with pytest.raises(UserError, match="do not belong together"):
        save_hf(_tiny_gpt(3), tmp_path / "hf", CharTokenizer(list("abcd")))
    assert not (tmp_path / "hf").exists()
