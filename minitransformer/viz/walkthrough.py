"""The eight steps of a decoder-only model's forward pass, as a page description for page.py.

Each step has a title, formulas, a few sentences and blocks (token chips, matrices, the top-k
list). A matrix block's ``scope`` says whether it is fixed, per layer or per (layer, head); the
page picks the one the reader selects. Values are the model's own tensors for the text
(``trace.py``); wide ones show their first ``MAX_COLS`` channels with a note saying so.
"""

from __future__ import annotations

import math

import torch

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


def _note(width: int, what: str = "channels") -> str | None:
    if width > MAX_COLS:
        return f"Showing the first {MAX_COLS} of {width} {what}; the rest are left out."
    return None


def matrix(id: str, title: str, data, scope: str = "fixed", rows=None, cols=None,
           color: str = "signed", note: str | None = None) -> dict:
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


def step_tokens(t: ForwardTrace, tokenizer, config) -> dict:
    kind = getattr(tokenizer, "kind", type(tokenizer).__name__)
    return {"id": "tokenize", "title": "Tokenization: text to token ids",
            "formulas": [f"\"{t.text}\"  \u2192  {len(t.ids)} tokens  \u2192  ids"],
            "text": [f"The {kind} tokenizer cuts the text into {len(t.ids)} tokens and gives "
                     f"each one an integer id: its row in the embedding table (vocabulary of "
                     f"{config.vocab_size}). Spaces show as \u2423 and newlines as \u23ce."],
            "blocks": [{"kind": "tokens", "id": "tokens", "tokens": t.tokens, "ids": t.ids}]}


def step_embeddings(t: ForwardTrace, config) -> dict:
    c = config.n_embd
    text = [f"Each id selects one row of the learned embedding matrix W_emb "
            f"({config.vocab_size} \u00d7 {c}). Row i below is the vector of token i: "
            f"{c} numbers the model has learned for it."]
    formulas = ["E = W_emb[ids]        (T \u00d7 d_model)"]
    blocks = [matrix("token-embeddings", "token embeddings E (tokens \u00d7 channels)",
                     t.tok_emb, rows=t.tokens)]
    if t.embed_scale != 1.0:
        formulas.append(f"E \u00b7 \u221ad_model = E \u00b7 {t.embed_scale:.3g}        "
                        "(section 3.4)")
        text.append(f"As in the paper, the embeddings are then multiplied by \u221ad_model "
                    f"(\u221a{c} = {t.embed_scale:.3g}). The table starts at std "
                    "d_model^\u2212\u00bd (as in tensor2tensor), so the scaled rows begin at "
                    "unit size, as large as the positional encoding added next.")
        blocks.append(matrix("scaled-embeddings", "scaled embeddings E \u00b7 \u221ad_model",
                             t.tok_emb * t.embed_scale, rows=t.tokens))
    return {"id": "embed", "title": "Token embeddings", "formulas": formulas, "text": text,
            "blocks": blocks}


def _embedded(t: ForwardTrace) -> str:
    """What the positions are added to: E, or E \u00b7 \u221ad_model when the model scales it."""
    return "E \u00b7 \u221ad_model" if t.embed_scale != 1.0 else "E"


def step_positions(t: ForwardTrace, config) -> dict:
    pe, rows, e = t.pos_encoding, t.tokens, _embedded(t)
    x0 = matrix("block-input", "X = first block's input", t.x0, rows=rows)
    if pe == "sinusoidal":
        formulas = ["PE(pos, 2i) = sin(pos / 10000^(2i/d_model))",
                    "PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))",
                    f"X = {e} + PE"]
        text = ["The paper's fixed sinusoids: each pair of channels turns at its own "
                "frequency, so PE(pos + k) is a rotation (a linear map) of PE(pos) and the "
                "model can read relative offsets. The encoding is added to the embeddings."]
        blocks = [matrix("positions", "positional encoding PE", t.pos_emb, rows=rows), x0]
    elif pe == "learned":
        formulas = ["P = W_pos[0 .. T\u22121]        (a trained table, GPT-2 style)",
                    f"X = {e} + P"]
        text = ["Each position has its own learned vector (one row of W_pos), added to the "
                "token's embedding. A learned table cannot go past the context it was "
                f"trained for (block_size {config.block_size})."]
        blocks = [matrix("positions", "learned position vectors P", t.pos_emb, rows=rows), x0]
    elif pe == "rope":
        formulas = [f"X = {e}        (nothing is added)",
                    "RoPE: rotate channel pairs (c, c + d_k/2) of q and k at position pos by "
                    "pos \u00b7 \u03b8_c,  \u03b8_c = 10000^(\u22122c/d_k)",
                    "\u21d2  q_i \u00b7 k_j depends on the offset i \u2212 j only"]
        text = ["Rotary embeddings act inside attention (step 4): queries and keys are "
                "rotated by an angle that grows with the position. The table shows each "
                "position's angle (radians) for every channel pair."]
        blocks = [matrix("rope-angles", "rotation angles pos \u00b7 \u03b8_c",
                         t.rope_angles, rows=rows,
                         cols=[f"\u03b8{i}" for i in range(t.rope_angles.shape[1])]), x0]
    elif pe == "alibi":
        slopes = t.alibi_slopes[None, :]
        formulas = [f"X = {e}        (nothing is added)",
                    "ALiBi: score(i, j) += \u2212m_h \u00b7 |i \u2212 j|, one slope m_h per head"]
        text = ["Attention with linear biases acts on the scores (step 5): each head "
                "penalises distant keys in proportion to their distance, with its own "
                "slope m_h (a geometric sequence)."]
        blocks = [matrix("alibi-slopes", "slopes m_h", slopes, rows=["m"],
                         cols=[f"head {h}" for h in range(slopes.shape[1])]), x0]
    else:
        formulas = [f"X = {e}        (no positional information)"]
        text = ["This model gets no position signal: without the causal mask attention "
                "would be blind to word order (it is permutation-equivariant)."]
        blocks = [x0]
    return {"id": "positions", "title": "Positional encoding and the sum",
            "formulas": formulas, "text": text, "blocks": blocks}


def step_qkv(t: ForwardTrace, config) -> dict:
    hs = config.n_embd // config.n_head
    pre = t.norm_position == "pre"
    rows = t.tokens
    blocks = [matrix("attn-input", "attention input " + ("LN\u2081(x)" if pre else "x") +
                     " (layer {layer})", _per_layer(t, lambda ly: ly.attn.h), "layer",
                     rows=rows)]
    names = [("q", "Q"), ("k", "K"), ("v", "V")]
    for key, name in names:
        if t.pos_encoding == "rope" and key in "qk":
            blocks.append(matrix(f"{key}-raw", f"{name} before RoPE (layer {{layer}}, head "
                                 f"{{head}})", _per_head(t, lambda ly, h, key=key:
                                                        getattr(ly.attn, key + "_raw")[h]),
                                 "head", rows=rows))
            title = f"{name} after RoPE"
        else:
            title = name
        blocks.append(matrix(key, title + " (layer {layer}, head {head})",
                             _per_head(t, lambda ly, h, key=key: getattr(ly.attn, key)[h]),
                             "head", rows=rows))
    text = [("Pre-LN (GPT-2): the block first normalises its input, and the projections "
             "read LN\u2081(x)." if pre else
             "Post-LN (the paper): the projections read the block's input x as it is."),
            f"Three learned matrices project every token to a query (what it looks for), a "
            f"key (what it offers) and a value (what it passes on). With {config.n_head} "
            f"heads each head has its own slice of d_k = d_model / h = {hs} columns."]
    if t.pos_encoding == "rope":
        text.append("RoPE then rotates the queries and keys by their positions (compare "
                    "'before' and 'after'); values are not rotated.")
    return {"id": "qkv", "title": "Q, K, V projections of head {head}",
            "formulas": ["Q = h W_Q,   K = h W_K,   V = h W_V        "
                         f"(each T \u00d7 d_k, d_k = {hs})"],
            "text": text, "blocks": blocks}


def step_attention(t: ForwardTrace, config) -> dict:
    hs = config.n_embd // config.n_head
    rows = t.tokens
    formulas = [f"scores = Q K\u1d40 / \u221ad_k        (\u221a{hs} = {math.sqrt(hs):.3g})"]
    blocks = []
    if t.pos_encoding == "alibi":
        formulas.append("scores += \u2212m_h \u00b7 |i \u2212 j|        (ALiBi)")
        blocks.append(matrix("alibi-bias", "ALiBi bias (head {head})",
                             _per_head(t, lambda ly, h: ly.attn.bias[h]), "head", rows=rows,
                             cols=rows))
    formulas += ["mask: scores[i, j] = \u2212\u221e for j > i  (no peeking at later tokens)",
                 "A = softmax(scores)  row by row;   head = A V",
                 "MultiHead(x) = Concat(head_1, \u2026, head_h) W_O"]
    blocks += [
        matrix("scores", "masked scores (layer {layer}, head {head})",
               _per_head(t, lambda ly, h: ly.attn.masked[h]), "head", rows=rows, cols=rows),
        matrix("attn-weights", "attention weights A = softmax (layer {layer}, head {head})",
               _per_head(t, lambda ly, h: ly.attn.weights[h]), "head", rows=rows, cols=rows,
               color="prob", note="Row i: how much token i takes from each earlier token; "
                                  "every row sums to 1."),
        matrix("head-output", "head output A V (layer {layer}, head {head})",
               _per_head(t, lambda ly, h: ly.attn.head_out[h]), "head", rows=rows),
        matrix("heads-concat", "all heads concatenated (layer {layer})",
               _per_layer(t, lambda ly: ly.attn.concat), "layer", rows=rows),
        matrix("attn-output", "after W_O: MultiHead output (layer {layer})",
               _per_layer(t, lambda ly: ly.attn.out), "layer", rows=rows),
    ]
    text = ["Each query is compared with every key by a dot product, scaled by \u221ad_k so "
            "the softmax does not saturate. The causal mask sets the scores of later tokens "
            "to \u2212\u221e, so their weight is exactly 0. The weights then average the "
            "value vectors; the heads' outputs are put side by side and mixed by W_O."]
    return {"id": "attention", "title": "Scaled dot-product attention, layer {layer}",
            "formulas": formulas, "text": text, "blocks": blocks}


def step_residual(t: ForwardTrace, config) -> dict:
    rows, pre = t.tokens, t.norm_position == "pre"
    stats = _per_layer(t, lambda ly: torch.stack(
        [ly.attn.residual.mean(-1), ly.attn.residual.var(-1, unbiased=False).sqrt()], -1))
    blocks = [matrix("layer-input", "x: block input (layer {layer})",
                     _per_layer(t, lambda ly: ly.attn.x), "layer", rows=rows),
              matrix("residual-sum", "x + MultiHead(\u2026): the residual sum",
                     _per_layer(t, lambda ly: ly.attn.residual), "layer", rows=rows),
              matrix("residual-stats", "mean and std of each row of the sum", stats, "layer",
                     rows=rows, cols=["mean", "std"])]
    if pre:
        formulas = ["x\u2032 = x + MultiHead(LN\u2081(x))        (Pre-LN: the sum is not "
                    "normalised)", "FFN input = LN\u2082(x\u2032)",
                    "LN(z) = \u03b3 \u2299 (z \u2212 mean(z)) / \u221a(var(z) + \u03b5) + \u03b2"]
        blocks.append(matrix("norm-output", "LN\u2082(x\u2032): what the FFN reads",
                             _per_layer(t, lambda ly: ly.ffn.h), "layer", rows=rows))
        text = ["Pre-LN keeps a clean residual path: the attention output is added to x and "
                "the sum flows on unnormalised; the next sublayer normalises its own input. "
                "Each row of LN\u2082(x\u2032) has mean 0 and variance 1 before \u03b3 and "
                "\u03b2."]
    else:
        formulas = ["x\u2032 = LN\u2081(x + MultiHead(x))        (Post-LN, as in the paper)",
                    "LN(z) = \u03b3 \u2299 (z \u2212 mean(z)) / \u221a(var(z) + \u03b5) + \u03b2"]
        blocks.append(matrix("norm-output", "x\u2032 = LN\u2081(sum)",
                             _per_layer(t, lambda ly: ly.attn.after), "layer", rows=rows))
        text = ["Post-LN adds the attention output to x and normalises the sum: each row is "
                "shifted to mean 0 and scaled to variance 1, then scaled by \u03b3 and shifted "
                "by \u03b2 (both learned)."]
    return {"id": "residual", "title": "Residual connection and LayerNorm, layer {layer}",
            "formulas": formulas, "text": text, "blocks": blocks}


def step_ffn(t: ForwardTrace, config) -> dict:
    rows, pre = t.tokens, t.norm_position == "pre"
    act = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)"}.get(t.activation,
                                                                           t.activation)
    width = t.layers[0].ffn.hidden.shape[-1]
    blocks = [matrix("ffn-input", "FFN input (layer {layer})",
                     _per_layer(t, lambda ly: ly.ffn.h), "layer", rows=rows),
              matrix("ffn-hidden", f"{act}(z W\u2081 + b\u2081) (layer {{layer}})",
                     _per_layer(t, lambda ly: ly.ffn.hidden), "layer", rows=rows,
                     note=_note(width, "hidden units")),
              matrix("ffn-output", "FFN output (layer {layer})",
                     _per_layer(t, lambda ly: ly.ffn.out), "layer", rows=rows),
              matrix("block-output", "block output (layer {layer})",
                     _per_layer(t, lambda ly: ly.ffn.after), "layer", rows=rows)]
    last = len(t.layers) - 1
    formulas = [f"FFN(z) = {act}(z W\u2081 + b\u2081) W\u2082 + b\u2082        "
                f"(d_model {config.n_embd} \u2192 {width} \u2192 {config.n_embd})",
                "block output = x\u2032 + FFN(LN\u2082(x\u2032))" if pre else
                "block output = LN\u2082(x\u2032 + FFN(x\u2032))"]
    text = ["The same two-layer network is applied to every token on its own (no mixing "
            "between tokens here: that was attention's job). It widens each vector, applies "
            f"{act} and projects back; a residual connection adds the result to x\u2032.",
            f"The block output is the next block's input; there are {last + 1} blocks "
            "(choose the layer above)."]
    return {"id": "ffn", "title": "Position-wise feed-forward network, layer {layer}",
            "formulas": formulas, "text": text, "blocks": blocks}


def step_output(t: ForwardTrace, tokenizer, config, k: int) -> dict:
    pre = t.norm_position == "pre"
    probs = torch.softmax(t.logits[-1].double(), -1)  # (V,)
    top = t.top_k(tokenizer, k)
    items = [{"id": i, "token": label, "prob": p, "logit": float(t.logits[-1, i])}
             for i, label, p in top]
    tied = getattr(config, "tie_weights", False)
    formulas = [("h = LN_f(x_L)        (Pre-LN stacks end with one more norm)" if pre else
                 "h = x_L        (every Post-LN block already ends in a norm)"),
                "logits = h W_vocab\u1d40" + ("        (W_vocab = W_emb, tied)" if tied else ""),
                "p(next token) = softmax(logits of the last position)"]
    text = [f"The last position's vector is turned into one score per vocabulary entry "
            f"({config.vocab_size} of them) and the softmax makes them probabilities. These "
            f"are the {len(items)} likeliest next tokens after \"{t.text[-20:]}\" "
            f"(they hold {100 * sum(p for _, _, p in top):.1f}% of the probability; "
            f"entropy {float(-(probs * probs.clamp_min(1e-30).log()).sum()):.2f} nats)."]
    blocks = [matrix("final-hidden", "h after the final norm" if pre else "h = x_L",
                     t.final, rows=t.tokens),
              {"kind": "topk", "id": "topk", "title": f"top-{len(items)} next tokens",
               "items": items}]
    return {"id": "output", "title": "Final norm, logits and the next-token probabilities",
            "formulas": formulas, "text": text, "blocks": blocks}


def walkthrough_doc(trace: ForwardTrace, tokenizer, config, layer: int = 0, head: int = 0,
                    top_k: int = 10, source: str = "") -> dict:
    """The page description for ``page.render_page``."""
    norm = "Pre-LN" if trace.norm_position == "pre" else "Post-LN"
    return {
        "title": f"Inside a Transformer: \"{trace.text}\"",
        "subtitle": (f"{source} \u00b7 decoder-only, {config.n_layer} layers \u00d7 "
                     f"{config.n_head} heads, d_model {config.n_embd}, {norm}, "
                     f"{trace.pos_encoding} positions \u00b7 every number below is this "
                     f"model's own, for this text"),
        "n_layer": config.n_layer, "n_head": config.n_head, "layer": layer, "head": head,
        "autoplay_ms": 4000,
        "steps": [step_tokens(trace, tokenizer, config), step_embeddings(trace, config),
                  step_positions(trace, config), step_qkv(trace, config),
                  step_attention(trace, config), step_residual(trace, config),
                  step_ffn(trace, config), step_output(trace, tokenizer, config, top_k)],
    }
