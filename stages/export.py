"""pipe export: the trained model in the Paddle Inference format, parity-checked, as `<run>/export/`.

    pipe export runs/exp1/train
    pipe export runs/exp1/train --onnx
    pipe export runs/exp1/train --set export.parity_tol=1e-5 --out runs/exp1/export-strict

Reads a verified `train/` artifact: `model.safetensors`, the resolved config (model, data) and the
interface (input shape, labels, preprocessing). Writes `export/`:
`model.json` + `model.pdiparams` (PIR program, what later stages serve), `preprocess.yaml` (input
name/shape, layout, scale, mean, std, labels), `legacy/model.pdmodel` + `legacy/model.pdiparams` (the
pre-PIR program PaddleSlim's int8 quantization needs) and `manifest.json`. No `.pdiparams.info` (a
pickle Paddle Inference does not need) is shipped.

Parity gate (exit 5, nothing written): a Paddle Inference predictor (oneDNN) on the first
`export.parity_samples` test samples must match the dygraph model, max|diff| <= `export.parity_tol` *
max|logit|; the legacy program is held to the same bound. The saved output cannot be named `logits`
(PIR names unnamed fetches `fetch_name_<i>`; `Value.name` is settable only on persistable values):
the interface records the predictor's real names with the public one as `alias`.

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
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from pipeline import artifacts, config as config_mod, data as data_mod, models, runtime
from pipeline.config import ExportConfig, RunConfig
from pipeline.errors import InputError, ParityError, PipeError

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
    iface = src.manifest["interface"]
    shape, labels, pre = _read_interface(src)
    ds = data_mod.load(train_cfg.data)
    _check_data(src, ds, shape, labels)
    threads = runtime.threads_per_process(1)
    paddle = runtime.import_paddle(threads)
    paddle.set_device("cpu")
    model = {"name": train_cfg.model.name, "num_classes": len(labels), "shape": _model_shape(shape, pre),
             "vocab_size": pre.get("vocab_size"), "dtype": iface["inputs"][0]["dtype"]}
    net = _load_model(paddle, src, model)
    test, y = ds.test, np.asarray(ds.test.y[ds.test.idx])
    n = min(cfg.export.parity_samples, len(test))
    x_par = data_mod.prepare(np.asarray(test.x[test.idx[:n]]), pre)
    # Reference logits first: to_static converts `net.forward` in place.
    ref = np.concatenate([_dygraph_logits(paddle, net, xb) for xb in _batches(test, pre)])
    ref_par = _dygraph_logits(paddle, net, x_par)
    in_name = iface["inputs"][0]["name"]
    doc = dataclasses.replace(train_cfg, export=cfg.export).to_dict()
    with artifacts.write_stage(out_dir, "export", doc, src) as w:
        _save_program(paddle, net, in_name, shape, model["dtype"], w.dir / "model")
        pred = _predictor(paddle, w.dir / "model.json", w.dir / "model.pdiparams", threads)
        parity = _parity_gate(ref_par, _predict(pred, x_par), cfg.export, "predictor")
        got = np.concatenate([_predict(pred, xb) for xb in _batches(test, pre)])
        latency = _latency_ms(pred, x_par[:1])
        legacy_error = _export_legacy(src, model, shape, in_name, w.dir / "legacy", threads)
        legacy_parity = {"parity_max_abs_diff": None, "parity_rel": None}
        if legacy_error is None:
            legacy = _predictor(paddle, w.dir / "legacy/model.pdmodel", w.dir / "legacy/model.pdiparams", threads)
            legacy_parity = _parity_gate(ref_par, _predict(legacy, x_par), cfg.export, "legacy program")
        io = {"inputs": pred.get_input_names(), "outputs": pred.get_output_names()}
        w.interface = _with_io_names(iface, io)
        _write_preprocess(w.dir / "preprocess.yaml", w.interface, pre)
        if pre["kind"] == "text":  # the tokenizer travels with the model
            shutil.copyfile(src.file(pre["vocab_file"]), w.dir / pre["vocab_file"])
        onnx_parity = _export_onnx(w.dir, ref_par, x_par, cfg.export, threads) if onnx else None
        reduced = (_reduced_precision(paddle, w.dir, test, pre, got, y, x_par[:1], latency, threads)
                   if cfg.export.precision != "fp32" else None)
        _check_file_set(w.dir, onnx, pre, legacy_error is None)
        w.metrics = {
            **parity,
            "test_acc": float((got.argmax(1) == y).mean()),
            "dygraph_test_acc": float((ref.argmax(1) == y).mean()),
            "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
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
            "inputs": legacy.get_input_names(), "outputs": legacy.get_output_names()} if legacy_error is None
            else {"available": False, "reason": legacy_error}}
        if onnx_parity is not None:
            w.extra["onnx"] = {"format": "onnx", "model": "model.onnx", "opset": _ONNX_OPSET,
                               "inputs": onnx_parity["inputs"], "outputs": onnx_parity["outputs"]}
    return out_dir


def _read_interface(src: artifacts.Artifact) -> tuple[list[int], list[str], dict[str, Any]]:
    """(input shape with -1 batch, labels, preprocessing) from the train manifest, checked."""
    where = src.path / artifacts.MANIFEST
    iface = src.manifest["interface"]
    try:
        (inp,), (out,) = iface["inputs"], iface["outputs"]
        shape = [int(d) for d in inp["shape"]]
        labels, pre = [str(s) for s in iface["labels"]], iface["preprocessing"]
        named = all(isinstance(io["name"], str) and io["name"] for io in (inp, out)) and isinstance(pre, dict)
    except (KeyError, TypeError, ValueError):
        named = False
    if not named:
        raise InputError(f"{where}: interface needs one named input and output, labels and preprocessing")
    if pre.get("kind") == "text":
        if shape != [-1, -1] or inp.get("dtype") != "int64" or not isinstance(pre.get("vocab_size"), int):
            raise InputError(f"{where}: a text interface takes int64 ids of shape [-1, -1] and a vocab_size")
        return shape, labels, pre
    if len(shape) != 4 or shape[0] != -1 or min(shape[1:]) < 1:
        raise InputError(f"{where}: interface input must be NCHW with a dynamic batch, got {shape}")
    return shape, labels, pre


def _check_data(src: artifacts.Artifact, ds: data_mod.Dataset, shape: list[int], labels: list[str]) -> None:
    """The test split is re-read from `data.source`: it must still be the data the model was trained on."""
    where = src.path / artifacts.MANIFEST
    source = src.manifest["config"]["data"]["source"]
    now = ds.interface()["inputs"][0]["shape"]
    if now != shape or list(ds.labels) != labels:
        raise InputError(f"{where}: trained on {shape[1:]} inputs with {len(labels)} labels, but data.source "
                         f"{source!r} now gives {now[1:]} with {len(ds.labels)}; the data changed")
    n_test = (src.manifest["metrics"].get("samples") or {}).get("test")
    if n_test is not None and n_test != len(ds.test):
        raise InputError(f"{where}: the test split had {n_test} samples, data.source {source!r} now gives "
                         f"{len(ds.test)}; the data changed")


def _model_shape(shape: list[int], pre: dict[str, Any]) -> list[int]:
    """The per-sample shape the model is built for (text: the training max_len, not the dynamic -1)."""
    return [int(pre["max_len"])] if pre["kind"] == "text" else shape[1:]


def _load_model(paddle: Any, src: artifacts.Artifact, model: dict[str, Any]) -> Any:
    path = src.file("model.safetensors")
    name = model["name"]
    net = models.build(name, model["num_classes"], tuple(model["shape"]), model["vocab_size"])
    state = runtime.load_safetensors(paddle, path)
    want = {k: list(v.shape) for k, v in net.state_dict().items()}
    have = {k: list(v.shape) for k, v in state.items()}
    if want != have:
        bad = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        raise InputError(f"{path}: weights do not fit model {name!r} (first mismatch: {bad[0]})")
    net.set_state_dict(state)
    net.eval()
    return net


def _batches(split: data_mod.Split, pre: dict[str, Any]) -> Iterator[np.ndarray]:
    """Prepared model inputs of a split, `_EVAL_BATCH` at a time (the split may be a large memmap)."""
    for i in range(0, len(split), _EVAL_BATCH):
        yield data_mod.prepare(np.asarray(split.x[split.idx[i:i + _EVAL_BATCH]]), pre)


def _dygraph_logits(paddle: Any, net: Any, x: np.ndarray) -> np.ndarray:
    with paddle.no_grad():
        return net(paddle.to_tensor(x)).astype("float32").numpy()


def _save_program(paddle: Any, net: Any, in_name: str, shape: list[int], dtype: str, prefix: Path) -> None:
    """jit.save: PIR `model.json` by default, `model.pdmodel` when FLAGS_enable_pir_api=0 (the child)."""
    spec = paddle.static.InputSpec(list(shape), dtype, in_name)
    static = paddle.jit.to_static(net, input_spec=[spec], full_graph=True)
    paddle.jit.save(static, str(prefix))
    # A pickle Paddle Inference does not need (jit.save writes it for legacy programs).
    prefix.with_name(prefix.name + ".pdiparams.info").unlink(missing_ok=True)


def _predictor(paddle: Any, model: Path, params: Path, threads: int) -> Any:
    c = paddle.inference.Config(str(model), str(params))
    if not c.onednn_enabled():
        c.enable_onednn()
    c.set_cpu_math_library_num_threads(threads)
    c.disable_glog_info()  # else every IR pass prints a line on stderr
    return paddle.inference.create_predictor(c)


def _reduced_precision(paddle: Any, d: Path, test: data_mod.Split, pre: dict[str, Any], fp32: np.ndarray,
                       y: np.ndarray, x1: np.ndarray, fp32_latency: float, threads: int) -> dict[str, Any]:
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
    got = np.concatenate([_predict(pred, xb) for xb in _batches(test, pre)])
    latency = _latency_ms(pred, x1)
    out = {"precision": precision, "supported": True, "device": "gpu" if gpu else "cpu",
           "accuracy": float((got.argmax(1) == y).mean()), "fp32_accuracy": float((fp32.argmax(1) == y).mean()),
           "top1_agreement": float((got.argmax(1) == fp32.argmax(1)).mean()),
           "max_abs_diff": float(np.abs(got - fp32).max()), "latency_ms_p50_bs1": latency,
           "fp32_latency_ms_p50_bs1": fp32_latency, "speedup_bs1": fp32_latency / latency}
    print(f"{precision}: accuracy {out['accuracy']:.2%} (fp32 {out['fp32_accuracy']:.2%}), top-1 agreement "
          f"{out['top1_agreement']:.2%}, max|diff| {out['max_abs_diff']:.3g}, p50 batch 1 {latency:.3f} ms "
          f"(fp32 {fp32_latency:.3f} ms)")
    return out


def _predict(pred: Any, x: np.ndarray) -> np.ndarray:
    (name_in,), names_out = pred.get_input_names(), pred.get_output_names()
    if len(names_out) != 1:
        raise PipeError(f"the exported program has {len(names_out)} outputs, expected 1 (logits)")
    h_in, h_out = pred.get_input_handle(name_in), pred.get_output_handle(names_out[0])
    h_in.copy_from_cpu(np.ascontiguousarray(x))
    pred.run()
    return h_out.copy_to_cpu()


def _parity_gate(ref: np.ndarray, got: np.ndarray, ecfg: ExportConfig, what: str) -> dict[str, Any]:
    if got.shape != ref.shape:
        raise ParityError(f"parity gate: {what} returned shape {list(got.shape)}, the trained model "
                        f"{list(ref.shape)}; nothing written")
    diff = float(np.abs(got.astype(np.float64) - ref).max())
    peak = float(np.abs(ref).max())
    bound = ecfg.parity_tol * peak
    if not diff <= bound:  # `not <=` also catches NaN
        raise ParityError(f"parity gate: {what} vs trained model max|diff| {diff:.3g} > export.parity_tol "
                        f"{ecfg.parity_tol:g} x max|logit| {peak:.3g} = {bound:.3g} on {len(ref)} test samples; "
                        "nothing written")
    return {"parity_max_abs_diff": diff, "parity_max_abs_logit": peak,
            "parity_rel": diff / peak if peak else 0.0, "parity_tol": ecfg.parity_tol,
            "parity_samples": int(len(ref))}


def _latency_ms(pred: Any, x1: np.ndarray) -> float:
    """p50 of copy-in + run + copy-out at batch 1: what a server pays per request."""
    h_in = pred.get_input_handle(pred.get_input_names()[0])
    h_out = pred.get_output_handle(pred.get_output_names()[0])
    times = []
    for i in range(_WARMUP + _TIMED):
        t0 = time.perf_counter()
        h_in.copy_from_cpu(x1)
        pred.run()
        h_out.copy_to_cpu()
        if i >= _WARMUP:
            times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _with_io_names(iface: dict[str, Any], io: dict[str, list[str]]) -> dict[str, Any]:
    """The train interface with the predictor's real io names; the interface name stays as `alias`."""
    out = dict(iface)
    for key, names in io.items():
        specs = iface[key]
        if len(names) != len(specs):
            raise PipeError(f"the exported program has {len(names)} {key}, the interface lists {len(specs)}")
        out[key] = [{**s, "name": real, "alias": s["name"]} for s, real in zip(specs, names)]
    return out


def _write_preprocess(path: Path, iface: dict[str, Any], pre: dict[str, Any]) -> None:
    inp, out = iface["inputs"][0], iface["outputs"][0]
    doc = {
        "input": {"name": inp["name"], "dtype": inp["dtype"], "shape": inp["shape"]},
        "output": {"name": out["name"], "alias": out["alias"], "shape": out["shape"]},
        "kind": pre["kind"], "labels": iface["labels"],
    }
    if pre["kind"] == "text":
        doc.update({k: pre[k] for k in ("tokenizer", "max_len", "pad_id", "unk_id", "vocab_file", "vocab_size")})
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


def _export_legacy(src: artifacts.Artifact, model: dict[str, Any], shape: list[int], in_name: str,
                   dest: Path, threads: int) -> str | None:
    """FLAGS_enable_pir_api=0 only takes effect if set before paddle is imported: a child process.

    Returns None, or why Paddle could not write a legacy program for this model (then `legacy/` is
    left out and only PaddleSlim's int8 route is unavailable; e.g. nn.GRU fails in legacy to_static
    with `ValueError: Unknown place type: Place(undefined:0)` in Paddle 3.3.1)."""
    dest.mkdir()
    spec = {"weights": str(src.file("model.safetensors").resolve()),
            "sha256": src.manifest["files"]["model.safetensors"]["sha256"],
            "model": model, "shape": shape, "input": in_name,
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
    m = spec["model"]
    net = models.build(m["name"], m["num_classes"], tuple(m["shape"]), m["vocab_size"])
    net.set_state_dict(runtime.load_safetensors(paddle, weights))
    net.eval()
    _save_program(paddle, net, spec["input"], spec["shape"], m["dtype"], Path(spec["prefix"]))
    return 0


# ------------------------------------------------------------------ ONNX (child process)


def _export_onnx(d: Path, ref: np.ndarray, x: np.ndarray, ecfg: ExportConfig, threads: int) -> dict[str, Any]:
    """paddle2onnx of the PIR program just written, then the parity gate in onnxruntime."""
    spec = {"model": str((d / "model.json").resolve()), "params": str((d / "model.pdiparams").resolve()),
            "dest": str((d / "model.onnx").resolve())}
    env = dict(os.environ, FLAGS_enable_pir_api="1", GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="pipe-export-") as cwd:  # nothing the converter drops survives
        try:
            proc = subprocess.run([sys.executable, "-m", "stages.export", "--onnx", json.dumps(spec)],
                                  capture_output=True, text=True, env=env, cwd=cwd, timeout=_LEGACY_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise PipeError(f"paddle2onnx did not finish within {_LEGACY_TIMEOUT} s") from None
    if proc.returncode != 0 or not (d / "model.onnx").is_file():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise PipeError(f"paddle2onnx failed (exit {proc.returncode}): {lines[-1] if lines else 'no model.onnx'}")
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 3
    sess = ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])
    inputs, outputs = [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]
    if len(inputs) != 1 or len(outputs) != 1:
        raise PipeError(f"model.onnx has {len(inputs)} inputs and {len(outputs)} outputs, expected 1 and 1")
    got = sess.run(outputs, {inputs[0]: np.ascontiguousarray(x)})[0]
    return {**_parity_gate(ref, got, ecfg, "onnxruntime (model.onnx)"), "inputs": inputs, "outputs": outputs}


def _onnx_main(spec: dict[str, Any]) -> int:
    """Child: paddle2onnx without its optimizer pass (its default, polygraphy, sets
    POLYGRAPHY_AUTOINSTALL_DEPS=1, i.e. may pip-install at run time; onnxruntime optimizes anyway)."""
    runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import paddle2onnx

    paddle2onnx.export(spec["model"], spec["params"], spec["dest"], opset_version=_ONNX_OPSET,
                       enable_onnx_checker=True, optimize_tool="none")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--legacy":
        sys.exit(_legacy_main(json.loads(sys.argv[2])))
    if len(sys.argv) == 3 and sys.argv[1] == "--onnx":
        sys.exit(_onnx_main(json.loads(sys.argv[2])))
    print("usage: python -m stages.export --legacy|--onnx SPEC_JSON (internal; use `pipe export`)", file=sys.stderr)
    sys.exit(2)
