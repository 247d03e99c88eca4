"""Interoperability with Hugging Face checkpoints: GPT-2, Llama, Qwen3 and BERT folders in;
GPT-2, Llama or Qwen3 out.

    from minitransformer.interop import load_hf, load_hf_tokenizer, save_hf
    model = load_hf("path/to/all-MiniLM-L6-v2")      # an EncoderModel with BERT's weights
"""

from .hf import describe, hf_model_class, load_hf, save_hf
from .tokenizer import HFTokenizer, load_hf_tokenizer

__all__ = ["HFTokenizer", "describe", "hf_model_class", "load_hf", "load_hf_tokenizer",
           "save_hf"]
