"""The CPU's int8 capability (`pipeline/cpu.py`) and what the engines do with it (`pipeline/engines/`).

The real probe runs here whatever the CPU; the other CPU class's branch runs by forcing the verdict
(`PIPE_INT8_CAPABILITY`) or, for oneDNN, by `ONEDNN_MAX_CPU_ISA=AVX2`, which makes oneDNN itself run its
AVX2 kernels (tests/stages/test_compress_text.py shows the saturation that follows).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pipeline import cpu
from pipeline.engines import ort as ort_engine
from pipeline.errors import InputError
from tests.conftest import REPO

EXACT, SATURATED = 64 * 255 * 127, 32 * 32767  # 2,072,640 and what int16 saturation leaves of it


@pytest.fixture
def auto(monkeypatch):
    monkeypatch.delenv(cpu.FORCE_ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    return monkeypatch


def test_the_real_probe_agrees_with_the_cpu_flags(auto):
    """Ground truth on this machine: the u8 x s8 sum is exact with VNNI and saturated (32 x 32767) without.
    (Under an emulator the two can disagree: qemu -cpu Haswell keeps the host's /proc/cpuinfo, and the
    probe then says 1,048,544, which is why the probe, not the flags, decides for onnxruntime.)"""
    cap = cpu.capability()
    probe = cap["probe"]
    assert probe["expected"] == EXACT and probe["got"] in (EXACT, SATURATED), probe
    assert probe["saturates"] == (probe["got"] != EXACT)
    assert probe["saturates"] == (not cap["vnni"]), cap
    ov = cap["probe_openvino"]  # OpenVINO's own probe (a QDQ MatMul), the same sum
    assert ov["expected"] == EXACT and ov["saturates"] == (not cap["vnni"]), ov
    assert cap["int8_exact"] == {"onnxruntime": not probe["saturates"], "paddle_inference": cap["vnni"],
                                 "openvino": not ov["saturates"]}
    assert cap["forced"] is None and cap["int8_saturates"] == (not all(cap["int8_exact"].values()))
    assert set(cap["flags"]) <= set(cpu._SHOWN_FLAGS)
    assert ("int8 exact" in cpu.summary(cap)) == (not cap["int8_saturates"])


@pytest.mark.parametrize("force", ["saturating", "exact"])
def test_forcing_the_verdict_runs_the_other_class_branch(auto, force):
    auto.setenv(cpu.FORCE_ENV, force)
    cap = cpu.capability()
    exact = force == "exact"
    assert cap["forced"] == force
    assert cap["int8_exact"] == {"onnxruntime": exact, "paddle_inference": exact, "openvino": exact}
    assert cap["probe"]["expected"] == EXACT  # the real probe is still recorded beside the forced verdict
    assert f"forced by {cpu.FORCE_ENV}={force}" in cpu.summary(cap)
    ops = cpu.onednn_int8_ops()
    if exact:
        assert ops == set()  # every quantized op in int8
    else:
        assert "conv2d" in ops and not ops & {"fc", "matmul", "matmul_v2", "mul"}


def test_onednn_max_cpu_isa_below_vnni_means_paddle_int8_saturates(auto):
    auto.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu.int8_exact("paddle_inference")
    assert "fc" not in cpu.onednn_int8_ops()
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in cpu.summary()


def test_a_bad_forced_value_is_a_one_line_error_naming_the_variable(auto, tmp_path):
    auto.setenv(cpu.FORCE_ENV, "avx2")
    with pytest.raises(InputError, match="PIPE_INT8_CAPABILITY='avx2': expected auto, exact or saturating"):
        cpu.capability()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(tmp_path), "--int8"],
                          capture_output=True, text=True, cwd=REPO, env={**__import__("os").environ,
                                                                        cpu.FORCE_ENV: "avx2"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def _quantized(tmp_path, reduce_range: bool):
    """A real int8 QDQ model (MatMul 64 -> 16 -> 4, onnxruntime quantize_static) and its fp32 original."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime import quantization as q

    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
              for s, n in (((64, 16), "w1"), ((16, 4), "w2")))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], [w1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / f"int8-{reduce_range}.onnx"
    onnx.save(model, str(fp32))
    x = np.abs(rng.standard_normal((64, 64))).astype(np.float32)

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.it = iter(x.reshape(8, 8, 64))

        def get_next(self):
            b = next(self.it, None)
            return None if b is None else {"x": b}

    q.quantize_static(str(fp32), str(int8), Reader(), quant_format=q.QuantFormat.QDQ, reduce_range=reduce_range,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8, per_channel=True)
    return fp32, int8, x


@pytest.mark.parametrize("force", ["exact", "saturating"])
def test_onnxruntime_int8_load_follows_the_capability_and_the_models_weight_range(auto, tmp_path, force):
    """Where int8 saturates, a full-range int8 model (pipe's mark 'full', or no mark at all) is loaded with
    session.x64quantprecision=1; a reduce_range one ('reduced') and any fp32 model load as they are."""
    auto.setenv(cpu.FORCE_ENV, force)
    fp32, full, x = _quantized(tmp_path, reduce_range=False)
    _, reduced, _ = _quantized(tmp_path, reduce_range=True)
    assert ort_engine.saturation_safe(fp32) is None and ort_engine.saturation_safe(full) is False  # no mark: int8 ops
    ort_engine.mark_weight_range(reduced, reduced=True)
    assert ort_engine.saturation_safe(reduced) is True
    ort_engine.mark_weight_range(reduced, reduced=True)  # idempotent: one mark
    import onnx
    assert [p.key for p in onnx.load(str(reduced)).metadata_props].count(ort_engine.RANGE_KEY) == 1

    def x64(path):
        eng = ort_engine.load([path], threads=1, precision="int8")
        try:  # the session's own options: onnxruntime raises for a key never set
            return eng, eng.session.get_session_options().get_session_config_entry("session.x64quantprecision") == "1"
        except RuntimeError:
            return eng, False

    saturating = force == "saturating"
    for path, want in ((fp32, False), (full, saturating), (reduced, False)):
        eng, on = x64(path)
        assert on == want, (path.name, eng.describe())
        assert eng.describe().get("x64quantprecision", False) == want
        assert ("note" in eng.describe()) == want
    ref = ort_engine.load([fp32], threads=1).run({"x": x})["y"]
    for path in (full, reduced):  # real int8: close to fp32, not equal
        got = ort_engine.load([path], threads=1, precision="int8").run({"x": x})["y"]
        assert got.shape == ref.shape and 0 < np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
