"""Which model a package ships, and where its files come from (`pipe package`, stages/package.py).

    source = select(artifact, cfg)          # an export's fp32, or a compress variant
    source = measured(export, source, ...)  # an export with --engine auto: its fp32 engines measured here

From an export: fp32 (or bf16) on Paddle Inference, its engines measured once the model loads
(`pipeline/export_engines.py`, picked by `pipeline/choose.py`), or what another engine reads of it (OpenVINO the
legacy program, onnxruntime `pipe export --onnx`'s file). From a compress artifact: `--variant`, or the one
`choose.py` picks from what compress measured, refused when compress judged it below budget; its export
verified as the one it was made from (`lineage_export`). `Source` also says which ONNX Triton serves.
`cfg` is `pipe package`'s PackageConfig (precision, engine, optimize, variant, triton, max_batch_size).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, choose, config as config_mod, engines, fidelity, iospec, reference, tasks
from pipeline.config import CompressConfig
from pipeline.engines import openvino as ov_engine, paddle as paddle_engine
from pipeline.errors import GateError, InputError
from pipeline.serving import spec as serving_spec
from pipeline.serving.spec import MODEL_FILES

# The Triton ONNX of a Paddle package, by precision, in order of preference (compress variant names).
_ONNX_VARIANTS = {"fp32": ("onnx-fp32",), "bf16": ("onnx-fp32",), "int8": ("int8-onnx", "onnx-fp32")}


@dataclass
class Source:
    """The model chosen for the package, the engine that runs it, and where its fp32 program and ONNX come from."""

    files: list[Path]  # [program, params] (pir, legacy) or [model.onnx]
    format: str
    engine: str
    precision: str
    variant: str
    interface: dict[str, Any]
    fp32_program: Path
    fp32_params: Path
    why: str = ""
    onnx: Path | None = None
    onnx_variant: str = ""
    onnx_precision: str = ""
    variant_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    vocab: Path | None = None  # text models: the export's vocabulary file
    measure: bool = False  # an export with --engine auto: its fp32 engines are measured (`measured`)
    measurement: dict[str, Any] | None = None  # what `measured` found (pipeline/export_engines.py)
    reference_set: tuple[dict[str, np.ndarray], Any] | None = None  # the set `measured` ran, drawn once


def select(src: artifacts.Artifact, cfg: Any) -> Source:
    """The model `pipe package` of `src` (an export or a compress artifact) ships, as `cfg` asks."""
    engine = "" if cfg.engine == "auto" else engines.resolve(cfg.engine)
    if src.stage == "export":
        if cfg.precision == "int8":
            raise InputError(f"{src.path}: --precision int8 needs a compress artifact (pipe compress "
                             f"{src.path} --int8), this is an export")
        if cfg.variant:
            raise InputError(f"--variant {cfg.variant}: names a compress variant; {src.path} is an export")
        return _from_export(src, cfg.precision or "fp32", engine)
    return _from_compress(src, cfg, engine)


def _from_export(exp: artifacts.Artifact, precision: str, engine: str) -> Source:
    """`auto` at fp32: the fp32 engines the export has files for are measured once the model loads (`measured`);
    bf16 runs on Paddle Inference; another engine runs what it can read (OpenVINO the legacy program, onnxruntime
    the `pipe export --onnx` or `pipe import` file)."""
    if exp.manifest.get("format") != "pir":
        raise InputError(f"{exp.path / artifacts.MANIFEST}: format {exp.manifest.get('format')!r}, "
                         "expected a PIR export (model.json)")
    program, params = exp.file("model.json"), exp.file("model.pdiparams")
    onnx = exp.file("model.onnx") if "model.onnx" in exp.manifest["files"] else None
    base = dict(interface=exp.manifest["interface"], fp32_program=program, fp32_params=params, vocab=_vocab_file(exp))
    if engine and engine != paddle_engine.NAME and precision != "fp32":
        raise InputError(f"--engine {engine} --precision {precision}: only Paddle Inference runs bf16")
    if engine in ("", paddle_engine.NAME):
        why = "--engine paddle" if engine else "only Paddle Inference runs bf16"
        source = Source([program, params], "pir", paddle_engine.NAME, precision, f"export-{precision}", why=why,
                         measure=not engine and precision == "fp32", **base)
    elif engine == ov_engine.NAME and (exp.manifest.get("legacy") or {}).get("available", True) \
            and "legacy" in exp.manifest:
        leg = exp.manifest["legacy"]
        source = Source([exp.file(leg["model"]), exp.file(leg["params"])], "legacy", engine, "fp32", "export-legacy",
                         why="--engine openvino: the export's legacy program", **base)
    elif onnx is not None:
        source = Source([onnx], "onnx", engine, "fp32", "export-onnx", why=f"--engine {engine}: the export's ONNX",
                         **base)
    else:
        raise InputError(f"--engine {engine}: {exp.path} holds no file it runs (it reads "
                         f"{', '.join(engines.FORMATS[engine])}); pipe compress {exp.path} --int8 writes them, or "
                         f"pipe export --onnx")
    if onnx is not None:  # `pipe export --onnx`: already parity-gated there
        source.onnx, source.onnx_variant, source.onnx_precision = onnx, "export", "fp32"
    return source


def measured(exp: artifacts.Artifact, source: Source, cfg: Any, text: dict[str, Any] | None,
             desc: iospec.IO, task: Any, info: tasks.Info, threads: int) -> Source:
    """An export's fp32 engines measured on the reference set (`pipeline/export_engines.py`: this machine's
    measurement, cached by the export's manifest sha256) and the one `pipeline/choose.py` picks, as after
    compress."""
    from pipeline import export_engines

    x, targets = reference_set(exp, source, text, desc, task, info)
    ccfg = (exp.manifest.get("config") or {}).get("compress") or {}
    budget = CompressConfig(**{k: float(ccfg.get(k, getattr(CompressConfig, k)))
                               for k in ("max_drop", "min_agreement", "min_sqnr_db")})
    found = export_engines.measured(exp, desc, task, info, x, targets, budget, threads, cfg.max_batch_size)
    variants = found["variants"]
    chosen = choose.pick(variants, ref_accuracy=variants["fp32"]["accuracy"], ref_name="fp32",
                         max_drop=budget.max_drop, optimize=cfg.optimize, where=f"package: {exp.path}",
                         maximize=task.maximize)
    v = variants[chosen.variant]
    files = [exp.file(f) for f in v["files"]] or source.files
    said = "measured here" if found["measured_here"] else \
        f"this machine's measurement of the export, from {found['cache']}"
    picked = dataclasses.replace(source, files=files, format=v["format"], engine=v["engine"],
                                 variant=f"export-{'fp32' if v['format'] == 'pir' else v['format']}",
                                 why=f"{said}: {chosen.why}", measure=False, reference_set=(x, targets),
                                 variant_metrics={k: v[k] for k in ("latency_ms_p50_bs1", "latency_ms_p99_bs1",
                                                                    "items_per_s_batch", "speedup_bs1", "speedup_batch",
                                                                    "throughput_batch")},
                                 measurement={k: found[k] for k in ("measured_here", "cache", "variants")}
                                 | {"chosen": chosen.variant})
    return picked


def _from_compress(comp: artifacts.Artifact, cfg: Any, engine: str) -> Source:
    """A compress variant: `--variant`, or the one `pipeline/choose.py` picks from what compress measured here."""
    where = comp.path / artifacts.MANIFEST
    metrics = comp.manifest.get("metrics") or {}
    if not isinstance(metrics.get("variants"), dict) or not metrics["variants"]:
        raise InputError(f"{where}: metrics.variants is missing; not a compress artifact this pipe reads")
    ccfg = (comp.manifest.get("config") or {}).get("compress") or {}
    maximize = tasks.from_interface(comp.manifest["interface"], iospec.IO.from_interface(
        comp.manifest["interface"]))[0].maximize
    variants = fidelity.verdicts(metrics, ccfg, maximize)  # compress's verdicts, as stored (or as of an old manifest)
    exp = lineage_export(comp)
    if cfg.variant:
        name, why = cfg.variant, f"--variant {cfg.variant}"
        if name not in variants:
            raise InputError(f"--variant {name}: {where} has {', '.join(sorted(variants))}")
    else:
        ref, ref_name = (variants.get("fp32") or {}).get("accuracy"), "fp32"
        if "distill" in metrics:
            ref, ref_name = metrics["distill"]["teacher_test_acc"], f"teacher {metrics['distill']['teacher_model']}"
        chosen = choose.pick(variants, ref_accuracy=ref, ref_name=ref_name, max_drop=float(ccfg.get("max_drop", 1.0)),
                             optimize=cfg.optimize, engine=engine, precision=cfg.precision, where=f"package: {where}",
                             maximize=maximize)
        name, why = chosen.variant, chosen.why
    var = variants[name]
    if not isinstance(var, dict):
        raise InputError(f"{where}: metrics.variants.{name} must be a mapping")
    if var.get("supported") is False:
        raise InputError(f"{where}: the {name} variant could not run where it was made "
                         f"({var.get('reason') or 'unsupported'}); pick another")
    if str(var.get("status", "")).startswith(("below budget", fidelity.OVER)):  # compress's verdict: never shipped
        raise GateError(f"{where}: the {name} variant is {var['status']}; pick another")
    if str(var.get("status", "")).startswith("unreliable"):
        print(f"package: note: {name} was measured {var['status']}")
    var_engine = str(var.get("engine") or paddle_engine.NAME)
    for flag, asked, got in (("--engine", engine, var_engine), ("--precision", cfg.precision, var.get("precision"))):
        if asked and asked != got:
            raise InputError(f"{flag} {asked}: variant {name} runs {var_engine} {var.get('precision')}")
    files, fmt = var.get("files") or [], str(var.get("format") or "")
    if fmt not in MODEL_FILES:
        raise InputError(f"{where}: metrics.variants.{name} has format {fmt!r}; expected {', '.join(MODEL_FILES)}")
    if var.get("source") == "export":
        paths = [exp.file(str(f)) for f in files] or [exp.file("model.json"), exp.file("model.pdiparams")]
    else:
        paths = [comp.file(str(f)) for f in files]
    if [p.suffix for p in paths] != [Path(f).suffix for f in MODEL_FILES[fmt]]:
        raise InputError(f"{where}: metrics.variants.{name} must list {' and '.join(MODEL_FILES[fmt])}-like files")
    source = Source(paths, fmt, var_engine, str(var.get("precision")), name, exp.manifest["interface"],
                     exp.file("model.json"), exp.file("model.pdiparams"), why=why, vocab=_vocab_file(exp))
    source.variant_metrics = {k: v for k, v in var.items()
                              if k not in ("files", "format", "engine", "source", "inputs", "outputs")}
    if fmt == "onnx":  # Triton serves the very file the package serves
        source.onnx, source.onnx_variant, source.onnx_precision = paths[0], f"compress:{name}", source.precision
    elif cfg.triton:
        # an int8 ONNX below budget (e.g. onnxruntime's on PP-OCRv4 rec) is never what Triton serves
        onnx_name = next((n for n in _ONNX_VARIANTS[source.precision] if isinstance(variants.get(n), dict)
                          and variants[n].get("supported") is not False and variants[n].get("shippable") is not False),
                         None)
        if onnx_name is not None:
            onnx_files = [f for f in variants[onnx_name].get("files") or [] if str(f).endswith(".onnx")]
            if len(onnx_files) != 1:
                raise InputError(f"{where}: metrics.variants.{onnx_name} must list one .onnx file")
            held = exp if variants[onnx_name].get("source") == "export" else comp  # the export's model.onnx
            source.onnx, source.onnx_variant = held.file(str(onnx_files[0])), f"compress:{onnx_name}"
            source.onnx_precision = "int8" if onnx_name.startswith("int8") else "fp32"
    return source


def _vocab_file(exp: artifacts.Artifact) -> Path | None:
    """A text export's vocabulary (verified with the rest of the export), or None for other models."""
    pre = (exp.manifest.get("interface") or {}).get("preprocessing") or {}
    if pre.get("kind") != "text":
        return None
    name = pre.get("vocab_file")
    if not isinstance(name, str) or name not in exp.manifest["files"]:
        raise InputError(f"{exp.path / artifacts.MANIFEST}: a text model, but the export lists no vocabulary "
                         f"file {name!r}")
    return exp.file(name)


def lineage_export(comp: artifacts.Artifact) -> artifacts.Artifact:
    ref = comp.manifest.get("input") or {}
    if ref.get("stage") != "export":
        raise InputError(f"{comp.path / artifacts.MANIFEST}: input is not an export artifact")
    exp = artifacts.verify((comp.path / ref["path"]).resolve(), ("export",))
    if exp.manifest_sha256 != ref.get("manifest_sha256"):
        raise InputError(f"{exp.path / artifacts.MANIFEST}: changed since {comp.path} was made from it "
                         "(re-run pipe compress)")
    return exp


def reference_set(exp: artifacts.Artifact, source: Source, text: dict[str, Any] | None, desc: iospec.IO, task: Any,
                  info: tasks.Info) -> tuple[dict[str, np.ndarray], Any]:
    """The reference set's inputs (by the interface's input names) and targets, drawn from the export's data."""
    vocab = serving_spec.check_vocab(source.vocab, text) if text is not None else None
    if tasks.dynamic(task):  # the task's own lines, prepared as served, one tensor
        arr, targets = task.reference_set(config_mod.from_dict(exp.manifest["config"]).data, info, reference.SAMPLES)
        return {desc.inputs[0].name: arr}, targets
    return reference.draw_set(exp.manifest["config"], exp.manifest["interface"], vocab)
