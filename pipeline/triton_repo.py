"""A package's Triton model repository (`pipe package` writes it unless --no-triton): the ONNX under the model's
public tensor names, parity-checked against the fp32 predictor, labels.txt, and config.pbtxt read off the ONNX.

    write(root, name, source, desc, served, labels, cfg, checks, y_refs, threads, logits) -> the manifest's record

`source` is the package stage's choice (its ONNX and variant, or the fp32 program for paddle2onnx); `cfg` the
package config (onnx_parity_tol, max_batch_size, max_wait_ms).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from pipeline import engines, iospec, p2o
from pipeline.errors import InputError, ParityError, PipeError
from pipeline.serving import spec as serving_spec


def write(root: Path, name: str, source: Any, desc: iospec.IO, served: iospec.IO, labels: list[str],
          cfg: Any, checks: list[dict[str, np.ndarray]], y_refs: list[dict[str, np.ndarray]],
          threads: int, logits: str) -> dict[str, Any]:
    """The Triton repository: its ONNX with every tensor under its public name, parity-checked on every
    output against the fp32 predictor (`y_refs`, by `desc`'s names), and config.pbtxt from the ONNX itself;
    labels.txt on the logits output (`logits`: its public name) of a task with logits only: Triton serves
    every task's raw outputs (its classification extension reads labels.txt), the rest is the client's."""
    (root / "1").mkdir(parents=True)
    onnx_path = root / "1" / "model.onnx"
    metrics: dict[str, Any] = {}
    if source.onnx is not None:
        shutil.copyfile(source.onnx, onnx_path)
        origin, precision = source.onnx_variant, source.onnx_precision
    else:
        paddle2onnx(source.fp32_program, source.fp32_params, onnx_path, threads)
        origin, precision = "paddle2onnx", "fp32"
    sess = _onnx_session(onnx_path, threads)
    # the ONNX's own names, by name (ONNX made from the legacy program lists its inputs in reverse order)
    on = engines.names(SimpleNamespace(inputs=[i.name for i in sess.get_inputs()],
                                       outputs=[o.name for o in sess.get_outputs()]), desc, str(onnx_path))
    pairs = list(zip((*desc.inputs, *desc.outputs), (*served.inputs, *served.outputs)))
    renamed = _rename_io(onnx_path, {on[t.name]: s.public for t, s in pairs})
    if renamed:
        metrics["onnx_io_renamed"] = renamed
        sess = _onnx_session(onnx_path, threads)
    ort_in, ort_out, y_onnx = _run_onnx(sess, onnx_path, checks, desc, served)
    per: dict[str, dict[str, float]] = {}
    for t in desc.outputs:
        per[t.public] = {"max_abs_diff": max(float(np.abs(y[t.name].astype(np.float64) - ref[t.name]).max())
                                             for y, ref in zip(y_onnx, y_refs)),
                         "max_abs": max(float(np.abs(ref[t.name]).max()) for ref in y_refs)}
    head = per[logits or desc.main().public]  # the logits, else the first output
    metrics.update({"onnx_max_abs_diff": head["max_abs_diff"], "onnx_max_abs_logit": head["max_abs"],
                    "onnx_outputs": per, "onnx_source": origin, "onnx_precision": precision})
    if precision == "fp32":  # an int8 ONNX is measured against fp32 by compress, not held to parity
        for out_name, p in per.items():
            bound = cfg.onnx_parity_tol * p["max_abs"]
            if not p["max_abs_diff"] <= bound:  # `not <=` also catches NaN
                raise ParityError(f"onnx parity: onnxruntime ({origin}) vs Paddle fp32 predictor on output "
                                  f"{out_name!r} max|diff| {p['max_abs_diff']:.3g} > onnx_parity_tol "
                                  f"{cfg.onnx_parity_tol:g} x max|value| {p['max_abs']:.3g} = {bound:.3g} on "
                                  f"{sum(iospec.num_rows(f) for f in checks)} check samples; nothing written "
                                  "(or pass --no-triton)")
        metrics["onnx_parity_tol"] = cfg.onnx_parity_tol
    if logits:
        (root / serving_spec.TRITON_LABELS).write_text("".join(f"{lab}\n" for lab in labels), encoding="utf-8")
    (root / "config.pbtxt").write_text(config(name, ort_in, ort_out,
                                                      logits or None, cfg),
                                       encoding="utf-8")
    return {"model": name, "onnx_source": origin, "onnx_precision": precision, "repository": "triton",
            "metrics": metrics}


def _rename_io(path: Path, names: dict[str, str]) -> dict[str, str]:
    """Give the Triton copy of the ONNX the model's public input and output names (`names`: the ONNX's ->
    the public; a legacy program's output is e.g. `linear_0.tmp_1`, paddle2onnx's `fetch_name_0`), so one v2
    request, names included, works on `pipe serve` and on Triton alike. Returns {old: new} for what changed."""
    want = {old: new for old, new in names.items() if old != new}
    if not want:
        return {}
    import onnx

    model = onnx.load(str(path))
    g = model.graph
    taken = ({n for node in g.node for n in (*node.input, *node.output)} | {i.name for i in g.initializer}) - set(want)
    clash = {new: f"{new}__pipe_internal" for new in want.values() if new in taken}  # an inner tensor of that name
    mapping = {**clash, **want}
    for node in g.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for vi in (*g.input, *g.output, *g.value_info):
        vi.name = mapping.get(vi.name, vi.name)
    for init in g.initializer:
        init.name = mapping.get(init.name, init.name)
    onnx.save(model, str(path))
    return want


def paddle2onnx(program: Path, params: Path, dest: Path, threads: int) -> None:
    """paddle2onnx as every stage runs it (pipeline/p2o.py: a child process, repaired)."""
    import importlib.util

    for mod in ("paddle2onnx", "onnxruntime"):
        if importlib.util.find_spec(mod) is None:
            raise InputError(f"the Triton repository needs {mod} (pip install paddle2onnx onnxruntime), "
                             "or pass --no-triton")
    try:
        p2o.in_child(program, params, dest, 13, threads)
    except PipeError as e:
        raise PipeError(f"{e} (or pass --no-triton)") from None


def _onnx_session(path: Path, threads: int) -> Any:
    """The Triton copy on plain onnxruntime, as Triton's backend runs it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3  # unused-initializer warnings from paddle2onnx graphs
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _run_onnx(sess: Any, path: Path, checks: list[dict[str, np.ndarray]], desc: iospec.IO, served: iospec.IO
              ) -> tuple[list[Any], list[Any], list[dict[str, np.ndarray]]]:
    """The check batches on the Triton copy, fed and fetched by the public names (`_rename_io` gave it them):
    (its inputs and outputs in the served order, every output by `desc`'s names per batch). Each input's dims
    behind the batch must be the model's."""
    ins, outs = {i.name: i for i in sess.get_inputs()}, {o.name: o for o in sess.get_outputs()}
    if {t.public for t in served.inputs} != set(ins) or any(t.public not in outs for t in served.outputs):
        raise InputError(f"{path}: ONNX io names {list(ins)} -> {list(outs)} are not the model's "
                         f"{[t.public for t in served.inputs]} -> {[t.public for t in served.outputs]}")
    for t in served.inputs:
        want = [*t.shape[1:]]
        got = [d if isinstance(d, int) else -1 for d in ins[t.public].shape[1:]]
        if got != want:
            raise InputError(f"{path}: ONNX input {t.public!r} shape [N, {', '.join(map(str, got))}] does not match "
                             f"the model's [N, {', '.join(map(str, want))}]")
    fetch = [t.public for t in served.outputs]
    ys = [dict(zip((t.name for t in desc.outputs),
                   sess.run(fetch, {s.public: feeds[t.name] for t, s in zip(desc.inputs, served.inputs)})))
          for feeds in checks]
    return [ins[t.public] for t in served.inputs], [outs[t.public] for t in served.outputs], ys


_ONNX_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32"}


def config(name: str, ort_in: list[Any], ort_out: list[Any], logits: str | None, cfg: Any) -> str:
    """config.pbtxt for Triton's onnxruntime backend: an entry per tensor, named, typed and shaped as the ONNX
    declares it (the first dim is the batch: max_batch_size); labels.txt on the logits output (`logits`: its
    public name; None: a task without logits, no labels file)."""
    def dims(shape: list[Any]) -> str:
        return ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in shape[1:])

    def dtype(t: str) -> str:
        if t not in _ONNX_TYPES:
            raise InputError(f"ONNX tensor type {t} has no Triton mapping here")
        return _ONNX_TYPES[t]

    def entries(kind: str, tensors: list[Any]) -> str:
        body = ",\n".join(
            "  {\n"
            f'    name: "{t.name}"\n    data_type: {dtype(t.type)}\n    dims: [ {dims(t.shape)} ]\n'
            + ('    label_filename: "labels.txt"\n' if kind == "output" and t.name == logits else "")
            + "  }" for t in tensors)
        return f"{kind} [\n{body}\n]\n"

    delay_us = int(round(cfg.max_wait_ms * 1000))
    return (
        f'name: "{name}"\n'
        'backend: "onnxruntime"\n'
        f"max_batch_size: {cfg.max_batch_size}\n"
        + entries("input", ort_in) + entries("output", ort_out)
        + f"dynamic_batching {{\n  max_queue_delay_microseconds: {delay_us}\n}}\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
    )
