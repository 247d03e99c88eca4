"""Generation past the context window: the exact sliding window, the context shift, rolling.

References are written out here without the KV cache: nanoGPT's loop (crop to the last
block_size tokens every step) and "crop to the last block_size - shift tokens when the text
outgrows the window, then extend" (llama.cpp's context shift).
"""

from __future__ import annotations

import pytest
import torch

from minitransformer.config import GPTConfig
from minitransformer.data.text import load_text
from minitransformer.models import GPT
from minitransformer.models.generation import default_context_shift, roll_cache, window_start
from minitransformer.nn.kv_cache import KVCache
from minitransformer.nn.positional import RotaryEmbedding

POS_ENCODINGS = ["learned", "sinusoidal", "rope", "alibi", "none"]


@torch.no_grad()
def shifted_reference(model, idx: torch.Tensor, n: int, shift: int, keep: int = 0):
    """Greedy, no cache: keep a window; when it outgrows block_size, keep only its last
    block_size - shift tokens (with ``keep``: the text's first ``keep`` tokens, then the last
    block_size - keep - shift); the model sees the whole window every step. shift 0 is
    nanoGPT's loop (``idx[:, -block_size:]`` every step). Returns (tokens (B, T + n),
    the logits each choice came from (B, n, V))."""
    block = model.config.block_size
    window, out, seen = idx, idx, []
    for _ in range(n):
        if window.shape[1] > block:
            window = torch.cat([out[:, :keep], window[:, -(block - keep - shift):]], dim=1)
        logits, _ = model(window)  # (B, T, V)
        seen.append(logits[:, -1])
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        window, out = torch.cat([window, nxt], dim=1), torch.cat([out, nxt], dim=1)
    return out, torch.stack(seen, dim=1)


def generate_with_logits(model, prompt: torch.Tensor, n: int, **kw):
    """``GPT.generate`` greedy, and the last-position logits of each step (hooked)."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out[:, -1]))
    try:
        out = model.generate(prompt, n, temperature=0.0, **kw)
    finally:
        hook.remove()
    return out, torch.stack(seen, dim=1)


def _fp64(model):
    return model.double()  # no last-bit ties between the cached and the full forward


def assert_same_run(got, want):
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-9)


@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_exact_mode_equals_recomputing_the_window_every_token(make_gpt, pos):
    model = _fp64(make_gpt(scale=0.3, pos_encoding=pos))  # block_size 16
    prompt = torch.randint(0, 13, (2, 3))
    n = 40  # 2.5 windows past block_size
    want = shifted_reference(model, prompt, n, 0)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=0), want)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=0, use_cache=False),
                    want)


@pytest.mark.parametrize("pos", POS_ENCODINGS)
@pytest.mark.parametrize("shift", [None, 1, 5, 15])
def test_context_shift_equals_crop_then_extend(make_gpt, pos, shift):
    model = _fp64(make_gpt(scale=0.3, pos_encoding=pos))
    prompt = torch.randint(0, 13, (2, 3))
    n = 50
    s = default_context_shift(16) if shift is None else shift
    want = shifted_reference(model, prompt, n, s)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=shift), want)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=shift,
                                         use_cache=False), want)


def test_default_shift_is_a_quarter_of_the_window_and_changes_what_the_model_sees(make_gpt):
    model = _fp64(make_gpt(scale=0.3, pos_encoding="learned"))
    prompt = torch.randint(0, 13, (1, 3))
    assert default_context_shift(16) == 4 and default_context_shift(256) == 64
    shifted = generate_with_logits(model, prompt, 60)
    assert_same_run(shifted, shifted_reference(model, prompt, 60, 4))
    exact = shifted_reference(model, prompt, 60, 0)
    # Inside the window nothing changes; past it the model sees other windows.
    torch.testing.assert_close(shifted[1][:, :14], exact[1][:, :14], rtol=0, atol=1e-9)
    assert (shifted[1][:, 14:] - exact[1][:, 14:]).abs().max() > 1e-3


def test_a_prompt_longer_than_the_window_is_cropped_by_the_same_rule(make_gpt):
    model = _fp64(make_gpt(scale=0.3, pos_encoding="rope"))
    prompt = torch.randint(0, 13, (1, 23))  # block_size 16
    for shift in (0, 4):
        assert_same_run(generate_with_logits(model, prompt, 20, context_shift=shift),
                        shifted_reference(model, prompt, 20, shift))


@pytest.mark.parametrize("pos", POS_ENCODINGS)
@pytest.mark.parametrize("shift, keep", [(0, 1), (None, 1), (5, 3), (1, 14)])
def test_context_keep_holds_the_first_tokens_in_every_window(make_gpt, pos, shift, keep):
    model = _fp64(make_gpt(scale=0.3, pos_encoding=pos))  # block_size 16
    prompt = torch.randint(0, 13, (2, 4))
    n = 45
    s = default_context_shift(16) if shift is None else shift
    want = shifted_reference(model, prompt, n, s, keep)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=shift,
                                         context_keep=keep), want)
    assert_same_run(generate_with_logits(model, prompt, n, context_shift=shift,
                                         context_keep=keep, use_cache=False), want)
    if keep == 1:  # and it changes what the model sees past the window
        dropped = shifted_reference(model, prompt, n, s)[1]
        assert (want[1][:, 13:] - dropped[:, 13:]).abs().max() > 1e-3


def test_window_start_with_kept_tokens_by_hand():
    # block_size 8, 2 kept, shift 2: a window of 9 restarts as the 2 kept + the last 4
    assert window_start(8, 2, 8, 2, keep=2) == 2  # 2 + 6 tokens: full, not past
    assert window_start(9, 2, 8, 2, keep=2) == 5  # text[:2] + text[5:9]: 6 tokens
    assert window_start(11, 5, 8, 2, keep=2) == 5  # 2 + 6: full again
    assert window_start(12, 5, 8, 0, keep=2) == 6  # exact: 2 + the last 6
    assert window_start(1, 2, 8, 2, keep=2) == 2  # a text shorter than the kept part


@pytest.mark.parametrize("shift, keep, words", [(None, 16, "context keep must be in 0 .. 15"),
                                                (12, 4, "context shift must be in 0 .. 11"),
                                                (0, -1, "context keep must be in 0 .. 15")])
def test_context_keep_out_of_range_is_refused(make_gpt, shift, keep, words):
    model = make_gpt()
    with pytest.raises(ValueError, match=words):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 3, context_shift=shift,
                       context_keep=keep)


@pytest.mark.parametrize("shift", [-1, 16, 99])
def test_context_shift_out_of_range_is_refused(make_gpt, shift):
    model = make_gpt()
    with pytest.raises(ValueError, match="context shift must be in 0 .. 15"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 3, context_shift=shift)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_rolling_is_refused_for_absolute_positions(make_gpt, pos):
    model = make_gpt(pos_encoding=pos)
    with pytest.raises(ValueError, match="rolling the cache needs relative positions"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 3, context_mode="roll")


# ---- the cache operations behind rolling -------------------------------------------------

def test_rope_rotate_by_moves_a_key_to_another_position():
    rope = RotaryEmbedding(8, max_len=64)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    at_20 = rope(x, offset=20)  # positions 20 .. 24
    torch.testing.assert_close(rope.rotate_by(at_20, -7), rope(x, offset=13), rtol=0,
                               atol=1e-6)
    torch.testing.assert_close(rope.rotate_by(rope(x), 3), rope(x, offset=3), rtol=0,
                               atol=1e-6)


def test_kv_cache_drop_front_keeps_the_newest_entries():
    cache = KVCache()
    k, v = torch.randn(1, 2, 70, 4), torch.randn(1, 2, 70, 4)  # past the first capacity (64)
    cache.update(k[:, :, :40], v[:, :, :40])
    cache.update(k[:, :, 40:], v[:, :, 40:])
    cache.drop_front(25)
    assert cache.length == 45
    assert torch.equal(cache.k, k[:, :, 25:]) and torch.equal(cache.v, v[:, :, 25:])
    cache.update(k[:, :, :1], v[:, :, :1])  # appends after the kept entries
    assert torch.equal(cache.k[:, :, -1], k[:, :, 0]) and cache.length == 46
    cache.drop_front(99)
    assert cache.length == 0


def test_kv_cache_drop_front_after_the_kept_entries():
    cache = KVCache()
    k, v = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    cache.update(k, v)
    cache.drop_front(3, rekey=lambda x: -x, after=2)  # positions 2, 3, 4 go
    assert cache.length == 7
    assert torch.equal(cache.k[:, :, :2], k[:, :, :2])  # the kept ones, as they were
    assert torch.equal(cache.k[:, :, 2:], -k[:, :, 5:])  # the moved ones, re-keyed
    assert torch.equal(cache.v, torch.cat([v[:, :, :2], v[:, :, 5:]], dim=2))
    cache.drop_front(9, after=2)
    assert cache.length == 2 and torch.equal(cache.k, k[:, :, :2])


def _roll_by_hand(model, idx: torch.Tensor, n: int, shift: int, keep: int = 0) -> torch.Tensor:
    """Greedy with a cache that drops its oldest ``shift`` entries after the first ``keep``
    when full (RoPE keys re-rotated), written with the layers' own cache operations."""
    block = model.config.block_size
    cache = model.new_cache()
    logits, _ = model(idx, cache=cache)
    for _ in range(n):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
        if cache[0][0].length == block:  # keep the last block - shift tokens, with the new one
            for layer, (self_cache, _) in zip(model.decoder.layers, cache, strict=True):
                rope = layer.self_attn.rope
                self_cache.drop_front(shift + 1, None if rope is None else
                                      (lambda k, rope=rope: rope.rotate_by(k, -(shift + 1))),
                                      after=keep)
        logits, _ = model(nxt, cache=cache)
    return idx


@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
@pytest.mark.parametrize("keep", [0, 2])
def test_roll_mode_drops_the_oldest_entries_and_keeps_the_rest(make_gpt, pos, keep):
    model = _fp64(make_gpt(scale=0.3, pos_encoding=pos))
    prompt = torch.randint(0, 13, (2, 3))
    with torch.no_grad():
        want = _roll_by_hand(model, prompt, 40, 4, keep)
    got = model.generate(prompt, 40, temperature=0.0, context_shift=4, context_mode="roll",
                         context_keep=keep)
    assert torch.equal(got, want)


# ---- rolling against recomputing, on trained models ----------------------------------------

@pytest.fixture(scope="module")
def shakespeare_ids() -> torch.Tensor:
    text = load_text("shakespeare")[:300_000]
    vocab = {ch: i for i, ch in enumerate(sorted(set(text)))}
    return torch.tensor([vocab[ch] for ch in text])


def _train_debug(ids: torch.Tensor, pos: str, steps: int = 200) -> GPT:
    """A debug-preset-sized GPT (2 layers x 64, block_size 32) trained briefly on the first
    90% of ``ids``."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=int(ids.max()) + 1, n_layer=2, n_head=2, n_embd=64,
                          block_size=32, dropout=0.0, pos_encoding=pos))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    train = ids[: int(0.9 * len(ids))]
    for _ in range(steps):
        starts = torch.randint(0, len(train) - 33, (16,), generator=g).tolist()
        x = torch.stack([train[s:s + 32] for s in starts])  # (16, 32)
        y = torch.stack([train[s + 1:s + 33] for s in starts])  # (16, 32)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def _read(model, text: torch.Tensor, shift: int, mode: str) -> torch.Tensor:
    """Next-token distributions (T, V) while reading ``text`` (T,): "recompute" runs the
    whole window (the crop rule above) without a cache, "roll" keeps one cache and drops its
    oldest entries when it is full."""
    block, probs = model.config.block_size, []
    window, cache = text[:0], model.new_cache()
    for t in range(len(text)):
        if mode == "recompute":
            window = torch.cat([window, text[t:t + 1]])
            if len(window) > block:
                window = window[-(block - shift):]
            logits, _ = model(window[None])  # (1, T, V)
        else:
            if cache[0][0].length == block:  # the same window: the last block - shift tokens
                roll_cache(model, cache, shift + 1)
            logits, _ = model(text[None, t:t + 1], cache=cache)  # (1, 1, V)
        probs.append(logits[0, -1].double().softmax(-1))
    return torch.stack(probs)  # (T, V)


# The stated tolerance of rolling: the total variation distance between its next-token
# distribution and re-prefilling's, per step after the window first moves. Measured on these
# models (2 x 64, block_size 32, 200 steps, shift 8, 320 held-out characters): rope mean
# 0.006, max 0.058, the same argmax at 99.7% of steps; alibi mean 0.020, max 0.106, 95.9%.
ROLL_TOLERANCE = {"mean_tv": 0.05, "max_tv": 0.3}


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_rolling_stays_close_to_recomputing_on_a_trained_model(shakespeare_ids, pos):
    model = _train_debug(shakespeare_ids, pos)
    text = shakespeare_ids[-320:]  # held-out text, 10 windows long
    shift = 8
    roll = _read(model, text, shift, "roll")
    recompute = _read(model, text, shift, "recompute")
    tv = 0.5 * (roll - recompute).abs().sum(-1)  # (T,) total variation distance per step
    assert torch.all(tv[:32] < 1e-5)  # identical until the window first moves
    assert tv[32:].mean() < ROLL_TOLERANCE["mean_tv"]
    assert tv[32:].max() < ROLL_TOLERANCE["max_tv"]
