"""minitransformer: the Transformer of "Attention Is All You Need", written from scratch.

    from minitransformer import GPT, GPTConfig, load_checkpoint
    model, tokenizer = load_checkpoint("runs/shakespeare")
"""

from .config import EncoderConfig, GPTConfig, Seq2SeqConfig, TrainConfig
from .errors import UserError
from .families import FAMILIES, load_checkpoint, load_run
from .interop import load_hf, save_hf
from .models import GPT
from .models.encoder import EncoderModel
from .models.seq2seq import Seq2SeqTransformer
from .nn import MultiHeadAttention, scaled_dot_product_attention
from .tokenizers import BPETokenizer, CharTokenizer

__version__ = "0.1.0"

PRESETS = {name: family.presets for name, family in FAMILIES.items()}

__all__ = ["FAMILIES", "GPT", "PRESETS", "BPETokenizer", "CharTokenizer", "EncoderConfig",
           "EncoderModel", "GPTConfig", "MultiHeadAttention", "Seq2SeqConfig",
           "Seq2SeqTransformer", "TrainConfig", "UserError", "load_checkpoint", "load_hf",
           "load_run", "save_hf", "scaled_dot_product_attention"]
