"""Our GPT against Hugging Face's GPT2LMHeadModel with the same weights (no network)."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from minitransformer.config import GPTConfig  # noqa: E402
from minitransformer.errors import UserError  # noqa: E402
from minitransformer.interop import load_hf, save_hf  # noqa: E402
from minitransformer.models import GPT  # noqa: E402

VOCAB = 97


def random_gpt2(tmp_path, **overrides):
    """A small GPT2LMHeadModel with random weights large enough to give varied logits."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=2,
                                  n_head=4, attn_implementation="eager", bos_token_id=0,
                                  eos_token_id=0, **overrides)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.3)  # far from the 0.02 init: a test that can fail
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return random_gpt2(tmp_path_factory.mktemp("gpt2"))


def test_logits_equal_hf(gpt2):
    hf, folder = gpt2
    ours = load_hf(folder)
    assert isinstance(ours, GPT)
    assert ours.config.activation == "gelu_tanh" and ours.config.tie_weights
    assert ours.lm_head.weight is ours.tok_emb.weight
    ids = torch.randint(VOCAB, (3, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert ref.abs().max() > 1.0  # the logits are not all near zero
    assert (got - ref).abs().max().item() <= 1e-4


def test_reference_attention_path_equal_hf(gpt2):
    hf, folder = gpt2
    ours = load_hf(folder)
    ids = torch.randint(VOCAB, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids, output_attentions=True)
        logits, _, internals = ours(ids, return_internals=True)
    assert (logits - ref.logits).abs().max().item() <= 1e-4
    for a, b in zip(internals.attentions, ref.attentions, strict=True):
        assert (a - b).abs().max().item() <= 1e-5


def test_greedy_generation_matches_hf(gpt2):
    hf, folder = gpt2
    ours = load_hf(folder)
    prompt = torch.tensor([[5, 17, 42, 8]])
    ref = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0,
                      eos_token_id=None, min_new_tokens=20)
    got = ours.generate(prompt, 20, temperature=0.0)
    assert got.tolist() == ref.tolist()
    assert len(set(got[0, 4:].tolist())) > 3  # not one token repeated


def test_save_hf_round_trip(gpt2, tmp_path):
    hf, folder = gpt2
    ours = load_hf(folder)
    out = save_hf(ours, tmp_path / "saved")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    back = transformers.GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").eval()
    ids = torch.randint(VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4


def test_save_hf_of_our_own_gpt(tmp_path):
    """A GPT trained here (exact GELU, untied head, own eps) loads in transformers unchanged."""
    torch.manual_seed(4)
    cfg = GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=2, n_embd=32, d_ff=80,
                    activation="gelu", tie_weights=False, layer_norm_eps=1e-6)
    ours = GPT(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    save_hf(ours, tmp_path / "mine")
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "mine",
                                                        attn_implementation="eager").eval()
    ids = torch.randint(31, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (back(ids).logits - ours(ids)[0]).abs().max().item() <= 1e-4
    again = load_hf(tmp_path / "mine")
    assert again.config == GPTConfig(**{**cfg.__dict__, "dropout": 0.0})


@pytest.mark.parametrize("change", [dict(pos_encoding="rope"), dict(norm_position="post"),
                                    dict(bias=False), dict(pos_encoding="sinusoidal")])
def test_save_hf_refuses_what_gpt2_cannot_express(tmp_path, change):
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, **change))
    with pytest.raises(UserError, match="cannot be written as GPT-2"):
        save_hf(model, tmp_path / "x")
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_load_hf_refuses_unsupported_options(tmp_path):
    _, folder = random_gpt2(tmp_path, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(UserError, match="scale_attn_by_inverse_layer_idx"):
        load_hf(folder)


def test_pytorch_bin_is_read_without_unpickling_code(gpt2, tmp_path):
    hf, _ = gpt2
    folder = tmp_path / "bin"
    folder.mkdir()
    hf.config.to_json_file(folder / "config.json")
    torch.save({k: v.clone() for k, v in hf.state_dict().items()}, folder / "pytorch_model.bin")
    ours = load_hf(folder)
    ids = torch.randint(VOCAB, (1, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (ours(ids)[0] - hf(ids).logits).abs().max().item() <= 1e-4

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, folder / "pytorch_model.bin")
    with pytest.raises(UserError, match="plain tensors") as refused:
        load_hf(folder)
    line = str(refused.value)  # short and plain, naming what it refused, no unsafe advice
    assert "system)" in line and "weights_only" not in line and "\x1b" not in line
    assert "\n" not in line and len(line) < 300
    (folder / "pytorch_model.bin").write_text(  # a clone without its LFS files
        "version https://git-lfs.github.com/spec/v1\noid sha256:ab12\nsize 500000000\n")
    with pytest.raises(UserError, match="is a Git LFS pointer, not the weights"):
        load_hf(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02garbage")  # damaged: no objects named
    with pytest.raises(UserError, match=r"as plain tensors \(UnpicklingError") as refused:
        load_hf(folder)
    assert "other objects" not in str(refused.value)


def test_load_hf_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such"):
        load_hf(tmp_path / "absent")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(UserError, match="not supported"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UserError, match="holds no weights"):
        load_hf(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(UserError, match="safetensors"):
        load_hf(tmp_path)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_export_cli_writes_what_transformers_loads(tmp_path, kind, capsys):
    """`minitransformer export RUN --hf OUT`: transformers reads the weights and the tokenizer
    (same ids, same text back) and computes our logits."""
    from minitransformer.cli import main
    from minitransformer.tokenizers import fit_tokenizer
    from minitransformer.training.checkpoint import write_model_files

    text = "First Citizen:\nBefore we proceed any further, hear me speak. 你好！\n" * 20
    tok = fit_tokenizer(kind, text, 280)
    torch.manual_seed(7)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg).eval()
    run = tmp_path / "run"
    write_model_files(run, model, {"family": "gpt", "model": cfg.__dict__}, tok)
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "out" /
                                                                     "tokenizer.json"))
    sample = "Before we proceed,\nhear me 你好"
    ids = tok.encode(sample)
    assert hf_tok(sample)["input_ids"] == ids
    assert hf_tok.decode(ids) == sample
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out",
                                                      attn_implementation="eager").eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        assert (hf(x).logits - model(x)[0]).abs().max().item() <= 1e-4
    capsys.readouterr()
    assert main(["sample", "--hf", str(tmp_path / "out"), "--prompt", "hear", "--seed", "1",
                 "--max-new-tokens", "5"]) == 0
    via_hf = capsys.readouterr().out
    assert main(["sample", str(run), "--prompt", "hear", "--seed", "1",
                 "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out == via_hf
