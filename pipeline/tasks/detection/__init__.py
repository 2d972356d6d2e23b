"""Detection, CenterNet-style (Zhou et al., "Objects as Points", 2019): the task contract (pipeline/tasks/__init__.py)
for a model returning three raw heads at stride 4 (`pipeline/tasks/detection/detector.py`):

    heatmap [N, K, h, w] class-centre logits; size [N, 2, h, w] box (width, height) in cells (input px / 4);
    offset [N, 2, h, w] the centre's (x, y) inside its cell, in cells

Stored targets `y` per batch: float32 (B, M, 5) rows [x1, y1, x2, y2, class_index] in model-input pixels,
class_index -1 for padding rows. Decoding (sigmoid, 3x3 peaks, top-k, class-wise NMS) runs in numpy after the
engine, never in the exported graph (STYLE §13); metrics are COCO's (pycocotools COCOeval, bbox).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np

name = "detection"
metrics = ("map", "map50")  # COCO mAP@[.5:.95] and mAP@.5
monitor = "map"
maximize = True
settings = {"score_threshold": 0.05, "nms_iou": 0.6, "max_detections": 100}
outputs = ("heatmap", "size", "offset")
stride = 4
data = "boxes"
# int8 keeps the three heads' final convs fp32 (pipeline/quantize.py output_layers): measured on this model
# (notes/paddle-stack-facts.md section 16) 1.03 points mAP lost with them in int8, 0.02 without, at no speed cost
int8_fp32_outputs = True

EVAL_SCORE_THRESHOLD = 0.001  # metrics_of keeps low-score boxes: COCO AP integrates over the whole ranking
_EVAL_CHUNK = 64  # images decoded at a time in metrics_of (a split's heatmaps need not fit in memory twice)


# ------------------------------------------------------------------ targets and loss


def _gaussian_radius(h: np.ndarray, w: np.ndarray, min_overlap: float = 0.7) -> np.ndarray:
    """CenterNet's `gaussian_radius` (from CornerNet, its three quadratics kept as published), vectorised:
    how far a corner may move with the box still overlapping the truth by `min_overlap`."""
    b1, c1 = h + w, w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + np.sqrt(b1 ** 2 - 4 * c1)) / 2
    b2, c2 = 2 * (h + w), (1 - min_overlap) * w * h
    r2 = (b2 + np.sqrt(b2 ** 2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * (h + w), (min_overlap - 1) * w * h
    r3 = (b3 + np.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2
    return np.minimum(np.minimum(r1, r2), r3)


def targets(y: np.ndarray, feeds: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """CenterNet targets for input size feeds["image"].shape[2:]: `heatmap` (B, K, h, w), per class the max of
    each object's gaussian (peak 1.0 at its centre cell, sigma = (2r + 1) / 6, cut at the radius r); and per
    object row `index` (B, M) int64 (cy * w + cx), `size` (B, M, 2) and `offset` (B, M, 2) in cells, `mask`."""
    y = np.asarray(y, np.float32).reshape(len(y), -1, 5)
    (B, M, _), K = y.shape, len(info.labels)
    h, w = (int(s) // stride for s in feeds["image"].shape[2:])
    box, cls = y[..., :4] / stride, y[..., 4].astype(np.int64)
    bw, bh = box[..., 2] - box[..., 0], box[..., 3] - box[..., 1]
    valid = (cls >= 0) & (cls < K) & (bw > 0) & (bh > 0)
    ctr = np.stack([(box[..., 0] + box[..., 2]) / 2, (box[..., 1] + box[..., 3]) / 2], -1)
    cell = np.clip(np.floor(ctr).astype(np.int64), 0, [w - 1, h - 1])
    r = np.maximum(0, np.floor(_gaussian_radius(np.ceil(bh), np.ceil(bw)))) * valid
    sigma = (2 * r + 1) / 6
    dx = np.arange(w)[None, None, :] - cell[..., 0:1]  # (B, M, w)
    dy = np.arange(h)[None, None, :] - cell[..., 1:2]  # (B, M, h)
    gx = np.exp(-dx ** 2 / (2 * sigma[..., None] ** 2)) * (np.abs(dx) <= r[..., None])
    gy = np.exp(-dy ** 2 / (2 * sigma[..., None] ** 2)) * (np.abs(dy) <= r[..., None]) * valid[..., None]
    heat, rows, k = np.zeros((B, K, h, w), np.float32), np.arange(B), np.where(valid, cls, 0)
    for m in range(M):  # over object slots; each writes one class plane per image, so no index repeats
        heat[rows, k[:, m]] = np.maximum(heat[rows, k[:, m]], gy[:, m, :, None] * gx[:, m, None, :])
    mask = valid.astype(np.float32)
    return {"heatmap": heat, "index": (cell[..., 1] * w + cell[..., 0]) * valid,
            "size": (np.stack([bw, bh], -1) * mask[..., None]).astype(np.float32),
            "offset": ((ctr - cell) * mask[..., None]).astype(np.float32), "mask": mask}


def loss(F: Any, outputs: dict[str, Any], targets: dict[str, Any], info: Any) -> Any:
    """CenterNet's objective: penalty-reduced focal loss (alpha 2, beta 4) on the heatmap + 0.1 * L1(size) +
    L1(offset) at the object centres, each summed and divided by the number of objects (at least 1); the
    L1 terms average their two coordinates, as CenterNet's RegL1Loss does."""
    import paddle

    gt, mask = targets["heatmap"], targets["mask"]
    p = paddle.clip(F.sigmoid(outputs["heatmap"]), 1e-4, 1 - 1e-4)
    pos = (gt >= 1.0).astype(p.dtype)
    focal = (paddle.log(p) * (1 - p) ** 2 * pos + paddle.log(1 - p) * p ** 2 * (1 - gt) ** 4 * (1 - pos)).sum()
    n = paddle.clip(mask.sum(), min=1.0)

    def l1(head: str) -> Any:
        out = outputs[head]
        flat = out.reshape([out.shape[0], out.shape[1], -1]).transpose([0, 2, 1])  # (B, h*w, 2)
        idx = targets["index"].unsqueeze(-1).expand([-1, -1, out.shape[1]])
        got = paddle.take_along_axis(flat, idx, axis=1)
        return (paddle.abs(got - targets[head]) * mask.unsqueeze(-1)).sum() / (2 * n)

    return -focal / n + 0.1 * l1("size") + l1("offset")


# ------------------------------------------------------------------ decoding


def _peaks(heat: np.ndarray) -> np.ndarray:
    """`heat` where it equals its 3x3 neighbourhood's max (CenterNet's max-pool NMS), else 0."""
    h, w = heat.shape[-2:]
    pad = np.pad(heat, [(0, 0)] * (heat.ndim - 2) + [(1, 1), (1, 1)], constant_values=-np.inf)
    hmax = pad[..., 1:h + 1, 1:w + 1]
    for dy in range(3):
        for dx in range(3):
            hmax = np.maximum(hmax, pad[..., dy:dy + h, dx:dx + w])
    return np.where(heat == hmax, heat, 0)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of boxes a (n, 4) and b (m, 4), [x1, y1, x2, y2]."""
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda z: np.prod(np.clip(z[:, 2:] - z[:, :2], 0, None), -1)  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-9)


def nms(dets: np.ndarray, iou: float) -> np.ndarray:
    """Greedy class-wise NMS (as torchvision's batched_nms): rows of (n, 6) [x1, y1, x2, y2, score, class]
    sorted by score descending; a row is dropped when a kept higher-scored row of its class overlaps it by
    more than `iou`. The IoU matrix is computed once; the loop runs over the n rows."""
    over = (_iou(dets[:, :4], dets[:, :4]) > iou) & (dets[:, None, 5] == dets[None, :, 5])
    keep = np.ones(len(dets), bool)
    for i in range(len(dets)):
        if keep[i]:
            keep[i + 1:] &= ~over[i, i + 1:]
    return dets[keep]


def decode(outputs: dict[str, np.ndarray], settings: dict[str, Any]) -> list[np.ndarray]:
    """Boxes per image, (n, 6) float32 [x1, y1, x2, y2, score, class_index] in model-input pixels, score
    descending: sigmoid heatmap, 3x3 peaks, the top max_detections over K*h*w, score >= score_threshold,
    class-wise NMS at nms_iou (`nms`), boxes clipped to the input."""
    logits = np.asarray(outputs["heatmap"], np.float32)
    B, K, h, w = logits.shape
    heat = _peaks(1 / (1 + np.exp(-np.clip(logits, -60, 60)))).reshape(B, -1)
    top = min(int(settings["max_detections"]), heat.shape[1])
    idx = np.argpartition(-heat, top - 1, axis=1)[:, :top]
    idx = np.take_along_axis(idx, np.argsort(-np.take_along_axis(heat, idx, 1), axis=1, kind="stable"), 1)
    score, cls, pix = np.take_along_axis(heat, idx, 1), idx // (h * w), idx % (h * w)
    at = lambda head: np.take_along_axis(np.asarray(outputs[head], np.float32).reshape(B, 2, h * w),  # noqa: E731
                                         pix[:, None, :], 2).transpose(0, 2, 1)  # (B, top, 2)
    ctr = np.stack([pix % w, pix // w], -1) + at("offset")
    half = np.maximum(at("size"), 0) / 2
    boxes = np.clip(np.concatenate([ctr - half, ctr + half], -1) * stride, 0, [w * stride, h * stride] * 2)
    dets = np.concatenate([boxes, score[..., None], cls[..., None]], -1).astype(np.float32)
    keep = score >= float(settings["score_threshold"])
    return [nms(d[k], float(settings["nms_iou"])) for d, k in zip(dets, keep)]


# ------------------------------------------------------------------ metrics and answers


def coco_map(dets: list[np.ndarray], y: np.ndarray, num_classes: int | None = None) -> dict[str, float]:
    """COCO mAP@[.5:.95] and mAP@.5 (pycocotools COCOeval, bbox, maxDets 100) of `dets` (decode's, one per
    image) against `y` (N, M, 5); categories 0..num_classes-1 (default: the largest class in y or dets, + 1).
    No predictions at all, or no ground-truth objects, give 0.0 (pycocotools raises / reports -1)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    y = np.asarray(y, np.float32).reshape(len(y), -1, 5)
    img, row = np.nonzero(y[..., 4] >= 0)
    gt = y[img, row]
    rows = np.concatenate([np.c_[np.full(len(d), i + 1), d] for i, d in enumerate(dets)] or [np.zeros((0, 7))])
    if num_classes is None:
        num_classes = int(max(gt[:, 4].max(initial=-1), rows[:, 6].max(initial=-1))) + 1
    if len(rows) == 0 or len(gt) == 0:
        return {"map": 0.0, "map50": 0.0}
    wh = gt[:, 2:4] - gt[:, :2]
    anns = [{"id": j + 1, "image_id": int(i) + 1, "category_id": int(g[4]) + 1, "iscrowd": 0,
             "bbox": [float(v) for v in (*g[:2], *wh[j])], "area": float(wh[j, 0] * wh[j, 1])}
            for j, (i, g) in enumerate(zip(img, gt))]
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and the summary table
        truth = COCO()
        truth.dataset = {"images": [{"id": i + 1} for i in range(len(y))], "annotations": anns,
                         "categories": [{"id": k + 1} for k in range(num_classes)]}
        truth.createIndex()
        # loadRes's numpy form: [image_id, x, y, w, h, score, category_id]
        res = truth.loadRes(np.c_[rows[:, :3], rows[:, 3:5] - rows[:, 1:3], rows[:, 5], rows[:, 6] + 1])
        ev = COCOeval(truth, res, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {"map": max(0.0, float(ev.stats[0])), "map50": max(0.0, float(ev.stats[1]))}


def metrics_of(outputs: dict[str, np.ndarray], y: np.ndarray, info: Any) -> dict[str, float]:
    """COCO mAP of a split: decoded with info.settings but score_threshold EVAL_SCORE_THRESHOLD (0.001,
    as COCO evaluations do: a serving threshold would cut the precision-recall curve short)."""
    cfg = {**settings, **(info.settings or {}), "score_threshold": EVAL_SCORE_THRESHOLD}
    n = len(outputs["heatmap"])
    dets = [d for s in range(0, n, _EVAL_CHUNK)
            for d in decode({k: v[s:s + _EVAL_CHUNK] for k, v in outputs.items()}, cfg)]
    return coco_map(dets, y, len(info.labels))


def answer(outputs: dict[str, np.ndarray], info: Any, sizes: list[Any] | None) -> dict[str, Any]:
    """/v1's answer: {"detections": per image [{"label", "score", "box": [x1, y1, x2, y2]}]} in the original image's pixels,
    `sizes[i]` its (height, width) (None: model-input pixels); the image was resized to the model input, so
    x scales by width / input width and y by height / input height. Coordinates rounded to 2 decimals."""
    h_in, w_in = (int(s) * stride for s in np.asarray(outputs["heatmap"]).shape[2:])
    dets = decode(outputs, {**settings, **(info.settings or {})})
    sizes = sizes if sizes is not None else [None] * len(dets)
    out = []
    for d, size in zip(dets, sizes):
        sy, sx = (1.0, 1.0) if size is None else (size[0] / h_in, size[1] / w_in)
        boxes = np.round(d[:, :4].astype(np.float64) * [sx, sy, sx, sy], 2)
        out.append([{"label": info.labels[int(c)], "score": float(s), "box": b.tolist()}
                    for b, s, c in zip(boxes, d[:, 4], d[:, 5])])
    return {"detections": out}
