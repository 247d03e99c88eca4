"""Load Hugging Face checkpoint folders into our models, and write our GPT as a GPT-2 or Llama
folder.

    load_hf("path/to/gpt2")        -> GPT            (model_type "gpt2")
    load_hf("path/to/llama")       -> GPT            (model_type "llama": RMSNorm, SwiGLU, RoPE)
    load_hf("path/to/minilm")      -> EncoderModel   (model_type "bert")
    save_hf(gpt, "out/")           -> config.json + model.safetensors for GPT2LMHeadModel
                                      or LlamaForCausalLM

Everything is local: a folder on disk, read without unpickling, nothing downloaded.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from ..errors import UserError
from ..io import atomic_write, atomic_write_json
from ..models import GPT, EncoderModel
from . import bert, gpt2, llama
from .tokenizer import char_tokenizer_as_hf
from .weights import hf_folder, load_mapped, read_hf_config, read_hf_weights

SUPPORTED = ("gpt2", "llama", "bert")
ARCHITECTURES = {"GPT2": "gpt2", "Llama": "llama", "Bert": "bert"}  # class name -> model_type


def model_type(hf_config: dict) -> str:
    kind = hf_config.get("model_type")
    if kind is None:  # very old files name only the class
        arch = " ".join(hf_config.get("architectures") or [])
        kind = next((t for name, t in ARCHITECTURES.items() if name in arch), None)
    if kind not in SUPPORTED:
        raise UserError(f"model_type {kind!r} is not supported; minitransformer loads "
                        f"{', '.join(SUPPORTED[:-1])} and {SUPPORTED[-1]} checkpoints")
    return kind


def load_hf(path, device="cpu"):
    """Read a local Hugging Face folder (config.json + model.safetensors) into our model.

    GPT-2 and Llama folders give a ``GPT``, BERT folders an ``EncoderModel``; returned in
    eval mode.
    """
    folder = hf_folder(path)
    hf_config = read_hf_config(folder)
    kind = model_type(hf_config)
    weights = read_hf_weights(folder)
    if kind in ("gpt2", "llama"):
        arch = gpt2 if kind == "gpt2" else llama
        config = arch.config_from_hf(hf_config)
        model = GPT(config)
        state = arch.state_from_hf(weights, config)
    else:
        config = bert.config_from_hf(hf_config, weights)
        model = EncoderModel(config)
        state = bert.state_from_hf(weights, config)
    load_mapped(model, state, str(folder))
    return model.to(device).eval()


def save_hf(model, path, tokenizer=None) -> Path:
    """Write our ``GPT`` as a folder that ``AutoModelForCausalLM.from_pretrained`` loads:
    a ``LlamaForCausalLM`` when the GPT is Llama-shaped (see ``architecture``), else a
    ``GPT2LMHeadModel``.

    Raises ``UserError`` when the model's options fit neither (sinusoidal positions, Post-LN,
    ...). ``tokenizer`` (char, BPE or one read by
    ``load_hf_tokenizer``) is saved as tokenizer.json with the same ids.
    """
    if not isinstance(model, GPT):
        raise UserError(f"only a GPT can be written as GPT-2 or Llama, not a "
                        f"{type(model).__name__}")
    arch = architecture(model.config)
    hf_config = arch.config_to_hf(model.config)
    tok_json = None
    if tokenizer is not None:
        inner = getattr(tokenizer, "tokenizer", None) or getattr(tokenizer, "hf", None)
        if getattr(tokenizer, "kind", "") == "char":
            inner = char_tokenizer_as_hf(tokenizer.chars)
        if not hasattr(inner, "to_str"):  # not a tokenizers.Tokenizer inside
            raise UserError(f"a {type(tokenizer).__name__} cannot be written as a Hugging Face "
                            f"tokenizer.json")
        tok_json = inner.to_str()
    tensors = arch.state_to_hf(model.state_dict(), model.config)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "model.safetensors",
                 lambda tmp: save_file(tensors, tmp, {"format": "pt"}))
    atomic_write_json(folder / "config.json", hf_config)
    if tok_json is not None:
        atomic_write(folder / "tokenizer.json",
                     lambda tmp: Path(tmp).write_text(tok_json, encoding="utf-8"))
    return folder


def architecture(config):
    """The module that writes a GPT of ``config``: ``llama`` for RMSNorm + SwiGLU + RoPE +
    Pre-LN without biases, else ``gpt2``; refuses, saying why, a GPT that fits neither."""
    wrong = llama.mismatches(config)
    if not wrong:
        return llama
    try:
        gpt2.config_to_hf(config)
    except UserError as e:
        raise UserError(f"{e}; nor as Llama: {'; '.join(wrong)}") from None
    return gpt2


def describe(model) -> str:
    """One line about a loaded model (for the CLI)."""
    c = model.config
    kind = "GPT" if isinstance(model, GPT) else "encoder"
    return (f"{kind}: {model.num_params():,} parameters, {c.n_layer} layers, {c.n_head} heads, "
            f"{c.n_embd} wide, context {c.block_size}, vocabulary {c.vocab_size:,}")


__all__ = ["describe", "load_hf", "save_hf"]
