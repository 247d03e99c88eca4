"""The changes of later models: RMSNorm, SwiGLU, ReLU^2, QK-norm, grouped-query attention,
logit soft-capping and Muon, each against its formula or PyTorch's own module."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from minitransformer.cli import main
from minitransformer.config import GPTConfig, TrainConfig
from minitransformer.errors import ConfigError
from minitransformer.models import GPT
from minitransformer.nn.attention import MultiHeadAttention
from minitransformer.nn.feedforward import FeedForward, SwiGLU
from minitransformer.nn.norm import RMSNorm, rms_norm
from minitransformer.training import checkpoint as ckpt
from minitransformer.training.optim import MuonWithAdamW, make_optimizer, muon_parameters


def gpt(**kw) -> GPT:
    torch.manual_seed(0)
    base = dict(vocab_size=23, block_size=16, n_layer=2, n_head=4, n_embd=32)
    return GPT(GPTConfig(**{**base, **kw})).eval()


# ---- RMSNorm -------------------------------------------------------------------------------

def test_rmsnorm_equals_torch_rmsnorm_and_its_formula():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 3 + 1
    ours, theirs = RMSNorm(16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
    theirs.load_state_dict(ours.state_dict())  # the same parameter name and shape
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)
    by_hand = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * ours.weight
    torch.testing.assert_close(ours(x), by_hand, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rms_norm(x, ours.weight, 1e-6), by_hand, atol=1e-6, rtol=1e-6)
    low = ours(x.bfloat16())  # reduced in fp32, returned in bf16
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), by_hand, atol=0.05, rtol=0.02)


def test_rmsnorm_replaces_every_norm_the_final_one_included():
    model = gpt(norm="rmsnorm")
    norms = [n for n, m in model.named_modules() if isinstance(m, RMSNorm)]
    assert not [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert "decoder.final_norm" in norms and len(norms) == 2 * 2 + 1


# ---- feed-forward ---------------------------------------------------------------------------

def test_swiglu_equals_its_formula_written_out():
    torch.manual_seed(0)
    ffn = SwiGLU(12, 20)
    x = torch.randn(2, 3, 12)
    wg, w1, w2 = ffn.gate.weight, ffn.fc.weight, ffn.proj.weight
    silu = lambda z: z * torch.sigmoid(z)  # noqa: E731
    by_hand = (silu(x @ wg.T) * (x @ w1.T)) @ w2.T
    torch.testing.assert_close(ffn(x), by_hand, atol=1e-6, rtol=1e-6)


def test_swiglu_default_width_keeps_the_parameter_count_of_a_4d_ffn():
    c = GPTConfig(n_embd=384, n_head=6, activation="swiglu", bias=False)
    assert c.ffn_width == 1024  # 2/3 of 4 * 384
    assert GPTConfig(n_embd=128, n_head=4, activation="swiglu").ffn_width == 344  # rounded up to 8
    assert GPTConfig(n_embd=128, n_head=4, activation="swiglu", d_ff=300).ffn_width == 300
    wide = dict(n_embd=384, n_head=6, n_layer=1, bias=False)
    plain, gated = gpt(**wide), gpt(activation="swiglu", **wide)
    ffn_params = lambda m: sum(p.numel() for n, p in m.named_parameters() if ".ffn." in n)  # noqa
    assert ffn_params(gated) == ffn_params(plain) == 2 * 384 * 1536  # 3 * 384 * 1024


def test_relu2_is_relu_squared():
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, activation="relu2")
    x = torch.randn(4, 8)
    torch.testing.assert_close(ffn(x), F.relu(ffn.fc(x)) ** 2 @ ffn.proj.weight.T + ffn.proj.bias)


# ---- attention ------------------------------------------------------------------------------

def reference_attention(attn: MultiHeadAttention, x: torch.Tensor, qk_norm: bool = False):
    """Causal attention computed from the weights: queries per head, keys and values per
    key/value head repeated over their group, QK-norm written out."""
    b, t, c = x.shape
    nh, nkv, hs = attn.n_head, attn.n_kv_head, c // attn.n_head
    q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(b, t, nh, hs).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T + attn.k_proj.bias).view(b, t, nkv, hs).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T + attn.v_proj.bias).view(b, t, nkv, hs).transpose(1, 2)
    if qk_norm:
        q = q / torch.sqrt((q ** 2).mean(-1, keepdim=True) + 1e-6) * attn.q_norm.weight
        k = k / torch.sqrt((k ** 2).mean(-1, keepdim=True) + 1e-6) * attn.k_norm.weight
    k = torch.cat([k[:, j: j + 1].expand(b, nh // nkv, t, hs) for j in range(nkv)], dim=1)
    v = torch.cat([v[:, j: j + 1].expand(b, nh // nkv, t, hs) for j in range(nkv)], dim=1)
    scores = q @ k.transpose(-2, -1) / hs ** 0.5
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
    return y @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("n_kv_head, qk_norm", [(4, False), (2, False), (1, False), (2, True)])
def test_grouped_query_attention_and_qk_norm_match_a_reference(impl, n_kv_head, qk_norm):
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, causal=True, attn_impl=impl, n_kv_head=n_kv_head,
                              qk_norm=qk_norm)
    if qk_norm:
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 1.5)
            attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, 32)
    y, _ = attn(x)
    torch.testing.assert_close(y, reference_attention(attn, x, qk_norm), atol=1e-5, rtol=1e-5)
    assert attn.k_proj.weight.shape == (n_kv_head * 8, 32)


def test_n_kv_head_equal_to_n_head_is_todays_attention():
    torch.manual_seed(0)
    old, new = MultiHeadAttention(32, 4, causal=True), \
        MultiHeadAttention(32, 4, causal=True, n_kv_head=4)
    new.load_state_dict(old.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(old(x)[0], new(x)[0], atol=0, rtol=0)


def test_the_kv_cache_stores_n_kv_head_heads():
    model = gpt(n_kv_head=1, pos_encoding="rope")
    cache = model.new_cache()
    model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    assert cache[0][0].k.shape == (1, 1, 5, 8)  # (B, nkv, T, hs): 4x smaller than 4 heads


# ---- soft-capping ---------------------------------------------------------------------------

def test_logit_softcap_is_cap_tanh_logits_over_cap():
    plain, capped = gpt(), gpt(logit_softcap=2.0)
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 23, (2, 9))
    with torch.no_grad():
        raw, _ = plain(idx)
        with_cap, _ = capped(idx)
    torch.testing.assert_close(with_cap, 2.0 * torch.tanh(raw / 2.0))
    assert with_cap.abs().max() < 2.0


# ---- cached = uncached generation for every switch ------------------------------------------

@pytest.mark.parametrize("switches", [
    dict(norm="rmsnorm"), dict(activation="swiglu", bias=False), dict(activation="relu2"),
    dict(qk_norm=True, pos_encoding="rope"), dict(n_kv_head=2, pos_encoding="rope"),
    dict(n_kv_head=1), dict(logit_softcap=3.0), dict(rope_base=500.0, pos_encoding="rope"),
    dict(norm="rmsnorm", activation="swiglu", qk_norm=True, n_kv_head=2, bias=False,
         pos_encoding="rope", logit_softcap=15.0),
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_cached_generation_equals_uncached(switches):
    model = gpt(**switches)
    with torch.no_grad():  # random weights give flat logits: sharpen them
        model.lm_head.weight.mul_(30)
    prompt = torch.randint(0, 23, (2, 3))
    a = model.generate(prompt, 25, temperature=0.8, seed=1, use_cache=True)
    b = model.generate(prompt, 25, temperature=0.8, seed=1, use_cache=False)
    assert torch.equal(a, b)  # 25 new tokens: past block_size 16, through a context shift


# ---- bad values -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    (dict(n_kv_head=3), "n_kv_head (3) must divide n_head (4)"),
    (dict(n_kv_head=0), "n_kv_head must be positive"),
    (dict(logit_softcap=0.0), "logit_softcap must be positive"),
    (dict(logit_softcap=-1.0), "logit_softcap must be positive"),
    (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm"),
])
def test_bad_values_fail_at_construction(bad, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GPTConfig(n_head=4, n_embd=32, **bad)


def test_bad_values_from_the_cli_exit_2(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world " * 50)
    for flags in (["--n_kv_head", "5"], ["--logit_softcap", "0"],
                  ["--optimizer", "muon", "--muon_lr", "-1"], ["--muon_lr", "0.05"]):
        code = main(["train", "--data", str(corpus), "--out", str(tmp_path / "r"),
                     "--preset", "debug", *flags])
        assert code == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err


def test_muon_with_an_old_pytorch_is_refused(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match="torch.optim.Muon"):
        make_optimizer(gpt(), 1e-3, 0.1, (0.9, 0.99), "cpu", "muon")


# ---- Muon -----------------------------------------------------------------------------------

def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = gpt(pos_encoding="learned")
    hidden = sorted(n for n, _ in muon_parameters(model))
    expected = sorted(f"decoder.layers.{i}.{m}.weight" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
        "ffn.fc", "ffn.proj"))
    assert hidden == expected
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "cpu", "muon", muon_lr=0.02)
    assert isinstance(opt, MuonWithAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    adamw = sorted(names[id(p)] for g in opt.adamw.param_groups for p in g["params"])
    assert adamw == sorted(n for n in names.values() if n not in expected)
    assert "tok_emb.weight" in adamw and "pos_emb.weight" in adamw  # the tied head with them
    assert [g["lr_scale"] for g in opt.muon.param_groups] == [20.0]  # 0.02 / 1e-3


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_newton_schulz_in_fp32_is_torchs_iteration(shape):
    """The fp32 iteration (for CPUs that emulate bf16) is torch.optim.Muon's: the same
    normalisation, orientation and quintic, to bf16's rounding; the singular values land in
    the band the quintic aims for (about 0.7 .. 1.2 after five steps), not at 1."""
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_bf16

    from minitransformer.training.optim import newton_schulz

    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    coefficients = (3.4445, -4.7750, 2.0315)
    ours = newton_schulz(g, coefficients, 5, 1e-7)
    assert ours.dtype == torch.float32 and ours.shape == g.shape
    torch.testing.assert_close(ours, torch_bf16(g, coefficients, 5, 1e-7).float(),
                               atol=0.03, rtol=0)
    s = torch.linalg.svdvals(ours.double())
    assert 0.6 < s.min() and s.max() < 1.25


def test_muon_on_a_cpu_without_bf16_steps_in_fp32_and_puts_torchs_back(monkeypatch):
    from torch.optim import _muon

    from minitransformer.training import optim as optim_mod

    for native, expected in ((False, True), (True, False)):
        monkeypatch.setattr(optim_mod, "cpu_has_bf16", lambda native=native: native)
        opt = make_optimizer(gpt(), 1e-3, 0.0, (0.9, 0.99), "cpu", "muon", muon_lr=0.02)
        assert opt.fp32_iterations is expected
    original, real, seen = _muon._zeropower_via_newtonschulz, optim_mod.newton_schulz, []

    def recording(g, *rest):
        seen.append(tuple(g.shape))
        return real(g, *rest)

    monkeypatch.setattr(optim_mod, "newton_schulz", recording)
    model = gpt()
    opt = make_optimizer(model, 1e-3, 0.0, (0.9, 0.99), "cpu", "muon", muon_lr=0.02)
    opt.fp32_iterations = True
    model(torch.randint(0, 23, (2, 8)), torch.randint(0, 23, (2, 8)))[1].backward()
    opt.step()
    hidden = [tuple(p.shape) for _, p in muon_parameters(model)]
    assert sorted(seen) == sorted(hidden)  # every hidden matrix, through ours
    assert _muon._zeropower_via_newtonschulz is original  # torch's again after the step


def test_an_untied_head_stays_with_adamw():
    model = gpt(tie_weights=False)
    assert "lm_head.weight" not in {n for n, _ in muon_parameters(model)}


TINY = ["--preset", "debug", "--n_layer", "2", "--n_embd", "32", "--n_head", "4",
        "--block_size", "16", "--batch_size", "8", "--eval_iters", "2", "--sample_tokens", "0",
        "--dtype", "float32", "--quiet"]


@pytest.fixture(scope="module")
def muon_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("muon")
    corpus = root / "text.txt"
    corpus.write_text(("To be, or not to be, that is the question. " * 200), encoding="utf-8")
    out = root / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), *TINY, "--optimizer",
                 "muon", "--max_iters", "30", "--eval_interval", "15", "--keep_last", "5"]) == 0
    return corpus, out


def test_a_muon_run_lowers_the_loss(muon_run):
    _, out = muon_run
    with open(out / "log.csv", newline="") as f:
        val = [float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]]
    assert val[-1] < val[0] - 0.5


def test_muon_state_round_trips_and_resume_is_bit_exact(muon_run, tmp_path):
    corpus, out = muon_run
    steps = ckpt.list_checkpoints(out)
    assert [p.name for p in steps] == ["step_0000015", "step_0000030"]
    saved = ckpt.read_state(steps[0])["optimizer"]
    assert saved["kind"] == "muon" and saved["format"] == 2
    assert {g.get("optimizer") for g in saved["param_groups"]} == {"adamw", "muon"}
    # a copy that stopped at step 15, resumed to 30: the same weights, bit for bit
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints" / "step_0000030")
    assert main(["train", "--out", str(copy), "--resume", "--quiet"]) == 0
    a = load_file(out / "checkpoints" / "step_0000030" / ckpt.MODEL_FILE)
    b = load_file(copy / "checkpoints" / "step_0000030" / ckpt.MODEL_FILE)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_with_the_other_optimizer_is_refused(muon_run, tmp_path, capsys):
    _, out = muon_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints" / "step_0000030")
    assert main(["train", "--out", str(copy), "--resume", "--optimizer", "adamw"]) == 2
    assert "--optimizer muon" in capsys.readouterr().err


def test_train_config_muon_fields():
    with pytest.raises(ConfigError):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ConfigError):
        TrainConfig(optimizer="muon", muon_momentum=1.0)
    with pytest.raises(ConfigError, match="applies to --optimizer muon only"):
        TrainConfig(muon_lr=0.05)


def test_compare_varies_the_new_fields(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("It is a truth universally acknowledged. " * 100, encoding="utf-8")
    out = tmp_path / "cmp"
    assert main(["compare", "--data", str(corpus), "--out", str(out), *TINY, "--max_iters",
                 "4", "--eval_interval", "4", "--pos_encoding", "rope",
                 "--vary", "n_kv_head=1,4", "--vary", "optimizer=adamw,muon"]) == 0
    table = (out / "results.md").read_text()
    for value in ("muon", "adamw"):
        assert value in table
    assert len(list(out.glob("*/config.json"))) == 4


def test_an_adamw_checkpoint_of_the_old_format_still_resumes(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("All the world's a stage. " * 100, encoding="utf-8")
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), *TINY, "--max_iters", "8",
                 "--eval_interval", "4", "--keep_last", "5"]) == 0
    shutil.rmtree(out / "checkpoints" / "step_0000008")
    state_file = out / "checkpoints" / "step_0000004" / ckpt.STATE_JSON
    state = json.loads(state_file.read_text())
    assert state["optimizer"].pop("format") == 2 and state["optimizer"].pop("kind") == "adamw"
    state_file.write_text(json.dumps(state))  # as format 1 wrote it: no format, no kind
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    assert ckpt.read_state(out / "checkpoints" / "step_0000008")["step"] == 8


def test_a_modern_preset_with_adamw_drops_its_muon_settings():
    from minitransformer.presets import GPT as PRESETS
    from minitransformer.presets import with_preset

    modern = PRESETS["cpu-medium-modern"]
    assert modern["optimizer"] == "muon" and "muon_lr" in modern
    merged = with_preset(modern, {"optimizer": "adamw"})
    assert "muon_lr" not in merged
    TrainConfig(**{k: v for k, v in merged.items() if k in TrainConfig.__dataclass_fields__})
    # a Muon setting the user gives is kept, and TrainConfig then refuses it
    assert with_preset(modern, {"optimizer": "adamw", "muon_lr": 0.1})["muon_lr"] == 0.1


def test_every_gpt_preset_has_its_modern_twin():
    from minitransformer.presets import GPT as PRESETS
    from minitransformer.presets import MODERN

    for name in ("debug", "cpu-small", "cpu-medium", "shakespeare-char", "gpt2-124m"):
        twin = PRESETS[f"{name}-modern"]
        assert {k: twin[k] for k in MODERN} == MODERN
        tuned = (*MODERN, "batch_size", "muon_lr")  # the 2- and 10-minute twins' own
        assert {k: v for k, v in twin.items() if k not in tuned} == \
            {k: v for k, v in PRESETS[name].items() if k not in tuned}


def test_the_one_line_description_names_qk_norm():
    """`sample --hf` and `export` describe the model in one line: a Qwen3's QK-norm was left
    out of its parts."""
    from minitransformer.interop.hf import describe

    sizes = dict(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    assert "qk-norm" not in describe(GPT(GPTConfig(**sizes)))
    assert describe(GPT(GPTConfig(**sizes, qk_norm=True))).startswith("GPT (learned, ")
    assert ", qk-norm): " in describe(GPT(GPTConfig(**sizes, qk_norm=True)))
