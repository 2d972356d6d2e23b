"""`pipe compress`'s variants (stages/compress.py): each loaded on its engine, and the metrics document the stage
writes about them.

    engines = load(src, cdir, io, backends, skipped, threads)   # fp32, bf16, int8-paddle, onnx-fp32, int8-onnx
    engines.update(openvino(src, cdir, io, engines, threads))   # compress.openvino: OpenVINO on those files
    w.metrics = metrics(variants, parity, ccfg, calib, n_test, threads, io, cap)

A variant that cannot run here is recorded unsupported with the engine's reason, never a failed stage.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, engines as engines_mod, fidelity, quantize, runtime
from pipeline.config import CompressConfig
from pipeline.engines import openvino as ov_engine, ort as ort_engine, paddle as paddle_engine
from pipeline.errors import PipeError
from pipeline.timing import WARMUP as _WARMUP

VARIANT_FILES = {
    "int8-paddle": ("int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"),
    "onnx-fp32": ("onnx-fp32/model.onnx",),
    "int8-onnx": ("int8-onnx/model.onnx",),
}


def load(src: artifacts.Artifact, cdir: Path, io: dict[str, Any], backends: tuple[str, ...],
         skipped: dict[str, str], threads: int) -> dict[str, dict[str, Any]]:
    """name -> {run: feeds -> outputs (`runner`), describe, format, precision, engine, files, source, inputs,
    outputs} for every variant, each loaded through its engine (`pipeline/engines/`).

    A Paddle predictor whose oneDNN bf16/int8 passes reject the program (e.g. bf16 on a 3-D pool:
    "the input of Op(pool) should be 4-D or 5-D Tensor") makes that variant unsupported with the
    engine's message, not the stage fail; an int8-paddle model that cannot run is deleted (and added
    to `skipped`), so the artifact ships no unusable files."""
    pir = [src.file("model.json"), src.file("model.pdiparams")]
    out: dict[str, dict[str, Any]] = {}
    desc = io["desc"]

    def unsupported(fmt: str, precision: str, source: str, reason: str) -> dict[str, Any]:
        return engines_mod.unsupported_variant(paddle_engine.NAME, fmt, precision, source, reason, desc)

    out["fp32"] = engines_mod.variant(paddle_engine.load(pir, threads=threads), desc, pir[0], "pir", [], "export")
    bf16_reason = runtime.bf16_unsupported()
    if bf16_reason:
        out["bf16"] = unsupported("pir", "bf16", "export", bf16_reason)
    else:
        try:
            bf16 = paddle_engine.load(pir, threads=threads, precision="bf16")
            out["bf16"] = engines_mod.variant(bf16, desc, pir[0], "pir", [], "export")
        except PipeError as e:
            out["bf16"] = unsupported("pir", "bf16", "export", f"oneDNN bf16 cannot run this model: {e}")
    if "paddle" in backends and "int8-paddle" not in skipped:
        files = [cdir / f for f in VARIANT_FILES["int8-paddle"]]
        try:
            eng = paddle_engine.load(files, threads=threads, precision="int8")
        except PipeError as e:
            shutil.rmtree(cdir / "int8-paddle")
            skipped["int8-paddle"] = f"oneDNN int8 cannot run PaddleSlim's model: {e}"
        else:
            out["int8-paddle"] = engines_mod.variant(eng, desc, files[0], "legacy", list(VARIANT_FILES["int8-paddle"]),
                                                       "compress")
    if "int8-paddle" in skipped:
        out["int8-paddle"] = unsupported("legacy", "int8", "compress", skipped["int8-paddle"])
    if "onnxruntime" in backends:
        for name, precision in (("onnx-fp32", "fp32"), ("int8-onnx", "int8")):
            (rel,) = VARIANT_FILES[name]
            eng = ort_engine.load([cdir / rel], threads=threads, precision=precision)
            out[name] = engines_mod.variant(eng, desc, cdir / rel, "onnx", [rel], "compress")
    return out


def openvino(src: artifacts.Artifact, cdir: Path, io: dict[str, Any], built: dict[str, dict[str, Any]],
             threads: int) -> dict[str, dict[str, Any]]:
    """OpenVINO on files the other routes made: fp32 on the export's legacy program (it does not read PIR;
    facts note section 13: faster than from paddle2onnx's ONNX on mobilenet_v3_small, 6.6x vs 4.6x fp32 at
    batch 1), else, or when its Paddle frontend cannot read that program (e.g. "No creator found for
    einsum node" on a text model), on onnx-fp32; int8 on int8-onnx's QDQ model. Unsupported, with the
    reason, when the library is missing or cannot load the file."""
    legacy = ("legacy", [io["legacy_model"], io["legacy_params"]], "export") if io["legacy_model"] else None
    onnx32 = ("onnx", list(VARIANT_FILES["onnx-fp32"]), "compress")
    onnx8 = ("onnx", list(VARIANT_FILES["int8-onnx"]), "compress")
    todo = {"openvino-fp32": ("fp32", [c for c in (legacy, onnx32) if c is not None])}
    if "int8-onnx" in built:
        todo["openvino-int8"] = ("int8", [onnx8])
    out: dict[str, dict[str, Any]] = {}
    desc = io["desc"]
    for name, (precision, choices) in todo.items():
        why = []
        for fmt, files, source in choices:
            paths = [src.file(f) if source == "export" else cdir / f for f in files]
            if not all(p.is_file() for p in paths):
                continue  # the onnxruntime route was not run (--backend paddle)
            try:  # fed by name: OpenVINO lists the legacy program's inputs reversed (facts note section 14)
                eng = ov_engine.load(paths, threads=threads, precision=precision)
                out[name] = engines_mod.variant(eng, desc, paths[0], fmt, files, source)
                break
            except PipeError as e:
                why.append(str(e))
                out[name] = {**engines_mod.unsupported_variant(ov_engine.NAME, fmt, precision, source, "; ".join(why),
                                                               desc), "files": files}
    return out


def metrics(variants: dict[str, dict[str, Any]], parity: dict[str, Any], ccfg: CompressConfig,
            calib: dict[str, np.ndarray], n_test: int, threads: int, io: dict[str, Any],
            cap: dict[str, Any]) -> dict[str, Any]:
    base = variants["fp32"]
    int8 = fidelity.int8_names(variants)
    best = fidelity.best_int8(variants, io["task"].maximize)  # None when none is within budget
    drop = variants[best]["drop_points"] if best else None  # as fidelity.judge stored it
    live = [n for n, v in variants.items() if v["supported"]]
    method, extra = quantize.ORT_CALIB[ccfg.algo]
    desc, digest = io["desc"], hashlib.sha256()
    for a in calib.values():  # in the interface's order: for one input, the sha256 of its batches
        digest.update(a.tobytes())
    op_types, rule = quantize.ort_op_types(desc)
    batches, size = next(iter(calib.values())).shape[:2]  # what was drawn (compress.calib_batches 0: up to 10)
    calibration = {"split": "train", "batches": int(batches), "batch_size": int(size), "samples": int(batches * size),
                   "thin": bool(batches * size < quantize.CALIB_WARN_BELOW), "seed": ccfg.calib_seed, "paddleslim_algo": ccfg.algo, "paddleslim_onnx_format": True,
                   "paddleslim_op_types": list(quantize.QUANT_OPS), "onnxruntime_method": method,
                   "onnxruntime_options": extra, "onnxruntime_op_types": op_types or "default",
                   "onnxruntime_op_types_rule": rule, "dtype": "/".join(a.dtype.name for a in calib.values()),
                   "inputs": {desc.input(k).public: {"dtype": a.dtype.name, "shape": [-1, *a.shape[2:]],
                                                     "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
                              for k, a in calib.items()},
                   "inputs_sha256": digest.hexdigest()}
    if "vocab" in io:  # the tokenizer the calibration (and test) texts were encoded with: the export's
        calibration.update(vocab_file=io["pre"]["vocab_file"], vocab_sha256=io["vocab_sha256"],
                           max_len=int(io["pre"]["max_len"]))
    return {
        "task": io["task"].name,
        "metric": io["task"].monitor,
        "fp32_accuracy": base["accuracy"],
        "fp32_metrics": base["metrics"],
        "best_int8": best,
        "best_int8_accuracy": variants[best]["accuracy"] if best else None,
        "int8_drop_points": drop,
        "max_drop": ccfg.max_drop,
        "min_agreement": ccfg.min_agreement,
        "min_sqnr_db": ccfg.min_sqnr_db,
        "logits_output": io["info"].logits or None,
        "sqnr_budget_outputs": fidelity.budgeted(desc, io["info"].logits or None),
        "agreement_samples": base["agreement_samples"],
        "int8_not_shippable": {n: variants[n]["status"] for n in int8 if not variants[n]["shippable"]},
        "cpu": cap,
        "onnxruntime_reduce_range": ccfg.reduce_range,
        "int8_faster_than_fp32": any(variants[n]["faster_than_fp32"] for n in int8),
        "int8_vs_own_fp32": (own := fidelity.int8_vs_own_fp32(variants)),
        "int8_pays": any(o["faster"] for o in own.values()),
        "int8_unsupported": {n: v["reason"] for n, v in variants.items() if v["precision"] == "int8"
                             and not v["supported"]},
        "fastest_bs1": min(live, key=lambda n: variants[n]["latency_ms_p50_bs1"]),
        "fastest_batch": max(live, key=lambda n: variants[n]["items_per_s_batch"]),
        "test_samples": n_test,
        "threads": threads,
        **parity,
        "calibration": calibration,
        "timing": {"latency_runs": ccfg.latency_runs, "throughput_runs": ccfg.throughput_runs, "warmup": _WARMUP,
                   "interleaved": True,
                   "faster_means": f">= {fidelity.SPEED_MARGIN:.2f}x fp32 at batch 1 p50 and batch 32"},
        "variants": {n: {k: val for k, val in v.items() if k not in ("max_abs_logit_fp32", "fp32_absmax")}
                     for n, v in variants.items()},
    }
