"""Positional encodings against the papers' formulas, and what position does to attention."""

from __future__ import annotations

import math

import pytest
import torch

from minitransformer.nn import (
    ALiBi,
    Encoder,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
)

# ---- sinusoidal (Vaswani et al., section 3.5) --------------------------------------------


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_matches_paper_formula(d_model):
    pe = SinusoidalPositionalEncoding(d_model, max_len=60)
    table = pe(60)
    assert table.shape == (60, d_model)
    for pos in range(60):
        for dim in range(d_model):
            i = dim // 2  # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
            assert table[pos, dim].item() == pytest.approx(expected, abs=1e-6), (pos, dim)


def test_sinusoidal_offset_and_extension_past_table():
    pe = SinusoidalPositionalEncoding(8, max_len=10)
    far = pe(5, offset=20)  # past the table: extended on the fly
    for row, pos in enumerate(range(20, 25)):
        assert far[row, 0].item() == pytest.approx(math.sin(pos), abs=1e-6)
        assert far[row, 1].item() == pytest.approx(math.cos(pos), abs=1e-6)
    torch.testing.assert_close(pe(3, offset=4), pe(10)[4:7])


@pytest.mark.parametrize("k", [1, 5, 17])
def test_sinusoidal_shift_is_a_fixed_rotation(k):
    """PE(pos + k) = M_k PE(pos) with one block-diagonal M_k for every pos (section 3.5)."""
    d, n = 16, 100
    table = SinusoidalPositionalEncoding(d, max_len=n + k)(n + k).double()  # (T, C)
    m = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        omega = 1.0 / 10000 ** (2 * i / d)
        c, s = math.cos(k * omega), math.sin(k * omega)
        # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = c, s
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -s, c
    shifted = table[:n] @ m.T  # row pos: M_k PE(pos)
    torch.testing.assert_close(shifted, table[k:n + k], rtol=0, atol=1e-5)
    assert not torch.allclose(table[:n], table[k:n + k], atol=1e-2)  # M_k is no identity


# ---- RoPE (Su et al. 2021) ---------------------------------------------------------------


def _rotate_at(rope: RotaryEmbedding, x: torch.Tensor, pos: int) -> torch.Tensor:
    return rope(x.view(1, 1, 1, -1), offset=pos).view(-1)


def test_rope_score_depends_only_on_relative_position():
    hs = 8
    rope = RotaryEmbedding(hs, max_len=16)  # positions past 16 rebuild the tables
    q, k = torch.randn(hs), torch.randn(hs)
    score = {(i, j): float(_rotate_at(rope, q, i) @ _rotate_at(rope, k, j))
             for i in range(0, 40, 3) for j in range(0, 40, 3)}
    for (i, j), s in score.items():
        assert s == pytest.approx(score[(i - j, 0)] if i >= j else score[(0, j - i)],
                                  abs=1e-4), (i, j)
    distinct = {round(score[(d, 0)], 3) for d in range(0, 40, 3)}
    assert len(distinct) > 5  # the score does change with the distance
    assert float(_rotate_at(rope, q, 0) @ _rotate_at(rope, k, 0)) == pytest.approx(
        float(q @ k), abs=1e-5)  # position 0 is no rotation


def test_rope_equals_complex_rotation():
    """Channels (c, c + hs/2) as one complex number, multiplied by e^(i pos theta_c)."""
    hs, t = 8, 12
    x = torch.randn(2, 3, t, hs, dtype=torch.float64)
    theta = torch.tensor([10000 ** (-2 * c / hs) for c in range(hs // 2)], dtype=torch.float64)
    z = torch.complex(x[..., : hs // 2], x[..., hs // 2:])  # (B, nh, T, hs/2)
    pos = torch.arange(5, 5 + t, dtype=torch.float64)[:, None]
    rotated = z * torch.polar(torch.ones_like(pos * theta), pos * theta)
    expected = torch.cat([rotated.real, rotated.imag], dim=-1)
    got = RotaryEmbedding(hs)(x, offset=5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


# ---- ALiBi (Press et al. 2022) -----------------------------------------------------------


def test_alibi_slopes_power_of_two():
    expected = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(8).tolist() == pytest.approx(expected)
    assert alibi_slopes(4).tolist() == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256])


def test_alibi_slopes_not_a_power_of_two():
    # The paper's rule for 6 heads: the 4 slopes of 4 heads (2^-2, 2^-4, 2^-6, 2^-8), then
    # every other slope of 8 heads (2^-1, 2^-3, 2^-5, 2^-7), as many as are missing (two).
    expected = [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    assert alibi_slopes(6).tolist() == pytest.approx(expected)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBi(8)(5, 7, offset=2)  # queries at absolute positions 2..6, keys at 0..6
    for h in range(8):
        m = 2.0 ** -(h + 1)
        for i in range(5):
            for j in range(7):
                assert bias[h, i, j].item() == pytest.approx(-m * abs(i + 2 - j))


def test_alibi_inside_attention_scores():
    """Attention weights with ALiBi = softmax(q.k / sqrt(hs) - m |i - j|) over visible keys."""
    d, nh, t = 16, 4, 6
    mha = MultiHeadAttention(d, nh, causal=True, alibi=ALiBi(nh)).double().eval()
    x = torch.randn(1, t, d, dtype=torch.float64)
    with torch.no_grad():
        _, weights = mha(x, need_weights=True)
        q = mha.q_proj(x).view(1, t, nh, d // nh).transpose(1, 2)
        k = mha.k_proj(x).view(1, t, nh, d // nh).transpose(1, 2)
    slopes = [2.0 ** (-8 * (h + 1) / nh) for h in range(nh)]
    for h in range(nh):
        for i in range(t):
            scores = [float(q[0, h, i] @ k[0, h, j]) / math.sqrt(d // nh) - slopes[h] * (i - j)
                      for j in range(i + 1)]
            z = sum(math.exp(s) for s in scores)
            expected = [math.exp(s) / z for s in scores] + [0.0] * (t - i - 1)
            assert weights[0, h, i].tolist() == pytest.approx(expected, abs=1e-9)


# ---- permutation: attention alone does not know the order --------------------------------


def _encoder(pos_encoding: str) -> Encoder:
    return Encoder(2, 16, 4, 32, pos_encoding=pos_encoding).double().eval()


def test_encoder_without_positions_is_permutation_equivariant():
    enc = _encoder("none")
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    perm = torch.randperm(7)
    y, _ = enc(x)
    y_perm, _ = enc(x[:, perm])
    torch.testing.assert_close(y_perm, y[:, perm])


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal"])
def test_encoder_with_positions_is_not_permutation_equivariant(pos):
    enc = _encoder("none" if pos == "sinusoidal" else pos)
    add = SinusoidalPositionalEncoding(16)(7).double() if pos == "sinusoidal" else 0.0
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    y, _ = enc(x + add)
    y_perm, _ = enc(x[:, perm] + add)
    assert (y_perm - y[:, perm]).abs().max() > 1e-3
