"""The forward pass of a checkpoint on one text, every intermediate tensor laid out by step.

The model is run once with ``return_internals=True``; its ``Internals`` give the embeddings,
each block's input and output and the attention weights. The in-between values that
``Internals`` does not carry (Q, K, V of each head, the scores before the softmax, the
feed-forward's hidden layer) are recomputed from each block's input with the block's own
submodules and weights, then checked against what the model itself returned, so what the
walkthrough shows is the real forward pass, never an approximation of it.

Shapes: T time (tokens of the text), C channels (n_embd), nh heads, hs head size, F FFN width,
V vocabulary size. Batch size is always 1 here and dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..nn.mask import causal_mask

VISIBLE = {"\n": "⏎", " ": "␣", "\t": "→", "\r": "␍"}


def show_token(text: str) -> str:
    """A token as a label: whitespace made visible (space ␣, newline ⏎), empty as ∅."""
    if text == "":
        return "∅"
    return "".join(VISIBLE.get(ch, ch) for ch in text)


def bytes_label(data: bytes) -> str:
    """What a token's bytes stand for: whole UTF-8 characters as themselves, every byte that
    is only part of a character as a ``<0xE4>``-style marker (never mojibake such as ``ä»``)."""
    out, i = [], 0
    while i < len(data):
        lead = data[i]
        n = 1 if lead < 0x80 else 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 \
            else 4 if 0xF0 <= lead < 0xF5 else 0
        try:
            out.append(data[i:i + n].decode("utf-8") if n else None)
        except UnicodeDecodeError:
            out.append(None)
        if out[-1] is None:
            out[-1], n = f"<0x{lead:02X}>", 1
        i += n
    return "".join(out)


def _label(tokenizer, i: int) -> str:
    data = tokenizer.token_bytes(i) if hasattr(tokenizer, "token_bytes") else None
    if data is not None:  # a BPE piece: show the text its bytes hold
        return show_token(bytes_label(data))
    decoded = tokenizer.decode([i])
    raw = tokenizer.id_to_token(i) if hasattr(tokenizer, "id_to_token") else None
    if raw is not None:
        spaced = raw.replace("\u2581", " ")  # SentencePiece's visible space
        # The vocabulary entry keeps the word-initial space that decoding one token drops.
        if not decoded or "\ufffd" in decoded or spaced.strip() == decoded.strip():
            return show_token(spaced)
    return show_token(decoded)


def token_labels(tokenizer, ids, special: dict[int, str] | None = None) -> list[str]:
    """One printable label per token id; ``special`` names ids such as <s> and </s>."""
    special = special or {}
    return [special[int(i)] if int(i) in special else _label(tokenizer, int(i)) for i in ids]


def encode_text(tokenizer, text: str, max_len: int, what: str = "text",
                prompt: bool = False) -> list[int]:
    """Token ids of ``text``, refusing empty text and text longer than the model's context.
    ``prompt``: as a decoder-only model reads a prompt (Llama's <s> first; see
    tokenizers/specials.py)."""
    if not text:
        raise UserError(f"the {what} is empty: give at least one character")
    # raises UnknownCharactersError (a UserError)
    ids = tokenizer.encode_prompt(text) if prompt else tokenizer.encode(text)
    if not ids:
        raise UserError(f"the {what} encodes to no tokens")
    if len(ids) > max_len:
        raise UserError(f"the {what} is {len(ids)} tokens long; this model reads at most "
                        f"{max_len} (its block_size): shorten it")
    return ids


@dataclass
class AttentionTrace:
    """One attention sublayer of one block, all heads. x is the sublayer's input (T, C)."""

    x: torch.Tensor  # (T, C) the residual stream entering the sublayer
    h: torch.Tensor  # (T, C) what the projections read: LN(x) (pre-LN) or x (post-LN)
    q_raw: torch.Tensor  # (nh, T, hs) h W^Q before RoPE
    k_raw: torch.Tensor  # (nh, T, hs)
    q: torch.Tensor  # (nh, T, hs) after RoPE (= q_raw otherwise)
    k: torch.Tensor  # (nh, T, hs)
    v: torch.Tensor  # (nh, T, hs)
    scores: torch.Tensor  # (nh, T, T) Q K^T / sqrt(d_k), plus the ALiBi bias if any
    bias: torch.Tensor | None  # (nh, T, T) ALiBi's -m |i - j|, or None
    mask: torch.Tensor | None  # (T, T) True = may attend, or None
    masked: torch.Tensor  # (nh, T, T) scores with -inf where the mask forbids
    weights: torch.Tensor  # (nh, T, T) softmax: the model's own attention weights
    head_out: torch.Tensor  # (nh, T, hs) weights @ V
    concat: torch.Tensor  # (T, C) heads side by side
    out: torch.Tensor  # (T, C) concat W^O
    residual: torch.Tensor  # (T, C) x + out
    after: torch.Tensor  # (T, C) the stream after the sublayer: residual (pre) or LN(residual)


@dataclass
class FFNTrace:
    """One feed-forward sublayer: x is its input stream (T, C)."""

    x: torch.Tensor  # (T, C)
    h: torch.Tensor  # (T, C) LN(x) (pre-LN) or x (post-LN)
    pre_act: torch.Tensor  # (T, F) h W1 + b1
    hidden: torch.Tensor  # (T, F) act(h W1 + b1)
    out: torch.Tensor  # (T, C) hidden W2 + b2
    residual: torch.Tensor  # (T, C) x + out
    after: torch.Tensor  # (T, C) the block's output


@dataclass
class LayerTrace:
    attn: AttentionTrace
    ffn: FFNTrace


@dataclass
class ForwardTrace:
    """Everything the walkthrough shows for one text through one decoder-only model."""

    text: str
    ids: list[int]
    tokens: list[str]
    norm_position: str
    pos_encoding: str
    activation: str
    tok_emb: torch.Tensor  # (T, C) E = W_emb[ids], the table's rows before any scale
    pos_emb: torch.Tensor | None  # (T, C) for sinusoidal / learned, else None
    x0: torch.Tensor  # (T, C) the first block's input: E * embed_scale (+ positions)
    embed_scale: float = 1.0  # sqrt(C) when the model scales token embeddings (the paper)
    layers: list[LayerTrace] = field(default_factory=list)
    final: torch.Tensor | None = None  # (T, C) after the final norm (pre-LN) or as is
    logits: torch.Tensor | None = None  # (T, V) the model's own logits
    rope_angles: torch.Tensor | None = None  # (T, hs/2) rotation angle of each pair (rope)
    alibi_slopes: torch.Tensor | None = None  # (nh,) (alibi)

    def top_k(self, tokenizer, k: int = 10, position: int = -1):
        """[(id, label, probability)] of the k likeliest next tokens after ``position``."""
        probs = torch.softmax(self.logits[position].double(), dim=-1)  # (V,)
        p, i = probs.topk(min(k, probs.numel()))
        return [(int(a), token_labels(tokenizer, [int(a)])[0], float(b))
                for a, b in zip(i, p, strict=True)]


def _check(name: str, ours: torch.Tensor, theirs: torch.Tensor, atol: float = 1e-4) -> None:
    if not torch.allclose(ours, theirs, atol=atol, rtol=1e-4):
        err = (ours - theirs).abs().max().item()
        raise RuntimeError(f"walkthrough recomputation of {name} differs from the model's "
                           f"own value by {err:.3g}")


def trace_attention(attn, residual, x: torch.Tensor, weights: torch.Tensor,
                    causal: bool) -> AttentionTrace:
    """Recompute one self-attention sublayer step by step from its input x (T, C).

    ``attn`` is the block's MultiHeadAttention, ``residual`` its Residual wrapper;
    ``weights`` (nh, T, T) are the model's own attention weights, which the recomputation
    must reproduce.
    """
    t = x.shape[0]
    h = residual.norm(x) if residual.pre else x  # (T, C)
    q_raw = attn.queries(h[None], offset=0, rotate=False)[0]  # (nh, T, hs), QK-normed if set
    k_raw, v = attn.keys_values(h[None], offset=0, rotate=False)  # (1, nkv, T, hs) each
    # grouped-query attention: each key/value head shown once per query head it serves
    k_raw, v = attn.expand_kv(k_raw)[0], attn.expand_kv(v)[0]  # (nh, T, hs)
    q = attn.rope(q_raw[None])[0] if attn.rope is not None else q_raw  # (nh, T, hs)
    k = attn.rope(k_raw[None])[0] if attn.rope is not None else k_raw  # (nh, T, hs)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (nh, T, T)
    bias = attn.alibi(t, t).to(scores.dtype) if attn.alibi is not None else None
    if bias is not None:
        scores = scores + bias  # (nh, T, T)
    mask = causal_mask(t, device=x.device) if causal else None  # (T, T)
    masked = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    _check("the attention weights", torch.softmax(masked, dim=-1), weights, atol=1e-5)
    head_out = weights @ v  # (nh, T, hs)
    concat = head_out.transpose(0, 1).reshape(t, -1)  # (T, C)
    out = attn.out_proj(concat)  # (T, C)
    res = x + out  # (T, C)
    after = res if residual.pre else residual.norm(res)  # (T, C)
    return AttentionTrace(x, h, q_raw, k_raw, q, k, v, scores, bias, mask, masked, weights,
                          head_out, concat, out, res, after)


def trace_ffn(ffn, residual, x: torch.Tensor) -> FFNTrace:
    """Recompute one feed-forward sublayer from its input stream x (T, C)."""
    h = residual.norm(x) if residual.pre else x  # (T, C)
    pre_act = ffn.fc(h)  # (T, F)
    gate = getattr(ffn, "gate", None)  # SwiGLU: hidden = SiLU(h W_gate) * (h W1)
    hidden = F.silu(gate(h)) * pre_act if gate is not None else ffn.act(pre_act)  # (T, F)
    out = ffn.proj(hidden)  # (T, C)
    res = x + out  # (T, C)
    after = res if residual.pre else residual.norm(res)  # (T, C)
    return FFNTrace(x, h, pre_act, hidden, out, res, after)


def embed_scale(model) -> float:
    """The factor the model multiplies its token embeddings by: its own ``emb_scale``, else
    sqrt(d_model) when its config sets ``scale_embeddings`` (section 3.4), else 1."""
    scale = getattr(model, "emb_scale", None)
    if scale is not None:
        return float(scale)
    c = model.config
    return math.sqrt(c.n_embd) if getattr(c, "scale_embeddings", False) else 1.0


@torch.no_grad()
def trace_gpt(model, tokenizer, text: str) -> ForwardTrace:
    """Run a decoder-only model on ``text`` and lay out every step of its forward pass."""
    model.eval()
    c = model.config
    ids = encode_text(tokenizer, text, c.block_size, prompt=True)
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    logits, _, internals = model(idx, return_internals=True)
    states = [s[0].float() for s in internals.hidden_states]  # n_layer + 1 of (T, C)
    tok = model.tok_emb(idx)[0].float()  # (T, C) E = W_emb[ids], before the scale
    scale = embed_scale(model)
    # The model hands back its token embeddings as it adds them: already scaled.
    _check("the scaled token embeddings", tok * scale, internals.token_embeddings[0].float())
    pos = internals.position_embeddings  # (T, C) or None
    x0 = states[0]  # (T, C) what the first block reads
    pos_part = pos.float() if pos is not None else 0.0
    _check("the embedding sum", tok * scale + pos_part, x0)
    trace = ForwardTrace(text, ids, token_labels(tokenizer, ids), c.norm_position,
                         c.pos_encoding, c.activation, tok, pos, x0, scale)
    for i, block in enumerate(model.decoder.layers):
        weights = internals.attentions[i][0].float()  # (nh, T, T)
        a = trace_attention(block.self_attn, block.res_self, states[i], weights, causal=True)
        f = trace_ffn(block.ffn, block.res_ffn, a.after)
        _check(f"the output of block {i}", f.after, states[i + 1])
        trace.layers.append(LayerTrace(a, f))
    trace.final = model.decoder.final_norm(states[-1])  # (T, C)
    trace.logits = logits[0].float()  # (T, V)
    raw = model.lm_head(trace.final)  # (T, V)
    if cap := getattr(c, "logit_softcap", None):
        raw = cap * torch.tanh(raw / cap)  # (T, V)
    _check("the logits", raw, trace.logits, atol=1e-3)
    first = model.decoder.layers[0].self_attn
    if first.rope is not None:
        hs = first.head_size
        inv_freq = first.rope.base ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        trace.rope_angles = torch.arange(len(ids), dtype=torch.float64)[:, None] * inv_freq
    if first.alibi is not None:
        trace.alibi_slopes = first.alibi.slopes.float().cpu()
    return trace
