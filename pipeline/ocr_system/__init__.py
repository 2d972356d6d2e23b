"""The OCR system: text detection, then text-line orientation where a classifier is given, then recognition, as
PaddleOCR's `TextSystem` (tools/infer/predict_system.py) and RapidOCR 1.4.4's `RapidOCR.__call__` chain them, on
pipe's three tasks (pipeline/tasks/ocr_det, ocr_cls, ocr_rec), each model run by whatever `run` it is given (an
engine's, a server's batcher).

Per page, as upstream:
- ocr_det's boxes in the page's own pixels (`db.to_source`), each dropped when a side is 3 px or less
  (PaddleOCR's `filter_tag_det_res`; the points are already clockwise from the top left and clipped);
- sorted into reading order (`reading_order`, upstream's `sorted_boxes`: by the first point's y then x, and a
  line whose first point is within 10 px of the previous one's height reads after it only if it is to its right);
- each cut out by a perspective transform of its quadrilateral (`crop`, upstream's `get_rotate_crop_image`:
  width and height the longer of each pair of sides, bicubic, border replicated; a crop at least 1.5 times as
  tall as wide turned by 90 degrees, counter-clockwise as np.rot90);
- turned upright by the classifier (ocr_cls: label 180 above cls_thresh), where there is one;
- recognised (ocr_rec), and a line whose recognition score is below `drop_score` (0.5, PaddleOCR's and
  RapidOCR's `text_score`) dropped, as upstream drops it.
The lines of every page given go through the classifier and the recognizer together (`read`), in the batches
pipe serve runs (`prepare_images`: the recognizer's at each line's own width bucket), so a line reads the same
whichever lines share its batch, across pages as the server's batcher batches across requests. (PaddleOCR and
RapidOCR pad each batch of 6 to its widest line instead: a line's score then moves with its neighbours.)

`end_to_end` scores answers against pages with transcriptions: the detection's precision, recall and hmean as
ocr_det's metric (IoU 0.5, one-to-one, "###" don't care), and `e2e_acc`, the share of the ground-truth lines
(don't-care aside) whose matched line reads exactly their text (compared as ocr_rec's metric compares:
spaces ignored by default).

This folder holds the system whole: its composition (here), its package (`package.py`: `pipe package DET CLS REC`
and loading the system package) and its server (`serving.py`: /v1/ocr and the Open Inference Protocol on the three
parts' predictors). Nothing here imports `stages/`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Outputs = dict[str, np.ndarray]  # a model's outputs by public name
DROP_SCORE = 0.5  # PaddleOCR's drop_score, RapidOCR's text_score
MIN_SIDE = 3  # filter_tag_det_res: a box whose width or height is 3 px or less is no line
SAME_LINE_PX = 10  # sorted_boxes: first points closer than this in y are on one line


@dataclass(frozen=True)
class Model:
    """One of the system's models: its task's Info, how to run it (feeds -> outputs by public name), and the
    items per run (upstream's cls_batch_num and rec_batch_num: 6; det: one page at a time)."""

    info: Any
    run: Run
    batch: int = 6


@dataclass(frozen=True)
class System:
    det: Model
    rec: Model
    cls: Model | None = None
    drop_score: float = DROP_SCORE


def read(system: System, images: Sequence[np.ndarray]) -> tuple[list[list[dict[str, Any]]], dict[str, float]]:
    """RGB uint8 [H, W, 3] pages -> per page its lines in reading order, each {"points": 4 [x, y] in the page's
    pixels, "text", "score"}; and the seconds each stage took ("det", "cls", "rec") over all pages. The steps
    (`page_boxes`, `crops`, `answers`, `page_lines`) are the ones pipe serve's /v1/ocr runs on its batchers."""
    from pipeline.tasks import ocr_cls, ocr_det, ocr_rec

    times = {"det": 0.0, "cls": 0.0, "rec": 0.0}
    t0 = time.perf_counter()
    boxes = page_boxes(images, system.det.info, _runs(ocr_det, system.det, images, 1))
    times["det"] = time.perf_counter() - t0
    lines = crops(images, boxes)
    if system.cls is not None and lines:
        t0 = time.perf_counter()
        lines = ocr_cls.turn_upright(lines, answer_lines(ocr_cls, system.cls, lines), system.cls.info)
        times["cls"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    texts = answer_lines(ocr_rec, system.rec, lines)
    times["rec"] = time.perf_counter() - t0
    return page_lines(boxes, texts, system.drop_score), times


def answer_lines(task: Any, model: Model, images: Sequence[np.ndarray]) -> list[Any]:
    """The task's answer (`decode`) for each line image, in the order given, from the batches the server runs
    (`prepare_images`: ocr_rec's at each line's own width bucket, ocr_cls's one shape), at most `model.batch`
    lines each: a line's answer does not depend on which lines share its batch."""
    return answers(task, model.info, len(images), _runs(task, model, images, model.batch))


def _runs(task: Any, model: Model, images: Sequence[np.ndarray], size: int) -> list[tuple[list[int], Outputs]]:
    """The task's batches of `images` (`prepare_images`, at most `size` each) run by the model: (positions,
    outputs by public name) per batch."""
    name = model.info.settings.get("input", "x")
    return [(pos, model.run({name: x})) for pos, x in task.prepare_images(images, model.info, size)]


def page_boxes(images: Sequence[np.ndarray], det_info: Any, runs: Sequence[tuple[list[int], Outputs]]
               ) -> list[list[np.ndarray]]:
    """ocr_det's outputs for batches of the pages (positions, outputs by public name) -> per page its boxes in
    its own pixels, decoded with the system's det settings (`ocr_det.system_info`: grown by system_unclip_ratio,
    2.0, where the detector alone answers at its unclip_ratio 1.5), big enough (`_big_enough`), in reading order
    (`reading_order`)."""
    from pipeline.tasks import ocr_det
    from pipeline.tasks.ocr_det import db

    system = ocr_det.system_info(det_info)  # the boxes grown by system_unclip_ratio: the system's crops
    boxes: list[list[np.ndarray]] = [[] for _ in images]
    for pos, outputs in runs:
        for p, page in zip(pos, ocr_det.decode(outputs, system), strict=True):
            h, w = images[p].shape[:2]
            boxes[p] = [b for b in db.to_source(page, h, w) if _big_enough(b)]
    return [[page[k] for k in reading_order(page)] for page in boxes]


def crops(images: Sequence[np.ndarray], boxes: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Every page's lines (`crop`), page after page, each page's in the order of its boxes."""
    return [crop(images[p], b) for p in range(len(images)) for b in boxes[p]]


def answers(task: Any, info: Any, n: int, runs: Sequence[tuple[list[int], Outputs]]) -> list[Any]:
    """The task's answer (`decode`) for each of `n` line images from its batches' outputs (positions, outputs by
    public name), in the images' order."""
    out: list[Any] = [None] * n
    for pos, outputs in runs:
        for p, a in zip(pos, task.decode(outputs, info), strict=True):
            out[p] = a
    return out


def page_lines(boxes: Sequence[Sequence[np.ndarray]], texts: Sequence[tuple[str, float]], drop_score: float
               ) -> list[list[dict[str, Any]]]:
    """Per page its lines {"points", "text", "score"} from its boxes and their recognised (text, score), `texts`
    in `crops`' order; a line scoring below `drop_score` dropped."""
    out: list[list[dict[str, Any]]] = []
    at = 0
    for page in boxes:
        lines = []
        for b in page:
            text, score = texts[at]
            at += 1
            if score >= drop_score:
                lines.append({"points": b.tolist(), "text": text, "score": float(score)})
        out.append(lines)
    return out


def _big_enough(box: np.ndarray) -> bool:
    """filter_tag_det_res: the box's width (|p0 - p1|) and height (|p0 - p3|), rounded down, above 3 px."""
    return int(np.linalg.norm(box[0] - box[1])) > MIN_SIDE and int(np.linalg.norm(box[0] - box[3])) > MIN_SIDE


def reading_order(boxes: Sequence[np.ndarray]) -> list[int]:
    """The boxes' indices top to bottom, then left to right (upstream's `sorted_boxes`, the same swaps)."""
    order = sorted(range(len(boxes)), key=lambda k: (float(boxes[k][0][1]), float(boxes[k][0][0])))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]], boxes[order[j + 1]]
            if abs(float(b[0][1]) - float(a[0][1])) < SAME_LINE_PX and float(b[0][0]) < float(a[0][0]):
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order


def crop(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The line inside quadrilateral `box` (4 [x, y] clockwise from the top left) straightened by a perspective
    transform (upstream's `get_rotate_crop_image`); turned by 90 degrees when at least 1.5 times as tall as wide."""
    import cv2

    pts = np.asarray(box, np.float32)
    w = int(max(np.linalg.norm(pts[0] - pts[1]), np.linalg.norm(pts[2] - pts[3])))
    h = int(max(np.linalg.norm(pts[0] - pts[3]), np.linalg.norm(pts[1] - pts[2])))
    dst = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)
    m = cv2.getPerspectiveTransform(pts, dst)
    out = cv2.warpPerspective(np.ascontiguousarray(image), m, (w, h), borderMode=cv2.BORDER_REPLICATE,
                              flags=cv2.INTER_CUBIC)
    if out.shape[0] * 1.0 / out.shape[1] >= 1.5:
        out = np.ascontiguousarray(np.rot90(out))
    return out


def end_to_end(answers: Sequence[Sequence[dict[str, Any]]], polys: Sequence[Sequence[np.ndarray]],
               texts: Sequence[Sequence[str]], ignore_space: bool = True, nfkc: bool = False) -> dict[str, float]:
    """Answers (per page its lines, `read`'s) against per page its ground-truth polygons and texts: ocr_det's
    hmean, precision and recall of the lines' polygons, and `e2e_acc`, the share of ground-truth lines ("###"
    aside) matched by a line whose text is theirs, compared as ocr_rec's metric compares; `lines`, how many."""
    from pipeline.tasks.ocr_det import metric
    from pipeline.tasks.ocr_rec import text as text_mod

    counts, right = [], 0
    for page, gt, gt_texts in zip(answers, polys, texts, strict=True):
        det = [np.asarray(line["points"], np.float32) for line in page]
        c, pairs = metric.page_matches(list(gt), [metric.is_dont_care(t) for t in gt_texts], det)
        counts.append(c)
        right += sum(text_mod.normalise(page[d]["text"], ignore_space, nfkc) ==
                     text_mod.normalise(gt_texts[g], ignore_space, nfkc) for g, d in pairs)
    scores = metric.combine(counts)
    lines = sum(c.gt_care for c in counts)
    return {**scores, "e2e_acc": right / lines if lines else 0.0, "lines": lines}
