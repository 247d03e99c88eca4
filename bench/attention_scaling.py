"""Attention's cost against sequence length N: the reference path against the fast path.

    python bench/attention_scaling.py --threads 1       # CPU, N = 64 ... 8192, ~2 minutes
    python bench/attention_scaling.py --device cuda --max-n 16384

Both paths compute softmax(Q K^T / sqrt(d_k)) V with the causal mask, as
``minitransformer.nn.attention`` does:

- reference: ``scaled_dot_product_attention``, the readable path. It builds the N x N score and
  weight matrices, so its memory grows like N^2.
- fast: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, the fused kernel
  MultiHeadAttention uses for training. It works on blocks of keys (flash-attention style) and
  never holds the whole N x N matrix.

Time is the best of several forward passes (no gradient). Peak memory is measured, not
computed: on CUDA the allocator's peak, on CPU the growth of the process's peak resident memory
(VmHWM, reset before each run through /proc/self/clear_refs) with glibc told to return large
blocks to the system. The log-log slopes over the largest sizes say how each path scales.
The results go to docs/img/attention_scaling.png and to their own section of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from minitransformer.nn.attention import scaled_dot_product_attention  # noqa: E402
from minitransformer.nn.mask import causal_mask  # noqa: E402

START, END = "<!-- attention-scaling:start -->", "<!-- attention-scaling:end -->"
PATHS = ("reference", "fast")


def fixed_malloc_threshold() -> None:
    """Make glibc hand every block over 128 KiB back to the system when freed, so that each
    run's peak shows up as new resident memory (glibc's sliding threshold would keep it)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Bytes a block of code adds at its peak, on CUDA or (Linux) on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_ok = device.type == "cpu" and _status_kib("VmHWM") is not None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        elif self.cpu_ok:
            self.base = _status_kib("VmRSS") * 1024
            try:
                Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to VmRSS
            except OSError:
                self.cpu_ok = False
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        elif self.cpu_ok:
            self.peak = _status_kib("VmHWM") * 1024 - self.base
        else:
            self.peak = float("nan")
        return False


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_path(path: str, q, k, v):
    if path == "reference":
        mask = causal_mask(q.shape[-2], device=q.device)  # (N, N) bool, part of its cost
        return scaled_dot_product_attention(q, k, v, mask)[0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def measure(path: str, n: int, args, device: torch.device) -> dict:
    g = torch.Generator(device=device).manual_seed(n)
    shape = (args.batch, args.heads, n, args.head_size)
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=args.dtype)
               for _ in range(3))
    out = run_path(path, q, k, v)  # warm-up (and a first allocation of everything)
    del out
    sync(device)
    with PeakMemory(device) as mem:
        out = run_path(path, q, k, v)
        sync(device)
    del out
    times, spent = [], 0.0
    while len(times) < args.min_repeat or (spent < args.min_time and len(times) < 50):
        t0 = time.perf_counter()
        run_path(path, q, k, v)
        sync(device)
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return {"ms": 1e3 * min(times), "mib": mem.peak / 2 ** 20}  # best of: least disturbed


def slope(points: list[tuple[int, float]], min_n: int) -> float | None:
    """Least-squares slope of log(value) against log(N) over N >= min_n."""
    pts = [(math.log(n), math.log(y)) for n, y in points if n >= min_n and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def sweep(args, device: torch.device) -> dict[str, dict[int, dict]]:
    results: dict[str, dict[int, dict]] = {p: {} for p in PATHS}
    t_start = time.perf_counter()
    n = args.min_n
    while n <= args.max_n:
        for path in PATHS:
            if results[path].get(n // 2, {}).get("skipped"):
                results[path][n] = {"skipped": "over the time budget"}
                continue
            left = args.budget - (time.perf_counter() - t_start)
            prev = results[path].get(n // 2)
            # Quadratic growth: the next size costs about 4x the last one, per repeat.
            if prev and "ms" in prev and 4 * prev["ms"] / 1e3 * (args.min_repeat + 2) > left:
                results[path][n] = {"skipped": "over the time budget"}
                continue
            try:
                results[path][n] = measure(path, n, args, device)
            except (RuntimeError, MemoryError) as e:  # out of memory
                results[path][n] = {"skipped": f"failed: {str(e).splitlines()[0][:60]}"}
            r = results[path][n]
            shown = f"{r['ms']:10.2f} ms {r['mib']:10.1f} MiB" if "ms" in r else r["skipped"]
            print(f"N={n:6d} {path:9s} {shown}", flush=True)
        n *= 2
    return results


def fits(results, min_n: int) -> dict[str, dict[str, float | None]]:
    out = {}
    for path, rows in results.items():
        ok = [(n, r) for n, r in sorted(rows.items()) if "ms" in r]
        out[path] = {"time": slope([(n, r["ms"]) for n, r in ok], min_n),
                     "memory": slope([(n, r["mib"]) for n, r in ok if r["mib"] > 1], min_n)}
    return out


def plot(results, slopes, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for ax, key, label in ((axes[0], "ms", "forward time (ms)"),
                           (axes[1], "mib", "peak extra memory (MiB)")):
        for path, style in zip(PATHS, ("o-", "s-"), strict=True):
            pts = [(n, r[key]) for n, r in sorted(results[path].items())
                   if key in r and r[key] > 0]
            if not pts:
                continue
            s = slopes[path]["time" if key == "ms" else "memory"]
            tag = f" (slope {s:.2f})" if s is not None else ""
            ax.plot(*zip(*pts, strict=True), style, label=f"{path}{tag}")
        ns = sorted({n for rows in results.values() for n in rows})
        for power, ls in ((1, ":"), (2, "--")):  # guide lines through the last fast point
            anchor = [(n, r[key]) for n, r in sorted(results["reference"].items())
                      if key in r and r[key] > 0]
            if anchor:
                n0, y0 = anchor[-1]
                ax.plot(ns, [y0 * (n / n0) ** power for n in ns], ls, color="grey", lw=0.8,
                        label=f"~N^{power}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def markdown(results, slopes, args, device, machine: str, png: Path, md: Path) -> str:
    rel = png.relative_to(md.parent) if png.is_relative_to(md.parent) else png
    lines = [START, "## Attention: time and memory against sequence length", "",
             f"`python bench/attention_scaling.py` on {machine}: batch {args.batch}, "
             f"{args.heads} heads of size {args.head_size}, {str(args.dtype)[6:]}, causal, "
             f"forward pass only. *reference* is `scaled_dot_product_attention` in "
             f"`minitransformer/nn/attention.py` (it materialises the N x N weights); *fast* "
             f"is PyTorch's fused `F.scaled_dot_product_attention(is_causal=True)`, the path "
             f"`MultiHeadAttention` takes when no weights are asked for. Time is the best of "
             f"at least {args.min_repeat} runs; on a shared machine the small sizes are the "
             f"noisiest. Memory is the peak growth while one call runs.", "",
             f"![attention time and memory against N, log-log]({rel})", "",
             "| N | reference ms | fast ms | fast speed-up | reference MiB | fast MiB |",
             "|---:|---:|---:|---:|---:|---:|"]
    for n in sorted({n for rows in results.values() for n in rows}):
        r, f = results["reference"].get(n, {}), results["fast"].get(n, {})

        def cell(x, key, fmt):
            return format(x[key], fmt) if key in x else x.get("skipped", "-")

        speed = f"{r['ms'] / f['ms']:.1f}x" if "ms" in r and "ms" in f else "-"
        lines.append(f"| {n} | {cell(r, 'ms', '.2f')} | {cell(f, 'ms', '.2f')} | {speed} | "
                     f"{cell(r, 'mib', '.1f')} | {cell(f, 'mib', '.1f')} |")

    def s(path, key):
        v = slopes[path][key]
        return "n/a" if v is None else f"{v:.2f}"

    lines += ["", f"Log-log slopes over N >= {args.fit_from}: reference time "
              f"{s('reference', 'time')}, memory {s('reference', 'memory')}; fast time "
              f"{s('fast', 'time')}, memory {s('fast', 'memory')}. A slope of 2 is "
              f"quadratic: both paths do the same O(N^2 d) arithmetic, so both times grow "
              f"about 4x per doubling of N (a little more for the reference path at the "
              f"largest sizes, where it writes and reads gigabyte-sized score matrices). Only "
              f"the reference path keeps O(N^2) memory; the fused kernel's extra memory grows "
              f"linearly (its output and per-block scratch), which is what lets long contexts "
              f"fit.", END]
    return "\n".join(lines) + "\n"


def write_section(md: Path, section: str) -> None:
    """Put the section between its markers in md, leaving every other section alone."""
    text = md.read_text(encoding="utf-8") if md.exists() else "# Benchmarks\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    md.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--min-n", type=int, default=64)
    p.add_argument("--max-n", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: PyTorch's); 1 is steadier on a busy machine")
    p.add_argument("--min-repeat", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per point")
    p.add_argument("--budget", type=float, default=170.0, help="seconds for the whole sweep")
    p.add_argument("--fit-from", type=int, default=1024, help="fit slopes over N >= this")
    p.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "attention_scaling.png")
    p.add_argument("--md", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    fixed_malloc_threshold()
    if device.type == "cuda":
        machine = torch.cuda.get_device_name(device)
    else:
        n = torch.get_num_threads()
        machine = f"{cpu_name()}, {n} thread{'s' if n > 1 else ''}"
    machine += f", torch {torch.__version__}"
    print(f"attention scaling on {machine}")
    results = sweep(args, device)
    slopes = fits(results, args.fit_from)
    for path in PATHS:
        print(f"{path}: time slope {slopes[path]['time']}, memory slope "
              f"{slopes[path]['memory']}")
    if not args.no_write:
        title = (f"causal attention, {args.heads} heads x {args.head_size}, batch "
                 f"{args.batch}, {machine}")
        plot(results, slopes, args.png, title)
        write_section(args.md, markdown(results, slopes, args, device, machine, args.png,
                                        args.md))
        print(f"wrote {args.png} and the section in {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
