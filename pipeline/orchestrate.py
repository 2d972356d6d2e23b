"""`pipe all`: every stage in order into one run directory, each reading the previous one's artifact.

    pipe all --config examples/digits.yaml --run runs/digits

train -> export -> compress (when `compress.int8`) -> package. What gets packaged is said, with why:
the int8 Paddle variant when compress measured it faster than fp32 on this machine (its accuracy has
already passed the compress gate), else fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

from pipeline.config import RunConfig

STAGES = ("train", "export", "compress", "package")  # in order; compress only with compress.int8


def run_all(cfg: RunConfig, run_dir: Path, resume: str | None = None,
            say: Callable[[str], None] = print) -> Iterator[Path]:
    from stages import compress, export, package, train

    train_dir = train.run(cfg, run_dir / "train", resume=resume)
    yield train_dir
    export_dir = export.run(cfg, train_dir, run_dir / "export")
    yield export_dir
    model_dir, precision = export_dir, "fp32"
    if cfg.compress.int8:
        model_dir = compress.run(cfg, export_dir, run_dir / "compress")
        yield model_dir
        precision = _pick(model_dir, say)
    yield package.run(package.PackageConfig(precision=precision), model_dir, run_dir / "package")


def _pick(compress_dir: Path, say: Callable[[str], None]) -> str:
    """int8 only if it pays here: `pipe serve` runs Paddle Inference, so the int8-paddle variant decides."""
    variants = json.loads((compress_dir / "manifest.json").read_text())["metrics"]["variants"]
    int8 = variants.get("int8-paddle") or {}
    if int8.get("supported", True) and int8.get("faster_than_fp32"):
        say(f"package: int8 (int8-paddle measured faster than fp32: {int8.get('note', '')})")
        return "int8"
    say(f"package: fp32 (int8-paddle was not faster than fp32 on this machine: {int8.get('note', 'not built')})")
    return "fp32"
