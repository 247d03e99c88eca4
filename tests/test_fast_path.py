"""The fast training path: bf16 autocast stays close to fp32; torch.compile falls back cleanly."""

from __future__ import annotations

import torch

from minitransformer import GPT, GPTConfig, TrainConfig
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training import device as device_mod
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
