"""Two named inputs per sample for pipe: a factory's x may be a mapping of input name -> array.

    pipe train --config examples/two_inputs.yaml --run runs/two_inputs

`load(cfg)` returns `{"train": ({"img": img, "feat": feat}, y), "val": ..., "test": ..., "labels": [...]}`:
`img` uint8 (N, 1, 8, 8) images (normalised by pipe like any image input) and `feat` float32 (N, 4) side
features (given to the model as they are). Synthetic and deterministic: the class is 2 * a + b, where the
image shows a (a bright top half or bottom half) and the features show b (which pair of features is
raised), so neither input alone tells more than half of the classes apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABELS = ["top-left", "top-right", "bottom-left", "bottom-right"]
_PER_CLASS = {"train": 64, "val": 16, "test": 16}  # 384 samples in all


def load(cfg: Any) -> dict[str, Any]:
    rng = np.random.default_rng(20261201)  # fixed: the data never depends on the training seed
    out: dict[str, Any] = {"labels": list(LABELS)}
    for split, n in _PER_CLASS.items():
        y = np.repeat(np.arange(len(LABELS), dtype=np.int64), n)
        y = y[rng.permutation(len(y))]
        a, b = y // 2, y % 2
        img = rng.normal(100.0, 40.0, size=(len(y), 1, 8, 8))
        img[a == 0, :, :4] += 45.0  # the image's cue: which half is brighter
        img[a == 1, :, 4:] += 45.0
        feat = rng.normal(0.0, 1.0, size=(len(y), 4))
        feat[b == 0, :2] += 1.5  # the features' cue: which pair is raised
        feat[b == 1, 2:] += 1.5
        out[split] = ({"img": np.clip(img, 0, 255).astype(np.uint8), "feat": feat.astype(np.float32)}, y)
    return out
