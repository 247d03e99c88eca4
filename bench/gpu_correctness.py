"""Quick checks on a CUDA device: the fast path equals the reference path there, bf16 stays
close to fp32, the KV cache changes nothing, and how much faster cached generation is."""

from __future__ import annotations

import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.nn.attention import scaled_dot_product_attention

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 32, device=dev) for _ in range(3))
mask = torch.ones(64, 64, dtype=torch.bool, device=dev).tril()
ref, _ = scaled_dot_product_attention(q, k, v, mask)
fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
print(f"attention fast vs reference on {dev}: max |diff| {(ref - fast).abs().max().item():.2e}")

for pe in ["sinusoidal", "learned", "rope", "alibi", "none"]:
    cfg = GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=64,
                    pos_encoding=pe)
    torch.manual_seed(1)
    m = GPT(cfg).to(dev).eval()
    idx = torch.randint(0, 97, (3, 5), device=dev)
    a = m.generate(idx, 40, temperature=0, use_cache=True)
    b = m.generate(idx, 40, temperature=0, use_cache=False)
    x = torch.randint(0, 97, (2, 32), device=dev)
    with torch.no_grad():
        l32 = m(x)[0]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            l16 = m(x)[0].float()
    print(f"{pe:>10}: cached == uncached past block_size: {torch.equal(a, b)}; "
          f"bf16 vs fp32 logits max |diff| {(l32 - l16).abs().max().item():.3f}")

cfg = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                activation="gelu_tanh")
m = GPT(cfg).to(dev).eval()
idx = torch.zeros(1, 1, dtype=torch.long, device=dev)
for use_cache in (False, True):
    m.generate(idx, 5, use_cache=use_cache, seed=0)  # warm-up
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 300 if dev.type == "cuda" else 20
    m.generate(idx, n, use_cache=use_cache, seed=0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"gpt2-124m generation, cache={use_cache}: {n / (time.perf_counter() - t0):.1f} tokens/s")
