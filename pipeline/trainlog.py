"""A training run's logs as files: `steps.csv` (one row per optimizer step), `metrics.csv` (one per epoch)
and `curves.png` (the loss curves and the monitored validation metric's).

Every checkpoint and the `train/` artifact hold both CSVs; a resume reads them back exactly (floats are
written by `repr`), so a resumed run's logs equal an uninterrupted run's.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

STEP_FIELDS = ["step", "epoch", "loss", "lr"]
EPOCH_FIELDS = ["epoch", "step", "train_loss", "val_loss", "val_acc", "lr", "img_per_s", "loss_scale",
                "skipped_steps"]  # classification's; `epoch_fields` gives any task's


def epoch_fields(metrics: tuple[str, ...]) -> list[str]:
    """metrics.csv's columns for a task reporting `metrics` over the validation split."""
    return ["epoch", "step", "train_loss", "val_loss", *(f"val_{m}" for m in metrics), *EPOCH_FIELDS[5:]]


def write_csv(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of `write_csv`, each value back as an int, a float or "" (an empty cell)."""
    def parse(v: str) -> Any:
        if v == "":
            return ""
        try:
            return int(v)
        except ValueError:
            return float(v)

    with open(path, newline="", encoding="utf-8") as f:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


def plot(path: Path, steps: list[dict[str, Any]], epochs: list[dict[str, Any]], metric: str = "val_acc") -> None:
    """The loss curves and the validation `metric` (a metrics.csv column) per epoch."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="train (step)")
    if epochs:
        ax1.plot([r["step"] for r in epochs], [r["val_loss"] for r in epochs], "o-", label="val (epoch)")
        ax2.plot([r["epoch"] + 1 for r in epochs], [r[metric] for r in epochs], "o-", color="tab:green")
    ax1.set(xlabel="step", ylabel="loss", title="loss")
    ax1.legend()
    what = {"val_acc": "accuracy", "val_map": "mAP@[.5:.95]", "val_map50": "mAP@.5"}.get(metric, metric.removeprefix("val_"))
    ax2.set(xlabel="epoch", ylabel=what, title=f"validation {what}")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
