"""onnxruntime int8 (`quantize.int8_onnx`) calibrates through onnxruntime's own calibrator, its session run in
PRIORITY_BASED order (`quantize._ort_ranges`: PP-OCRv4 rec's calibration peaked at 15 GB in the default order, 0.7 GB
in this one), and hands the ranges to quantize_static as its calibration cache: the int8 file must be the one
quantize_static writes when it calibrates by itself, byte for byte, for every calibration algo pipe offers."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import iospec, quantize
from pipeline.config import CompressConfig


def _convnet(path, batch: int | str = "n") -> None:
    """A small real CNN in ONNX (conv, relu, conv, global pool, matmul): random weights, a dynamic batch unless
    `batch` fixes it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = {"w1": rng.normal(0, 0.3, (8, 3, 3, 3)), "b1": rng.normal(0, 0.1, 8), "w2": rng.normal(0, 0.3, (16, 8, 3, 3)),
         "b2": rng.normal(0, 0.1, 16), "fc": rng.normal(0, 0.3, (16, 5))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["logits"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, "w"])
    graph = helper.make_graph(nodes, "convnet", [x],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 5])],
                              [numpy_helper.from_array(a.astype(np.float32), k) for k, a in w.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


DESC = iospec.IO.from_interface({"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 3, 16, -1]}],
                                 "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 5]}]})


@pytest.mark.parametrize("algo", sorted(quantize.ORT_CALIB))
def test_the_int8_file_is_the_one_quantize_static_writes_by_itself(tmp_path, algo):
    from onnxruntime import quantization as q

    _convnet(tmp_path / "model.onnx")
    rng = np.random.default_rng(1)
    calib = [{"x": rng.normal(size=(n, 3, 16, 16)).astype(np.float32)} for n in (4, 4, 4)]
    ccfg = CompressConfig(algo=algo)
    quantize.int8_onnx(tmp_path / "model.onnx", {"desc": DESC}, calib, ccfg, tmp_path / "pipe", threads=1)

    # onnxruntime alone, calibrating in its default session, on the model pre-processed as pipe does it for an input
    # dynamic beyond the batch (the width here: no symbolic shapes), with pipe's arguments
    q.quant_pre_process(str(tmp_path / "model.onnx"), str(tmp_path / "pre.onnx"), skip_symbolic_shape=True)
    method, extra = quantize.ORT_CALIB[algo]
    q.quantize_static(str(tmp_path / "pre.onnx"), str(tmp_path / "alone.onnx"), quantize._Batches(calib),
                      quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8, per_channel=True, reduce_range=ccfg.reduce_range,
                      calibrate_method=getattr(q.CalibrationMethod, method), extra_options=dict(extra),
                      op_types_to_quantize=None, nodes_to_exclude=[])
    quantize_ops = {"QuantizeLinear", "DequantizeLinear"}
    import onnx

    ours = onnx.load(str(tmp_path / "pipe" / "model.onnx"))
    assert sum(n.op_type in quantize_ops for n in ours.graph.node) >= 6  # int8 indeed: both convs and the matmul
    # the file pipe writes also carries its weight-range mark (ort_engine.mark_weight_range): compare the graphs
    alone = onnx.load(str(tmp_path / "alone.onnx"))
    assert ours.graph.SerializeToString() == alone.graph.SerializeToString()


@pytest.mark.parametrize("batch", ["n", 4])
@pytest.mark.parametrize("algo", ["KL", "hist"])
def test_histograms_a_sample_at_a_time_are_onnxruntimes_over_all_batches_at_once(tmp_path, algo, batch):
    """`quantize._histograms` (two passes, a sample at a time; a batch at a time where the model fixes its batch
    size) makes the histograms onnxruntime's collector makes of every batch stacked: the same counts, bins, min,
    max (and threshold), tensor by tensor. The int8 file test above cannot see them all: onnxruntime's entropy
    with its 128 bins reads only the min and max."""
    from onnxruntime.quantization import calibrate, quant_pre_process

    _convnet(tmp_path / "model.onnx", batch)
    quant_pre_process(str(tmp_path / "model.onnx"), str(tmp_path / "pre.onnx"), skip_symbolic_shape=True)
    rng = np.random.default_rng(3)
    calib = [{"x": rng.normal(size=(4, 3, 16, 16)).astype(np.float32) * s} for s in (0.5, 1.0, 3.0)]
    method, extra = quantize.ORT_CALIB[algo]
    options = {quantize._ORT_CALIB_KEYS[k]: v for k, v in extra.items()}
    cal = calibrate.create_calibrator(tmp_path / "pre.onnx", None, augmented_model_path=str(tmp_path / "aug.onnx"),
                                      calibrate_method=getattr(calibrate.CalibrationMethod, method),
                                      extra_options=options)
    ours = quantize._histograms(cal, calib)
    cal.collect_data(quantize._Batches(calib))  # onnxruntime's own: every batch's outputs stacked, then binned
    theirs = cal.collector.histogram_dict
    assert sorted(ours) == sorted(theirs) and len(ours) >= 5  # x, both convs' inputs, the pool's, the matmul's
    for name, want in theirs.items():
        got = ours[name]
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert np.asarray(g).dtype == np.asarray(w).dtype and np.array_equal(g, w), name


@pytest.mark.parametrize("algo", ["KL", "hist"])
def test_histogram_algos_calibrate_on_batches_of_different_shapes(tmp_path, capsys, algo):
    """ocr_rec's width buckets and ocr_det's pages differ in shape from batch to batch: onnxruntime's histogram
    calibrators, given them in one call, fail ("inhomogeneous shape"); pipe's histograms (`_histograms`, a batch at
    a time) span all of them, and the int8 model reads every batch close to fp32."""
    import onnxruntime as ort
    from onnxruntime import quantization as q

    _convnet(tmp_path / "model.onnx")
    rng = np.random.default_rng(2)
    calib = [{"x": rng.normal(size=(4, 3, 16, w)).astype(np.float32)} for w in (16, 16, 24, 32)]
    q.quant_pre_process(str(tmp_path / "model.onnx"), str(tmp_path / "pre.onnx"), skip_symbolic_shape=True)
    method, extra = quantize.ORT_CALIB[algo]
    with pytest.raises(ValueError, match="inhomogeneous"):  # onnxruntime alone, all batches in one call
        q.quantize_static(str(tmp_path / "pre.onnx"), str(tmp_path / "alone.onnx"), quantize._Batches(calib),
                          calibrate_method=getattr(q.CalibrationMethod, method), extra_options=dict(extra))
    capsys.readouterr()
    quantize.int8_onnx(tmp_path / "model.onnx", {"desc": DESC}, calib, CompressConfig(algo=algo), tmp_path / "pipe",
                       threads=1)
    assert capsys.readouterr() == ("", "")  # onnxruntime's "Collecting tensor data ..." is not compress's output
    fp32 = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(tmp_path / "pipe" / "model.onnx"), providers=["CPUExecutionProvider"])
    import onnx

    assert sum(n.op_type == "QuantizeLinear" for n in onnx.load(str(tmp_path / "pipe" / "model.onnx")).graph.node) >= 3
    for b in calib:  # each shape's batch, the widest included, within the ranges the histograms set
        want, got = fp32.run(None, b)[0], int8.run(None, b)[0]
        assert np.corrcoef(want.ravel(), got.ravel())[0, 1] > 0.99, b["x"].shape
