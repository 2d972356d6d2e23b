"""Detection precision, recall and hmean as PaddleOCR's `DetMetric` computes them with its
`DetectionIoUEvaluator` (ppocr/metrics/det_metric.py, eval_det_iou.py; after MhLiao/DB's ICDAR 2015 IoU
evaluation), polygons by shapely:

- a ground truth or detection polygon that is not valid and simple is dropped;
- a ground truth whose transcription is "###" or "*" is don't-care; a detection whose area lies more than
  half (`AREA_PRECISION`) inside one of them is don't-care too; neither counts;
- one-to-one greedy matching in the order of ground truths, then detections: a pair matches when both are
  unmatched, neither is don't-care and their IoU is above `IOU` (0.5, strictly);
- summed over pages: precision = matched / cared detections, recall = matched / cared ground truths, hmean
  their harmonic mean (0 when both are 0).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import numpy as np

IOU = 0.5
AREA_PRECISION = 0.5
DONT_CARE = ("###", "*")


class Counts(NamedTuple):
    gt_care: int
    det_care: int
    matched: int


def page_counts(gt: Sequence[np.ndarray], ignore: Sequence[bool], det: Sequence[np.ndarray]) -> Counts:
    """One page: its ground-truth polygons with their don't-care flags, and its detected polygons."""
    return page_matches(gt, ignore, det)[0]


def page_matches(gt: Sequence[np.ndarray], ignore: Sequence[bool], det: Sequence[np.ndarray]
                 ) -> tuple[Counts, list[tuple[int, int]]]:
    """`page_counts` and the matched pairs (index in `gt`, index in `det`): DetMetric's greedy one-to-one
    matching, ground truth in order, each taking the first free detection above IOU. Invalid or
    self-intersecting polygons take part in nothing."""
    from shapely.geometry import Polygon

    gts = [(k, Polygon(p), bool(i)) for k, (p, i) in enumerate(zip(gt, ignore, strict=True))]
    gts = [(k, p, i) for k, p, i in gts if p.is_valid and p.is_simple]
    dets = [(k, p) for k, p in enumerate(Polygon(d) for d in det) if p.is_valid and p.is_simple]
    dont = [p for _, p, i in gts if i]
    det_ignored = [_inside_any(d, dont) for _, d in dets]
    gt_used, det_used, pairs = [False] * len(gts), [False] * len(dets), []
    for g, (kg, pg, ig) in enumerate(gts):
        for d, (kd, pd) in enumerate(dets):
            if gt_used[g] or det_used[d] or ig or det_ignored[d]:
                continue
            if _iou(pd, pg) > IOU:
                gt_used[g] = det_used[d] = True
                pairs.append((kg, kd))
    return Counts(len(gts) - len(dont), len(dets) - sum(det_ignored), len(pairs)), pairs


def _inside_any(det: object, dont_care: list) -> bool:
    area = det.area  # type: ignore[attr-defined]
    return any((0 if area == 0 else det.intersection(g).area / area) > AREA_PRECISION  # type: ignore[attr-defined]
               for g in dont_care)


def _iou(a: object, b: object) -> float:
    inter = a.intersection(b).area  # type: ignore[attr-defined]
    union = a.union(b).area  # type: ignore[attr-defined]
    return inter / union if union else 0.0


def combine(counts: Iterable[Counts]) -> dict[str, float]:
    cs = list(counts)
    gt, det, m = sum(c.gt_care for c in cs), sum(c.det_care for c in cs), sum(c.matched for c in cs)
    recall = 0.0 if gt == 0 else m / gt
    precision = 0.0 if det == 0 else m / det
    hmean = 0.0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
    return {"hmean": float(hmean), "precision": float(precision), "recall": float(recall)}


def is_dont_care(text: str) -> bool:
    return text in DONT_CARE
