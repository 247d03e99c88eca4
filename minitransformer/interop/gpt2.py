"""GPT-2 (Hugging Face ``GPT2LMHeadModel``) <-> our ``GPT``: config fields and weight names.

GPT-2 is our GPT with learned positions, Pre-LN, GELU (tanh approximation), biases and the
output head tied to the token embedding. Two differences of layout:

- GPT-2's linear layers are ``Conv1D`` modules storing the weight as (in, out), the transpose
  of ``nn.Linear``'s (out, in);
- its attention computes q, k, v with one fused projection ``c_attn`` of shape (C, 3C); we
  keep W^Q, W^K, W^V apart (``q_proj``, ``k_proj``, ``v_proj``), so it is split in three.

    HF name (prefix transformer.)        ours
    wte.weight                           tok_emb.weight
    wpe.weight                           pos_emb.weight
    h.{i}.ln_1                           decoder.layers.{i}.res_self.norm
    h.{i}.attn.c_attn                    decoder.layers.{i}.self_attn.{q,k,v}_proj   (split, T)
    h.{i}.attn.c_proj                    decoder.layers.{i}.self_attn.out_proj       (T)
    h.{i}.ln_2                           decoder.layers.{i}.res_ffn.norm
    h.{i}.mlp.c_fc / mlp.c_proj          decoder.layers.{i}.ffn.fc / ffn.proj        (T)
    ln_f                                 decoder.final_norm
    lm_head.weight (untied only)         lm_head.weight
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import GPTConfig
from ..errors import UserError
from .weights import TensorTaker

# GPT-2's activation_function values and ours.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "gelu": "gelu", "relu": "relu"}
TO_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# Options of GPT2Config that change the computation in ways our GPT does not express.
_UNSUPPORTED = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                "add_cross_attention": False, "scale_attn_weights": True}

_LAYER = [  # (HF suffix, our suffix, transpose) for one block, besides c_attn
    ("ln_1.weight", "res_self.norm.weight", False), ("ln_1.bias", "res_self.norm.bias", False),
    ("attn.c_proj.weight", "self_attn.out_proj.weight", True),
    ("attn.c_proj.bias", "self_attn.out_proj.bias", False),
    ("ln_2.weight", "res_ffn.norm.weight", False), ("ln_2.bias", "res_ffn.norm.bias", False),
    ("mlp.c_fc.weight", "ffn.fc.weight", True), ("mlp.c_fc.bias", "ffn.fc.bias", False),
    ("mlp.c_proj.weight", "ffn.proj.weight", True), ("mlp.c_proj.bias", "ffn.proj.bias", False),
]
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old files


def config_from_hf(hf: dict) -> GPTConfig:
    """GPTConfig for a GPT-2 config.json; refuses options our GPT cannot reproduce."""
    for key, ok in _UNSUPPORTED.items():
        if hf.get(key, ok) != ok:
            raise UserError(f"this GPT-2 checkpoint sets {key}={hf[key]!r}, which "
                            f"minitransformer's GPT does not implement")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise UserError(f"GPT-2 activation_function {act!r} is not supported "
                        f"(supported: {', '.join(ACTIVATIONS)})")
    return GPTConfig(vocab_size=hf.get("vocab_size", 50257), block_size=hf.get("n_positions", 1024),
                     n_layer=hf.get("n_layer", 12), n_head=hf.get("n_head", 12),
                     n_embd=hf.get("n_embd", 768), d_ff=hf.get("n_inner"), dropout=0.0, bias=True,
                     pos_encoding="learned", norm_position="pre", activation=ACTIVATIONS[act],
                     tie_weights=hf.get("tie_word_embeddings", True),
                     layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5))


def state_from_hf(hf: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Rename (and transpose / split) GPT-2 tensors to our GPT's state-dict names."""
    sd = {(k[len("transformer."):] if k.startswith("transformer.") else k): v
          for k, v in hf.items() if not k.endswith(_IGNORED_SUFFIXES)}
    out, take = {}, TensorTaker(sd, "GPT-2")

    out["tok_emb.weight"] = take("wte.weight")
    out["pos_emb.weight"] = take("wpe.weight")
    for i in range(config.n_layer):
        ours = f"decoder.layers.{i}."
        w = take(f"h.{i}.attn.c_attn.weight").t()  # (3C, C): rows q, then k, then v
        b = take(f"h.{i}.attn.c_attn.bias")  # (3C,)
        for part, wp, bp in zip("qkv", w.chunk(3, dim=0), b.chunk(3, dim=0), strict=True):
            out[f"{ours}self_attn.{part}_proj.weight"] = wp.contiguous()  # (C, C)
            out[f"{ours}self_attn.{part}_proj.bias"] = bp.contiguous()  # (C,)
        for hf_suffix, our_suffix, transpose in _LAYER:
            t = take(f"h.{i}.{hf_suffix}")
            out[ours + our_suffix] = t.t().contiguous() if transpose else t
    out["decoder.final_norm.weight"] = take("ln_f.weight")
    out["decoder.final_norm.bias"] = take("ln_f.bias")
    if not config.tie_weights:
        out["lm_head.weight"] = take("lm_head.weight")
    take.check_all_used()  # a tied model's saved lm_head.weight is its embedding's copy
    return out


def config_to_hf(config: GPTConfig) -> dict:
    """A GPT2Config dict for our GPT; refuses a GPT whose options GPT-2 cannot express."""
    need = {"pos_encoding": "learned", "norm_position": "pre", "bias": True}
    wrong = [f"{k}={getattr(config, k)!r} (GPT-2 has {v!r})" for k, v in need.items()
             if getattr(config, k) != v]
    if config.activation not in TO_HF_ACTIVATION:
        wrong.append(f"activation={config.activation!r}")
    known = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff", "dropout",
             "activation", "attn_impl", "init", "tie_weights", "layer_norm_eps", *need}
    defaults = GPTConfig()
    for f in dataclasses.fields(config):  # options added later: only their defaults are GPT-2
        if f.name not in known and getattr(config, f.name) != getattr(defaults, f.name):
            wrong.append(f"{f.name}={getattr(config, f.name)!r}")
    if wrong:
        raise UserError("this GPT cannot be written as GPT-2: " + "; ".join(wrong))
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.block_size,
        "n_embd": config.n_embd, "n_layer": config.n_layer, "n_head": config.n_head,
        "n_inner": config.d_ff, "activation_function": TO_HF_ACTIVATION[config.activation],
        "layer_norm_epsilon": config.layer_norm_eps,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "initializer_range": 0.02,
        "tie_word_embeddings": config.tie_weights, "bos_token_id": None, "eos_token_id": None,
    }


def state_to_hf(sd: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """Our GPT's state dict in GPT2LMHeadModel's names and layouts (the inverse of above)."""
    out = {"transformer.wte.weight": sd["tok_emb.weight"],
           "transformer.wpe.weight": sd["pos_emb.weight"]}
    for i in range(config.n_layer):
        ours, hf = f"decoder.layers.{i}.", f"transformer.h.{i}."
        w = torch.cat([sd[f"{ours}self_attn.{p}_proj.weight"] for p in "qkv"], dim=0)  # (3C, C)
        out[hf + "attn.c_attn.weight"] = w.t()  # (C, 3C), Conv1D layout
        out[hf + "attn.c_attn.bias"] = torch.cat(
            [sd[f"{ours}self_attn.{p}_proj.bias"] for p in "qkv"])  # (3C,)
        for hf_suffix, our_suffix, transpose in _LAYER:
            t = sd[ours + our_suffix]
            out[hf + hf_suffix] = t.t() if transpose else t
    out["transformer.ln_f.weight"] = sd["decoder.final_norm.weight"]
    out["transformer.ln_f.bias"] = sd["decoder.final_norm.bias"]
    if not config.tie_weights:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}
