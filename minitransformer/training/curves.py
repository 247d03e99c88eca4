"""The loss-curve PNG written beside log.csv: train and val loss against step."""

from __future__ import annotations

import csv
from pathlib import Path


def plot_loss_curve(csv_path: Path, png_path: Path) -> None:
    """Plot train loss (every log step) and val loss (every evaluation) from log.csv."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, val = ([], []), ([], [])
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for key, series in (("train_loss", train), ("val_loss", val)):
                if row.get(key):
                    series[0].append(int(row["step"]))
                    series[1].append(float(row[key]))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(*train, label="train", lw=1, alpha=0.8)
    ax.plot(*val, "o-", label="val", lw=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = Path(png_path).with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(png_path)
