"""A custom dataset for pipe: any `module:factory` returning the three splits works as `data.source`.

    pipe train --config examples/custom/custom.yaml --run runs/custom

pipe calls `load(cfg)` with the `DataConfig` and expects
`{"train": (x, y), "val": (x, y), "test": (x, y), "labels": [...]}`, x uint8 or float32 (N, C, H, W),
y integer class ids. This one is synthetic and deterministic (no download): 16x16 RGB noise images
whose class is the colour channel shifted up, plus a faint class-specific stripe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABELS = ["red", "green", "blue"]
_PER_CLASS = {"train": 80, "val": 20, "test": 20}  # 360 images in all
_SIZE = 16


def load(cfg: Any) -> dict[str, Any]:
    rng = np.random.default_rng(20261129)  # fixed: the data never depends on the training seed
    out: dict[str, Any] = {"labels": list(LABELS)}
    for split, n in _PER_CLASS.items():
        xs, ys = [], []
        for c in range(len(LABELS)):
            xs.append(_images(rng, c, n))
            ys.append(np.full(n, c, np.int64))
        x, y = np.concatenate(xs), np.concatenate(ys)
        order = rng.permutation(len(y))
        out[split] = (x[order], y[order])
    return out


def _images(rng: np.random.Generator, c: int, n: int) -> np.ndarray:
    img = rng.normal(110.0, 45.0, size=(n, 3, _SIZE, _SIZE))
    img[:, c] += 35.0  # the class signal: one channel brighter on average
    img[:, :, c::3, :] += 10.0  # a weak second cue: every third row from row c
    return np.clip(img, 0, 255).astype(np.uint8)
