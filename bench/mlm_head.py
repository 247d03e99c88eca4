"""Masked-LM training step: every position through the vocabulary head, or the chosen only.

    python bench/mlm_head.py [--rounds 5] [--steps 5] [--block-size 128] [--batch 8]
                             [--device cuda --dtype bfloat16 --compile]

An ``EncoderModel`` of all-MiniLM-L6-v2's sizes (6 layers, 12 heads, 384 wide, 30,522 ids,
the head tied to the embeddings; random weights, nothing downloaded) trains on random ids,
corrupted as BERT does (15% of positions chosen). Each step is forward, backward and AdamW.
"all positions" projects every position onto the vocabulary and takes the loss at the chosen
ones (what the task did before, and what Hugging Face's ``BertForMaskedLM`` does);
"chosen only" is what ``MaskedLMTask.loss_terms`` does (``targets_only``). The two take
turns, ``--rounds`` times; medians. fp32 on every core unless told (on a GPU: bf16 autocast
and ``torch.compile``, where the chosen positions' count changes every step).
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


def step_seconds(model, opt, batches, targets_only: bool, dtype=torch.float32) -> float:
    device = batches[0][0].device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for x, y in batches:
        with torch.autocast(device.type, dtype, enabled=dtype != torch.float32):
            if targets_only:
                logits = model(x, y, targets_only=True)[0]  # (N, V)
                total, n = token_cross_entropy(logits, y[y != IGNORE])
            else:
                total, n = token_cross_entropy(model(x)[0], y)  # (B, T, V) logits
        (total / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - t0) / len(batches)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="steps per round and path")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=30522, block_size=a.block_size, n_layer=6, n_head=12,
                        n_embd=384, mask_id=103, mlm_head="linear", dropout=0.0)
    model = EncoderModel(cfg).to(a.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if a.compile:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    batches = [mask_tokens(torch.randint(1000, 30000, (a.batch, a.block_size), generator=g),
                           103, 30522, g) for _ in range(a.steps)]
    batches = [(x.to(a.device), y.to(a.device)) for x, y in batches]
    warm = batches if a.compile else batches[:1]  # first calls allocate (and compile)
    step_seconds(model, opt, warm, True, dtype)
    step_seconds(model, opt, warm, False, dtype)
    times = {True: [], False: []}
    for _ in range(a.rounds):
        for only in (False, True):
            times[only].append(step_seconds(model, opt, batches, only, dtype))
    full, only = statistics.median(times[False]), statistics.median(times[True])
    where = f"{torch.get_num_threads()} threads" if a.device == "cpu" else a.device
    print(f"{where}, {a.dtype}{', compiled' if a.compile else ''}, batch {a.batch} x "
          f"{a.block_size} tokens, medians of {a.rounds} rounds of {a.steps} steps")
    print("| masked-LM head | ms per step | speed-up |\n|---|---:|---:|")
    print(f"| all positions | {full * 1e3:.0f} | 1.00x |")
    print(f"| chosen only | {only * 1e3:.0f} | {full / only:.2f}x |")


if __name__ == "__main__":
    main()
