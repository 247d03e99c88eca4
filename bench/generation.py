"""Generation speed: tokens/s with and without the KV cache.

    python bench/generation.py --new-tokens 500

Config (b) of the benchmarks: 6 layers, 6 heads, 384 wide, block_size 512 (so 500 new tokens
stay inside the context), batch 1, a 1-token prompt, greedy decoding.

- reference: no cache, explicit softmax attention, fp32, every core (its matrices are large:
  the whole context each step).
- cached: ``GPT.generate`` as ``minitransformer sample`` runs it: the KV cache, the fused
  kernel, fp32, and the thread count ``sample`` picks (one thread for models this small).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.training.device import decoding_threads, set_threads

CONFIG_B = dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=65)


def measure(new_tokens: int = 500, use_cache: bool = True, attn_impl: str = "auto",
            threads: str = "sample", **cfg) -> dict:
    """Tokens per second of greedy generation from a 1-token prompt (one timed run).

    threads: "sample" = what ``minitransformer sample`` uses, "all" = one per core.
    """
    set_threads()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**CONFIG_B, **cfg, "attn_impl": attn_impl})).eval()
    before = torch.get_num_threads()
    if threads == "sample":
        decoding_threads(model, torch.device("cpu"))
    n_threads = torch.get_num_threads()
    try:
        idx = torch.zeros(1, 1, dtype=torch.long)
        model.generate(idx, 8, temperature=0, use_cache=use_cache)  # warm-up
        t0 = time.perf_counter()
        out = model.generate(idx, new_tokens, temperature=0, use_cache=use_cache)
        dt = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    assert out.shape[1] == new_tokens + 1
    return {"tokens_per_s": new_tokens / dt, "threads": n_threads, "tokens": out}


def compare(new_tokens: int = 500, rounds: int = 2) -> dict:
    """Reference and cached runs interleaved ``rounds`` times; medians, and whether both wrote
    the same tokens."""
    ref, fast, same = [], [], True
    for _ in range(rounds):
        r = measure(new_tokens, use_cache=False, attn_impl="reference", threads="all")
        f = measure(new_tokens, use_cache=True, attn_impl="auto", threads="sample")
        ref.append(r["tokens_per_s"])
        fast.append(f["tokens_per_s"])
        same = same and torch.equal(r["tokens"], f["tokens"])
    return {"reference": statistics.median(ref), "cached": statistics.median(fast),
            "reference_threads": r["threads"], "cached_threads": f["threads"],
            "same_tokens": same, "runs": (ref, fast)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    c = compare(a.new_tokens, a.rounds)
    print(f"uncached reference: {c['reference']:.1f} tokens/s ({c['reference_threads']} "
          f"threads); cached: {c['cached']:.1f} tokens/s ({c['cached_threads']} thread(s)); "
          f"{c['cached'] / c['reference']:.1f}x; same tokens: {c['same_tokens']}")


if __name__ == "__main__":
    main()
