"""How close our GPT comes to transformers' LlamaForCausalLM (and Qwen3ForCausalLM) on the same
random weights.

    python bench/llama_parity.py            # CPU, a few seconds

The small models of tests/test_interop_llama.py (Llamas with grouped-query attention, an
untied head and RoPE theta 500, and with multi-query attention and a tied head; a Qwen3),
saved by transformers and read with ``load_hf``. Printed per model, as max |logit difference|
over 3 x 32 tokens:

- float32: ours against theirs, both paths of our attention;
- transformers' own float32 against its float64: the size of float32 rounding here;
- float64 with transformers' float32 steps (its RMSNorm, its eager softmax, its RoPE tables)
  also in float64: what is left of the difference when rounding is taken away.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import transformers
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

from minitransformer.interop import load_hf

VOCAB, BLOCK = 101, 32
CONFIGS = {
    "gqa_untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=False),
    "mqa_tied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=True),
    "qwen3_tied": dict(kind="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True),
}
CLASSES = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
NORMS = (modeling_llama.LlamaRMSNorm, modeling_qwen3.Qwen3RMSNorm)


def random_llama(folder: Path, kind: str = "llama", **overrides):
    """As the tests build it: linear weights N(0, 0.25), norm gains 1 + N(0, 0.2)."""
    torch.manual_seed(0)
    config_class, model_class = CLASSES[kind]
    cfg = config_class(vocab_size=VOCAB, max_position_embeddings=BLOCK,
                       attn_implementation="eager", **overrides)
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25)
    model.save_pretrained(folder)
    return model


def rms_norm_in_input_dtype(self, h):
    """transformers' LlamaRMSNorm (Qwen3RMSNorm) without its cast to float32."""
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) +
                                          self.variance_epsilon))


def ours(folder: Path, attn_impl: str = "auto"):
    model = load_hf(folder)
    for block in model.decoder.layers:
        block.self_attn.attn_impl = attn_impl
    return model


@torch.no_grad()
def main() -> None:
    torch.set_num_threads(1)
    ids = torch.randint(VOCAB, (3, BLOCK), generator=torch.Generator().manual_seed(1))
    for name, cfg in CONFIGS.items():
        folder = Path(tempfile.mkdtemp()) / "hf"
        hf = random_llama(folder, **cfg)
        ref = hf(ids).logits
        line = [f"{name:11s} max |logit| {ref.abs().max().item():.1f}"]
        for impl in ("reference", "fast"):
            line.append(f"float32 {impl} {(ours(folder, impl)(ids)[0] - ref).abs().max():.2e}")
        hf64 = hf.double()
        line.append(f"theirs 32 vs 64 {(ref - hf64(ids).logits).abs().max():.2e}")
        hf64.set_attn_implementation("sdpa")  # computes the softmax in the input's dtype
        plain = [norm.forward for norm in NORMS]
        for norm in NORMS:
            norm.forward = rms_norm_in_input_dtype
        try:
            exact = hf64(ids).logits
        finally:
            for norm, forward in zip(NORMS, plain, strict=True):
                norm.forward = forward
        mine = ours(folder, "reference").double()
        rope = mine.decoder.layers[0].self_attn.rope  # one module shared by every layer
        cos, sin = hf64.model.rotary_emb(torch.zeros(1, BLOCK, 1, dtype=torch.float64),
                                         torch.arange(BLOCK)[None])  # (1, T, hs)
        half = rope.head_size // 2
        rope.cos, rope.sin = cos[0, :, :half].clone(), sin[0, :, :half].clone()  # (T, hs/2)
        line.append(f"float64, no float32 steps {(mine(ids)[0] - exact).abs().max():.2e}")
        print("; ".join(line))


if __name__ == "__main__":
    main()
