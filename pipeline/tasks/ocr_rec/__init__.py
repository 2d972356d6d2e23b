"""ocr_rec: CTC text recognition (PaddleOCR's PP-OCR recognizers), a task that owns its data, its pre-processing
and its answer (STYLE §14): `pipe import` brings the model, this folder knows what it reads and says.

    pipe import <ch_PP-OCRv4_rec_infer> --task ocr_rec --keys ppocr_keys_v1.txt

- `text.py`: the key file, CTC greedy decode, line accuracy and 1 - normalised edit distance (RecMetric);
- `lines.py`: the one pre-processing (height 48, aspect kept, BGR, [-1, 1], width buckets);
- `data.py`: generated lines (`ocr_lines`) and PaddleOCR label files.

The model: one float32 image input [N, 3, 48, W] (W dynamic) and one output of per-step class
probabilities [N, W/8, keys + 2]. Its keys are the task's labels (`Info.labels`, in the key file's order);
what a user may tune is in `settings`, with PaddleOCR's defaults. Beyond the common task contract
(pipeline/tasks/__init__.py), a task that owns its data supplies what `pipe import` calls:
`from_program`, `default_source`, `load_data`, `batches`, `decode`, `score`, `files`, `output_roles`, and what
`pipe compress` calls besides (pipeline/compress_owned.py): `subset`, `reference_agreement`, `timing_batch`,
`unit` and `nncf_model_type`; `recognise`
runs any engine over line images in those batches and answers in the images' order (the bench).
Its input's width is dynamic, so it also supplies what `pipe package` and `pipe serve` call for such an
input (pipeline/tasks/__init__.py): `sample_limits`, `example_shapes`, `prepare_images`, `reference_set`,
and the compact form its reference set keeps: `reference_digest`, `reference_agreement`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_rec import data as data_mod, lines, text

name = "ocr_rec"
metrics = ("acc", "norm_edit_dis")
monitor = "acc"
maximize = True
# Upstream defaults: ignore_space as PaddleOCR's RecMetric(ignore_space=True); min_width from the exports'
# rec_image_shape 3,48,320 (PaddleOCR's and RapidOCR's batch width starts at max_wh_ratio = 320 / 48);
# max_width as PaddleX's OCRReisizeNormImg (max_imgW 3200); nfkc is ours, off as RecMetric has no such step
# (on: full-width punctuation matches ASCII, facts §17); the width bucket is ours (facts §17: 64 px lose
# nothing against exact widths). Lines per batch are the caller's (import.batch_size; PaddleOCR's and
# RapidOCR's rec_batch_num is 6).
settings: dict[str, Any] = {"ignore_space": True, "nfkc": False, "min_width": 320, "max_width": 3200,
                            "width_bucket": 64}
default_source = data_mod.BUILT_IN
KEYS_FILE = "keys.txt"
OUTPUT = "probs"
REFERENCE_LINES = 16  # a package's reference set (reference_set): its inputs' size decides
# Training batches are [N, 3, 48, 320], a wider line squeezed: PaddleOCR's PP-OCRv4 rec training config
# (RecResizeImg image_shape [3, 48, 320]). Measured here (dygraph, batch 8, 2 busy cores): 2.0 GB and ~3 s a step
# at 320; every new width grows Paddle's CPU allocator's cache (6.8 GB after widths up to 960).
TRAIN_WIDTH = 320
timing_batch = 32  # compress's throughput batch, lines (items/s at batch 32, as every compress measures it)
unit = "lines"  # what compress's messages count
# NNCF's preset for models with attention blocks: on PP-OCRv4 rec (an SVTR neck) its default preset lost 7.4
# points of line accuracy, the transformer one 2.1 (facts §17)
nncf_model_type = "transformer"


# ------------------------------------------------------------------ the common contract


def targets(y: Any, feeds: Any, info: Any) -> dict[str, np.ndarray]:
    """A batch's texts -> CTC targets: `labels` [N, L] (class ids, blank-padded) and `label_lengths` [N]."""
    labels, lengths, _ = text.encode([str(t) for t in y], info.labels)
    return {"labels": labels, "label_lengths": lengths}


def loss(F: Any, outputs: dict[str, Any], targets: dict[str, Any], info: Any) -> Any:
    """PaddleOCR's CTCLoss: CTC over every step of the output (padding included, as its recognizers train),
    per line, then the batch mean. The model ends in a softmax: the log of it goes in (warpctc normalises its
    input again, and log_softmax(log p) = log p)."""
    import paddle

    probs = _probs(outputs, "ocr_rec")
    n, steps = probs.shape[0], probs.shape[1]
    logp = paddle.log(paddle.clip(probs.astype("float32"), min=1e-12)).transpose([1, 0, 2])
    per = F.ctc_loss(logp, targets["labels"], paddle.full([n], steps, dtype="int64"), targets["label_lengths"],
                     blank=text.BLANK, reduction="none")
    return per.mean()


def training_batch(images: Sequence[np.ndarray], texts: Sequence[str], info: Any,
                   rngs: Sequence[np.random.Generator] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(feeds, targets) of one training batch: each RGB line augmented with its own generator (`augment.py`; None:
    as it is), prepared as every other line (`lines.prepare`) at most TRAIN_WIDTH wide and padded to it."""
    st = info.settings
    if rngs is not None:
        from pipeline.tasks.ocr_rec import augment

        images = [augment.augment(im, r) for im, r in zip(images, rngs, strict=True)]
    x = lines.collate([lines.prepare(im, TRAIN_WIDTH) for im in images], int(st["width_bucket"]), TRAIN_WIDTH)
    return {st.get("input", "x"): x}, targets(texts, None, info)


def check_outputs(outputs: dict[str, np.ndarray], info: Any, where: str) -> None:
    probs = _probs(outputs, where)
    if probs.dtype.kind != "f" or probs.ndim != 3 or probs.shape[2] != text.classes(info.labels):
        raise InputError(f"{where}: ocr_rec needs one float [N, T, {text.classes(info.labels)}] output, got "
                         f"{probs.dtype} {list(probs.shape)}")


def metrics_of(outputs: dict[str, np.ndarray], y: Sequence[str], info: Any) -> dict[str, float]:
    return text.metrics([t for t, _ in decode(outputs, info)], y, bool(info.settings["ignore_space"]),
                        bool(info.settings["nfkc"]))


def answer(outputs: dict[str, np.ndarray], info: Any, sizes: Any = None) -> dict[str, Any]:
    """/v1's answer: per line its text and score (the mean of its kept characters' probabilities)."""
    return {"lines": [{"text": t, "score": s} for t, s in decode(outputs, info)]}


def fidelity(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> dict[str, float]:
    """The share of lines whose decoded text is the same in `got` as in `ref` (e.g. int8 against fp32), compared
    as the metric compares a line with its label (`same_text`)."""
    a, b = decode(got, info), decode(ref, info)
    return {"text_agreement": float(np.mean([same_text(x[0], y[0], info) for x, y in zip(a, b)])) if a else 1.0}


def same_text(a: str, b: str, info: Any) -> bool:
    """Two answers are the same as the metric sees them: with `ignore_space`, a trailing space the model emits at
    a line's right margin (facts §17) is no difference."""
    st = info.settings
    return text.normalise(a, bool(st["ignore_space"]), bool(st["nfkc"])) == \
        text.normalise(b, bool(st["ignore_space"]), bool(st["nfkc"]))


# ------------------------------------------------------------------ what pipe import calls


def from_program(pio: Any, keys: Path | list[str] | None, yml: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """(labels = the keys, settings) for the program `pio`, refusing one that is not a recognizer of these
    keys: one image input [N, 3, 48, W] and one [N, T, keys + 2] float output."""
    if keys is None:
        raise InputError(f"{where}: ocr_rec needs its key file: pass --keys (PaddleOCR's character_dict_path)")
    ks = text.read_keys(keys) if isinstance(keys, Path) else text.check_keys(keys, f"{where}: character_dict")
    if len(pio.inputs) != 1 or len(pio.outputs) != 1:
        raise InputError(f"{where}: ocr_rec takes one image input and one output; the program has "
                         f"{len(pio.inputs)} and {len(pio.outputs)}")
    x, out = pio.inputs[0], pio.outputs[0]
    if x.dtype != "float32" or len(x.shape) != 4 or x.shape[1] != 3 or x.shape[2] not in (-1, lines.HEIGHT):
        raise InputError(f"{where}: ocr_rec takes float32 [N, 3, {lines.HEIGHT}, W] line images; input {x.name!r} "
                         f"is {x.dtype} {list(x.shape)}")
    if out.dtype != "float32" or len(out.shape) != 3:
        raise InputError(f"{where}: ocr_rec needs per-step class probabilities [N, T, classes]; output "
                         f"{out.name!r} is {out.dtype} {list(out.shape)} (a classifier?)")
    text.check_classes(ks, out.shape[2], str(keys) if isinstance(keys, Path) else f"{where}: character_dict")
    return list(ks), {**settings, "input": x.name}


def output_roles(outputs: Sequence[Any]) -> list[tuple[str, str]]:
    return [(OUTPUT, OUTPUT)]


def files(info: Any) -> dict[str, str]:
    """The files the export carries for this task: the key file, in PaddleOCR's format."""
    return {KEYS_FILE: "".join(k + "\n" for k in info.labels)}


def load_data(cfg: Any, info: Any) -> data_mod.Data:
    return data_mod.load(cfg, info.labels)


def batches(split: data_mod.Lines, info: Any, size: int, limit: int | None = None, rows: Sequence[int] | None = None
            ) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """(positions in the split, {input: [n, 3, 48, W]}) in order of width, `size` lines at a time; the first
    `limit` lines only, or the lines at `rows`, if given."""
    st = info.settings
    n = len(split) if limit is None else min(limit, len(split))
    at = list(range(n)) if rows is None else [int(r) for r in rows]
    prepared = [lines.prepare(split.images[i], int(st["max_width"])) for i in at]
    for pos in lines.plan([p.shape[2] for p in prepared], size):
        yield [at[i] for i in pos], {st.get("input", "x"): lines.collate([prepared[i] for i in pos],
                                                                         int(st["width_bucket"]), int(st["min_width"]))}


def decode(outputs: dict[str, np.ndarray], info: Any) -> list[tuple[str, float]]:
    return text.ctc_greedy(_probs(outputs, "ocr_rec"), info.labels)


def recognise(images: Sequence[np.ndarray], info: Any, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
              size: int) -> list[tuple[str, float]]:
    """(text, score) of each RGB line image, in the order given: `run` (feeds -> outputs by name, e.g. an
    engine's) is called on the task's width-sorted batches of `size` lines, its answers put back in place."""
    out: list[tuple[str, float]] = [("", 0.0)] * len(images)
    for pos, feeds in batches(data_mod.Lines(list(images), [""] * len(images)), info, size):
        for p, a in zip(pos, decode(run(feeds), info), strict=True):
            out[p] = a
    return out


# ------------------------------------------------------------------ what package and serve call


def sample_limits(info: Any) -> tuple[int, ...]:
    """The largest line the input takes, per sample: [3, 48, max_width] (a tensor sent wider is refused)."""
    return (3, lines.HEIGHT, int(info.settings["max_width"]))


def example_shapes(info: Any) -> list[tuple[int, ...]]:
    """Per-sample shapes to check conversions and warm engines at: the first width buckets, where most lines
    fall (oneDNN builds kernels per shape on first sight: facts §17, 322 ms/line the first time)."""
    st = info.settings
    lo, step = int(st["min_width"]), int(st["width_bucket"])
    return [(3, lines.HEIGHT, w) for w in range(lo, min(int(st["max_width"]), lo + 4 * step) + 1, step)]


def prepare_images(images: Sequence[np.ndarray], info: Any, size: int) -> list[tuple[list[int], np.ndarray]]:
    """RGB uint8 [H, W, 3] line images -> (positions, [n, 3, 48, W]) batches of at most `size`, each batch at
    one bucketed width (`lines.collate`): a line is always run at its own bucket's width, so its answer is
    the same alone or with others of any width (the server batches only equal shapes)."""
    st = info.settings
    prepared = [lines.prepare(im, int(st["max_width"])) for im in images]
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prepared):
        groups.setdefault(lines.batch_width([p.shape[2]], int(st["width_bucket"]), int(st["min_width"])), []).append(i)
    out = []
    for _, pos in sorted(groups.items()):
        for k in range(0, len(pos), size):
            part = pos[k:k + size]
            out.append((part, lines.collate([prepared[i] for i in part], int(st["width_bucket"]),
                                            int(st["min_width"]))))
    return out


def reference_set(cfg: Any, info: Any, n: int) -> tuple[np.ndarray, list[str]]:
    """Up to `n` real lines (at most REFERENCE_LINES) for a package's reference check: the narrowest of the
    test and val splits (the inputs are stored: 16 lines at 320 px are 2.9 MB; the outputs only as
    `reference_digest`), prepared as served, padded to one width (the set is one tensor), and their texts."""
    ds = load_data(cfg, info)
    st = info.settings
    pool = [(sp, i) for sp in (ds.test, ds.val) for i in range(len(sp))]
    if not pool:
        raise InputError(f"reference set: data.source {cfg.source!r} has no val or test lines")
    prepared = [lines.prepare(sp.images[i], int(st["max_width"])) for sp, i in pool]
    order = sorted(range(len(pool)), key=lambda k: prepared[k].shape[2])[:min(n, REFERENCE_LINES)]
    x = lines.collate([prepared[k] for k in order], int(st["width_bucket"]), int(st["min_width"]))
    return x, [pool[k][0].texts[pool[k][1]] for k in order]


def reference_digest(outputs: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """What a package's reference set keeps of a batch's outputs and checks where it serves: per step the
    class (int32) and its probability, [N, T] each (the softmax itself is [N, T, 6625] floats)."""
    p = _probs(outputs, "reference set")
    return {"steps": p.argmax(-1).astype(np.int32), "step_probs": p.max(-1).astype(np.float32)}


def reference_agreement(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], info: Any) -> float:
    """How far `got`'s answers are `ref`'s, per character: the mean over lines of 1 - the normalised edit
    distance between the texts their CTC paths decode to (repeats merged, blanks dropped), compared as the
    metric compares a line with its label (`same_text`). A character is what the model predicts, as a class
    is for a classifier: 0.99 = one character in a hundred differs (a line of 15 characters differing in
    one scores 0.933; the share of identical lines would count it as a whole line lost)."""
    from rapidfuzz.distance import Levenshtein

    chars = ("",) + tuple(info.labels) + (" ",)
    st = info.settings

    def texts(steps: np.ndarray) -> list[str]:
        return [text.normalise("".join(chars[c] for i, c in enumerate(row) if c != text.BLANK and (i == 0 or c != row[i - 1])),
                               bool(st["ignore_space"]), bool(st["nfkc"])) for row in steps]

    a, b = texts(got["steps"]), texts(ref["steps"])
    return float(np.mean([1.0 - Levenshtein.normalized_distance(x, y) for x, y in zip(a, b, strict=True)])) if a else 1.0


def subset(split: data_mod.Lines, rows: Sequence[int]) -> data_mod.Lines:
    """The lines at `rows`, in that order (what the int8 search scores a part of the val split on)."""
    return data_mod.Lines([split.images[i] for i in rows], [split.texts[i] for i in rows])


def _probs(outputs: dict[str, np.ndarray], where: str) -> np.ndarray:
    """The per-step probabilities: the only output, or the one named `probs` (what import names it)."""
    from pipeline import tasks

    return tasks.one_output(outputs, OUTPUT, where, "ocr_rec reads one output of per-step class probabilities")


def score(answers: Sequence[tuple[str, float]], split: data_mod.Lines, info: Any) -> dict[str, float]:
    return text.metrics([a[0] for a in answers], split.texts, bool(info.settings["ignore_space"]),
                        bool(info.settings["nfkc"]))


def info_of(iface: dict[str, Any]) -> Any:
    """The Info an import artifact's interface records (labels = keys, the task's settings)."""
    from pipeline import tasks

    rec = iface.get("task") or {}
    return tasks.Info(tuple(iface["labels"]), {**settings, **(rec.get("settings") or {})})
