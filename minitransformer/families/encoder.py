"""The encoder family: a bidirectional encoder trained as a masked language model (BERT).

    train      15% of the tokens chosen, 80% [MASK] / 10% random / 10% kept; predict them
    evaluate   masked-LM val loss, masked-token accuracy, the most-frequent-token baseline
    fill       the likeliest tokens for each [MASK] slot of a text (the playground's box too)
    train --init_from   continue masked-LM training of a BERT folder (all-MiniLM-L6-v2) or
               an encoder run; a folder without a masked-LM head gets a fresh one

The tokenizer gets one id beyond the corpus' own, [MASK]: with characters it is the last id
(the char tokenizer never produces it); with BPE it is the special token ``<mask>`` (BERT's
``[MASK]`` in a tokenizer from a Hugging Face folder).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..config import EncoderConfig, config_from_dict
from ..errors import UserError
from ..io import load_weights
from ..models import EncoderModel
from ..presets import ENCODER as PRESETS
from ..training import checkpoint as ckpt
from ..training.mlm import MaskedLMTask
from ..viz.trace import token_labels
from ..viz.views import self_attention_views
from .base import Built, NotApplicable, Prepared, note_unknown_pieces, run_meta, summary_lines
from .streams import StreamFamily

MASK_TOKENS = ("<mask>", "[MASK]")  # ours, BERT's
MASK = "[MASK]"  # how a text to fill marks its slots, whatever the tokenizer calls the id


NO_HEAD = "masked-LM training needs an output head: --mlm_head bert or linear"


class EncoderFamily(StreamFamily):
    name = "encoder"
    presets = PRESETS
    title = "encoder"
    a_title = "an encoder"
    config_class = EncoderConfig
    model_class = EncoderModel
    default_data = "shakespeare"
    special_tokens = ("<mask>",)
    commands = frozenset({"fill"})
    redirects = {"sample": "an encoder fills in masks rather than continuing text; try: "
                           "minitransformer fill DIR \"To be, or not to b[MASK].\"",
                 "translate": "an encoder has no decoder: train --model seq2seq",
                 "explain": "its attention maps: minitransformer attention DIR --text ...",
                 "export": "export writes GPT runs (as GPT-2, Llama or Qwen3 folders); an "
                           "encoder run loads in Python: minitransformer.load_checkpoint(DIR)"}

    def tokenizer_extras(self, tokenizer) -> dict:
        """The [MASK] id and the model's vocabulary size."""
        if tokenizer.kind == "char":  # one id past the characters
            return {"mask_id": tokenizer.vocab_size, "vocab_size": tokenizer.vocab_size + 1}
        found = (tokenizer.token_to_id(t) for t in MASK_TOKENS)
        mask = next((i for i in found if i is not None), None)
        if mask is None:
            raise NotApplicable("the BPE tokenizer has no <mask> (or BERT's [MASK]) token")
        return {"mask_id": mask, "vocab_size": tokenizer.vocab_size}

    def check_fields(self, fields: dict) -> None:
        """As every family's, and a model without an output head refused (compare's variants
        before the first is trained)."""
        super().check_fields(fields)
        if fields.get("mlm_head") == "none":
            raise NotApplicable(NO_HEAD)

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        cfg = config_from_dict(EncoderConfig, {**fields, **prepared.extra})
        if cfg.mlm_head == "none":
            raise NotApplicable(NO_HEAD)
        self.check_length(prepared, cfg.block_size)
        return Built(cfg, EncoderModel(cfg), self.make_task(prepared, cfg),
                     run_meta(self.name, cfg, prepared.data_meta), cfg.n_layer)

    def init_fields(self, source, fields: dict) -> dict:
        """As every family's; a source saved without a masked-LM head (an embedding model
        such as all-MiniLM-L6-v2) gets a fresh one: --mlm_head bert (default) or linear."""
        if source.config.mlm_head != "none":
            return super().init_fields(source, fields)
        head = fields.get("mlm_head", "bert")
        out = super().init_fields(source, {k: v for k, v in fields.items() if k != "mlm_head"})
        return {**out, "mlm_head": head}

    def load_source(self, model, source, fresh: dict | None = None) -> list[str]:
        if source.config.mlm_head != "none":
            return super().load_source(model, source, fresh)
        tied = model.tok_emb.weight.data_ptr()
        head = {k: v for k, v in model.state_dict().items()
                if k.startswith("mlm_head.") and v.data_ptr() != tied}
        super().load_source(model, source, {**head, **(fresh or {})})
        how = "its output tied to the token embeddings" if model.config.tie_weights else \
            "its own output matrix"
        return [f"{source.path} has no masked-LM head: added a fresh one "
                f"({model.config.mlm_head}, {how}), trained from random weights"]

    def make_task(self, prepared: Prepared, config) -> MaskedLMTask:
        return MaskedLMTask(prepared.train_ids, prepared.val_ids, config.block_size,
                            config.mask_id, config.vocab_size)

    def describe(self, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        c = built.config
        return summary_lines(f"corpus {prepared.source}: {prepared.summary}; "
                             f"{c.vocab_size} ids with [MASK]", "encoder", built,
                             f"{c.n_layer} layers, {c.n_head} heads, {c.n_embd} wide, context "
                             f"{c.block_size}; masked-LM, 15% of tokens chosen (80/10/10)",
                             train_cfg, f"batch {train_cfg.batch_size}")

    def finish(self, run_dir, result, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        model = built.model
        load_weights(model, Path(run_dir) / ckpt.MODEL_FILE)  # the best model
        device = next(model.parameters()).device
        acc, base = built.task.accuracy(model, "val", train_cfg.batch_size,
                                        train_cfg.eval_iters, device)
        windows = train_cfg.batch_size * train_cfg.eval_iters
        return [f"best model: val masked-token accuracy {acc:.1%} on {windows:,} windows "
                f"(always guessing the most frequent token: {base:.1%})",
                f"evaluate it: minitransformer evaluate {run_dir}"]

    def evaluate(self, model, tokenizer, meta: dict, options: dict, device) -> list[str]:
        if why := cannot_fill(model):
            raise NotApplicable(f"{why}, and evaluate scores masked-token predictions")
        loss, task, batch, iters, where = self.val_loss(model, tokenizer, meta, options)
        acc, base = task.accuracy(model, "val", batch, iters, device, options.get("seed") or 0)
        return [f"masked-LM val loss        {loss:.4f} nats/token",
                f"masked-token accuracy     {acc:.1%}",
                f"most-frequent baseline    {base:.1%}", where]

    def attention_views(self, model, tokenizer, text: str, target: str | None = None):
        """Its self-attention over ``text``, whose [MASK]s (if the model has the id) are
        slots, as ``fill`` reads them: the attention that fills them."""
        mask_id = getattr(model.config, "mask_id", None)
        if mask_id is None or MASK not in text:
            return self_attention_views(model, tokenizer, text, target)
        ids = masked_ids(tokenizer, text, mask_id, model.config.block_size)
        return self_attention_views(model, tokenizer, text, target, ids, {mask_id: MASK})

    def fill(self, model, tokenizer, texts: list[str], top: int) -> list[str]:
        """``fill``'s lines: each text, each [MASK] slot's ``top`` likeliest tokens with their
        probabilities, then the text with every slot given its likeliest token."""
        if why := cannot_fill(model):
            raise NotApplicable(why)
        for n, text in enumerate(texts, 1):  # every text checked before any is filled
            try:
                _slots(tokenizer, text, model.config.mask_id, model.config.block_size)
            except FillError as e:
                raise UserError(f"text {n}: {e}" if len(texts) > 1 else str(e)) from None
        note_unknown_pieces(tokenizer, [MARKER.sub(" ", t) for t in texts])
        lines = []
        for text in texts:
            result = fill_mask(model, tokenizer, text, top)
            lines.append(text)
            filled = list(result["ids"])
            for n, slot in enumerate(result["slots"], 1):
                shown = " | ".join(f"{p['token']} {p['prob']:.1%}" for p in slot["predictions"])
                lines.append(f"  {MASK} {n}: {shown}")
                filled[slot["position"]] = slot["predictions"][0]["id"]
            # decoded whole (BPE's bytes join); a line break shown as the candidates show it
            lines.append("-> " + tokenizer.decode(filled).replace("\n", "\u23ce"))
        return lines


class FillError(UserError):
    """A text ``fill_mask`` cannot fill; ``code`` says why (the server's error code)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def fills_masks(model) -> bool:
    """A masked-LM encoder: a [MASK] id and an output head over the vocabulary."""
    return cannot_fill(model) is None


def cannot_fill(model) -> str | None:
    """Why ``model`` cannot fill masks (no head, or no [MASK] id), or None."""
    cfg = model.config
    if getattr(cfg, "mlm_head", "none") == "none":
        return ("this encoder has no masked-LM head (mlm_head none): it embeds sentences "
                "rather than filling masks")
    if getattr(cfg, "mask_id", None) is None:
        return ("this encoder has no [MASK] id (config.json's model.mask_id), so no slot to "
                "fill")
    return None


# a slot as a text may write it: ours, lower case, or the <mask> of BPE runs and RoBERTa
MARKER = re.compile(r"\[MASK\]|<mask>", re.IGNORECASE)


def masked_ids(tokenizer, text: str, mask_id: int, block_size: int) -> list[int]:
    """The ids of ``text``, each [MASK] in it (or [mask], <mask>) as ``mask_id``."""
    return _slots(tokenizer, text, mask_id, block_size)[0]


def _slots(tokenizer, text: str, mask_id: int, block_size: int) -> tuple[list[int], list[bool]]:
    """(ids, whether each slot took the space before it). The pieces between the slots are
    encoded one by one, so that no tokenizer needs to know the marker. A subword tokenizer's
    words carry the space before them (" be" is one token), so there a space right before a
    slot is the slot's, as RoBERTa's <mask> takes it, not a token of its own."""
    pieces = MARKER.split(text)
    try:
        tokenizer.encode("".join(pieces))  # every unseen character named at once
    except (UserError, ValueError, KeyError) as e:
        raise FillError(str(e), "unknown_characters") from None
    if len(pieces) == 1:
        raise FillError(f"put at least one {MASK} in the text", "no_mask")
    ids, spaced = [], []
    for i, piece in enumerate(pieces):
        if i:
            ids.append(mask_id)
        takes_space = tokenizer.kind != "char" and i < len(pieces) - 1 and piece.endswith(" ")
        if takes_space:
            piece = piece[:-1]
        if i < len(pieces) - 1:
            spaced.append(takes_space)
        if piece:
            ids.extend(tokenizer.encode(piece))
    if len(ids) > block_size:
        raise FillError(f"the text is {len(ids)} tokens; this model reads at most {block_size} "
                        f"(its block_size)", "context_length_exceeded")
    return ids, spaced


@torch.inference_mode()
def fill_mask(model, tokenizer, text: str, top: int) -> dict:
    """The ``top`` likeliest tokens (and their probabilities) for each [MASK] of ``text``,
    all slots predicted together from one forward pass (as BERT is trained):
    {"ids": the text's ids, "texts": each position's text ([MASK] for a slot, " [MASK]" for
    one that took the space before it), "slots": [{"position", "predictions": [{"token" (a
    printable label), "text", "id", "prob"}, ...]}, ...]}. The probabilities are the model's
    softmax over its whole vocabulary; [MASK] itself is never offered."""
    mask_id = model.config.mask_id
    ids, spaced = _slots(tokenizer, text, mask_id, model.config.block_size)
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)
        logits, _ = model(idx)  # (1, T, V)
    finally:
        model.train(was_training)
    probs = torch.softmax(logits[0].float(), dim=-1)  # (T, V)
    ranked = probs.clone()
    ranked[:, mask_id] = -1.0  # below every probability, even those that underflow to 0
    positions = [i for i, t in enumerate(ids) if t == mask_id]
    slots = []
    for pos in positions:
        best = torch.topk(ranked[pos], min(top, probs.shape[-1] - 1)).indices
        labels = token_labels(tokenizer, best.tolist())
        slots.append({"position": pos, "predictions": [
            {"token": label, "text": tokenizer.decode([int(i)]), "id": int(i),
             "prob": float(probs[pos, i])} for label, i in zip(labels, best, strict=True)]})
    slot_text = dict(zip(positions, (" " + MASK if s else MASK for s in spaced), strict=True))
    texts = [slot_text[i] if i in slot_text else tokenizer.decode([t])
             for i, t in enumerate(ids)]
    return {"ids": ids, "texts": texts, "slots": slots}


FAMILY = EncoderFamily()
