"""Generation speed: tokens/s with and without the KV cache.

    python bench/generation.py --new-tokens 500

Config (b) of the benchmarks: 6 layers, 6 heads, 384 wide, block_size 512 (so 500 new tokens
stay inside the context), batch 1, a 1-token prompt, greedy decoding.
"""

from __future__ import annotations

import argparse
import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.training.device import set_threads


def measure(new_tokens: int = 500, use_cache: bool = True, attn_impl: str = "fast",
            n_layer: int = 6, n_head: int = 6, n_embd: int = 384, block_size: int = 512,
            vocab_size: int = 65) -> float:
    """Tokens per second of greedy generation."""
    set_threads()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                          n_head=n_head, n_embd=n_embd, attn_impl=attn_impl)).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    model.generate(idx, 8, temperature=0, use_cache=use_cache)  # warm-up
    t0 = time.perf_counter()
    out = model.generate(idx, new_tokens, temperature=0, use_cache=use_cache)
    dt = time.perf_counter() - t0
    assert out.shape[1] == new_tokens + 1
    return new_tokens / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=500)
    a = p.parse_args()
    slow = measure(a.new_tokens, use_cache=False, attn_impl="reference")
    fast = measure(a.new_tokens, use_cache=True, attn_impl="fast")
    print(f"uncached reference: {slow:.1f} tokens/s; cached: {fast:.1f} tokens/s "
          f"({fast / slow:.1f}x)")


if __name__ == "__main__":
    main()
