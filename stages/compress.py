"""pipe compress: int8 post-training quantization of an export, measured and gated, as `<run>/compress/`.

    pipe compress runs/exp1/export --int8
    pipe compress runs/exp1/export --int8 --backend paddle --algo KL --calib-batches 20 --max-drop 0.5
    pipe compress runs/sentiment/export --distill --student text_cnn --int8

Reads a verified `export/` artifact (the PIR program for fp32/bf16, the legacy program for PaddleSlim)
and the data it was trained on. Every input and output goes by name (the export's interface,
`pipeline/iospec.py`): any number of each, no single-tensor case. Writes `compress/`:
- `int8-paddle/model.pdmodel` + `model.pdiparams` (`--backend paddle|both`): PaddleSlim
  `quant_post_static` on the legacy program, in a child process with FLAGS_enable_pir_api=0 (PaddleSlim
  2.6 cannot read PIR), its `data_loader` yielding `{legacy input name: batch}` (a list or
  `batch_generator=` fail: facts note section 14), run by Paddle Inference with oneDNN int8 kernels;
- `onnx-fp32/model.onnx` and `int8-onnx/model.onnx` (`--backend onnxruntime|both`): paddle2onnx of the
  PIR program (in a child: it can abort the process), then onnxruntime `quant_pre_process` +
  `quantize_static` (QDQ, unsigned QUInt8 activations, per-channel QInt8 weights, 7-bit with
  `compress.reduce_range` so the file computes the same on CPUs without VNNI; signed activations were
  slower than fp32 on this kind of CPU), calibrated by a reader of dicts keyed by that ONNX's own input
  names (ONNX made from the legacy program lists them reversed);
- nothing for OpenVINO (`compress.openvino`): `openvino-fp32` runs the export's legacy program (it does
  not read PIR; the fp32 ONNX when there is no legacy program), `openvino-int8` the int8-onnx file;
- `manifest.json`: `metrics.variants` maps fp32, bf16, int8-paddle, onnx-fp32, int8-onnx, openvino-fp32,
  openvino-int8 to their format, engine, files (relative to this dir, or with `source: "export"` to the
  export's; fp32/bf16 have `files: []`: they run the export's `model.json`), the engine's own input and
  output names (`inputs`, `outputs`), test accuracy, top-1 agreement and max|diff| of the logits output
  against fp32 over up to 4,096 samples of all splits, `fidelity` (every output by public name: float
  outputs `sqnr_db` = 10 log10(sum ref^2 / sum (ref - got)^2), null when identical, and `max_abs_diff`;
  other outputs `equal`, the fraction of equal elements), size, p50/p99 latency at batch 1, items/s at
  batch 32, the engine as it describes itself, and its one verdict, `status` (`pipeline/fidelity.py`
  `verdict`; `shippable` is status `ok`, `drop_points` the drop it judged): `ok`, `below budget` (agreement <
  `compress.min_agreement`, or a float output other than the logits below `compress.min_sqnr_db`, named),
  `unreliable on this CPU` (Paddle int8 without VNNI that is not both within budget and faster), `over
  budget` (test accuracy more than `compress.max_drop` points below fp32's) or `unsupported`. The table,
  `pipe package` and the report read this status; none judges a variant again. `metrics.cpu` is this CPU's int8 capability (`pipeline/cpu.py`), which decides the int8
  settings.

Both int8 routes calibrate on the same `calib_batches` x `calib_batch_size` samples drawn (seeded)
from the TRAIN split, every input of a sample together: by default up to 10 whole batches of 32, all of a
smaller split (recorded in `metrics.calibration`: batches, batch_size, samples; under 100 samples a warning
and `thin: true`); an explicit `--calib-batches` the split cannot fill is an error. Integer inputs (token ids, masks) are never
quantized: both routes keep them integer, and a model that has any is quantized on its matmul/linear
ops only (`pipeline/quantize.py`, `ort_op_types`: onnxruntime's default op types wreck attention models).

Text exports (every input int64 `[-1, -1]`, `preprocess.yaml` with `vocab_file`): every input, calibration
and test alike, is made from the split's raw text encoded with the export's own `vocab.json`
(`data.encode_texts`, padded to the export's `max_len`, then `data.text_inputs`); the vocabulary
`data.source` builds now must equal it, else the data changed (exit 2). The embedding lookups stay fp32.
A model Paddle could not write as a legacy program (nn.GRU, and nn.MultiHeadAttention's
activation x activation matmul in Paddle 3.3.1: `export` records `legacy.available: false` and why)
has no PaddleSlim route: `int8-paddle` is recorded as unsupported with the export's reason, and
`--backend paddle` alone is refused (exit 2). Timing batches are the test split's first samples, every
input by name.

The quantizers (and their child processes) are `pipeline/quantize.py`; each variant loaded on its engine, and
the metrics document, `pipeline/compress_variants.py`; each variant's fidelity and status against fp32, and the
table printed, `pipeline/fidelity.py`.

Timing interleaves the variants run by run after a warm-up, so machine noise hits them alike. Gates
(nothing written): some int8 variant must be within budget (status `ok`), and the best of those may lose
at most `max_drop` points of test accuracy against fp32 (exit 4); the ONNX conversion must match fp32
within the export's parity tolerance on every float output (exit 5). Whether int8
is faster is measured and said plainly, not assumed: on a tiny model it is not. No pickles are
written (no `.pdiparams.info`, `.pkl`, `.npy`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from pipeline import artifacts, compress_variants, config as config_mod, cpu, data as data_mod, fidelity, iospec, \
    quantize, runtime, tasks
from pipeline import engines as engines_mod
from pipeline.timing import interleaved
from pipeline.config import CompressConfig, RunConfig
from pipeline.errors import InputError, ParityError, PipeError

_EVAL_BATCH = 256
_FIDELITY_MAX = 4096  # samples of all splits on which agreement and max|diff| are measured
_FIDELITY_SEED = 0
_BS_THROUGHPUT = 32
_BACKEND_VARIANTS = {"paddle": ("int8-paddle",), "onnxruntime": ("onnx-fp32", "int8-onnx")}
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
    if tasks.owns_data(_task_of(src)):  # its own data and batches (ocr_rec): measured on them, not on arrays
        from pipeline import compress_owned

        return compress_owned.run(cfg, src, out_dir)
    if ccfg.backend == "openvino":
        raise InputError("--backend openvino: OpenVINO's own int8 route (NNCF with a per-layer search) is for ocr_rec "
                         "models so far; here openvino-int8 runs onnxruntime's int8 file: use --backend onnxruntime or both")
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
    calib = _calibration_batches(ds, prep, ccfg)  # {input name: (batches, batch_size, ...)}
    y_test = np.asarray(ds.test.y[ds.test.idx])
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)  # threads and logging on our terms before any engine loads
    doc = dataclasses.replace(exp_cfg, compress=ccfg).to_dict()
    with artifacts.write_stage(out_dir, "compress", doc, src) as w:
        keep = bool(getattr(io["task"], "int8_fp32_outputs", False))
        fp32_layers: dict[str, list[str]] = {}
        if "paddle" in backends and "int8-paddle" not in skipped:
            fp32_layers["int8-paddle"] = quantize.int8_paddle(src, io, quantize.split_batches(calib), ccfg,
                                                              w.dir / "int8-paddle", threads, keep)
        if "onnxruntime" in backends:
            quantize.to_onnx(src, w.dir / "onnx-fp32", threads)
            fp32_layers["int8-onnx"] = quantize.int8_onnx(w.dir / "onnx-fp32/model.onnx", io, quantize.split_batches(calib),
                                                          ccfg, w.dir / "int8-onnx", threads, keep)
        engines = compress_variants.load(src, w.dir, io, backends, skipped, threads)  # may add to `skipped`
        if ccfg.openvino:
            engines.update(compress_variants.openvino(src, w.dir, io, engines, threads))
        _check_file_set(w.dir, backends, skipped)
        variants = _measure(engines, src, w.dir, ds, prep, ccfg, io)
        parity = _onnx_parity(variants, exp_cfg.export.parity_tol)
        cap = cpu.capability()
        fidelity.print_table(variants, len(y_test), io, cap)
        w.metrics = compress_variants.metrics(variants, parity, ccfg, calib, len(y_test), threads, io, cap)
        if keep:  # which layers the task's rule kept in fp32, per int8 file (OpenVINO runs int8-onnx's)
            w.metrics["calibration"]["fp32_layers"] = {"rule": quantize.KEEP_OUTPUTS_RULE, **fp32_layers}
        if distilled is not None:
            w.metrics["distill"] = distilled
        if ccfg.int8:
            fidelity.gate(w.metrics, variants, ccfg, len(y_test))
        w.interface = src.manifest["interface"]
        w.extra = {"format": "variants", "tools": _tool_versions()}
    return out_dir


def _task_of(src: artifacts.Artifact) -> Any:
    try:
        iface = src.manifest["interface"]
        return tasks.from_interface(iface, iospec.IO.from_interface(iface))[0]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(f"{src.path / artifacts.MANIFEST}: not an export this pipe can compress (no interface)") from None
    except InputError as e:
        raise InputError(f"{src.path / artifacts.MANIFEST}: {e}") from None


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
    """A built-in student must take the teacher's kind of input, and a built-in image model takes one input
    (before anything is trained; `pipe train` feeds a factory student every named input)."""
    from pipeline.nets import models

    iface = teacher.manifest.get("interface", {})
    pre = iface.get("preprocessing", {})
    text = isinstance(pre, dict) and pre.get("kind") == "text"
    if student in models.BUILTIN and (student in models.TEXT) != text:
        fit = [m for m in models.BUILTIN if (m in models.TEXT) == text]
        raise InputError(f"--student {student}: not a model for {'text' if text else 'image'} data like the "
                         f"teacher's {teacher.path} (built in: {', '.join(fit)}, or package.module:factory)")
    names = [t.get("alias") or t.get("name") for t in iface.get("inputs", []) if isinstance(t, dict)]
    if student in models.BUILTIN and not text and len(names) > 1:
        raise InputError(f"--student {student}: a built-in image model takes one input, the teacher's export "
                         f"takes {len(names)} ({', '.join(map(str, names))}); use a package.module:factory student")


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
    """The export's io (`desc`: every input and output by name, which is the logits; pipeline/iospec.py),
    labels and preprocessing, checked before anything is loaded. Text: every input int64 ids [-1, -1] and
    the export's vocabulary (`vocab`, token -> id, read from its verified `vocab.json`). `legacy_inputs`:
    the legacy program's name of each input, in the interface's order (PaddleSlim feeds them);
    `legacy_model` is None when export could not write that program (`legacy_reason` says why)."""
    where = src.path / artifacts.MANIFEST
    m = src.manifest
    try:
        iface, legacy = m["interface"], m["legacy"]
        io = {"labels": [str(s) for s in iface["labels"]], "pre": dict(iface["preprocessing"]),
              "legacy_inputs": None, "legacy_model": None, "legacy_params": None, "legacy_reason": None}
        if legacy.get("available", True):
            io.update(legacy_inputs=[str(n) for n in legacy["inputs"]], legacy_model=str(legacy["model"]),
                      legacy_params=str(legacy["params"]))
        else:
            io["legacy_reason"] = str(legacy.get("reason") or "no reason recorded")
        kind = io["pre"]["kind"]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(f"{where}: not an export this pipe can compress (needs an interface with labels and "
                         "preprocessing, and a legacy entry)") from None
    try:
        desc = iospec.IO.from_interface(iface)
        io["task"], io["info"] = tasks.from_interface(iface, desc)
        data_mod.input_preprocessing(io["pre"], [t.public for t in desc.inputs])  # describes these inputs
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    logits = desc.logits() if io["info"].logits else None
    if logits is not None and (np.dtype(logits.dtype).kind != "f" or len(logits.shape) != 2):
        raise InputError(f"{where}: the logits output {logits.public!r} must be float (N, classes), got "
                         f"{logits.dtype} {list(logits.shape)}")
    if io["legacy_inputs"] is not None and len(io["legacy_inputs"]) != len(desc.inputs):
        raise InputError(f"{where}: the legacy program lists {len(io['legacy_inputs'])} inputs, the interface "
                         f"{len(desc.inputs)}")
    io["desc"] = desc
    for rel in ("model.json", "model.pdiparams", io["legacy_model"], io["legacy_params"]):
        if rel is not None:
            src.file(rel)  # listed, and verified above
    if kind == "text":
        bad = [t for t in desc.inputs if list(t.shape) != [-1, -1] or t.dtype != "int64"]
        if bad:
            raise InputError(f"{where}: a text input must be int64 ids of shape [-1, -1], got {bad[0].public!r} "
                             f"{bad[0].dtype} {list(bad[0].shape)}")
        io["vocab"] = _read_vocab(src, io["pre"])
        io["vocab_sha256"] = m["files"][io["pre"]["vocab_file"]]["sha256"]
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
    now = [(t.name, t.dtype, list(t.shape[1:])) for t in ds.inputs()]
    was = [(t.public, t.dtype, list(t.shape[1:])) for t in io["desc"].inputs]
    if now != was or list(ds.labels) != io["labels"]:
        def say(ts: list[tuple[str, str, list[int]]]) -> str:
            return ", ".join(f"{n} {d} {s}" for n, d, s in ts)
        raise InputError(f"{where}: exported for inputs {say(was)} with {len(io['labels'])} labels, but "
                         f"data.source {source!r} now gives {say(now)} with {len(ds.labels)}; the data changed")
    n_test = src.manifest["metrics"].get("test_samples")
    if n_test is not None and n_test != len(ds.test):
        raise InputError(f"{where}: the test split had {n_test} samples, data.source {source!r} now gives "
                         f"{len(ds.test)}; the data changed")
    if "vocab" in io:
        vocab_now = ds.preprocessing.get("vocab")
        if vocab_now != list(io["vocab"]) or ds.preprocessing.get("max_len") != io["pre"]["max_len"]:
            raise InputError(f"{src.file(io['pre']['vocab_file'])}: data.source {source!r} now builds another "
                             "vocabulary or max_len than the export's; the data changed")
        if len(ds.texts) != iospec.num_rows(ds.train.inputs):
            raise InputError(f"data.source {source!r}: a text dataset without its texts; cannot encode it with "
                             f"{src.file(io['pre']['vocab_file'])}")


Feeds = dict[str, np.ndarray]  # input (or output) name -> batch
Prep = Callable[[data_mod.Split, np.ndarray], Feeds]


def _preparer(ds: data_mod.Dataset, io: dict[str, Any]) -> Prep:
    """(split, positions in the split) -> the model's inputs, keyed by the interface's names and checked
    against it (`iospec.IO.feeds`). `Split.feeds` with the export's preprocessing; text: the raw texts
    encoded with the export's vocabulary at its max_len (not the ids `data.load` stored, which come from
    the vocabulary rebuilt now) and made into the model's inputs by the export's rule (`data.text_inputs`),
    so what is calibrated and measured is exactly what a client of this export would send."""
    desc, pre = io["desc"], io["pre"]
    if "vocab" not in io:
        return lambda split, rows: desc.feeds(split.feeds(rows, pre), "compress data")
    vocab, max_len = io["vocab"], int(pre["max_len"])
    return lambda split, rows: desc.feeds(data_mod.text_inputs(
        data_mod.encode_texts([ds.texts[j] for j in split.idx[rows]], vocab, max_len), pre), "compress data")


def _calibration_batches(ds: data_mod.Dataset, prep: Prep, ccfg: CompressConfig) -> Feeds:
    """{input: (batches, batch_size, ...)}: the train rows `quantize.calibration_rows` draws, in whole batches."""
    rows = quantize.calibration_rows(len(ds.train), ccfg)
    size = ccfg.calib_batch_size if ccfg.calib_batches else min(ccfg.calib_batch_size, len(ds.train))
    batches = len(rows) // size
    return {k: np.ascontiguousarray(a.reshape(batches, size, *a.shape[1:])) for k, a in prep(ds.train, rows).items()}


def _batches(split: data_mod.Split, prep: Prep) -> Iterator[Feeds]:
    for i in range(0, len(split), _EVAL_BATCH):
        yield prep(split, np.arange(i, min(i + _EVAL_BATCH, len(split))))


def _check_file_set(d: Path, backends: tuple[str, ...], skipped: dict[str, str]) -> None:
    """Exactly the expected files: no `.pdiparams.info` (a pickle), no calibration caches."""
    want = {f for b in backends for v in _BACKEND_VARIANTS[b] if v not in skipped
            for f in compress_variants.VARIANT_FILES[v]}
    found = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    if found != want:
        raise PipeError(f"compress wrote an unexpected file set (extra {sorted(found - want)}, "
                        f"missing {sorted(want - found)})")


# ------------------------------------------------------------------ engines and measurement


def _measure(engines: dict[str, dict[str, Any]], src: artifacts.Artifact, cdir: Path, ds: data_mod.Dataset,
             prep: Prep, ccfg: CompressConfig, io: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Test accuracy on the test split (the logits output); top-1 agreement, max|diff| and each output's
    fidelity vs fp32 on up to `_FIDELITY_MAX` samples of all splits (the test split alone is a few hundred
    samples: one sample is 0.4 point of digits); then interleaved timing, then each variant's status."""
    test, task, info = ds.test, io["task"], io["info"]
    logits, main = info.logits, io["desc"].main().public
    live = {n: e for n, e in engines.items() if e["run"] is not None}
    y = np.asarray(test.y[test.idx])
    # The test split's outputs, for the task's metrics (batch by batch: the split may be a large memmap)
    scored = {n: task.metrics_of(tasks.concat([e["run"](f) for f in _batches(test, prep)]), y, info)
              for n, e in live.items()}
    test_top = {n: _top(e["run"], test, prep, logits) for n, e in live.items()} if logits else {}
    chunks = list(fidelity_batches(ds, prep))
    ref = [live["fp32"]["run"](f) for f in chunks]
    fid = {n: fidelity.measure(iter(ref) if n == "fp32" else (e["run"](f) for f in chunks), ref, logits or None, f"{n}")
           for n, e in live.items()}
    head = next(_batches(test, prep))  # text: padded to the export's max_len, as stored for training
    x1 = {k: np.ascontiguousarray(a[:1]) for k, a in head.items()}
    rows = np.arange(_BS_THROUGHPUT) % iospec.num_rows(head)  # repeats if the split is small
    x32 = {k: np.ascontiguousarray(a[rows]) for k, a in head.items()}
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
                         "fidelity": None, "latency_ms_p50_bs1": None,
                         "latency_ms_p99_bs1": None, "items_per_s_batch": None, "metric": io["task"].monitor,
                         "metrics": None}
            continue
        f = fid[name]
        agree = float((f["top"] == fid["fp32"]["top"]).mean()) if logits else None
        out[name] = {**v, "supported": True,
                     "metric": task.monitor, "metrics": scored[name],
                     "accuracy": scored[name][task.monitor],  # the task's monitored metric (classification: accuracy)
                     "top1_agreement": agree,
                     "max_abs_diff": f["outputs"][main]["max_abs_diff"],
                     "max_abs_logit_fp32": f["absmax"][main], "fp32_absmax": f["absmax"],
                     "agreement_samples": int(f["samples"]),
                     "test_top1_agreement": float((test_top[name] == test_top["fp32"]).mean()) if logits else None,
                     "fidelity": f["outputs"], **fidelity.timing_fields(lat[name], thr[name], _BS_THROUGHPUT)}
    base = out["fp32"]
    for name, v in out.items():
        if not v["supported"]:
            v.update(speedup_bs1=None, speedup_batch=None, faster_than_fp32=None, note=v["reason"])
            continue
        v.update(fidelity.speed_fields(name, v, base))
    fidelity.judge(out, ccfg, logits or None, io["task"].maximize)
    if "int8-onnx" in out and "onnx-fp32" in out and out["int8-onnx"]["supported"]:  # int8 on its own engine
        own, v = out["onnx-fp32"], out["int8-onnx"]
        s1 = own["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
        s32 = v["items_per_s_batch"] / own["items_per_s_batch"]
        v["note"] += f" (vs onnx-fp32: {s1:.2f}x at batch 1, {s32:.2f}x at batch 32)"
    return out




def _top(run: Callable[[Feeds], Feeds], split: data_mod.Split, prep: Prep, logits: str) -> np.ndarray:
    """Classification: each test sample's top-1 class under one variant."""
    return np.concatenate([run(f)[logits].argmax(axis=1) for f in _batches(split, prep)])


def fidelity_batches(ds: data_mod.Dataset, prep: Prep) -> Iterator[Feeds]:
    """Up to `_FIDELITY_MAX` samples of train, val and test (a seeded draw when there are more), in
    `_EVAL_BATCH` batches: where int8 and fp32 are compared beyond the test split."""
    for sp, rows in data_mod.draw(ds, _FIDELITY_MAX, _FIDELITY_SEED):
        for i in range(0, len(rows), _EVAL_BATCH):
            yield prep(sp, rows[i:i + _EVAL_BATCH])


def _onnx_parity(variants: dict[str, dict[str, Any]], tol: float) -> dict[str, Any]:
    """The ONNX conversion is held to the export's parity bound against the fp32 predictor, on every float
    output (tol x that output's max|value| in fp32)."""
    v = variants.get("onnx-fp32")
    if v is None:
        return {}
    for out, f in v["fidelity"].items():
        bound = tol * v["fp32_absmax"][out]
        if "max_abs_diff" in f and not f["max_abs_diff"] <= bound:
            raise ParityError(f"parity gate: onnx-fp32 vs Paddle fp32 output {out!r} max|diff| {f['max_abs_diff']:.3g} "
                              f"> export.parity_tol {tol:g} x its max|value| {v['fp32_absmax'][out]:.3g} = {bound:.3g} "
                              f"on {v['agreement_samples']} samples of all splits; nothing written")
    return {"onnx_parity_max_abs_diff": v["max_abs_diff"], "onnx_parity_tol": tol}
