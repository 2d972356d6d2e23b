"""ocr_cls's data: line images (RGB uint8 [H, W, 3]) with their orientation label, train/val/test, as ocr_rec's
`Lines` whose `texts` hold each line's label ("0" or "180": the model's labels).

- `ocr_lines` (built in, the name ocr_rec's generated lines have): ocr_rec's generator (`ocr_rec.data.generated`:
  corpus lines rendered in its font, sizes, shades, noise and blur), with any letter, digit or punctuation of
  the corpus (the classifier reads no key file), each line turned by 180 degrees with probability 0.5 by a
  seeded generator and labelled "180", else "0". Deterministic by seed; `data.ocr_lines` lines for train, 15%
  as many each for val and test. Not cached: ~7 ms a line here (1,300 lines for the default 1,000 in ~9 s).
- PaddleOCR's cls label files (configs/cls/cls_mv3.yml: train.txt, test.txt; val.txt too), each line
  `image_path<TAB>0` or `image_path<TAB>180`, the path relative to the label file's folder: the format of
  ocr_rec's label files, given and read as ocr_rec's are (a folder holding any of train.txt, val.txt,
  test.txt, a missing val or test carved out of train when there is one; or one label file or several
  comma-separated: the test split); a label that is not one of the model's is refused first, naming the file
  and line (PaddleOCR's ClsLabelEncode drops such a sample silently).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_rec import data as rec_data

BUILT_IN = rec_data.BUILT_IN
TURN = 0.5  # the share of generated lines turned upside down
Lines = rec_data.Lines  # texts: each line's label
Data = rec_data.Data


def load(cfg: Any, labels: Sequence[str]) -> Data:
    """`cfg` is the run's DataConfig (source, ocr_lines, split_seed); `labels` the model's (upright first)."""
    if cfg.source == BUILT_IN:
        n = int(cfg.ocr_lines)
        m = max(1, round(n * 0.15))
        return generated((n, m, m), labels)
    files = rec_data.label_files(cfg.source, rec_data._LABEL_FILES, f"ocr_cls takes {BUILT_IN} or PaddleOCR cls "
                                 f"label files, lines 'image_path<TAB>0' or '<TAB>180'")
    _check_label_files([p for ps in files.values() for p in ps], labels)
    return rec_data.from_label_files(files, int(cfg.split_seed))


def turned_label(labels: Sequence[str]) -> str:
    """The label of a line to turn: the one with "180" in it, as PaddleOCR's predict_cls tests it."""
    return next(lb for lb in labels if "180" in lb)


def generated(counts: tuple[int, int, int], labels: Sequence[str], seed: int = 0) -> Data:
    """ocr_rec's generated lines (no key file), each turned by 180 degrees with probability TURN; the same seed
    gives the same bytes and labels."""
    lines = rec_data.generated(counts, None, seed)  # type: ignore[arg-type]  # None: any letter, digit, punct
    up, down = next(lb for lb in labels if "180" not in lb), turned_label(labels)
    flips = iter(np.random.default_rng(seed + 2).random(sum(counts)) < TURN)

    def turn(part: Lines) -> Lines:
        images, names = [], []
        for img in part.images:
            flip = bool(next(flips))
            images.append(np.ascontiguousarray(img[::-1, ::-1]) if flip else img)
            names.append(down if flip else up)
        return Lines(images, names)

    return Data(turn(lines.train), turn(lines.val), turn(lines.test))


def _check_label_files(paths: list[Path], labels: Sequence[str]) -> None:
    """Every label in the label files ocr_rec's reader will read is one of the model's, before any image is
    decoded; a line without a tab is left to that reader's message."""
    for path in paths:
        for n, line in rec_data.label_lines(path):
            _, tab, label = line.partition("\t")
            if tab and label not in labels:
                raise InputError(f"{path}:{n}: label {label!r}: ocr_cls takes {' or '.join(map(repr, labels))} "
                                 f"(PaddleOCR's cls label lines 'image_path<TAB>label')")
