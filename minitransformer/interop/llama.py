"""Llama (Hugging Face ``LlamaForCausalLM``) and Qwen3 (``Qwen3ForCausalLM``) <-> our ``GPT``:
config fields and weight names.

Llama is our GPT with RMSNorm in every norm (the final one included), the SwiGLU feed-forward,
RoPE, Pre-LN, no biases and (optionally) grouped-query attention; the head is untied unless
``tie_word_embeddings``. The layouts agree, so every tensor is copied as it is:

- the linear layers are ``nn.Linear`` (out, in), as ours;
- RoPE turns channel pair (c, c + hs/2) of each head, as ours (``rotate_half``), so the
  query and key rows need no permutation;
- key/value head j serves query heads j*g .. j*g+g-1 (g = heads / key-value heads), as ours.

    HF name (prefix model.)                     ours
    embed_tokens.weight                         tok_emb.weight
    layers.{i}.input_layernorm.weight           decoder.layers.{i}.res_self.norm.weight
    layers.{i}.self_attn.{q,k,v}_proj.weight    decoder.layers.{i}.self_attn.{q,k,v}_proj.weight
    layers.{i}.self_attn.o_proj.weight          decoder.layers.{i}.self_attn.out_proj.weight
    layers.{i}.post_attention_layernorm.weight  decoder.layers.{i}.res_ffn.norm.weight
    layers.{i}.mlp.gate_proj.weight             decoder.layers.{i}.ffn.gate.weight
    layers.{i}.mlp.up_proj.weight               decoder.layers.{i}.ffn.fc.weight
    layers.{i}.mlp.down_proj.weight             decoder.layers.{i}.ffn.proj.weight
    norm.weight                                 decoder.final_norm.weight
    lm_head.weight (untied only)                lm_head.weight

Qwen3 is Llama with QK-norm (our ``qk_norm``: one RMSNorm gain over the head size shared by
all query heads, one by all key heads, applied before RoPE, with the other norms' eps):

    layers.{i}.self_attn.{q,k}_norm.weight      decoder.layers.{i}.self_attn.{q,k}_norm.weight

Config: hidden_size -> n_embd, intermediate_size -> d_ff, num_hidden_layers -> n_layer,
num_attention_heads -> n_head, num_key_value_heads -> n_kv_head, max_position_embeddings ->
block_size, rms_norm_eps -> layer_norm_eps, rope theta -> rope_base (``rope_parameters`` in
current files, top-level ``rope_theta`` in older ones).
"""

from __future__ import annotations

import torch

from ..config import GPTConfig
from ..errors import UserError
from .weights import TensorTaker

# What makes our GPT a Llama: (option, Llama's value).
SHAPE = {"norm": "rmsnorm", "activation": "swiglu", "pos_encoding": "rope",
         "norm_position": "pre", "bias": False}
# Options of ours neither has: (option, the value that means "off"). qk_norm makes a Qwen3.
_OFF = {"logit_softcap": None, "scale_embeddings": False}

_LAYER = [  # (HF suffix, our suffix) for one block
    ("input_layernorm.weight", "res_self.norm.weight"),
    ("self_attn.q_proj.weight", "self_attn.q_proj.weight"),
    ("self_attn.k_proj.weight", "self_attn.k_proj.weight"),
    ("self_attn.v_proj.weight", "self_attn.v_proj.weight"),
    ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
    ("post_attention_layernorm.weight", "res_ffn.norm.weight"),
    ("mlp.gate_proj.weight", "ffn.gate.weight"),
    ("mlp.up_proj.weight", "ffn.fc.weight"),
    ("mlp.down_proj.weight", "ffn.proj.weight"),
]
_QK_NORM = [("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
            ("self_attn.k_norm.weight", "self_attn.k_norm.weight")]
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # a RoPE buffer some old files saved

# LlamaConfig's defaults (and where Qwen3Config's differ), for fields a config.json leaves out.
_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
             "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
_QWEN3_DEFAULTS = {"vocab_size": 151936, "intermediate_size": 22016, "head_dim": 128,
                   "max_position_embeddings": 32768}


def is_qwen3(hf: dict) -> bool:
    """A Qwen3 config.json (by model_type, or by class name in files without one)."""
    if hf.get("model_type") is not None:
        return hf["model_type"] == "qwen3"
    return "Qwen3" in " ".join(hf.get("architectures") or [])


def _refuse(field: str, value, why: str) -> UserError:
    return UserError(f"this checkpoint's config.json sets {field}={value!r}; {why}")


def rope_theta(hf: dict) -> float:
    """RoPE's base from ``rope_parameters`` (or the older top-level ``rope_theta``); refuses
    scaled or partial RoPE, which our RotaryEmbedding does not implement."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise _refuse("rope_parameters", params, "expected an object")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise _refuse("rope_parameters.rope_type", kind,
                      "minitransformer implements only the default (unscaled) RoPE")
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
    if extra:
        raise _refuse(f"rope_parameters.{extra[0]}", params[extra[0]],
                      "minitransformer implements only the default (unscaled) RoPE")
    scaling = hf.get("rope_scaling")
    if scaling is not None and (not isinstance(scaling, dict) or
                                scaling.get("rope_type", scaling.get("type")) != "default"):
        raise _refuse("rope_scaling", scaling,
                      "minitransformer implements only the default (unscaled) RoPE")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_hf(hf: dict) -> GPTConfig:
    """GPTConfig for a Llama (or Qwen3) config.json; refuses options our GPT cannot reproduce."""
    qwen3 = is_qwen3(hf)
    get = {**_DEFAULTS, **(_QWEN3_DEFAULTS if qwen3 else {}),
           **{k: v for k, v in hf.items() if v is not None}}.get
    if get("use_sliding_window", False):
        raise _refuse("use_sliding_window", get("use_sliding_window"),
                      "minitransformer attends to every earlier position in every layer")
    if any(kind != "full_attention" for kind in get("layer_types") or []):
        raise _refuse("layer_types", get("layer_types"),
                      "minitransformer attends to every earlier position in every layer")
    act = get("hidden_act", "silu")
    if act != "silu":
        raise _refuse("hidden_act", act, "minitransformer's SwiGLU gates with silu only")
    for key in ("attention_bias", "mlp_bias"):
        if get(key, False):
            raise _refuse(key, get(key), "minitransformer's Llama-shaped GPT has no biases")
    if (get("pretraining_tp", 1) or 1) > 1:
        raise _refuse("pretraining_tp", get("pretraining_tp"),
                      "minitransformer does not split the layers into slices")
    width, heads = get("hidden_size"), get("num_attention_heads")
    head_dim = get("head_dim", width // heads)
    if head_dim * heads != width:
        raise _refuse("head_dim", head_dim, f"minitransformer needs hidden_size / "
                      f"num_attention_heads = {width} / {heads} (= {width / heads:g})")
    kv = get("num_key_value_heads", heads)
    return GPTConfig(vocab_size=get("vocab_size"), block_size=get("max_position_embeddings"),
                     n_layer=get("num_hidden_layers"), n_head=heads, n_embd=width,
                     d_ff=get("intermediate_size"), dropout=0.0, **SHAPE,
                     n_kv_head=None if kv == heads else kv, rope_base=rope_theta(hf),
                     qk_norm=qwen3,
                     tie_weights=bool(get("tie_word_embeddings")),
                     layer_norm_eps=get("rms_norm_eps"))


def state_from_hf(hf: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Rename Llama (Qwen3) tensors to our GPT's state-dict names (no transposes, no splits)."""
    sd = {(k[len("model."):] if k.startswith("model.") else k): v
          for k, v in hf.items() if not k.endswith(_IGNORED_SUFFIXES)}
    out, take = {}, TensorTaker(sd, "Llama")

    out["tok_emb.weight"] = take("embed_tokens.weight")
    for i in range(config.n_layer):
        for hf_suffix, our_suffix in _LAYER + (_QK_NORM if config.qk_norm else []):
            out[f"decoder.layers.{i}.{our_suffix}"] = take(f"layers.{i}.{hf_suffix}")
    out["decoder.final_norm.weight"] = take("norm.weight")
    if not config.tie_weights:
        out["lm_head.weight"] = take("lm_head.weight")
    take.check_all_used()  # a tied model's saved lm_head.weight is its embedding's copy
    return out


def mismatches(config: GPTConfig) -> list[str]:
    """Why this GPT is not a Llama (or, with qk_norm, a Qwen3), one item per option; empty
    when it is."""
    wrong = [f"{k}={getattr(config, k)!r} (Llama has {v!r})" for k, v in SHAPE.items()
             if getattr(config, k) != v]
    wrong += [f"{k}={getattr(config, k)!r} (Llama has none)" for k, v in _OFF.items()
              if getattr(config, k) != v]
    return wrong


def config_to_hf(config: GPTConfig) -> dict:
    """A LlamaConfig dict for our GPT (a Qwen3Config dict with qk_norm); refuses a GPT whose
    options Llama cannot express."""
    wrong = mismatches(config)
    if wrong:
        raise UserError("this GPT cannot be written as Llama: " + "; ".join(wrong))
    if config.qk_norm:
        kind = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": config.n_layer,
                "layer_types": ["full_attention"] * config.n_layer}
    else:
        kind = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "mlp_bias": False, "pretraining_tp": 1}
    return {
        **kind,
        "vocab_size": config.vocab_size, "max_position_embeddings": config.block_size,
        "hidden_size": config.n_embd, "intermediate_size": config.ffn_width,
        "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head or config.n_head,
        "head_dim": config.n_embd // config.n_head, "hidden_act": "silu",
        "rms_norm_eps": config.layer_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base},
        "attention_bias": False,
        "attention_dropout": config.dropout, "initializer_range": 0.02,
        "tie_word_embeddings": config.tie_weights, "bos_token_id": None, "eos_token_id": None,
    }


def state_to_hf(sd: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our GPT's state dict in LlamaForCausalLM's (Qwen3ForCausalLM's) names: the inverse of
    ``state_from_hf``."""
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"]}
    for i in range(config.n_layer):
        for hf_suffix, our_suffix in _LAYER + (_QK_NORM if config.qk_norm else []):
            out[f"model.layers.{i}.{hf_suffix}"] = sd[f"decoder.layers.{i}.{our_suffix}"]
    out["model.norm.weight"] = sd["decoder.final_norm.weight"]
    if not config.tie_weights:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}
