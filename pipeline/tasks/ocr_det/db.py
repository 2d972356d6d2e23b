"""DB post-processing: a text probability map -> quadrilaterals, as PaddleOCR's `DBPostProcess` (box_type 'quad',
ppocr/postprocess/db_postprocess.py, after DBNet.pytorch's seg_detector_representer).

Per page: binarise the map at `thresh` (optionally dilated by a 2x2 kernel), `cv2.findContours` (RETR_LIST,
CHAIN_APPROX_SIMPLE), at most `max_candidates` contours in OpenCV's order; each contour's minimum-area
rectangle (`mini_box`), dropped if its short side < `min_size`; its score is the map's mean inside the box
('fast') or inside the contour ('slow'), dropped below `box_thresh`; the box is grown by the Vatti offset of
area * unclip_ratio / perimeter (pyclipper, round joins), dropped if that gives other than one polygon; the
grown polygon's minimum-area rectangle again, dropped if its short side < min_size + 2.

Boxes stay in the map's coordinates here (`Page`): `to_source` maps them to the page's own pixels as
DBPostProcess does (x / map_w * src_w, rounded, clipped to [0, src_w]), so decoding needs only the model's
output and the mapping only the page's size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

SCORE_MODES = ("fast", "slow")


class Page(NamedTuple):
    """One page's detections in its map's coordinates: boxes float32 [K, 4, 2] (clockwise from top-left),
    their scores, and the map's (height, width)."""

    boxes: np.ndarray
    scores: list[float]
    map_size: tuple[int, int]


def decode(maps: np.ndarray, st: dict[str, Any]) -> list[Page]:
    """[N, 1, H, W] probability maps -> each page's detections, with the task's settings `st`."""
    import cv2

    pages = []
    for pred in np.asarray(maps)[:, 0]:
        mask = pred > float(st["thresh"])
        if st["use_dilation"]:
            mask = cv2.dilate(mask.astype(np.uint8), np.ones((2, 2), np.uint8))
        pages.append(_boxes(pred, mask, st))
    return pages


def _boxes(pred: np.ndarray, mask: np.ndarray, st: dict[str, Any]) -> Page:
    import cv2

    contours, _ = cv2.findContours((mask * 255).astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    min_size, boxes, scores = float(st["min_size"]), [], []
    for contour in contours[: int(st["max_candidates"])]:
        points, sside = mini_box(contour)
        if sside < min_size:
            continue
        score = box_score_fast(pred, points) if st["score_mode"] == "fast" else box_score_slow(pred, contour)
        if float(st["box_thresh"]) > score:
            continue
        grown = unclip(points, float(st["unclip_ratio"]))
        if len(grown) != 1:  # a box the offset splits (or empties) is no text line: skipped, as upstream
            continue
        box, sside = mini_box(np.asarray(grown[0]).reshape(-1, 1, 2))
        if sside < min_size + 2:
            continue
        boxes.append(box)
        scores.append(float(score))
    arr = np.array(boxes, np.float32).reshape(-1, 4, 2)
    return Page(arr, scores, (int(pred.shape[0]), int(pred.shape[1])))


def mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle of a contour as float32 [4, 2] in PaddleOCR's order (left pair by x, then
    each pair by y: top-left, top-right, bottom-right, bottom-left) and its short side."""
    import cv2

    rect = cv2.minAreaRect(contour)
    pts = sorted(list(cv2.boxPoints(rect)), key=lambda p: p[0])
    tl, bl = (pts[0], pts[1]) if pts[1][1] > pts[0][1] else (pts[1], pts[0])
    tr, br = (pts[2], pts[3]) if pts[3][1] > pts[2][1] else (pts[3], pts[2])
    return np.array([tl, tr, br, bl], np.float32), float(min(rect[1]))


def box_score_fast(pred: np.ndarray, box: np.ndarray) -> float:
    """The map's mean inside the box (filled as int32 points, as upstream truncates them)."""
    h, w = pred.shape[:2]
    box = np.array(box, np.float32)
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    box[:, 0] -= xmin
    box[:, 1] -= ymin
    return _masked_mean(pred, box, xmin, xmax, ymin, ymax)


def box_score_slow(pred: np.ndarray, contour: np.ndarray) -> float:
    """The map's mean inside the contour itself."""
    h, w = pred.shape[:2]
    c = np.array(contour).reshape(-1, 2).copy()
    xmin, xmax = int(np.clip(c[:, 0].min(), 0, w - 1)), int(np.clip(c[:, 0].max(), 0, w - 1))
    ymin, ymax = int(np.clip(c[:, 1].min(), 0, h - 1)), int(np.clip(c[:, 1].max(), 0, h - 1))
    c[:, 0] -= xmin
    c[:, 1] -= ymin
    return _masked_mean(pred, c, xmin, xmax, ymin, ymax)


def _masked_mean(pred: np.ndarray, poly: np.ndarray, xmin: int, xmax: int, ymin: int, ymax: int) -> float:
    import cv2

    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), np.uint8)
    cv2.fillPoly(mask, poly.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(pred[ymin: ymax + 1, xmin: xmax + 1], mask)[0])


def unclip(box: np.ndarray, ratio: float) -> list[Any]:
    """The box grown by area * ratio / perimeter (DB's offset), as pyclipper's polygons."""
    import pyclipper
    from shapely.geometry import Polygon

    poly = Polygon(box)
    distance = poly.area * ratio / poly.length
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return list(offset.Execute(distance))


def to_source(page: Page, src_h: int, src_w: int) -> np.ndarray:
    """A page's boxes in its own pixels: float32 [K, 4, 2], integral, as DBPostProcess's int16 boxes."""
    h, w = page.map_size
    out = page.boxes.astype(np.float32).copy()
    out[..., 0] = np.clip(np.round(out[..., 0] / w * src_w), 0, src_w)
    out[..., 1] = np.clip(np.round(out[..., 1] / h * src_h), 0, src_h)
    return out
