"""Classification: cross-entropy on a logits output, top-1 accuracy, labels with softmax scores on /v1.

The logits are the output `info.logits` names (model.logits_output, or the only output); every stage
reaches them through this module's contract (pipeline/tasks/__init__.py) and never argmaxes itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import InputError

name = "classification"
metrics = ("acc",)
monitor = "acc"
maximize = True
settings: dict[str, Any] = {}
logits = True
data = "labels"


def check_outputs(outputs: dict[str, np.ndarray], info: Any, where: str) -> None:
    z = outputs[info.logits]
    n, k = len(next(iter(outputs.values()))), len(info.labels)
    if z.dtype.kind != "f" or list(z.shape) != [n, k]:
        raise InputError(f"{where}: the logits output {info.logits!r} is {z.dtype} {list(z.shape)} for {n} "
                         f"samples; classification needs float [{n}, {k}] ({k} labels)")


def targets(y: np.ndarray, feeds: dict[str, np.ndarray], info: Any) -> np.ndarray:
    """A batch's labels as int64 class ids."""
    return np.asarray(y, np.int64)


def loss(F: Any, outputs: dict[str, Any], targets: Any, info: Any) -> Any:
    """Mean cross-entropy of the logits [N, K] against class ids [N], with train.label_smoothing."""
    return F.cross_entropy(outputs[info.logits].astype("float32"), targets, label_smoothing=info.label_smoothing)


def predict(logits: np.ndarray) -> np.ndarray:
    """Each sample's class: the top-1 of its logits."""
    return np.asarray(logits).argmax(axis=1)


def metrics_of(outputs: dict[str, np.ndarray], y: np.ndarray, info: Any) -> dict[str, float]:
    return {"acc": float((predict(outputs[info.logits]) == np.asarray(y)).mean())}


def fidelity(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> dict[str, float]:
    """The share of samples whose top-1 class is the same in `got` and `ref` (e.g. int8 and fp32)."""
    return {"top1_agreement": float((predict(got[info.logits]) == predict(ref[info.logits])).mean())}


def answer(outputs: dict[str, np.ndarray], info: Any, sizes: Any = None) -> dict[str, Any]:
    """/v1's answer for a batch: each sample's label, its softmax probability, and the logits."""
    logits = outputs[info.logits]
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = p.argmax(axis=1)
    return {"labels": [info.labels[i] for i in top], "scores": [float(p[r, i]) for r, i in enumerate(top)],
            "logits": logits.tolist()}
