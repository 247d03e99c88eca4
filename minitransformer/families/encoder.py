"""The encoder family: a bidirectional encoder trained as a masked language model (BERT).

    train      15% of the tokens chosen, 80% [MASK] / 10% random / 10% kept; predict them
    evaluate   masked-LM val loss, masked-token accuracy, the most-frequent-token baseline
    train --init_from   continue masked-LM training of a BERT folder (all-MiniLM-L6-v2) or
               an encoder run; a folder without a masked-LM head gets a fresh one

The tokenizer gets one id beyond the corpus' own, [MASK]: with characters it is the last id
(the char tokenizer never produces it); with BPE it is the special token ``<mask>`` (BERT's
``[MASK]`` in a tokenizer from a Hugging Face folder).
"""

from __future__ import annotations

from pathlib import Path

from ..config import EncoderConfig, config_from_dict
from ..io import load_weights
from ..models import EncoderModel
from ..presets import ENCODER as PRESETS
from ..training import checkpoint as ckpt
from ..training.mlm import MaskedLMTask
from ..viz.views import self_attention_views
from .base import Built, NotApplicable, Prepared, run_meta, summary_lines
from .streams import StreamFamily

MASK_TOKENS = ("<mask>", "[MASK]")  # ours, BERT's


class EncoderFamily(StreamFamily):
    name = "encoder"
    presets = PRESETS
    title = "encoder"
    config_class = EncoderConfig
    model_class = EncoderModel
    default_data = "shakespeare"
    special_tokens = ("<mask>",)
    redirects = {"sample": "an encoder fills in masks rather than continuing text; try: "
                           "minitransformer evaluate DIR",
                 "translate": "an encoder has no decoder: train --model seq2seq",
                 "explain": "its attention maps: minitransformer attention DIR --text ..."}

    def tokenizer_extras(self, tokenizer) -> dict:
        """The [MASK] id and the model's vocabulary size."""
        if tokenizer.kind == "char":  # one id past the characters
            return {"mask_id": tokenizer.vocab_size, "vocab_size": tokenizer.vocab_size + 1}
        found = (tokenizer.token_to_id(t) for t in MASK_TOKENS)
        mask = next((i for i in found if i is not None), None)
        if mask is None:
            raise NotApplicable("the BPE tokenizer has no <mask> (or BERT's [MASK]) token")
        return {"mask_id": mask, "vocab_size": tokenizer.vocab_size}

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        cfg = config_from_dict(EncoderConfig, {**fields, **prepared.extra})
        if cfg.mlm_head == "none":
            raise NotApplicable("masked-LM training needs an output head: --mlm_head bert or "
                                "linear")
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
        return [f"best model: val masked-token accuracy {acc:.1%} (always guessing the most "
                f"frequent token: {base:.1%})",
                f"evaluate it: minitransformer evaluate {run_dir}"]

    def evaluate(self, model, tokenizer, meta: dict, options: dict, device) -> list[str]:
        loss, task, batch, iters = self.val_loss(model, tokenizer, meta, options)
        acc, base = task.accuracy(model, "val", batch, iters, device, options.get("seed") or 0)
        return [f"masked-LM val loss        {loss:.4f} nats/token",
                f"masked-token accuracy     {acc:.1%}",
                f"most-frequent baseline    {base:.1%}"]

    def attention_views(self, model, tokenizer, text: str, target: str | None = None):
        return self_attention_views(model, tokenizer, text, target)


FAMILY = EncoderFamily()
