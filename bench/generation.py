"""Generation speed: the KV cache inside and past the context window, and batched sampling.

    python bench/generation.py [--new-tokens 500] [--rounds 2] [--samples 8]

Config (b) of the benchmarks: 6 layers, 6 heads, 384 wide, batch 1, a 1-token prompt,
greedy decoding, fp32; two context windows:

- block_size 512: all 500 new tokens stay inside the window;
- block_size 256 (nanoGPT's shakespeare-char config): the text outgrows the window after
  256 tokens, and ``sample``'s default context shift (block_size // 4 = 64) moves it.

Paths:

- reference: no cache, explicit softmax attention, fp32, every core; every token recomputes
  the cropped window (``idx[:, -block_size:]``), as nanoGPT's ``sample.py`` does.
- cached: ``GPT.generate`` as ``minitransformer sample`` runs it: the KV cache, the fused
  kernel, fp32, the thread count ``sample`` picks, the default context shift.
- exact window (block_size 256 only, for comparison): the cache with ``context_shift=0``,
  rebuilt for every token past the window.

Batched sampling: ``--samples`` samples of ``--new-tokens`` tokens at temperature 1 (block_size
256, default shift) generated together in one batch against the same samples generated one
by one (batch 1, seed + i each) in the same process; and how many of the batched samples came
out identical to their one-by-one twin in fp32, with the first token where one differed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.training.device import decoding_threads, set_threads

CONFIG_B = dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=65)
TARGETS = {"shift_vs_inside": 0.9, "shift_vs_reference": 8.0, "inside_vs_reference": 11.0,
           "batch_vs_sequential": 4.0}


def build(attn_impl: str = "auto", **cfg) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**CONFIG_B, **cfg, "attn_impl": attn_impl})).eval()


def timed_generate(model, idx: torch.Tensor, new_tokens: int, threads: str, **kw):
    """(seconds, output, threads used) of one ``generate`` call after a short warm-up.

    threads: "sample" = what ``minitransformer sample`` uses, "all" = one per core.
    """
    set_threads()
    before = torch.get_num_threads()
    if threads == "sample":
        decoding_threads(model, torch.device("cpu"), idx.shape[0])
    n_threads = torch.get_num_threads()
    try:
        model.generate(idx, 8, **kw)  # warm-up
        t0 = time.perf_counter()
        out = model.generate(idx, new_tokens, **kw)
        dt = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    assert out.shape[1] == idx.shape[1] + new_tokens
    return dt, out, n_threads


def measure(new_tokens: int = 500, use_cache: bool = True, attn_impl: str = "auto",
            threads: str = "sample", context_shift: int | None = None, **cfg) -> dict:
    """Tokens per second of greedy generation from a 1-token prompt (one timed run)."""
    model = build(attn_impl, **cfg)
    idx = torch.zeros(1, 1, dtype=torch.long)
    dt, out, n = timed_generate(model, idx, new_tokens, threads, temperature=0,
                                use_cache=use_cache, context_shift=context_shift)
    return {"tokens_per_s": new_tokens / dt, "threads": n, "tokens": out}


PATHS = {  # name: (block_size, use_cache, attn_impl, threads, context_shift)
    "reference 512": (512, False, "reference", "all", 0),
    "cached 512": (512, True, "auto", "sample", None),
    "reference 256": (256, False, "reference", "all", 0),
    "cached 256": (256, True, "auto", "sample", None),
    "exact window 256": (256, True, "auto", "sample", 0),
}


def compare(new_tokens: int = 500, rounds: int = 2) -> dict:
    """Every path of ``PATHS``, taking turns ``rounds`` times; medians, threads, and whether
    the reference and the cache wrote the same tokens where they see the same windows."""
    runs = {name: [] for name in PATHS}
    last = {}
    for _ in range(rounds):
        for name, (block, use_cache, impl, threads, shift) in PATHS.items():
            r = measure(new_tokens, use_cache, impl, threads, shift, block_size=block)
            runs[name].append(r["tokens_per_s"])
            last[name] = r
    out = {name: {"tokens_per_s": statistics.median(v), "threads": last[name]["threads"],
                  "runs": v} for name, v in runs.items()}
    out["same_tokens_512"] = torch.equal(last["reference 512"]["tokens"],
                                         last["cached 512"]["tokens"])
    out["same_tokens_256_exact"] = torch.equal(last["reference 256"]["tokens"],
                                               last["exact window 256"]["tokens"])
    return out


def batched(new_tokens: int = 500, samples: int = 8, rounds: int = 2, seed: int = 1) -> dict:
    """``samples`` samples together against one by one, block_size 256, temperature 1."""
    model = build(block_size=256)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    kw = dict(temperature=1.0, seed=seed)
    together, alone = [], []
    for _ in range(rounds):
        dt, batch, n_batch = timed_generate(model, prompt.repeat(samples, 1), new_tokens,
                                            "sample", **kw)
        together.append(samples * new_tokens / dt)
        set_threads()
        before = torch.get_num_threads()
        decoding_threads(model, torch.device("cpu"))
        n_one = torch.get_num_threads()
        try:
            t0 = time.perf_counter()
            ones = [model.generate(prompt, new_tokens, temperature=1.0, seed=seed + i)
                    for i in range(samples)]
            alone.append(samples * new_tokens / (time.perf_counter() - t0))
        finally:  # set_threads never raises the count: the next round's batch starts from it
            torch.set_num_threads(before)
    same, first_diff = 0, []
    for i, one in enumerate(ones):
        diff = (batch[i] != one[0]).nonzero()
        same += diff.numel() == 0
        if diff.numel():
            first_diff.append(int(diff[0]))
    return {"batched": statistics.median(together), "sequential": statistics.median(alone),
            "threads": (n_batch, n_one), "identical": same, "samples": samples,
            "first_difference": first_diff, "runs": (together, alone)}


def report(g: dict, b: dict | None, n: int) -> dict:
    """Print the tables; return the ratios the targets are about."""
    ratios = {"inside_vs_reference": g["cached 512"]["tokens_per_s"]
              / g["reference 512"]["tokens_per_s"],
              "shift_vs_reference": g["cached 256"]["tokens_per_s"]
              / g["reference 256"]["tokens_per_s"],
              "shift_vs_inside": g["cached 256"]["tokens_per_s"]
              / g["cached 512"]["tokens_per_s"]}
    print(f"generation, config (b), batch 1, {n} new tokens from a 1-token prompt, greedy, fp32 "
          f"(medians of {len(g['cached 512']['runs'])} runs):")
    print("| block_size | path | threads | tokens/s | vs its reference |")
    print("|---:|---|---:|---:|---:|")
    for name, (block, *_rest) in PATHS.items():
        ref = g[f"reference {block}"]["tokens_per_s"]
        r = g[name]
        label = {"reference": "reference: no cache, recompute the window, explicit softmax",
                 "cached": "`sample`: KV cache, fused attention"
                           + (", context shift 64" if block == 256 else ""),
                 "exact window": "KV cache, exact sliding window (--context-shift 0)"}[
                     name.rsplit(" ", 1)[0]]
        print(f"| {block} | {label} | {r['threads']} | {r['tokens_per_s']:.1f} | "
              f"{r['tokens_per_s'] / ref:.2f}x |")
    print(f"same tokens, reference and cache: block 512 {g['same_tokens_512']}, block 256 exact "
          f"window {g['same_tokens_256_exact']}")
    if b is not None:
        ratios["batch_vs_sequential"] = b["batched"] / b["sequential"]
        print(f"\nbatched sampling, block_size 256, {b['samples']} samples x {n} tokens, "
              f"temperature 1:")
        print("| path | threads | tokens/s | ratio |\n|---|---:|---:|---:|")
        print(f"| {b['samples']} one by one (batch 1, seed + i) | {b['threads'][1]} | "
              f"{b['sequential']:.1f} | 1.00x |")
        print(f"| `--num-samples {b['samples']}` (one batch) | {b['threads'][0]} | "
              f"{b['batched']:.1f} | {ratios['batch_vs_sequential']:.2f}x |")
        print(f"fp32: {b['identical']} of {b['samples']} batched samples identical to their "
              f"one-by-one twin; first differing token of the others: {b['first_difference']}")
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--samples", type=int, default=8, help="batched samples (0 = skip)")
    a = p.parse_args()
    g = compare(a.new_tokens, a.rounds)
    b = batched(a.new_tokens, a.samples, a.rounds) if a.samples else None
    ratios = report(g, b, a.new_tokens)
    print("\ntargets:")
    for name, value in ratios.items():
        print(f"- {name.replace('_', ' ')}: {value:.2f}x (>= {TARGETS[name]}x)")


if __name__ == "__main__":
    main()
