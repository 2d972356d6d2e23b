"""`pipe compress` of a model whose task owns its data and batching (`load_data`: ocr_rec, a text line of any
width; ocr_det, a page of any size), called by stages/compress.py.

    pipe compress <ocr_det export> --int8 --backend openvino --out OUT
 It writes the artifact every compress writes (`metrics.variants`, read
by `pipe package` and pipeline/choose.py), measured on the task's own batches (width buckets), not on
fixed-shape arrays:

- `fp32`: Paddle Inference on the export's PIR program; `bf16` the same with oneDNN bf16, where the CPU has it;
- `openvino-fp32`: OpenVINO on the export's legacy program (else its model.onnx); `onnx-fp32`: onnxruntime on
  the export's model.onnx (`pipe import` converted and parity-checked it);
- `openvino-int8` (`compress.openvino`): `openvino-int8/model.xml` + `model.bin`, NNCF's post-training int8
  with a per-layer sensitivity search (`quantize.int8_openvino`): every quantizable layer in int8 first,
  then the layers whose quantization costs the most on the val split go back to fp32, the costliest first,
  until the task's metric on the val split (ocr_rec: line accuracy; ocr_det: hmean) is within `compress.max_drop`
  points of fp32's. NNCF's preset is the task's `nncf_model_type` (ocr_rec "transformer"; absent or None: NNCF's
  default, ocr_det's). Which layers stayed fp32, and what int8 everywhere scored, is in `metrics.openvino_search`; the
  test split judges the result afterwards, as every variant;
- `int8-onnx` (`--backend onnxruntime|both`): onnxruntime static QDQ of the export's model.onnx;
- `int8-paddle` (`--backend paddle|both`): PaddleSlim on the legacy program, run by oneDNN int8.
  These two quantize every layer (they have no search): they are measured and judged like the others.

Calibration: `calib_batches` x `calib_batch_size` train items (default all of up to 10 x 32, at most the task's
`calib_max`: ocr_det 40 pages, the count its int8 was measured at), a seeded draw,
in the task's batches (ocr_rec: sorted by width, bucketed as served; ocr_det: a page a batch, at its own
shape), so every route calibrates at the shapes it serves. Data without a train split (a label file, which is
a test split, or a folder of val/test files) calibrates on val, else test, and one without val searches on test
(`_stand_ins`: one line each, `metrics.splits`). Messages count items in the task's `unit` ("lines"
if it has none; ocr_det "pages"); manifest keys keep ocr_rec's word (`calibration.lines`, `val_lines`).

Each variant is judged on the test split by the task's metric (ocr_rec: line accuracy; ocr_det: hmean), against
fp32 by the agreement of its answers with fp32's over the val and test items (the task's `reference_agreement`:
ocr_rec's is per character, 1 - the normalised edit distance between the two texts, compared as the metric
compares; ocr_det's the hmean of one run's boxes against the other's; `char_agreement`, below
compress.min_agreement: never shipped; the same on the task's reference items that `pipe package` will check the
packaged variant on, `reference_agreement`), and timed interleaved (pipeline/timing.py)
at batch 1 and at the task's `timing_batch` (ocr_rec 32; ocr_det 4, its package's max_batch: a page is ~0.25 s)
on the first test items of one shape (ocr_rec: real lines at the first served width, `_timing_batches`). The
`*_batch` fields (`items_per_s_batch`, `speedup_batch`, `fastest_batch`, every compress's names, which
pipeline/choose.py ranks on) hold items/s at the task's timing batch, which each variant's `throughput_batch`
and `metrics.timing.batch` record (manifests written before were `*_bs32`: `artifacts.verify` reads them as
`*_batch`). The gate is every compress's: an int8 variant within budget or exit 4, nothing
written.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline import artifacts, config as config_mod, cpu, engines as engines_mod, fidelity, iospec, quantize, reference, \
    runtime, tasks, timing
from pipeline.config import CompressConfig, RunConfig
from pipeline.engines import openvino as ov_engine, ort as ort_engine, paddle as paddle_engine
from pipeline.engines import unsupported_variant as _unsupported, variant as _variant
from pipeline.errors import InputError, PipeError

Feeds = dict[str, np.ndarray]
Run = Callable[[Feeds], Feeds]
_TIMING_WARMUP = 3  # a batch of 32 lines or 4 pages takes ~0.3-1 s: fewer warm-up calls than a small model's 20


# what this module calls of a task beyond import's part of the owned-data contract
_NEEDS = ("subset", "reference_set", "reference_digest", "reference_agreement", "timing_batch")


def run(cfg: RunConfig, src: artifacts.Artifact, out_dir: Path) -> Path:
    ccfg = cfg.compress
    iface = src.manifest["interface"]
    desc = iospec.IO.from_interface(iface)
    task, info = tasks.from_interface(iface, desc)
    where = src.path / artifacts.MANIFEST
    if ccfg.distill:
        raise InputError(f"--distill: {where}: a {task.name} model is not distilled by pipe compress; --int8 only")
    lacking = [k for k in _NEEDS if not hasattr(task, k)]
    if lacking:  # a task that supplies what pipe import needs and not these
        raise InputError(f"{where}: pipe compress does not take {task.name} models yet (the task has no "
                         f"{', '.join(lacking)})")
    exp_cfg = config_mod.from_dict(src.manifest["config"])
    unit = getattr(task, "unit", "lines")
    data = task.load_data(exp_cfg.data, info)
    _check_data(src, data, exp_cfg, unit)
    data, roles = _stand_ins(data, exp_cfg.data.source, unit)
    size = exp_cfg.import_.batch_size
    calib_rows = _calibration_rows(len(data.train), ccfg, task, unit)
    calib = [feeds for _, feeds in task.batches(data.train, info, ccfg.calib_batch_size, rows=calib_rows)]
    backends = {"both": ("paddle", "onnxruntime"), "openvino": ()}.get(ccfg.backend, (ccfg.backend,))
    if ccfg.backend == "openvino" and not ccfg.openvino:
        raise InputError("--backend openvino with compress.openvino false: no int8 route left to run")
    legacy = src.manifest.get("legacy") or {}
    legacy_files = [src.file(legacy["model"]), src.file(legacy["params"])] if legacy.get("available", True) \
        and "model" in legacy else None
    onnx = src.file("model.onnx") if "model.onnx" in src.manifest["files"] else None
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)
    doc = dataclasses.replace(exp_cfg, compress=ccfg).to_dict()
    with artifacts.write_stage(out_dir, "compress", doc, src) as w:
        built = _fp32_variants(src, desc, legacy_files, onnx, threads)
        ref = _evaluate(built["fp32"]["run"], data, task, info, size)
        search = None
        if ccfg.openvino:
            built["openvino-int8"], search = _openvino_int8(legacy_files or [onnx], desc, calib, data, task, info, size,
                                                            ccfg, w.dir, roles["val"])
        if "onnxruntime" in backends:
            built["int8-onnx"] = _ort_int8(onnx, desc, calib, ccfg, w.dir, threads)
        if "paddle" in backends:
            built["int8-paddle"] = _paddle_int8(src, legacy, legacy_files, desc, calib, ccfg, w.dir, threads)
        variants, shape = _measure(built, src, w.dir, data, task, info, size, ref, ccfg)
        w.metrics = _metrics(variants, ccfg, task, calib, calib_rows, len(data.train), len(data.test), threads, search,
                             size, shape, unit)
        w.metrics["calibration"]["split"] = roles["train"]
        w.metrics["splits"] = roles  # the split each role ran on (a label file has test only)
        _print(variants, task, len(data.test), w.metrics, unit)
        fidelity.gate(w.metrics, variants, ccfg, len(data.test))
        w.interface = iface
        w.extra = {"format": "variants", "tools": _versions()}
    return out_dir


# ------------------------------------------------------------------ data


def _calibration_rows(n: int, ccfg: CompressConfig, task: Any, unit: str) -> np.ndarray:
    """Which train items calibrate (`quantize.calibration_rows`): by default (compress.calib_batches 0) at most
    the task's `calib_max` if it has one (ocr_det: 40 pages), fewer than which is thin; an explicit count is the
    user's."""
    most = getattr(task, "calib_max", None)
    if not most:
        return quantize.calibration_rows(n, ccfg, unit, whole_batches=False)
    if not ccfg.calib_batches and n > most:
        ccfg = dataclasses.replace(ccfg, calib_batches=1, calib_batch_size=most)
    return quantize.calibration_rows(n, ccfg, unit, whole_batches=False, thin_below=most)


def _check_data(src: artifacts.Artifact, data: Any, exp_cfg: RunConfig, unit: str) -> None:
    """The task's data is read again from data.source: it must still be what the export was measured on."""
    was = (src.manifest.get("metrics") or {}).get("samples") or {}
    now = {s: len(getattr(data, s)) for s in ("train", "val", "test")}
    if any(was.get(s) not in (None, n) for s, n in now.items()):
        raise InputError(f"{src.path / artifacts.MANIFEST}: measured on {was}; data.source {exp_cfg.data.source!r} "
                         f"now gives {now}; the data changed")
    if not any(now.values()):
        raise InputError(f"data.source {exp_cfg.data.source!r}: no {unit} to calibrate and measure on")


def _stand_ins(data: Any, source: str, unit: str) -> tuple[Any, dict[str, str]]:
    """The data with each split it lacks stood in for by one it has, and {role: the split it is}: calibration
    (train) takes val, else test; the int8 search (val) takes test; judging (test) takes val. A label file is
    a test split only (`ocr_rec.data.label_files`), a folder may hold val and test only; each stand-in is said
    in one line."""
    have = {s for s in ("train", "val", "test") if len(getattr(data, s))}
    order = {"train": ("train", "val", "test"), "val": ("val", "test", "train"), "test": ("test", "val", "train")}
    roles = {r: next(s for s in order[r] if s in have) for r in order}
    what = {"train": "calibrating on", "val": "the int8 search and the agreement with fp32 run on",
            "test": "the variants are judged on"}
    for r, s in roles.items():
        if r != s:
            print(f"compress: no {r} split in data.source {source!r}: {what[r]} the {s} split "
                  f"({len(getattr(data, s))} {unit})")
    if all(r == s for r, s in roles.items()):
        return data, roles
    return dataclasses.replace(data, **{r: getattr(data, s) for r, s in roles.items()}), roles


def _evaluate(run: Run, data: Any, task: Any, info: tasks.Info, size: int) -> dict[str, Any]:
    """A variant over the val and test splits in the task's batches: per split the answers in order, the
    task's metrics, and each batch's digest (what agreement is judged on: ocr_rec, the CTC path)."""
    out: dict[str, Any] = {}
    for sp in ("val", "test"):
        split = getattr(data, sp)
        answers: list[Any] = [None] * len(split)
        digests = []
        for pos, feeds in task.batches(split, info, size):
            y = run(feeds)
            for p, a in zip(pos, task.decode(y, info), strict=True):
                answers[p] = a
            digests.append((len(pos), task.reference_digest(y, info)))
        out[sp] = {"answers": answers, "digests": digests, "metrics": task.score(answers, split, info)}
    return out


def _agreement(got: dict[str, Any], ref: dict[str, Any], task: Any, info: tasks.Info, splits: tuple[str, ...]
               ) -> tuple[float, int]:
    """The share of items of `splits` answered as fp32 answers them (the task's `reference_agreement`)."""
    total = same = 0.0
    for sp in splits:
        for (n, g), (_, r) in zip(got[sp]["digests"], ref[sp]["digests"], strict=True):
            same += n * task.reference_agreement(g, r, info)
            total += n
    return same / total, int(total)


# ------------------------------------------------------------------ variants


def _fp32_variants(src: artifacts.Artifact, desc: iospec.IO, legacy: list[Path] | None, onnx: Path | None,
                   threads: int) -> dict[str, dict[str, Any]]:
    pir = [src.file("model.json"), src.file("model.pdiparams")]
    out = {"fp32": _variant(paddle_engine.load(pir, threads=threads), desc, pir[0], "pir", [], "export")}
    why = runtime.bf16_unsupported()
    if not why:
        try:
            out["bf16"] = _variant(paddle_engine.load(pir, threads=threads, precision="bf16"), desc, pir[0], "pir", [],
                                   "export")
        except PipeError as e:
            why = f"oneDNN bf16 cannot run this model: {e}"
    if why:
        out["bf16"] = _unsupported(paddle_engine.NAME, "pir", "bf16", "export", why, desc)
    rel = lambda p: p.relative_to(src.path).as_posix()  # noqa: E731
    for fmt, files in (("legacy", legacy), ("onnx", [onnx] if onnx else None)):
        if files and not ov_engine.available():
            try:
                out["openvino-fp32"] = _variant(ov_engine.load(files, threads=threads), desc, files[0], fmt,
                                                [rel(f) for f in files], "export")
                break
            except PipeError as e:
                out["openvino-fp32"] = _unsupported(ov_engine.NAME, fmt, "fp32", "export", str(e), desc)
    if onnx is not None:
        out["onnx-fp32"] = _variant(ort_engine.load([onnx], threads=threads), desc, onnx, "onnx", [rel(onnx)], "export")
    return out


def _openvino_int8(files: list[Path], desc: iospec.IO, calib: list[Feeds], data: Any, task: Any, info: tasks.Info,
                   size: int, ccfg: CompressConfig, cdir: Path, split: str = "val"
                   ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """NNCF int8 with the per-layer search (`quantize.int8_openvino`), scored by the task's metric on the val
    split (the test split judges it afterwards), within compress.max_drop points of fp32's."""
    why = ov_engine.available() or _nncf_missing()
    if why:
        return _unsupported(ov_engine.NAME, "ir", "int8", "compress", why, desc), None
    val = data.val
    items = [(tuple(pos), feeds) for pos, feeds in task.batches(val, info, size)]
    outs = [t.public for t in desc.outputs]

    def score(run: Callable[[Feeds], list[np.ndarray]], chosen: list[Any]) -> float:
        rows = [p for pos, _ in chosen for p in pos]
        answers = [a for pos, feeds in chosen for a in task.decode(dict(zip(outs, run(feeds), strict=True)), info)]
        return float(task.score(answers, task.subset(val, rows), info)[task.monitor]) * (1 if task.maximize else -1)

    search = quantize.int8_openvino(files, calib, items, score, ccfg.max_drop / 100, cpu.int8_exact(ov_engine.NAME),
                                    cdir / "openvino-int8", model_type=getattr(task, "nncf_model_type", None))
    search.update(score_means=f"{task.monitor} on the {len(val)} {split} {getattr(task, 'unit', 'lines')}",
                  val_lines=len(val), source=files[0].name)
    paths = [cdir / "openvino-int8/model.xml", cdir / "openvino-int8/model.bin"]
    eng = ov_engine.load(paths, threads=runtime.threads_per_process(1), precision="int8")
    return _variant(eng, desc, paths[0], "ir", ["openvino-int8/model.xml", "openvino-int8/model.bin"], "compress"), search


def _nncf_missing() -> str:
    try:
        import nncf  # noqa: F401
    except ImportError as e:
        return f"nncf is not installed ({e}); pip install nncf"
    return ""


def _ort_int8(onnx: Path | None, desc: iospec.IO, calib: list[Feeds], ccfg: CompressConfig, cdir: Path,
              threads: int) -> dict[str, Any]:
    if onnx is None:
        return _unsupported(ort_engine.NAME, "onnx", "int8", "compress", "the export has no model.onnx (import.onnx "
                            "was off)", desc)
    quantize.int8_onnx(onnx, {"desc": desc}, calib, ccfg, cdir / "int8-onnx", threads)
    path = cdir / "int8-onnx/model.onnx"
    return _variant(ort_engine.load([path], threads=threads, precision="int8"), desc, path, "onnx",
                    ["int8-onnx/model.onnx"], "compress")


def _paddle_int8(src: artifacts.Artifact, legacy: dict[str, Any], files: list[Path] | None, desc: iospec.IO,
                 calib: list[Feeds], ccfg: CompressConfig, cdir: Path, threads: int) -> dict[str, Any]:
    if files is None:
        return _unsupported(paddle_engine.NAME, "legacy", "int8", "compress", "PaddleSlim quantizes only the legacy "
                            "program, which this export does not have", desc)
    io = {"desc": desc, "legacy_model": legacy["model"], "legacy_params": legacy["params"],
          "legacy_inputs": [str(n) for n in legacy["inputs"]]}
    quantize.int8_paddle(src, io, calib, ccfg, cdir / "int8-paddle", threads)
    paths = [cdir / "int8-paddle/model.pdmodel", cdir / "int8-paddle/model.pdiparams"]
    try:
        eng = paddle_engine.load(paths, threads=threads, precision="int8")
    except PipeError as e:
        return _unsupported(paddle_engine.NAME, "legacy", "int8", "compress", f"oneDNN int8 cannot run PaddleSlim's "
                            f"model: {e}", desc)
    return _variant(eng, desc, paths[0], "legacy", ["int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"],
                    "compress")


# ------------------------------------------------------------------ measurement


def _measure(built: dict[str, dict[str, Any]], src: artifacts.Artifact, cdir: Path, data: Any, task: Any,
             info: tasks.Info, size: int, ref: dict[str, Any], ccfg: CompressConfig
             ) -> tuple[dict[str, dict[str, Any]], list[int]]:
    live = {n: e for n, e in built.items() if e["run"] is not None}
    evals = {n: ref if n == "fp32" else _evaluate(e["run"], data, task, info, size) for n, e in live.items()}
    # the reference set `pipe package` checks the packaged variant on (the task's few items, against fp32's):
    # held here too, so compress never calls shippable what package would refuse
    ref_x, _ = task.reference_set(config_mod.from_dict(src.manifest["config"]).data, info, reference.SAMPLES)
    ref_feeds = {image_input_name(src): ref_x}
    ref_digest = task.reference_digest(live["fp32"]["run"](ref_feeds), info)
    ref_agree = {n: float(task.reference_agreement(task.reference_digest(e["run"](ref_feeds), info), ref_digest, info))
                 for n, e in live.items()}
    x1, x32 = _timing_batches(data.test, task, info)
    groups = [g for g in ({n: e["run"] for n, e in live.items() if e["engine"] == engine}
                          for engine in engines_mod.ENGINES) if g]
    lat = timing.interleaved(groups, x1, ccfg.latency_runs)
    thr = timing.interleaved(groups, x32, ccfg.throughput_runs, warmup=_TIMING_WARMUP)
    out: dict[str, dict[str, Any]] = {}
    for name, e in built.items():
        v = {k: e[k] for k in ("format", "precision", "engine", "files", "source", "inputs", "outputs")}
        v["engine_info"] = e.get("describe")
        paths = [src.file(f) for f in v["files"] or ("model.json", "model.pdiparams")] if v["source"] == "export" \
            else [cdir / f for f in v["files"]]
        v["size_bytes"] = sum(p.stat().st_size for p in paths) if v["files"] or v["source"] == "export" else None
        v.update(metric=task.monitor, top1_agreement=None, max_abs_diff=None, fidelity=None,
                 throughput_batch=task.timing_batch)  # what items_per_s_batch / speedup_batch were timed at
        if name not in live:
            out[name] = {**v, "supported": False, "reason": e["reason"], "accuracy": None, "metrics": None,
                         "val_metrics": None, "char_agreement": None, "agreement_samples": None,
                         "reference_agreement": None, "reference_samples": None,
                         "latency_ms_p50_bs1": None, "latency_ms_p99_bs1": None, "items_per_s_batch": None,
                         "speedup_bs1": None, "speedup_batch": None, "faster_than_fp32": None, "note": e["reason"],
                         "status": f"unsupported: {e['reason']}", "shippable": False}
            continue
        agree, n = _agreement(evals[name], ref, task, info, ("val", "test"))
        met = evals[name]["test"]["metrics"]
        out[name] = {**v, "supported": True, "metrics": met, "accuracy": met[task.monitor],
                     "val_metrics": evals[name]["val"]["metrics"], "char_agreement": agree, "agreement_samples": n,
                     "reference_agreement": ref_agree[name], "reference_samples": int(len(ref_x)),
                     **fidelity.timing_fields(lat[name], thr[name], task.timing_batch)}
    base = out["fp32"]
    for name, v in out.items():
        if v["supported"]:
            v.update(fidelity.speed_fields(name, v, base, task.timing_batch))
    fidelity.judge(out, ccfg, None, task.maximize, getattr(task, "unit", "lines"))
    return out, [int(d) for d in next(iter(x32.values())).shape]


def image_input_name(src: artifacts.Artifact) -> str:
    """The name the export's one image input goes by (a dynamic task's input)."""
    return iospec.IO.from_interface(src.manifest["interface"]).inputs[0].name


def _timing_batches(split: Any, task: Any, info: tasks.Info) -> tuple[Feeds, Feeds]:
    """Batch 1 and a batch of the task's `timing_batch` of real items at one shape: the first test items in the
    task's order, each prepared alone, that share the first one's batch shape (ocr_rec: the narrowest lines, the
    first width bucket, 320 px; ocr_det: pages in split order, which rarely share a shape), repeated up to
    `timing_batch` if there are fewer."""
    lines: list[Feeds] = []
    for _, feeds in task.batches(split, info, 1):  # in order of width
        if lines and any(feeds[k].shape != lines[0][k].shape for k in feeds):
            break
        lines.append(feeds)
        if len(lines) == task.timing_batch:
            break
    rows = np.arange(task.timing_batch) % len(lines)
    x32 = {k: np.ascontiguousarray(np.concatenate([lines[i][k] for i in rows])) for k in lines[0]}
    return {k: np.ascontiguousarray(a) for k, a in lines[0].items()}, x32


def _metrics(variants: dict[str, dict[str, Any]], ccfg: CompressConfig, task: Any, calib: list[Feeds],
             rows: np.ndarray, n_train: int, n_test: int, threads: int, search: dict[str, Any] | None, size: int,
             shape: list[int], unit: str) -> dict[str, Any]:
    base = variants["fp32"]
    int8 = fidelity.int8_names(variants)
    sign = 1 if task.maximize else -1
    best = fidelity.best_int8(variants, task.maximize)
    live = [n for n, v in variants.items() if v["supported"]]
    digest = hashlib.sha256()
    for b in calib:
        for a in b.values():
            digest.update(np.ascontiguousarray(a).tobytes())
    widths = sorted({int(a.shape[-1]) for b in calib for a in b.values()})
    return {
        "task": task.name, "metric": task.monitor, "fp32_accuracy": base["accuracy"], "fp32_metrics": base["metrics"],
        "best_int8": best, "best_int8_accuracy": variants[best]["accuracy"] if best else None,
        "int8_drop_points": (base["accuracy"] - variants[best]["accuracy"]) * 100 * sign if best else None,
        "max_drop": ccfg.max_drop, "min_agreement": ccfg.min_agreement, "agreement": "char_agreement",
        "agreement_samples": base["agreement_samples"],
        "int8_not_shippable": {n: variants[n]["status"] for n in int8 if not variants[n]["shippable"]},
        "int8_unsupported": {n: v["reason"] for n, v in variants.items() if v["precision"] == "int8" and not v["supported"]},
        "cpu": cpu.capability(),
        "int8_faster_than_fp32": any(variants[n]["faster_than_fp32"] for n in int8),
        "int8_vs_own_fp32": (own := fidelity.int8_vs_own_fp32(variants)),
        "int8_pays": any(o["faster"] for o in own.values()),
        "fastest_bs1": min(live, key=lambda n: variants[n]["latency_ms_p50_bs1"]),
        "fastest_batch": max(live, key=lambda n: variants[n]["items_per_s_batch"]),
        "test_samples": n_test,
        "threads": threads,
        "calibration": {"split": "train", "lines": int(len(rows)), "unit": unit, "of": n_train, "batches": len(calib),
                        "batch_size": ccfg.calib_batch_size, "widths": widths, "seed": ccfg.calib_seed,
                        "max": getattr(task, "calib_max", None),  # the task's default cap (ocr_det: pages' memory)
                        "thin": bool(len(rows) < (getattr(task, "calib_max", None) or quantize.CALIB_WARN_BELOW)),
                        "inputs_sha256": digest.hexdigest(),
                        "onnxruntime_method": quantize.ORT_CALIB[ccfg.algo][0], "paddleslim_algo": ccfg.algo},
        "openvino_search": search,
        "timing": {"latency_runs": ccfg.latency_runs, "throughput_runs": ccfg.throughput_runs, "batch": task.timing_batch,
                   "lines": f"the first test {unit} of one shape (repeated up to {task.timing_batch})",
                   "shape": shape, "interleaved": True,
                   "eval_batch": size, "faster_means": f">= {fidelity.SPEED_MARGIN:.2f}x fp32 at batch 1 p50 and batch "
                                                       f"{task.timing_batch}"},
        "variants": variants,
    }


def _print(variants: dict[str, dict[str, Any]], task: Any, n: int, metrics: dict[str, Any], unit: str) -> None:
    print(f"compress: {task.name}, {n} test {unit}; agree = the answers' agreement with fp32's over "
          f"{metrics['agreement_samples']} val and test {unit} (the task's reference_agreement); CPU: "
          f"{cpu.summary(metrics['cpu'])}")
    thr = f"{unit}/s bs{task.timing_batch}"
    print(f"  {'variant':<14} {task.monitor:>7} {'drop':>6} {'agree':>6} {'ms bs1':>7} {thr:>12}  status")
    base = variants["fp32"]
    for name, v in variants.items():
        if not v["supported"]:
            print(f"  {name:<14} unsupported: {v['reason']}")
            continue
        drop = (base["accuracy"] - v["accuracy"]) * 100 * (1 if task.maximize else -1)
        print(f"  {name:<14} {v['accuracy']:>7.2%} {drop:>6.2f} {v['char_agreement']:>6.3f} "
              f"{v['latency_ms_p50_bs1']:>7.1f} {v['items_per_s_batch']:>12.1f}  {v['status']}"
              + (f"; {v['note']}" if v["note"] else ""))
    s = metrics["openvino_search"]
    if s:
        print(f"  openvino-int8: on val fp32 scored {s['score_fp32']:.4f}, int8 everywhere {s['score_int8_everywhere']:.4f}; "
              f"{len(s['fp32_layers'])} of {s['layers_quantizable']} layers back in fp32 -> {s['score']:.4f} "
              f"({'within' if s['reached'] else 'NOT within'} {s['max_drop'] * 100:g} points): "
              f"{', '.join(s['fp32_layers']) or 'none'}")


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("nncf", "openvino", "onnxruntime", "paddleslim"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out
