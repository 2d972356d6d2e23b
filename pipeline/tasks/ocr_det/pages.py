"""One pre-processing for every place a page meets the detector: PaddleOCR's `DetResizeForTest` then
`NormalizeImage` and `ToCHWImage` (ppocr/data/imaug/operators.py), as its det configs and inference.yml name them.

- channel order BGR: PaddleOCR decodes with cv2.imread (BGR) and feeds it unchanged; images are kept RGB here
  (PIL's order) and flipped at this one point;
- resize (limit_type 'max', limit_side_len 960): scale so the long side is at most 960 (never up), then each
  side to the nearest multiple of 32, at least 32 (the DB backbone downsamples by 32); 'min' (RapidOCR's
  default, with 736) scales up until the short side is at least the limit; either way the long side then
  stays within MAX_SIDE (PaddleOCR 3's `max_side_limit`: a long, thin page under 'min' would grow unbounded);
- (x * float32(1/255) - mean) / std with ImageNet's mean and std in PaddleOCR's order, applied to the BGR
  image as PaddleOCR applies them (its NormalizeImage does not reorder them): facts §17 measured this;
- each page's (src_h, src_w, ratio_h, ratio_w), PaddleOCR's `shape_list`, to map boxes back.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pipeline.errors import InputError

MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3)
SCALE = np.float32(1.0 / 255.0)
STRIDE = 32
LIMIT_TYPES = ("max", "min")
MAX_SIDE = 4000  # PaddleOCR 3's DetResizeForTest max_side_limit


class Shape(NamedTuple):
    """A page's PaddleOCR shape_list row: its original size and the resize ratios."""

    src_h: int
    src_w: int
    ratio_h: float
    ratio_w: float


def resized_size(h: int, w: int, limit_side_len: int, limit_type: str) -> tuple[int, int]:
    """DetResizeForTest's (resize_h, resize_w) for an h x w page."""
    if limit_type == "max":
        ratio = float(limit_side_len) / max(h, w) if max(h, w) > limit_side_len else 1.0
    elif limit_type == "min":
        ratio = float(limit_side_len) / min(h, w) if min(h, w) < limit_side_len else 1.0
    else:
        raise InputError(f"ocr_det limit_type {limit_type!r}: expected one of {', '.join(LIMIT_TYPES)}")
    rh, rw = int(h * ratio), int(w * ratio)
    if max(rh, rw) > MAX_SIDE:
        cap = float(MAX_SIDE) / max(rh, rw)
        rh, rw = int(rh * cap), int(rw * cap)
    return max(int(round(rh / STRIDE) * STRIDE), STRIDE), max(int(round(rw / STRIDE) * STRIDE), STRIDE)


def prepare(image: np.ndarray, limit_side_len: int, limit_type: str) -> tuple[np.ndarray, Shape]:
    """An RGB uint8 [H, W, 3] page -> (float32 [3, h, w] BGR normalised, its Shape)."""
    import cv2

    h, w = image.shape[:2]
    rh, rw = resized_size(h, w, limit_side_len, limit_type)
    bgr = cv2.resize(cv2.cvtColor(image, cv2.COLOR_RGB2BGR), (rw, rh))  # the swap numpy's [..., ::-1] copy does, 30-80x faster
    x = (bgr.astype(np.float32) * SCALE - MEAN) / STD
    return x.transpose(2, 0, 1), Shape(h, w, rh / float(h), rw / float(w))


def max_side(limit_side_len: int, limit_type: str) -> int:
    """The longest side `resized_size` gives under these settings: the limit rounded to the stride for 'max',
    MAX_SIDE's for 'min'."""
    side = limit_side_len if limit_type == "max" else MAX_SIDE
    return max(int(round(side / STRIDE) * STRIDE), STRIDE)
