"""Decoding on a CUDA device, checked against references computed there, in fp64 (so that no
last-bit tie decides a token): the exact sliding window and the context shift past
block_size, kept start tokens, rolling the cache (RoPE, ALiBi: the same tokens as on the CPU),
batched samples against one-by-one, the ragged batch that `serve` decodes, and the
encoder-decoder's greedy and beam search with and without its caches. Then the speed of
sampling 8 samples together against one by one, in fp32 and bf16.

    python bench/gpu_decoding.py          # on the GPU machine (seconds); on a CPU it runs too
"""

from __future__ import annotations

import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.config import Seq2SeqConfig
from minitransformer.models.ragged import generate_ragged
from minitransformer.models.seq2seq import Seq2SeqTransformer

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
POS = ["learned", "sinusoidal", "rope", "alibi", "none"]
FAILED: list[str] = []


def check(name: str, ok: bool) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not ok:
        FAILED.append(name)


def tiny_gpt(pos: str, device=DEV) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16,
                      dropout=0.0, pos_encoding=pos))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)  # far from uniform, so that greedy decoding varies
    return m.double().to(device).eval()


@torch.no_grad()
def crop_then_extend(model, idx, n: int, shift: int, keep: int = 0) -> torch.Tensor:
    """Greedy, no cache: when the window outgrows block_size keep its first ``keep`` tokens
    and its last block_size - keep - shift (shift 0: nanoGPT's crop every step)."""
    block, window, out = model.config.block_size, idx, idx
    for _ in range(n):
        if window.shape[1] > block:
            window = torch.cat([out[:, :keep], window[:, -(block - keep - shift):]], dim=1)
        nxt = model(window)[0][:, -1].argmax(-1, keepdim=True)  # (B, 1)
        window, out = torch.cat([window, nxt], 1), torch.cat([out, nxt], 1)
    return out


def gpt_checks() -> None:
    prompt = torch.randint(0, 13, (2, 3), device=DEV)
    for pos in POS:
        m = tiny_gpt(pos)
        for shift, keep in ((0, 0), (4, 0), (3, 1)):
            got = m.generate(prompt, 45, temperature=0.0, context_shift=shift, context_keep=keep)
            check(f"{pos}: shift {shift}, keep {keep} equals crop-then-extend past block_size",
                  torch.equal(got, crop_then_extend(m, prompt, 45, shift, keep)))
        batch = m.generate(prompt[:1].repeat(4, 1), 40, temperature=1.0, top_k=6, seed=7)
        alone = [m.generate(prompt[:1], 40, temperature=1.0, top_k=6, seed=7 + i)
                 for i in range(4)]
        check(f"{pos}: 4 samples in one batch equal each alone with seed + i",
              torch.equal(batch, torch.cat(alone)))
        prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11]]
        ragged = generate_ragged(m, prompts, [30, 5, 20], temperature=0.0)
        single = [m.generate(torch.tensor([p], device=DEV), k, temperature=0.0)[0, len(p):]
                  .tolist() for p, k in zip(prompts, [30, 5, 20], strict=True)]
        check(f"{pos}: a ragged batch (serve's) equals each prompt alone", ragged == single)
        if pos in ("rope", "alibi"):
            here = m.generate(prompt, 45, temperature=0.0, context_mode="roll", context_shift=4)
            cpu = tiny_gpt(pos, "cpu").generate(prompt.cpu(), 45, temperature=0.0,
                                                context_mode="roll", context_shift=4)
            check(f"{pos}: rolling the cache gives the CPU's tokens", torch.equal(here.cpu(), cpu))


def seq2seq_checks() -> None:
    torch.manual_seed(0)
    m = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=40, block_size=32, n_layer=2, n_head=4,
                                         n_embd=32, dropout=0.0))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    m = m.double().to(DEV).eval()
    src = torch.randint(4, 40, (3, 9), device=DEV)
    src[1, 6:] = m.config.pad_id  # a shorter sentence, right-padded
    for beam in (1, 4):
        cached = m.translate(src, beam_size=beam, max_len=20)
        check(f"seq2seq beam {beam}: cached equals uncached",
              cached == m.translate(src, beam_size=beam, max_len=20, use_cache=False))
        on_cpu = m.to("cpu").translate(src.cpu(), beam_size=beam, max_len=20)
        m.to(DEV)
        check(f"seq2seq beam {beam}: the CPU's tokens", cached == on_cpu)


def speed() -> None:
    cfg = GPTConfig(vocab_size=50257, block_size=256, n_layer=12, n_head=12, n_embd=768)
    for dtype in (torch.float32, torch.bfloat16):
        m = GPT(cfg).to(DEV, dtype).eval()
        idx = torch.zeros(1, 1, dtype=torch.long, device=DEV)
        n = 300 if DEV.type == "cuda" else 10
        for rows in (1, 8):  # warm-up over every length and batch size timed below: in bf16
            m.generate(idx.repeat(rows, 1), n, seed=0)  # cuDNN plans each new shape once
        times = {}
        for label, rows in (("one by one", [1] * 8), ("8 together", [8])):
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for r in rows:
                m.generate(idx.repeat(r, 1), n, seed=0)
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            times[label] = 8 * n / (time.perf_counter() - t)
        print(f"gpt2-124m shape, context 256, {n} new tokens from one, {dtype}: "
              + ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in times.items())
              + f" ({times['8 together'] / times['one by one']:.1f}x)")
        profile_steps(m, idx)


def profile_steps(model, idx, n: int = 40) -> None:
    """Where ``n`` one-row tokens spend their time: the operators that take the most of it,
    on the host and on the device (bf16 decoding ran slower than fp32 on an H200)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.type == "cuda" else [])
    with profile(activities=activities) as prof:
        model.generate(idx, n, seed=0)
        if DEV.type == "cuda":
            torch.cuda.synchronize()
    key = "device_time_total" if DEV.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    print("device:", torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu")
    gpt_checks()
    seq2seq_checks()
    speed()
    print(f"{len(FAILED)} failed" + (": " + "; ".join(FAILED) if FAILED else ""))
