"""What a model family plugs in to be compared: its data, its model and task, its long-window loss.

``compare`` is family-agnostic; a family is an object with

    name, config_class, default_data   e.g. "gpt", GPTConfig, "shakespeare"
    field_names()                      the config fields it accepts (beside TrainConfig's)
    prepare(source, encoding, fields)  read the corpus and fit the tokenizer, once for all
                                       variants -> a ``Prepared``
    build(prepared, fields, seed)      one variant: config, model, task, meta -> a ``Built``
    loss_at_length(model, prepared, length, device, n_tokens)
                                       val loss on windows of ``length`` tokens; raises
                                       ``CannotEvaluate`` with a reason when that makes no sense

and is registered in ``FAMILIES`` (or with ``register``). ``fields`` is the flat mapping of
the family's own config fields (training fields are split off before).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import GPTConfig, Seq2SeqConfig, config_from_dict, field_names, split_fields
from ..data import check_length, get_batch, load_text, split_ids
from ..errors import UserError


class CannotEvaluate(Exception):
    """A length a model cannot be evaluated at; ``str()`` says why, for the results table."""


@dataclass
class Prepared:
    """A corpus read once for every variant: text, tokenizer, id splits, the family's extras."""

    source: str
    encoding: str
    tokenizer: Any
    train_ids: torch.Tensor | None = None
    val_ids: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    summary: str = ""  # one line about the corpus, for the console

    @property
    def n_train_tokens(self) -> int:
        return len(self.train_ids) if self.train_ids is not None else 0


@dataclass
class Built:
    """One variant ready for ``train()``."""

    config: Any  # the family's model config
    model: nn.Module
    task: Any  # what the trainer calls: batch, loss, tokens, sample
    meta: dict  # stored in every config.json of the run
    init_depth: int  # the n_layer the init scheme scales residual projections by


class GPTFamily:
    """Decoder-only language models on one token stream (characters or byte-level BPE)."""

    name = "gpt"
    config_class = GPTConfig
    default_data = "shakespeare"

    def __init__(self, tokenizer_kind: str = "char"):
        self.tokenizer_kind = tokenizer_kind

    def field_names(self) -> list[str]:
        return field_names(GPTConfig)

    def prepare(self, source: str, encoding: str, fields: dict) -> Prepared:
        from ..tokenizers import fit_tokenizer

        text = load_text(source, encoding)
        vocab = fields.get("vocab_size") if self.tokenizer_kind == "bpe" else None
        tokenizer = fit_tokenizer(self.tokenizer_kind, text, vocab)
        ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
        train_ids, val_ids = split_ids(ids)
        return Prepared(source, encoding, tokenizer, train_ids, val_ids,
                        summary=f"{len(train_ids):,} training tokens")

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        from ..models import GPT
        from ..training.trainer import LanguageModelTask

        tok = prepared.tokenizer
        cfg = config_from_dict(GPTConfig, {**fields, "vocab_size": tok.vocab_size})
        check_length(prepared.train_ids, prepared.val_ids, cfg.block_size, prepared.source)
        task = LanguageModelTask(prepared.train_ids, prepared.val_ids, cfg.block_size)
        meta = {"format": "minitransformer", "version": 1, "family": "gpt",
                "model": dataclasses.asdict(cfg),
                "data": {"source": prepared.source, "encoding": prepared.encoding,
                         "tokenizer": tok.kind}}
        return Built(cfg, GPT(cfg), task, meta, cfg.n_layer)

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


class Seq2SeqFamily:
    """The encoder-decoder on sentence pairs, built as ``train --model seq2seq`` builds it."""

    name = "seq2seq"
    config_class = Seq2SeqConfig
    default_data = "bible_en_es"

    def __init__(self, tokenizer_kind: str = "bpe"):
        pass  # always a joint BPE vocabulary

    def field_names(self) -> list[str]:
        from ..data import ParallelDataConfig

        return field_names(Seq2SeqConfig) + field_names(ParallelDataConfig)

    def _split(self, fields: dict):
        from ..data import ParallelDataConfig

        model, data = split_fields(fields, Seq2SeqConfig, ParallelDataConfig)
        return model, config_from_dict(ParallelDataConfig, data)

    def prepare(self, source: str, encoding: str, fields: dict) -> Prepared:
        from ..data import load_parallel, split_indices
        from ..tokenizers import BPETokenizer

        model, data_cfg = self._split(fields)
        corpus = load_parallel(source, None, data_cfg.src, data_cfg.tgt, encoding)
        splits = split_indices(corpus.groups)
        texts = [corpus.src[i] for i in splits["train"]] + [corpus.tgt[i] for i in
                                                             splits["train"]]
        tokenizer = BPETokenizer.train(texts, model.get("vocab_size", 8000))
        return Prepared(source, encoding, tokenizer, extra={"corpus": corpus, "splits": splits},
                        summary=f"{len(splits['train']):,} training pairs "
                                f"{corpus.src_lang} -> {corpus.tgt_lang}")

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        from ..commands_seq2seq import _encode_splits, _sample_sources
        from ..models import Seq2SeqTransformer
        from ..training.seq2seq_task import Seq2SeqTask

        tok, corpus, splits = prepared.tokenizer, prepared.extra["corpus"], \
            prepared.extra["splits"]
        model_fields, data_cfg = self._split(fields)
        cfg = config_from_dict(Seq2SeqConfig, {
            **model_fields, "vocab_size": tok.vocab_size, "pad_id": tok.pad_id,
            "bos_id": tok.bos_id, "eos_id": tok.eos_id})
        encoded, _ = _encode_splits(tok, corpus, splits, cfg, data_cfg)
        task = Seq2SeqTask(encoded, cfg.pad_id, cfg.bos_id, cfg.eos_id, data_cfg.batch_tokens,
                           _sample_sources(corpus, splits, tok), seed=seed)
        meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
                "model": dataclasses.asdict(cfg),
                "data": {"source": prepared.source, "source_tgt": None,
                         "encoding": prepared.encoding, "tokenizer": "bpe",
                         "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang,
                         "config": dataclasses.asdict(data_cfg),
                         "pairs": {k: len(v) for k, v in splits.items()}}}
        return Built(cfg, Seq2SeqTransformer(cfg), task, meta,
                     cfg.encoder_layers + cfg.decoder_layers)

    def loss_at_length(self, model, prepared: Prepared, length: int, device,
                       n_tokens: int = 16384, seed: int = 0) -> float:
        raise CannotEvaluate("not defined for sentence pairs")


FAMILIES: dict[str, Any] = {"gpt": GPTFamily, "seq2seq": Seq2SeqFamily}


def register(name: str, family_factory) -> None:
    """Make a family comparable: ``family_factory(tokenizer_kind)`` returns the family object."""
    FAMILIES[name] = family_factory


def get_family(name: str, tokenizer_kind: str = "char"):
    if name not in FAMILIES:
        raise UserError(f"compare does not know the model family {name!r} yet; it knows "
                        f"{', '.join(FAMILIES)}")
    return FAMILIES[name](tokenizer_kind)
