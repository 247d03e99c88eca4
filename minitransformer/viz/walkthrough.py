"""The eight steps of a decoder-only model's forward pass, as a page description for page.py.

Each step has a title, formulas, a few sentences and blocks (token chips, matrices, the top-k
list). A matrix block's ``scope`` says whether it is fixed, per layer or per (layer, head); the
page picks the one the reader selects. Values are the model's own tensors for the text
(``trace.py``); wide ones show their first ``MAX_COLS`` channels with a note saying so.

Every sentence is a message of the catalogues (``i18n.msg``), so the page shows it in the
reader's language; formulas made only of symbols stay plain strings.
"""

from __future__ import annotations

import math

import torch

from .i18n import msg
from .trace import ForwardTrace

MAX_COLS = 64
DISPLAY_TOKENS = 64  # the page shows at most this many tokens


def _round(x: float) -> float:
    return float(f"{x:.6g}") if math.isfinite(x) else x


def values(t: torch.Tensor, max_cols: int | None = MAX_COLS) -> list:
    """A 2-D tensor as nested lists of rounded floats (-inf stays -inf), columns capped."""
    t = t.detach().double().cpu()
    if max_cols is not None:
        t = t[:, :max_cols]
    return [[_round(v) for v in row] for row in t.tolist()]


def _note(width: int, what: str = "channels") -> dict | None:
    if width > MAX_COLS:
        return msg(f"note.first_{what}", n=MAX_COLS, width=width)
    return None


def matrix(id: str, title, data, scope: str = "fixed", rows=None, cols=None,
           color: str = "signed", note=None) -> dict:
    """A matrix block. data: a 2-D tensor (fixed), a list of them (layer) or of lists (head)."""
    if scope == "fixed":
        vals = values(data)
        width = data.shape[-1]
    elif scope == "layer":
        vals = [values(m) for m in data]
        width = data[0].shape[-1]
    else:
        vals = [[values(m) for m in per_layer] for per_layer in data]
        width = data[0][0].shape[-1]
    if cols is None and width > MAX_COLS:
        note = note or _note(width)
    block = {"kind": "matrix", "id": id, "title": title, "scope": scope, "values": vals,
             "rows": rows, "cols": cols, "color": color}
    if note:
        block["note"] = note
    return block


def _per_layer(trace: ForwardTrace, get) -> list[torch.Tensor]:
    return [get(layer) for layer in trace.layers]


def _per_head(trace: ForwardTrace, get) -> list[list[torch.Tensor]]:
    return [[get(layer, h) for h in range(layer.attn.q.shape[0])] for layer in trace.layers]


ACTIVATIONS = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "relu2": "ReLU\u00b2",
               "swiglu": "SwiGLU"}


def _features(config) -> list:
    """What the subtitle names beside the positions: the activation, and each change later
    models made where this one has it (docs/modern.md)."""
    out = [ACTIVATIONS.get(config.activation, config.activation)]
    if _rms(config):
        out.append("RMSNorm")
    if getattr(config, "qk_norm", False):
        out.append("QK-norm")
    kv = getattr(config, "n_kv_head", None)
    if kv and kv < config.n_head:
        out.append(msg("walk.kv_heads", kv=kv))
    if cap := getattr(config, "logit_softcap", None):
        out.append(msg("walk.softcap", c=f"{cap:g}"))
    if not getattr(config, "bias", True):
        out.append(msg("walk.no_bias"))
    return out


def _listed(items: list):
    """Items as one message: "a, b, c" in the reader's language."""
    return items[0] if len(items) == 1 else msg("walk.list", first=items[0],
                                                  rest=_listed(items[1:]))


def step_tokens(t: ForwardTrace, tokenizer, config) -> dict:
    kind = getattr(tokenizer, "kind", type(tokenizer).__name__)
    return {"id": "tokenize", "title": msg("tokens.title"),
            "formulas": [msg("tokens.formula", text=t.text, n=len(t.ids))],
            "text": [msg("tokens.text", kind=kind, n=len(t.ids), vocab=config.vocab_size)],
            "blocks": [{"kind": "tokens", "id": "tokens", "tokens": t.tokens, "ids": t.ids}]}


def step_embeddings(t: ForwardTrace, config) -> dict:
    c = config.n_embd
    text = [msg("embed.text", vocab=config.vocab_size, c=c)]
    formulas = ["E = W_emb[ids]        (T \u00d7 d_model)"]
    blocks = [matrix("token-embeddings", msg("embed.block"), t.tok_emb, rows=t.tokens)]
    if t.embed_scale != 1.0:
        scale = f"{t.embed_scale:.3g}"
        formulas.append(msg("embed.scale_formula", scale=scale))
        text.append(msg("embed.scale_text", c=c, scale=scale))
        blocks.append(matrix("scaled-embeddings", msg("embed.scaled_block"),
                             t.tok_emb * t.embed_scale, rows=t.tokens))
    return {"id": "embed", "title": msg("embed.title"), "formulas": formulas, "text": text,
            "blocks": blocks}


def _embedded(t: ForwardTrace) -> str:
    """What the positions are added to: E, or E \u00b7 \u221ad_model when the model scales it."""
    return "E \u00b7 \u221ad_model" if t.embed_scale != 1.0 else "E"


def step_positions(t: ForwardTrace, config) -> dict:
    pe, rows, e = t.pos_encoding, t.tokens, _embedded(t)
    x0 = matrix("block-input", msg("pos.x0"), t.x0, rows=rows)
    if pe == "sinusoidal":
        formulas = ["PE(pos, 2i) = sin(pos / 10000^(2i/d_model))",
                    "PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))", f"X = {e} + PE"]
        text = [msg("pos.sin_text")]
        blocks = [matrix("positions", msg("pos.sin_block"), t.pos_emb, rows=rows), x0]
    elif pe == "learned":
        formulas = [msg("pos.learned_formula"), f"X = {e} + P"]
        text = [msg("pos.learned_text", block_size=config.block_size)]
        blocks = [matrix("positions", msg("pos.learned_block"), t.pos_emb, rows=rows), x0]
    elif pe == "rope":
        formulas = [msg("pos.nothing_added", e=e), msg("pos.rope_formula"),
                    msg("pos.rope_offset")]
        text = [msg("pos.rope_text")]
        blocks = [matrix("rope-angles", msg("pos.rope_block"), t.rope_angles, rows=rows,
                         cols=[f"\u03b8{i}" for i in range(t.rope_angles.shape[1])]), x0]
    elif pe == "alibi":
        slopes = t.alibi_slopes[None, :]
        formulas = [msg("pos.nothing_added", e=e), msg("pos.alibi_formula")]
        text = [msg("pos.alibi_text")]
        blocks = [matrix("alibi-slopes", msg("pos.alibi_block"), slopes, rows=["m"],
                         cols=[msg("ui.head_n", n=h) for h in range(slopes.shape[1])]), x0]
    else:
        formulas = [msg("pos.none_formula", e=e)]
        text = [msg("pos.none_text")]
        blocks = [x0]
    return {"id": "positions", "title": msg("pos.title"), "formulas": formulas, "text": text,
            "blocks": blocks}


def step_qkv(t: ForwardTrace, config) -> dict:
    hs = config.n_embd // config.n_head
    pre = t.norm_position == "pre"
    rows = t.tokens
    blocks = [matrix("attn-input", msg("qkv.input_pre" if pre else "qkv.input_post"),
                     _per_layer(t, lambda ly: ly.attn.h), "layer", rows=rows)]
    qk_norm = getattr(config, "qk_norm", False)
    for key, name in [("q", "Q"), ("k", "K"), ("v", "V")]:
        rotated = t.pos_encoding == "rope" and key in "qk"
        normed = qk_norm and key in "qk"  # the raw rows are already QK-normed
        if rotated:
            blocks.append(matrix(f"{key}-raw", msg("qkv.normed_before_rope" if normed
                                                   else "qkv.before_rope", name=name),
                                 _per_head(t, lambda ly, h, key=key:
                                           getattr(ly.attn, key + "_raw")[h]),
                                 "head", rows=rows))
        title = "qkv.after_rope" if rotated else "qkv.normed" if normed else "qkv.block"
        blocks.append(matrix(key, msg(title, name=name),
                             _per_head(t, lambda ly, h, key=key: getattr(ly.attn, key)[h]),
                             "head", rows=rows))
    text = [msg("qkv.pre_text" if pre else "qkv.post_text"),
            msg("qkv.text", heads=config.n_head, hs=hs)]
    formulas = [msg("qkv.formula", hs=hs)]
    kv = getattr(config, "n_kv_head", None) or config.n_head
    if kv < config.n_head:
        text.append(msg("qkv.gqa_text", kv=kv, g=config.n_head // kv))
    if qk_norm:
        formulas.append(msg("qkv.qk_norm_formula"))
        text.append(msg("qkv.qk_norm_text"))
    if t.pos_encoding == "rope":
        text.append(msg("qkv.rope_text"))
    return {"id": "qkv", "title": msg("qkv.title"), "formulas": formulas, "text": text,
            "blocks": blocks}


def step_attention(t: ForwardTrace, config) -> dict:
    hs = config.n_embd // config.n_head
    rows = t.tokens
    formulas = [f"scores = Q K\u1d40 / \u221ad_k        (\u221a{hs} = {math.sqrt(hs):.3g})"]
    blocks = []
    if t.pos_encoding == "alibi":
        formulas.append("scores += \u2212m_h \u00b7 |i \u2212 j|        (ALiBi)")
        blocks.append(matrix("alibi-bias", msg("attn.alibi_block"),
                             _per_head(t, lambda ly, h: ly.attn.bias[h]), "head", rows=rows,
                             cols=rows))
    formulas += [msg("attn.mask_formula"), msg("attn.softmax_formula"),
                 "MultiHead(x) = Concat(head_1, \u2026, head_h) W_O"]
    blocks += [
        matrix("scores", msg("attn.scores_block"),
               _per_head(t, lambda ly, h: ly.attn.masked[h]), "head", rows=rows, cols=rows),
        matrix("attn-weights", msg("attn.weights_block"),
               _per_head(t, lambda ly, h: ly.attn.weights[h]), "head", rows=rows, cols=rows,
               color="prob", note=msg("attn.weights_note")),
        matrix("head-output", msg("attn.head_block"),
               _per_head(t, lambda ly, h: ly.attn.head_out[h]), "head", rows=rows),
        matrix("heads-concat", msg("attn.concat_block"),
               _per_layer(t, lambda ly: ly.attn.concat), "layer", rows=rows),
        matrix("attn-output", msg("attn.out_block"),
               _per_layer(t, lambda ly: ly.attn.out), "layer", rows=rows),
    ]
    return {"id": "attention", "title": msg("attn.title"), "formulas": formulas,
            "text": [msg("attn.text")], "blocks": blocks}


LN_FORMULA = ("LN(z) = \u03b3 \u2299 (z \u2212 mean(z)) / \u221a(var(z) + \u03b5) + "
              "\u03b2")
RMS_FORMULA = "LN(z) = RMSNorm(z) = \u03b3 \u2299 z / \u221a(mean(z\u00b2) + \u03b5)"


def _rms(config) -> bool:
    return getattr(config, "norm", "layernorm") == "rmsnorm"


def step_residual(t: ForwardTrace, config) -> dict:
    rows, pre = t.tokens, t.norm_position == "pre"
    stats = _per_layer(t, lambda ly: torch.stack(
        [ly.attn.residual.mean(-1), ly.attn.residual.var(-1, unbiased=False).sqrt()], -1))
    blocks = [matrix("layer-input", msg("res.input_block"),
                     _per_layer(t, lambda ly: ly.attn.x), "layer", rows=rows),
              matrix("residual-sum", msg("res.sum_block"),
                     _per_layer(t, lambda ly: ly.attn.residual), "layer", rows=rows),
              matrix("residual-stats", msg("res.stats_block"), stats, "layer",
                     rows=rows, cols=[msg("res.mean"), msg("res.std")])]
    rms = _rms(config)
    norm, suffix = (RMS_FORMULA, "_rms") if rms else (LN_FORMULA, "")
    if pre:
        formulas = [msg("res.pre_formula"), msg("res.pre_ffn_formula"), norm]
        blocks.append(matrix("norm-output", msg("res.pre_norm_block"),
                             _per_layer(t, lambda ly: ly.ffn.h), "layer", rows=rows))
        text = [msg("res.pre_text" + suffix)]
    else:
        formulas = [msg("res.post_formula"), norm]
        blocks.append(matrix("norm-output", msg("res.post_norm_block"),
                             _per_layer(t, lambda ly: ly.attn.after), "layer", rows=rows))
        text = [msg("res.post_text" + suffix)]
    return {"id": "residual", "title": msg("res.title" + suffix), "formulas": formulas,
            "text": text, "blocks": blocks}


def step_ffn(t: ForwardTrace, config) -> dict:
    rows, pre = t.tokens, t.norm_position == "pre"
    act = ACTIVATIONS.get(t.activation, t.activation)
    width = t.layers[0].ffn.hidden.shape[-1]
    swiglu, bias = t.activation == "swiglu", getattr(config, "bias", True)
    b1, b2, gate = (" + b\u2081", " + b\u2082", " + b_gate") if bias else ("", "", "")
    gated = f"SiLU(z W_gate{gate}) \u2299 (z W\u2081{b1})"  # SwiGLU's hidden layer
    hidden = msg("ffn.hidden_swiglu", gated=gated) if swiglu else \
        msg("ffn.hidden_block" if bias else "ffn.hidden_nobias", act=act)
    blocks = [matrix("ffn-input", msg("ffn.input_block"),
                     _per_layer(t, lambda ly: ly.ffn.h), "layer", rows=rows),
              matrix("ffn-hidden", hidden,
                     _per_layer(t, lambda ly: ly.ffn.hidden), "layer", rows=rows,
                     note=_note(width, "hidden")),
              matrix("ffn-output", msg("ffn.output_block"),
                     _per_layer(t, lambda ly: ly.ffn.out), "layer", rows=rows),
              matrix("block-output", msg("ffn.block_output"),
                     _per_layer(t, lambda ly: ly.ffn.after), "layer", rows=rows)]
    inner = f"({gated})" if swiglu else f"{act}(z W\u2081{b1})"
    formulas = [f"FFN(z) = {inner} W\u2082{b2}        "
                f"(d_model {config.n_embd} \u2192 {width} \u2192 {config.n_embd})",
                msg("ffn.pre_formula" if pre else "ffn.post_formula")]
    text = [msg("ffn.text", act=act), *([msg("ffn.swiglu_text")] if swiglu else []),
            msg("ffn.blocks_text", n=len(t.layers))]
    return {"id": "ffn", "title": msg("ffn.title"), "formulas": formulas, "text": text,
            "blocks": blocks}


def step_output(t: ForwardTrace, tokenizer, config, k: int) -> dict:
    pre = t.norm_position == "pre"
    probs = torch.softmax(t.logits[-1].double(), -1)  # (V,)
    top = t.top_k(tokenizer, k)
    items = [{"id": i, "token": label, "prob": p, "logit": float(t.logits[-1, i])}
             for i, label, p in top]
    tied = getattr(config, "tie_weights", False)
    formulas = [msg("out.pre_formula" if pre else "out.post_formula"),
                msg("out.logits_tied") if tied else "logits = h W_vocab\u1d40"]
    if cap := getattr(config, "logit_softcap", None):
        formulas.append(msg("out.softcap_formula", c=f"{cap:g}"))
    formulas.append(msg("out.softmax_formula"))
    entropy = float(-(probs * probs.clamp_min(1e-30).log()).sum())
    text = [msg("out.text", vocab=config.vocab_size, k=len(items), tail=t.text[-20:],
                pct=f"{100 * sum(p for _, _, p in top):.1f}", entropy=f"{entropy:.2f}")]
    blocks = [matrix("final-hidden", msg("out.final_pre" if pre else "out.final_post"),
                     t.final, rows=t.tokens),
              {"kind": "topk", "id": "topk", "title": msg("out.topk", k=len(items)),
               "items": items}]
    return {"id": "output", "title": msg("out.title"), "formulas": formulas, "text": text,
            "blocks": blocks}


def walkthrough_doc(trace: ForwardTrace, tokenizer, config, layer: int = 0, head: int = 0,
                    top_k: int = 10, source: str = "", lang: str = "en") -> dict:
    """The page description for ``page.render_page``; ``lang`` is the language it opens in
    (the page's toggle switches to the other)."""
    norm = "Pre-LN" if trace.norm_position == "pre" else "Post-LN"
    return {
        "title": msg("walk.title", text=trace.text),
        "subtitle": msg("walk.subtitle", source=source, layers=config.n_layer,
                        heads=config.n_head, d=config.n_embd, norm=norm,
                        pos=_listed([msg(f"pe.{trace.pos_encoding}"), *_features(config)])),
        "lang": lang, "n_layer": config.n_layer, "n_head": config.n_head, "layer": layer,
        "head": head, "autoplay_ms": 4000,
        "steps": [step_tokens(trace, tokenizer, config), step_embeddings(trace, config),
                  step_positions(trace, config), step_qkv(trace, config),
                  step_attention(trace, config), step_residual(trace, config),
                  step_ffn(trace, config), step_output(trace, tokenizer, config, top_k)],
    }
