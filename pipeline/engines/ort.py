"""onnxruntime on the CPU (CPUExecutionProvider): fp32 ONNX, and the QDQ int8 ONNX `pipe compress` writes.

int8 on a CPU without VNNI: onnxruntime's u8 x s8 kernels saturate int16 there (`pipeline/cpu.py`).
`pipe compress` quantizes with `reduce_range=True` (7-bit weights: a pair of products fits in int16) and
marks the model (`metadata_props` `pipe.int8_weight_range` = `reduced`). Loading any other int8 model
(full-range weights, or no mark) on such a CPU sets `session.x64quantprecision=1`: exact, but about fp32's
speed (facts note section 12); `describe()` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import cpu, runtime
from pipeline.engines import feeds as feeds_mod
from pipeline.errors import InputError, PipeError

NAME = "onnxruntime"
RANGE_KEY = "pipe.int8_weight_range"  # "reduced" (7-bit weights, exact on any x86 CPU) or "full"
_INT8_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
             "ConvInteger", "DynamicQuantizeLinear"}


@dataclass
class Engine:
    session: Any
    info: dict[str, Any]
    inputs: list[str] = field(default_factory=list)  # the graph's names, in its order (reversed in ONNX
    outputs: list[str] = field(default_factory=list)  # made from the legacy program: facts note section 14)

    def __post_init__(self) -> None:
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self._names = frozenset(self.inputs)
        self._where = f"{self.info['files'][0]}: {NAME}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every input by name -> every output by name."""
        feeds_mod.check(feeds, self._names, self.inputs, self._where)
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))

    def describe(self) -> dict[str, Any]:
        return dict(self.info)


def mark_weight_range(path: Path, reduced: bool) -> None:
    """Record in the model itself how its int8 weights were quantized (read back by `load`)."""
    import onnx

    model = onnx.load(str(path))
    props = [p for p in model.metadata_props if p.key != RANGE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    model.metadata_props.add(key=RANGE_KEY, value="reduced" if reduced else "full")
    onnx.save(model, str(path))


def saturation_safe(path: Path) -> bool | None:
    """None: no int8 ops; True: int8 with 7-bit weights (pipe's mark); False: any other int8 model."""
    import onnx

    model = onnx.load(str(path))
    mark = {p.key: p.value for p in model.metadata_props}.get(RANGE_KEY)
    if mark is not None:
        return mark == "reduced"
    return False if any(n.op_type in _INT8_OPS for n in model.graph.node) else None


def load(files: list[Path], *, threads: int, precision: str = "fp32", device: str = "cpu") -> Engine:
    """`files` = [model.onnx]. device: cpu (CPUExecutionProvider), or gpu[:N] (CUDAExecutionProvider, from
    onnxruntime-gpu: the same code path, never run here)."""
    gpu = runtime.device_index(device, "--device")
    import onnxruntime as ort

    providers: list[Any] = ["CPUExecutionProvider"]
    if gpu is not None:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise InputError(f"--device {device}: onnxruntime: this onnxruntime has no CUDAExecutionProvider "
                            f"({', '.join(ort.get_available_providers())}; install onnxruntime-gpu)")
        providers = [("CUDAExecutionProvider", {"device_id": gpu}), "CPUExecutionProvider"]

    (path,) = (Path(f) for f in files)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    info: dict[str, Any] = {"engine": NAME, "version": ort.__version__, "precision": precision,
                            "threads": threads, "device": device, "files": [path.name]}
    if gpu is None and not cpu.int8_exact(NAME):
        safe = saturation_safe(path)
        info["int8_weight_range"] = {None: None, True: "reduced", False: "full"}[safe]
        if safe is False:
            so.add_session_config_entry("session.x64quantprecision", "1")
            info["x64quantprecision"] = True
            info["note"] = ("int8 with full-range weights on a CPU whose int8 saturates: "
                            "session.x64quantprecision=1 (exact, at about fp32 speed)")
    try:
        sess = ort.InferenceSession(str(path), so, providers=providers)
    except Exception as e:  # onnxruntime's C++ error: one line, naming the file
        raise PipeError(f"{path}: onnxruntime cannot load it ({e.__class__.__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    return Engine(sess, info)
