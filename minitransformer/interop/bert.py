"""BERT (Hugging Face ``BertModel`` / ``BertForMaskedLM``) -> our ``EncoderModel``.

BERT is our encoder with learned positions, token-type embeddings, a LayerNorm on the summed
embeddings, Post-LN blocks and exact GELU. ``nn.Linear`` layouts are the same on both sides.

    HF name (prefix bert. in *ForMaskedLM)        ours
    embeddings.word_embeddings                    tok_emb
    embeddings.position_embeddings                pos_emb
    embeddings.token_type_embeddings              type_emb
    embeddings.LayerNorm                          emb_norm
    encoder.layer.{i}.attention.self.query|key|value    encoder.layers.{i}.attn.q_proj|k_proj|v_proj
    encoder.layer.{i}.attention.output.dense      encoder.layers.{i}.attn.out_proj
    encoder.layer.{i}.attention.output.LayerNorm  encoder.layers.{i}.res_attn.norm
    encoder.layer.{i}.intermediate.dense          encoder.layers.{i}.ffn.fc
    encoder.layer.{i}.output.dense                encoder.layers.{i}.ffn.proj
    encoder.layer.{i}.output.LayerNorm            encoder.layers.{i}.res_ffn.norm
    cls.predictions.transform.dense|LayerNorm     mlm_head.transform.0|2
    cls.predictions.bias                          mlm_head.bias
    cls.predictions.decoder.weight (untied only)  mlm_head.decoder.weight

Not used: the pooler (a tanh layer on [CLS] for next-sentence prediction) and the
next-sentence head; sentence embeddings are pooled as the folder's sentence-transformers
modules say (``interop/sentence.py``: mean, cls or max).
"""

from __future__ import annotations

import torch

from ..config import EncoderConfig
from ..errors import UserError

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}

_LAYER = {
    "attention.self.query": "attn.q_proj", "attention.self.key": "attn.k_proj",
    "attention.self.value": "attn.v_proj", "attention.output.dense": "attn.out_proj",
    "attention.output.LayerNorm": "res_attn.norm", "intermediate.dense": "ffn.fc",
    "output.dense": "ffn.proj", "output.LayerNorm": "res_ffn.norm",
}
_TOP = {
    "embeddings.word_embeddings": "tok_emb", "embeddings.position_embeddings": "pos_emb",
    "embeddings.token_type_embeddings": "type_emb", "embeddings.LayerNorm": "emb_norm",
    "cls.predictions.transform.dense": "mlm_head.transform.0",
    "cls.predictions.transform.LayerNorm": "mlm_head.transform.2",
    "cls.predictions.decoder": "mlm_head.decoder",
}
_IGNORED = ("pooler.", "cls.seq_relationship.", "embeddings.position_ids",
            "embeddings.token_type_ids", "cls.predictions.decoder.bias")


def _normalise_names(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``bert.`` prefix and rename the old TensorFlow-era gamma/beta to weight/bias."""
    out = {}
    for k, v in hf.items():
        k = k[len("bert."):] if k.startswith("bert.") else k
        if k.endswith(".gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[: -len("beta")] + "bias"
        out[k] = v
    return out


def config_from_hf(hf: dict, weights: dict[str, torch.Tensor]) -> EncoderConfig:
    """EncoderConfig for a BERT config.json (the MLM head is kept when the file has one)."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"BERT position_embedding_type {hf['position_embedding_type']!r} is "
                        f"not supported (only absolute)")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UserError(f"BERT hidden_act {act!r} is not supported "
                        f"(supported: {', '.join(ACTIVATIONS)})")
    names = _normalise_names(weights)
    has_head = "cls.predictions.transform.dense.weight" in names
    return EncoderConfig(
        vocab_size=hf.get("vocab_size", 30522), block_size=hf.get("max_position_embeddings", 512),
        n_layer=hf.get("num_hidden_layers", 12), n_head=hf.get("num_attention_heads", 12),
        n_embd=hf.get("hidden_size", 768), d_ff=hf.get("intermediate_size"), dropout=0.0,
        bias=True, pos_encoding="learned", norm_position="post", activation=ACTIVATIONS[act],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        type_vocab_size=hf.get("type_vocab_size", 2), embedding_norm="layernorm",
        mlm_head="bert" if has_head else "none",
        tie_weights=hf.get("tie_word_embeddings", True))


def state_from_hf(hf: dict[str, torch.Tensor], config: EncoderConfig) -> dict[str, torch.Tensor]:
    """Rename BERT tensors to our EncoderModel's state-dict names."""
    out = {}
    for k, v in _normalise_names(hf).items():
        if k.startswith(_IGNORED):
            continue
        if k == "cls.predictions.bias":
            out["mlm_head.bias"] = v
            continue
        if k.startswith("encoder.layer."):
            _, _, i, rest = k.split(".", 3)
            module, _, param = rest.rpartition(".")
            if module not in _LAYER:
                raise UserError(f"unknown BERT weight {k}")
            out[f"encoder.layers.{i}.{_LAYER[module]}.{param}"] = v
            continue
        module, _, param = k.rpartition(".")
        if module not in _TOP:
            raise UserError(f"unknown BERT weight {k}")
        out[f"{_TOP[module]}.{param}"] = v
    if config.mlm_head != "none" and config.tie_weights:
        out.pop("mlm_head.decoder.weight", None)  # a saved copy of the word embeddings
    return out
