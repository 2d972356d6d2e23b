"""The user-task example's model (task.py): a small CNN whose one output `count` is a number per image.

pipe calls `build(num_classes=K, input_shape=(C, H, W))`; a regression model ignores num_classes and
returns {"count": [N, 1]} (named outputs: the task reads the one it knows by name).
"""

from __future__ import annotations

from typing import Any


def build(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    import paddle
    from paddle import nn

    class Counter(nn.Layer):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2D(channels, 16, 3, padding=1), nn.ReLU(), nn.Conv2D(16, 16, 3, padding=1), nn.ReLU(),
                nn.Conv2D(16, 1, 1))  # a density map: its sum over the image is the count

        def forward(self, x: Any) -> dict[str, Any]:
            # the sum over 256 pixels, scaled so that a fresh model predicts about 0, not hundreds
            return {"count": paddle.sum(self.body(x), axis=[2, 3]) * 0.05}

    return Counter(int(input_shape[0]))
