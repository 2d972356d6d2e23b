"""`pipe all`: every stage in order into one run directory, each reading the previous one's artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pipeline.config import RunConfig

STAGES = ("train", "export")  # the stages this version has, in order


def run_all(cfg: RunConfig, run_dir: Path, resume: str | None = None) -> Iterator[Path]:
    from stages import export, train

    train_dir = train.run(cfg, run_dir / "train", resume=resume)
    yield train_dir
    yield export.run(cfg, train_dir, run_dir / "export")
