"""A Triton python-based backend named `onnxruntime`, for tests only: it runs a repository's unchanged
`backend: "onnxruntime"` models where only the python backend exists (the nvidia-pytriton wheel's
tritonserver 2.51 ships no onnxruntime backend).

    tritonserver --model-repository=PACKAGE/triton --backend-directory=B ...

B holds the wheel's python backend as `B/python/` (libtriton_python.so, triton_python_backend_utils.py,
the stub for this Python) and this file as `B/onnxruntime/model.py`; Triton uses a backend directory's
`model.py` when it has no `libtriton_<name>.so`. The stub must import numpy and onnxruntime
(tests/stages/test_triton.py sets its environment).

At load it checks config.pbtxt against the ONNX as Triton's real onnxruntime backend does
(triton-inference-server/onnxruntime_backend `ValidateInputs`, `ValidateOutputs`, `CompareDimsSupported`):
the input count, every input and output name and data type, and the dims behind an initial -1 batch dim
when max_batch_size > 0 (inputs: a fixed ONNX dim must equal the config's; outputs: every dim, exactly).
A mismatch fails initialize, so the model never becomes ready and the server logs why.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64", "tensor(float16)": "TYPE_FP16",
          "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32", "tensor(int8)": "TYPE_INT8",
          "tensor(uint8)": "TYPE_UINT8", "tensor(bool)": "TYPE_BOOL"}


def _shape(dims: list) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_dims(model: str, name: str, onnx_dims: list[int], cfg_dims: list[int], max_batch: int,
                exact: bool) -> None:
    """Triton's CompareDimsSupported: an ONNX dim of -1 matches anything unless `exact`."""
    if max_batch > 0:
        if not onnx_dims or onnx_dims[0] != -1:
            raise ValueError(f"model '{model}', tensor '{name}': for the model to support batching the shape "
                             "should have at least 1 dimension and the first dimension must be -1; but shape "
                             f"expected by the model is {_shape(onnx_dims)}")
        full = [-1, *cfg_dims]
    else:
        full = list(cfg_dims)
    ok = len(onnx_dims) == len(full) and all(m == c for m, c in zip(onnx_dims, full) if exact or m != -1)
    if not ok:
        raise ValueError(f"model '{model}', tensor '{name}': the model expects {len(onnx_dims)} dimensions "
                         f"(shape {_shape(onnx_dims)}) but the model configuration specifies {len(full)} "
                         f"dimensions (shape {_shape(full)})")


def _check(model: str, config: dict, session: ort.InferenceSession) -> None:
    max_batch = int(config.get("max_batch_size", 0))
    for kind, declared, actual, exact in (("input", config.get("input", []), session.get_inputs(), False),
                                          ("output", config.get("output", []), session.get_outputs(), True)):
        by_name = {t.name: t for t in actual}
        if kind == "input" and len(declared) != len(actual):
            raise ValueError(f"unable to load model '{model}', configuration expects {len(declared)} inputs, "
                             f"model provides {len(actual)}")
        for io in declared:
            name = io["name"]
            if name not in by_name:
                raise ValueError(f"unable to load model '{model}', unexpected inference {kind} '{name}', "
                                 f"allowed {kind}s are: {', '.join(sorted(by_name))}")
            onnx = by_name[name]
            want = _TYPES.get(onnx.type, onnx.type)
            if io["data_type"] != want:
                raise ValueError(f"unable to load model '{model}', configuration expects datatype "
                                 f"{io['data_type']} for {kind} '{name}', model provides {want}")
            cfg_dims = [int(d) for d in (io.get("reshape") or {}).get("shape", io["dims"])]
            onnx_dims = [d if isinstance(d, int) and d >= 0 else -1 for d in onnx.shape]
            _check_dims(model, name, onnx_dims, cfg_dims, max_batch, exact)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        model = args["model_name"]
        path = Path(args["model_repository"]) / args["model_version"] / (config.get("default_model_filename")
                                                                         or "model.onnx")
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = int(params.get("intra_op_thread_count") or 0)
        so.inter_op_num_threads = int(params.get("inter_op_thread_count") or 0)
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        _check(model, config, self.session)
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [io["name"] for io in config["input"]]
        self.outputs = [io["name"] for io in config["output"]]

    def execute(self, requests: list) -> list:
        """One onnxruntime run per group of requests whose inputs share a shape (Triton's dynamic batcher
        batches only equal shapes; the grouping does not rely on it), its rows split back per request."""
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        groups: dict[object, list[int]] = {}
        for i, feed in enumerate(feeds):  # without a batch dim (max_batch_size 0) each request runs alone
            groups.setdefault(tuple(feed[n].shape[1:] for n in self.inputs) if self.batching else i, []).append(i)
        responses: list = [None] * len(requests)
        for members in groups.values():
            if len(members) == 1:
                parts = [self.session.run(self.outputs, feeds[members[0]])]
            else:
                ys = self.session.run(self.outputs, {n: np.concatenate([feeds[i][n] for i in members])
                                                     for n in self.inputs})
                ends = np.cumsum([len(feeds[i][self.inputs[0]]) for i in members])
                parts = [[y[end - len(feeds[i][self.inputs[0]]):end] for y in ys] for i, end in zip(members, ends)]
            for i, outs in zip(members, parts):
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(n, np.ascontiguousarray(y)) for n, y in zip(self.outputs, outs)])
        return responses

    def finalize(self) -> None:
        self.session = None
