"""Data for the user-task example (task.py): 16x16 grey images with 0 to 5 bright dots; the target is the count.

    pipe all --config examples/counting/counting.yaml --run runs/counting

A `module:factory` data source (see examples/custom/data.py): y holds integer counts, which the task reads as
numbers to regress, not as classes. Synthetic and deterministic, no download.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_DOTS = 5
_COUNTS = {"train": 600, "val": 120, "test": 120}
_SIZE = 16


def load(cfg: Any) -> dict[str, Any]:
    rng = np.random.default_rng(20261202)  # fixed: the data never depends on the training seed
    out: dict[str, Any] = {"labels": [str(k) for k in range(MAX_DOTS + 1)]}  # the counts a sample may have
    for split, n in _COUNTS.items():
        y = rng.integers(0, MAX_DOTS + 1, n)
        x = rng.normal(60.0, 12.0, size=(n, 1, _SIZE, _SIZE))
        for i, k in enumerate(y):  # k dots of 2x2 pixels at distinct cells of a 4x4 grid
            for cell in rng.choice(16, k, replace=False):
                r, c = 4 * (cell // 4) + rng.integers(0, 3), 4 * (cell % 4) + rng.integers(0, 3)
                x[i, 0, r:r + 2, c:c + 2] += 150.0
        out[split] = (np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64))
    return out
