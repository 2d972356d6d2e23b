"""The fp32 engines an export (trained or imported) has files for, measured for `pipe package` of an export
(stages/package.py), as compress measures its variants, so that `--engine auto` ships the fastest within budget.

    found = export_engines.measured(exp, desc, task, info, x, targets, budget, threads, batch)
    choose.pick(found["variants"], ref_accuracy=found["variants"]["fp32"]["accuracy"], ref_name="fp32", ...)

Candidates, named as compress names them: `fp32` (Paddle Inference on the PIR program), `onnx-fp32`
(onnxruntime on the export's `model.onnx`, `pipe import`'s or `pipe export --onnx`'s) and `openvino-fp32`
(OpenVINO on the legacy program, else that ONNX). An engine whose library is missing here, or that cannot
load its file, is recorded unsupported with the reason. Each runs the package's reference set (`x`: the task's
own inputs, prepared as served; `targets` for the task's metric), is judged against Paddle fp32's outputs by
compress's one verdict (`fidelity.verdict`: agreement on that set, `reference_agreement`, and the task's metric
within compress.max_drop) and timed interleaved (`pipeline/timing.py`) at batch 1 and at the task's
`timing_batch` (else 32) on the set's first items, with fewer runs than compress (`LATENCY_RUNS`,
`THROUGHPUT_RUNS`: the test suite packages exports many times; `timing.interleaved` itself keeps the
engines' turns apart). Every variant carries the fields `pipeline/choose.py` ranks on.

An export is immutable and so is a measurement of it on one machine: the result is kept in
`$PIPE_CACHE_DIR/engines/<export manifest sha256>.json` (default `~/.cache/pipe`), written atomically (a
temporary file beside it, fsynced, renamed), with the key it is valid for (the export manifest's sha256, this
CPU's capability, the engine libraries' versions, threads, the runs and the set's size). A second package of
the same export on the same machine reads it and measures nothing; anything else (another CPU or library, a
file that does not parse) is measured again and replaces it. The package's manifest records the
measurement and whether it was made there (`metrics.engine_measurement`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, cpu, engines, fidelity, iospec, pretrained, reference, timing
from pipeline.config import CompressConfig
from pipeline.engines import openvino as ov_engine, ort as ort_engine, paddle as paddle_engine
from pipeline.errors import PipeError

# timed runs per engine at batch 1 and at the throughput batch, after WARMUP calls, and untimed calls before each
# block of timed ones (timing.interleaved): an OCR page takes ~0.1-0.3 s, and a package measures three engines
LATENCY_RUNS, THROUGHPUT_RUNS, WARMUP, BLOCK_WARMUP = 8, 3, 1, 1
SCHEMA = 1
_KEPT = ("format", "precision", "engine", "files", "source", "supported", "reason", "metric", "accuracy",
         "reference_agreement", "reference_samples", "fidelity", "latency_ms_p50_bs1", "latency_ms_p99_bs1",
         "items_per_s_batch", "throughput_batch", "speedup_bs1", "speedup_batch", "faster_than_fp32", "note",
         "status", "shippable", "drop_points", "engine_info")


def cache_file(exp: artifacts.Artifact) -> Path:
    return pretrained.cache_root() / "engines" / f"{exp.manifest_sha256}.json"


def measured(exp: artifacts.Artifact, desc: iospec.IO, task: Any, info: Any, x: dict[str, np.ndarray],
             targets: Any, budget: CompressConfig, threads: int, batch: int) -> dict[str, Any]:
    """{variants, key, cache, measured_here}: this machine's measurement of the export's fp32 engines, from
    the cache when it holds one for this key, else made now and stored there."""
    timing_batch = int(getattr(task, "timing_batch", 32))
    key = {"schema": SCHEMA, "export_manifest_sha256": exp.manifest_sha256, "cpu": cpu.capability(),
           "versions": {k: v for k, v in artifacts.versions().items() if k in ("paddlepaddle", "onnxruntime",
                                                                                "openvino")},
           "threads": threads, "runs": [LATENCY_RUNS, THROUGHPUT_RUNS, WARMUP, BLOCK_WARMUP],
           "throughput_batch": timing_batch, "reference_samples": int(iospec.num_rows(x)),
           "budget": {k: getattr(budget, k) for k in ("max_drop", "min_agreement", "min_sqnr_db")}}
    path = cache_file(exp)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    fresh = isinstance(doc, dict) and doc.get("key") == json.loads(json.dumps(key))
    if fresh and isinstance(doc.get("variants"), dict):
        return {"variants": doc["variants"], "key": key, "cache": str(path), "measured_here": False}
    variants = _measure(exp, desc, task, info, x, targets, budget, threads, batch, timing_batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    artifacts.write_text_atomic(path, json.dumps({"key": key, "variants": variants}, indent=1) + "\n")
    return {"variants": variants, "key": key, "cache": str(path), "measured_here": True}


def _candidates(exp: artifacts.Artifact, desc: iospec.IO, threads: int) -> dict[str, dict[str, Any]]:
    """Each fp32 engine on the export's file it reads, loaded (compress's variant form), or unsupported."""
    pir = [exp.file("model.json"), exp.file("model.pdiparams")]
    out = {"fp32": engines.variant(paddle_engine.load(pir, threads=threads), desc, pir[0], "pir", [], "export")}
    files = exp.manifest["files"]
    onnx = ["model.onnx"] if "model.onnx" in files else []
    leg = exp.manifest.get("legacy") or {}
    legacy = [leg["model"], leg["params"]] if leg.get("available", True) and "model" in leg else []
    for name, engine, choices in (("onnx-fp32", ort_engine, [("onnx", onnx)]),
                                  ("openvino-fp32", ov_engine, [("legacy", legacy), ("onnx", onnx)])):
        choices = [(fmt, rel) for fmt, rel in choices if rel]
        if not choices:
            continue  # no file this engine reads
        why = engines.missing(engine.NAME)
        for fmt, rel in choices if not why else []:
            paths = [exp.file(f) for f in rel]
            try:  # by name: OpenVINO lists the legacy program's inputs reversed (facts note section 14)
                out[name] = engines.variant(engine.load(paths, threads=threads), desc, paths[0], fmt, rel, "export")
                break
            except PipeError as e:
                why = f"{why}; {e}" if why else str(e)
        if name not in out:
            out[name] = {**engines.unsupported_variant(engine.NAME, choices[0][0], "fp32", "export", why, desc),
                         "files": choices[0][1]}
    return out


def _measure(exp: artifacts.Artifact, desc: iospec.IO, task: Any, info: Any, x: dict[str, np.ndarray], targets: Any,
             budget: CompressConfig, threads: int, batch: int, timing_batch: int) -> dict[str, dict[str, Any]]:
    built = _candidates(exp, desc, threads)
    live = {n: e for n, e in built.items() if e["run"] is not None}
    got = {n: reference.run(e["run"], x, batch, desc) for n, e in live.items()}  # by program output name
    digest = hasattr(task, "reference_digest")
    ref = got["fp32"]
    if digest:  # the task's compact form, as the package's reference check compares (ocr_rec: the decoded path)
        ref = {reference.DIGEST + k: v for k, v in
               task.reference_digest({t.public: got["fp32"][t.name] for t in desc.outputs}, info).items()}
    n = int(iospec.num_rows(x))
    rows = np.arange(timing_batch) % n  # the set's first items, repeated if it has fewer
    x1 = {k: np.ascontiguousarray(a[:1]) for k, a in x.items()}
    xn = {k: np.ascontiguousarray(a[rows]) for k, a in x.items()}
    groups = [g for g in ({k: e["run"] for k, e in live.items() if e["engine"] == eng} for eng in engines.ENGINES) if g]
    lat = timing.interleaved(groups, x1, LATENCY_RUNS, warmup=WARMUP, block_warmup=BLOCK_WARMUP)
    thr = timing.interleaved(groups, xn, THROUGHPUT_RUNS, warmup=WARMUP, block_warmup=BLOCK_WARMUP)
    out: dict[str, dict[str, Any]] = {}
    for name, e in built.items():
        v = {k: e[k] for k in ("format", "precision", "engine", "files", "source")}
        v.update(engine_info=e.get("describe"), metric=task.monitor, throughput_batch=timing_batch)
        if name not in live:
            out[name] = {**v, "supported": False, "reason": e["reason"], "accuracy": None, "note": e["reason"],
                         "speedup_bs1": None, "speedup_batch": None, "faster_than_fp32": None}
            continue
        res = reference.compare(got[name], ref, desc, budget.min_sqnr_db, logits=info.logits, task=task, info=info)
        agree = res.get("top1_agreement")
        scored = task.metrics_of({t.public: got[name][t.name] for t in desc.outputs}, targets, info)
        out[name] = {**v, "supported": True, "accuracy": float(scored[task.monitor]),
                     "reference_agreement": res.get("agreement") if agree is None else agree, "reference_samples": n,
                     "fidelity": None if digest else res.get("outputs"),
                     **fidelity.timing_fields(lat[name], thr[name], timing_batch)}
    for name, v in out.items():
        if v["supported"]:
            v.update(fidelity.speed_fields(name, v, out["fp32"], timing_batch))
    fidelity.judge(out, budget, info.logits or None, task.maximize, getattr(task, "unit", "samples"))
    return {n: {k: v.get(k) for k in _KEPT} for n, v in out.items()}
