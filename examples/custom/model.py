"""A custom model for pipe: any `module:factory` returning a `paddle.nn.Layer` works as `model.name`.

    pipe train --config examples/custom/custom.yaml --run runs/custom

pipe calls `build(num_classes=K, input_shape=(C, H, W))` after it has imported paddle; the layer maps a
float32 (N, C, H, W) batch to (N, K) logits. Run from the repo root: `examples.custom.model` resolves
from the working directory, as with `python -m`.
"""

from __future__ import annotations

from typing import Any


def build(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    """Two conv blocks and a linear head, ~6k parameters: enough for the colour-shift data in data.py."""
    from paddle import nn  # imported here so `pipe --help` never loads paddle

    channels = int(input_shape[0])
    return nn.Sequential(
        nn.Conv2D(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
        nn.Conv2D(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2D(1),
        nn.Flatten(), nn.Linear(32, num_classes),
    )
