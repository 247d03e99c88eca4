"""``explain``: a checkpoint's forward pass on one text as an offline HTML walkthrough.

The model family picks the tracer and the page builder (``EXPLAINERS``); a decoder-only GPT
gets the eight steps of ``walkthrough.py``.
"""

from __future__ import annotations

from ..errors import UserError
from .trace import encode_text, trace_gpt
from .walkthrough import DISPLAY_TOKENS, walkthrough_doc


def _check_choice(value: int, n: int, what: str) -> None:
    if not 0 <= value < n:
        raise UserError(f"--{what} {value} is out of range: the model has {n} {what}s "
                        f"(0 .. {n - 1})")


def explain_gpt(model, tokenizer, text: str, layer: int = 0, head: int = 0,
                top_k: int = 10, source: str = "") -> dict:
    """The walkthrough description of a decoder-only model on ``text``."""
    c = model.config
    _check_choice(layer, c.n_layer, "layer")
    _check_choice(head, c.n_head, "head")
    if top_k < 1:
        raise UserError("--top-k must be at least 1")
    limit = min(c.block_size, DISPLAY_TOKENS)
    ids = encode_text(tokenizer, text, c.block_size)
    if len(ids) > limit:
        raise UserError(f"the text is {len(ids)} tokens long; the walkthrough shows at most "
                        f"{limit}: shorten it")
    trace = trace_gpt(model, tokenizer, text)
    return walkthrough_doc(trace, tokenizer, c, layer, head, top_k, source)


EXPLAINERS = {"gpt": explain_gpt}


def build_explain_doc(folder, text: str, layer: int = 0, head: int = 0, top_k: int = 10,
                      which: str = "best") -> dict:
    """Load a checkpoint and describe its forward pass on ``text``."""
    from ..training import checkpoint as ckpt

    model, tokenizer, meta = ckpt.load_checkpoint_with_meta(folder, which, "cpu")
    family = meta.get("family")
    explainer = EXPLAINERS.get(family)
    if explainer is None:
        raise UserError(f"the walkthrough covers {', '.join(EXPLAINERS)} models; this "
                        f"checkpoint is {family!r} (its attention maps: minitransformer "
                        f"attention)")
    source = meta.get("data", {}).get("source") or str(folder)
    return explainer(model, tokenizer, text, layer, head, top_k, f"trained on {source}")
