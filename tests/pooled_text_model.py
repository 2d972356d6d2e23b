"""A text model oneDNN bf16 cannot run on Paddle 3.3.1, for the test that such a model is recorded, not fatal.

`module:factory` form: `--model tests.pooled_text_model:pooled_bag`. Its mean over time is a 1-D average
pool, which oneDNN's bf16 passes reject ("(InvalidArgument) the input of Op(pool) should be 4-D or 5-D
Tensor"); the built-in text models average with einsums instead and do run in bf16.
"""

from typing import Any


def pooled_bag(num_classes: int, input_shape: tuple[int, ...], vocab_size: int) -> Any:
    from paddle import nn

    class PooledBag(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, 32, padding_idx=0)
            self.fc = nn.Linear(32, num_classes)

        def forward(self, x: Any) -> Any:
            e = self.embed(x).transpose([0, 2, 1])  # (N, E, L)
            return self.fc(nn.functional.adaptive_avg_pool1d(e, 1).squeeze(-1))

    return PooledBag()
