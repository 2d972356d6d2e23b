"""pipe compress: int8 post-training quantization of an export, measured and gated, as `<run>/compress/`.

    pipe compress runs/exp1/export --int8
    pipe compress runs/exp1/export --int8 --backend paddle --algo KL --calib-batches 20 --max-drop 0.5
    pipe compress runs/sentiment/export --distill --student text_cnn --int8

Reads a verified `export/` artifact (the PIR program for fp32/bf16, the legacy program for PaddleSlim)
and the data it was trained on. Writes `compress/`:
- `int8-paddle/model.pdmodel` + `model.pdiparams` (`--backend paddle|both`): PaddleSlim
  `quant_post_static` on the legacy program, in a child process with FLAGS_enable_pir_api=0 (PaddleSlim
  2.6 cannot read PIR), run by Paddle Inference with oneDNN int8 kernels (`enable_onednn_int8`);
- `onnx-fp32/model.onnx` and `int8-onnx/model.onnx` (`--backend onnxruntime|both`): paddle2onnx of the
  PIR program (in a child: it can abort the process), then onnxruntime `quant_pre_process` +
  `quantize_static` (QDQ, unsigned QUInt8 activations, per-channel QInt8 weights, 7-bit with
  `compress.reduce_range` so the file computes the same on CPUs without VNNI; signed activations were
  slower than fp32 on this kind of CPU);
- nothing for OpenVINO (`compress.openvino`): `openvino-fp32` runs the export's legacy program (it does
  not read PIR; the fp32 ONNX when there is no legacy program), `openvino-int8` the int8-onnx file;
- `manifest.json`: `metrics.variants` maps fp32, bf16, int8-paddle, onnx-fp32, int8-onnx, openvino-fp32,
  openvino-int8 to their format, engine, files (relative to this dir, or with `source: "export"` to the
  export's; fp32/bf16 have `files: []`: they run the export's `model.json`), test accuracy, top-1 agreement and max|diff| against fp32 over up to
  4,096 samples of all splits, size, p50/p99 latency at batch 1, items/s at batch 32, the engine as it
  describes itself, and a status: `ok`, `below budget` (agreement < `compress.min_agreement`), `unreliable
  on this CPU` (Paddle int8 without VNNI that is not both within budget and faster) or `unsupported`.
  `metrics.cpu` is this CPU's int8 capability (`pipeline/cpu.py`), which decides the int8 settings.

Both int8 routes calibrate on the same `calib_batches` x `calib_batch_size` samples drawn (seeded)
from the TRAIN split.

Text exports (int64 ids `[-1, -1]`, `preprocess.yaml` with `vocab_file`): every input, calibration and
test alike, is the split's raw text encoded with the export's own `vocab.json` (`data.encode_texts`,
padded to the export's `max_len`); the vocabulary `data.source` builds now must equal it, else the data
changed (exit 2). The int8 routes quantize the matmul/linear ops (the embedding lookup stays fp32).
A model Paddle could not write as a legacy program (nn.GRU, and nn.MultiHeadAttention's
activation x activation matmul in Paddle 3.3.1: `export` records `legacy.available: false` and why)
has no PaddleSlim route: `int8-paddle` is recorded as unsupported with the export's reason, and
`--backend paddle` alone is refused (exit 2). Timing batches are the test split's texts padded to max_len.

Timing interleaves the variants run by run after a warm-up, so machine noise hits them alike. Gates
(nothing written): some int8 variant must be within budget (status `ok`), and the best of those may lose
at most `max_drop` points of test accuracy against fp32 (exit 4); the ONNX conversion must match fp32
within the export's parity tolerance (exit 5). Whether int8
is faster is measured and said plainly, not assumed: on a tiny model it is not. No pickles are
written (no `.pdiparams.info`, `.pkl`, `.npy`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from pipeline import artifacts, config as config_mod, cpu, data as data_mod, iospec, runtime
from pipeline import engines as engines_mod
from pipeline.engines import openvino as ov_engine, ort as ort_engine, paddle as paddle_engine
from pipeline.config import CompressConfig, RunConfig
from pipeline.errors import GateError, InputError, ParityError, PipeError

_EVAL_BATCH = 256
_FIDELITY_MAX = 4096  # samples of all splits on which agreement and max|diff| are measured
_FIDELITY_SEED = 0
_BS_THROUGHPUT = 32
_WARMUP = 20  # runs per variant and batch size before anything is timed
_ROUNDS, _SEGMENTS, _BLOCK_WARMUP = 10, 2, 3  # see interleaved()
_SWITCH_PAUSE_S = 0.3  # > KMP_BLOCKTIME (200 ms): the other engine's threads have stopped spinning
_SPEED_MARGIN = 1.05  # "faster" means at least 5% faster at batch 1 (p50) and at batch 32
_CHILD_TIMEOUT = 1800
_QUANT_OPS = ["conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2"]
_ORT_TEXT_OPS = ("MatMul", "Gemm")
# onnxruntime's closest calibrator to each PaddleSlim algorithm (it has no MSE search).
_ORT_CALIB = {
    "avg": ("MinMax", {"CalibMovingAverage": True}),
    "KL": ("Entropy", {}),
    "hist": ("Percentile", {"CalibPercentile": 99.99}),  # PaddleSlim's hist_percent 0.9999
    "mse": ("MinMax", {}),
}
_BACKEND_VARIANTS = {"paddle": ("int8-paddle",), "onnxruntime": ("onnx-fp32", "int8-onnx")}
_VARIANT_FILES = {
    "int8-paddle": ("int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"),
    "onnx-fp32": ("onnx-fp32/model.onnx",),
    "int8-onnx": ("int8-onnx/model.onnx",),
}


def run(cfg: RunConfig, in_dir: Path, out_dir: Path) -> Path:
    """Quantize the export artifact `in_dir` into `out_dir`. Only `cfg.compress` is read from `cfg`:
    model, data and parity tolerance are the ones recorded in the export manifest."""
    ccfg, out_dir = cfg.compress, Path(out_dir)
    if not ccfg.int8 and not ccfg.distill:
        raise InputError("nothing to do: pass --int8 (compress.int8) and/or --distill --student NAME")
    if ccfg.distill and not ccfg.student:
        raise InputError("--distill: name the student model with --student (e.g. --student mlp, "
                         "or text_cnn for a text model)")
    src = artifacts.verify(in_dir, ("export",))
    distilled = None
    if ccfg.distill:  # from here on, the student's export is what gets measured and quantized
        _check_student(src, ccfg.student)
        src, distilled = _distill(cfg, src, out_dir.parent)
    exp_cfg = config_mod.from_dict(src.manifest["config"])
    io = _read_export(src)
    backends = ("paddle", "onnxruntime") if ccfg.backend == "both" else (ccfg.backend,)
    backends = backends if ccfg.int8 else ()
    skipped = _skipped_routes(src, io, backends)
    ds = data_mod.load(exp_cfg.data)
    _check_data(src, ds, io)
    prep = _preparer(ds, io)
    calib = _calibration_batches(ds, prep, ccfg)
    y_test = np.asarray(ds.test.y[ds.test.idx])
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)  # threads and logging on our terms before any engine loads
    doc = dataclasses.replace(exp_cfg, compress=ccfg).to_dict()
    with artifacts.write_stage(out_dir, "compress", doc, src) as w:
        if "paddle" in backends and "int8-paddle" not in skipped:
            _quantize_paddle(src, io, calib, ccfg, w.dir / "int8-paddle", threads)
        if "onnxruntime" in backends:
            _to_onnx(src, w.dir / "onnx-fp32", threads)
            _quantize_onnx(w.dir / "onnx-fp32/model.onnx", io, calib, ccfg, w.dir / "int8-onnx")
        engines = _engines(src, w.dir, io, backends, skipped, threads)  # may add to `skipped`
        if ccfg.openvino:
            engines.update(_openvino(src, w.dir, io, engines, threads))
        _check_file_set(w.dir, backends, skipped)
        variants = _measure(engines, src, w.dir, ds, prep, ccfg)
        parity = _onnx_parity(variants, exp_cfg.export.parity_tol)
        cap = cpu.capability()
        _print_table(variants, len(y_test), io, cap)
        w.metrics = _metrics(variants, parity, ccfg, calib, len(y_test), threads, io, cap)
        if distilled is not None:
            w.metrics["distill"] = distilled
        if ccfg.int8:
            _gate(w.metrics, variants, ccfg, len(y_test))
        w.interface = src.manifest["interface"]
        w.extra = {"format": "variants", "tools": _tool_versions()}
    return out_dir


def _distill(cfg: RunConfig, teacher: artifacts.Artifact, run_dir: Path) -> tuple[artifacts.Artifact, dict[str, Any]]:
    """Train `compress.student` from the export's trained model through `pipe train` (ranks, checkpoints,
    resume, AMP: the `train`, `amp`, `dist` and `distill` sections of this config), export it
    (parity-gated) into `RUN/student-NAME/`, and with `compress.baseline` train it alone too."""
    from stages import export as export_stage

    ref = teacher.manifest["input"]
    teacher_train = artifacts.verify((teacher.path / ref["path"]).resolve(), ("train",))
    exp_cfg = config_mod.from_dict(teacher.manifest["config"])
    name = cfg.compress.student
    student_cfg = dataclasses.replace(
        exp_cfg, model=dataclasses.replace(exp_cfg.model, name=name), train=cfg.train, amp=cfg.amp, dist=cfg.dist,
        distill=dataclasses.replace(cfg.distill, teacher=str(teacher_train.path.resolve())))
    tag = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)
    student_dir = run_dir / f"student-{tag}"
    student = _train_once(student_cfg, student_dir / "train")
    exported = artifacts.verify(export_stage.run(student_cfg, student.path, student_dir / "export"), ("export",))
    _same_tokenizer(teacher, exported)
    out = {"student": name, "teacher_model": exp_cfg.model.name, "temperature": cfg.distill.temperature,
           "alpha": cfg.distill.alpha, "teacher_test_acc": teacher_train.manifest["metrics"]["test_acc"],
           "student_test_acc": student.manifest["metrics"]["test_acc"], "student_dir": str(student_dir)}
    if cfg.compress.baseline:
        alone = dataclasses.replace(student_cfg, distill=dataclasses.replace(cfg.distill, teacher=""))
        base = _train_once(alone, run_dir / f"student-{tag}-baseline" / "train")
        out["baseline_test_acc"] = base.manifest["metrics"]["test_acc"]
        out["gain_points"] = (out["student_test_acc"] - out["baseline_test_acc"]) * 100
    print(f"distill: teacher {exp_cfg.model.name} {out['teacher_test_acc']:.2%} -> student {name} "
          f"{out['student_test_acc']:.2%}" + (f" (alone: {out['baseline_test_acc']:.2%}, gain "
                                             f"{out['gain_points']:+.2f} points)" if "gain_points" in out else ""))
    return exported, out


def _check_student(teacher: artifacts.Artifact, student: str) -> None:
    """A built-in student must take the teacher's kind of input (before anything is trained)."""
    from pipeline import models

    pre = teacher.manifest.get("interface", {}).get("preprocessing", {})
    text = isinstance(pre, dict) and pre.get("kind") == "text"
    if student in models.BUILTIN and (student in models.TEXT) != text:
        fit = [m for m in models.BUILTIN if (m in models.TEXT) == text]
        raise InputError(f"--student {student}: not a model for {'text' if text else 'image'} data like the "
                         f"teacher's {teacher.path} (built in: {', '.join(fit)}, or package.module:factory)")


def _same_tokenizer(teacher: artifacts.Artifact, student: artifacts.Artifact) -> None:
    """A text student is trained on the teacher's data config, so it must have come out with the teacher's
    vocabulary (byte for byte) and max_len; anything else means the data changed under the teacher."""
    t_pre, s_pre = (a.manifest["interface"]["preprocessing"] for a in (teacher, student))
    if t_pre.get("kind") != "text":
        return
    vocab = t_pre["vocab_file"]
    t_sha, s_sha = (a.manifest["files"].get(vocab, {}).get("sha256") for a in (teacher, student))
    if t_sha is None or t_sha != s_sha or t_pre["max_len"] != s_pre.get("max_len"):
        raise InputError(f"{student.path / vocab}: the student's vocabulary or max_len differs from the teacher's "
                         f"{teacher.path / vocab}; data.source no longer gives the teacher's data")


def _train_once(cfg: RunConfig, out: Path) -> artifacts.Artifact:
    """Reuse a finished training with the same config; else train (resuming its own checkpoints)."""
    from stages import train as train_stage

    try:
        done = artifacts.verify(out, ("train",))
        if done.manifest["config"] == cfg.to_dict():
            print(f"{out}: already trained with this config, reused")
            return done
    except InputError:
        pass
    resume = "auto" if (out.parent / "checkpoints").is_dir() else None
    return artifacts.verify(train_stage.run(cfg, out, resume=resume), ("train",))


def _tool_versions() -> dict[str, str]:
    """Converters the manifest's `versions` does not list."""
    from importlib import metadata

    out = {}
    for dist in ("paddle2onnx", "onnx"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


# ------------------------------------------------------------------ input checks and data


def _read_export(src: artifacts.Artifact) -> dict[str, Any]:
    """Input/output names and preprocessing of the export, checked before anything is loaded. Images:
    float32 NCHW with a dynamic batch. Text: int64 ids [-1, -1] and the export's vocabulary (`vocab`,
    token -> id, read from its verified `vocab.json`). `legacy_model` is None when export could not write
    the legacy program (`legacy_reason` says why)."""
    where = src.path / artifacts.MANIFEST
    m = src.manifest
    try:
        (inp,), (out,) = m["interface"]["inputs"], m["interface"]["outputs"]
        legacy = m["legacy"]
        io = {"input": str(inp["name"]), "output": str(out["name"]), "shape": [int(d) for d in inp["shape"]],
              "dtype": str(inp.get("dtype", "float32")),
              "labels": [str(s) for s in m["interface"]["labels"]], "pre": dict(m["interface"]["preprocessing"]),
              "legacy_input": None, "legacy_model": None, "legacy_params": None, "legacy_reason": None}
        if legacy.get("available", True):
            io.update(legacy_input=str(legacy["inputs"][0]), legacy_model=str(legacy["model"]),
                      legacy_params=str(legacy["params"]))
        else:
            io["legacy_reason"] = str(legacy.get("reason") or "no reason recorded")
        kind = io["pre"]["kind"]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise InputError(f"{where}: not an export this pipe can compress (needs one named input and output, "
                         "labels, preprocessing and a legacy entry)") from None
    for rel in ("model.json", "model.pdiparams", io["legacy_model"], io["legacy_params"]):
        if rel is not None:
            src.file(rel)  # listed, and verified above
    if kind == "text":
        if io["shape"] != [-1, -1] or io["dtype"] != "int64":
            raise InputError(f"{where}: a text input must be int64 ids of shape [-1, -1], got {io['dtype']} "
                             f"{io['shape']}")
        io["vocab"] = _read_vocab(src, io["pre"])
        io["vocab_sha256"] = m["files"][io["pre"]["vocab_file"]]["sha256"]
    elif len(io["shape"]) != 4 or io["shape"][0] != -1:
        raise InputError(f"{where}: input must be NCHW with a dynamic batch, got {io['shape']}")
    return io


def _read_vocab(src: artifacts.Artifact, pre: dict[str, Any]) -> dict[str, int]:
    """The export's own tokenizer: `vocab_file` (a JSON list, index = id) as token -> id."""
    try:
        rel, max_len = str(pre["vocab_file"]), int(pre["max_len"])
        pad_id, unk_id = int(pre["pad_id"]), int(pre["unk_id"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{src.path / artifacts.MANIFEST}: a text export needs preprocessing vocab_file, max_len, "
                         "pad_id and unk_id") from None
    path = src.file(rel)
    try:
        tokens = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a readable JSON vocabulary ({e.__class__.__name__})") from None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) \
            or len(set(tokens)) != len(tokens):
        raise InputError(f"{path}: expected a JSON list of distinct strings (index = token id)")
    # data.encode_texts pads with 0 and maps unknown characters to 1: the export must agree.
    if (pad_id, unk_id) != (0, 1) or len(tokens) < 2 or max_len < 1 \
            or pre.get("vocab_size", len(tokens)) != len(tokens):
        raise InputError(f"{path}: pad_id {pad_id}, unk_id {unk_id}, {len(tokens)} tokens, vocab_size "
                         f"{pre.get('vocab_size')}, max_len {max_len}: expected pad 0, unk 1 and vocab_size = tokens")
    return {t: i for i, t in enumerate(tokens)}


def _skipped_routes(src: artifacts.Artifact, io: dict[str, Any], backends: tuple[str, ...]) -> dict[str, str]:
    """variant -> why it cannot be built from this export (recorded as unsupported, not a crash)."""
    if "paddle" not in backends or io["legacy_model"] is not None:
        return {}
    why = (f"PaddleSlim quantizes only the legacy program, which export could not write for this model "
           f"({io['legacy_reason']})")
    if backends == ("paddle",):
        raise InputError(f"--backend paddle: {src.path / artifacts.MANIFEST}: {why}; use --backend onnxruntime")
    return {"int8-paddle": why}


def _check_data(src: artifacts.Artifact, ds: data_mod.Dataset, io: dict[str, Any]) -> None:
    """The data is re-read from `data.source`: it must still be the data the export was measured on."""
    where = src.path / artifacts.MANIFEST
    source = src.manifest["config"]["data"]["source"]
    now = ds.interface()["inputs"][0]["shape"]
    if now != io["shape"] or list(ds.labels) != io["labels"]:
        raise InputError(f"{where}: exported for {io['shape'][1:]} inputs with {len(io['labels'])} labels, but "
                         f"data.source {source!r} now gives {now[1:]} with {len(ds.labels)}; the data changed")
    n_test = src.manifest["metrics"].get("test_samples")
    if n_test is not None and n_test != len(ds.test):
        raise InputError(f"{where}: the test split had {n_test} samples, data.source {source!r} now gives "
                         f"{len(ds.test)}; the data changed")
    if "vocab" in io:
        vocab_now = ds.preprocessing.get("vocab")
        if vocab_now != list(io["vocab"]) or ds.preprocessing.get("max_len") != io["pre"]["max_len"]:
            raise InputError(f"{src.file(io['pre']['vocab_file'])}: data.source {source!r} now builds another "
                             "vocabulary or max_len than the export's; the data changed")
        if len(ds.texts) != len(ds.train.x):
            raise InputError(f"data.source {source!r}: a text dataset without its texts; cannot encode it with "
                             f"{src.file(io['pre']['vocab_file'])}")


Prep = Callable[[data_mod.Split, np.ndarray], np.ndarray]


def _preparer(ds: data_mod.Dataset, io: dict[str, Any]) -> Prep:
    """(split, positions in the split) -> model input. Images: `data.prepare` with the export's
    preprocessing. Text: the raw texts encoded with the export's vocabulary at its max_len (not the
    ids `data.load` stored, which come from the vocabulary rebuilt now), so what is calibrated and
    measured is exactly what a client of this export would send."""
    if "vocab" not in io:
        pre = io["pre"]
        return lambda split, rows: np.ascontiguousarray(
            data_mod.prepare(np.asarray(split.x[split.idx[rows]]), pre))
    vocab, max_len = io["vocab"], int(io["pre"]["max_len"])
    return lambda split, rows: data_mod.encode_texts([ds.texts[j] for j in split.idx[rows]], vocab, max_len)


def _calibration_batches(ds: data_mod.Dataset, prep: Prep, ccfg: CompressConfig) -> np.ndarray:
    """(batches, batch_size, ...): a seeded draw without replacement from the train split."""
    need = ccfg.calib_batches * ccfg.calib_batch_size
    if need > len(ds.train):
        raise InputError(f"compress.calib_batches x calib_batch_size = {need} samples, but the train split has "
                         f"{len(ds.train)}; lower --calib-batches")
    pick = np.random.default_rng(ccfg.calib_seed).permutation(len(ds.train))[:need]
    x = prep(ds.train, np.sort(pick))
    return np.ascontiguousarray(x.reshape(ccfg.calib_batches, ccfg.calib_batch_size, *x.shape[1:]))


def _batches(split: data_mod.Split, prep: Prep) -> Iterator[np.ndarray]:
    for i in range(0, len(split), _EVAL_BATCH):
        yield prep(split, np.arange(i, min(i + _EVAL_BATCH, len(split))))


def _check_file_set(d: Path, backends: tuple[str, ...], skipped: dict[str, str]) -> None:
    """Exactly the expected files: no `.pdiparams.info` (a pickle), no calibration caches."""
    want = {f for b in backends for v in _BACKEND_VARIANTS[b] if v not in skipped for f in _VARIANT_FILES[v]}
    found = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    if found != want:
        raise PipeError(f"compress wrote an unexpected file set (extra {sorted(found - want)}, "
                        f"missing {sorted(want - found)})")


# ------------------------------------------------------------------ quantization


def _quantize_paddle(src: artifacts.Artifact, io: dict[str, Any], calib: np.ndarray, ccfg: CompressConfig,
                     dest: Path, threads: int) -> None:
    """PaddleSlim reads only the legacy program, and only with FLAGS_enable_pir_api=0 set before paddle
    is imported: a child process. The calibration batches go through its stdin as raw bytes (float32
    images, int64 token ids)."""
    files = {"model.pdmodel": io["legacy_model"], "model.pdiparams": io["legacy_params"]}
    spec = {"model_dir": str(src.file(io["legacy_model"]).parent.resolve()),
            "files": {name: {"path": str(src.file(rel).resolve()), "sha256": src.manifest["files"][rel]["sha256"]}
                      for name, rel in files.items()},
            "dest": str(dest.resolve()), "input": io["legacy_input"], "algo": ccfg.algo,
            "calib_shape": list(calib.shape), "calib_dtype": calib.dtype.name}
    _child("--paddleslim", spec, calib.tobytes(), {"FLAGS_enable_pir_api": "0"}, threads, "PaddleSlim quantization")
    if not (dest / "model.pdmodel").is_file():
        raise PipeError("PaddleSlim wrote no model.pdmodel")


def _to_onnx(src: artifacts.Artifact, dest: Path, threads: int) -> None:
    """paddle2onnx of the PIR program. A child: on a model it cannot convert it aborts the process."""
    spec = {"files": {name: {"path": str(src.file(name).resolve()), "sha256": src.manifest["files"][name]["sha256"]}
                      for name in ("model.json", "model.pdiparams")},
            "dest": str((dest / "model.onnx").resolve())}
    dest.mkdir()
    _child("--onnx", spec, b"", {"FLAGS_enable_pir_api": "1"}, threads, "paddle2onnx")
    if not (dest / "model.onnx").is_file():
        raise PipeError("paddle2onnx wrote no model.onnx")


def _quantize_onnx(model: Path, io: dict[str, Any], calib: np.ndarray, ccfg: CompressConfig, dest: Path) -> None:
    import onnxruntime as ort
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ort.set_default_logger_severity(3)  # else every optimizer session warns about unused initializers

    class _Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.it, None)
            return None if batch is None else {io["input"]: batch}

    method, extra = _ORT_CALIB[ccfg.algo]
    dest.mkdir()
    with tempfile.TemporaryDirectory(prefix="pipe-compress-") as tmp:
        pre = Path(tmp) / "pre.onnx"
        # auto_merge: without it symbolic shape inference gave up on paddle2onnx's conv biases
        # (reshaped to [1,-1,1,1] through an Identity; mobilenet_v3_small's squeeze-excite blocks) with
        # "Incomplete symbolic shape inference". On failure onnxruntime drops sym_shape_infer_temp.onnx
        # into the working directory: run it from the temp dir. Text models skip it: on paddle2onnx's
        # sequence-length arithmetic (Shape -> Slice -> Range/Expand) it fails with a bare AssertionError
        # in `_get_value`; onnx's own shape inference is enough for quantize_static there.
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            quant_pre_process(str(Path(cwd, model)), str(pre), auto_merge=True, skip_symbolic_shape="vocab" in io)
        finally:
            os.chdir(cwd)
        # reduce_range (7-bit weights): a pair of u8 x s7 products fits in int16, so the model computes the
        # same on CPUs without VNNI, where onnxruntime's u8 x s8 kernels saturate (pipeline/cpu.py). Measured
        # on digits (1,797 samples): agreement with fp32 0.996 with it on an AVX2-only CPU (0.972 without)
        # and 0.996 on an AVX-512 VNNI CPU (0.998 without), at the same speed on both.
        q.quantize_static(str(pre), str(dest / "model.onnx"), _Reader(), quant_format=q.QuantFormat.QDQ,
                          activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8, per_channel=True,
                          reduce_range=ccfg.reduce_range, calibrate_method=getattr(q.CalibrationMethod, method),
                          extra_options=dict(extra), op_types_to_quantize=_ort_op_types(io))
    ort_engine.mark_weight_range(dest / "model.onnx", reduced=ccfg.reduce_range)


def _ort_op_types(io: dict[str, Any]) -> list[str] | None:
    """Text: the matmul/linear ops only, as on the Paddle route (the embedding Gather stays fp32).
    Images: onnxruntime's default, every op it can quantize."""
    return list(_ORT_TEXT_OPS) if "vocab" in io else None


def _child(flag: str, spec: dict[str, Any], stdin: bytes, env_extra: dict[str, str], threads: int, what: str) -> None:
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads), **env_extra,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # cwd: a scratch dir, so nothing the libraries may drop in the working directory survives.
    with tempfile.TemporaryDirectory(prefix="pipe-compress-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-m", "stages.compress", flag, json.dumps(spec)], input=stdin,
                                  capture_output=True, env=env, cwd=cwd, timeout=_CHILD_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise PipeError(f"{what} did not finish within {_CHILD_TIMEOUT} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
        err = InputError if proc.returncode == 2 else PipeError  # 2: an input changed since it was verified
        raise err(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")


# ------------------------------------------------------------------ engines and measurement


def _engines(src: artifacts.Artifact, cdir: Path, io: dict[str, Any], backends: tuple[str, ...],
             skipped: dict[str, str], threads: int) -> dict[str, dict[str, Any]]:
    """name -> {run: x -> logits, describe, format, precision, engine, files, source, inputs, outputs} for
    every variant, each loaded through its engine (`pipeline/engines/`).

    A Paddle predictor whose oneDNN bf16/int8 passes reject the program (e.g. bf16 on a 3-D pool:
    "the input of Op(pool) should be 4-D or 5-D Tensor") makes that variant unsupported with the
    engine's message, not the stage fail; an int8-paddle model that cannot run is deleted (and added
    to `skipped`), so the artifact ships no unusable files."""
    pir = [src.file("model.json"), src.file("model.pdiparams")]
    out: dict[str, dict[str, Any]] = {}

    def unsupported(name: str, fmt: str, precision: str, source: str, reason: str) -> dict[str, Any]:
        return {"run": None, "reason": reason, "engine": paddle_engine.NAME, "format": fmt, "precision": precision,
                "files": [], "source": source, "inputs": [io["input"]], "outputs": [io["output"]]}

    desc = iospec.IO.from_interface(src.manifest["interface"])
    out["fp32"] = {**entry(paddle_engine.load(pir, threads=threads), desc, pir[0]), "format": "pir",
                   "files": [], "source": "export"}
    bf16_reason = runtime.bf16_unsupported()
    if bf16_reason:
        out["bf16"] = unsupported("bf16", "pir", "bf16", "export", bf16_reason)
    else:
        try:
            bf16 = paddle_engine.load(pir, threads=threads, precision="bf16")
            out["bf16"] = {**entry(bf16, desc, pir[0]), "format": "pir", "files": [], "source": "export"}
        except PipeError as e:
            out["bf16"] = unsupported("bf16", "pir", "bf16", "export", f"oneDNN bf16 cannot run this model: {e}")
    if "paddle" in backends and "int8-paddle" not in skipped:
        files = [cdir / f for f in _VARIANT_FILES["int8-paddle"]]
        try:
            eng = paddle_engine.load(files, threads=threads, precision="int8")
        except PipeError as e:
            shutil.rmtree(cdir / "int8-paddle")
            skipped["int8-paddle"] = f"oneDNN int8 cannot run PaddleSlim's model: {e}"
        else:
            out["int8-paddle"] = {**entry(eng, desc, files[0]), "format": "legacy",
                                  "files": list(_VARIANT_FILES["int8-paddle"]), "source": "compress"}
    if "int8-paddle" in skipped:
        out["int8-paddle"] = unsupported("int8-paddle", "legacy", "int8", "compress", skipped["int8-paddle"])
    if "onnxruntime" in backends:
        for name, precision in (("onnx-fp32", "fp32"), ("int8-onnx", "int8")):
            (rel,) = _VARIANT_FILES[name]
            eng = ort_engine.load([cdir / rel], threads=threads, precision=precision)
            out[name] = {**entry(eng, desc, cdir / rel), "format": "onnx", "files": [rel], "source": "compress"}
    return out


def _openvino(src: artifacts.Artifact, cdir: Path, io: dict[str, Any], built: dict[str, dict[str, Any]],
              threads: int) -> dict[str, dict[str, Any]]:
    """OpenVINO on files the other routes made: fp32 on the export's legacy program (it does not read PIR;
    facts note section 13: faster than from paddle2onnx's ONNX on mobilenet_v3_small, 6.6x vs 4.6x fp32 at
    batch 1), else, or when its Paddle frontend cannot read that program (e.g. "No creator found for
    einsum node" on a text model), on onnx-fp32; int8 on int8-onnx's QDQ model. Unsupported, with the
    reason, when the library is missing or cannot load the file."""
    legacy = ("legacy", [io["legacy_model"], io["legacy_params"]], "export") if io["legacy_model"] else None
    onnx32 = ("onnx", list(_VARIANT_FILES["onnx-fp32"]), "compress")
    onnx8 = ("onnx", list(_VARIANT_FILES["int8-onnx"]), "compress")
    todo = {"openvino-fp32": ("fp32", [c for c in (legacy, onnx32) if c is not None])}
    if "int8-onnx" in built:
        todo["openvino-int8"] = ("int8", [onnx8])
    out: dict[str, dict[str, Any]] = {}
    desc = iospec.IO.from_interface(src.manifest["interface"])
    for name, (precision, choices) in todo.items():
        why = []
        for fmt, files, source in choices:
            paths = [src.file(f) if source == "export" else cdir / f for f in files]
            if not all(p.is_file() for p in paths):
                continue  # the onnxruntime route was not run (--backend paddle)
            base = {"format": fmt, "files": files, "source": source, "inputs": [io["input"]],
                    "outputs": [io["output"]]}
            try:
                eng = ov_engine.load(paths, threads=threads, precision=precision)
                out[name] = {**entry(eng, desc, paths[0]), **base}
                break
            except PipeError as e:
                why.append(str(e))
                out[name] = {"run": None, "reason": "; ".join(why), "engine": ov_engine.NAME, "precision": precision,
                             **base}
    return out


def entry(eng: Any, desc: iospec.IO, where: Path) -> dict[str, Any]:
    """What measurement needs of a loaded engine (`pipeline/engines/`): `run` x -> logits, fed and fetched by
    name (compress feeds one input, `_read_export`), the feed dict built once per batch."""
    info = eng.describe()
    on = engines_mod.names(eng, desc, str(where))
    (feed,) = (on[t.name] for t in desc.inputs)
    fetch = on[desc.logits().name]
    return {"run": lambda x: eng.run({feed: x})[fetch], "describe": info, "engine": info["engine"],
            "precision": info["precision"], "inputs": list(eng.inputs), "outputs": list(eng.outputs)}


def _measure(engines: dict[str, dict[str, Any]], src: artifacts.Artifact, cdir: Path, ds: data_mod.Dataset,
             prep: Prep, ccfg: CompressConfig) -> dict[str, dict[str, Any]]:
    """Test accuracy on the test split; top-1 agreement and max|diff| vs fp32 on up to `_FIDELITY_MAX`
    samples of all splits (the test split alone is a few hundred samples: one sample is 0.4 point of
    digits); then interleaved timing, then each variant's status (`_status`)."""
    test = ds.test
    live = {n: e for n, e in engines.items() if e["run"] is not None}
    y = np.asarray(test.y[test.idx])
    # Batch by batch (the split may be a large memmap); logits are small.
    logits = {n: np.concatenate([e["run"](xb) for xb in _batches(test, prep)]) for n, e in live.items()}
    chunks = list(fidelity_batches(ds, prep))
    wide = {n: np.concatenate([e["run"](xb) for xb in chunks]) for n, e in live.items()}
    ref, wide_ref = logits["fp32"], wide["fp32"]
    head = next(_batches(test, prep))  # text: padded to the export's max_len, as stored for training
    x1 = np.ascontiguousarray(head[:1])
    x32 = np.ascontiguousarray(np.resize(head, (_BS_THROUGHPUT, *head.shape[1:])))  # repeats if the split is small
    groups = [{n: e["run"] for n, e in live.items() if e["engine"] == engine}
              for engine in engines_mod.ENGINES]
    groups = [g for g in groups if g]
    lat = interleaved(groups, x1, ccfg.latency_runs)
    thr = interleaved(groups, x32, ccfg.throughput_runs)
    out: dict[str, dict[str, Any]] = {}
    for name, e in engines.items():
        v = {k: e[k] for k in ("format", "precision", "engine", "files", "source", "inputs", "outputs")}
        v["engine_info"] = e.get("describe")
        if v["source"] == "export":  # fp32/bf16: the PIR program; openvino-fp32: the legacy one
            v["size_bytes"] = sum(src.manifest["files"][f]["bytes"] for f in v["files"] or ("model.json", "model.pdiparams"))
        else:  # None: a variant that could not be built has no files
            v["size_bytes"] = sum((cdir / f).stat().st_size for f in v["files"]) if v["files"] else None
        if name not in live:
            out[name] = {**v, "supported": False, "reason": e["reason"], "accuracy": None, "top1_agreement": None,
                         "max_abs_diff": None, "agreement_samples": None, "test_top1_agreement": None,
                         "latency_ms_p50_bs1": None,
                         "latency_ms_p99_bs1": None, "items_per_s_bs32": None, "correct": None}
            continue
        got, got_wide = logits[name], wide[name]
        out[name] = {**v, "supported": True,
                     "accuracy": float((got.argmax(1) == y).mean()),
                     "correct": int((got.argmax(1) == y).sum()),
                     "top1_agreement": float((got_wide.argmax(1) == wide_ref.argmax(1)).mean()),
                     "max_abs_diff": float(np.abs(got_wide.astype(np.float64) - wide_ref).max()),
                     "max_abs_logit_fp32": float(np.abs(wide_ref).max()),
                     "agreement_samples": int(len(wide_ref)),
                     "test_top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
                     "latency_ms_p50_bs1": float(np.percentile(lat[name], 50) * 1e3),
                     "latency_ms_p99_bs1": float(np.percentile(lat[name], 99) * 1e3),
                     "items_per_s_bs32": float(_BS_THROUGHPUT / np.median(thr[name]))}
    base = out["fp32"]
    for name, v in out.items():
        if not v["supported"]:
            v.update(speedup_bs1=None, speedup_bs32=None, faster_than_fp32=None, note=v["reason"],
                     status=f"unsupported: {v['reason']}", shippable=False)
            continue
        s1 = base["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
        s32 = v["items_per_s_bs32"] / base["items_per_s_bs32"]
        v.update(speedup_bs1=s1, speedup_bs32=s32,
                 faster_than_fp32=None if name == "fp32" else bool(min(s1, s32) >= _SPEED_MARGIN),
                 note="" if name == "fp32" else _speed_note(s1, s32))
        v["status"] = _status(name, v, base, len(y), ccfg)
        v["shippable"] = v["status"] == "ok"
    if "int8-onnx" in out and "onnx-fp32" in out and out["int8-onnx"]["supported"]:  # int8 on its own engine
        own, v = out["onnx-fp32"], out["int8-onnx"]
        s1 = own["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
        s32 = v["items_per_s_bs32"] / own["items_per_s_bs32"]
        v["note"] += f" (vs onnx-fp32: {s1:.2f}x at batch 1, {s32:.2f}x at batch 32)"
    return out


def fidelity_batches(ds: data_mod.Dataset, prep: Prep) -> Iterator[np.ndarray]:
    """Up to `_FIDELITY_MAX` samples of train, val and test (a seeded draw when there are more), in
    `_EVAL_BATCH` batches: where int8 and fp32 are compared beyond the test split."""
    for sp, rows in data_mod.draw(ds, _FIDELITY_MAX, _FIDELITY_SEED):
        for i in range(0, len(rows), _EVAL_BATCH):
            yield prep(sp, rows[i:i + _EVAL_BATCH])


def _status(name: str, v: dict[str, Any], base: dict[str, Any], n_test: int, ccfg: CompressConfig) -> str:
    """'ok', 'below budget: ...' (agreement under compress.min_agreement: never shipped), or 'unreliable on
    this CPU: ...' (Paddle int8 where oneDNN has no exact int8 matmul and the int8 model, with the matmul
    family left in fp32, is not both within budget and faster than fp32)."""
    if name == "fp32":
        return "ok"
    agree = v["top1_agreement"]
    if agree < ccfg.min_agreement:
        return f"below budget: top-1 agreement {agree:.4f} < compress.min_agreement {ccfg.min_agreement:g}"
    if v["engine"] == paddle_engine.NAME and v["precision"] == "int8" and not cpu.int8_exact(paddle_engine.NAME):
        drop = (base["correct"] - v["correct"]) / n_test * 100
        if drop > ccfg.max_drop or not v["faster_than_fp32"]:
            return (f"unreliable on this CPU: oneDNN int8 matmul saturates without VNNI, so fc/matmul ran in fp32; "
                    f"then agreement {agree:.4f}, drop {drop:.2f} points, {v['speedup_bs1']:.2f}x fp32 at batch 1 "
                    f"and {v['speedup_bs32']:.2f}x at batch 32: not both within budget and faster")
    return "ok"


def interleaved(groups: list[dict[str, Callable[[np.ndarray], np.ndarray]]], x: np.ndarray,
                 n: int) -> dict[str, list[float]]:
    """Seconds per call, `n` per variant. Each group (one engine) is timed in `_SEGMENTS` turns, groups
    alternating; within a turn every variant runs a block of calls per round, the order rotating each
    round, so a noisy neighbour or a clock change hits fp32 and int8 alike. The first `_BLOCK_WARMUP`
    calls of a block (threads waking up) are not timed.

    Engines are not mixed call by call: Paddle's OpenMP threads spin ~200 ms after a call (KMP_BLOCKTIME)
    and onnxruntime's spin too, so alternating engines measured their fight for the 2 cores (fp32 p50
    13 ms instead of 0.5 ms), which no server running one engine sees. A pause lets them go idle."""
    for runs in groups:
        for fn in runs.values():
            for _ in range(_WARMUP):
                fn(x)
    times: dict[str, list[float]] = {name: [] for runs in groups for name in runs}
    rounds = -(-_ROUNDS // _SEGMENTS)
    block = -(-n // (rounds * _SEGMENTS))
    for _ in range(_SEGMENTS):
        for runs in groups:
            time.sleep(_SWITCH_PAUSE_S)
            names = list(runs)
            for r in range(rounds):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    todo = min(block, n - len(times[name]))
                    for i in range(_BLOCK_WARMUP + todo if todo > 0 else 0):
                        t0 = time.perf_counter()
                        runs[name](x)
                        if i >= _BLOCK_WARMUP:
                            times[name].append(time.perf_counter() - t0)
    return times


def _speed_note(s1: float, s32: float) -> str:
    def one(s: float, where: str) -> str:
        if s >= _SPEED_MARGIN:
            return f"{s:.2f}x faster than fp32 at {where}"
        if s <= 1 / _SPEED_MARGIN:
            return f"SLOWER than fp32 at {where} ({s:.2f}x)"
        return f"no faster than fp32 at {where} ({s:.2f}x, within 5%)"

    return f"{one(s1, 'batch 1')}; {one(s32, 'batch 32')}"


def _onnx_parity(variants: dict[str, dict[str, Any]], tol: float) -> dict[str, Any]:
    """The ONNX conversion is held to the export's parity bound against the fp32 predictor."""
    v = variants.get("onnx-fp32")
    if v is None:
        return {}
    bound = tol * v["max_abs_logit_fp32"]
    if not v["max_abs_diff"] <= bound:
        raise ParityError(f"parity gate: onnx-fp32 vs Paddle fp32 max|diff| {v['max_abs_diff']:.3g} > export.parity_tol "
                        f"{tol:g} x max|logit| {v['max_abs_logit_fp32']:.3g} = {bound:.3g} on the test split; "
                        "nothing written")
    return {"onnx_parity_max_abs_diff": v["max_abs_diff"], "onnx_parity_tol": tol}


# ------------------------------------------------------------------ report and gate


def _int8_names(variants: dict[str, dict[str, Any]]) -> list[str]:
    """The int8 variants that were built and measured (an unsupported route has no numbers)."""
    return [n for n, v in variants.items() if v["precision"] == "int8" and v["supported"]]


def _metrics(variants: dict[str, dict[str, Any]], parity: dict[str, Any], ccfg: CompressConfig,
             calib: np.ndarray, n_test: int, threads: int, io: dict[str, Any], cap: dict[str, Any]) -> dict[str, Any]:
    base = variants["fp32"]
    int8 = _int8_names(variants)
    ok = [n for n in int8 if variants[n]["shippable"]]  # best_int8 is None when none is within budget
    best = max(ok, key=lambda n: (variants[n]["correct"], -variants[n]["latency_ms_p50_bs1"])) if ok else None
    drop = (base["correct"] - variants[best]["correct"]) / n_test * 100 if best else None
    live = [n for n, v in variants.items() if v["supported"]]
    method, extra = _ORT_CALIB[ccfg.algo]
    calibration = {"split": "train", "batches": int(calib.shape[0]), "batch_size": int(calib.shape[1]),
                   "seed": ccfg.calib_seed, "paddleslim_algo": ccfg.algo, "paddleslim_onnx_format": True,
                   "paddleslim_op_types": list(_QUANT_OPS), "onnxruntime_method": method,
                   "onnxruntime_options": extra, "onnxruntime_op_types": _ort_op_types(io) or "default",
                   "dtype": calib.dtype.name, "inputs_sha256": hashlib.sha256(calib.tobytes()).hexdigest()}
    if "vocab" in io:  # the tokenizer the calibration (and test) texts were encoded with: the export's
        calibration.update(vocab_file=io["pre"]["vocab_file"], vocab_sha256=io["vocab_sha256"],
                           max_len=int(io["pre"]["max_len"]))
    return {
        "fp32_accuracy": base["accuracy"],
        "best_int8": best,
        "best_int8_accuracy": variants[best]["accuracy"] if best else None,
        "int8_drop_points": drop,
        "max_drop": ccfg.max_drop,
        "min_agreement": ccfg.min_agreement,
        "agreement_samples": base["agreement_samples"],
        "int8_not_shippable": {n: variants[n]["status"] for n in int8 if not variants[n]["shippable"]},
        "cpu": cap,
        "onnxruntime_reduce_range": ccfg.reduce_range,
        "int8_faster_than_fp32": any(variants[n]["faster_than_fp32"] for n in int8),
        "int8_vs_own_fp32": (own := _int8_vs_own_fp32(variants)),
        "int8_pays": any(o["faster"] for o in own.values()),
        "int8_unsupported": {n: v["reason"] for n, v in variants.items() if v["precision"] == "int8"
                             and not v["supported"]},
        "fastest_bs1": min(live, key=lambda n: variants[n]["latency_ms_p50_bs1"]),
        "fastest_bs32": max(live, key=lambda n: variants[n]["items_per_s_bs32"]),
        "test_samples": n_test,
        "threads": threads,
        **parity,
        "calibration": calibration,
        "timing": {"latency_runs": ccfg.latency_runs, "throughput_runs": ccfg.throughput_runs, "warmup": _WARMUP,
                   "interleaved": True, "faster_means": f">= {_SPEED_MARGIN:.2f}x fp32 at batch 1 p50 and batch 32"},
        "variants": {n: {k: val for k, val in v.items() if k not in ("correct", "max_abs_logit_fp32")}
                     for n, v in variants.items()},
    }


def _int8_vs_own_fp32(variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each int8 variant against fp32 on its own engine (int8-onnx vs onnx-fp32): whether int8 itself
    pays, apart from the engine's speed (onnxruntime fp32 alone may beat Paddle fp32)."""
    out = {}
    for name, own in (("int8-paddle", "fp32"), ("int8-onnx", "onnx-fp32"), ("openvino-int8", "openvino-fp32")):
        v, o = variants.get(name), variants.get(own)
        if not (v and o and v["supported"] and o["supported"]):
            continue
        s1 = o["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
        s32 = v["items_per_s_bs32"] / o["items_per_s_bs32"]
        out[name] = {"own_fp32": own, "speedup_bs1": s1, "speedup_bs32": s32,
                     "faster": bool(min(s1, s32) >= _SPEED_MARGIN)}
    return out


def _gate(metrics: dict[str, Any], variants: dict[str, dict[str, Any]], ccfg: CompressConfig, n: int) -> None:
    drop = metrics["int8_drop_points"]
    if not _int8_names(variants):
        raise PipeError("int8: no int8 variant could be built (" + "; ".join(
            f"{k}: {why}" for k, why in metrics["int8_unsupported"].items()) + ")")
    if drop is None:
        raise GateError("int8 gate: no int8 variant within budget on this CPU (" + "; ".join(
            f"{k}: {why}" for k, why in metrics["int8_not_shippable"].items()) + f"); CPU: {cpu.summary()}; "
            "nothing written")
    if drop > ccfg.max_drop:
        best = metrics["best_int8"]
        others = ", ".join(f"{k} {variants[k]['accuracy']:.2%}" for k in _int8_names(variants) if k != best)
        raise GateError(f"int8 gate: best int8 variant {best} {variants[best]['accuracy']:.2%} vs fp32 "
                        f"{variants['fp32']['accuracy']:.2%} on {n} test samples: drop {drop:.2f} points > "
                        f"max_drop {ccfg.max_drop:g}" + (f" ({others})" if others else "") + "; nothing written")


def _print_table(variants: dict[str, dict[str, Any]], n: int, io: dict[str, Any], cap: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    if not console.is_terminal:  # logs and CI: no 80-column squeeze
        console = Console(soft_wrap=True, width=130)
    base = variants["fp32"]
    caption = "; ".join(f"{', '.join(k for k, v in variants.items() if v['engine'] == e)}: {label}"
                        for e, label in engines_mod.LABELS.items() if any(v["engine"] == e for v in variants.values()))
    what = (f"{n} test samples, texts as int64 ids padded to {io['pre']['max_len']}" if "vocab" in io
            else f"{n} test samples")
    agreed = variants["fp32"].get("agreement_samples")
    t = Table(title=f"fp32 vs each variant: {what} (agree, max|diff|: {agreed} samples of all splits), timing "
                    "interleaved", caption=caption)
    for col in ("variant", "acc", "drop pts", "agree", "max|diff|", "KB", "p50 ms bs1", "p99 ms bs1",
                "items/s bs32", "vs fp32 bs1 / bs32", "speed"):
        t.add_column(col, justify="left" if col in ("variant", "speed") else "right", no_wrap=col == "variant")
    for name, v in variants.items():
        size = "-" if v["size_bytes"] is None else f"{v['size_bytes'] / 1024:.0f}"
        if not v["supported"]:
            t.add_row(name, "-", "-", "-", "-", size, "-", "-", "-", "-", "[red]unsupported[/red] (below)")
            continue
        t.add_row(name, f"{v['accuracy']:.2%}", f"{(base['correct'] - v['correct']) / n * 100:.2f}",
                  f"{v['top1_agreement']:.3f}", f"{v['max_abs_diff']:.3g}", size, f"{v['latency_ms_p50_bs1']:.3f}",
                  f"{v['latency_ms_p99_bs1']:.3f}", f"{v['items_per_s_bs32']:.0f}",
                  f"{v['speedup_bs1']:.2f}x / {v['speedup_bs32']:.2f}x",
                  _verdict(name, v) if v["status"] == "ok" else f"[red]{v['status'].split(':')[0]}[/red] (below)")
    console.print(f"CPU: {cpu.summary(cap)}", markup=False)
    console.print(t)
    for name, v in variants.items():
        if v["supported"] and v["status"] != "ok":
            console.print(f"{name}: {v['status']}", markup=False)
        note = (v.get("engine_info") or {}).get("note")
        if note:
            console.print(f"{name}: {note}", markup=False)
    for name, v in variants.items():
        if name != "fp32" and v["note"]:
            console.print(f"{name}: {'unsupported: ' if not v['supported'] else ''}{v['note']}", markup=False)
    int8 = _int8_names(variants)
    if int8 and not any(variants[k]["faster_than_fp32"] for k in int8):
        console.print(f"[bold yellow]int8 is not faster than fp32 here[/bold yellow] (faster = at least "
                      f"{_SPEED_MARGIN:.2f}x at both batch 1 and batch 32): {', '.join(int8)}")
    own = _int8_vs_own_fp32(variants)
    if own and not any(o["faster"] for o in own.values()):
        console.print("[bold yellow]int8 does not pay on this model[/bold yellow]: no int8 variant is faster than fp32 "
                      "on its own engine (" + "; ".join(f"{k} vs {o['own_fp32']}: {o['speedup_bs1']:.2f}x at batch 1, "
                                                        f"{o['speedup_bs32']:.2f}x at batch 32" for k, o in own.items())
                      + ")")


def _verdict(name: str, v: dict[str, Any]) -> str:
    if name == "fp32":
        return "baseline"
    s1, s32 = v["speedup_bs1"] >= _SPEED_MARGIN, v["speedup_bs32"] >= _SPEED_MARGIN
    if s1 and s32:
        return "faster"
    if s1 or s32:
        return f"faster at bs{1 if s1 else 32} only"
    slower = max(v["speedup_bs1"], v["speedup_bs32"]) <= 1 / _SPEED_MARGIN
    return "[red]SLOWER[/red]" if slower else "[yellow]not faster[/yellow]"


# ------------------------------------------------------------------ children


def _read_verified(files: dict[str, dict[str, str]]) -> None:
    """The files may have changed since the parent verified them."""
    for name, f in files.items():
        if artifacts.sha256_file(Path(f["path"])) != f["sha256"]:
            raise InputError(f"{f['path']}: sha256 mismatch")


def _paddleslim_main(spec: dict[str, Any]) -> int:
    """Child (FLAGS_enable_pir_api=0): quant_post_static on the legacy program."""
    _read_verified(spec["files"])
    shape = spec["calib_shape"]
    calib = np.frombuffer(sys.stdin.buffer.read(), dtype=np.dtype(spec["calib_dtype"])).reshape(shape)
    paddle = runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    paddle.enable_static()
    from paddleslim.quant import quant_post_static

    def loader() -> Iterator[dict[str, np.ndarray]]:
        for batch in calib:
            yield {spec["input"]: batch}

    quant_post_static(
        executor=paddle.static.Executor(paddle.CPUPlace()), model_dir=spec["model_dir"],
        quantize_model_path=spec["dest"], model_filename=Path(spec["files"]["model.pdmodel"]["path"]).name,
        params_filename=Path(spec["files"]["model.pdiparams"]["path"]).name, data_loader=loader,
        batch_size=shape[1], batch_nums=shape[0], algo=spec["algo"], round_type="round",
        # onnx_format=True stores the weights as int8 (digits: 81 KB of params vs 304 KB with False) and
        # was closer to fp32 (max|diff| 0.89 vs 2.93); oneDNN int8 runs both.
        quantizable_op_type=list(_QUANT_OPS), onnx_format=True)
    return 0


def _onnx_main(spec: dict[str, Any]) -> int:
    """Child: paddle2onnx of the PIR program, without an optimizer pass (polygraphy, paddle2onnx's default,
    sets POLYGRAPHY_AUTOINSTALL_DEPS=1, i.e. may pip-install at run time; onnxruntime optimizes anyway)."""
    _read_verified(spec["files"])
    runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import paddle2onnx

    paddle2onnx.export(spec["files"]["model.json"]["path"], spec["files"]["model.pdiparams"]["path"], spec["dest"],
                       opset_version=13, enable_onnx_checker=True, optimize_tool="none")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--paddleslim", "--onnx"):
        main = _paddleslim_main if sys.argv[1] == "--paddleslim" else _onnx_main
        try:
            sys.exit(main(json.loads(sys.argv[2])))
        except InputError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
    print("usage: python -m stages.compress --paddleslim|--onnx SPEC_JSON (internal; use `pipe compress`)",
          file=sys.stderr)
    sys.exit(2)
