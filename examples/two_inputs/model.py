"""A model with two named inputs and two outputs for pipe.

    pipe train --config examples/two_inputs.yaml --run runs/two_inputs

pipe calls `build(num_classes=K, input_shape=..., input_shapes={"img": (1, 8, 8), "feat": (4,)})` and then
the layer by keyword, `net(img=..., feat=...)`: its forward names both inputs. It returns a dict
`{"logits": (N, K), "embedding": (N, 16)}`; classification reads `logits`, and the interface lists the
outputs in sorted key order (embedding, logits), the order `paddle.jit.save` gives a dict's outputs.
No BatchNorm and no dropout: a 2-process run matches a 1-process run up to float rounding.
"""

from __future__ import annotations

from typing import Any


def build(num_classes: int, input_shape: tuple[int, ...], input_shapes: dict[str, tuple[int, ...]]) -> Any:
    import paddle  # imported here so `pipe --help` never loads paddle
    from paddle import nn

    channels, h, w = input_shapes["img"]
    (features,) = input_shapes["feat"]

    class TwoInputs(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2D(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2), nn.Flatten())
            self.img_fc = nn.Linear(8 * (h // 2) * (w // 2), 16)
            self.feat_fc = nn.Linear(features, 16)
            self.embed = nn.Linear(32, 16)
            self.head = nn.Linear(16, num_classes)

        def forward(self, img: Any, feat: Any) -> dict[str, Any]:
            both = paddle.concat([self.img_fc(self.conv(img)), self.feat_fc(feat)], axis=1)
            embedding = nn.functional.relu(self.embed(nn.functional.relu(both)))
            return {"logits": self.head(embedding), "embedding": embedding}

    return TwoInputs()
