"""The Open Inference Protocol (KServe v2) over HTTP, as Triton's `tritonclient.http` speaks it: `/v2/...`.

One model, named by the package's `spec.name`, version "1" (the Triton repository's). Triton's model
configuration and statistics extensions answer `GET /v2/models/NAME[/versions/1]/config` (`model_config`)
and `.../stats` (`pipeline/serving/stats.py`), which tritonclient and perf_analyzer read. An inference
request is a JSON header, optionally followed by the binary tensor data extension: its length in the
`Inference-Header-Content-Length` header, each binary input's bytes in `parameters.binary_data_size`
(little-endian, C order; BYTES elements as a 4-byte little-endian length and the bytes), in input order.
Outputs come as JSON `data`, or as binary after the JSON header (the answer's own
`Inference-Header-Content-Length`, each output's `parameters.binary_data_size`) when the request asks:
`parameters.binary_data` on a requested output, else the request's `parameters.binary_data_output`.

Triton's classification extension: `parameters.classification` N on the logits output answers, instead
of the output, a BYTES tensor [batch, min(N, classes)] of "<value>:<index>:<label>" strings, each sample's
top N by value (`classify`); N = 0 is the output itself, as on Triton. A task without logits (detection)
has no such output: every output is answered raw, as Triton answers it (the task's postprocessing,
e.g. `pipeline.tasks.detection.decode`, is the client's; /v1 runs it in the server).

Every input of the package (`spec.io`), each once by its public name (the program's own, e.g.
`fetch_name_0`, is taken too, for clients written before names were public), with its datatype (FP32, INT64
or INT32), all of one batch size; a text package also takes BYTES, UTF-8 strings of shape [N] or [N, 1],
alone under any of its inputs' names, encoded as /v1 encodes {"text": [...]} and filling every input
(`validate.v1_inputs`). Tensors are checked by `validate.check_tensor`, as on /v1 and Paddle Serving's
endpoint, and the batch sizes by `validate.feeds` (iospec's messages). Every output is answered unless
the request's `outputs` names some, each under the name it was asked by (none asked: the public names); the
model metadata and configuration list every tensor by public name, as the package's Triton repository
names them. Errors are
raised as the server's other endpoints raise them (the 422 kinds of `openapi.ERRORS`); on /v2 they are
answered `{"error": "<message>"}`, 422 as 400 (`error_status`).
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np

from pipeline import __version__, iospec
from pipeline.serving import validate
from pipeline.serving.spec import DTYPES, TRITON_LABELS, Settings, Spec
from pipeline.serving.validate import ApiError

VERSION = "1"  # the Triton repository's model version (`triton/<name>/1/`)
EXTENSIONS = ["classification", "model_configuration", "binary_tensor_data", "statistics"]  # in Triton's order
HEADER_LENGTH = "inference-header-content-length"
ACCEPTED = ("application/json", "application/octet-stream", "")  # tritonclient sends no Content-Type
# Every datatype of the protocol, with its element size in bytes (BYTES: variable).
DATATYPES = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
             "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "BYTES": 0}
_NUMPY = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4"}
_MAX_RANK = 16
_LENGTH = re.compile(r"[0-9]{1,12}")
# Triton keeps the classification count in a uint32_t (server src/http_server.h, OutputInfo::class_cnt_)
# and silently truncates a larger one (2**32 answers the raw output, 2**32 + 1 the top 1): refused here.
MAX_CLASSIFICATION = 2**32 - 1


def datatype(dtype: str) -> str:
    """Paddle dtype name -> the protocol's datatype (float32 -> FP32)."""
    return DTYPES[dtype][2].removeprefix("TYPE_")


def error_status(code: int) -> int:
    """The protocol answers a request it cannot run with 400; the server's 422s are that."""
    return 400 if code == 422 else code


def server_metadata() -> dict[str, Any]:
    return {"name": "pipe", "version": __version__, "extensions": EXTENSIONS}


def check_model(spec: Spec, name: str, version: str | None = None) -> None:
    """404 unless `name` (and `version`, when given) is the served model. The message names what is
    served, not what was asked for."""
    if name != spec.name:
        raise ApiError(404, "not_found", f"unknown model; this server serves '{spec.name}'")
    if version is not None and version != VERSION:
        raise ApiError(404, "not_found", f"unknown version; '{spec.name}' has version {VERSION}")


def model_metadata(spec: Spec) -> dict[str, Any]:
    """Every input and output, by public name, in the model's order."""
    io_ = spec.io
    return {"name": spec.name, "versions": [VERSION], "platform": "paddle_inference",
            "inputs": [_meta(t) for t in io_.inputs], "outputs": [_meta(t) for t in io_.outputs]}


def model_config(spec: Spec, s: Settings, engine: str) -> dict[str, Any]:
    """Triton's model configuration extension (`GET /v2/models/NAME/config`, gRPC ModelConfig): the model as
    this server serves it, in the fields and JSON of the package's `triton/NAME/config.pbtxt` (numbers as
    numbers, as Triton answers): every tensor by public name, datatype and per-sample dims (-1: any
    length), labels.txt on the logits output, and the served batching (`--max-batch-size`, `--max-wait-ms`)
    and predictor count. The backend is the engine serving it (onnxruntime and openvino are Triton's
    backend names too)."""
    logits = spec.io.output(spec.info.logits).public if spec.info.logits and spec.labels else None

    def entry(t: iospec.Tensor, output: bool) -> dict[str, Any]:
        e = {"name": t.public, "data_type": DTYPES[t.dtype][2],
             "dims": [d if isinstance(d, int) and d > 0 else -1 for d in t.shape[1:]]}
        if output and t.public == logits:
            e["label_filename"] = TRITON_LABELS
        return e

    return {"name": spec.name, "backend": engine, "max_batch_size": s.max_batch_size,
            "input": [entry(t, False) for t in spec.io.inputs],
            "output": [entry(t, True) for t in spec.io.outputs],
            "dynamic_batching": {"max_queue_delay_microseconds": int(round(s.max_wait_ms * 1000))},
            "instance_group": [{"count": s.predictors, "kind": "KIND_CPU"}]}


def _meta(t: iospec.Tensor) -> dict[str, Any]:
    return {"name": t.public, "datatype": datatype(t.dtype), "shape": list(t.shape)}


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def split(body: bytes, header: str | None, max_depth: int) -> tuple[Any, bytes]:
    """The JSON header (parsed as every JSON body is, `validate.parse_json`) and the binary data after it."""
    if header is None:
        return validate.parse_json(body, max_depth), b""
    header = header.strip()
    if not _LENGTH.fullmatch(header) or int(header) > len(body):
        raise _bad(f"Inference-Header-Content-Length must be the JSON header's length in bytes, 0..{len(body)} "
                   "(the body's length)")
    n = int(header)
    return validate.parse_json(body[:n], max_depth), body[n:]


def _expected_input(spec: Spec, s: Settings, t: iospec.Tensor) -> str:
    if spec.text is not None:
        return (f"INT64 {validate.expected(spec, s, t)}; or BYTES, UTF-8 texts of shape [N] or [N, 1] with "
                f"1 <= N <= {s.max_batch_size}")
    return f"{datatype(t.dtype)}: {validate.expected(spec, s, t)}"


def _shape(t: dict[str, Any], where: str) -> list[int]:
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) > _MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _bad(f"{where}: shape must be a list of at most {_MAX_RANK} integers >= 0")
    return shape


def _binary_size(t: dict[str, Any], where: str) -> int | None:
    params = t.get("parameters", {})
    if not isinstance(params, dict):
        raise _bad(f"{where}: parameters must be an object")
    if any(k.startswith("shared_memory") for k in params):
        raise _bad(f"{where}: shared memory is not supported (send data or binary_data_size)")
    size = params.get("binary_data_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise _bad(f"{where}: parameters.binary_data_size must be an integer >= 0")
    return size


def _outputs(doc: dict[str, Any], spec: Spec) -> list[tuple[str, iospec.Tensor, bool, int]]:
    """(name as asked, output, binary, classification count) per requested output; none requested: every
    output, by public name. The count is Triton's (`classification`: an integer >= 0, 0 meaning the
    output itself), on the logits output only; Triton answers a count that is not such an integer
    (negative, 3.0, "3", true) with a 500 ("Unable to set 'classification'"), this server with a 400: it is
    the request's fault."""
    io_ = spec.io
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise _bad("parameters must be an object")
    default = params.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise _bad("parameters.binary_data_output must be true or false")
    requested = doc.get("outputs")
    if requested is None or requested == []:
        return [(t.public, t, default, 0) for t in io_.outputs]
    if not isinstance(requested, list) or not all(isinstance(o, dict) for o in requested):
        raise _bad("outputs must be a list of objects")
    logits = io_.output(spec.info.logits) if spec.info.logits else None
    out = []
    for i, o in enumerate(requested):
        t = validate.find(io_.outputs, o.get("name"))
        if t is None:
            raise _bad(f"outputs[{i}]: unknown output; this model outputs {_names(io_.outputs)}")
        p = o.get("parameters", {})
        if not isinstance(p, dict) or not set(p) <= {"binary_data", "classification"}:
            raise _bad(f"outputs[{i}]: parameters may hold binary_data and classification only")
        binary, count = p.get("binary_data", default), p.get("classification", 0)
        if not isinstance(binary, bool):
            raise _bad(f"outputs[{i}]: parameters.binary_data must be true or false")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_CLASSIFICATION:
            raise _bad(f"outputs[{i}]: parameters.classification must be an integer 0..{MAX_CLASSIFICATION} "
                       "(the number of top classes; 0: the output itself)")
        if count and logits is None:
            raise _bad(f"outputs[{i}]: classification applies to a logits output; this model ({spec.task.name}) "
                       "has none")
        if count and t.name != logits.name:
            raise _bad(f"outputs[{i}]: classification applies to the logits output '{logits.public}' only")
        out.append((o["name"], t, binary, count))
    if len({n for n, _, _, _ in out}) != len(out):
        raise _bad("outputs: each output at most once")
    return out


def _names(tensors: tuple[iospec.Tensor, ...]) -> str:
    """The protocol's names (the public ones), as the metadata lists them."""
    return ", ".join(f"'{t.public}'" for t in tensors)


Outputs = list[tuple[str, iospec.Tensor, bool, int]]


def request(doc: Any, binary: bytes, spec: Spec, s: Settings) -> tuple[list[dict[str, Any]], Outputs]:
    """The checked request: one entry per input it holds (the model's input, datatype, shape and data: a
    list, or a view of its bytes), and the outputs to answer with. Framing first (each binary input's size
    against shape x datatype, and all of them, in input order, against the bytes after the JSON header),
    every input present (or BYTES texts alone), then `tensors` checks the values."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) \
            or not all(isinstance(t, dict) for t in doc["inputs"]):
        raise _bad("expected an inference request: an object with inputs (a list of tensor objects)")
    if "id" in doc and not isinstance(doc["id"], str):
        raise _bad("id must be a string")
    io_ = spec.io
    found: list[dict[str, Any]] = []
    at = 0
    for i, t in enumerate(doc["inputs"]):
        inp = validate.find(io_.inputs, t.get("name"))
        if inp is None:
            raise _bad(f"inputs[{i}]: unknown input; this model takes {_names(io_.inputs)}")
        if any(f["input"] == inp for f in found):
            raise _bad(f"inputs[{i}]: input '{inp.public}' given twice")
        where = f"input '{inp.public}'"
        dt = t.get("datatype")
        if not isinstance(dt, str) or dt not in DATATYPES:
            raise _bad(f"{where}: unknown datatype; expected {_expected_input(spec, s, inp)}")
        if dt != datatype(inp.dtype) and not (dt == "BYTES" and spec.text is not None):
            raise _bad(f"{where}: datatype {dt}, expected {_expected_input(spec, s, inp)}")
        shape, size = _shape(t, where), _binary_size(t, where)
        if size is None:
            if not isinstance(t.get("data"), list):
                raise _bad(f"{where}: data (a list) or parameters.binary_data_size is required")
            data: Any = t["data"]
        else:
            if "data" in t:
                raise _bad(f"{where}: both data and parameters.binary_data_size")
            if dt != "BYTES" and size != math.prod(shape) * DATATYPES[dt]:
                raise _bad(f"{where}: parameters.binary_data_size is {size}, but shape x {dt} is "
                           f"{math.prod(shape) * DATATYPES[dt]} bytes")
            if at + size > len(binary):
                raise _bad(f"{where}: parameters.binary_data_size is {size}, but {len(binary) - at} bytes follow "
                           "the JSON header" + (" after the inputs before it" if at else ""))
            data, at = memoryview(binary)[at:at + size], at + size
        found.append({"input": inp, "datatype": dt, "shape": shape, "data": data, "where": where})
    if at != len(binary):
        raise _bad(f"{len(binary)} bytes follow the JSON header but the inputs' parameters.binary_data_size "
                   f"add up to {at}")
    texts = [f for f in found if f["datatype"] == "BYTES"]
    if texts and len(found) > 1:
        raise _bad(f"{texts[0]['where']}: BYTES texts fill every input of this model; send them alone")
    missing = [t for t in io_.inputs if not any(f["input"] == t for f in found)]
    if missing and not texts:
        raise _bad(f"missing input '{missing[0].public}'; this model takes {_names(io_.inputs)}")
    return found, _outputs(doc, spec)


async def tensors(found: list[dict[str, Any]], spec: Spec, s: Settings) -> dict[str, np.ndarray]:
    """The checked inputs as the predictor's feeds: numbers through `validate.check_tensor`, then one batch
    size (`validate.feeds`); BYTES texts through `validate.v1_inputs` (the encoder /v1 uses, filling every
    input)."""
    arrays = {}
    for f in found:
        inp, dt, shape, data, where = f["input"], f["datatype"], f["shape"], f["data"], f["where"]
        if dt == "BYTES":
            if len(shape) not in (1, 2) or shape[1:] not in ([], [1]) or not 1 <= shape[0] <= s.max_batch_size:
                raise ApiError(422, "invalid_tensor", f"{where}: shape {shape}, expected "
                                                      f"{_expected_input(spec, s, inp)}")
            return await validate.v1_inputs({"text": _texts(data, shape[0], where)}, spec, s)
        n = math.prod(shape)
        if isinstance(data, memoryview):
            arr = np.frombuffer(data, _NUMPY[dt])
        else:
            try:
                arr = np.asarray(data)
            except (ValueError, TypeError, OverflowError):
                arr = None
            if arr is None or (arr.size and arr.dtype.kind not in "iuf"):
                raise ApiError(422, "invalid_tensor", f"{where}: data must be a list of numbers")
        if arr.size != n:
            raise ApiError(422, "invalid_tensor", f"{where}: data holds {arr.size} values, shape {shape} needs {n}")
        arrays[inp.name] = validate.check_tensor(arr.reshape(shape), spec, s, inp, where)
    return validate.feeds(arrays, spec)


def _texts(data: Any, n: int, where: str) -> list[str]:
    """BYTES elements: a JSON list of strings, or binary (4-byte little-endian length, then the bytes)."""
    if not isinstance(data, memoryview):
        if not isinstance(data, list) or len(data) != n or not all(isinstance(v, str) for v in data):
            raise ApiError(422, "invalid_tensor", f"{where}: data must be a list of {n} strings (the shape)")
        return data
    data = bytes(data)
    out, at = [], 0
    for _ in range(n):
        if at + 4 > len(data):
            break
        (k,) = struct.unpack_from("<I", data, at)
        at += 4
        if at + k > len(data):
            break
        out.append(data[at:at + k])
        at += k
    if len(out) != n or at != len(data):
        raise ApiError(422, "invalid_tensor", f"{where}: the binary data is not {n} BYTES elements (4-byte "
                                              "little-endian length, then the bytes)")
    try:
        return [b.decode("utf-8") for b in out]
    except UnicodeDecodeError:
        raise ApiError(422, "invalid_tensor", f"{where}: BYTES elements must be UTF-8 text") from None


def classify(y: np.ndarray, count: int, labels: list[str]) -> list[bytes]:
    """Triton's classification of each sample (triton-inference-server/server src/classification.cc,
    `AddClassResults`): its `count` highest values (all, when it has fewer), highest first, each as
    `std::to_string(value) + ":" + std::to_string(index)`, then ":" + the index's line of labels.txt
    unless there is none or it is empty (core `InferenceResponse::ClassificationLabel`). std::to_string of
    a float is printf's "%f": six decimals, correctly rounded, as Python's "%f". Equal values keep index
    order, as Triton's std::sort leaves them for up to 16 classes (libstdc++ insertion-sorts that few)."""
    out = []
    for row in y.reshape(len(y), -1):
        for i in np.argsort(-row, kind="stable")[:count]:
            label = labels[i] if i < len(labels) else ""
            out.append(("%f:%d" % (float(row[i]), i) + (f":{label}" if label else "")).encode("utf-8"))
    return out


def encode(y: np.ndarray, out: iospec.Tensor, count: int, spec: Spec) -> tuple[str, list[int], bytes]:
    """One output as the binary extension and gRPC's raw_output_contents carry it: (datatype, shape, bytes),
    little-endian C order; classified (`count` > 0), BYTES [batch, min(count, classes)], each element a
    4-byte little-endian length and the UTF-8 string, as Triton serializes it."""
    if count:
        classes = classify(y, count, spec.labels)
        return ("BYTES", [len(y), min(count, math.prod(y.shape[1:]))],
                b"".join(struct.pack("<I", len(c)) + c for c in classes))
    dt = datatype(out.dtype)
    y = np.ascontiguousarray(y, _NUMPY[dt])
    return dt, list(y.shape), y.tobytes()


def answer(outs: dict[str, np.ndarray], doc: dict[str, Any], outputs: Outputs, spec: Spec) -> Any:
    """The inference response: each requested output (`outs`: every output by program name) under the name
    it was asked by, as JSON, or the JSON header and the binary outputs after it. A classified output is
    BYTES [batch, min(count, classes)]; binary, each element is a 4-byte little-endian length and the
    UTF-8 string, as Triton serializes it."""
    import orjson
    from fastapi.responses import Response

    resp: dict[str, Any] = {"model_name": spec.name, "model_version": VERSION}
    if "id" in doc:
        resp["id"] = doc["id"]
    tensors, blobs = [], []
    for name, out, binary, count in outputs:
        y = outs[out.name]
        if binary:
            dt, shape, raw = encode(y, out, count, spec)
            blobs.append(raw)
            t: dict[str, Any] = {"name": name, "datatype": dt, "shape": shape,
                                 "parameters": {"binary_data_size": len(raw)}}
        elif count:
            classes = classify(y, count, spec.labels)
            t = {"name": name, "datatype": "BYTES", "shape": [len(y), min(count, math.prod(y.shape[1:]))],
                 "data": [c.decode("utf-8") for c in classes]}
        else:
            t = {"name": name, "datatype": datatype(out.dtype), "shape": list(y.shape),
                 "data": np.asarray(y, _NUMPY[datatype(out.dtype)]).ravel().tolist()}
        tensors.append(t)
    resp["outputs"] = tensors
    head = orjson.dumps(resp)
    if not blobs:
        return Response(head, media_type="application/json")
    return Response(head + b"".join(blobs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(head))})
