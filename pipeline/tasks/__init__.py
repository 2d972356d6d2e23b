"""Tasks as a small contract (STYLE §13): what a stage needs to know about a model's task, and nothing else.

`model.task` names one: `classification` (the default), `detection`, the OCR tasks pipe imports (`ocr_rec`,
`ocr_det`, `ocr_cls`: pipeline/tasks/ocr_*/), or `package.module:Task` for a user's own (a module, a class,
which is instantiated with no arguments, or an object). A task supplies:

    name: str                            what the manifests record
    metrics: tuple[str, ...]             its metric names over a split; `val_<m>` / `test_<m>` in manifests
    monitor: str                         the metric training's best checkpoint, patience and compress's
    maximize: bool                         budget use by default, and its direction
    settings: dict                       postprocessing settings with their defaults (serving.yaml)
    targets(y, feeds, info)              a batch's stored targets `y[idx]` -> what `loss` takes (numpy: an
                                           array or a dict of arrays); how targets of varying count batch
    loss(F, outputs, targets, info)      the batch's mean loss (paddle; outputs by name, targets as tensors)
    metrics_of(outputs, y, info)         {metric: value} over a split (numpy outputs by name, all samples)
    answer(outputs, info, sizes)         /v1's answer for a batch, a JSON-able dict (numpy outputs by name;
                                           `sizes`: each image's original (height, width), or None)
    check_outputs(outputs, info, where)  optional: refuse (InputError) a model whose outputs cannot serve it
    data: str                            optional: the data it needs, "labels" (class ids) or "boxes" (a
                                           detection source); a mismatch is refused before training
    int8_fp32_outputs: bool              optional: True keeps the layers producing the outputs in fp32 when
                                           compress quantizes (the rule is recorded in the variant's calibration)
    logits: bool                         optional: True if it reads one output as logits (model.logits_output;
                                           `info.logits` names it); knowledge distillation needs that
    fidelity(got, ref, info)             optional: a compressed variant against fp32 beyond the metric's
                                           drop, e.g. classification's top-1 agreement ({} if absent)

A task whose one image input has dynamic dims behind the batch (ocr_rec: a line's width) supplies what
`pipe package` and `pipe serve` need for it (`dynamic(task)`); the stages then ask it instead of the
input's fixed shape:

    sample_limits(info)                  the largest per-sample shape the input takes (a tensor beyond: 422)
    example_shapes(info)                 per-sample shapes to check conversions and warm engines at
    prepare_images(images, info, size)   RGB uint8 [H, W, 3] images -> [(positions, batch array)], each
                                           batch of one shape (the server batches only equal shapes)
    reference_set(data_cfg, info, n)     up to n real inputs as one array, and their targets
    reference_digest(outputs, info)      optional: the compact form of outputs the reference set keeps and
                                           checks (ocr_rec: per step the class and its probability)
    reference_agreement(got, ref, info)  with it: the share of samples whose answer is the same (gated by
                                           compress.min_agreement, as top-1 agreement for classification)

`info` (`Info`) carries what the data and config know: the labels, the postprocessing settings, and
train.label_smoothing. Tasks import nothing from the stages; the stages call tasks only through this.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import InputError

BUILT_IN = {"classification": "pipeline.tasks.classification", "detection": "pipeline.tasks.detection",
            "ocr_rec": "pipeline.tasks.ocr_rec", "ocr_det": "pipeline.tasks.ocr_det",
            "ocr_cls": "pipeline.tasks.ocr_cls"}
_REQUIRED = ("name", "metrics", "monitor", "maximize", "targets", "loss", "metrics_of", "answer")


@dataclass(frozen=True)
class Info:
    labels: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)  # the task's postprocessing settings
    label_smoothing: float = 0.0
    logits: str = ""  # classification: the output holding the logits (model.logits_output, or the only one)


def get(spec: str) -> Any:
    """The task `spec` names (model.task): a built-in's module, or a user's `package.module:Task`."""
    spec = spec or "classification"
    if spec in BUILT_IN:
        return importlib.import_module(BUILT_IN[spec])
    if ":" not in spec:
        raise InputError(f"model.task {spec!r}: expected {', '.join(BUILT_IN)} or package.module:Task")
    from pipeline.nets.models import import_object  # resolved from the working directory, as model factories are

    obj = import_object(spec, "model.task")
    if isinstance(obj, type):
        obj = obj()
    missing = [k for k in _REQUIRED if not hasattr(obj, k)]
    if missing:
        raise InputError(f"model.task {spec!r}: a task needs {', '.join(missing)} (pipeline/tasks/__init__.py)")
    if obj.monitor not in obj.metrics:
        raise InputError(f"model.task {spec!r}: monitor {obj.monitor!r} is not one of its metrics {', '.join(obj.metrics)}")
    return obj


def from_interface(iface: dict[str, Any], desc: Any) -> tuple[Any, Info]:
    """A manifest's task and its Info (labels, recorded settings, the logits output's public name); every
    manifest before tasks existed is classification."""
    rec = iface.get("task") or {}
    task = get(str(rec.get("spec") or "classification"))
    found = {**(getattr(task, "settings", {}) or {}), **(rec.get("settings") or {})}
    logits = desc.logits().public if getattr(task, "logits", False) else ""
    return task, Info(tuple(str(s) for s in iface.get("labels") or ()), found, 0.0, logits)


def concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Batches of outputs by name -> one array per output."""
    import numpy as np

    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def one_output(outputs: dict[str, Any], name: str, where: str, refusal: str) -> Any:
    """The output a task reads: the only one, or the one import named `name`; else InputError `refusal`
    followed by the outputs the model has."""
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    if name in outputs:
        return outputs[name]
    raise InputError(f"{where}: {refusal}; the model has {len(outputs)} ({', '.join(outputs)})")


def settings(task: Any, postprocess: Any) -> dict[str, Any]:
    """The task's postprocessing settings: its defaults, with the `postprocess.*` config keys it has."""
    given = dataclasses.asdict(postprocess) if dataclasses.is_dataclass(postprocess) else dict(postprocess or {})
    out = dict(getattr(task, "settings", {}) or {})
    return {k: type(v)(given[k]) if k in given else v for k, v in out.items()}


def check_outputs(task: Any, outputs: dict[str, Any], info: Info, where: str) -> None:
    """The task's own check of a model's outputs (numpy, by name, for a few samples), if it has one: a
    model that cannot serve the task fails before training, naming the output."""
    fn = getattr(task, "check_outputs", None)
    if fn is not None:
        fn(outputs, info, where)


_DATA = {"labels": "class labels", "boxes": "boxes (a detection source: data.source shapes or a COCO folder)"}


def check_data(task: Any, targets: str, source: str) -> None:
    """Refuse data whose targets the task cannot learn from (a task without `data` takes any)."""
    need = getattr(task, "data", None)
    if need and need != targets:
        raise InputError(f"model.task {task.name}: needs {_DATA.get(need, need)}; data.source {source} has "
                         f"{_DATA.get(targets, targets)}")


def dynamic(task: Any) -> bool:
    """Whether the task's image input has dynamic dims it prepares itself (see the module docstring)."""
    return hasattr(task, "prepare_images")


def owns_data(task: Any) -> bool:
    """A task that owns its data and batching (`load_data`, `batches(split, info, size, limit, rows)`, `decode`,
    `score`: ocr_rec, whose input has a dynamic width): `pipe compress` measures it on its own batches
    (pipeline/compress_owned.py) instead of fixed-shape arrays."""
    return hasattr(task, "load_data")


def splits(task: Any, data: Any, names: tuple[str, ...] | list[str] = ("train", "val", "test")) -> str:
    """What an owned-data task's `load_data` gave, in one phrase naming each split of `names` that has items, its count
    in the task's `unit` and the label files it was read from (`data.files`, where it has them), e.g.
    "test (12 lines of my_lines/rec_gt.txt)"."""
    files = getattr(data, "files", None) or {}
    parts = []
    for s in names:
        n = len(getattr(data, s))
        if n:
            src = (f" of {', '.join(files[s])}" if s in files else
                   f" carved out of {', '.join(files['train'])}" if "train" in files else "")
            parts.append(f"{s} ({n} {getattr(task, 'unit', 'lines')}{src})")
    return ", ".join(parts)


def fidelity(task: Any, got: dict[str, Any], ref: dict[str, Any], info: Info) -> dict[str, float]:
    fn = getattr(task, "fidelity", None)
    return dict(fn(got, ref, info)) if fn is not None else {}
