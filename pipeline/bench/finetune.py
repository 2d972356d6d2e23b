"""`make bench` rows for fine-tuning (`model.init`): does starting from weights trained on related data pay?

    python -c "from pipeline.bench import finetune; print(finetune.rows())"

Related data: the digits 0-4 alone (a 5-class task, digits' own split). The source run trains digits_cnn on
it; then, side by side and with the same config, seed and epochs, digits_cnn trains on all ten digits from
scratch and from the source run's weights (`--init`; the 10-class head has another shape, so it starts
fresh, as the one-line note says). Read from each run's metrics.csv: the epochs each needs to reach the
from-scratch run's best validation accuracy, and both validation accuracies after that many epochs.
Training on the CPU is deterministic: one run each.
"""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import numpy as np

from pipeline import config as config_mod, data as data_mod

_DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits.yaml"
_EPOCHS = 6


def rows() -> list[tuple[str, str, str, str]]:
    from stages import train as train_stage

    with tempfile.TemporaryDirectory(prefix="pipe-bench-finetune-") as tmp:
        tmp = Path(tmp)
        src = _half_digits(tmp / "digits-0-4.npz")
        runs = {}
        for name, sets in (("source", [f"data.source={src}"]), ("scratch", []),
                           ("init", [f"model.init={tmp / 'source' / 'train'}"])):
            cfg = config_mod.load(_DIGITS, [f"train.epochs={_EPOCHS}", *sets])
            out = train_stage.run(cfg, tmp / name / "train", view=lambda ev: None)
            runs[name] = _val_acc(out / "metrics.csv"), json.loads((out / "manifest.json").read_text())
    scratch, init = runs["scratch"][0], runs["init"][0]
    best = max(scratch)
    reach = {k: next((i + 1 for i, v in enumerate(c) if v >= best), None) for k, c in (("scratch", scratch),
                                                                                       ("init", init))}
    k = reach["init"] or _EPOCHS
    loaded = runs["init"][1]["init"]
    note = (f"digits_cnn, {_EPOCHS} epochs; init from a digits 0-4 run (loaded {loaded['loaded']} tensors, "
            f"{len(loaded['shape_mismatch'])} head tensors fresh)")
    got = lambda n: "not reached" if n is None else f"{n}"  # noqa: E731
    return [
        (f"fine-tuning: {note}: epochs to reach scratch's best val_acc {best:.4f}, init / scratch",
         f"{got(reach['init'])} / {got(reach['scratch'])}", "init fewer", "met" if (reach["init"] or 99) <
         (reach["scratch"] or 99) else "**missed**"),
        (f"fine-tuning: val_acc after {k} epoch(s), init / scratch", f"{init[k - 1]:.4f} / {scratch[k - 1]:.4f}",
         "init higher", "met" if init[k - 1] > scratch[k - 1] else "**missed**"),
        ("fine-tuning: val_acc after 1 epoch, init / scratch", f"{init[0]:.4f} / {scratch[0]:.4f}", "reported", ""),
        ("fine-tuning: test accuracy after all epochs, init / scratch",
         f"{runs['init'][1]['metrics']['test_acc']:.4f} / {runs['scratch'][1]['metrics']['test_acc']:.4f}",
         "reported", ""),
    ]


def _half_digits(path: Path) -> Path:
    """digits 0-4 with digits' own split, as an .npz the data layer reads."""
    ds = data_mod.load(config_mod.load(_DIGITS).data)
    xs, ys, splits = [], [], []
    for k, sp in enumerate((ds.train, ds.val, ds.test)):
        keep = sp.idx[np.asarray(sp.y[sp.idx]) < 5]
        (x,) = sp.inputs.values()  # digits: one input
        xs.append(np.asarray(x[keep]))
        ys.append(np.asarray(sp.y[keep]))
        splits.append(np.full(len(keep), k))
    np.savez(path, x=np.concatenate(xs), y=np.concatenate(ys), split=np.concatenate(splits),
             labels=np.array([str(i) for i in range(5)]))
    return path


def _val_acc(metrics_csv: Path) -> list[float]:
    with open(metrics_csv, newline="") as f:
        return [float(r["val_acc"]) for r in csv.DictReader(f)]
