"""Inference engines behind one small contract: `load(...)` a variant's files with threads and precision,
then `run(x)` a batch of numpy inputs and `describe()` what runs.

    from pipeline import engines
    eng = engines.ENGINES["onnxruntime"].load([Path("int8-onnx/model.onnx")], threads=2, precision="int8")
    logits = eng.run(x)

Each module imports its library inside `load` (paddle ~1 s, onnxruntime ~0.1 s, openvino ~0.3 s). CPU-class
differences (int8 without VNNI, see `pipeline/cpu.py`) are settings an engine applies at load time and
reports in `describe()`; they are not separate engines. The server owns batching, protocol and limits.
A GPU is one more `device` of the same engines (Paddle Inference GPU/TensorRT, onnxruntime CUDA); only
`cpu` is built and run here.
"""

from __future__ import annotations

from pipeline.engines import openvino, ort, paddle
from pipeline.errors import InputError

ENGINES = {"paddle_inference": paddle, "onnxruntime": ort, "openvino": openvino}
# What each engine reads (serving.yaml's model.format): PIR model.json, legacy model.pdmodel, model.onnx.
FORMATS = {"paddle_inference": ("pir", "legacy"), "onnxruntime": ("onnx",), "openvino": openvino.FORMATS}
ALIASES = {"paddle": "paddle_inference"}  # the flag's short name
LABELS = {"paddle_inference": "Paddle Inference with oneDNN", "onnxruntime": "onnxruntime CPU",
          "openvino": "OpenVINO CPU"}


def resolve(name: str, flag: str = "--engine") -> str:
    """A flag's engine name (paddle | paddle_inference | onnxruntime | openvino) -> the engine's name."""
    engine = ALIASES.get(name, name)
    if engine not in ENGINES:
        raise InputError(f"{flag}: unknown engine {name!r}; expected auto, paddle, onnxruntime or openvino")
    return engine


def missing(engine: str) -> str:
    """'' when `engine`'s library imports here, else one line saying which is missing."""
    if engine == "openvino":
        return openvino.available()
    import importlib.util

    lib = {"paddle_inference": "paddle", "onnxruntime": "onnxruntime"}[engine]
    return "" if importlib.util.find_spec(lib) else f"{engine}: {lib} is not installed here"
