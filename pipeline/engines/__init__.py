"""Inference engines behind one small contract: `load(...)` a variant's files with threads and precision,
then `run(x)` a batch of numpy inputs and `describe()` what runs.

    from pipeline import engines
    eng = engines.ENGINES["onnxruntime"].load([Path("int8-onnx/model.onnx")], threads=2, precision="int8")
    logits = eng.run(x)

Each module imports its library inside `load` (paddle ~1 s, onnxruntime ~0.1 s). CPU-class differences
(int8 without VNNI, see `pipeline/cpu.py`) are settings an engine applies at load time and reports in
`describe()`; they are not separate engines. The server owns batching, protocol and limits.
"""

from pipeline.engines import ort, paddle

ENGINES = {"paddle_inference": paddle, "onnxruntime": ort}
