"""Load Hugging Face checkpoint folders into our models, and write our GPT as a GPT-2, Llama
or Qwen3 folder.

    load_hf("path/to/gpt2")        -> GPT            (model_type "gpt2")
    load_hf("path/to/llama")       -> GPT            (model_type "llama": RMSNorm, SwiGLU, RoPE)
    load_hf("path/to/qwen3")       -> GPT            (model_type "qwen3": Llama + QK-norm)
    load_hf("path/to/minilm")      -> EncoderModel   (model_type "bert")
    save_hf(gpt, "out/", tok)      -> config.json + model.safetensors for GPT2LMHeadModel
                                      or LlamaForCausalLM,
                                      generation_config.json, and with ``tok`` the tokenizer
                                      files AutoTokenizer loads (see interop/tokenizer.py)
    check_export_folder("out/")    -> refuses a file, or a folder already holding any of
                                      EXPORT_FILES (unless force), before anything is written

Everything is local: a folder on disk, read without unpickling, nothing downloaded.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from ..errors import UserError
from ..io import atomic_write, atomic_write_json, atomic_write_text, is_run_config
from ..models import GPT, EncoderModel
from . import bert, gpt2, llama
from .tokenizer import exported_tokenizer
from .weights import hf_folder, load_mapped, read_hf_config, read_hf_weights

SUPPORTED = ("gpt2", "llama", "qwen3", "bert")
ARCHITECTURES = {"GPT2": "gpt2", "Llama": "llama", "Qwen3": "qwen3",
                 "Bert": "bert"}  # class name -> model_type
# every file save_hf may write: its own three, then those of ExportedTokenizer.files
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")


def model_type(hf_config: dict) -> str:
    kind = hf_config.get("model_type")
    if kind is None:  # very old files name only the class
        arch = " ".join(hf_config.get("architectures") or [])
        kind = next((t for name, t in ARCHITECTURES.items() if name in arch), None)
    if kind not in SUPPORTED:
        raise UserError(f"model_type {kind!r} is not supported; minitransformer loads "
                        f"{', '.join(SUPPORTED[:-1])} and {SUPPORTED[-1]} checkpoints")
    return kind


def hf_model_class(path) -> type:
    """The class ``load_hf`` builds from the folder (``GPT`` or ``EncoderModel``), from its
    config alone."""
    hf_config = read_hf_config(hf_folder(path))
    if is_run_config(hf_config):
        raise UserError(f"{path} holds a minitransformer run, not a Hugging Face model")
    return EncoderModel if model_type(hf_config) == "bert" else GPT


def load_hf(path, device="cpu"):
    """Read a local Hugging Face folder (config.json + model.safetensors) into our model.

    GPT-2, Llama and Qwen3 folders give a ``GPT``, BERT folders an ``EncoderModel``; returned in
    eval mode.
    """
    folder = hf_folder(path)
    hf_config = read_hf_config(folder)
    if is_run_config(hf_config):
        raise UserError(f"{path} holds a minitransformer run, not a Hugging Face model")
    kind = model_type(hf_config)
    check_sizes(hf_config, folder)
    weights = read_hf_weights(folder)
    arch = gpt2 if kind == "gpt2" else llama if kind in ("llama", "qwen3") else bert
    try:  # reading the values (llama.py reads both Llama and Qwen3); sizes checked above
        config = arch.config_from_hf(hf_config, weights) if arch is bert else \
            arch.config_from_hf(hf_config)
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{folder / 'config.json'}: a value in it cannot be used ({e})") from None
    model = (EncoderModel if arch is bert else GPT)(config)
    state = arch.state_from_hf(weights, config)
    load_mapped(model, state, str(folder))
    return model.to(device).eval()


SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "intermediate_size", "max_position_embeddings", "head_dim",
         "n_embd", "n_layer", "n_head", "n_positions", "n_inner")


def check_sizes(hf_config: dict, folder: Path) -> None:
    """Each size a config.json sets is a positive whole number (or null where a default
    applies), said by name before anything is built from it."""
    for key in SIZES:
        value = hf_config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise UserError(f"{folder / 'config.json'} sets {key}={value!r}; it must be a "
                            f"positive whole number")


def save_hf(model, path, tokenizer=None, roles: dict[str, str] | None = None,
            positions: int | None = None) -> Path:
    """Write our ``GPT`` as a folder that ``AutoModelForCausalLM.from_pretrained`` loads:
    a ``LlamaForCausalLM`` when the GPT is Llama-shaped (see ``architecture``;
    ``Qwen3ForCausalLM`` with qk_norm), else a ``GPT2LMHeadModel``.

    Raises ``UserError`` when the model's options fit neither (sinusoidal positions, Post-LN,
    ...). ``tokenizer`` (char, BPE or one read by ``load_hf_tokenizer``) is saved with the
    same ids as tokenizer.json, tokenizer_config.json and special_tokens_map.json
    (``AutoTokenizer.from_pretrained`` loads them); its special tokens give config.json and
    generation_config.json their bos / eos ids; ``roles`` ({"eos_token": "<|im_end|>", ...}):
    those of the folder the run started from, where they differ from the names' usual roles
    (``exported_tokenizer``); ``positions``: the source folder's max_position_embeddings,
    written for a RoPE model trained on shorter windows (it has no table to cut), so the
    folder reads as far as the one it came from. Files already in ``path`` of those names are
    replaced, others left alone; callers that must not replace them call
    ``check_export_folder`` first, as ``export`` does.
    """
    if not isinstance(model, GPT):
        raise UserError(f"only a GPT can be written as GPT-2, Llama or Qwen3, not a "
                        f"{type(model).__name__}")
    folder = check_export_folder(path, force=True)  # only a file is refused here
    arch = architecture(model.config)
    hf_config = arch.config_to_hf(model.config)
    reach = model.config.block_size
    if positions and model.config.pos_encoding == "rope":
        reach = hf_config["max_position_embeddings"] = max(reach, positions)
    tok = None if tokenizer is None else exported_tokenizer(tokenizer, roles)
    files, generation = _tokenizer_files(tok, model.config, reach)
    hf_config.update(generation)
    tensors = arch.state_to_hf(model.state_dict(), model.config)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a parent that is a file, no permission, ...
        raise UserError(f"cannot create the folder {folder}: {e.strerror or e}") from None
    atomic_write(folder / "model.safetensors",
                 lambda tmp: save_file(tensors, tmp, {"format": "pt"}))
    atomic_write_json(folder / "config.json", hf_config)
    atomic_write_json(folder / "generation_config.json", generation)
    for name, content in files.items():
        write = atomic_write_text if isinstance(content, str) else atomic_write_json
        write(folder / name, content)
    return folder


def check_export_folder(path, force: bool = False) -> Path:
    """Refuse, before anything is written, a ``path`` that ``save_hf`` should not write into:
    a file (a folder is needed), or a folder that already holds any of ``EXPORT_FILES``
    unless ``force`` (``save_hf`` then replaces them). Other files in the folder are left
    alone either way. Returns the folder as a ``Path``."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file; give a folder to write the Hugging Face files "
                        f"into")
    there = [name for name in EXPORT_FILES if (folder / name).exists()]
    if there and not force:
        raise UserError(f"{folder} already holds {', '.join(there)}; pass --force to replace "
                        f"them, or choose another folder")
    return folder


def architecture(config):
    """The module that writes a GPT of ``config``: ``llama`` for RMSNorm + SwiGLU + RoPE +
    Pre-LN without biases (QK-norm: a Qwen3), else ``gpt2``; refuses, saying why, a GPT that
    fits neither."""
    wrong = llama.mismatches(config)
    if not wrong:
        return llama
    try:
        gpt2.config_to_hf(config)
    except UserError as e:
        raise UserError(f"{e}; nor as Llama: {'; '.join(wrong)}") from None
    return gpt2


def _tokenizer_files(tok, config, max_length: int) -> tuple[dict, dict]:
    """(tokenizer files by name, generation_config.json) for a model of ``config``.

    ``generate`` stops at eos_token_id and pads with pad_token_id (the eos token when there is
    no pad token, which ``generate`` would otherwise pick itself with a warning). A char
    tokenizer has no special tokens: no bos or eos, ``generate`` writes every new token it is
    asked for.
    """
    generation = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if tok is None:
        return {}, generation
    size = tok.tokenizer.get_vocab_size(with_added_tokens=True)
    if size > config.vocab_size:
        raise UserError(f"the tokenizer has {size:,} tokens but the model only "
                        f"{config.vocab_size:,}: they do not belong together")
    bos, eos = tok.token_id("bos_token"), tok.token_id("eos_token")
    pad = tok.token_id("pad_token")
    generation.update(bos_token_id=bos, eos_token_id=eos,
                      pad_token_id=pad if pad is not None else eos)
    return tok.files(max_length), generation


def describe(model) -> str:
    """One line about a loaded model (for the CLI)."""
    c = model.config
    kind = "GPT" if isinstance(model, GPT) else "encoder"
    parts = [getattr(c, name, None) for name in ("pos_encoding", "norm", "activation")]
    parts += ["qk-norm"] if getattr(c, "qk_norm", False) else []  # Qwen3's
    kind += f" ({', '.join(p for p in parts if isinstance(p, str))})"  # Llama's: rope, rmsnorm
    return (f"{kind}: {model.num_params():,} parameters, {c.n_layer} layers, {c.n_head} heads, "
            f"{c.n_embd} wide, context {c.block_size}, vocabulary {c.vocab_size:,}")


__all__ = ["EXPORT_FILES", "check_export_folder", "describe", "load_hf", "save_hf"]
