"""Masked-LM training step: every position through the vocabulary head, or the chosen only.

    python bench/mlm_head.py [--rounds 5] [--steps 5] [--block-size 128] [--batch 8]

An ``EncoderModel`` of all-MiniLM-L6-v2's sizes (6 layers, 12 heads, 384 wide, 30,522 ids,
the head tied to the embeddings; random weights, nothing downloaded) trains on random ids,
corrupted as BERT does (15% of positions chosen). Each step is forward, backward and AdamW.
"all positions" projects every position onto the vocabulary and takes the loss at the chosen
ones (what the task did before, and what Hugging Face's ``BertForMaskedLM`` does);
"chosen only" is what ``MaskedLMTask.loss_terms`` does (``targets_only``). The two take
turns, ``--rounds`` times; medians. fp32, every core.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minitransformer.config import EncoderConfig
from minitransformer.models import EncoderModel
from minitransformer.models.mlm import IGNORE, mask_tokens
from minitransformer.training.task import token_cross_entropy


def step_seconds(model, opt, batches, targets_only: bool) -> float:
    t0 = time.perf_counter()
    for x, y in batches:
        if targets_only:
            total, n = token_cross_entropy(model(x, y, targets_only=True)[0], y[y != IGNORE])
        else:
            total, n = token_cross_entropy(model(x)[0], y)
        (total / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / len(batches)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="steps per round and path")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=30522, block_size=a.block_size, n_layer=6, n_head=12,
                        n_embd=384, mask_id=103, mlm_head="linear", dropout=0.0)
    model = EncoderModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    batches = [mask_tokens(torch.randint(1000, 30000, (a.batch, a.block_size), generator=g),
                           103, 30522, g) for _ in range(a.steps)]
    step_seconds(model, opt, batches[:1], True)  # warm-up: first calls allocate
    step_seconds(model, opt, batches[:1], False)
    times = {True: [], False: []}
    for _ in range(a.rounds):
        for only in (False, True):
            times[only].append(step_seconds(model, opt, batches, only))
    full, only = statistics.median(times[False]), statistics.median(times[True])
    print(f"{torch.get_num_threads()} threads, batch {a.batch} x {a.block_size} tokens, "
          f"medians of {a.rounds} rounds of {a.steps} steps")
    print("| masked-LM head | ms per step | speed-up |\n|---|---:|---:|")
    print(f"| all positions | {full * 1e3:.0f} | 1.00x |")
    print(f"| chosen only | {only * 1e3:.0f} | {full / only:.2f}x |")


if __name__ == "__main__":
    main()
