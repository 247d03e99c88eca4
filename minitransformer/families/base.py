"""What a model family plugs in: the one interface every command uses.

A family is one module (``gpt.py``, ``encoder.py``, ``seq2seq.py``) holding one object with

    name, title, config_class, model_class    e.g. "gpt", "GPT", GPTConfig, GPT
    data_classes                               extra config dataclasses (sentence pairs: batching)
    presets, default_data, tokenizers          its named settings, its corpus, --tokenizer choices
    commands                                   what it can do beyond train / evaluate / attention
    prepare(source, encoding, fields, kind)    read the corpus (one source, or a list of them),
                                               fit the tokenizer -> Prepared
    reopen(meta, tokenizer, source, encoding)  the same for a run being resumed or evaluated
    build(prepared, fields, seed)              config, model, task, meta -> Built
    describe(prepared, built, train_cfg)       the lines printed before training
    finish(run_dir, result, built, train_cfg)  the lines printed after it
    evaluate(model, tokenizer, meta, options)  the lines of ``evaluate`` (loss, accuracy, BLEU)
    attention_views(model, tokenizer, text, target)
    loss_at_length(model, prepared, length, device)
    start_from(source, prepared, fields)       train --init_from: ``build``'s model with a
                                               pretrained folder's weights (pretrained.py)

``families/__init__.py`` registers each once; a run folder's ``config.json`` names its family,
the one key every loader dispatches on. A command that does not apply to a family raises
``NotApplicable`` (a user error, exit 2) through ``require``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import TrainConfig, config_from_dict, field_names
from ..data.cache import check_sources, recorded_source
from ..data.text import check_encoding_applies
from ..errors import ConfigError, UserError
from ..io import RUN_FORMAT, load_tensors
from ..presets import NO_STEP_CAP, get_preset
from ..tokenizers import TOKENIZERS


class NotApplicable(UserError):
    """A command or flag that has no meaning for this model family."""


class CannotEvaluate(Exception):
    """A length a model cannot be evaluated at; ``str()`` says why, for the results table."""


@dataclass
class Prepared:
    """A corpus read once (for a run, or for every variant of a comparison)."""

    source: str
    encoding: str
    tokenizer: Any
    data_meta: dict  # what config.json records under "data"
    train_ids: torch.Tensor | None = None  # token streams (GPT, encoder)
    val_ids: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)  # the family's own (e.g. sentence pairs)
    summary: str = ""  # one line about the corpus, for the console

    @property
    def n_train_tokens(self) -> int:
        return len(self.train_ids) if self.train_ids is not None else 0


@dataclass
class Built:
    """One model ready for ``train()``."""

    config: Any  # the family's model config
    model: nn.Module
    task: Any  # what the trainer calls (training/task.py)
    meta: dict  # stored in every config.json of the run
    init_depth: int  # the n_layer the init scheme scales residual projections by


def run_meta(family: str, config, data_meta: dict) -> dict:
    """The config.json of a run before training adds its own fields."""
    return {**RUN_FORMAT, "family": family, "model": dataclasses.asdict(config), "data": data_meta}


def train_config(meta: dict, overrides: dict | None = None) -> TrainConfig:
    """The TrainConfig a run folder records (defaults where an old folder lacks it)."""
    saved = meta.get("train", {})
    if not isinstance(saved, dict):
        raise UserError("config.json: its 'train' entry is not a mapping")
    try:
        return config_from_dict(TrainConfig, {**saved, **(overrides or {})})
    except ConfigError as e:
        raise UserError(f"config.json: {e}") from None


class Family:
    """Defaults shared by the families; each family module overrides what is its own."""

    name = ""
    title = ""  # how messages name it: "GPT", "encoder", "encoder-decoder"
    a_title = ""  # the same with its article: "a GPT", "an encoder"
    config_class: type = object
    model_class: type = nn.Module
    data_classes: tuple[type, ...] = ()
    presets: dict[str, dict] = {}
    default_data = "shakespeare"
    default_preset = "cpu-small"
    tokenizers: tuple[str, ...] = TOKENIZERS  # char, bpe (automatic), bpe-bytes, bpe-chars
    commands: frozenset[str] = frozenset()  # beyond train, evaluate, attention, compare
    redirects: dict[str, str] = {}  # command -> what to use instead, for the message
    evaluate_options: frozenset[str] = frozenset()  # evaluate's flags this family reads
    can_autosize = False  # --time_budget without --preset sizes the model
    measures_lengths = False  # loss_at_length scores it (compare --eval_lengths)
    spare_rows = False  # build honours prepared.extra["vocab_rows"] (see keep_rows)

    # -- settings ---------------------------------------------------------------------------
    def check_batch_split(self, batch_size: int, world_size: int, grad_accum: int) -> None:
        """Refuse, before any data is read, a batch that cannot be split over world_size x
        grad_accum parts, where that needs no data (the task checks again with it)."""

    def field_names(self) -> list[str]:
        """The config fields it accepts beside TrainConfig's."""
        return [n for cls in (self.config_class, *self.data_classes) for n in field_names(cls)]

    def check_fields(self, fields: dict) -> None:
        """Refuse now, before any data is read, settings that no data could make valid (a
        zero n_layer, an n_embd that n_head does not divide, ...): each config class built
        from its fields, the data's own values (the vocabulary, ...) left at the defaults."""
        for cls in (self.config_class, *self.data_classes):
            names = set(field_names(cls))
            config_from_dict(cls, {k: v for k, v in fields.items() if k in names})

    def preset(self, name: str | None) -> dict:
        try:
            return get_preset(self.presets, name or self.default_preset, self.name)
        except ConfigError as e:
            raise UserError(str(e)) from None

    def claims(self, source: str | None, source_tgt: str | None) -> bool:
        """Whether this data implies this family when --model is not given."""
        return False

    def saved_fields(self, meta: dict) -> dict:
        """The flat config fields a run folder was built with."""
        return dict(meta["model"])

    def require(self, command: str) -> None:
        """Raise NotApplicable unless ``command`` applies to this family."""
        if command not in self.commands:
            hint = self.redirects.get(command, "")
            raise NotApplicable(f"{command} does not apply to {self.title} runs"
                                + (f"; {hint}" if hint else ""))

    def build_model(self, meta: dict) -> nn.Module:
        """The model a config.json describes (random weights)."""
        try:
            config = config_from_dict(self.config_class, meta["model"])
        except ConfigError as e:
            raise UserError(f"config.json: {e}") from None
        return self.model_class(config)

    # -- what each family supplies ----------------------------------------------------------
    def prepare(self, source: str | list[str], encoding: str, fields: dict, kind: str | None,
                source_tgt: str | None = None, newline: str | None = None,
                text_field: str | None = None) -> Prepared:
        """The data of a new run. ``text_field``: the field of JSONL records and table rows
        that holds the text (None: "text")."""
        raise NotImplementedError

    def reopen(self, meta: dict, tokenizer, source: str | list[str], encoding: str,
               source_tgt: str | None = None, newline: str | None = None,
               text_field: str | None = None) -> Prepared:
        """A run's data read again (resume, evaluate, --init_from); ``text_field`` None: the
        run's own field where ``source`` is the run's own."""
        raise NotImplementedError

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        raise NotImplementedError

    def describe(self, prepared: Prepared, built: Built, train_cfg: TrainConfig) -> list[str]:
        return []

    def finish(self, run_dir, result, prepared: Prepared, built: Built,
               train_cfg: TrainConfig) -> list[str]:
        return []

    def evaluate(self, model, tokenizer, meta: dict, options: dict, device) -> list[str]:
        raise NotImplementedError

    def attention_views(self, model, tokenizer, text: str, target: str | None = None):
        raise NotImplementedError

    def end_tokens(self, tokenizer, meta: dict) -> frozenset[int]:
        """The ids at which a served completion ends (none: it ends at max_tokens only)."""
        return frozenset()

    def translate(self, model, tokenizer, lines: list[str], options: dict,
                  device) -> list[str]:
        self.require("translate")
        raise NotImplementedError

    def explain(self, model, tokenizer, text: str, layer: int, head: int, top_k: int,
                source: str) -> dict:
        self.require("explain")
        raise NotImplementedError

    def fill(self, model, tokenizer, texts: list[str], top: int) -> list[str]:
        """``fill``'s lines: each [MASK] slot's likeliest tokens (a masked-LM family's)."""
        self.require("fill")
        raise NotImplementedError

    def loss_at_length(self, model, prepared: Prepared, length: int, device,
                       n_tokens: int = 16384, seed: int = 0) -> float:
        raise CannotEvaluate("not defined for this model family")

    # -- starting from pretrained weights (train --init_from) -------------------------------
    init_changeable: frozenset[str] = frozenset({"dropout", "attn_impl"})  # beside block_size

    def init_fields(self, source, fields: dict) -> dict:
        """The fields of a run started from ``source`` (``pretrained.Source``): its model's,
        with the flags given applied where they leave every tensor's shape and the function
        as they are (``init_changeable``; block_size may shrink). Data fields (seq2seq's
        batching) are free. Any other model field given with another value is a UserError
        naming the flag."""
        own = dataclasses.asdict(source.config)
        out = {**(self.saved_fields(source.meta) if source.kind == "run" else {}), **own}
        for key, value in fields.items():
            if key not in own or value == own[key] or key in self.init_changeable:
                out[key] = value
            elif key == "block_size" and value < own[key]:
                out[key] = value  # a learned position table keeps its first rows
            else:
                more = " (it may only shrink)" if key == "block_size" else ""
                raise UserError(f"--{key} {value}: a run started from {source.path} keeps its "
                                f"architecture ({key} {own[key]}){more}; drop the flag")
        return out

    def start_from(self, source, prepared: Prepared, fields: dict,
                   seed: int = 0) -> tuple[Built, list[str]]:
        """(the model and task of ``build`` holding the source's weights, lines to print)."""
        self.keep_rows(prepared, source.config.vocab_size)
        built = self.build(prepared, self.init_fields(source, fields), seed)
        if built.config.vocab_size != source.config.vocab_size:
            raise UserError(f"{source.path}: its tokenizer has {prepared.tokenizer.vocab_size:,} "
                            f"ids but its model {source.config.vocab_size:,} rows of embedding")
        notes = self.load_source(built.model, source)
        # the tokenizer's ids, and the family's own past them (a char encoder's [MASK])
        ids = prepared.extra.get("vocab_size", prepared.tokenizer.vocab_size)
        if built.config.vocab_size > ids:  # keep_rows: said, as a mismatched tokenizer looks
            notes.append(f"note: {source.path} has {built.config.vocab_size:,} embedding rows "
                         f"for its {ids:,} ids; the {built.config.vocab_size - ids:,}"
                         f" past them (padding, as in Qwen's models) are kept")
        built.meta["init_from"] = source.origin
        return built, notes

    def keep_rows(self, prepared: Prepared, rows: int) -> None:
        """Let ``build`` give the model ``rows`` embedding rows where its tokenizer has fewer
        ids: pretrained models pad their vocabulary (Qwen's 151,669 ids have 151,936 rows),
        and a run started from one keeps them. Families without ``spare_rows`` refuse it."""
        if self.spare_rows and rows > prepared.tokenizer.vocab_size:
            prepared.extra["vocab_rows"] = rows

    def load_source(self, model: nn.Module, source, fresh: dict | None = None) -> list[str]:
        """Copy the source's weights into ``model`` (a shorter block_size takes the first rows
        of a learned position table); ``fresh`` names tensors kept as ``model`` has them.
        Returns lines to print."""
        expected = model.state_dict()
        old, new = source.config.block_size, model.config.block_size
        state = {}
        for name, t in source.state.items():
            want = expected.get(name)
            if want is not None and t.shape != want.shape and t.shape[0] == old and \
                    want.shape[0] == new and t.shape[1:] == want.shape[1:]:
                t = t[:new]  # (new, C) of (old, C): positions 0 .. new-1
            state[name] = t
        load_tensors(model, {**state, **(fresh or {})}, str(source.path))
        return []


def chain_start(meta: dict) -> dict:
    """What the Hugging Face folder a run's chain of ``--init_from`` began with said, as the
    run's config.json recorded it, for ``export`` to write back: "special_tokens", the roles
    ({"eos_token": "<|im_end|>", ...}), and "positions", its max_position_embeddings (a RoPE
    model trained on shorter windows still reads as far). Either may be missing."""
    origin = meta.get("init_from")
    origin = origin if isinstance(origin, dict) else {}
    out: dict = {}
    roles = origin.get("special_tokens")
    if isinstance(roles, dict):
        out["special_tokens"] = {k: v for k, v in roles.items() if isinstance(v, str)}
    positions = origin.get("positions")
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        out["positions"] = positions
    return out


def source_roles(meta: dict) -> dict[str, str]:
    """The special tokens' roles of ``chain_start`` ({} for none)."""
    return chain_start(meta).get("special_tokens", {})


def summary_lines(corpus: str, model: str, built: Built, shape: str, train_cfg: TrainConfig,
                  batches: str) -> list[str]:
    """What ``train`` prints first: the corpus, the model, the budget."""
    from ..training.device import pick_device

    budget = f"{train_cfg.max_iters:,} steps"
    if train_cfg.time_budget and train_cfg.max_iters >= NO_STEP_CAP:  # only the time counts
        budget = f"{train_cfg.time_budget:.0f}s"
    elif train_cfg.time_budget:  # the schedule runs to whichever limit comes first
        budget = f"{train_cfg.time_budget:.0f}s or {budget}, whichever comes first"
    lr = "noam" if train_cfg.lr_schedule == "noam" else f"{train_cfg.learning_rate:g}"
    return [corpus,
            f"{model}: {built.model.num_params():,} parameters ({shape}); device "
            f"{pick_device(train_cfg.device)}",
            f"training for {budget}, {batches}, lr {lr}"]


def data_source(meta: dict, options: dict) -> tuple[str | list[str], str]:
    """(corpus, encoding) to evaluate on: --data / --encoding, else the run's own."""
    data = meta.get("data", {})
    source = options.get("data") or data.get("source")
    if not source:
        raise NotApplicable("the checkpoint does not name its corpus; pass --data")
    check_encoding_applies(source, options.get("encoding"))
    return source, options.get("encoding") or data.get("encoding", "utf-8")


def as_named_now(meta: dict, source: str | list[str]) -> dict:
    """``meta`` for reading ``source``, which the user named with --data: where it is the
    run's own by name but changed since, without the recorded fingerprints and cache, so that
    it is read as it is now (unnamed, a changed source is an error: the run's text is gone);
    else as it is (the run's own, unchanged, keeps its cache)."""
    data = meta.get("data", {})
    sources = [source] if isinstance(source, str) else list(source)
    if recorded_source(sources) != data.get("source"):
        return meta
    try:
        check_sources(data, sources)
    except UserError:
        if not all(Path(s).exists() for s in sources):  # a missing file: its own error later
            return meta
        data = {k: v for k, v in data.items() if k not in ("sources", "cache")}
        if os.environ.get("RANK", "0") == "0":  # torchrun: said once
            print(f"note: {', '.join(sources)} changed since the run read it: it is read as it "
                  f"is now, so its val split is not the one the run measured and a resume "
                  f"does not continue exactly", file=sys.stderr)
    return {**meta, "data": data}


def note_unknown_pieces(tokenizer, texts: list[str]) -> None:
    """Say on stderr which pieces of ``texts`` the tokenizer's vocabulary lacks (each read as
    <unk>, which decoding drops), where it can tell (a subword vocabulary's)."""
    unknown = tokenizer.unknown_pieces(texts) if hasattr(tokenizer, "unknown_pieces") else []
    if unknown:
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        print(f"note: the model's vocabulary has no {', '.join(map(repr, unknown[:10]))}{more}: "
              f"each is read as <unk>", file=sys.stderr)


def data_label(meta: dict, fallback: str) -> str:
    """The corpus a run was trained on, as a page names it: bundled names as they are, files
    by their names (config.json keeps absolute paths), several joined; else ``fallback``."""
    source = meta.get("data", {}).get("source")
    if not source:
        return fallback
    sources = source if isinstance(source, list) else [source]
    return ", ".join(Path(s).name or s for s in sources)


def loss_lines(loss: float, per: str, tokens_per_char: float | None = None) -> list[str]:
    """Val loss, perplexity and bits per token (or character); with ``tokens_per_char`` (a
    tokenizer's tokens per character of the val text) bits per character too, the figure
    that compares runs whose tokenizers differ."""
    rows = [("val loss", f"{loss:.4f} nats/{per}"), ("perplexity", f"{math.exp(loss):.3f}"),
            (f"bits/{per}", f"{loss / math.log(2):.4f}")]
    if tokens_per_char is not None:
        rows.append(("bits/character", f"{loss * tokens_per_char / math.log(2):.4f} "
                                       f"({tokens_per_char:.3f} tokens per character of the "
                                       f"text scored)"))
    return [f"{name:<16}{value}" for name, value in rows]


def tokens_per_character(tokenizer, ids, limit: int = 1_000_000) -> float:
    """Tokens per character of the text ``ids`` (its first ``limit`` tokens) decode to."""
    ids = ids[:limit]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return len(ids) / max(1, len(tokenizer.decode(ids)))
