"""OpenVINO on the CPU: ONNX (the fp32 and the QDQ int8 files `pipe compress` writes) and the legacy
`.pdmodel` program. It does not read PIR `model.json` (facts note section 13), so it runs the export's
legacy program or the ONNX.

Settings, from measurement on 2 cores: the LATENCY hint (one stream: with THROUGHPUT and one synchronous
request at a time, batch-32 items/s halved at 2 threads), `INFERENCE_PRECISION_HINT=f32` (on CPUs with
AMX or avx512_bf16 OpenVINO otherwise runs fp32 models in bf16), and no CPU pinning (`pipe serve` runs
several predictor processes and an HTTP process on the same cores; pinned, they would fight).

int8 on a CPU without VNNI: OpenVINO's CPU plugin is built on oneDNN and its u8 x s8 kernels saturate
int16 there like onnxruntime's (`pipeline/cpu.py` probes it; it also honours `ONEDNN_MAX_CPU_ISA`). The
7-bit weights `pipe compress` writes (`reduce_range`) cannot saturate; any other int8 file there gets a
note in `describe()`, and the agreement gate and the package's reference check decide.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import cpu, runtime
from pipeline.engines import feeds as feeds_mod, ort as ort_engine
from pipeline.errors import InputError, PipeError

NAME = "openvino"
# The CPU plugin keeps the kernels it builds for each input shape in a cache of 5,000 entries by default. A
# model whose shapes come from the data (PP-OCRv4 det on pages of any size) fills it shape by shape: each det
# predictor grew from 0.4 to 1.0 GB over 600 pages of mixed sizes (pipe predict, 2 workers). Measured on that det
# program, one shape takes some 25-40 entries (a cap of 300 stopped the growth after ~10 new shapes, 1,000 after
# ~30); with no cache at all a page took within the noise of a cached one. So the cache is capped per shape: 50
# entries (300 for det's 6 shapes) against 200 left det and rec predictors still growing by 40-80 MB over 800 pages
# of interleaved sizes, with the same pages/s within the noise (with `few_malloc_arenas`, predict/run.py). 20 against
# 50 (2026-12-07, pipe predict in-process, EPYC, 2 cores): over 1,000 mixed pages the job grew +7.6% after page 200
# against +11.2% (still rising to page ~400 at 50) and ran 210-260 MB lower; over 300 pages, 3 alternated runs
# each, 4.30 against 4.53 pages/s (-5%); no cache at all, +5.9% but 4.24 pages/s on the 1,000.
RUNTIME_CACHE_PER_SHAPE = 20
FORMATS = ("onnx", "legacy", "ir")  # what it reads: model.onnx, model.pdmodel + model.pdiparams, or its own
# model.xml + model.bin (what `pipe compress` writes for a model NNCF quantized)


@dataclass
class Engine:
    core: Any  # held for the engine's lifetime: the compiled model and its request live in the core's plugin
    compiled: Any
    info: dict[str, Any]
    inputs: list[str] = field(default_factory=list)  # the file's own names, in OpenVINO's order (`load`)
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.request = self.compiled.create_infer_request()
        self.inputs = self.inputs or [p.get_any_name() for p in self.compiled.inputs]
        self.outputs = self.outputs or [p.get_any_name() for p in self.compiled.outputs]
        # Each name -> its port on the compiled model, by name: OpenVINO lists the legacy .pdmodel's inputs in
        # reverse order and positional feeding raises nothing (facts note section 14).
        self._in = _ports(self.compiled.inputs, self.inputs, self.info["files"][0], "input")
        self._out = _ports(self.compiled.outputs, self.outputs, self.info["files"][0], "output")
        self._names = frozenset(self.inputs)
        self._where = f"{self.info['files'][0]}: {NAME}"

    def __del__(self) -> None:  # the request before its compiled model, that before the core
        for name in ("request", "compiled"):
            self.__dict__.pop(name, None)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every input by name -> every output by name."""
        feeds_mod.check(feeds, self._names, self.inputs, self._where)
        self.request.infer({port: np.ascontiguousarray(feeds[name]) for name, port in self._in.items()})
        # .copy(): the tensors are reused by the next call
        return {name: self.request.get_output_tensor(port).data.copy() for name, port in self._out.items()}

    def describe(self) -> dict[str, Any]:
        return dict(self.info)


def available() -> str:
    """'' when OpenVINO can be imported here, else why not (one line)."""
    try:
        import openvino  # noqa: F401
    except ImportError as e:
        return f"openvino is not installed ({e.__class__.__name__}: {e}); pip install openvino"
    return ""


def load(files: list[Path], *, threads: int, precision: str = "fp32", device: str = "cpu",
         cache_capacity: int = 0) -> Engine:
    """`files` = [model.onnx], [model.pdmodel, model.pdiparams] or [model.xml, model.bin]. device: cpu, or gpu[:N] (OpenVINO's GPU
    plugin: the same code path, never run here). `cache_capacity` > 0 caps the CPU plugin's kernel cache at about
    that many input shapes (`RUNTIME_CACHE_PER_SHAPE`), as Paddle's oneDNN cache is capped per shape."""
    gpu = runtime.device_index(device, "--device")
    if precision not in ("fp32", "int8"):
        raise PipeError(f"OpenVINO precision {precision!r}: expected fp32 or int8")
    why = available()
    if why:
        raise InputError(why)
    import openvino as ov

    paths = [Path(f) for f in files]
    info: dict[str, Any] = {"engine": NAME, "version": ov.__version__.split("-")[0], "precision": precision,
                            "threads": threads, "device": device, "files": [p.name for p in paths],
                            "hint": "LATENCY"}
    if gpu is None and precision == "int8" and paths[0].suffix == ".onnx" and not cpu.int8_exact(NAME):
        safe = ort_engine.saturation_safe(paths[0])
        info["int8_weight_range"] = {None: None, True: "reduced", False: "full"}[safe]
        if safe is False:
            info["note"] = ("int8 with full-range weights on a CPU whose int8 saturates: OpenVINO has no exact "
                            "mode for it; the agreement gate and the reference check decide")
    core = ov.Core()
    target, config = "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                             "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": False}
    if cache_capacity > 0:
        config["CPU_RUNTIME_CACHE_CAPACITY"] = cache_capacity * RUNTIME_CACHE_PER_SHAPE
        info["runtime_cache"] = config["CPU_RUNTIME_CACHE_CAPACITY"]
    if gpu is not None:
        target, config = f"GPU.{gpu}", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        if target not in core.available_devices and not (gpu == 0 and "GPU" in core.available_devices):
            raise InputError(f"--device {device}: OpenVINO: not among its devices here ({', '.join(core.available_devices)})")
        target = target if target in core.available_devices else "GPU"
    try:
        model = core.read_model(*(str(p) for p in paths))
        compiled = core.compile_model(model, target, config)
    except Exception as e:  # OpenVINO's C++ error: one line, naming the file
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise PipeError(f"{paths[0]}: OpenVINO cannot load it ({e.__class__.__name__}: "
                        f"{(lines[-1] if lines else '')[:200]})") from None
    # The names the file itself gives (before compiling: the compiled ports also carry the names of tensors
    # fused into them, and `get_any_name()` there may pick one of those, e.g. `Add.9` for `fetch_name_0`).
    return Engine(core, compiled, info, [p.get_any_name() for p in model.inputs],
                  [p.get_any_name() for p in model.outputs])


def _ports(ports: Any, names: list[str], where: str, kind: str) -> dict[str, int]:
    """name -> the index of the compiled port that carries it."""
    out = {}
    for name in names:
        found = [i for i, p in enumerate(ports) if name in p.get_names()]
        if len(found) != 1:
            raise PipeError(f"{where}: OpenVINO's compiled model has {len(found)} {kind} ports named {name!r}")
        out[name] = found[0]
    return out


def probe() -> dict[str, Any]:
    """OpenVINO's int8 matmul of 64 terms, each 255 x 127 (a QDQ graph it runs as an int8 FullyConnected)."""
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    k, a, w = cpu.PROBE_K, cpu.PROBE_A, cpu.PROBE_W
    inits = [numpy_helper.from_array(np.full((k, 16), w, np.int8), "w"),
             numpy_helper.from_array(np.array(1.0, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "zu"), numpy_helper.from_array(np.array(0, np.int8), "zs")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "zu"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s", "zu"], ["ad"]),
             helper.make_node("DequantizeLinear", ["w", "s", "zs"], ["wd"]),
             helper.make_node("MatMul", ["ad", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "pipe_int8_probe", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    core = ov.Core()
    with tempfile.TemporaryDirectory(prefix="pipe-ov-probe-") as tmp:  # from a file: OpenVINO may keep
        path = Path(tmp) / "probe.onnx"                                  # pointers into an in-memory model
        path.write_bytes(model.SerializeToString())
        compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                      {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    request.infer({0: np.full((1, k), a, np.float32)})
    got = int(round(float(request.get_output_tensor(0).data[0, 0])))
    del request, compiled, core  # in this order: the request before its compiled model, that before the core
    return {"op": f"QDQ MatMul u8 x s8, K={k}, all {a} x {w}", "expected": k * a * w, "got": got,
            "saturates": got != k * a * w}
