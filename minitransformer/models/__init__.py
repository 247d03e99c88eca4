"""The models: decoder-only GPT, the bidirectional encoder, the paper's encoder-decoder."""

from ..config import EncoderConfig, GPTConfig, Seq2SeqConfig
from .encoder import EncoderModel
from .gpt import GPT
from .seq2seq import Seq2SeqTransformer

__all__ = ["GPT", "EncoderConfig", "EncoderModel", "GPTConfig", "Seq2SeqConfig",
           "Seq2SeqTransformer"]
