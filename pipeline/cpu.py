"""Does int8 saturate on this CPU? The CPU's flags, and a behavioural probe that is ground truth.

    PIPE_INT8_CAPABILITY=saturating pipe compress runs/exp1/export --int8   # as an AVX2-only CPU would

x86 int8 kernels multiply unsigned 8-bit activations by signed 8-bit weights. With VNNI (`avx512_vnni`,
`avx_vnni`, `amx_int8`) the products are summed straight into int32. Without it (AVX2, AVX-512 without
VNNI) the kernels use `vpmaddubsw`, which adds pairs of products into int16 with saturation: two
255 x 127 products (64,770) do not fit in 32,767. Measured on an AVX2-only EPYC (notes/paddle-stack-facts.md
section 12): onnxruntime's `MatMulInteger` of all-255 by all-127 over K=64 returned 1,048,544 instead of
2,072,640; Paddle's oneDNN int8 `fc` lost 1-4 accuracy points on text models, its convs did not.

- onnxruntime: the probe runs that `MatMulInteger` (a 1x64 by 64x1 graph built in memory, ~40 ms
  with the import) and compares with the exact sum. It is what onnxruntime does here, whatever the flags say.
- OpenVINO: the same sum as a QDQ MatMul, which its CPU plugin runs as an int8 FullyConnected
  (`pipeline/engines/openvino.py`). It is built on oneDNN and honours `ONEDNN_MAX_CPU_ISA` (measured on an
  AMX Xeon: 2,072,640, and 1,048,544 with `ONEDNN_MAX_CPU_ISA=AVX2`).
- Paddle Inference (oneDNN): no cheap probe (an int8 program needs PaddleSlim), so the flags decide, and
  `ONEDNN_MAX_CPU_ISA` when set: oneDNN honours it, so `ONEDNN_MAX_CPU_ISA=AVX2` makes a VNNI CPU run
  oneDNN's AVX2 int8 kernels, saturation included (measured: digits int8 agreement 0.998 -> 0.986).

`PIPE_INT8_CAPABILITY=exact|saturating` forces the verdict for both engines (tests use it to run the other
CPU class's branch on any machine); the real flags and probe result are still recorded beside it.
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

from pipeline.errors import InputError

FORCE_ENV = "PIPE_INT8_CAPABILITY"
_FORCED = ("exact", "saturating")
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_SHOWN_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16", "amx_bf16")
# oneDNN ISA names (ONEDNN_MAX_CPU_ISA) below which its int8 kernels have no VNNI.
_ONEDNN_NO_VNNI = ("sse41", "avx", "avx2", "avx512_core")
PROBE_K, PROBE_A, PROBE_W = 64, 255, 127
# Paddle's oneDNN int8 op types besides the matmul family (fc, matmul, matmul_v2, mul), which
# saturate without VNNI. Convolutions keep int8 there: oneDNN halves the first conv's weights (`sa0.5`)
# and its AVX2 conv kernels lost nothing measurable (digits agreement 0.998 with fc in fp32).
ONEDNN_INT8_OPS_NO_VNNI = frozenset({"conv2d", "fused_conv2d", "depthwise_conv2d", "pool2d", "concat",
                                     "elementwise_add", "elementwise_mul", "reshape2", "transpose2",
                                     "slice", "split", "nearest_interp", "nearest_interp_v2", "prior_box"})


def flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_onnxruntime() -> dict[str, Any]:
    """onnxruntime's u8 x s8 dot product of 64 terms, each 255 x 127, against the exact sum."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((PROBE_K, 1), PROBE_W, np.int8), "w")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "pipe_int8_probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, PROBE_K])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = int(sess.run(None, {"a": np.full((1, PROBE_K), PROBE_A, np.uint8)})[0][0, 0])
    want = PROBE_K * PROBE_A * PROBE_W
    return {"op": f"MatMulInteger u8 x s8, K={PROBE_K}, all {PROBE_A} x {PROBE_W}", "expected": want,
            "got": got, "saturates": got != want}


def forced() -> str | None:
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in _FORCED:
        raise InputError(f"{FORCE_ENV}={os.environ[FORCE_ENV]!r}: expected auto, exact or saturating")
    return value


@functools.lru_cache(maxsize=None)
def _probe() -> dict[str, Any]:
    return probe_onnxruntime()


@functools.lru_cache(maxsize=None)
def _probe_openvino() -> dict[str, Any] | None:
    """None when OpenVINO is not installed here. Run in a child process (~1 s, once per process): a process
    that only needs the verdict (package, serve's HTTP process, inspect) never loads OpenVINO beside Paddle."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("openvino") is None:
        return None
    code = "import json; from pipeline.engines import openvino as o; print(json.dumps(o.probe()))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None  # recorded as "no OpenVINO verdict": int8_exact("openvino") is then False


def _onednn_exact() -> bool:
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
    return any(f in flags() for f in _VNNI_FLAGS) and isa not in _ONEDNN_NO_VNNI


def int8_exact(engine: str) -> bool:
    """True when `engine`'s int8 kernels sum u8 x s8 products without int16 saturation here (or forced)."""
    force = forced()
    if force is not None:
        return force == "exact"
    if engine == "paddle_inference":
        return _onednn_exact()
    if engine == "onnxruntime":
        return not _probe()["saturates"]
    if engine == "openvino":
        ov = _probe_openvino()
        return ov is not None and not ov["saturates"]
    raise ValueError(f"no int8 capability known for engine {engine!r}")


def capability() -> dict[str, Any]:
    """This CPU's int8 capability: JSON-ready, recorded in compress and package manifests and bench."""
    have = flags()
    exact = {e: int8_exact(e) for e in ("onnxruntime", "paddle_inference")}
    ov = _probe_openvino()
    if ov is not None:
        exact["openvino"] = int8_exact("openvino")
    return {
        "cpu": _model_name(),
        "flags": [f for f in _SHOWN_FLAGS if f in have],
        "vnni": any(f in have for f in _VNNI_FLAGS),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or None,
        "probe": dict(_probe()),
        "probe_openvino": dict(ov) if ov is not None else None,
        "forced": forced(),
        "int8_exact": exact,
        "int8_saturates": not all(exact.values()),
    }


def summary(cap: dict[str, Any] | None = None) -> str:
    """One line, e.g. 'AMD EPYC 9R14: avx512_vnni; int8 exact (probe 2072640 = 2072640)'."""
    cap = cap or capability()
    probe = cap["probe"]
    said = "exact" if not cap["int8_saturates"] else "SATURATES (no VNNI: u8 x s8 pairs sum into int16)"
    if cap["forced"]:
        said += f", forced by {FORCE_ENV}={cap['forced']}"
    isa = f", ONEDNN_MAX_CPU_ISA={cap['onednn_max_cpu_isa']}" if cap["onednn_max_cpu_isa"] else ""
    vnni = [f for f in cap["flags"] if f in _VNNI_FLAGS] or ["no VNNI"]
    ov = cap.get("probe_openvino")
    return (f"{cap['cpu']}: {', '.join(vnni)}{isa}; int8 {said}; onnxruntime probe {probe['got']} "
            f"(exact {probe['expected']})" + (f", openvino probe {ov['got']}" if ov else ""))


def onednn_int8_ops() -> set[str]:
    """The op set for Paddle's `enable_onednn_int8`: all quantized ops (empty set) where oneDNN int8 is
    exact, else every op but the matmul family, which then runs in fp32."""
    return set() if int8_exact("paddle_inference") else set(ONEDNN_INT8_OPS_NO_VNNI)
