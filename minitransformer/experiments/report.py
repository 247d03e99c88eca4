"""The comparison's figure and tables: overlaid val-loss curves, loss against window length."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def _fmt_loss(value) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None or math.isnan(value) else f"{value:.4f}"


def _lengths(results) -> list[int]:
    return sorted({n for r in results for n in r.lengths})


def _note(result) -> str:
    if result.stopped_early:
        return "stopped early (overfitting)"
    return "overfitting warning" if result.warnings else ""


def table_rows(results) -> tuple[list[str], list[list]]:
    """Header and rows with plain values (for the CSV)."""
    lengths = _lengths(results)
    header = ["variant", *results[0].variant.fields, "final_val_loss", "best_val_loss",
              "tokens_per_s", "parameters", "steps", "train_seconds",
              *[f"val_loss_at_{n}" for n in lengths], "note"]
    rows = []
    for r in results:
        rows.append([r.variant.name, *r.variant.fields.values(), f"{r.final_val_loss:.6g}",
                     f"{r.best_val_loss:.6g}", f"{r.tokens_per_s:.0f}", r.parameters, r.steps,
                     f"{r.train_seconds:.1f}",
                     *[_fmt_loss(r.lengths.get(n, "")) for n in lengths], _note(r)])
    return header, rows


def markdown_table(results) -> str:
    lengths = _lengths(results)
    notes = any(_note(r) for r in results)
    header = ["variant", "final val loss", "best val loss", "tokens/s", "parameters", "steps",
              *[f"val loss @{n}" for n in lengths], *(["note"] if notes else [])]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1 - notes)
                            + (["---"] if notes else [])) + "|"]
    for r in results:
        cells = [r.variant.label, f"{r.final_val_loss:.4f}", f"{r.best_val_loss:.4f}",
                 f"{r.tokens_per_s:,.0f}", f"{r.parameters:,}", str(r.steps),
                 *[_fmt_loss(r.lengths.get(n, "")) for n in lengths],
                 *([_note(r)] if notes else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def val_curve(log_path: Path, x_axis: str) -> tuple[list[float], list[float]]:
    """(x, val loss) from a run's log.csv; x is the step or the training seconds."""
    xs, ys = [], []
    with open(log_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row.get("val_loss"):
                xs.append(float(row["elapsed_s"] if x_axis == "time" else row["step"]))
                ys.append(float(row["val_loss"]))
    return xs, ys


def plot_comparison(results, out_dir: Path, png_path: Path, block_size: int | None = None,
                    x_axis: str = "step") -> None:
    """Left: every variant's val loss during training. Right (with eval lengths): the best
    model's val loss against the window length, the training context marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [n for n in _lengths(results)  # only lengths some variant could be evaluated at
               if any(isinstance(r.lengths.get(n), float) for r in results)]
    fig, axes = plt.subplots(1, 2 if lengths else 1, figsize=(12 if lengths else 7, 4.5),
                             dpi=100, squeeze=False)
    ax = axes[0][0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(results):
        xs, ys = val_curve(Path(out_dir) / r.variant.name / "log.csv", x_axis)
        if xs and xs[0] == 0 and len(xs) > 2:  # the untrained model squeezes the scale
            xs, ys = xs[1:], ys[1:]
        ax.plot(xs, ys, "o-", ms=3, lw=1.6, color=colors[i % len(colors)],
                label=f"{r.variant.label} ({r.best_val_loss:.3f})")
    ax.set_xlabel("training time (s)" if x_axis == "time" else "step")
    ax.set_ylabel("val loss (nats/token)")
    ax.set_title("validation loss during training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if lengths:
        ax = axes[0][1]
        for i, r in enumerate(results):
            pts = [(n, v) for n, v in sorted(r.lengths.items()) if isinstance(v, float)]
            failed = sorted({v for v in r.lengths.values() if isinstance(v, str)})
            label = r.variant.label + (f" ({'; '.join(failed)} beyond)" if failed else "")
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", ms=4, lw=1.6,
                        color=colors[i % len(colors)], label=label)
        if block_size:
            ax.axvline(block_size, color="grey", ls="--", lw=1,
                       label=f"training context ({block_size})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("evaluation window (tokens)")
        ax.set_ylabel("val loss (nats/token)")
        ax.set_title("length extrapolation (best model)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = Path(png_path).with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(png_path)
