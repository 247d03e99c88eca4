"""Our GPT against Hugging Face's LlamaForCausalLM (and Qwen3ForCausalLM) with the same
weights (no network).

Two small random Llamas: grouped-query attention (4 query heads on 2 key/value heads) with an
untied head and a RoPE base of 500, and multi-query attention (8 on 1) with a tied head; and a
small random Qwen3 (Llama with QK-norm), 4 query heads on 2, tied.
"""

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

VOCAB, BLOCK = 101, 32
CONFIGS = {
    "gqa_untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=False),
    "mqa_tied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=True),
    "qwen3_tied": dict(kind="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True),
}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}


def random_llama(folder, seed=0, kind="llama", **overrides):
    """A small LlamaForCausalLM with random weights far from its init, saved as safetensors:
    linear and embedding weights N(0, 0.25) (varied logits), norm gains 1 + N(0, 0.2) (a gain
    copied to the wrong place shows)."""
    torch.manual_seed(seed)
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[kind])
    cfg = config_class(vocab_size=VOCAB, max_position_embeddings=BLOCK,
                       attn_implementation="eager", bos_token_id=0, eos_token_id=0, **overrides)
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25)
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def llama(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    return random_llama(folder, **CONFIGS[request.param]), folder


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_config_read_from_llama_fields(llama):
    hf, folder = llama
    c, h = load_hf(folder).config, hf.config
    assert (c.norm, c.activation, c.pos_encoding, c.norm_position, c.bias) == \
        ("rmsnorm", "swiglu", "rope", "pre", False)
    assert (c.n_embd, c.n_layer, c.n_head, c.d_ff, c.block_size, c.vocab_size) == \
        (h.hidden_size, h.num_hidden_layers, h.num_attention_heads, h.intermediate_size,
         BLOCK, VOCAB)
    assert (c.n_kv_head, c.tie_weights, c.layer_norm_eps) == \
        (h.num_key_value_heads, h.tie_word_embeddings, h.rms_norm_eps)
    assert c.qk_norm == (h.model_type == "qwen3")
    assert c.rope_base == h.rope_parameters["rope_theta"]


@pytest.mark.parametrize("attn_impl", ["reference", "fast"])
def test_logits_equal_hf(llama, attn_impl):
    hf, folder = llama
    ours = load_hf(folder)
    ours.config.attn_impl = attn_impl
    for block in ours.decoder.layers:
        block.self_attn.attn_impl = attn_impl
    assert isinstance(ours, GPT)
    assert (ours.lm_head.weight is ours.tok_emb.weight) == hf.config.tie_word_embeddings
    ids = torch.randint(VOCAB, (3, BLOCK), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert ref.abs().max() > 1.0  # the logits are not all near zero
    assert max_diff(got, ref) <= 1e-4


def test_kv_cached_steps_equal_hf(llama):
    """Position by position through our KV cache: RoPE's offset and the grouped cache."""
    hf, folder = llama
    ours = load_hf(folder)
    ids = torch.randint(VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = ours.new_cache()
    with torch.no_grad():
        ref = hf(ids).logits
        steps = [ours(ids[:, :5], cache=cache)[0]]
        steps += [ours(ids[:, t:t + 1], cache=cache)[0] for t in range(5, 20)]
    assert max_diff(torch.cat(steps, dim=1), ref) <= 1e-4


def test_greedy_generation_matches_hf(llama):
    """Inside the context window (4 + 24 <= 32): past it HF's Llama keeps counting positions
    while ours moves the window, by design."""
    hf, folder = llama
    ours = load_hf(folder)
    prompt = torch.tensor([[5, 17, 42, 8], [1, 2, 3, 99]])
    ref = hf.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                      pad_token_id=0, eos_token_id=None)
    got = ours.generate(prompt, 24, temperature=0.0)
    assert got.tolist() == ref.tolist()
    assert len(set(got[:, 4:].flatten().tolist())) > 3  # not one token repeated


def test_export_round_trip(llama, tmp_path):
    """ours -> save_hf -> LlamaForCausalLM (and AutoModelForCausalLM) and -> load_hf again."""
    hf, folder = llama
    ours = load_hf(folder)
    out = save_hf(ours, tmp_path / "saved")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == hf.config.model_type
    assert cfg["architectures"] == [type(hf).__name__]
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert type(back) is type(hf)
    again = load_hf(out)
    assert again.config == ours.config
    ids = torch.randint(VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        assert max_diff(back.eval()(ids).logits, ref) <= 1e-4
        assert max_diff(again(ids)[0], ref) <= 1e-4


def test_save_hf_of_our_own_llama_shaped_gpt(tmp_path):
    """A GPT built here with Llama's switches (and the SwiGLU default width) loads in
    transformers unchanged."""
    torch.manual_seed(4)
    cfg = GPTConfig(vocab_size=31, block_size=16, n_layer=2, n_head=4, n_embd=32,
                    norm="rmsnorm", activation="swiglu", pos_encoding="rope", bias=False,
                    n_kv_head=2, rope_base=1234.0, tie_weights=False, layer_norm_eps=1e-6)
    ours = GPT(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    save_hf(ours, tmp_path / "mine")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "mine",
                                                         attn_implementation="eager").eval()
    assert back.config.intermediate_size == cfg.ffn_width
    ids = torch.randint(31, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert max_diff(back(ids).logits, ours(ids)[0]) <= 1e-4
    again = load_hf(tmp_path / "mine")
    assert again.config == GPTConfig(**{**cfg.__dict__, "d_ff": cfg.ffn_width})


@pytest.mark.parametrize("change", [dict(bias=True), dict(scale_embeddings=True),
                                    dict(logit_softcap=30.0), dict(norm_position="post")])
def test_save_hf_refuses_what_neither_expresses(tmp_path, change):
    llama_shaped = dict(norm="rmsnorm", activation="swiglu", pos_encoding="rope", bias=False)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8,
                          **{**llama_shaped, **change}))
    name = next(iter(change))
    with pytest.raises(UserError, match=f"cannot be written as GPT-2.*nor as Llama.*{name}="):
        save_hf(model, tmp_path / "x")
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_gpt2_shaped_gpt_is_still_written_as_gpt2(tmp_path):
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    cfg = json.loads((save_hf(model, tmp_path / "g") / "config.json").read_text())
    assert cfg["model_type"] == "gpt2"


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain") / "hf"
    random_llama(folder, seed=8, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                 num_attention_heads=2, rope_theta=500.0)
    return folder


def rewrite_config(src, dst, **changes):
    """A copy of the folder ``src`` whose config.json has ``changes`` (None deletes a key)."""
    dst.mkdir()
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_older_files_with_top_level_rope_theta(llama_folder, tmp_path):
    old = rewrite_config(llama_folder, tmp_path / "old", rope_parameters=None, rope_theta=500.0,
                         rope_scaling=None)
    assert load_hf(old).config.rope_base == 500.0
    gone = rewrite_config(llama_folder, tmp_path / "gone", rope_parameters=None)
    assert load_hf(gone).config.rope_base == 10000.0  # Llama's default theta


def test_model_type_from_architectures_alone(llama_folder, tmp_path):
    folder = rewrite_config(llama_folder, tmp_path / "arch", model_type=None)
    assert json.loads((folder / "config.json").read_text())["architectures"] == \
        ["LlamaForCausalLM"]
    assert load_hf(folder).config.norm == "rmsnorm"


REFUSED = [
    ("rope_parameters.rope_type", dict(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 10000.0})),
    ("rope_parameters.partial_rotary_factor",
     dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                           "partial_rotary_factor": 0.5})),
    ("rope_scaling", dict(rope_parameters=None, rope_theta=10000.0,
                          rope_scaling={"type": "dynamic", "factor": 2.0})),
    ("head_dim", dict(head_dim=32)),
    ("attention_bias", dict(attention_bias=True)),
    ("mlp_bias", dict(mlp_bias=True)),
    ("pretraining_tp", dict(pretraining_tp=2)),
    ("hidden_act", dict(hidden_act="gelu")),
    ("use_sliding_window", dict(model_type="qwen3", use_sliding_window=True)),
    ("layer_types", dict(layer_types=["sliding_attention"])),
]


@pytest.mark.parametrize("field,change", REFUSED, ids=[f for f, _ in REFUSED])
def test_refuses_what_we_do_not_implement(llama_folder, tmp_path, field, change, capsys):
    folder = rewrite_config(llama_folder, tmp_path / "x", **change)
    with pytest.raises(UserError, match=f"sets {field.replace('.', '[.]')}="):
        load_hf(folder)
    from minitransformer.cli import main
    capsys.readouterr()
    assert main(["sample", "--hf", str(folder), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_export_cli_of_a_llama_shaped_run(tmp_path, capsys):
    """`minitransformer export RUN --hf OUT` for a Llama-shaped run: transformers computes our
    logits, and `sample --hf OUT` writes what `sample RUN` writes."""
    from minitransformer.cli import main
    from minitransformer.tokenizers import fit_tokenizer
    from minitransformer.training.checkpoint import write_model_files

    tok = fit_tokenizer("char", "First Citizen:\nBefore we proceed any further, hear me.\n", 0)
    torch.manual_seed(7)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=4, n_embd=32,
                    norm="rmsnorm", activation="swiglu", pos_encoding="rope", bias=False,
                    n_kv_head=1, tie_weights=False)
    model = GPT(cfg).eval()
    run = tmp_path / "run"
    write_model_files(run, model, {"family": "gpt", "model": cfg.__dict__}, tok)
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out",
                                                           attn_implementation="eager").eval()
    assert isinstance(hf, transformers.LlamaForCausalLM)
    x = torch.tensor([tok.encode("Before we proceed,\nhear me")])
    with torch.no_grad():
        assert max_diff(hf(x).logits, model(x)[0]) <= 1e-4
    capsys.readouterr()
    args = ["--prompt", "hear", "--seed", "1", "--max-new-tokens", "5"]
    assert main(["sample", "--hf", str(tmp_path / "out"), *args]) == 0
    via_hf = capsys.readouterr().out
    assert main(["sample", str(run), *args]) == 0
    assert capsys.readouterr().out == via_hf


@pytest.mark.parametrize("changes,said", [
    ({"vocab_size": "320"}, "sets vocab_size='320'; it must be a positive whole number"),
    ({"num_attention_heads": 0}, "sets num_attention_heads=0; it must be a positive"),
    ({"hidden_size": 32.0}, "sets hidden_size=32.0; it must be a positive whole number"),
    ({"rope_parameters": None, "rope_theta": None}, "a value in it cannot be used"),
])
def test_a_config_value_of_the_wrong_kind_is_a_user_error(llama_folder, tmp_path, capsys,
                                                          changes, said):
    """Hand-edited files: each used to end in an internal error (TypeError,
    ZeroDivisionError) with exit 1."""
    from minitransformer.cli import main

    folder = rewrite_config(llama_folder, tmp_path / "x")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)  # None stays null here
    (folder / "config.json").write_text(json.dumps(cfg))
    assert main(["sample", "--hf", str(folder), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_folder_with_only_sentencepieces_file_says_how_to_get_tokenizer_json(llama_folder,
                                                                              tmp_path,
                                                                              capsys):
    from minitransformer.cli import main

    folder = rewrite_config(llama_folder, tmp_path / "sp")
    (folder / "tokenizer.model").write_bytes(b"\x0a\x05piece")
    assert main(["sample", "--hf", str(folder), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "has only SentencePiece's tokenizer.model" in err and "save_pretrained" in err
