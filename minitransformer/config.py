"""Typed configs and the named presets.

One dataclass per model family (``GPTConfig`` here; the encoder-decoder adds its own) and one
``TrainConfig`` for the training loop, whose field names follow nanoGPT's. Presets live in one
dict, ``PRESETS[family][name]``, each a flat mapping of field -> value over both configs.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, fields
from typing import Literal, get_args

from .errors import ConfigError


def _check_literals(cfg) -> None:
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        allowed = get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is Literal else ()
        if allowed and getattr(cfg, f.name) not in allowed:
            raise ConfigError(f"{f.name} must be one of {', '.join(map(str, allowed))}; "
                              f"got {getattr(cfg, f.name)!r}")


def _check_finite(cfg) -> None:
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value}")


def _check_positive(cfg, *names: str) -> None:
    _check_finite(cfg)
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")


def _check_transformer(cfg, *extra_sizes: str) -> None:
    """Checks every model family shares: sizes positive, heads dividing the width, dropout a
    probability, switches among their allowed values, RoPE's even head size."""
    _check_positive(cfg, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff",
                    "layer_norm_eps", *extra_sizes)
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg.dropout}")
    _check_literals(cfg)
    if cfg.pos_encoding == "rope" and (cfg.n_embd // cfg.n_head) % 2:
        raise ConfigError("rope needs an even head size (n_embd / n_head)")


@dataclass
class GPTConfig:
    """A decoder-only language model (GPT-2 when the defaults are kept)."""

    vocab_size: int = 65
    block_size: int = 256  # context length T
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384  # d_model
    d_ff: int | None = None  # feed-forward width; None = 4 * n_embd
    dropout: float = 0.0
    bias: bool = True
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "learned"
    norm_position: Literal["pre", "post"] = "pre"
    activation: Literal["relu", "gelu", "gelu_tanh"] = "gelu"
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    init: Literal["gpt2", "xavier"] = "gpt2"
    tie_weights: bool = True
    layer_norm_eps: float = 1e-5
    # The paper's sqrt(d_model) embedding scale (section 3.4), with token embeddings drawn at
    # std d_model^-0.5 so that they enter at unit size, as large as sinusoidal positions
    # (GPT-2's std 0.02 embeddings are drowned by them).
    scale_embeddings: bool = False

    def __post_init__(self):
        _check_transformer(self)

    @property
    def ffn_width(self) -> int:
        return self.d_ff or 4 * self.n_embd


@dataclass
class EncoderConfig:
    """A bidirectional encoder (BERT's layout: learned positions, Post-LN, exact GELU)."""

    vocab_size: int = 65
    block_size: int = 128  # longest input (BERT's max_position_embeddings)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128  # d_model
    d_ff: int | None = None  # feed-forward width; None = 4 * n_embd
    dropout: float = 0.0
    bias: bool = True
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "learned"
    norm_position: Literal["pre", "post"] = "post"
    activation: Literal["relu", "gelu", "gelu_tanh"] = "gelu"
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    init: Literal["gpt2", "xavier"] = "gpt2"
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 0  # token-type (segment A/B) embeddings; 0 = none
    embedding_norm: Literal["layernorm", "none"] = "layernorm"  # LayerNorm after the sum
    mlm_head: Literal["bert", "linear", "none"] = "bert"  # masked-LM output head
    tie_weights: bool = True  # MLM head's output matrix = the token embedding
    mask_id: int | None = None  # id of the [MASK] token used in masked-LM training

    def __post_init__(self):
        _check_transformer(self)
        if self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size must not be negative, got {self.type_vocab_size}")
        if self.mask_id is not None and not 0 <= self.mask_id < self.vocab_size:
            raise ConfigError(f"mask_id ({self.mask_id}) must be a token id below vocab_size "
                              f"({self.vocab_size})")

    @property
    def ffn_width(self) -> int:
        return self.d_ff or 4 * self.n_embd


@dataclass
class Seq2SeqConfig:
    """The paper's encoder-decoder; the defaults are its Transformer base (section 3, 5.4).

    One joint source/target vocabulary: a single embedding serves both sides and, with
    ``tie_weights``, the output layer too (section 3.4). ``block_size`` is the longest
    sentence in tokens the position table is sized for (sinusoidal positions extend past it).
    """

    vocab_size: int = 8000
    block_size: int = 256  # longest source or target sentence, in tokens
    n_layer: int = 6  # layers in each stack, unless n_encoder_layer / n_decoder_layer say
    n_encoder_layer: int | None = None
    n_decoder_layer: int | None = None
    n_head: int = 8
    n_embd: int = 512  # d_model
    d_ff: int | None = None  # None = 4 * n_embd (2048 in the paper)
    dropout: float = 0.1
    bias: bool = True
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "sinusoidal"
    norm_position: Literal["pre", "post"] = "post"
    activation: Literal["relu", "gelu", "gelu_tanh"] = "relu"
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    init: Literal["gpt2", "xavier"] = "xavier"
    tie_weights: bool = True
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (section 3.4)
    label_smoothing: float = 0.1  # epsilon_ls (section 5.4)
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        _check_transformer(self, "n_encoder_layer", "n_decoder_layer")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        ids = (self.pad_id, self.bos_id, self.eos_id)
        if len(set(ids)) < 3 or not all(0 <= i < self.vocab_size for i in ids):
            raise ConfigError(f"pad_id, bos_id and eos_id must be distinct ids below "
                              f"vocab_size ({self.vocab_size}); got {ids}")

    @property
    def ffn_width(self) -> int:
        return self.d_ff or 4 * self.n_embd

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layer or self.n_layer

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layer or self.n_layer


@dataclass
class TrainConfig:
    """The training loop's settings; names as in nanoGPT's train.py."""

    batch_size: int = 12
    max_iters: int = 2000
    eval_interval: int = 250
    eval_iters: int = 200
    log_interval: int = 10
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    grad_accum: int = 1
    seed: int = 1337
    time_budget: float | None = None  # seconds of training (evaluation excluded)
    lr_schedule: Literal["cosine", "noam"] = "cosine"  # noam: the paper's, section 5.3
    keep_last: int = 3  # how many recent checkpoints stay in checkpoints/
    sample_tokens: int = 200  # length of the sample printed at each evaluation
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self):
        _check_positive(self, "batch_size", "max_iters", "eval_interval", "eval_iters",
                        "log_interval", "learning_rate", "grad_accum", "time_budget",
                        "keep_last")
        for name in ("min_lr", "warmup_iters", "weight_decay", "grad_clip", "sample_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        _check_literals(self)


def parse_duration(text: str | float | int) -> float:
    """'120s', '5m', '1h', '90' -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m:
        raise ConfigError(f"cannot read the duration {text!r}: write e.g. 120s, 5m or 1h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


PRESETS: dict[str, dict[str, dict]] = {
    "gpt": {
        # Seconds on a laptop: for tests and a first look.
        "debug": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=16,
                      max_iters=200, eval_interval=100, eval_iters=20, learning_rate=3e-3,
                      min_lr=3e-4, warmup_iters=20, weight_decay=0.0, sample_tokens=80),
        # About two minutes of training on 2 CPU cores (the `make demo` model), tuned by
        # 120-s runs on Tiny Shakespeare (docs/BENCHMARKS.md): in that time 3 layers beat 4
        # (more steps), ReLU (the paper's FFN) beats GELU, and batches of 32 at lr 5e-3 beat
        # 16 at 3e-3; val loss about 1.60 with bf16 autocast.
        "cpu-small": dict(n_layer=3, n_head=4, n_embd=128, block_size=64, batch_size=32,
                          max_iters=100_000, time_budget=120.0, eval_interval=500,
                          eval_iters=200, learning_rate=5e-3, min_lr=1e-4, warmup_iters=100,
                          beta2=0.99, weight_decay=0.1, dropout=0.0, activation="relu"),
        # nanoGPT's shakespeare-char GPU config.
        "shakespeare-char": dict(n_layer=6, n_head=6, n_embd=384, block_size=256,
                                 batch_size=64, dropout=0.2, max_iters=5000,
                                 eval_interval=250, learning_rate=1e-3, min_lr=1e-4,
                                 warmup_iters=100, beta2=0.99),
        # GPT-2 small: 124,439,808 parameters with vocab_size 50257 and tied weights.
        "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024,
                          vocab_size=50257, bias=True, tie_weights=True, dropout=0.0,
                          activation="gelu_tanh", pos_encoding="learned",
                          norm_position="pre", batch_size=8, learning_rate=6e-4,
                          min_lr=6e-5, warmup_iters=2000, max_iters=600_000,
                          weight_decay=0.1, beta2=0.95),
    },
    # The bidirectional encoder, trained as a masked language model (BERT's task #1).
    "encoder": {
        # Seconds: for tests and a first look.
        "debug": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=32,
                      max_iters=200, eval_interval=100, eval_iters=20, learning_rate=3e-3,
                      min_lr=3e-4, warmup_iters=20, weight_decay=0.0, sample_tokens=32),
        # About two minutes of training on 2 CPU cores.
        "cpu-small": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16,
                          max_iters=100_000, time_budget=120.0, eval_interval=500,
                          eval_iters=50, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                          weight_decay=0.01, beta2=0.999, sample_tokens=96),
        # BERT-base (Devlin et al. 2019, appendix A.2): 12 layers, 768 wide, 12 heads,
        # sequences of 512, dropout 0.1, Adam lr 1e-4 with 10,000 warmup steps, decay 0.01.
        "bert-base": dict(n_layer=12, n_head=12, n_embd=768, d_ff=3072, block_size=512,
                          type_vocab_size=2, dropout=0.1, batch_size=256, max_iters=1_000_000,
                          learning_rate=1e-4, min_lr=0.0, warmup_iters=10_000,
                          weight_decay=0.01, beta1=0.9, beta2=0.999, eval_interval=2000),
    },
    # The encoder-decoder. batch_tokens / train_max_len belong to parallel.ParallelDataConfig.
    "seq2seq": {
        # Seconds: for tests and a first look (it will not translate well).
        "debug": dict(n_layer=2, n_head=2, n_embd=64, d_ff=128, vocab_size=1000, dropout=0.1,
                      batch_size=64, batch_tokens=1024, train_max_len=48, max_iters=100,
                      eval_interval=50, eval_iters=5, learning_rate=2e-3, min_lr=2e-4,
                      warmup_iters=20, weight_decay=0.0, beta2=0.98, sample_tokens=40),
        # 15 minutes of training on 2 CPU cores (15 min 17 s with set-up and evaluation). Sized
        # for that budget; short runs on 1 thread (BLEU with beam 4 on 200 valid pairs):
        # in equal time a small model (1.9M parameters) beats a wider one that sees fewer
        # tokens (d_model 128: 8.4, 192: 4.1), and for the same 2.2M target tokens many
        # small batches beat fewer large ones (1,200 tokens per batch: 12.6; 2,000: 11.6;
        # 3,000: 8.4). No dropout: at this budget the model underfits. The 15-minute run
        # sees about 3x the tokens of those runs.
        "cpu-small": dict(n_layer=3, n_head=4, n_embd=128, d_ff=512, vocab_size=4000,
                          dropout=0.0, batch_size=256, batch_tokens=1200, train_max_len=80,
                          max_iters=1_000_000, time_budget=900.0, eval_interval=1000,
                          eval_iters=20, learning_rate=2e-3, min_lr=1e-4, warmup_iters=200,
                          weight_decay=0.0, beta1=0.9, beta2=0.98, grad_clip=1.0,
                          sample_tokens=60),
        # The paper's base model (sections 5.1-5.4): 6+6 layers, d_model 512, 8 heads,
        # d_ff 2048, dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98), the noam schedule
        # with 4000 warmup steps, about 25,000 source + 25,000 target tokens per step.
        "base": dict(n_layer=6, n_head=8, n_embd=512, d_ff=2048, vocab_size=8000,
                     dropout=0.1, label_smoothing=0.1, batch_size=4096, batch_tokens=25000,
                     train_max_len=128, lr_schedule="noam", warmup_iters=4000,
                     max_iters=100_000, eval_interval=1000, eval_iters=50, beta1=0.9,
                     beta2=0.98, weight_decay=0.0, grad_clip=0.0, sample_tokens=80),
    },
}


def field_names(cls) -> list[str]:
    return [f.name for f in fields(cls)]


def closest(name: str, choices) -> str:
    """' (did you mean X?)' or ''."""
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {match[0]}?)" if match else ""


def split_fields(values: dict, *classes) -> list[dict]:
    """Split a flat {field: value} mapping between config classes; unknown keys are errors."""
    parts = [{} for _ in classes]
    known = {}
    for i, cls in enumerate(classes):
        for name in field_names(cls):
            known.setdefault(name, i)
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown config field {key!r}{closest(key, known)}")
        parts[known[key]][key] = value
    return parts


def get_preset(family: str, name: str) -> dict:
    presets = PRESETS.get(family, {})
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r} for {family}{closest(name, presets)}; "
                          f"choose from {', '.join(presets)}")
    return dict(presets[name])


def config_from_dict(cls, values: dict):
    """Build a config from a dict (e.g. config.json), rejecting unknown keys."""
    names = field_names(cls)
    for key in values:
        if key not in names:
            raise ConfigError(f"unknown {cls.__name__} field {key!r}{closest(key, names)}")
    try:
        return cls(**values)
    except TypeError as e:  # wrong value types from a hand-edited file
        raise ConfigError(f"bad {cls.__name__}: {e}") from None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
