"""GPT: causality, KV-cached decoding, parameter counts, config validation."""

from __future__ import annotations

import pytest
import torch

from minitransformer.config import GPTConfig, TrainConfig, split_fields
from minitransformer.errors import ConfigError, UserError
from minitransformer.models import GPT
from minitransformer.presets import GPT as GPT_PRESETS
from minitransformer.presets import get_preset

POS_ENCODINGS = ["sinusoidal", "learned", "rope", "alibi", "none"]


@pytest.mark.parametrize("pos", POS_ENCODINGS)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_future_tokens_never_change_past_logits(make_gpt, pos, impl):
    model = make_gpt(scale=0.3, pos_encoding=pos, attn_impl=impl)
    idx = torch.randint(0, 13, (2, 16))
    with torch.no_grad():
        base, _ = model(idx)
        for t in (0, 5, 14):
            changed = idx.clone()
            shift = torch.randint(1, 13, changed[:, t + 1:].shape)  # never 0 mod 13
            changed[:, t + 1:] = (changed[:, t + 1:] + shift) % 13  # surely different tokens
            logits, _ = model(changed)
            torch.testing.assert_close(logits[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-6)
            assert not torch.allclose(logits[:, t + 1:], base[:, t + 1:], atol=1e-3)


def test_loss_is_cross_entropy_of_logits(make_gpt):
    model = make_gpt()
    idx = torch.randint(0, 13, (2, 8))
    targets = torch.randint(0, 13, (2, 8))
    targets[0, :3] = -1  # ignored
    logits, loss = model(idx, targets)
    logp = torch.log_softmax(logits.double(), dim=-1)
    keep = targets != -1
    expected = -logp[keep].gather(-1, targets[keep][:, None]).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # A fresh GPT-2-initialised model is close to uniform: loss ~ ln(V).
    assert loss.item() == pytest.approx(torch.log(torch.tensor(13.0)).item(), abs=0.1)


def test_internals_shapes(make_gpt):
    model = make_gpt(pos_encoding="learned")
    logits, loss, internals = model(torch.randint(0, 13, (2, 6)), return_internals=True)
    assert logits.shape == (2, 6, 13) and loss is None
    assert len(internals.attentions) == 2 and internals.attentions[0].shape == (2, 2, 6, 6)
    assert len(internals.hidden_states) == 3
    assert internals.position_embeddings.shape == (6, 16)
    # The attention maps are causal: nothing above the diagonal.
    assert torch.all(internals.attentions[1].triu(1) == 0)


# ---- KV cache ---------------------------------------------------------------------------

def _last_logits_per_step(model, prompt, n, use_cache):
    """Greedy tokens and the logits each step's choice came from (hooked on lm_head)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[:, -1]))
    try:
        out = model.generate(prompt, n, temperature=0.0, use_cache=use_cache)
    finally:
        hook.remove()
    return out, torch.stack(seen, dim=1)


@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_kv_cache_generation_equals_recomputation(make_gpt, pos):
    model = make_gpt(scale=0.3, pos_encoding=pos)  # block_size 16
    prompt = torch.randint(0, 13, (2, 5))
    n = 30  # runs well past block_size: the window slides
    cached, logits_c = _last_logits_per_step(model, prompt, n, use_cache=True)
    plain, logits_p = _last_logits_per_step(model, prompt, n, use_cache=False)
    assert cached.shape == (2, 5 + n)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(logits_c, logits_p, rtol=0, atol=1e-5)
    assert len(set(cached[0].tolist())) > 2  # greedy text that actually varies


@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_incremental_forward_equals_full_forward(make_gpt, pos):
    model = make_gpt(scale=0.3, pos_encoding=pos)
    idx = torch.randint(0, 13, (1, 16))
    with torch.no_grad():
        full, _ = model(idx)
        cache = model.new_cache()
        steps = [model(idx[:, :4], cache=cache)[0]]
        steps += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(4, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def _caches_equal(a, b) -> bool:
    return all(torch.equal(x[0].k, y[0].k) and torch.equal(x[0].v, y[0].v)
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("pos", POS_ENCODINGS)
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_logits_to_keep_equals_the_last_positions_of_the_full_forward(make_gpt, pos,
                                                                      norm_position):
    """A prefill with logits_to_keep fills the same cache and gives the same last logits:
    the last block's queries start at the right position (RoPE, ALiBi, learned, the causal
    mask among several kept queries), its residuals add to the right positions."""
    extra = dict(qk_norm=True, n_kv_head=1, n_head=2) if pos == "rope" else {}
    model = make_gpt(scale=0.3, pos_encoding=pos, norm_position=norm_position,
                     **extra).double()
    idx = torch.randint(0, 13, (2, 14))
    with torch.no_grad():
        full, _ = model(idx)  # (2, 14, V)
        kept, _ = model(idx, logits_to_keep=3)
        assert kept.shape == (2, 3, 13)
        torch.testing.assert_close(kept, full[:, -3:], rtol=0, atol=1e-12)
        whole, cut = model.new_cache(), model.new_cache()
        a = [model(idx[:, :6], cache=whole)[0], model(idx[:, 6:10], cache=whole)[0]]
        b = [model(idx[:, :6], cache=cut, logits_to_keep=1)[0],
             model(idx[:, 6:10], cache=cut, logits_to_keep=2)[0]]
        assert _caches_equal(whole, cut)
        a.append(model(idx[:, 10:11], cache=whole)[0])
        b.append(model(idx[:, 10:11], cache=cut)[0])
    torch.testing.assert_close(b[0], a[0][:, -1:], rtol=0, atol=1e-12)
    torch.testing.assert_close(b[1], a[1][:, -2:], rtol=0, atol=1e-12)
    torch.testing.assert_close(b[2], a[2], rtol=0, atol=1e-12)
    torch.testing.assert_close(a[2], full[:, 10:11], rtol=0, atol=1e-10)


def test_logits_to_keep_in_a_left_padded_batch(make_gpt):
    """Per-row positions and the padding mask are cut to the kept queries too."""
    model = make_gpt(scale=0.3, pos_encoding="rope").double()
    idx = torch.randint(1, 13, (2, 9))
    pad = torch.tensor([0, 4])
    with torch.no_grad():
        full, _ = model(idx, cache=model.new_cache(), pad=pad)
        kept, _ = model(idx, cache=model.new_cache(), pad=pad, logits_to_keep=2)
        alone, _ = model(idx[1:, 4:])  # row 1 without its padding
    torch.testing.assert_close(kept, full[:, -2:], rtol=0, atol=1e-12)
    torch.testing.assert_close(kept[1], alone[0, -2:], rtol=0, atol=1e-10)


def test_logits_to_keep_refuses_a_loss_and_negative_counts(make_gpt):
    model = make_gpt()
    idx = torch.randint(0, 13, (1, 8))
    with pytest.raises(ValueError, match="every position"):
        model(idx, idx, logits_to_keep=1)
    with pytest.raises(ValueError, match=">= 0"):
        model(idx, logits_to_keep=-1)
    logits, _, internals = model(idx, return_internals=True, logits_to_keep=1)
    assert logits.shape == (1, 1, 13) and internals.hidden_states[-1].shape == (1, 1, 16)
    assert [w.shape[-2] for w in internals.attentions] == [8, 1]  # the last block's queries


def test_learned_positions_refuse_longer_input(make_gpt):
    model = make_gpt(pos_encoding="learned")
    with pytest.raises(ValueError, match="learned"):
        model(torch.zeros(1, 17, dtype=torch.long))


# ---- sizes ------------------------------------------------------------------------------

def test_gpt2_124m_parameter_count():
    model_fields, _ = split_fields(get_preset(GPT_PRESETS, "gpt2-124m"), GPTConfig, TrainConfig)
    cfg = GPTConfig(**model_fields)
    assert (cfg.vocab_size, cfg.tie_weights) == (50257, True)
    with torch.device("meta"):
        model = GPT(cfg)
    # Independent count from the GPT-2 architecture: token + position tables, per layer
    # 4 C^2 + 4 C (attention) + 8 C^2 + 5 C (MLP) + 4 C (two LayerNorms), final LayerNorm.
    v, t, c, n = 50257, 1024, 768, 12
    by_hand = v * c + t * c + n * (12 * c * c + 13 * c) + 2 * c
    assert by_hand == 124_439_808
    assert model.num_params() == 124_439_808
    assert model.lm_head.weight is model.tok_emb.weight


def test_untied_head_counts_its_own_matrix(make_gpt):
    tied, untied = make_gpt(), make_gpt(tie_weights=False)
    assert untied.num_params() - tied.num_params() == 13 * 16


def test_every_preset_builds_a_valid_config():
    for name in GPT_PRESETS:
        model_fields, _ = split_fields(get_preset(GPT_PRESETS, name), GPTConfig, TrainConfig)
        GPTConfig(**model_fields)


# ---- config errors ----------------------------------------------------------------------

def test_n_embd_not_divisible_by_n_head():
    with pytest.raises(ConfigError, match=r"n_embd \(30\) must be divisible by n_head \(4\)"):
        GPTConfig(n_embd=30, n_head=4)


@pytest.mark.parametrize("field", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                                   "d_ff"])
@pytest.mark.parametrize("value", [0, -3])
def test_sizes_must_be_positive(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be positive") as err:
        GPTConfig(**{field: value})
    assert str(value) in str(err.value)
    assert isinstance(err.value, UserError)


def test_unknown_choice_and_bad_dropout():
    with pytest.raises(ConfigError, match="pos_encoding must be one of"):
        GPTConfig(pos_encoding="relative")
    with pytest.raises(ConfigError, match="dropout"):
        GPTConfig(dropout=1.0)
    with pytest.raises(ConfigError, match="rope needs an even head size"):
        GPTConfig(n_embd=12, n_head=4, pos_encoding="rope")
