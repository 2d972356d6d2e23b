"""Inference engines behind one small contract: `load(...)` a variant's files with threads and precision,
then `run(feeds)` a batch of named numpy inputs and `describe()` what runs.

    from pipeline import engines, iospec
    eng = engines.ENGINES["onnxruntime"].load([Path("int8-onnx/model.onnx")], threads=2, precision="int8")
    eng.inputs, eng.outputs                             # the file's own names, in its own order
    desc = iospec.IO.from_interface(manifest["interface"])
    on = engines.names(eng, desc, "int8-onnx/model.onnx")   # interface name -> the engine's name
    ys = eng.run({on["img"]: img, on["feat"]: feat})     # by name: every input, any order
    logits = ys[on[desc.logits().name]]                 # every output comes back, keyed by its name

Feed and fetch by name, never by position: ONNX made from the legacy program and OpenVINO reading the legacy
`.pdmodel` list the inputs in reverse order, and positional feeding raises nothing and answers wrong (facts
note section 14). A feed dict with a missing or unknown name is a one-line PipeError naming it.

Each module imports its library inside `load` (paddle ~1 s, onnxruntime ~0.1 s, openvino ~0.3 s). CPU-class
differences (int8 without VNNI, see `pipeline/cpu.py`) are settings an engine applies at load time and
reports in `describe()`; they are not separate engines. The server owns batching, protocol and limits.
A GPU is one more `device` of the same engines (Paddle Inference GPU/TensorRT, onnxruntime CUDA); only
`cpu` is built and run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pipeline import iospec
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


def names(eng: Any, desc: iospec.IO, where: str) -> dict[str, str]:
    """Each interface tensor's name (inputs and outputs, program and public name alike) -> the name `eng`
    feeds or returns it under. Inputs by name: every program keeps its InputSpec names (in whatever order).
    Outputs by name where the engine's file has the interface's names (the PIR program, paddle2onnx's ONNX
    of either program); else by position: the legacy program (PaddleSlim's int8 program is one) names its
    outputs after their ops, on Paddle Inference and OpenVINO alike (`linear_2.tmp_1` where PIR says
    `fetch_name_0`), in the same order (measured: tests/test_engines_named.py). InputError (the artifact and
    its file disagree), one line naming the tensor, when an input is not among the engine's or the output
    counts differ."""
    out: dict[str, str] = {}
    for t in desc.inputs:
        real = next((n for n in (t.name, t.alias) if n and n in eng.inputs), None)
        if real is None:
            raise InputError(f"{where}: input {t.public!r} is not among the engine's inputs "
                             f"({', '.join(map(repr, eng.inputs))})")
        out.update({t.name: real, t.public: real})
    by_name = all(t.name in eng.outputs for t in desc.outputs)
    if not by_name and len(eng.outputs) != len(desc.outputs):
        raise InputError(f"{where}: the engine has {len(eng.outputs)} outputs ({', '.join(map(repr, eng.outputs))}),"
                         f" the interface {len(desc.outputs)} ({', '.join(repr(t.public) for t in desc.outputs)})")
    for i, t in enumerate(desc.outputs):
        real = t.name if by_name else eng.outputs[i]
        out.update({t.name: real, t.public: real})
    return out


def variant(eng: Any, desc: iospec.IO, where: Path | str, fmt: str, files: list[str], source: str) -> dict[str, Any]:
    """A compressed variant as measurement needs it (pipe compress, both routes): `run` feeds -> outputs (`bind`),
    what the engine says of itself, its own input/output names in its order, and where its files come from."""
    info = eng.describe()
    return {"run": bind(eng, desc, str(where)), "describe": info, "engine": info["engine"],
            "precision": info["precision"], "inputs": list(eng.inputs), "outputs": list(eng.outputs),
            "format": fmt, "files": files, "source": source}


def unsupported_variant(engine: str, fmt: str, precision: str, source: str, reason: str,
                        desc: iospec.IO) -> dict[str, Any]:
    """A variant this machine cannot run, with the reason (recorded, not fatal)."""
    return {"run": None, "reason": reason, "engine": engine, "format": fmt, "precision": precision, "files": [],
            "source": source, "inputs": [t.name for t in desc.inputs], "outputs": [t.name for t in desc.outputs]}


def bind(eng: Any, desc: iospec.IO, where: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """`eng` as a function of the interface's tensors: feeds keyed by each input's program or public name ->
    every output keyed by its public name, mapped onto the engine's own names once (`names`)."""
    on = names(eng, desc, where)
    ins = [(t.name, t.public, on[t.name]) for t in desc.inputs]
    outs = [(t.public, on[t.name]) for t in desc.outputs]

    def run(feeds: dict[str, Any]) -> dict[str, Any]:
        got = eng.run({real: feeds[name] if name in feeds else feeds[public] for name, public, real in ins})
        return {public: got[real] for public, real in outs}

    return run
