"""The built-in detector: a tiny CenterNet (Zhou et al., "Objects as Points", 2019) for `model.task: detection`.

conv-BN-ReLU down to stride 16, nearest 2x upsampling with lateral adds back to stride 4, and one small head
per output at stride 4. `forward(image)` returns the three raw heads by name (`pipeline/tasks/detection/__init__.py`
decodes them in numpy, after the engine):

    heatmap  [N, K, H/4, W/4]  class-centre logits (no sigmoid in the graph: it breaks the legacy export)
    size     [N, 2, H/4, W/4]  box (width, height) in stride-4 cells, i.e. input pixels / 4, plain regression
    offset   [N, 2, H/4, W/4]  the centre's (x, y) position inside its cell, in cells (0..1)

Separate outputs, not one concatenated tensor: int8 export gives each its own scale (notes/paddle-stack-facts.md
§16: the box regression is the sensitive part). H and W must be multiples of 16.
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import nn

HEATMAP_PRIOR_BIAS = -2.19  # sigmoid(-2.19) ~= 0.1, CenterNet's prior for the heatmap head


def _cbr(cin: int, cout: int, stride: int = 1, k: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2, bias_attr=False),
                         nn.BatchNorm2D(cout), nn.ReLU())


def _up2(x: Any) -> Any:
    """Nearest 2x upsampling as unsqueeze + tile + flatten (a reshape): F.interpolate fails in Paddle
    Inference's oneDNN on the PIR program and in paddle2onnx (facts §16 traps). No shape values are read,
    so H and W stay dynamic."""
    x = paddle.tile(paddle.unsqueeze(x, [3, 5]), [1, 1, 1, 2, 1, 2])  # [N, C, H, 2, W, 2]
    return paddle.flatten(paddle.flatten(x, 4, 5), 2, 3)


class CenterNetTiny(nn.Layer):
    def __init__(self, num_classes: int, channels: int = 3) -> None:
        super().__init__()
        self.s2 = nn.Sequential(_cbr(channels, 16, 2), _cbr(16, 16))
        self.s4 = nn.Sequential(_cbr(16, 32, 2), _cbr(32, 32))
        self.s8 = nn.Sequential(_cbr(32, 64, 2), _cbr(64, 64))
        self.s16 = _cbr(64, 128, 2)
        self.lat16 = _cbr(128, 64, k=1)
        self.fuse8 = _cbr(64, 32)
        self.fuse4 = _cbr(32, 32)
        self.heatmap = self._head(num_classes)
        self.size = self._head(2)
        self.offset = self._head(2)
        last = self.heatmap[-1]
        last.bias.set_value(paddle.full(last.bias.shape, HEATMAP_PRIOR_BIAS, last.bias.dtype))

    @staticmethod
    def _head(cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2D(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2D(32, cout, 1))

    def forward(self, image: Any) -> dict[str, Any]:
        c4 = self.s4(self.s2(image))
        c8 = self.s8(c4)
        p8 = self.fuse8(_up2(self.lat16(self.s16(c8))) + c8)
        p4 = self.fuse4(_up2(p8) + c4)
        return {"heatmap": self.heatmap(p4), "size": self.size(p4), "offset": self.offset(p4)}


def centernet_tiny(num_classes: int, channels: int = 3) -> nn.Layer:
    """~210k parameters for 3 classes; input float32 [N, channels, H, W] (normalised, H and W multiples of 16)."""
    return CenterNetTiny(num_classes, channels)
