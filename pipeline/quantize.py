"""int8 post-training quantization of an export, for `pipe compress` (stages/compress.py): PaddleSlim on the
legacy program and paddle2onnx + onnxruntime on the PIR program. PaddleSlim and paddle2onnx run in child
processes of this module, which re-check the sha256 of every file they read (internal; use `pipe compress`):

    python -m pipeline.quantize --paddleslim|--onnx SPEC_JSON
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from pipeline import artifacts, engines as engines_mod, iospec, p2o, runtime
from pipeline.config import CompressConfig
from pipeline.engines import ort as ort_engine
from pipeline.errors import InputError, PipeError

_CHILD_TIMEOUT = 1800
QUANT_OPS = ["conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2"]
_ORT_MATMUL_OPS = ("MatMul", "Gemm")
_ORT_QUANTIZABLE = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # the compute layers output_layers stops at
# onnxruntime's closest calibrator to each PaddleSlim algorithm (it has no MSE search).
ORT_CALIB = {
    "avg": ("MinMax", {"CalibMovingAverage": True}),
    "KL": ("Entropy", {}),
    "hist": ("Percentile", {"CalibPercentile": 99.99}),  # PaddleSlim's hist_percent 0.9999
    "mse": ("MinMax", {}),
}


KEEP_OUTPUTS_RULE = ("the task keeps the layers producing its outputs in fp32 (int8_fp32_outputs): on every path back "
                     "from a model output, the first quantizable op")


def output_layers(nodes: list[tuple[str, str, list[str], list[str]]], outputs: list[str], quantizable: set[str]) -> list[str]:
    """The layers that produce the model's outputs: walking back from each output through the graph's
    nodes (name, op type, inputs, outputs), the first node of a `quantizable` type on every path (a head's
    last conv, not the convs before it). Names in graph order."""
    producer = {o: i for i, (_, _, _, outs) in enumerate(nodes) for o in outs}
    found, seen, todo = set(), set(), [producer[o] for o in outputs if o in producer]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if nodes[i][1] in quantizable:
            found.add(i)
        else:
            todo += [producer[x] for x in nodes[i][2] if x in producer]
    return [nodes[i][0] for i in sorted(found)]


def int8_paddle(src: artifacts.Artifact, io: dict[str, Any], calib: list[dict[str, np.ndarray]], ccfg: CompressConfig,
                dest: Path, threads: int, keep_outputs: bool = False) -> list[str]:
    """PaddleSlim reads only the legacy program, and only with FLAGS_enable_pir_api=0 set before paddle
    is imported: a child process. The calibration batches (`calib`: each a feed dict by the interface's input
    names; batches may differ in shape, e.g. OCR lines of several widths) go through its stdin as raw bytes,
    batch after batch and input after input (float32 images, int64 token ids: PaddleSlim keeps integer feeds
    integer), each under its name in the legacy program. `keep_outputs`: the layers producing the outputs
    stay fp32 (`output_layers`); returns their weights' names."""
    files = {"model.pdmodel": io["legacy_model"], "model.pdiparams": io["legacy_params"]}
    legacy = dict(zip((t.name for t in io["desc"].inputs), io["legacy_inputs"]))
    spec = {"model_dir": str(src.file(io["legacy_model"]).parent.resolve()),
            "files": {name: {"path": str(src.file(rel).resolve()), "sha256": src.manifest["files"][rel]["sha256"]}
                      for name, rel in files.items()},
            "dest": str(dest.resolve()), "algo": ccfg.algo, "keep_outputs": bool(keep_outputs),
            "batches": [[{"name": legacy[k], "dtype": a.dtype.name, "shape": list(a.shape)} for k, a in b.items()]
                        for b in calib]}
    raw = b"".join(np.ascontiguousarray(a).tobytes() for b in calib for a in b.values())
    out = _child("--paddleslim", spec, raw, {"FLAGS_enable_pir_api": "0"}, threads, "PaddleSlim quantization")
    if not (dest / "model.pdmodel").is_file():
        raise PipeError("PaddleSlim wrote no model.pdmodel")
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("fp32_layers ")]
    return json.loads(lines[-1][len("fp32_layers "):]) if lines else []


def to_onnx(src: artifacts.Artifact, dest: Path, threads: int) -> None:
    """paddle2onnx of the PIR program. A child: on a model it cannot convert it aborts the process."""
    spec = {"files": {name: {"path": str(src.file(name).resolve()), "sha256": src.manifest["files"][name]["sha256"]}
                      for name in ("model.json", "model.pdiparams")},
            "dest": str((dest / "model.onnx").resolve())}
    dest.mkdir()
    _child("--onnx", spec, b"", {"FLAGS_enable_pir_api": "1"}, threads, "paddle2onnx")
    if not (dest / "model.onnx").is_file():
        raise PipeError("paddle2onnx wrote no model.onnx")


def int8_onnx(model: Path, io: dict[str, Any], calib: list[dict[str, np.ndarray]], ccfg: CompressConfig, dest: Path,
              threads: int, keep_outputs: bool = False) -> list[str]:
    """onnxruntime QDQ int8 of the fp32 ONNX `model`, calibrated on the batches `calib` (feed dicts by the
    interface's input names) keyed by that file's own input names (`engines.names`: by name, whatever order
    the file lists them in). The int8 file must take its
    inputs in the same dtypes (integer inputs are never quantized). `keep_outputs`: the nodes producing the
    outputs stay fp32 (`output_layers`, onnxruntime's nodes_to_exclude); returns their names."""
    import onnx
    import onnxruntime as ort
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ort.set_default_logger_severity(3)  # else every optimizer session warns about unused initializers
    desc = io["desc"]
    on = engines_mod.names(ort_engine.load([model], threads=threads), desc, str(model))
    batches = [{on[k]: a for k, a in b.items()} for b in calib]
    method, extra = ORT_CALIB[ccfg.algo]
    op_types, _ = ort_op_types(desc)
    dest.mkdir()
    with tempfile.TemporaryDirectory(prefix="pipe-compress-") as tmp:
        pre = Path(tmp) / "pre.onnx"
        # auto_merge: without it symbolic shape inference gave up on paddle2onnx's conv biases
        # (reshaped to [1,-1,1,1] through an Identity; mobilenet_v3_small's squeeze-excite blocks) with
        # "Incomplete symbolic shape inference". On failure onnxruntime drops sym_shape_infer_temp.onnx
        # into the working directory: run it from the temp dir. Inputs with a dynamic axis beyond the batch
        # (text ids [-1, -1]) skip it: on paddle2onnx's sequence-length arithmetic (Shape -> Slice ->
        # Range/Expand) it fails with a bare AssertionError in `_get_value`; onnx's own shape inference is
        # enough for quantize_static there.
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            quant_pre_process(str(Path(cwd, model)), str(pre), auto_merge=True,
                              skip_symbolic_shape=any(-1 in t.shape[1:] for t in desc.inputs))
        finally:
            os.chdir(cwd)
        kept: list[str] = []
        if keep_outputs:
            g = onnx.load(str(pre), load_external_data=False).graph
            kept = output_layers([(n.name, n.op_type, list(n.input), list(n.output)) for n in g.node],
                                 [o.name for o in g.output], set(_ORT_QUANTIZABLE))
        # reduce_range (7-bit weights): a pair of u8 x s7 products fits in int16, so the model computes the
        # same on CPUs without VNNI, where onnxruntime's u8 x s8 kernels saturate (pipeline/cpu.py). Measured
        # on digits (1,797 samples): agreement with fp32 0.996 with it on an AVX2-only CPU (0.972 without)
        # and 0.996 on an AVX-512 VNNI CPU (0.998 without), at the same speed on both.
        ranges = Path(tmp) / "ranges.json"
        with _ort_quiet():
            _ort_ranges(pre, batches, op_types, method, extra, ranges)
            q.quantize_static(str(pre), str(dest / "model.onnx"), None, quant_format=q.QuantFormat.QDQ,
                              activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8, per_channel=True,
                              reduce_range=ccfg.reduce_range, calibrate_method=getattr(q.CalibrationMethod, method),
                              extra_options=dict(extra), op_types_to_quantize=op_types, nodes_to_exclude=kept,
                              calibration_cache_path=str(ranges))
    ort_engine.mark_weight_range(dest / "model.onnx", reduced=ccfg.reduce_range)
    before, after = _onnx_input_types(model), _onnx_input_types(dest / "model.onnx")
    if before != after:
        raise PipeError(f"onnxruntime quantization changed the model's inputs: {before} -> {after}")
    return kept


# quantize_static's extra options that configure its calibrator, by the calibrator's names (onnxruntime's mapping)
_ORT_CALIB_KEYS = {"CalibTensorRangeSymmetric": "symmetric", "CalibMovingAverage": "moving_average",
                   "CalibMovingAverageConstant": "averaging_constant", "CalibPercentile": "percentile"}


def _ort_ranges(model: Path, batches: list[dict[str, np.ndarray]], op_types: list[str] | None, method: str,
                extra: dict[str, Any], dest: Path) -> None:
    """onnxruntime's own calibrator (the one quantize_static builds from the same arguments) over `batches`, its
    ranges written to `dest`, the calibration cache quantize_static then reads: the int8 file is the one
    quantize_static writes by itself, byte for byte, every algo (tests/test_quantize_ort.py). Two changes, both
    for memory. MinMax's (avg, mse) session runs nodes in priority order: the calibrator appends a
    ReduceMin/ReduceMax pair per tensor at the graph's end, and in onnxruntime's default order every activation
    stayed alive until they ran (PP-OCRv4 rec, 10 batches of 32 lines: 15 GB, 43 s; in priority order 786 MB,
    23 s). The histogram methods (KL, hist) take every tensor as a graph output, which no order spares:
    `_histograms` makes their histograms a sample at a time."""
    import onnxruntime as ort
    from onnxruntime.quantization import calibrate

    options = {_ORT_CALIB_KEYS[k]: v for k, v in extra.items() if k in _ORT_CALIB_KEYS}
    cal = calibrate.create_calibrator(model, op_types, augmented_model_path=str(model.with_name("augmented.onnx")),
                                      calibrate_method=getattr(calibrate.CalibrationMethod, method),
                                      extra_options=options)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the calibrator's own session
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    cal.infer_session = ort.InferenceSession(cal.augmented_model_path, so, providers=cal.execution_providers)
    if method == "MinMax":
        cal.collect_data(_Batches(batches))
    else:
        cal.collector = calibrate.HistogramCollector(
            method=cal.method, symmetric=cal.symmetric, num_bins=cal.num_bins,
            num_quantized_bins=cal.num_quantized_bins, percentile=cal.percentile, scenario=cal.scenario)
        cal.collector.histogram_dict = _histograms(cal, batches)
    calibrate.save_tensors_data(cal.compute_data(), dest)


def _histograms(cal: Any, batches: list[dict[str, np.ndarray]]) -> dict[str, tuple]:
    """The histograms onnxruntime's HistogramCollector.collect makes of each calibrated tensor over all `batches`
    stacked (its `histogram_dict`, which compute_data reads), made in two passes a sample at a time: each tensor's
    range over every sample, then each sample's counts in that range's bins, summed. A histogram counts each value
    by itself, so the counts are the same to the last one (tests/test_quantize_ort.py). onnxruntime stacks every
    tensor over all the batches first: PP-OCRv4 rec's 10 batches of 32 lines peaked at 16.3 GB (3 batches of one
    width at once; 228 s), and batches of different shapes (ocr_rec's width buckets, ocr_det's pages) failed
    ("inhomogeneous shape"). Here the same calibration peaked at 1.5 GB (169 s). onnxruntime's rule, followed:
    the percentile method with symmetric ranges bins |x| over [min |x|, max |x|] (collect_absolute_value); entropy
    and the asymmetric percentile bin x over [-t, t], t = max |x| (collect_value)."""
    sess = cal.infer_session
    names = [o.name for o in sess.get_outputs()]
    wanted = [(i, n) for i, n in enumerate(names) if n in cal.tensors_to_calibrate]
    absolute = cal.method == "percentile" and cal.symmetric

    # a sample at a time where every input's first axis is dynamic (the batch's): a batch at a time, PP-OCRv4 rec's
    # 10 calibration batches (widths 320 to 1,088, 340 calibrated tensors) were killed for memory in 23 GB
    per_sample = not any(isinstance(i.shape[0], int) for i in sess.get_inputs())

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        for b in batches:
            if not per_sample:
                yield b
                continue
            for j in range(len(next(iter(b.values())))):
                yield {k: a[j:j + 1] for k, a in b.items()}

    def outputs() -> Iterator[tuple[str, np.ndarray]]:
        for feed in feeds():
            got = sess.run(None, feed)
            for i, name in wanted:
                yield name, got[i].ravel()

    seen: dict[str, list] = {}  # name -> [min x, max x, min |x|, max |x|] over every sample where it has values
    for n, a in outputs():
        if a.size:
            m = np.absolute(a)
            r = [np.nanmin(a), np.nanmax(a), np.nanmin(m), np.nanmax(m)]
            old = seen.setdefault(n, r)
            seen[n] = [min(old[0], r[0]), max(old[1], r[1]), min(old[2], r[2]), max(old[3], r[3])]
    hists: dict[str, list] = {}
    for n, a in outputs():
        lo, hi, alo, ahi = seen.get(n) or [np.zeros((), a.dtype)] * 4
        if absolute:
            counts, edges = np.histogram(np.absolute(a), bins=cal.num_bins, range=(alo, ahi) if n in seen else None)
        else:
            t = np.array(max(abs(lo), abs(hi)), dtype=a.dtype)
            counts, edges = np.histogram(a, cal.num_bins, range=(-t, t))
        if n in hists:
            hists[n][0] += counts
        else:
            hists[n] = [counts, edges.astype(a.dtype) if absolute else edges, lo, hi] + ([] if absolute else [t])
    return {n: tuple(h) for n, h in hists.items()}


@contextlib.contextmanager
def _ort_quiet() -> Iterator[None]:
    """onnxruntime's quantization tools talk on stdout ("Collecting tensor data and making histogram ...") and
    through the root logger ("Axis 1 is out-of-range for weight 'batch_norm_1.w_0' with rank 1", once per
    batch-norm on PP-OCRv4 det): neither is for compress's user, whose output is pipe's table. Errors still raise."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


class _Batches:
    """onnxruntime's CalibrationDataReader protocol over a list of feed dicts."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.it = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


AUTO_CALIB_BATCHES = 10
# Below this many samples a calibration is said to be thin (not refused): onnxruntime's and PaddleSlim's
# examples calibrate on a few hundred; 100 is where their per-tensor ranges still see most of a split.
CALIB_WARN_BELOW = 100


def calibration_rows(n: int, ccfg: CompressConfig, unit: str = "samples", whole_batches: bool = True,
                     thin_below: int = CALIB_WARN_BELOW) -> np.ndarray:
    """Which of a train split's n rows calibrate int8, sorted: a seeded draw without replacement. By default
    (compress.calib_batches 0) up to 10 batches of compress.calib_batch_size, all of a smaller split (in whole
    batches if `whole_batches`; a split smaller than one batch is one batch of all of it); an explicit count the
    split cannot fill is an error. Thin calibration (under CALIB_WARN_BELOW) is said on stderr, not refused.
    `unit` names the rows in those messages (ocr_rec: lines, which it batches by width itself); `thin_below`
    where thin starts (a task whose items are large, ocr_det's pages, calibrates on fewer)."""
    size = ccfg.calib_batch_size
    if ccfg.calib_batches:
        want = ccfg.calib_batches * size
        if want > n:
            raise InputError(f"--calib-batches {ccfg.calib_batches} (compress.calib_batches) x compress.calib_batch_size "
                             f"{size} = {want} {unit}, but the train split has {n}; lower it or leave it at 0 (as "
                             f"many as the split holds)")
    elif whole_batches:
        size = min(size, n)
        want = min(AUTO_CALIB_BATCHES, n // size) * size
    else:
        want = min(n, AUTO_CALIB_BATCHES * size)
    if want < thin_below:
        print(f"warning: compress calibrates int8 on {want} {unit} (the train split has {n}); fewer than "
              f"{thin_below} may set poor ranges", file=sys.stderr)
    return np.sort(np.random.default_rng(ccfg.calib_seed).permutation(n)[:want])


# NNCF's preset for models with attention blocks: on PP-OCRv4 rec (an SVTR neck) its default preset lost 7.4
# points of line accuracy, the transformer one 2.1 (facts §17).
NNCF_MODEL_TYPE = "transformer"
_OV_QUANTIZED = ("Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData")


def int8_openvino(files: list[Path], calib: list[dict[str, np.ndarray]], val: list[Any],
                  score: Callable[[Callable[[dict[str, np.ndarray]], list[np.ndarray]], list[Any]], float],
                  max_drop: float, exact: bool, dest: Path, model_type: str | None = NNCF_MODEL_TYPE) -> dict[str, Any]:
    """OpenVINO int8 with a per-layer sensitivity search, by NNCF: the model OpenVINO reads from `files` (the
    legacy program or an ONNX file), quantized on the batches `calib` (feed dicts by its input names; shapes
    may differ), then `nncf.quantize_with_accuracy_control` ranks the quantized layers by what each one's
    quantization costs `score` on the items `val` and returns them to fp32, the costliest first, until the
    score is within `max_drop` of the fp32 model's. `score(run, items)`: run (feeds -> the model's outputs,
    in its order) over some of `val`, higher is better. `exact`: this CPU's int8 is exact (VNNI); else every
    layer's weights get NNCF's overflow fix (7-bit, as onnxruntime's reduce_range: pipeline/cpu.py). Writes
    dest/model.xml + model.bin; returns the search's record: the score of fp32, of int8 everywhere and after
    the search, whether that reached the budget (NNCF returns its best even when no set of layers does), and
    the layers kept in fp32. `model_type`: NNCF's preset by its value ("transformer"), None = its default."""
    import nncf
    import openvino as ov
    from openvino._offline_transformations import compress_quantize_weights_transformation

    nncf.set_log_level(logging.ERROR)
    core = ov.Core()
    model = core.read_model(*(str(f) for f in files))
    names = {p.get_any_name() for p in model.inputs}
    if any(set(b) != names for b in calib):
        raise PipeError(f"{files[0]}: OpenVINO reads inputs {sorted(names)}; the calibration feeds {sorted(calib[0])}")

    # NNCF 3.4.0's quantize_with_accuracy_control validates the fp32 model (compiled in f32, as here) on all
    # of `val` before any other model (openvino/quantization/quantize_model.py): that call's score is fp32's.
    fp32_score: list[float] = []

    def scored(compiled: Any, items: Any) -> tuple[float, list[float]]:
        """The score on `items` and each item's alone (NNCF ranks layers by these; given them, it does not run
        the model again item by item): every item runs once."""
        items, outs = list(items), {}

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            if id(feeds) not in outs:
                res = compiled(feeds)
                outs[id(feeds)] = [res[o] for o in compiled.outputs]
            return outs[id(feeds)]
        total = float(score(run, items))
        if not fp32_score and len(items) == len(val):
            fp32_score.append(total)
        return total, [float(score(run, [item])) for item in items]

    fix = nncf.OverflowFix.FIRST_LAYER if exact else nncf.OverflowFix.ENABLE
    print(f"compress: NNCF int8 of {files[0].name} on {len(calib)} calibration batches, then its per-layer search on "
          f"{len(val)} val batches (minutes)", flush=True)
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    with tempfile.TemporaryDirectory(prefix="pipe-nncf-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        # NNCF's progress bars (rich) go to stdout. intermediate_model_dir: NNCF saves the model it quantized
        # everywhere, before its search, with the weights' FakeQuantize not yet folded into int8 constants.
        searched = nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(calib), nncf.Dataset(val), validation_fn=scored, max_drop=max_drop,
            drop_type=nncf.DropType.ABSOLUTE, model_type=nncf.ModelType(model_type) if model_type else None,
            subset_size=len(calib),
            advanced_quantization_parameters=nncf.AdvancedQuantizationParameters(overflow_fix=fix),
            advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(intermediate_model_dir=tmp))
        full = core.read_model(str(Path(tmp) / "intermediate_model.xml"))
    if not fp32_score:
        raise PipeError(f"NNCF {nncf.__version__} did not validate the fp32 model on all of val (pipe reads fp32's "
                        "score from that call)")
    # The weights folded as nncf.quantize folds them (the call NNCF makes): the model nncf.quantize returns,
    # scored as it would be saved (PP-OCRv4 rec: 34 of 45 val lines read right folded, 35 unfolded).
    compress_quantize_weights_transformation(full)
    full_score, _ = scored(core.compile_model(full, "CPU", f32), val)
    after, _ = scored(core.compile_model(searched, "CPU", f32), val)
    everywhere, kept = _ov_quantized(full), _ov_quantized(searched)
    dest.mkdir()
    ov.save_model(searched, str(dest / "model.xml"), compress_to_fp16=False)
    return {"method": "nncf.quantize_with_accuracy_control", "nncf": nncf.__version__, "model_type": model_type,
            "overflow_fix": fix.value, "max_drop": max_drop, "score_fp32": fp32_score[0],
            "score_int8_everywhere": full_score, "score": after,
            "reached": bool(after >= fp32_score[0] - max_drop - 1e-9),
            "layers_int8": len(kept), "layers_quantizable": len(everywhere),
            "fp32_layers": sorted(everywhere - kept)}


def _ov_quantized(model: Any) -> set[str]:
    """The compute layers (convolutions, matmuls) of an OpenVINO model that take a quantized activation: a
    FakeQuantize feeds one of their inputs."""
    out = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() in _OV_QUANTIZED and any(
                i.get_source_output().get_node().get_type_name() == "FakeQuantize" for i in op.inputs()):
            out.add(op.get_friendly_name())
    return out


def _onnx_input_types(path: Path) -> dict[str, int]:
    """A model file's graph inputs (initializers aside): name -> ONNX element type."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    weights = {w.name for w in g.initializer}
    return {i.name: i.type.tensor_type.elem_type for i in g.input if i.name not in weights}


def split_batches(calib: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """{input: (batches, batch_size, ...)} -> one feed dict per batch (what the quantizers take)."""
    return [{k: a[i] for k, a in calib.items()} for i in range(len(next(iter(calib.values()))))]


def ort_op_types(desc: iospec.IO) -> tuple[list[str] | None, str]:
    """(the op types onnxruntime quantizes, None = its default; the rule that chose them, for the manifest).
    A model with integer inputs (token ids, masks: text and attention models) gets the matmul/linear ops
    only, as on the Paddle route; its embedding Gathers stay fp32. The default also quantizes Add: an
    ERNIE-shaped 2-layer encoder (padding mask added as -1e4, LayerNorm's decomposed Add/Sub) fell to
    top-1 agreement 0.656 and 1.4 dB with it, MatMul/Gemm alone gave 1.000 and 30 dB (facts note section
    14). Float inputs only: the default, every op it can quantize."""
    ints = [t.public for t in desc.inputs if np.dtype(t.dtype).kind in "iub"]
    if ints:
        return list(_ORT_MATMUL_OPS), (f"integer inputs ({', '.join(ints)}): {'/'.join(_ORT_MATMUL_OPS)} only "
                                       "(the default op types quantize attention's mask Add)")
    return None, "float inputs only: onnxruntime's default op types"


def _child(flag: str, spec: dict[str, Any], stdin: bytes, env_extra: dict[str, str], threads: int, what: str) -> bytes:
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS=str(threads), **env_extra,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # cwd: a scratch dir, so nothing the libraries may drop in the working directory survives.
    with tempfile.TemporaryDirectory(prefix="pipe-compress-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-m", "pipeline.quantize", flag, json.dumps(spec)], input=stdin,
                                  capture_output=True, env=env, cwd=cwd, timeout=_CHILD_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise PipeError(f"{what} did not finish within {_CHILD_TIMEOUT} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
        err = InputError if proc.returncode == 2 else PipeError  # 2: an input changed since it was verified
        raise err(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")
    return proc.stdout


def _read_verified(files: dict[str, dict[str, str]]) -> None:
    """The files may have changed since the parent verified them."""
    for name, f in files.items():
        if artifacts.sha256_file(Path(f["path"])) != f["sha256"]:
            raise InputError(f"{f['path']}: sha256 mismatch")


def _paddleslim_main(spec: dict[str, Any]) -> int:
    """Child (FLAGS_enable_pir_api=0): quant_post_static on the legacy program."""
    _read_verified(spec["files"])
    raw, calib, at = sys.stdin.buffer.read(), [], 0
    for batch in spec["batches"]:  # batch after batch, input after input, as the parent wrote them
        feeds = {}
        for t in batch:
            dtype, shape = np.dtype(t["dtype"]), [int(d) for d in t["shape"]]
            feeds[t["name"]] = np.frombuffer(raw, dtype, int(np.prod(shape)), at).reshape(shape).copy()  # aligned
            at += feeds[t["name"]].nbytes
        calib.append(feeds)
    if at != len(raw) or not calib:
        raise InputError(f"calibration: {len(raw)} bytes on stdin, {len(calib)} batches that take {at}")
    paddle = runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    paddle.enable_static()
    from paddleslim.quant import quant_post_static

    skip: list[str] = []
    if spec.get("keep_outputs"):
        exe = paddle.static.Executor(paddle.CPUPlace())
        prog, _, fetch = paddle.static.load_inference_model(
            spec["model_dir"], exe,  # with file names given, the prefix is their directory
            model_filename=Path(spec["files"]["model.pdmodel"]["path"]).name,
            params_filename=Path(spec["files"]["model.pdiparams"]["path"]).name)
        block = prog.global_block()
        ops = [op for op in block.ops if op.type not in ("feed", "fetch")]
        nodes = [(str(i), op.type, op.input_arg_names, op.output_arg_names) for i, op in enumerate(ops)]
        layers = output_layers(nodes, [v.name for v in fetch], set(QUANT_OPS))
        weights = {n for n in block.vars if block.vars[n].persistable}
        skip = sorted({x for i in layers for x in ops[int(i)].input_arg_names if x in weights})
        print("fp32_layers " + json.dumps(skip), flush=True)

    def loader() -> Iterator[dict[str, np.ndarray]]:  # a callable of feed dicts: a list or batch_generator fail
        yield from calib

    quant_post_static(
        executor=paddle.static.Executor(paddle.CPUPlace()), model_dir=spec["model_dir"],
        quantize_model_path=spec["dest"], model_filename=Path(spec["files"]["model.pdmodel"]["path"]).name,
        params_filename=Path(spec["files"]["model.pdiparams"]["path"]).name, data_loader=loader,
        batch_size=iospec.num_rows(calib[0]), batch_nums=len(calib), algo=spec["algo"], round_type="round",
        # onnx_format=True stores the weights as int8 (digits: 81 KB of params vs 304 KB with False) and
        # was closer to fp32 (max|diff| 0.89 vs 2.93); oneDNN int8 runs both.
        quantizable_op_type=list(QUANT_OPS), onnx_format=True, skip_tensor_list=skip or None)
    return 0


def _onnx_main(spec: dict[str, Any]) -> int:
    """Child: paddle2onnx of the PIR program, as every stage calls it (pipeline/p2o.py)."""
    _read_verified(spec["files"])
    runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    p2o.convert(Path(spec["files"]["model.json"]["path"]), Path(spec["files"]["model.pdiparams"]["path"]),
                Path(spec["dest"]), 13)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--paddleslim", "--onnx"):
        main = _paddleslim_main if sys.argv[1] == "--paddleslim" else _onnx_main
        try:
            sys.exit(main(json.loads(sys.argv[2])))
        except InputError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
    print("usage: python -m pipeline.quantize --paddleslim|--onnx SPEC_JSON (internal; use `pipe compress`)",
          file=sys.stderr)
    sys.exit(2)
