"""A SentencePiece-style tokenizer (Llama 1-2's, Mistral's: ``▁`` marks a space) decodes a
text's first token without its space: ``▁is`` alone is ``is``. What generation adds to a
prompt keeps it: ``sample`` writes ``The model is``, not ``The modelis``, and ``serve``'s
completions and their log-probability tokens say `` is``.

Reference: transformers' own decoding of the whole sequence, prompt and continuation, on a
small random LlamaForCausalLM (no network)."""

import json
import os
import urllib.request

import pytest
import torch
from tokenizers import SentencePieceBPETokenizer, processors

from minitransformer.cli import main
from minitransformer.families import load_run
from minitransformer.interop import load_hf, load_hf_tokenizer
from minitransformer.tokenizers import BPETokenizer
from minitransformer.training.checkpoint import write_model_files

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TEXT = "the model is good and the model is bad, said the old man to the young one. " * 30
PROMPT = "the model"


@pytest.fixture(scope="module")
def folder(tmp_path_factory, small_llama):
    """A random Llama whose tokenizer.json is SentencePiece-style BPE with <s> first."""
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator([TEXT], vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"],
                           show_progress=False)
    tok = sp._tokenizer
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    out = tmp_path_factory.mktemp("sp") / "hf"
    model = small_llama(tok.get_vocab_size(), seed=5)
    with torch.no_grad():
        model.model.embed_tokens.weight[:3] = -5.0  # no specials: whole words keep coming
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>"}))
    return model, out


def hf_text(model, out, n: int) -> str:
    """The prompt and its greedy continuation, decoded whole by transformers."""
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    full = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0, eos_token_id=None)
    return tok.decode(full[0], skip_special_tokens=True)


def test_sample_keeps_the_space_before_what_it_adds(folder, tmp_path, capsys):
    model, out = folder
    expected = hf_text(model, out, 10)
    assert expected.startswith(PROMPT + " ")  # the space the bug dropped
    assert main(["sample", "--hf", str(out), "--prompt", PROMPT, "--max-new-tokens", "10",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    ours = load_hf(out)
    write_model_files(tmp_path / "run", ours, {"family": "gpt", "model": ours.config.__dict__},
                      BPETokenizer(load_hf_tokenizer(out).tokenizer))
    assert main(["sample", str(tmp_path / "run"), "--prompt", PROMPT, "--max-new-tokens", "10",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == expected + "\n"

    from minitransformer.serve import Settings, create_app, running

    body = {"model": "m", "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 1}
    with running(create_app(load_run(tmp_path / "run"), Settings(model_id="m"))) as url:
        req = urllib.request.Request(url + "v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            choice = json.loads(r.read())["choices"][0]
    assert PROMPT + choice["text"] == expected
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"][0] == len(PROMPT) and logprobs["tokens"][0].startswith(" ")


def test_after_the_start_token_alone_the_text_begins_without_a_space(folder, capsys):
    """sample --prompt "": after <s> alone there is no text, so the first word has no space
    before it, as transformers decodes it."""
    model, out = folder
    tok = transformers.AutoTokenizer.from_pretrained(out)
    full = model.generate(torch.tensor([[1]]), max_new_tokens=6, min_new_tokens=6,
                          do_sample=False, pad_token_id=0, eos_token_id=None)
    expected = tok.decode(full[0], skip_special_tokens=True)
    assert not expected.startswith(" ")
    assert main(["sample", "--hf", str(out), "--prompt", "", "--max-new-tokens", "6",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_continuation_reads_new_ids_after_the_prompts_own():
    """Unit: '▁the' after the prompt "the model" is ' the'; after <s> alone (no text) 'the',
    as transformers decodes <s>▁the; with no prompt given, after a probe token: ' the'."""
    from minitransformer.tokenizers.streaming import continuation

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator([TEXT], vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"],
                           show_progress=False)
    tok = BPETokenizer(sp._tokenizer)
    the = tok.token_to_id("\u2581the")
    assert the is not None and tok.decode([the]) == "the"
    assert continuation(tok, [the], tok.encode(PROMPT)) == " the"
    assert continuation(tok, [the], [1]) == "the"
    assert continuation(tok, [the]) == " the"
