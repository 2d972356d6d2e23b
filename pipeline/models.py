"""Model builders. Called from inside a stage's `run`, after paddle has been imported.

`model.name` is a built-in name or `package.module:factory`; a factory is called as
`factory(num_classes=K, input_shape=(C, H, W))` and must return a `paddle.nn.Layer` mapping a
float32 (N, C, H, W) batch to (N, K) logits. No pretrained weights are ever downloaded.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from pipeline.errors import InputError

BUILTIN = ("digits_cnn", "mlp", "resnet18", "mobilenet_v3_small")


def build(name: str, num_classes: int, input_shape: tuple[int, ...]) -> Any:
    import paddle

    if ":" in name:
        factory = import_factory(name, "--model")
        model = factory(num_classes=num_classes, input_shape=tuple(input_shape))
        if not isinstance(model, paddle.nn.Layer):
            raise InputError(f"--model {name}: factory returned {type(model).__name__}, not a paddle.nn.Layer")
        return model
    if name == "digits_cnn":
        return _digits_cnn(num_classes, input_shape[0])
    if name == "mlp":
        return _mlp(num_classes, input_shape)
    if name in ("resnet18", "mobilenet_v3_small"):
        c, h, w = input_shape
        if c != 3 or min(h, w) < 32:
            raise InputError(f"--model {name}: needs 3-channel input of at least 32x32, data is {c}x{h}x{w}")
        from paddle.vision import models as vm

        return getattr(vm, name)(pretrained=False, num_classes=num_classes)
    raise InputError(f"--model {name}: unknown model (built in: {', '.join(BUILTIN)}, or package.module:factory)")


def import_factory(spec: str, flag: str) -> Callable[..., Any]:
    """`package.module:factory` -> the callable, resolved from the working directory as `python -m` does.

    The `pipe` console script runs with its own directory, not the cwd, as sys.path[0], so a
    project's `examples.custom.model:build` would not import without this (also used by data.py)."""
    mod_name, _, fn_name = spec.partition(":")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        factory = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError, ValueError) as e:  # ValueError: empty module name
        raise InputError(f"{flag} {spec}: cannot import ({e})") from None
    if not callable(factory):
        raise InputError(f"{flag} {spec}: {fn_name} is not callable")
    return factory


def _digits_cnn(num_classes: int, channels: int) -> Any:
    """~60k parameters: three 3x3 conv blocks with BatchNorm, global average pooling, one linear."""
    from paddle import nn

    def block(cin: int, cout: int) -> list[Any]:
        return [nn.Conv2D(cin, cout, 3, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU()]

    return nn.Sequential(
        *block(channels, 32), *block(32, 64), nn.MaxPool2D(2),
        *block(64, 96), nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(96, num_classes),
    )


def _mlp(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    """No BatchNorm, no dropout: data-parallel runs match single-process runs up to float rounding."""
    from paddle import nn

    n = 1
    for d in input_shape:
        n *= int(d)
    return nn.Sequential(nn.Flatten(), nn.Linear(n, 64), nn.ReLU(), nn.Linear(64, num_classes))
