"""The serving package contract and its reader: what `pipe package` writes and `pipe serve` accepts.

A package is an allowlist of files (`allowlist`), `serving.yaml` (schema `SERVING_SCHEMA`) and a manifest
with the sha256 of each. `load_package` verifies all of it before anything is loaded; `settings` merges the
package's defaults with the `pipe serve` flags. serving.yaml lists every tensor (`inputs:`, `outputs:`; each
a name = the served program's, alias = the public name, dtype, shape with -1 for dynamic axes, and
`role: logits` on the logits output); `Spec.io` is that description (`pipeline/iospec.py`). Packages made
before it held one `input:` and one `output:`, read as a one-tensor list each. The `task:` section (name,
spec, postprocessing settings: `pipeline/tasks/`) says what /v1 answers; `Spec.task` and `Spec.info` are
that task and its Info (labels, settings, the logits output's public name, "" for a task without logits);
a package without one is classification. Text packages also carry the vocabulary
(`vocab.json`, a JSON list, id = position) and a `text:` section; `TextSpec.encode` is the training encoder
itself (`pipeline.data.encode_texts`), so served text gets exactly the ids its model was trained on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pipeline import artifacts, data as data_mod, engines, iospec, runtime, tasks
from pipeline.errors import InputError

PRECISIONS = ("fp32", "bf16", "int8")
# Paddle dtype name -> (Paddle Serving feed/fetch type, Serving Tensor data field, Triton data type).
DTYPES = {
    "float32": (1, "float_data", "TYPE_FP32"),
    "int64": (0, "int64_data", "TYPE_INT64"),
    "int32": (2, "int_data", "TYPE_INT32"),
}
# The model files of a package, by serving.yaml's model.format (besides the Triton directory).
MODEL_FILES = {"pir": ("model.json", "model.pdiparams"), "legacy": ("model.pdmodel", "model.pdiparams"),
               "onnx": ("model.onnx",), "ir": ("model.xml", "model.bin")}
PARAMS_FILE = "model.pdiparams"
DEFAULT_ENGINE = "paddle_inference"  # packages made before serving.yaml named an engine
DOC_FILES = ("serving.yaml", "serving_client_conf.prototxt", "README.md")
TRITON_LABELS = "labels.txt"  # the logits output's class names (tasks with logits only)
TRITON_FILES = ("config.pbtxt", "1/model.onnx", TRITON_LABELS)
VOCAB_FILE = "vocab.json"  # text packages: the only name `serve` accepts for the vocabulary
REFERENCE_FILE = "reference.safetensors"  # inputs and their fp32 outputs (pipeline/reference.py)
SERVING_SCHEMA = 1
# Server defaults written into serving.yaml; `pipe serve` flags override them.
SERVER_DEFAULTS = {
    "http_workers": 0, "predictors": 1, "predictor_mode": "auto", "threads": 0, "queue_size": 64, "timeout_s": 30.0,
    "max_body_bytes": 8 << 20, "max_json_depth": 32, "max_image_pixels": 4096 * 4096, "drain_s": 30.0,
}
# The text keys of serving.yaml's `text:` section (from the export's preprocessing).
TEXT_KEYS = ("tokenizer", "max_len", "pad_id", "unk_id", "vocab_file", "vocab_size")


def allowlist(fmt: str, triton_name: str | None, vocab_file: str | None = None, reference: bool = False,
              labels: bool = True) -> set[str]:
    """Every file a package holds (manifest.json included): the test and `serve` check against it. Packages
    made before the reference set existed have none (`serve` says their check cannot run); the Triton
    repository has labels.txt for a task with logits only (`labels`)."""
    files = {*MODEL_FILES[fmt], *DOC_FILES, artifacts.MANIFEST}
    if reference:
        files.add(REFERENCE_FILE)
    if vocab_file:
        files.add(vocab_file)
    if triton_name:
        files |= {f"triton/{triton_name}/{f}" for f in TRITON_FILES if labels or f != TRITON_LABELS}
    return files


def check_vocab(path: Path, text: dict[str, Any]) -> dict[str, int]:
    """vocab.json -> {token: id}, checked against the `text` spec (size, [PAD]/[UNK] ids, no duplicates)."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{path}: not a UTF-8 JSON vocabulary") from None
    ok = isinstance(vocab, list) and all(isinstance(t, str) for t in vocab) and len(set(vocab)) == len(vocab)
    if not ok or len(vocab) != text["vocab_size"]:
        raise InputError(f"{path}: expected a JSON list of {text['vocab_size']} distinct strings (vocab_size)")
    if vocab[text["pad_id"]] != "[PAD]" or vocab[text["unk_id"]] != "[UNK]":
        raise InputError(f"{path}: [PAD] and [UNK] must sit at pad_id {text['pad_id']} and unk_id {text['unk_id']}")
    return {t: i for i, t in enumerate(vocab)}


def text_section(pre: dict[str, Any], where: str) -> dict[str, Any]:
    """The `text:` section from a text preprocessing dict, checked: a char tokenizer with [PAD]=0, [UNK]=1
    (what `pipeline.data.encode_texts` writes), max_len >= 1, and the vocabulary file name."""
    try:
        text = {k: pre[k] for k in TEXT_KEYS}
        ok = (text["tokenizer"] == "char" and text["pad_id"] == 0 and text["unk_id"] == 1
              and text["vocab_file"] == VOCAB_FILE
              and all(isinstance(text[k], int) and not isinstance(text[k], bool) for k in ("max_len", "vocab_size"))
              and text["max_len"] >= 1 and text["vocab_size"] >= 2)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: text preprocessing must be the char tokenizer with pad_id 0, unk_id 1, "
                         f"{VOCAB_FILE}, max_len >= 1 and vocab_size (as pipe's data module writes it)")
    return text


@dataclass(frozen=True)
class TextSpec:
    """A text package's tokenizer: characters -> ids of `vocab`, truncated and padded to max_len."""

    max_len: int
    pad_id: int
    unk_id: int
    vocab_size: int
    vocab: dict[str, int]
    section: dict[str, Any]

    def encode(self, texts: list[str]) -> np.ndarray:
        """The training encoder itself: int64 (N, max_len), truncated, [PAD]-padded, unknown -> [UNK]."""
        return data_mod.encode_texts(texts, self.vocab, self.max_len)


@dataclass(frozen=True)
class Spec:
    """serving.yaml, checked."""

    name: str
    precision: str
    fmt: str
    files: tuple[Path, ...]  # the model files, in the order the engine loads them
    engine: str  # the engine the package was built and checked for (serving.yaml model.engine)
    io: iospec.IO  # every input and output: the served program's `name`, public `alias`, dtype, shape, role
    labels: list[str]
    preprocessing: dict[str, Any]
    doc: dict[str, Any]
    manifest_sha256: str
    text: TextSpec | None = None
    task: Any = None  # the task module (or a user's object) /v1 answers through (`pipeline/tasks/`)
    info: tasks.Info = tasks.Info(())  # its labels, postprocessing settings and logits output (public name)

    @property
    def dir(self) -> Path:
        return self.files[0].parent


def _entry(t: iospec.Tensor) -> dict[str, Any]:
    """One tensor as serving.yaml lists it: name (public), program_name (the served program's, where it
    differs: the engines' detail), dtype, shape, role (`iospec.Tensor.to_dict`)."""
    return t.to_dict()


def entries(tensors: tuple[iospec.Tensor, ...]) -> list[dict[str, Any]]:
    """serving.yaml's `inputs:` or `outputs:` list."""
    return [_entry(t) for t in tensors]


def task_section(iface: dict[str, Any], where: str) -> dict[str, Any]:
    """serving.yaml's `task:` section from a manifest's interface: name, spec (what `tasks.get` reads) and
    the postprocessing settings recorded at training (the task's defaults under them); an interface
    without a task is classification."""
    rec = iface.get("task") or {}
    if not isinstance(rec, dict) or not isinstance(rec.get("settings") or {}, dict):
        raise InputError(f"{where}: task must be a mapping of name, spec and settings")
    task = tasks.get(str(rec.get("spec") or "classification"))
    settings = {**(getattr(task, "settings", {}) or {}), **(rec.get("settings") or {})}
    return {"name": str(task.name), "spec": str(rec.get("spec") or "classification"), "settings": settings}


def read_task(section: Any, io_: iospec.IO, labels: list[str], where: str) -> tuple[Any, tasks.Info]:
    """serving.yaml's `task:` section (absent: classification) -> (task, Info), its module imported."""
    if section is not None and not (isinstance(section, dict) and isinstance(section.get("spec"), str)
                                    and isinstance(section.get("settings") or {}, dict)):
        raise InputError(f"{where}: task must name a spec and its settings (a mapping)")
    try:
        return tasks.from_interface({"task": section, "labels": labels}, io_)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def limits_of(task: Any, info: tasks.Info) -> tuple[int, ...] | None:
    """A task's per-sample input limits if its input is dynamic (`tasks.dynamic`), else None."""
    return tuple(int(d) for d in task.sample_limits(info)) if tasks.dynamic(task) else None


def check_io(io_: iospec.IO, labels: list[str], text: bool, where: str, logits: bool = True,
             limits: tuple[int, ...] | None = None) -> None:
    """What a package serves, checked (the package stage and `load_package` alike): every tensor of a
    servable dtype (`DTYPES`) with a dynamic batch and at least one more axis; inputs fixed behind the batch
    (text: every input int64 ids [-1, -1]; a task with a dynamic image input, `limits` = its
    `sample_limits`: one float32 input whose dims are dynamic or those limits); for a task with logits
    (`logits`), the logits output float32 [-1, len(labels)]. One line otherwise."""
    for kind, tensors in (("input", io_.inputs), ("output", io_.outputs)):
        for t in tensors:
            if t.dtype not in DTYPES:
                raise InputError(f"{where}: {kind} {t.public!r} dtype {t.dtype} is not servable "
                                 f"(pipe serves {', '.join(DTYPES)})")
            if len(t.shape) < 2:
                raise InputError(f"{where}: {kind} {t.public!r} shape {list(t.shape)}: expected a dynamic batch "
                                 "and at least one more axis")
    if limits is not None:
        t = io_.inputs[0]
        if len(io_.inputs) != 1 or t.dtype != "float32" or len(t.shape) != len(limits) + 1 \
                or any(d not in (-1, m) for d, m in zip(t.shape[1:], limits)):
            raise InputError(f"{where}: this task takes one float32 input [-1, {', '.join(map(str, limits))}] "
                             f"(dims may be dynamic, -1); got {', '.join(f'{u.public!r} {u.dtype} {list(u.shape)}' for u in io_.inputs)}")
    for t in io_.inputs if limits is None else ():
        if text and (t.dtype != "int64" or list(t.shape) != [-1, -1]):
            raise InputError(f"{where}: a text model takes int64 ids of shape [-1, -1]; input {t.public!r} is "
                             f"{t.dtype} {list(t.shape)}")
        if not text and min(t.shape[1:]) < 1:
            raise InputError(f"{where}: input {t.public!r} shape must be a dynamic batch and fixed dims, got "
                             f"{list(t.shape)}")
    if not logits:
        return
    logits_t = io_.logits()
    if logits_t.dtype != "float32" or list(logits_t.shape) != [-1, len(labels)]:
        raise InputError(f"{where}: the logits output {logits_t.public!r} must be float32 [-1, {len(labels)}], "
                         f"got {logits_t.dtype} {list(logits_t.shape)}")


@dataclass(frozen=True)
class Settings:
    predictors: int
    threads: int
    max_batch_size: int
    max_wait_ms: float
    queue_size: int
    timeout_s: float
    max_body_bytes: int
    max_json_depth: int
    max_image_pixels: int
    drain_s: float
    http_workers: int = 1  # HTTP processes on the one port (pipeline/serving/workers.py)
    predictor_mode: str = "process"  # "process" or "in-process" (`mode_for`)


def load_package(path: Path) -> Spec:
    """Verify the package (manifest, sha256 of every file, the allowlist) and read serving.yaml."""
    art = artifacts.verify(path, ("package",))
    where = path / "serving.yaml"
    if "serving.yaml" not in art.manifest["files"]:
        raise InputError(f"{path / artifacts.MANIFEST}: lists no serving.yaml")
    try:
        doc = yaml.safe_load(where.read_text(encoding="utf-8"))
        fmt = doc["model"]["format"]
        names = MODEL_FILES[fmt] if fmt in MODEL_FILES else ()
        engine = doc["model"].get("engine") or DEFAULT_ENGINE
        given = [doc["model"]["program"]] + ([doc["model"]["params"]] if doc["model"].get("params") else [])
        labels = [str(s) for s in doc["labels"]]
        # packages made before serving.yaml listed every tensor: one `input:`, one `output:` (the logits)
        tensors = ({"inputs": doc["inputs"], "outputs": doc["outputs"]} if "inputs" in doc
                   else {"inputs": [doc["input"]], "outputs": [doc["output"]]})
        is_text = isinstance(doc["preprocessing"], dict) and doc["preprocessing"].get("kind") == "text"
        ok = (doc["schema"] == SERVING_SCHEMA and doc["precision"] in PRECISIONS
              and tuple(given) == names and isinstance(engine, str)
              and isinstance(doc["preprocessing"], dict) and isinstance(doc["name"], str)
              and all(isinstance(v, list) and all(isinstance(t, dict) for t in v) for v in tensors.values()))
        ok = ok and (not is_text or isinstance(doc.get("text"), dict))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: not a serving spec this pipe reads (schema {SERVING_SCHEMA})")
    io_ = iospec.IO.from_interface(tensors, str(where))
    task, info = read_task(doc.get("task"), io_, labels, str(where))
    check_io(io_, labels, is_text, str(where), logits=bool(info.logits), limits=limits_of(task, info))
    text = None
    if is_text:
        section = text_section(doc["text"], f"{where}: text")
        vocab = check_vocab(path / section["vocab_file"], section)
        text = TextSpec(section["max_len"], section["pad_id"], section["unk_id"], section["vocab_size"], vocab,
                        section)
    triton = doc.get("triton") or {}
    ref = doc.get("reference")
    if ref is not None and not (isinstance(ref, dict) and ref.get("file") == REFERENCE_FILE
                                and isinstance(ref.get("min_agreement"), (int, float))
                                and 0 <= ref["min_agreement"] <= 1
                                and (ref.get("min_sqnr_db") is None or (isinstance(ref["min_sqnr_db"], (int, float))
                                                                       and math.isfinite(ref["min_sqnr_db"])))):
        raise InputError(f"{where}: reference must name {REFERENCE_FILE}, a min_agreement in 0..1 and, if any, a "
                         "finite min_sqnr_db")
    allowed = allowlist(fmt, triton.get("model") if triton else None, text.section["vocab_file"] if text else None,
                        reference=ref is not None, labels=bool(info.logits))
    found = set(art.manifest["files"]) | {artifacts.MANIFEST}
    if found != allowed:
        odd = sorted(found - allowed) or sorted(allowed - found)
        raise InputError(f"{path / artifacts.MANIFEST}: {odd[0]} is not in the package allowlist "
                         "(inference-format files only)")
    return Spec(doc["name"], doc["precision"], fmt, tuple(path / f for f in names), engine, io_, labels,
                doc["preprocessing"], doc, art.manifest_sha256, text, task, info)


MODES = ("auto", "process", "in-process")
# Engines whose run releases the GIL: they can run on the batcher's threads, in the server's own process.
_GIL_FREE = ("onnxruntime", "openvino")


def mode_for(engine: str, mode: str = "auto") -> str:
    """Where predictors run: "in-process" (the batcher's threads call the engine: no pipe, no second process;
    onnxruntime and OpenVINO release the GIL while they run) or "process" (a child each: Paddle Inference holds
    the GIL for a whole run on CPU: pipeline/serving/predictor.py's docstring). "auto" picks by engine;
    "in-process" for Paddle Inference is refused (InputError, one line)."""
    if mode not in MODES:
        raise InputError(f"--predictor-mode: one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        return "in-process" if engine in _GIL_FREE else "process"
    if mode == "in-process" and engine not in _GIL_FREE:
        raise InputError(f"--predictor-mode in-process: {engine} holds the GIL while it runs; it runs in predictor "
                         "processes (--predictor-mode process or auto)")
    return mode


# What each engine runs of a package: formats and precisions (OpenVINO cannot read PaddleSlim's int8 program:
# its scales are stored with other dims than the program declares, facts note section 13).
_RUNS = {"paddle_inference": {"pir": ("fp32", "bf16"), "legacy": ("fp32", "int8")},
         "onnxruntime": {"onnx": ("fp32", "int8")},
         "openvino": {"onnx": ("fp32", "int8"), "legacy": ("fp32",), "ir": ("fp32", "int8")}}


def engine_for(spec: Spec, override: str = "") -> str:
    """The engine to serve `spec` with: the package's, or `--engine` when it runs the package's files.
    InputError (one line) for an unknown engine, a missing library, or files the engine cannot run."""
    if not override or override == "auto":
        return spec.engine
    name = engines.resolve(override)
    if spec.precision not in _RUNS[name].get(spec.fmt, ()):
        held = ", ".join(p.name for p in spec.files)
        can = [e for e, fmts in _RUNS.items() if spec.precision in fmts.get(spec.fmt, ())]
        raise InputError(f"--engine {override}: {spec.dir} holds {held} ({spec.fmt} {spec.precision}), which "
                         f"{name} does not run; it runs on {', '.join(can)}")
    lib = engines.missing(name)
    if lib:
        raise InputError(f"--engine {override}: {lib}")
    return name


def settings(cfg: Any, spec: Spec) -> Settings:
    """`pipe serve` flags (a ServeConfig; None = the package's value) over serving.yaml, range-checked."""
    server = {**SERVER_DEFAULTS, **(spec.doc.get("server") or {})}
    batching = spec.doc.get("batching") or {}

    def pick(flag: str, given: Any, default: Any, kind: type, low: float, high: float) -> Any:
        value = default if given is None else given
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise InputError(f"{flag}: expected {kind.__name__}, got {value!r}") from None
        if not (low <= value <= high) or (kind is float and not math.isfinite(value)):
            raise InputError(f"{flag}: must be {low:g}..{high:g}, got {value:g}")
        return value

    cores = runtime.available_cores()
    workers = pick("--http-workers", cfg.http_workers, server["http_workers"], int, 0, 64)
    if workers == 0:  # one HTTP process per core, at most 4 (pipeline/serving/workers.py)
        from pipeline.serving import workers as workers_mod

        workers = workers_mod.auto(cores)
    predictors = pick("--predictors", cfg.predictors, server["predictors"], int, 1, 64)
    mode = mode_for(engine_for(spec, cfg.engine), cfg.predictor_mode or str(server["predictor_mode"]))
    threads = pick("--threads", cfg.threads, server["threads"], int, 0, 256)
    if threads == 0:  # the cores but one per HTTP process, shared by every predictor
        threads = max(1, (cores - workers) // (workers * predictors))
    return Settings(
        http_workers=workers,
        predictors=predictors,
        predictor_mode=mode,
        threads=threads,
        max_batch_size=pick("--max-batch-size", cfg.max_batch_size, batching.get("max_batch_size", 32), int, 1, 4096),
        max_wait_ms=pick("--max-wait-ms", cfg.max_wait_ms, batching.get("max_wait_ms", 2.0), float, 0, 1000),
        queue_size=pick("--queue-size", cfg.queue_size, server["queue_size"], int, 1, 100_000),
        timeout_s=pick("--timeout", cfg.timeout_s, server["timeout_s"], float, 0.001, 3600),
        max_body_bytes=pick("--max-body-bytes", cfg.max_body_bytes, server["max_body_bytes"], int, 64, 1 << 31),
        max_json_depth=pick("serving.yaml server.max_json_depth", None, server["max_json_depth"], int, 4, 256),
        max_image_pixels=pick("serving.yaml server.max_image_pixels", None, server["max_image_pixels"], int, 1,
                              1 << 28),
        drain_s=pick("--drain", cfg.drain_s, server["drain_s"], float, 0, 3600),
    )
