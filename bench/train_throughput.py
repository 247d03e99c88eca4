"""Training speed of one preset: ms/iter, tokens/s and MFU, on random tokens.

    python bench/train_throughput.py --preset cpu-small --attn-impl reference
    python bench/train_throughput.py --preset gpt2-124m --device cuda --dtype bfloat16 --compile on

MFU is model FLOPs (6N + 12 L T C per token) over the matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import flops_per_token, matmul_peak, sync  # noqa: E402

from minitransformer.config import GPTConfig, TrainConfig, split_fields  # noqa: E402
from minitransformer.models import GPT  # noqa: E402
from minitransformer.presets import GPT as GPT_PRESETS  # noqa: E402
from minitransformer.presets import get_preset  # noqa: E402
from minitransformer.training.device import (  # noqa: E402
    autocast,
    maybe_compile,
    pick_device,
    pick_dtype,
    set_threads,
)
from minitransformer.training.optim import make_optimizer  # noqa: E402


def measure(preset: str, attn_impl: str = "auto", device_name: str = "auto",
            dtype_name: str = "float32", compile_mode: str = "off", iters: int = 30,
            warmup: int = 5, peak: float | None = None, **overrides) -> dict:
    set_threads()
    device = pick_device(device_name)
    dtype = pick_dtype(dtype_name, device)
    model_p, train_p = split_fields({**get_preset(GPT_PRESETS, preset), **overrides},
                                    GPTConfig, TrainConfig)
    cfg = GPTConfig(**{**model_p, "attn_impl": attn_impl, "dropout": 0.0})
    tcfg = TrainConfig(**train_p)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = make_optimizer(model, 1e-4, 0.1, (0.9, 0.95), device.type)
    run, compiled = maybe_compile(model, compile_mode, device)
    b, t = tcfg.batch_size, cfg.block_size
    x = torch.randint(0, cfg.vocab_size, (b, t), device=device)
    y = torch.randint(0, cfg.vocab_size, (b, t), device=device)

    def step():
        with autocast(device, dtype):
            _, loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    dt = (time.perf_counter() - t0) / iters
    peak = peak or matmul_peak(device, dtype if dtype != torch.float32 else torch.float32)
    tok_s = b * t / dt
    per_token = flops_per_token(model.num_params(), cfg.n_layer, cfg.n_embd, t)
    return {"preset": preset, "attn_impl": attn_impl, "dtype": str(dtype).split(".")[-1],
            "compiled": compiled, "device": str(device), "params": model.num_params(),
            "ms_per_iter": dt * 1e3, "tokens_per_s": tok_s, "mfu": tok_s * per_token / peak,
            "peak_flops": peak, "flops_per_token": per_token}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--attn-impl", default="auto", choices=["auto", "reference", "fast"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16",
                                                         "float16"])
    p.add_argument("--compile", default="off", choices=["auto", "on", "off"])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override preset fields, e.g. n_layer=4 batch_size=12")
    a = p.parse_args()
    overrides = {}
    for item in a.set:
        k, v = item.split("=", 1)
        overrides[k] = type(getattr(GPTConfig(), k, getattr(TrainConfig(), k, "")))(v)
    r = measure(a.preset, a.attn_impl, a.device, a.dtype, a.compile, a.iters, a.warmup,
                **overrides)
    print(f"{r['preset']} ({r['params']:,} params) attn={r['attn_impl']} dtype={r['dtype']} "
          f"compiled={r['compiled']} on {r['device']}: {r['ms_per_iter']:.1f} ms/iter, "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}% of a measured "
          f"{r['peak_flops'] / 1e12:.2f} TFLOP/s matmul peak")


if __name__ == "__main__":
    main()
