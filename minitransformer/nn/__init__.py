"""The Transformer's layers, one module per concept (see docs/transformer-tour.md)."""

from .attention import MultiHeadAttention, scaled_dot_product_attention
from .beam_cache import BeamCache
from .block import Decoder, DecoderBlock, Encoder, EncoderBlock, Internals
from .feedforward import FeedForward
from .kv_cache import KVCache, StoragePool
from .mask import causal_mask, key_padding_mask, padding_mask
from .positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
)

__all__ = [
    "ALiBi", "BeamCache", "Decoder", "DecoderBlock", "Encoder", "EncoderBlock", "FeedForward",
    "Internals", "KVCache", "LearnedPositionalEmbedding", "MultiHeadAttention",
    "RotaryEmbedding", "SinusoidalPositionalEncoding", "StoragePool", "alibi_slopes",
    "causal_mask", "key_padding_mask", "padding_mask", "scaled_dot_product_attention",
]
