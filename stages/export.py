"""pipe export: the trained model in the Paddle Inference format, parity-checked, as `<run>/export/`.

    pipe export runs/exp1/train
    pipe export runs/exp1/train --onnx
    pipe export runs/exp1/train --set export.parity_tol=1e-5 --out runs/exp1/export-strict

Reads a verified `train/` artifact: `model.safetensors`, the resolved config (model, data) and the
interface (every named input and output, labels, preprocessing; pipeline/iospec.py). Writes `export/`:
`model.json` + `model.pdiparams` (PIR program, what later stages serve: one named InputSpec per input, in
forward's parameter order, dynamic batch and the dynamic axes the interface has), `preprocess.yaml`
(every input and output, labels, layout/scale/mean/std or the tokenizer), `legacy/model.pdmodel` +
`legacy/model.pdiparams` (the pre-PIR program PaddleSlim's int8 quantization needs) and `manifest.json`.
No `.pdiparams.info` (a pickle Paddle Inference does not need) is shipped.

Parity gate (exit 5, nothing written): a Paddle Inference predictor (oneDNN) on the first
`export.parity_samples` test samples, fed by name, must match the dygraph model on EVERY output, max|diff|
<= `export.parity_tol` * that output's max|value|; the legacy program and the ONNX are held to the same
bound. Saved outputs cannot keep their names (PIR names them `fetch_name_<i>`, a legacy program
`linear_2.tmp_1`; a dict output comes out in sorted key order, which is the interface's order): the
interface records each tensor under its public name with the program's real one as `program_name`.

`--precision bf16` (export.precision) also runs the program under oneDNN bf16 kernels (fp16 on a GPU) on
the test split and records accuracy, top-1 agreement and max|diff| against fp32 and the batch-1 latency
under `metrics.reduced_precision`; a CPU without avx512_bf16 gets a notice and `supported: false`.
The files are the same: precision is a predictor setting (`pipe package --precision bf16` serves it).

`--onnx` also writes `model.onnx` (paddle2onnx of the PIR program, opset 13, in a child process: it can
abort on a program it cannot convert), held to the same parity bound in onnxruntime.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from pipeline import artifacts, config as config_mod, data as data_mod, iospec, p2o, runtime, tasks
from pipeline.config import ExportConfig, RunConfig
from pipeline.errors import InputError, ParityError, PipeError
from pipeline.nets import models

_SHIPPED = {"model.json", "model.pdiparams", "preprocess.yaml"}
_LEGACY = {"legacy/model.pdmodel", "legacy/model.pdiparams"}
_EVAL_BATCH = 256
_WARMUP, _TIMED = 10, 100  # batch-1 latency: runs discarded, runs timed
_LEGACY_TIMEOUT = 600
_ONNX_OPSET = 13


def run(cfg: RunConfig, in_dir: Path, out_dir: Path, onnx: bool = False) -> Path:
    """Export the train artifact `in_dir` to `out_dir`. Only `cfg.export` is read from `cfg`: the
    model and the data are the ones recorded in the train manifest. `onnx`: also `model.onnx`."""
    out_dir = Path(out_dir)
    src = artifacts.verify(in_dir, ("train",))
    train_cfg = config_mod.from_dict(src.manifest["config"])
    if (src.manifest.get("init") or {}).get("kind") == "program":
        return _export_program(cfg, src, train_cfg, out_dir, onnx)
    desc, labels, pre = _read_interface(src)
    task, info = tasks.from_interface(src.manifest["interface"], desc)
    ds = data_mod.load(train_cfg.data, getattr(task, "data", None))  # the task picks the loader, as in train
    _check_data(src, ds, desc, labels)
    threads = runtime.threads_per_process(1)
    paddle = runtime.import_paddle(threads)
    paddle.set_device("cpu")
    model = {"name": train_cfg.model.name, "num_classes": len(labels), "vocab_size": pre.get("vocab_size"),
             "input_shapes": {k: list(v) for k, v in ds.input_shapes.items()}}
    net = _load_model(paddle, src, model)
    where = f"{src.path / artifacts.MANIFEST}: model {train_cfg.model.name!r}"
    call = models.calling(net, [t.name for t in desc.inputs], where)
    test, y = ds.test, np.asarray(ds.test.y[ds.test.idx])
    n = min(cfg.export.parity_samples, len(test))
    x_par = test.feeds(np.arange(n), pre)
    # Reference outputs first: to_static converts `net.forward` in place.
    dygraph = _Dygraph(paddle, net, call, desc, train_cfg.model.logits_output if info.logits else None, where)
    ref = tasks.concat([dygraph(xb) for xb in _batches(test, pre)])
    ref_par = dygraph(x_par)
    doc = dataclasses.replace(train_cfg, export=cfg.export).to_dict()
    with artifacts.write_stage(out_dir, "export", doc, src) as w:
        _save_program(paddle, net, desc, call.spec_order, w.dir / "model")
        pred = _predictor(paddle, w.dir / "model.json", w.dir / "model.pdiparams", threads)
        prog = _program_io(desc, pred.get_input_names(), pred.get_output_names(), "the exported program")
        parity = _parity_gate(ref_par, _predict(pred, prog, x_par), cfg.export, "predictor", desc)
        got = tasks.concat([_predict(pred, prog, xb) for xb in _batches(test, pre)])
        latency = _latency_ms(pred, prog, desc.batch(x_par, 0, 1))
        legacy_error = _export_legacy(src, model, desc, call.spec_order, w.dir / "legacy", threads)
        legacy_parity = {"parity_max_abs_diff": None, "parity_rel": None}
        legacy_io = None
        if legacy_error is None:
            legacy = _predictor(paddle, w.dir / "legacy/model.pdmodel", w.dir / "legacy/model.pdiparams", threads)
            legacy_io = _program_io(desc, legacy.get_input_names(), legacy.get_output_names(), "the legacy program")
            legacy_parity = _parity_gate(ref_par, _predict(legacy, legacy_io, x_par), cfg.export, "legacy program", desc)
        w.interface = prog.to_interface()
        _write_preprocess(w.dir / "preprocess.yaml", prog, pre)
        if pre["kind"] == "text":  # the tokenizer travels with the model
            shutil.copyfile(src.file(pre["vocab_file"]), w.dir / pre["vocab_file"])
        onnx_parity = _export_onnx(w.dir, desc, ref_par, x_par, cfg.export, threads) if onnx else None
        reduced = (_reduced_precision(paddle, w.dir, prog, test, pre, got, y, desc.batch(x_par, 0, 1), latency, threads,
                                      task, info)
                   if cfg.export.precision != "fp32" else None)
        _check_file_set(w.dir, onnx, pre, legacy_error is None)
        w.metrics = {
            **parity,
            **{f"test_{k}": v for k, v in task.metrics_of(got, y, info).items()},
            **{f"dygraph_test_{k}": v for k, v in task.metrics_of(ref, y, info).items()},
            **tasks.fidelity(task, got, ref, info),
            "test_samples": int(len(y)),
            "latency_ms_p50_bs1": latency,
            "threads": threads,
            "legacy_parity_max_abs_diff": legacy_parity["parity_max_abs_diff"],
            "legacy_parity_rel": legacy_parity["parity_rel"],
        }
        if reduced is not None:
            w.metrics["reduced_precision"] = reduced
        if onnx_parity is not None:
            w.metrics["onnx_parity_max_abs_diff"] = onnx_parity["parity_max_abs_diff"]
            w.metrics["onnx_parity_rel"] = onnx_parity["parity_rel"]
        w.extra = {"format": "pir", "onednn": True, "legacy": {
            "format": "legacy", "model": "legacy/model.pdmodel", "params": "legacy/model.pdiparams",
            "inputs": [t.name for t in legacy_io.inputs], "outputs": [t.name for t in legacy_io.outputs]}
            if legacy_io is not None else {"available": False, "reason": legacy_error}}
        if onnx_parity is not None:
            w.extra["onnx"] = {"format": "onnx", "model": "model.onnx", "opset": _ONNX_OPSET,
                               "inputs": onnx_parity["inputs"], "outputs": onnx_parity["outputs"]}
    return out_dir


def _export_program(cfg: RunConfig, src: artifacts.Artifact, train_cfg: RunConfig, out_dir: Path, onnx: bool) -> Path:
    """A fine-tuned import (`pipe train --init IMPORT`): the pretrained program as it was imported, its
    `.pdiparams` rewritten with the trained weights (pipeline/nets/program_layer.py), taken through `pipe import`'s
    own path (PIR translation, ONNX, parity, the task's metrics on the training data's val and test splits), so the
    artifact is an import's. Its lineage names both the pretrained source (its files' sha256) and the train run.
    ONNX as the import made it (`--onnx` also asks for it)."""
    import tempfile

    from pipeline.nets import paddle_program, program_layer, weights
    from stages import import_

    init = src.manifest["init"]
    try:
        imp = artifacts.verify(Path(init["path"]), ("export",))
    except InputError as e:
        raise InputError(f"{src.path}: fine-tuned from the import {init['path']}, which no longer verifies: "
                         f"{e}") from None
    if imp.manifest_sha256 != init["manifest_sha256"]:
        raise InputError(f"{src.path}: fine-tuned from {imp.path}, which has changed since (manifest sha256 "
                         f"{imp.manifest_sha256[:12]}, trained from {init['manifest_sha256'][:12]})")
    program, params = weights.program_files(imp.manifest)  # the legacy program, or the PIR one it came as
    prog = paddle_program.Program(imp.file(program), imp.file(params))
    io_ = paddle_program.read(prog)
    paddle = runtime.import_paddle(runtime.threads_per_process(1))
    trained = runtime.load_safetensors(paddle, src.file("model.safetensors"))
    names = {program_layer.key(p.name): p.name for p in io_.params}
    if set(trained) != set(names):
        raise InputError(f"{src.file('model.safetensors')}: holds {len(trained)} tensors, the program "
                         f"{prog.program} {len(names)}; not this import's fine-tuning")
    values = {names[k]: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in trained.items()}
    iface = imp.manifest["interface"]
    task_rec = iface.get("task") or {}
    lineage = {"kind": "finetune", "model": str(iface.get("model") or imp.path.name),
               "pretrained": {"path": str(imp.path.resolve()), "manifest_sha256": imp.manifest_sha256,
                              "source": imp.manifest.get("source")},
               "train": {"path": str(src.path.resolve()), "manifest_sha256": src.manifest_sha256}}
    task = tasks.get(str(task_rec.get("spec") or ""))
    keys = [n for n in task.files(task.info_of(iface)) if n in imp.manifest["files"]]  # ocr_rec: keys.txt
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pipe-finetuned-", dir=out_dir.parent) as tmp:
        shutil.copyfile(prog.program, Path(tmp) / f"model{prog.program.suffix}")  # .pdmodel or PIR's .json
        program_layer.write_params(prog.params, Path(tmp) / "model.pdiparams", values, io_)
        icfg = dataclasses.replace(train_cfg.import_, task=str(task_rec.get("spec") or ""),
                                   keys=str(imp.file(keys[0])) if keys else "",
                                   onnx=onnx or "onnx" in imp.manifest)
        run_cfg = dataclasses.replace(train_cfg, import_=icfg, export=cfg.export)
        return import_.run(run_cfg, Path(tmp), out_dir, finetuned=src, lineage=lineage)


def _read_interface(src: artifacts.Artifact) -> tuple[iospec.IO, list[str], dict[str, Any]]:
    """(the io description, labels, preprocessing) from the train manifest, checked."""
    where = src.path / artifacts.MANIFEST
    iface = src.manifest["interface"]
    desc = iospec.IO.from_interface(iface, f"{where}: interface")
    try:
        labels, pre = [str(s) for s in iface["labels"]], iface["preprocessing"]
        ok = isinstance(pre, dict) and isinstance(pre.get("kind"), str)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: interface needs labels and preprocessing")
    if pre["kind"] == "text":
        bad = next((t for t in desc.inputs if t.shape != (-1, -1) or t.dtype != "int64"), None)
        if bad is not None or not isinstance(pre.get("vocab_size"), int):
            raise InputError(f"{where}: a text interface takes int64 ids of shape [-1, -1] and a vocab_size")
    return desc, labels, pre


def _check_data(src: artifacts.Artifact, ds: data_mod.Dataset, desc: iospec.IO, labels: list[str]) -> None:
    """The test split is re-read from `data.source`: it must still be the data the model was trained on."""
    where = src.path / artifacts.MANIFEST
    source = src.manifest["config"]["data"]["source"]
    then = [(t.name, t.dtype, list(t.shape)) for t in desc.inputs]
    now = [(t.name, t.dtype, list(t.shape)) for t in ds.inputs()]
    if now != then or list(ds.labels) != labels:
        raise InputError(f"{where}: trained on inputs {_describe(then)} with {len(labels)} labels, but data.source "
                         f"{source!r} now gives {_describe(now)} with {len(ds.labels)}; the data changed")
    n_test = (src.manifest["metrics"].get("samples") or {}).get("test")
    if n_test is not None and n_test != len(ds.test):
        raise InputError(f"{where}: the test split had {n_test} samples, data.source {source!r} now gives "
                         f"{len(ds.test)}; the data changed")


def _describe(inputs: list[tuple[str, str, list[int]]]) -> str:
    if len(inputs) == 1:
        return str(inputs[0][2][1:])
    return ", ".join(f"{n} {d} {s[1:]}" for n, d, s in inputs)


def _load_model(paddle: Any, src: artifacts.Artifact, model: dict[str, Any]) -> Any:
    path = src.file("model.safetensors")
    name, shapes = model["name"], {k: tuple(v) for k, v in model["input_shapes"].items()}
    net = models.build(name, model["num_classes"], next(iter(shapes.values())), model["vocab_size"],
                       input_shapes=shapes)
    state = runtime.load_safetensors(paddle, path)
    want = {k: list(v.shape) for k, v in net.state_dict().items()}
    have = {k: list(v.shape) for k, v in state.items()}
    if want != have:
        bad = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        raise InputError(f"{path}: weights do not fit model {name!r} (first mismatch: {bad[0]})")
    net.set_state_dict(state)
    net.eval()
    return net


def _batches(split: data_mod.Split, pre: dict[str, Any]) -> Iterator[dict[str, np.ndarray]]:
    """Prepared model inputs of a split by name, `_EVAL_BATCH` at a time (the split may be a large memmap)."""
    for i in range(0, len(split), _EVAL_BATCH):
        yield split.feeds(np.arange(i, min(i + _EVAL_BATCH, len(split))), pre)


class _Dygraph:
    """The trained model called on named inputs, returning every output by the interface's name (float32)."""

    def __init__(self, paddle: Any, net: Any, call: models.Call, desc: iospec.IO, logits_output: str, where: str):
        self.paddle, self.net, self.call, self.desc = paddle, net, call, desc
        self.logits_output, self.where, self.rule = logits_output, where, None

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.paddle.no_grad():
            out = self.call(self.net, {k: self.paddle.to_tensor(v) for k, v in feeds.items()})
        if self.rule is None:
            self.rule = models.outputs(out, self.logits_output, self.where)
            if list(self.rule.names) != [t.name for t in self.desc.outputs]:
                raise InputError(f"{self.where}: the model returns {', '.join(self.rule.names)}, the train "
                                 f"manifest lists {', '.join(t.name for t in self.desc.outputs)}")
        return {k: v.numpy() for k, v in self.rule.named(out).items()}


def _save_program(paddle: Any, net: Any, desc: iospec.IO, order: tuple[str, ...], prefix: Path) -> None:
    """jit.save with one named InputSpec per input, in forward's parameter order (dynamic batch, and the
    dynamic axes the interface has): PIR `model.json` by default, `model.pdmodel` when FLAGS_enable_pir_api=0
    (the child)."""
    specs = [paddle.static.InputSpec(list(t.shape), t.dtype, t.name) for t in (desc.input(n) for n in order)]
    static = paddle.jit.to_static(net, input_spec=specs, full_graph=True)
    with warnings.catch_warnings():  # "Found 'dict' in given outputs ... sorted by key": iospec already says so
        warnings.filterwarnings("ignore", message="Found 'dict' in given outputs")
        paddle.jit.save(static, str(prefix))
    # A pickle Paddle Inference does not need (jit.save writes it for legacy programs).
    prefix.with_name(prefix.name + ".pdiparams.info").unlink(missing_ok=True)


def _program_io(desc: iospec.IO, inputs: list[str], outputs: list[str], what: str) -> iospec.IO:
    """The interface under a saved program's names: inputs keep their InputSpec names (in whatever order the
    program lists them), outputs are named by Paddle (`fetch_name_<i>`, or `linear_2.tmp_1` in a legacy
    program) in the order the model returns them, which is the interface's."""
    if sorted(inputs) != sorted(t.name for t in desc.inputs):
        raise PipeError(f"{what} takes inputs {', '.join(inputs)}, the interface lists "
                        f"{', '.join(t.name for t in desc.inputs)}")
    return desc.with_program_names([t.name for t in desc.inputs], list(outputs), what)


def _predictor(paddle: Any, model: Path, params: Path, threads: int) -> Any:
    c = paddle.inference.Config(str(model), str(params))
    if not c.onednn_enabled():
        c.enable_onednn()
    c.set_cpu_math_library_num_threads(threads)
    c.disable_glog_info()  # else every IR pass prints a line on stderr
    return paddle.inference.create_predictor(c)


def _reduced_precision(paddle: Any, d: Path, prog: iospec.IO, test: data_mod.Split, pre: dict[str, Any],
                       fp32: dict[str, np.ndarray], y: np.ndarray, x1: dict[str, np.ndarray], fp32_latency: float,
                       threads: int, task: Any, info: tasks.Info) -> dict[str, Any]:
    """`--precision bf16`: the same program under oneDNN bf16 kernels (fp16 on a GPU), measured on the
    test split against the fp32 predictor. Hardware without the kernels gets a notice, not a crash:
    the export stays fp32 and the manifest says why."""
    gpu = runtime.gpu_count(paddle) > 0
    precision = "fp16" if gpu else "bf16"
    reason = "" if gpu else runtime.bf16_unsupported()
    if reason:
        print(f"note: --precision bf16: {reason}; exported fp32 only", file=sys.stderr)
        return {"precision": precision, "supported": False, "reason": reason}
    c = paddle.inference.Config(str(d / "model.json"), str(d / "model.pdiparams"))
    if gpu:  # not run here: no machine of ours has a GPU
        c.enable_use_gpu(256, 0, paddle.inference.PrecisionType.Half)
    else:
        c.enable_onednn()
        c.enable_onednn_bfloat16()
        c.set_cpu_math_library_num_threads(threads)
    c.disable_glog_info()
    pred = paddle.inference.create_predictor(c)
    got = tasks.concat([_predict(pred, prog, xb) for xb in _batches(test, pre)])
    latency = _latency_ms(pred, prog, x1)
    metric = task.monitor
    out = {"precision": precision, "supported": True, "device": "gpu" if gpu else "cpu", "metric": metric,
           "accuracy": task.metrics_of(got, y, info)[metric], "fp32_accuracy": task.metrics_of(fp32, y, info)[metric],
           **tasks.fidelity(task, got, fp32, info),
           "max_abs_diff": max(float(np.abs(got[k].astype(np.float64) - fp32[k]).max()) for k in got),
           "latency_ms_p50_bs1": latency,
           "fp32_latency_ms_p50_bs1": fp32_latency, "speedup_bs1": fp32_latency / latency}
    agree = f", top-1 agreement {out['top1_agreement']:.2%}" if "top1_agreement" in out else ""
    print(f"{precision}: {'accuracy' if metric == 'acc' else metric} {out['accuracy']:.2%} (fp32 {out['fp32_accuracy']:.2%}){agree}, "
          f"max|diff| {out['max_abs_diff']:.3g}, p50 batch 1 {latency:.3f} ms "
          f"(fp32 {fp32_latency:.3f} ms)")
    return out


def _predict(pred: Any, prog: iospec.IO, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of a Paddle Inference predictor by the interface's (public) name, fed by name."""
    for t in prog.inputs:
        pred.get_input_handle(t.name).copy_from_cpu(np.ascontiguousarray(feeds[t.public]))
    pred.run()
    return {t.public: pred.get_output_handle(t.name).copy_to_cpu() for t in prog.outputs}


def _parity_gate(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], ecfg: ExportConfig, what: str,
                 desc: iospec.IO) -> dict[str, Any]:
    """Every output within export.parity_tol x its own max|value| of the trained model's; the top-level
    numbers are the logits output's, `parity_outputs` has each output's."""
    per: dict[str, dict[str, float]] = {}
    for t in desc.outputs:
        name = t.public
        r, g = ref[name], got[name]
        if g.shape != r.shape:
            raise ParityError(f"parity gate: {what} returned shape {list(g.shape)} for output {name!r}, the trained "
                              f"model {list(r.shape)}; nothing written")
        diff = float(np.abs(g.astype(np.float64) - r).max()) if r.size else 0.0
        peak = float(np.abs(r).max()) if r.size else 0.0
        bound = ecfg.parity_tol * peak
        if not diff <= bound:  # `not <=` also catches NaN
            raise ParityError(f"parity gate: {what} vs trained model on output {name!r}: max|diff| {diff:.3g} > "
                              f"export.parity_tol {ecfg.parity_tol:g} x max|{name}| {peak:.3g} = {bound:.3g} on "
                              f"{len(r)} test samples; nothing written")
        per[name] = {"max_abs_diff": diff, "max_abs": peak, "rel": diff / peak if peak else 0.0}
    top = per[desc.main().public]
    return {"parity_max_abs_diff": top["max_abs_diff"], "parity_max_abs_logit": top["max_abs"],
            "parity_rel": top["rel"], "parity_tol": ecfg.parity_tol,
            "parity_samples": int(len(ref[desc.main().public])), "parity_outputs": per}


def _latency_ms(pred: Any, prog: iospec.IO, x1: dict[str, np.ndarray]) -> float:
    """p50 of copy-in + run + copy-out at batch 1: what a server pays per request."""
    ins = [(pred.get_input_handle(t.name), np.ascontiguousarray(x1[t.public])) for t in prog.inputs]
    outs = [pred.get_output_handle(t.name) for t in prog.outputs]
    times = []
    for i in range(_WARMUP + _TIMED):
        t0 = time.perf_counter()
        for h, a in ins:
            h.copy_from_cpu(a)
        pred.run()
        for h in outs:
            h.copy_to_cpu()
        if i >= _WARMUP:
            times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _write_preprocess(path: Path, prog: iospec.IO, pre: dict[str, Any]) -> None:
    """What a client needs to feed the program: every input and output (public name, the program's where it
    differs, dtype, shape, role), the labels and the preprocessing."""
    doc = {
        "inputs": [{k: v for k, v in t.to_dict().items() if k != "role"} for t in prog.inputs],
        "outputs": [t.to_dict() for t in prog.outputs],
        "kind": pre["kind"], "labels": prog.extra["labels"],
    }
    if pre["kind"] == "text":
        doc.update({k: pre[k] for k in ("tokenizer", "max_len", "pad_id", "unk_id", "vocab_file", "vocab_size")})
    elif pre["kind"] == "inputs":
        doc["per_input"] = pre["inputs"]
    else:
        doc.update({k: pre[k] for k in ("layout", "scale", "mean", "std")})
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def _check_file_set(d: Path, onnx: bool, pre: dict[str, Any], legacy: bool) -> None:
    """Ship exactly the allowlist: no `.pdiparams.info`, nothing else Paddle may start writing."""
    found = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    want = (_SHIPPED | (_LEGACY if legacy else set()) | ({"model.onnx"} if onnx else set())
            | ({pre["vocab_file"]} if pre["kind"] == "text" else set()))
    if found != want:
        extra, missing = sorted(found - want), sorted(want - found)
        raise PipeError(f"export wrote an unexpected file set (extra {extra}, missing {missing})")


# ------------------------------------------------------------------ legacy program (child process)


def _export_legacy(src: artifacts.Artifact, model: dict[str, Any], desc: iospec.IO, order: tuple[str, ...],
                   dest: Path, threads: int) -> str | None:
    """FLAGS_enable_pir_api=0 only takes effect if set before paddle is imported: a child process.

    Returns None, or why Paddle could not write a legacy program for this model (then `legacy/` is
    left out and only PaddleSlim's int8 route is unavailable; e.g. nn.GRU fails in legacy to_static
    with `ValueError: Unknown place type: Place(undefined:0)` in Paddle 3.3.1)."""
    dest.mkdir()
    spec = {"weights": str(src.file("model.safetensors").resolve()),
            "sha256": src.manifest["files"]["model.safetensors"]["sha256"],
            "model": model, "interface": desc.to_interface(), "order": list(order),
            "prefix": str((dest / "model").resolve())}
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # a module:factory model imports as here
    try:
        proc = subprocess.run([sys.executable, "-m", "stages.export", "--legacy", json.dumps(spec)],
                              capture_output=True, text=True, env=env, timeout=_LEGACY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise PipeError(f"legacy export did not finish within {_LEGACY_TIMEOUT} s") from None
    if proc.returncode == 2:  # the weights changed under us: not a model limitation
        raise InputError(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        lines = [" ".join(ln.split()) for ln in proc.stderr.splitlines() if ln.strip()]
        shutil.rmtree(dest, ignore_errors=True)
        return f"legacy to_static failed: {lines[-1] if lines else 'no output'}"[:300]
    if not (dest / "model.pdmodel").is_file():
        raise PipeError("legacy export wrote no model.pdmodel (FLAGS_enable_pir_api=0 had no effect)")
    return None


def _legacy_main(spec: dict[str, Any]) -> int:
    """Child: rebuild the model and jit.save it as a legacy program (paddle imported with PIR off)."""
    weights = Path(spec["weights"])
    if artifacts.sha256_file(weights) != spec["sha256"]:  # the file may have changed since the parent verified it
        print(f"{weights}: sha256 mismatch", file=sys.stderr)
        return 2
    paddle = runtime.import_paddle(1)
    paddle.set_device("cpu")
    shapes = {k: tuple(v) for k, v in spec["model"]["input_shapes"].items()}
    net = models.build(spec["model"]["name"], spec["model"]["num_classes"], next(iter(shapes.values())),
                       spec["model"]["vocab_size"], input_shapes=shapes)
    net.set_state_dict(runtime.load_safetensors(paddle, weights))
    net.eval()
    _save_program(paddle, net, iospec.IO.from_interface(spec["interface"]), tuple(spec["order"]), Path(spec["prefix"]))
    return 0


# ------------------------------------------------------------------ ONNX (child process)


def _export_onnx(d: Path, desc: iospec.IO, ref: dict[str, np.ndarray], x: dict[str, np.ndarray],
                 ecfg: ExportConfig, threads: int) -> dict[str, Any]:
    """paddle2onnx of the PIR program just written, then the parity gate in onnxruntime on every output, fed
    by name (ONNX from the PIR program keeps the InputSpec names; outputs come in the program's order)."""
    p2o.in_child(d / "model.json", d / "model.pdiparams", d / "model.onnx", _ONNX_OPSET, threads)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 3
    sess = ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])
    inputs, outputs = [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]
    onnx_io = _program_io(desc, inputs, outputs, "model.onnx")
    got = sess.run([t.name for t in onnx_io.outputs],
                   {t.name: np.ascontiguousarray(x[t.public]) for t in onnx_io.inputs})
    named = {t.public: g for t, g in zip(onnx_io.outputs, got)}
    return {**_parity_gate(ref, named, ecfg, "onnxruntime (model.onnx)", desc),
            "inputs": [t.name for t in onnx_io.inputs], "outputs": [t.name for t in onnx_io.outputs]}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--legacy":
        sys.exit(_legacy_main(json.loads(sys.argv[2])))
    print("usage: python -m stages.export --legacy SPEC_JSON (internal; use `pipe export`)", file=sys.stderr)
    sys.exit(2)
