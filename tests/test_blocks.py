"""Blocks: residual + LayerNorm placement by hand, and equality with PyTorch's own layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer.nn import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    FeedForward,
    causal_mask,
    padding_mask,
)

D, NH, FF = 16, 4, 32


def _randomise_norms(module: nn.Module) -> None:
    """LayerNorms start at (1, 0); give them other values so a swapped norm shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)


def test_feedforward_formula():
    ffn = FeedForward(D, FF, "relu").double()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    expected = torch.relu(x @ ffn.fc.weight.T + ffn.fc.bias) @ ffn.proj.weight.T + ffn.proj.bias
    torch.testing.assert_close(ffn(x), expected)
    gelu = FeedForward(D, FF, "gelu_tanh").double()
    h = x @ gelu.fc.weight.T + gelu.fc.bias
    tanh_gelu = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    torch.testing.assert_close(gelu(x), tanh_gelu @ gelu.proj.weight.T + gelu.proj.bias)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_block_norm_placement(norm):
    block = EncoderBlock(D, NH, FF, dropout=0.0, norm_position=norm).double().eval()
    _randomise_norms(block)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    mask = padding_mask(torch.tensor([5, 3]), 5)
    ln1, ln2 = block.res_attn.norm, block.res_ffn.norm

    def attn(h):
        return block.attn(h, mask=mask)[0]

    if norm == "pre":  # x + F(LN(x))
        h = x + attn(ln1(x))
        expected = h + block.ffn(ln2(h))
    else:  # LN(x + F(x))
        h = ln1(x + attn(x))
        expected = ln2(h + block.ffn(h))
    got, _ = block(x, mask)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_block_norm_placement_with_cross_attention(norm):
    block = DecoderBlock(D, NH, FF, dropout=0.0, norm_position=norm).double().eval()
    _randomise_norms(block)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    memory = torch.randn(2, 6, D, dtype=torch.float64)
    memory_mask = padding_mask(torch.tensor([6, 2]), 6)
    ln1, ln2, ln3 = block.res_self.norm, block.res_cross.norm, block.res_ffn.norm

    def self_attn(h):
        return block.self_attn(h)[0]  # causal by construction

    def cross_attn(h):
        return block.cross_attn(h, context=memory, mask=memory_mask)[0]

    if norm == "pre":
        h = x + self_attn(ln1(x))
        h = h + cross_attn(ln2(h))
        expected = h + block.ffn(ln3(h))
    else:
        h = ln1(x + self_attn(x))
        h = ln2(h + cross_attn(h))
        expected = ln3(h + block.ffn(h))
    got, w_self, w_cross = block(x, memory, memory_mask=memory_mask)
    assert w_self is None and w_cross is None
    torch.testing.assert_close(got, expected)


def test_pre_and_post_differ():
    pre = EncoderBlock(D, NH, FF, norm_position="pre").double().eval()
    post = EncoderBlock(D, NH, FF, norm_position="post").double().eval()
    post.load_state_dict(pre.state_dict())
    x = torch.randn(1, 4, D, dtype=torch.float64)
    assert not torch.allclose(pre(x)[0], post(x)[0], atol=1e-3)


# ---- equality with torch.nn.TransformerEncoderLayer / TransformerDecoderLayer ------------

def _copy_attention(ours, theirs) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight,
                                           ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_linear_norm(ours, theirs) -> None:
    theirs.weight.copy_(ours.weight)
    theirs.bias.copy_(ours.bias)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_block_equals_torch_layer(norm):
    ours = EncoderBlock(D, NH, FF, norm_position=norm, activation="relu").double().eval()
    _randomise_norms(ours)
    theirs = nn.TransformerEncoderLayer(D, NH, FF, dropout=0.0, activation=F.relu,
                                        batch_first=True, norm_first=norm == "pre")
    theirs = theirs.double().eval()
    with torch.no_grad():
        _copy_attention(ours.attn, theirs.self_attn)
        _copy_linear_norm(ours.ffn.fc, theirs.linear1)
        _copy_linear_norm(ours.ffn.proj, theirs.linear2)
        _copy_linear_norm(ours.res_attn.norm, theirs.norm1)
        _copy_linear_norm(ours.res_ffn.norm, theirs.norm2)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    keep = padding_mask(torch.tensor([5, 3]), 5)
    expected = theirs(x, src_key_padding_mask=~keep[:, 0, 0, :])
    got, _ = ours(x, keep)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :3], expected[1, :3])  # torch may zero padded rows


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_block_equals_torch_layer(norm):
    ours = DecoderBlock(D, NH, FF, norm_position=norm, activation="relu").double().eval()
    _randomise_norms(ours)
    theirs = nn.TransformerDecoderLayer(D, NH, FF, dropout=0.0, activation=F.relu,
                                        batch_first=True, norm_first=norm == "pre")
    theirs = theirs.double().eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        _copy_linear_norm(ours.ffn.fc, theirs.linear1)
        _copy_linear_norm(ours.ffn.proj, theirs.linear2)
        _copy_linear_norm(ours.res_self.norm, theirs.norm1)
        _copy_linear_norm(ours.res_cross.norm, theirs.norm2)
        _copy_linear_norm(ours.res_ffn.norm, theirs.norm3)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    memory = torch.randn(2, 6, D, dtype=torch.float64)
    keep = padding_mask(torch.tensor([6, 2]), 6)
    expected = theirs(x, memory, tgt_mask=~causal_mask(4),
                      memory_key_padding_mask=~keep[:, 0, 0, :])
    got, _, _ = ours(x, memory, memory_mask=keep)
    torch.testing.assert_close(got, expected)


# ---- stacks -----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_stack_chains_blocks_and_reports_internals(norm):
    enc = Encoder(3, D, NH, FF, norm_position=norm).double().eval()
    _randomise_norms(enc)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    y, internals = enc(x, need_weights=True)
    h = x
    for layer in enc.layers:
        h, _ = layer(h)
    expected = enc.final_norm(h) if norm == "pre" else h
    assert isinstance(enc.final_norm, nn.LayerNorm if norm == "pre" else nn.Identity)
    torch.testing.assert_close(y, expected)
    assert len(internals.hidden_states) == 4 and len(internals.attentions) == 3
    assert internals.attentions[0].shape == (2, NH, 5, 5)
    torch.testing.assert_close(internals.attentions[0].sum(-1), torch.ones(2, NH, 5,
                                                                           dtype=torch.float64))


def test_decoder_stack_kv_cache_equals_full_pass():
    dec = Decoder(2, D, NH, FF, norm_position="pre", pos_encoding="rope").double().eval()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    memory = torch.randn(2, 5, D, dtype=torch.float64)
    full, internals = dec(x, memory, need_weights=True)
    assert len(internals.cross_attentions) == 2
    assert internals.cross_attentions[0].shape == (2, NH, 7, 5)
    cache = dec.new_cache()
    steps = [dec(x[:, :3], memory, cache=cache)[0]]
    for t in range(3, 7):  # the cross-attention cache is filled once, memory no longer needed
        steps.append(dec(x[:, t:t + 1], None, cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_decoder_block_needs_memory():
    block = DecoderBlock(D, NH, FF)
    with pytest.raises(ValueError, match="memory"):
        block(torch.randn(1, 3, D))
