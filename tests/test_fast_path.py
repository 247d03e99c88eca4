"""The fast training path: bf16 autocast stays close to fp32; attention "auto" takes the
faster kernel and computes the same thing; AdamW is fused; torch.compile falls back cleanly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitransformer import GPT, GPTConfig, TrainConfig
from minitransformer.nn import attention as attention_mod
from minitransformer.nn import causal_mask, scaled_dot_product_attention
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training import device as device_mod
from minitransformer.training.optim import make_optimizer
from minitransformer.training.trainer import LanguageModelTask, train


def small_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=4, n_embd=64, **kw))


def test_bf16_autocast_logits_are_close_to_fp32():
    for pos in ("learned", "rope", "alibi"):
        model = small_gpt(pos_encoding=pos).eval()
        idx = torch.randint(0, 40, (3, 32))
        with torch.no_grad():
            ref = model(idx)[0]
            with device_mod.autocast(torch.device("cpu"), torch.bfloat16):
                low = model(idx)[0].float()
        assert ref.dtype == torch.float32
        # bf16 keeps 8 bits of mantissa: logits agree to a few hundredths, argmax almost always
        assert (ref - low).abs().max() < 0.05, pos
        assert (ref.argmax(-1) == low.argmax(-1)).float().mean() > 0.95


def test_auto_attention_picks_the_explicit_formula_only_on_cpu_in_low_precision():
    q32 = torch.zeros(1, 1, 4, 8)
    pays = attention_mod.fused_kernel_pays
    assert pays(q32, 64)
    assert not pays(q32.bfloat16(), 64) and not pays(q32.half(), 256)
    assert pays(q32.bfloat16(), attention_mod.CPU_LOW_PRECISION_EXPLICIT_MAX_LEN + 1)


@pytest.mark.parametrize("pos", ["learned", "alibi"])
def test_auto_attention_in_bf16_never_calls_the_fused_kernel_and_matches_fp32(pos, monkeypatch):
    model = small_gpt(pos_encoding=pos)
    idx = torch.randint(0, 40, (3, 32))
    ref_logits, ref_loss = model(idx, idx)
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    def fused(*a, **k):
        raise AssertionError("the fused kernel was called")

    monkeypatch.setattr(F, "scaled_dot_product_attention", fused)
    with device_mod.autocast(torch.device("cpu"), torch.bfloat16):
        logits, loss = model(idx, idx)
    loss.backward()
    assert (logits.float() - ref_logits).abs().max() < 0.05
    assert abs(loss.item() - ref_loss.item()) < 0.01
    for name, p in model.named_parameters():  # every gradient points the same way
        if "k_proj.bias" in name:  # softmax ignores a shift shared by all keys: grad ~ 0
            continue
        cos = F.cosine_similarity(p.grad.flatten(), ref_grads[name].flatten(), dim=0)
        assert cos > 0.99, name


def test_softmax_runs_in_fp32_when_the_scores_are_bf16():
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    mask = causal_mask(16)
    out, w = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
    assert w.dtype == torch.float32 and out.dtype == torch.bfloat16
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 16), rtol=0, atol=1e-6)
    assert (w - ref_w).abs().max() < 0.03 and (out.float() - ref_out).abs().max() < 0.05


def test_adamw_is_fused_on_cpu():
    opt = make_optimizer(small_gpt(), 1e-3, 0.1, (0.9, 0.99), "cpu")
    assert opt.defaults["fused"] is True


def test_dtype_auto_picks_bf16_where_the_cpu_has_it(monkeypatch):
    cpu = torch.device("cpu")
    assert device_mod.pick_dtype("float32", cpu) == torch.float32
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(device_mod, "cpu_has_bf16", lambda native=native: native)
        assert device_mod.pick_dtype("auto", cpu) == expected
        assert device_mod.pick_dtype("bfloat16", cpu) == torch.bfloat16


def test_compile_that_raises_at_once_falls_back(monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    model = small_gpt()
    run, compiled = device_mod.maybe_compile(model, "on", torch.device("cpu"))
    assert run is model and not compiled
    assert "running eagerly" in capsys.readouterr().err


def test_compile_on_a_cpu_says_what_the_first_steps_cost(monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda model, **k: model)  # compiling is not tested
    run, compiled = device_mod.maybe_compile(small_gpt(), "on", torch.device("cpu"))
    assert compiled and "counts as training time" in capsys.readouterr().err
    assert device_mod.maybe_compile(small_gpt(), "auto", torch.device("cpu"))[1] is False
    assert capsys.readouterr().err == ""


def test_the_causal_mask_compiles_without_dynamos_cache_warning():
    """Dynamo warns once per process about an lru_cache it traces through; the mask skips
    its cache while compiling and is the same mask."""
    import warnings

    from minitransformer.nn.mask import causal_mask

    fn = torch.compile(lambda x: x.masked_fill(~causal_mask(3, 5, 2), 0.0), backend="eager",
                       fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fn(torch.ones(3, 5))
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    assert torch.equal(got, torch.ones(3, 5).tril(2))


class FailsWhenCalled(torch.nn.Module):
    """What a torch.compile'd model looks like when compilation breaks on the first call."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model

    def forward(self, *a, **k):
        raise RuntimeError("inductor: C++ compile failed")


def test_compile_that_fails_on_the_first_step_falls_back_to_eager(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch, "compile", lambda model, **k: FailsWhenCalled(model))
    tok = CharTokenizer.fit("abcdefgh ")
    ids = torch.tensor(tok.encode("abc defgh " * 300))
    model = small_gpt()
    model.lm_head.weight = model.tok_emb.weight = torch.nn.Parameter(torch.randn(9, 64) * 0.02)
    model.config.vocab_size = 9
    cfg = TrainConfig(batch_size=4, max_iters=6, eval_interval=3, eval_iters=1, log_interval=1,
                      sample_tokens=0, compile="on")
    result = train(model, tok, LanguageModelTask(ids[:2500], ids[2500:], 32), cfg, tmp_path,
                   {"family": "gpt", "model": vars(model.config)}, progress=False,
                   echo=lambda *a: None)
    assert result.step == 6
    assert "torch.compile failed" in capsys.readouterr().err
