"""What the playground asks of a model, computed on the worker thread.

    inspect     GPT: next-token probabilities and every head's attention at one position,
                through the window generation used there (past block_size: the context shift)
    translate   encoder-decoder: a translation and the cross-attention that produced it
    fill_mask   masked-LM encoder: the likeliest tokens for each [MASK] slot of a text

Shapes: T time, V vocabulary size.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..families import encoder
from ..models.generation import default_context_shift, window_start
from ..viz.trace import token_labels
from .errors import APIError
from .sampling import kept_start


def encode(tokenizer, text: str) -> list[int]:
    try:
        ids = tokenizer.encode_prompt(text)  # as completions read the prompt
    except (UserError, ValueError, KeyError) as e:
        raise APIError(400, f"text: {e}", "text", "unknown_characters") from None
    if not ids:
        raise APIError(400, "text encodes to no tokens", "text", "empty_prompt")
    return ids


def generation_starts(length: int, prompt: int, block_size: int, shift: int,
                      keep: int = 0) -> list[int]:
    """starts[p]: the first token after the ``keep`` kept ones of the window the model saw
    when it computed the next-token prediction at position p of a text of ``length`` tokens,
    of which the first ``prompt`` were a prompt that generation continued with context shift
    ``shift`` (the window: ``text[:keep] + text[starts[p]:p + 1]``; ``keep`` where the window
    is the whole text).

    From the prompt's last token on, these are the windows ``sample_steps`` used (the rule of
    ``models.generation.window_start``, starting from the whole prompt). Positions before it
    were never predicted from; they get the windows of the same rule over a text generated
    from its first token.
    """
    prompt = max(1, min(prompt, length))
    starts, grown, start = [], keep, keep
    for n in range(1, length + 1):  # n tokens fed; the prediction at position n - 1
        grown = window_start(n, grown, block_size, shift, keep)
        if n >= prompt:
            start = window_start(n, start, block_size, shift, keep)
        starts.append(grown if n < prompt else start)
    return starts


@torch.inference_mode()
def inspect(model, tokenizer, text: str, position: int, top: int,
            prompt: int | None = None) -> dict:
    """Top next-token probabilities and every head's attention at one position of ``text``,
    seen as the model saw it when it generated the next token: through the window that
    generation used under the default context shift, the tokenizer's start tokens kept
    (``generation_starts``; ``prompt``: the tokens of the text that were the prompt, default
    all of them). ``offset``: the first token of that window after ``kept`` tokens of the
    text's start (0 and 0 where the window is the whole text)."""
    ids = encode(tokenizer, text)
    pos = position if position >= 0 else len(ids) + position
    if not 0 <= pos < len(ids):
        raise APIError(400, f"position {position} is outside the text's {len(ids)} tokens",
                       "position", "bad_position")
    block = model.config.block_size
    n_prompt = len(ids) if prompt is None else prompt
    keep = kept_start(model, tokenizer)
    offset = generation_starts(len(ids), n_prompt, block, default_context_shift(block),
                               keep)[pos]
    kept = keep  # Llama's <s>, once the window has moved
    if offset <= keep:  # nothing dropped: the whole text
        kept, offset = 0, 0
    window = ids[:kept] + ids[offset:pos + 1]
    idx = torch.tensor([window], device=next(model.parameters()).device)  # (1, T)
    logits, _, internals = model(idx, return_internals=True)  # (1, T, V)
    probs = torch.softmax(logits[0, -1].float(), dim=-1)  # (V,)
    best = torch.topk(probs, min(top, probs.numel()))
    return {"offset": offset, "kept": kept, "position": pos,
            "tokens": token_labels(tokenizer, window),
            "top": [{"token": label, "id": int(i), "prob": float(p)} for label, i, p in
                    zip(token_labels(tokenizer, best.indices.tolist()), best.indices,
                        best.values, strict=True)],
            "attention": [[row.tolist() for row in a[0, :, -1, :].float()]
                          for a in internals.attentions]}  # [layer][head][key]


def translate(run, text: str, beam: int) -> dict:
    """The translation of one sentence and the cross-attention that produced it."""
    device = next(run.model.parameters()).device
    try:
        out = run.family.translate(run.model, run.tokenizer, [text], {"beam": beam}, device)[0]
    except UserError as e:  # a sentence longer than the model reads, say
        raise APIError(400, f"text: {e}", "text", "bad_text") from None
    if not out:  # </s> first (a young model): nothing attended to draw
        return {"translation": ""}
    body = {"translation": out}
    limit, tok = run.model.config.block_size - 1, run.tokenizer  # positions beside </s>, <s>
    if (n := len(tok.encode(text))) > limit:  # translate reads longer sources too
        return {**body, "note": long_source_note(run.model, n)}
    target = out
    if len(ids := tok.encode(out)) > limit:  # the alignment of the translation's beginning
        target = tok.decode(ids[:limit])
        body["note"] = (f"the translation is {len(ids)} tokens; its alignment is drawn for the "
                        f"first {limit} (the model's block_size)")
    try:
        views = {v.name: v for v in run.family.attention_views(run.model, tok, text, target)}
    except UserError as e:  # a target that encodes otherwise once cut, say
        return {**body, "note": f"no alignment drawn: {e}"}
    cross = next((v for name, v in views.items() if "cross" in name.lower()), None)
    if cross is not None:
        body["cross_attention"] = {"weights": cross.weights.mean(dim=(0, 1)).tolist(),
                                   "source": cross.key_labels, "target": cross.query_labels}
    return body


def long_source_note(model, n: int) -> str:
    """What ``translate`` did with a source of ``n`` tokens past the model's block_size, as
    the command line says it (``families.seq2seq.encode_sources``)."""
    c = model.config
    if c.pos_encoding == "learned":
        return (f"the text is {n} tokens; it is translated from its first {c.block_size - 1} "
                f"(the model's learned positions end there), and no alignment is drawn")
    return (f"the text is {n} tokens, past the model's block_size ({c.block_size}): translated "
            f"whole, but no alignment is drawn")


def fill_mask(model, tokenizer, text: str, top: int) -> dict:
    """The ``top`` likeliest tokens for each [MASK] of ``text`` (``families.encoder.fill_mask``),
    a text it cannot fill answered as a bad request."""
    try:
        return encoder.fill_mask(model, tokenizer, text, top)
    except encoder.FillError as e:
        raise APIError(400, f"text: {e}", "text", e.code) from None
