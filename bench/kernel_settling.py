"""How a decoding step's speed settles after a switch of kernel, and which kernel trials choose.

Config (b) of the benchmarks (6 layers, 6 heads, 384 wide), fp32, the threads given:

- by pass after a switch: steps of ``--rows`` rows through one ``packed_weights`` scope, the
  kernel fixed (``nn.kernels.KERNEL``) and switched every ``--run`` steps in the order MKL,
  BLAS, oneDNN's packed copy, ``--repeats`` times; the median milliseconds of the i-th step
  after a switch, for each kernel. A trial (``nn.kernels.trial_schedule``) times only passes
  after its turn's untimed ones, since decoding on one kernel sees the settled speed;
- trials: ``--models`` fresh models, each generating 100 tokens of ``--rows`` rows after
  ``decoding_threads`` as ``sample`` runs it; which kernel each trial chose, and its timed
  passes.

    python bench/kernel_settling.py --rows 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from minitransformer.nn import kernels
from minitransformer.nn.linear import packed_weights
from minitransformer.training.device import decoding_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation import CONFIG_B, build  # noqa: E402


def by_pass(rows: int, run: int, repeats: int) -> dict[str, list[float]]:
    """{kernel: median ms of the i-th step after switching to it}."""
    names = [k for k in ("mkl", "blas", "packed") if k != "mkl" or kernels.mkl_works()]
    model, x = build(), torch.zeros(rows, 1, dtype=torch.long)
    times = {k: [[] for _ in range(run)] for k in names}
    before = kernels.KERNEL
    try:
        with torch.inference_mode(), packed_weights(model):
            cache = model.new_cache(CONFIG_B["block_size"])
            model(x, cache=cache)
            for _ in range(repeats):
                for k in names:
                    kernels.KERNEL = k
                    for i in range(run):
                        t0 = time.perf_counter()
                        model(x, cache=cache)
                        times[k][i].append((time.perf_counter() - t0) * 1e3)
    finally:
        kernels.KERNEL = before
    return {k: [statistics.median(t) for t in v] for k, v in times.items()}


def trials(rows: int, models: int) -> list[tuple[str | None, dict[str, list[float]]]]:
    """(the kernel chosen for ``rows`` rows, {kernel: its timed passes in ms}) per model."""
    seen: dict[int, kernels.Trial] = {}
    real = kernels.KernelChoice.trial_kernel

    def watched(self, bucket, module):  # keeps each trial, to read its timed passes
        trial = self.trials.get(bucket)
        if trial is not None and bucket[0] == kernels.next_power_of_two(rows):
            seen[id(self)] = trial
        return real(self, bucket, module)

    out = []
    kernels.KernelChoice.trial_kernel = watched
    try:
        for _ in range(models):
            model = build()
            decoding_threads(model, torch.device("cpu"), rows)
            model.generate(torch.zeros(rows, 1, dtype=torch.long), 100, temperature=1.0, seed=1)
            choice = kernels.choice_for(model)
            bucket = (kernels.next_power_of_two(rows), torch.get_num_threads())
            timed: dict[str, list[float]] = {}
            trial = seen.get(id(choice))
            for k, s in trial.timed if trial is not None else []:
                timed.setdefault(k, []).append(round(s * 1e3, 2))
            out.append((choice.chosen.get(bucket), timed))
    finally:
        kernels.KernelChoice.trial_kernel = real
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--run", type=int, default=8, help="steps on a kernel before switching")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--models", type=int, default=4, help="fresh models whose trials to show")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"config (b), {a.rows} rows, {a.threads} threads: ms a step by step after a switch "
          f"(medians of {a.repeats})")
    print("| kernel | " + " | ".join(str(i + 1) for i in range(a.run)) + " |")
    print("|---|" + "---:|" * a.run)
    for k, ms in by_pass(a.rows, a.run, a.repeats).items():
        print(f"| {k} | " + " | ".join(f"{t:.2f}" for t in ms) + " |")
    if a.models:
        print(f"\ntrials of {a.models} fresh models ({a.rows} rows, 100 tokens after "
              "decoding_threads): chosen, timed passes in ms")
        for chosen, timed in trials(a.rows, a.models):
            torch.set_num_threads(a.threads)
            print(f"- {chosen}: {timed}")


if __name__ == "__main__":
    main()
