"""Special tokens of Hugging Face tokenizers, through sample, serve, the pages and export.

Prompts begin as the model's tokenizer begins a text: a tokenizer.json post-processor's
leading special tokens (Llama's ``<s>``) come first, as transformers' ``tokenizer(text)`` puts
them; its trailing ones never do; our own tokenizers add nothing. ``export`` gives special
tokens the roles the source folder gave them (Qwen-instruct's ``<|im_end|>`` as eos_token).

References: transformers' ``PreTrainedTokenizerFast`` and ``LlamaForCausalLM.generate`` on
the same folder (random weights, no network)."""

import json
import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from minitransformer.cli import main
from minitransformer.families import load_run
from minitransformer.interop import load_hf, load_hf_tokenizer
from minitransformer.tokenizers import BPETokenizer, CharTokenizer
from minitransformer.tokenizers.specials import (
    document_separator,
    leading_specials,
    prompt_ids,
)
from minitransformer.training.checkpoint import write_model_files

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ["<unk>", "<s>", "</s>", "[CLS]", "[SEP]", *"abcdefghijklmnopqrstuvwxyz ,.!?"]


def word_tokenizer(post_processor=None, specials=WORDS[:5]) -> Tokenizer:
    """One id per character (ids 0-4 the ``specials``), with ``post_processor`` if given."""
    words = [*specials, *WORDS[5:]]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(specials))
    if post_processor is not None:
        tok.post_processor = post_processor
    return tok


LLAMA = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])


@pytest.mark.parametrize("post_processor,lead", [
    (None, []),
    (LLAMA, [1]),
    (processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1),
                                                                         ("</s>", 2)]), [1]),
    (processors.BertProcessing(("[SEP]", 4), ("[CLS]", 3)), [3]),
    (processors.ByteLevel(trim_offsets=False), []),
])
def test_leading_specials_are_the_post_processors_and_never_its_trailing_ones(post_processor,
                                                                              lead):
    tok = word_tokenizer(post_processor)
    assert leading_specials(tok) == lead
    text_ids = tok.encode("to be", add_special_tokens=False).ids
    assert prompt_ids(tok, "to be") == lead + text_ids
    assert BPETokenizer(tok).encode_prompt("to be") == lead + text_ids


def test_a_prompt_that_begins_with_its_start_token_gets_no_second_one():
    tok = word_tokenizer(LLAMA)
    assert prompt_ids(tok, "<s>to be") == tok.encode("<s>to be", add_special_tokens=False).ids
    assert prompt_ids(tok, "<s>to be")[:2] == [1, WORDS.index("t")]


def test_our_own_tokenizers_add_nothing():
    text = "To be, or not to be"
    char = CharTokenizer.fit(text)
    assert char.encode_prompt(text) == char.encode(text)
    bpe = BPETokenizer.train([text] * 20, 300)
    assert bpe.encode_prompt(text) == bpe.encode(text)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, small_llama):
    """A small random LlamaForCausalLM whose tokenizer.json puts <s> first, as Llama's does."""
    folder = tmp_path_factory.mktemp("llama") / "hf"
    model = small_llama(len(WORDS), seed=3)
    model.save_pretrained(folder)
    word_tokenizer(LLAMA).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    return model, folder


def hf_greedy(model, folder, prompt: str, n: int) -> str:
    """transformers' own path: tokenizer(prompt), then generate, decoded past the prompt."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0, 0].item() == 1  # transformers put <s> first
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("prompt", ["to be", "to be, or not"])
def test_sample_hf_continues_what_transformers_generate_continues(llama_folder, capsys,
                                                                  prompt):
    """"to be": <s> changes what this random model writes (a longer prompt washes it out);
    "to be, or not": it writes [SEP] and <s>, left out as a run's sample leaves them out
    (transformers' decode(..., skip_special_tokens=True))."""
    model, folder = llama_folder
    expected = hf_greedy(model, folder, prompt, 12)
    assert main(["sample", "--hf", str(folder), "--prompt", prompt, "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == prompt + expected + "\n"


def test_sample_keeps_the_start_token_in_every_window_by_default(llama_folder, capsys):
    # block_size 64: 80 tokens move the window; <s> stays first in it unless told otherwise
    _, folder = llama_folder
    outs = {}
    for keep in (None, 1, 0):
        flags = [] if keep is None else ["--context-keep", str(keep)]
        assert main(["sample", "--hf", str(folder), "--prompt", "to be", "--max-new-tokens",
                     "80", "--temperature", "0", *flags]) == 0
        outs[keep] = capsys.readouterr().out
    assert outs[None] == outs[1] != outs[0]


def test_the_start_token_is_kept_by_default_only_where_the_window_has_room(llama_folder,
                                                                          capsys):
    from minitransformer.models.generation import default_context_keep

    assert default_context_keep(1, 64) == 1 and default_context_keep(0, 64) == 0
    assert default_context_keep(1, 1) == 0 and default_context_keep(1, 64, shift=63) == 0
    _, folder = llama_folder  # block_size 64: a shift of 63 leaves no room for <s>
    assert main(["sample", "--hf", str(folder), "--prompt", "to be", "--max-new-tokens", "70",
                 "--temperature", "0", "--context-shift", "63"]) == 0
    err = capsys.readouterr().err  # the model's description alone, as a Llama's parts
    assert err.count("\n") == 1 and err.startswith("GPT (rope, rmsnorm, swiglu): ")
    assert main(["sample", "--hf", str(folder), "--prompt", "to be", "--context-keep", "1",
                 "--context-shift", "63"]) == 2
    assert "less the 1 kept token(s), 63" in capsys.readouterr().err


@pytest.fixture(scope="module")
def llama_run(llama_folder, tmp_path_factory):
    """A run holding the folder's model and tokenizer, as ``train --init_from`` keeps them."""
    _, folder = llama_folder
    ours = load_hf(folder)
    run = tmp_path_factory.mktemp("run") / "run"
    write_model_files(run, ours, {"family": "gpt", "model": ours.config.__dict__},
                      BPETokenizer(load_hf_tokenizer(folder).tokenizer))
    return run


def test_an_empty_prompt_is_the_start_token_alone(llama_folder, llama_run, tmp_path, capsys):
    """sample --prompt "" on a Llama: what transformers' generate writes after <s> alone; a
    model whose tokenizer has no start token refuses an empty prompt, after loading it."""
    model, folder = llama_folder
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = model.generate(torch.tensor([[1]]), max_new_tokens=6, min_new_tokens=6,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    expected = tok.decode(out[0, 1:], skip_special_tokens=True)
    for source in (["--hf", str(folder)], [str(llama_run)]):
        assert main(["sample", *source, "--prompt", "", "--max-new-tokens", "6",
                     "--temperature", "0"]) == 0
        assert capsys.readouterr().out == expected + "\n"
    char = tmp_path / "char.txt"
    char.write_text("to be or not to be\n" * 50)
    assert main(["train", "--data", str(char), "--out", str(tmp_path / "c"), "--preset",
                 "debug", "--max_iters", "1", "--eval_iters", "1", "--quiet"]) == 0
    assert main(["sample", str(tmp_path / "c"), "--prompt", ""]) == 2
    assert "--prompt is empty" in capsys.readouterr().err


def test_a_run_from_a_llama_folder_samples_and_serves_from_its_start_token(llama_folder,
                                                                           llama_run, capsys):
    """``sample`` and ``serve``'s completions continue <s> + prompt; the playground's token
    view and its inspector count the same tokens."""
    import urllib.request

    from minitransformer.serve import Settings, create_app, running

    model, folder = llama_folder
    prompt = "to be"
    expected = hf_greedy(model, folder, prompt, 8)
    assert main(["sample", str(llama_run), "--prompt", prompt, "--max-new-tokens", "8",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == prompt + expected + "\n"

    def post(url, path, body):
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    with running(create_app(load_run(llama_run), Settings(model_id="m"))) as url:
        done = post(url, "v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 8,
                                            "temperature": 0})
        assert done["choices"][0]["text"] == expected
        assert done["usage"]["prompt_tokens"] == len(prompt) + 1  # <s> and a token a letter
        assert post(url, "api/tokenize", {"text": prompt})["ids"][:2] == [1, WORDS.index("t")]
        seen = post(url, "api/inspect", {"text": prompt, "position": -1, "top": 1})
        assert seen["position"] == len(prompt) and seen["offset"] == 0
        alone = post(url, "v1/completions", {"model": "m", "prompt": "", "max_tokens": 4,
                                             "temperature": 0})  # "": <s> alone, as sample
        assert alone["usage"]["prompt_tokens"] == 1
        assert alone["choices"][0]["text"] == hf_greedy(model, folder, "", 4)


def test_the_pages_of_a_llama_run_show_the_forward_pass_sample_runs(llama_run):
    """The attention map and the walkthrough read the text as sample reads a prompt: <s>
    first (where a Llama's heads gather much of their attention); a text cut to fit the
    walkthrough leaves room for it."""
    from minitransformer.serve.walkthrough import last_tokens
    from minitransformer.viz.walkthrough import DISPLAY_TOKENS

    run = load_run(llama_run)
    view = run.family.attention_views(run.model, run.tokenizer, "to be")[0]
    assert view.query_labels == ["<s>", "t", "o", "␣", "b", "e"] and view.weights.shape[-1] == 6
    doc = run.family.explain(run.model, run.tokenizer, "to be", 0, 0, 3, "")
    tokens = next(b["tokens"] for b in doc["steps"][0]["blocks"] if b["kind"] == "tokens")
    assert [t["label"] if isinstance(t, dict) else t for t in tokens][:2] == ["<s>", "t"]
    long = "to be or not to be " * 20
    kept, dropped = last_tokens(run, long)
    limit = min(run.model.config.block_size, DISPLAY_TOKENS)
    assert len(kept) == limit - 1 and dropped == len(long) - limit + 1
    run.family.explain(run.model, run.tokenizer, kept, 0, 0, 3, "")  # fits, <s> and all


QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim|>", "<|box|>"]
TEXT = "to be, or not to be, that is the question.\n" * 40


def exported_roles(folder) -> tuple[dict, dict]:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    return ({k: config.get(k) for k in ("bos_token", "eos_token", "pad_token")},
            {k: generation.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")})


def test_export_writes_back_the_source_folders_roles_through_a_chain_of_runs(llama_folder,
                                                                             tmp_path):
    """A Qwen-instruct-style folder says eos_token <|im_end|>; by name alone <|endoftext|>
    would take both bos and eos. Two runs on (the second from the first), the export says
    what the folder said, and transformers' tokenizer and generate read it; and its context
    is the folder's, not the shorter windows the runs trained on."""
    import transformers

    _, llama = llama_folder
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((llama / "model.safetensors").read_bytes())
    (folder / "config.json").write_text((llama / "config.json").read_text())
    word_tokenizer(specials=QWEN).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
         "eos_token": {"content": "<|im_end|>", "special": True},
         "pad_token": "<|endoftext|>"}))
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    common = ["--data", str(data), "--block_size", "16", "--batch_size", "2", "--max_iters",
              "1", "--eval_iters", "1", "--sample_tokens", "0", "--quiet"]
    assert main(["train", "--init_from", str(folder), "--out", str(tmp_path / "a"),
                 *common]) == 0
    assert main(["train", "--init_from", str(tmp_path / "a"), "--out", str(tmp_path / "b"),
                 *common]) == 0
    for run in ("a", "b"):
        assert main(["export", str(tmp_path / run), "--hf", str(tmp_path / f"{run}-hf")]) == 0
        tokens, ids = exported_roles(tmp_path / f"{run}-hf")
        assert tokens == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                          "pad_token": "<|endoftext|>"}
        assert ids == {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}
        # trained on windows of 16, the RoPE model still reads as far as the folder's 64
        config = json.loads((tmp_path / f"{run}-hf" / "config.json").read_text())
        tok_config = json.loads((tmp_path / f"{run}-hf" / "tokenizer_config.json").read_text())
        assert config["max_position_embeddings"] == tok_config["model_max_length"] == 64
        assert json.loads((tmp_path / run / "config.json").read_text())["model"][
            "block_size"] == 16
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "b-hf")
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)


def test_export_names_a_post_processors_start_token_bos(tmp_path):
    """Llama 3's <|begin_of_text|> has no usual name: the post-processor that puts it first
    makes it bos_token."""
    from minitransformer.interop.tokenizer import exported_tokenizer

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|x|>", "<|y|>", "<|z|>"]
    lead = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                         special_tokens=[("<|begin_of_text|>", 0)])
    assert exported_tokenizer(BPETokenizer(word_tokenizer(lead, specials))).specials == \
        {"bos_token": "<|begin_of_text|>"}
    assert exported_tokenizer(BPETokenizer(word_tokenizer(None, specials))).specials == {}


@pytest.mark.parametrize("specials,post_processor,separator", [
    (QWEN, None, "<|endoftext|>"),  # GPT-2's, Qwen's and ours: the token itself
    (WORDS[:5], LLAMA, "</s><s>"),  # Llama: its end, then its start
    (WORDS[:5], None, "</s>"),
    (["<unk>", "<s>", "[PAD]", "[CLS]", "[SEP]"], None, "\n\n"),  # no end token: a blank line
])
def test_documents_are_kept_apart_by_the_tokenizers_own_tokens(specials, post_processor,
                                                                separator):
    tok = word_tokenizer(post_processor, specials)
    assert document_separator(tok, "<|endoftext|>") == separator


def stream(folder) -> list[int]:
    from minitransformer.data.shards import open_shards

    _, train, val = open_shards(folder)
    return [int(i) for i in train[:len(train)]] + [int(i) for i in val[:len(val)]]


def test_a_llama_tokenizers_documents_end_with_its_own_tokens(llama_folder, tmp_path, capsys):
    """prepare --tokenizer_from and train --init_from put </s><s> between documents, never
    the text "<|endoftext|>" (which the folder's tokenizer spells as ordinary tokens); the
    hint prepare ends with starts from the folder."""
    _, folder = llama_folder
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {w} to be."}) + "\n"
                            for w in ("one", "two", "three")))
    out = tmp_path / "prepared"
    assert main(["prepare", "--data", str(data), "--out", str(out), "--tokenizer_from",
                 str(folder)]) == 0
    said = capsys.readouterr().out
    assert f"minitransformer train --init_from {folder} --data {out} --out RUN" in said
    ids = stream(out)
    tok = load_hf_tokenizer(folder)
    assert ids == tok.encode("doc one to be.</s><s>doc two to be.</s><s>doc three to be.")
    assert ids.count(0) == 0 and ids.count(2) == ids.count(1) == 2  # no <unk>
    assert main(["train", "--init_from", str(folder), "--data", str(data), "--out",
                 str(tmp_path / "run"), "--block_size", "16", "--batch_size", "2",
                 "--max_iters", "1", "--eval_iters", "1", "--sample_tokens", "0",
                 "--quiet"]) == 0
    from minitransformer.data.cache import TOKENS_DIR, cache_root

    cache = json.loads((tmp_path / "run" / "config.json").read_text())["data"]["cache"]
    assert stream(cache_root() / TOKENS_DIR / cache) == ids


def test_the_tokens_a_served_completion_ends_at(llama_run, tmp_path):
    """Our BPE runs and GPT-2's end at <|endoftext|>, a Llama run at </s>, a run from a
    Qwen-instruct folder at its eos_token <|im_end|> and at the <|endoftext|> between its
    documents (transformers stops Qwen at both); a char run never ends early."""
    from minitransformer.families import FAMILIES

    gpt = FAMILIES["gpt"]
    run = load_run(llama_run)
    assert gpt.end_tokens(run.tokenizer, run.meta) == {2}  # </s>
    ours = BPETokenizer.train(["to be or not to be"] * 20, 300, special_tokens=["<|endoftext|>"])
    assert gpt.end_tokens(ours, {}) == {ours.token_to_id("<|endoftext|>")} == {0}
    qwen = BPETokenizer(word_tokenizer(specials=QWEN))
    assert gpt.end_tokens(qwen, {}) == {0}  # <|endoftext|> by name
    meta = {"init_from": {"kind": "hf", "special_tokens": {"eos_token": "<|im_end|>"}}}
    assert gpt.end_tokens(qwen, meta) == {0, 2}
    assert gpt.end_tokens(BPETokenizer(word_tokenizer(specials=["<unk>", "a1", "a2", "a3",
                                                               "a4"])), {}) == set()
    assert gpt.end_tokens(CharTokenizer.fit("abc"), {}) == set()


def marks_first_word() -> Tokenizer:
    """A Llama tokenizer whose Metaspace marks only a text's first word (prepend_scheme
    "first"), <s> put first."""
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(["the model is good and the old man is bad. " * 40], vocab_size=80,
                           special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    hf = sp._tokenizer
    hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    hf.decoder = decoders.Metaspace(prepend_scheme="first")
    hf.post_processor = LLAMA
    return hf


def test_each_document_is_encoded_as_the_tokenizer_reads_a_text_alone(tmp_path):
    """Metaspace marking a text's first word alone: between documents go the ids of
    </s><s>, and the next document's first word keeps its mark, as when the tokenizer reads
    that document alone (written as the text "</s><s>the", the word lost it)."""
    from minitransformer.data.shards import open_shards, write_stream

    hf = marks_first_word()
    tok = BPETokenizer(hf)
    assert document_separator(hf, "<|endoftext|>") == "</s><s>"
    docs = ["the model is good", "the old man", "and the model"]
    write_stream(((True, d.encode()) for d in docs), tok, tmp_path / "dd", [], 0.3,
                 "</s><s>")
    _, train, val = open_shards(tmp_path / "dd")
    ids = [int(i) for i in train[:len(train)]] + [int(i) for i in val[:len(val)]]
    alone = [hf.encode(d, add_special_tokens=False).ids for d in docs]
    assert ids == alone[0] + [2, 1] + alone[1] + [2, 1] + alone[2]
    assert hf.id_to_token(alone[1][0]).startswith("\u2581")  # "▁the": the word's mark


@pytest.mark.parametrize("prompt", ["", "the"])
def test_logprobs_tokens_join_to_the_text_after_a_prompt_of_the_start_token_alone(prompt):
    """After <s> alone the first word reads without the space its mark stands for, in the
    text and in its logprobs entry; inside a text it keeps it."""
    from minitransformer.serve.choices import Choice

    tok = BPETokenizer(marks_first_word())
    before = tok.encode_prompt(prompt)
    c = Choice(0, [], offset=len(prompt), before=before)
    lp = torch.log_softmax(torch.zeros(tok.vocab_size), 0)
    for token in tok.encode(" good model is old"):
        c.add(token, lp, 1, tok)
    c.end(tok)
    text, entries = c.take()
    assert text == (" good model is old" if prompt else "good model is old")
    assert "".join(e.text for e in entries) == text
    assert all(e.text in e.top for e in entries)


def test_the_unknown_id_is_the_models_own_unknown_token():
    from tokenizers import models

    from minitransformer.tokenizers.specials import unknown_id

    wordpiece = Tokenizer(models.WordPiece({"[PAD]": 0, "[UNK]": 1, "a": 2}, unk_token="[UNK]"))
    unigram = Tokenizer(models.Unigram([("<pad>", 0), ("[UNKNOWN]", 0), ("a", -1)], unk_id=1))
    assert unknown_id(wordpiece) == 1 and unknown_id(unigram) == 1
    assert unigram.encode("ab").ids == [2, 1]
    named = Tokenizer(models.BPE({"<pad>": 0, "<unk>": 1, "a": 2}, []))
    assert unknown_id(named) == 1  # <unk> by name, where the model names none
    assert unknown_id(Tokenizer(models.BPE({"<pad>": 0, "a": 1}, []))) is None
