"""The GPT family: a decoder-only language model on one token stream (characters or BPE).

    train      next-token prediction on random windows (nanoGPT's batches)
    evaluate   val loss, perplexity, bits per token
    sample     continue a prompt (temperature, top-k, top-p, KV cache)
    explain    the eight-step walkthrough of the forward pass
    compare    also the val loss on windows longer than the training context
"""

from __future__ import annotations

import shlex

import torch

from ..config import GPTConfig, config_from_dict
from ..data import get_batch
from ..models import GPT
from ..presets import GPT as PRESETS
from ..tokenizers.fitting import GPT_SPECIALS
from ..tokenizers.specials import document_separator, end_token
from ..training.trainer import LanguageModelTask
from ..viz.explain import explain_gpt
from ..viz.views import self_attention_views
from .base import (
    Built,
    CannotEvaluate,
    Prepared,
    loss_lines,
    run_meta,
    source_roles,
    summary_lines,
    tokens_per_character,
)
from .streams import StreamFamily


class GPTFamily(StreamFamily):
    name = "gpt"
    presets = PRESETS
    title = "GPT"
    a_title = "a GPT"
    config_class = GPTConfig
    model_class = GPT
    default_data = "shakespeare"
    special_tokens = GPT_SPECIALS
    bpe_separator = GPT_SPECIALS[0]  # GPT-2's <|endoftext|> between documents
    commands = frozenset({"sample", "explain", "export"})
    redirects = {"translate": "it continues text: minitransformer sample DIR --prompt ...",
                 "fill": "it continues text (masks are an encoder's, train --model encoder): "
                         "minitransformer sample DIR --prompt ..."}
    can_autosize = True
    measures_lengths = True
    spare_rows = True

    def separator(self, tokenizer=None) -> str:
        """<|endoftext|>, or a pretrained tokenizer's own end and start (Llama's </s><s>)."""
        inner = getattr(tokenizer, "hf", None) or getattr(tokenizer, "tokenizer", None)
        return self.bpe_separator if inner is None else document_separator(inner,
                                                                          self.bpe_separator)

    def end_tokens(self, tokenizer, meta: dict) -> frozenset[int]:
        """The eos_token of the folder the run started from (Qwen-instruct's <|im_end|>) and
        the end token between its documents (<|endoftext|>, Llama's </s>), which the model
        learns to write where a text ends; a char run has neither."""
        inner = getattr(tokenizer, "hf", None) or getattr(tokenizer, "tokenizer", None)
        if inner is None:
            return frozenset()
        named = (source_roles(meta).get("eos_token"), end_token(inner, self.bpe_separator))
        return frozenset(i for i in (inner.token_to_id(t) for t in named if t) if i is not None)

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        tok = prepared.tokenizer
        rows = prepared.extra.get("vocab_rows", tok.vocab_size)  # keep_rows: a padded table
        cfg = config_from_dict(GPTConfig, {**fields, "vocab_size": rows})
        self.check_length(prepared, cfg.block_size)
        task = self.make_task(prepared, cfg)
        return Built(cfg, GPT(cfg), task, run_meta(self.name, cfg, prepared.data_meta),
                     cfg.n_layer)

    def make_task(self, prepared: Prepared, config) -> LanguageModelTask:
        return LanguageModelTask(prepared.train_ids, prepared.val_ids, config.block_size,
                                 config.vocab_size)

    def describe(self, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        c = built.config
        return summary_lines(f"corpus {prepared.source}: {prepared.summary}", "model", built,
                             f"{c.n_layer} layers, {c.n_head} heads, {c.n_embd} wide, context "
                             f"{c.block_size}", train_cfg, f"batch {train_cfg.batch_size}")

    def finish(self, run_dir, result, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        prompt = corpus_prompt(prepared)  # "--prompt=---": a first line "---" is no flag
        flag = "--prompt=" if prompt.startswith("-") else "--prompt "
        return [f"best model: {run_dir}/model.safetensors (+ config.json, tokenizer.json)",
                f"sample from it: minitransformer sample {shlex.quote(str(run_dir))} "
                f"{flag}{shlex.quote(prompt)}"]

    def evaluate(self, model, tokenizer, meta: dict, options: dict, device) -> list[str]:
        loss, task, *_, where = self.val_loss(model, tokenizer, meta, options)
        if tokenizer.kind == "char":
            return [*loss_lines(loss, "character"), where]
        return [*loss_lines(loss, "token", tokens_per_character(tokenizer, task.data["val"])),
                where]

    def attention_views(self, model, tokenizer, text: str, target: str | None = None):
        return self_attention_views(model, tokenizer, text, target, prompt=True)

    def explain(self, model, tokenizer, text: str, layer: int, head: int, top_k: int,
                source: str) -> dict:
        return explain_gpt(model, tokenizer, text, layer, head, top_k, source)

    @torch.no_grad()
    def loss_at_length(self, model, prepared: Prepared, length: int, device,
                       n_tokens: int = 16384, seed: int = 0) -> float:
        """Mean next-token cross-entropy (nats) over random val windows of ``length`` tokens.

        About ``n_tokens`` tokens in all (at least 4 windows), in batches of at most 8192.
        """
        val = prepared.val_ids
        if length + 1 > len(val):
            raise CannotEvaluate(f"val split too short ({len(val)} tokens)")
        gen = torch.Generator().manual_seed(seed)
        windows = max(4, n_tokens // length)
        per_batch = max(1, min(windows, 8192 // length))
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            while count < windows:
                b = min(per_batch, windows - count)
                x, y = get_batch(val, b, length, gen)  # (b, L), (b, L)
                try:
                    loss = model(x.to(device), y.to(device))[1]
                except ValueError as e:  # e.g. a learned position table past block_size
                    raise CannotEvaluate("cannot extrapolate") from e
                total += loss.item() * b
                count += b
        finally:
            model.train(was_training)
        return total / count


def corpus_prompt(prepared: Prepared, longest: int = 16) -> str:
    """A prompt the model knows: the start of its own corpus, up to the first line's end
    (at most ``longest`` characters, cut at a space): 'First Citizen:' for Shakespeare."""
    text = prepared.tokenizer.decode(prepared.train_ids[:64].tolist())
    line = next((ln for ln in text.splitlines() if ln.strip()), text).strip()
    if len(line) > longest:
        cut = line[:longest].rsplit(" ", 1)[0]
        line = cut if cut else line[:longest]
    return line or text[:1]


FAMILY = GPTFamily()
