"""--log tensorboard: the rows of log.csv as TensorBoard scalars, for a run and for compare."""

from __future__ import annotations

import csv
import shutil

import pytest

from minitransformer.cli import main

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

TINY = ["--preset", "debug", "--n_layer", "1", "--n_embd", "32", "--n_head", "2",
        "--block_size", "16", "--batch_size", "8", "--eval_iters", "2", "--log_interval", "2",
        "--sample_tokens", "0", "--quiet", "--dtype", "float32"]


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def csv_column(path, name) -> list[tuple[int, float]]:
    with open(path, newline="") as f:
        return [(int(r["step"]), float(r[name])) for r in csv.DictReader(f) if r[name]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("tb") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 100, encoding="utf-8")
    return path


def test_a_run_writes_the_csv_rows_as_scalars_and_a_resume_drops_the_later_ones(corpus,
                                                                                 tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), *TINY, "--max_iters", "12",
                 "--eval_interval", "6", "--log", "tensorboard", "--keep_last", "5"]) == 0
    got = scalars(out / "tensorboard")
    for name, tag in (("train_loss", "loss/train_loss"), ("val_loss", "loss/val_loss"),
                      ("lr", "train/lr")):
        want = csv_column(out / "log.csv", name)
        assert [s for s, _ in got[tag]] == [s for s, _ in want]
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want], rel=1e-5), tag
    # the training and the evaluation row of a step both carry elapsed_s: one point a step
    steps = [s for s, _ in got["train/elapsed_s"]]
    assert steps == sorted(set(steps)) and 12 in steps
    # resume from step 6 to 12 again: the events after step 6 are purged, then rewritten
    shutil.rmtree(out / "checkpoints" / "step_0000012")
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    again = scalars(out / "tensorboard")
    assert [s for s, _ in again["loss/val_loss"]] == [0, 6, 12]


def test_csv_only_by_default(corpus, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), *TINY, "--max_iters",
                 "4", "--eval_interval", "4"]) == 0
    assert not (out / "tensorboard").exists()


def test_compare_writes_one_event_folder_per_variant(corpus, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "--data", str(corpus), "--out", str(out), "--vary",
                 "norm=layernorm,rmsnorm", *TINY, "--max_iters", "4", "--eval_interval", "4",
                 "--log", "tensorboard"]) == 0
    folders = sorted(p.parent.name for p in out.glob("*/tensorboard"))
    assert len(folders) == 2, folders
    for folder in out.glob("*/tensorboard"):
        assert "loss/val_loss" in scalars(folder)
