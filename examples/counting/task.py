"""A user's own task for pipe (`model.task: examples.counting.task:Counting`): counting as regression.

    pipe all --config examples/counting/counting.yaml --run runs/counting

The contract is pipeline/tasks/__init__.py; this class supplies every part of it a stage needs, and pipe
imports nothing else of it. Its loss is mean squared error on the model's `count` output, its monitored
metric the mean absolute error (lower is better: `maximize = False`), its /v1 answer each image's count.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Counting:
    name = "counting"
    metrics = ("mae", "exact")  # mean absolute error; share of images whose rounded count is right
    monitor = "mae"
    maximize = False
    settings: dict[str, Any] = {}

    def check_outputs(self, outputs: dict[str, np.ndarray], info: Any, where: str) -> None:
        from pipeline.errors import InputError

        z, n = outputs.get("count"), len(next(iter(outputs.values())))
        if z is None or z.dtype.kind != "f" or list(z.shape) != [n, 1]:
            raise InputError(f"{where}: counting needs a float output 'count' [{n}, 1], the model returns "
                             + ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items()))

    def targets(self, y: np.ndarray, feeds: dict[str, np.ndarray], info: Any) -> np.ndarray:
        return np.asarray(y, np.float32)[:, None]

    def loss(self, F: Any, outputs: dict[str, Any], targets: Any, info: Any) -> Any:
        return F.mse_loss(outputs["count"].astype("float32"), targets)

    def metrics_of(self, outputs: dict[str, np.ndarray], y: np.ndarray, info: Any) -> dict[str, float]:
        got, want = np.asarray(outputs["count"], np.float64)[:, 0], np.asarray(y, np.float64)
        return {"mae": float(np.abs(got - want).mean()), "exact": float((np.round(got) == want).mean())}

    def answer(self, outputs: dict[str, np.ndarray], info: Any, sizes: Any = None) -> dict[str, Any]:
        got = np.asarray(outputs["count"], np.float64)[:, 0]
        return {"counts": [round(float(v), 4) for v in got], "rounded": [int(max(0, round(v))) for v in got]}
