"""Typed configs: one dataclass per model family, and the training loop's.

``GPTConfig``, ``EncoderConfig`` and ``Seq2SeqConfig`` describe models; ``TrainConfig`` the
training loop, whose field names follow nanoGPT's. The docstring under each field is its
help text (``--help`` shows it). Impossible values fail at construction with a message.
The named presets are in ``presets.py``.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from dataclasses import dataclass, fields
from typing import Literal, get_args

from .errors import ConfigError

SEED_LIMIT = 2 ** 63  # seeds are 0 .. 2**63 - 1 everywhere; seed + i must fit torch's 64 bits


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


def _check_modern(cfg) -> None:
    """The switches of later models (GPT): grouped heads dividing the heads, a positive cap."""
    _check_positive(cfg, "n_kv_head", "logit_softcap", "rope_base")
    if cfg.n_kv_head is not None and cfg.n_head % cfg.n_kv_head:
        raise ConfigError(f"n_kv_head ({cfg.n_kv_head}) must divide n_head ({cfg.n_head})")


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
    """vocabulary size: with --tokenizer bpe the number of entries to learn (default 1024;
    seq2seq: its preset's), otherwise set from the tokenizer"""
    block_size: int = 256
    """context length T in tokens"""
    n_layer: int = 6
    """number of Transformer blocks"""
    n_head: int = 6
    """attention heads per block"""
    n_embd: int = 384  # d_model
    """model width d_model (divisible by n_head)"""
    d_ff: int | None = None
    """feed-forward width (default 4 * n_embd; 2/3 of that, rounded up to a multiple of 8,
    for swiglu; a preset's d_ff stays under another --n_embd)"""
    dropout: float = 0.0
    """dropout probability (0 = none)"""
    bias: bool = True
    """biases in linear layers and LayerNorms"""
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "learned"
    """how positions enter the model"""
    norm_position: Literal["pre", "post"] = "pre"
    """LayerNorm before (pre, GPT) or after (post, the paper) each sublayer"""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """every norm of the model: LayerNorm (Ba et al. 2016) or RMSNorm, x / sqrt(mean(x^2) +
    eps) * g (Zhang & Sennrich 2019; Llama)"""
    activation: Literal["relu", "gelu", "gelu_tanh", "relu2", "swiglu"] = "gelu"
    """feed-forward activation: relu (the paper), gelu, gelu_tanh (GPT-2), relu2 = relu(x)^2
    (So et al. 2021), swiglu = (SiLU(x W_g) * x W_1) W_2, a gated FFN (Shazeer 2020; Llama)"""
    qk_norm: bool = False
    """RMSNorm over the head size on every query and key, before RoPE (Dehghani et al. 2023;
    Qwen3)"""
    n_kv_head: int | None = None
    """key/value heads (default n_head): fewer gives grouped-query attention (Ainslie et al.
    2023), 1 multi-query attention (Shazeer 2019); the KV cache shrinks by n_head / n_kv_head"""
    logit_softcap: float | None = None
    """soft-cap the output logits, cap * tanh(logits / cap) (Gemma 2; modded-nanogpt); none =
    off"""
    rope_base: float = 10000.0
    """RoPE's base theta: position p turns channel pair c by p * theta^(-2c / head size)"""
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    """attention path: reference (explicit softmax), fast (PyTorch's fused kernel), or auto
    (whichever is faster for the device and dtype)"""
    init: Literal["gpt2", "xavier"] = "gpt2"
    """weight initialisation: GPT-2 normal(0.02) or the paper's Xavier uniform"""
    tie_weights: bool = True
    """share the token embedding with the output layer"""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon"""
    # The paper's sqrt(d_model) embedding scale (section 3.4), with token embeddings drawn at
    # std d_model^-0.5 so that they enter at unit size, as large as sinusoidal positions
    # (GPT-2's std 0.02 embeddings are drowned by them).
    scale_embeddings: bool = False
    """multiply token embeddings by sqrt(n_embd) (the paper)"""

    def __post_init__(self):
        _check_transformer(self)
        _check_modern(self)

    @property
    def ffn_width(self) -> int:
        """d_ff if set; else 4 * n_embd, or 2/3 of that rounded up to a multiple of 8 for the
        three-matrix SwiGLU (as many parameters as a 4 * n_embd two-matrix FFN)."""
        if self.d_ff:
            return self.d_ff
        return -(-(8 * self.n_embd) // 24) * 8 if self.activation == "swiglu" else 4 * self.n_embd


@dataclass
class EncoderConfig:
    """A bidirectional encoder (BERT's layout: learned positions, Post-LN, exact GELU)."""

    vocab_size: int = 65
    """vocabulary size (set from the tokenizer when training)"""
    block_size: int = 128
    """longest input (BERT's max_position_embeddings)"""
    n_layer: int = 4
    """number of Transformer blocks"""
    n_head: int = 4
    """attention heads per block"""
    n_embd: int = 128  # d_model
    """model width d_model (divisible by n_head)"""
    d_ff: int | None = None
    """feed-forward width (default 4 * n_embd; a preset's stays under another --n_embd)"""
    dropout: float = 0.0
    """dropout probability (0 = none)"""
    bias: bool = True
    """biases in linear layers and LayerNorms"""
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "learned"
    """how positions enter the model"""
    norm_position: Literal["pre", "post"] = "post"
    """LayerNorm before (pre, GPT) or after (post, the paper) each sublayer"""
    activation: Literal["relu", "gelu", "gelu_tanh"] = "gelu"
    """feed-forward activation"""
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    """attention path: reference (explicit softmax), fast (PyTorch's fused kernel), or auto
    (whichever is faster for the device and dtype)"""
    init: Literal["gpt2", "xavier"] = "gpt2"
    """weight initialisation: GPT-2 normal(0.02) or the paper's Xavier uniform"""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon"""
    type_vocab_size: int = 0
    """token-type (segment) embeddings, 0 = none"""
    embedding_norm: Literal["layernorm", "none"] = "layernorm"  # LayerNorm after the sum
    """LayerNorm on the summed embeddings, as BERT"""
    mlm_head: Literal["bert", "linear", "none"] = "bert"
    """masked-LM output: BERT's dense+GELU+LayerNorm transform, a plain linear layer, or none
    (an embedding model)"""
    tie_weights: bool = True  # MLM head's output matrix = the token embedding
    """share the token embedding with the output layer"""
    mask_id: int | None = None
    """id of the [MASK] token (set from the tokenizer)"""

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
    """vocabulary size (set from the tokenizer when training)"""
    block_size: int = 256
    """longest source or target sentence, in tokens"""
    n_layer: int = 6  # layers in each stack, unless n_encoder_layer / n_decoder_layer say
    """number of Transformer blocks"""
    n_encoder_layer: int | None = None
    """encoder layers (default n_layer)"""
    n_decoder_layer: int | None = None
    """decoder layers (default n_layer)"""
    n_head: int = 8
    """attention heads per block"""
    n_embd: int = 512  # d_model
    """model width d_model (divisible by n_head)"""
    d_ff: int | None = None  # None = 4 * n_embd (2048 in the paper)
    """feed-forward width (default 4 * n_embd; a preset's stays under another --n_embd)"""
    dropout: float = 0.1
    """dropout probability (0 = none)"""
    bias: bool = True
    """biases in linear layers and LayerNorms"""
    pos_encoding: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "sinusoidal"
    """how positions enter the model"""
    norm_position: Literal["pre", "post"] = "post"
    """LayerNorm before (pre, GPT) or after (post, the paper) each sublayer"""
    activation: Literal["relu", "gelu", "gelu_tanh"] = "relu"
    """feed-forward activation"""
    attn_impl: Literal["auto", "reference", "fast"] = "auto"
    """attention path: reference (explicit softmax), fast (PyTorch's fused kernel), or auto
    (whichever is faster for the device and dtype)"""
    init: Literal["gpt2", "xavier"] = "xavier"
    """weight initialisation: GPT-2 normal(0.02) or the paper's Xavier uniform"""
    tie_weights: bool = True
    """share the token embedding with the output layer"""
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (section 3.4)
    """multiply token embeddings by sqrt(n_embd) (the paper)"""
    label_smoothing: float = 0.1  # epsilon_ls (section 5.4)
    """label smoothing epsilon of the training loss (the paper: 0.1)"""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon"""
    pad_id: int = 0
    """padding id (set from the tokenizer)"""
    bos_id: int = 1
    """<s> id (set from the tokenizer)"""
    eos_id: int = 2
    """</s> id (set from the tokenizer)"""

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
    """sequences per optimizer step (global)"""
    max_iters: int = 2000
    """optimizer steps to train for"""
    eval_interval: int = 250
    """evaluate, sample and checkpoint every N steps"""
    eval_iters: int = 200
    """batches averaged for the val loss"""
    log_interval: int = 10
    """log train loss every N steps"""
    learning_rate: float = 1e-3
    """peak learning rate"""
    min_lr: float = 1e-4
    """learning rate at the end of the cosine decay"""
    warmup_iters: int = 100
    """linear warmup steps"""
    weight_decay: float = 0.1
    """AdamW weight decay (matrices only)"""
    beta1: float = 0.9
    """AdamW beta1"""
    beta2: float = 0.99
    """AdamW beta2"""
    grad_clip: float = 1.0
    """clip the gradient norm to this (0 = off)"""
    grad_accum: int = 1
    """split each step into this many micro-batches"""
    seed: int = 1337
    """random seed (weights, data order, dropout)"""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw for every parameter, or muon: Muon (Jordan et al. 2024, torch.optim.Muon) for the
    2-D matrices inside the blocks, AdamW for embeddings, the output head, norms and biases"""
    muon_lr: float | None = None
    """Muon's peak learning rate, scaled by the schedule as learning_rate is (default 0.02;
    only with --optimizer muon)"""
    muon_momentum: float | None = None
    """Muon's Nesterov momentum (default 0.95; only with --optimizer muon)"""
    time_budget: float | None = None
    """train for this long (e.g. 120s, 5m), evaluation excluded; none: max_iters decides"""
    lr_schedule: Literal["cosine", "noam"] = "cosine"
    """cosine: warmup + cosine decay; noam: the paper's d^-0.5 min(s^-0.5, s w^-1.5)
    (section 5.3)"""
    keep_last: int = 3
    """recent checkpoints kept in checkpoints/"""
    log: Literal["csv", "tensorboard"] = "csv"
    """log.csv always; tensorboard also writes TensorBoard event files to RUN/tensorboard/
    (tensorboard --logdir RUN)"""
    sample_tokens: int = 200
    """length of the sample printed at each evaluation (0 = none)"""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """auto picks cuda, then mps, then cpu"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bf16 autocast on GPUs and CPUs with native bf16, fp16 on older GPUs, fp32
    elsewhere (weights stay fp32)"""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile the model (auto = on CUDA)"""
    shard: bool = False
    """under torchrun: shard parameters, gradients and AdamW state over the processes (FSDP2)
    instead of a full copy on each (DDP); the checkpoints are the same"""

    def __post_init__(self):
        _check_positive(self, "batch_size", "max_iters", "eval_interval", "eval_iters",
                        "log_interval", "learning_rate", "grad_accum", "time_budget",
                        "keep_last", "muon_lr")
        for name in ("min_lr", "warmup_iters", "weight_decay", "grad_clip", "sample_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"seed must be from 0 to 2**63 - 1, got {self.seed}")
        for name in ("beta1", "beta2", "muon_momentum"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        _check_literals(self)
        for name in ("muon_lr", "muon_momentum"):
            if self.optimizer != "muon" and getattr(self, name) is not None:
                raise ConfigError(f"{name} applies to --optimizer muon only (this run uses "
                                  f"{self.optimizer})")


def parse_duration(text: str | float | int) -> float:
    """'120s', '5m', '1h', '90' -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    if not (m := re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))):
        why = "must not be negative" if str(text).strip().startswith("-") else "cannot be read"
        raise ConfigError(f"the duration {text!r} {why}: write e.g. 120s, 5m or 1h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


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
