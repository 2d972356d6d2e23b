"""Classification, the task pipe trains, judges and serves today, in one place.

What the stages know about the task is here and only here: training's objective and metric, which epoch
is better, a compressed variant's fidelity to fp32, and /v1's answer. The stages call these on the
logits output (the io description, `pipeline/iospec.py`, says which output that is) and never argmax or
cross-entropy themselves, so another task (issue 20: `model.task`, detection) replaces this module's
functions behind the same calls and leaves the stages alone.

    loss(F, logits, y, smoothing)         training's objective (paddle tensors)
    eval_sums(F, logits, y)               one evaluation batch's (loss sum, correct): summed over a split
    better(monitor, acc, loss, best...)   whether an epoch beats the best so far (best checkpoint, patience)
    predict / accuracy / agreement        numpy logits: top-1, accuracy against labels, top-1 agreement
    answer(logits, labels)                /v1's labels, softmax scores and logits per sample
"""

from __future__ import annotations

from typing import Any

import numpy as np


def loss(F: Any, logits: Any, y: Any, smoothing: float = 0.0) -> Any:
    """Mean cross-entropy of `logits` [N, K] against integer labels `y` [N], with label smoothing."""
    return F.cross_entropy(logits, y, label_smoothing=smoothing)


def eval_sums(F: Any, logits: Any, y: Any) -> tuple[float, float]:
    """(summed cross-entropy, correct top-1 count) of one batch: a split's totals, all-reduced across ranks
    and divided by its size, give its loss and accuracy."""
    return (float(F.cross_entropy(logits, y, reduction="sum")),
            float((logits.argmax(axis=1) == y).astype("float32").sum()))


def better(monitor: str, acc: float, loss_: float, best_acc: float | None, best_loss: float | None) -> bool:
    """Whether an epoch's (val_acc, val_loss) beats the best so far: by `monitor`, a tie going to the
    other one. The best checkpoint and patience both use it."""
    if best_acc is None or best_loss is None:
        return True
    if monitor == "val_loss":
        return loss_ < best_loss or (loss_ == best_loss and acc > best_acc)
    return acc > best_acc or (acc == best_acc and loss_ < best_loss)


def predict(logits: np.ndarray) -> np.ndarray:
    """Each sample's class: the top-1 of its logits."""
    return np.asarray(logits).argmax(axis=1)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((predict(logits) == np.asarray(y)).mean())


def agreement(got: np.ndarray, ref: np.ndarray) -> float:
    """The share of samples whose top-1 class is the same in `got` and `ref` (e.g. int8 and fp32 logits)."""
    return float((predict(got) == predict(ref)).mean())


def answer(logits: np.ndarray, labels: list[str]) -> dict[str, Any]:
    """/v1's answer for a batch: each sample's label, its softmax probability, and the logits."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = p.argmax(axis=1)
    return {"labels": [labels[i] for i in top], "scores": [float(p[r, i]) for r, i in enumerate(top)],
            "logits": logits.tolist()}
