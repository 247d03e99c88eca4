"""``explain``: a checkpoint's forward pass on one text as an offline HTML walkthrough.

A decoder-only GPT gets the eight steps of ``walkthrough.py``; the GPT family
(``families/gpt.py``) calls ``explain_gpt`` for ``minitransformer explain``.
"""

from __future__ import annotations

from ..errors import UserError
from .trace import encode_text, trace_gpt
from .views import check_choice
from .walkthrough import DISPLAY_TOKENS, walkthrough_doc


def explain_gpt(model, tokenizer, text: str, layer: int = 0, head: int = 0,
                top_k: int = 10, source: str = "") -> dict:
    """The walkthrough description of a decoder-only model on ``text``."""
    c = model.config
    check_choice(layer, c.n_layer, "layer")
    check_choice(head, c.n_head, "head")
    if top_k < 1:
        raise UserError("--top_k must be at least 1")
    limit = min(c.block_size, DISPLAY_TOKENS)
    ids = encode_text(tokenizer, text, c.block_size, prompt=True)
    if len(ids) > limit:
        raise UserError(f"the text is {len(ids)} tokens long; the walkthrough shows at most "
                        f"{limit}: shorten it")
    trace = trace_gpt(model, tokenizer, text)
    return walkthrough_doc(trace, tokenizer, c, layer, head, top_k, source)
