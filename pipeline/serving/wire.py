"""Paddle Serving 0.9.0's HttpClient wire format for `POST /GeneralModelService/inference`.

Protobuf (`Content-Type: application/proto`, the client's default) with the messages of Serving's
general_model_service.proto, built here from a FileDescriptorProto (no generated code from Serving), or
JSON after the client's `set_http_proto(False)`; the answer comes in the request's format. One feed tensor
per model input (by `name` or `alias_name`, any order), each checked like any other tensor
(`validate.check_tensor`): float32 in `float_data` (elem_type 1), int64 in `int64_data` (elem_type 0;
token ids of shape [N, L] for text packages), int32 in `int_data`; all of one batch size. The answer
holds every output `fetch_var_names` names (none: every output), in the model's order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline import iospec
from pipeline.serving.spec import DTYPES, Settings, Spec
from pipeline.serving.validate import ApiError, check_tensor, expected, find, names
from pipeline.serving.validate import feeds as validate_feeds

PACKAGE = "baidu.paddle_serving.predictor.general_model"
ENGINE_NAME = "general_infer_0"


def messages() -> dict[str, Any]:
    """Paddle Serving 0.9.0's general_model_service.proto messages, built from a FileDescriptorProto here
    (no generated code from Serving): Tensor, Request, Response, ModelOutput."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="pipe/general_model_service.proto", package=PACKAGE,
                                            syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, ref in fields:
            repeated = ftype < 0
            f = m.field.add(name=fname, number=number, type=abs(ftype),
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if ref:
                f.type_name = f".{PACKAGE}.{ref}"

    R = -1  # sign marks a repeated field
    message("Tensor", [("int64_data", 1, R * F.TYPE_INT64, ""), ("float_data", 2, R * F.TYPE_FLOAT, ""),
                       ("int_data", 3, R * F.TYPE_INT32, ""), ("float64_data", 4, R * F.TYPE_DOUBLE, ""),
                       ("uint32_data", 5, R * F.TYPE_UINT32, ""), ("bool_data", 6, R * F.TYPE_BOOL, ""),
                       ("complex64_data", 7, R * F.TYPE_FLOAT, ""), ("complex128_data", 8, R * F.TYPE_DOUBLE, ""),
                       ("data", 9, R * F.TYPE_STRING, ""), ("elem_type", 10, F.TYPE_INT32, ""),
                       ("shape", 11, R * F.TYPE_INT32, ""), ("lod", 12, R * F.TYPE_INT32, ""),
                       ("name", 13, F.TYPE_STRING, ""), ("alias_name", 14, F.TYPE_STRING, ""),
                       ("tensor_content", 15, F.TYPE_BYTES, "")])
    message("Request", [("tensor", 1, R * F.TYPE_MESSAGE, "Tensor"), ("fetch_var_names", 2, R * F.TYPE_STRING, ""),
                        ("profile_server", 3, F.TYPE_BOOL, ""), ("log_id", 4, F.TYPE_UINT64, "")])
    message("ModelOutput", [("tensor", 1, R * F.TYPE_MESSAGE, "Tensor"), ("engine_name", 2, F.TYPE_STRING, "")])
    message("Response", [("outputs", 1, R * F.TYPE_MESSAGE, "ModelOutput"), ("profile_time", 2, R * F.TYPE_INT64, ""),
                         ("profile_server", 3, F.TYPE_BOOL, ""), ("log_id", 4, F.TYPE_UINT64, ""),
                         ("err_no", 5, F.TYPE_INT32, ""), ("err_msg", 6, F.TYPE_STRING, "")])
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fd.SerializeToString())
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}"))
            for n in ("Tensor", "Request", "ModelOutput", "Response")}


def parse_proto(body: bytes, cls: Any) -> Any:
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError):
        raise ApiError(400, "invalid_protobuf", "the body is not a Paddle Serving Request message") from None
    return msg


def check_json(doc: Any) -> dict[str, Any]:
    """Shape-check HttpClient's JSON body: {"tensor": [{...}], "fetch_var_names": [...], "log_id": n}."""
    bad = ApiError(422, "invalid_request", "expected a Paddle Serving Request: tensor (list of objects), "
                                            "fetch_var_names (list of strings), log_id (integer >= 0)")
    if not isinstance(doc, dict) or not isinstance(doc.get("tensor"), list):
        raise bad
    fetch, log_id = doc.get("fetch_var_names", []), doc.get("log_id", 0)
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise bad
    if not _json_int(log_id) or not 0 <= log_id < 2 ** 64:
        raise bad
    for t in doc["tensor"]:
        if not isinstance(t, dict) or not all(isinstance(t.get(k, ""), str) for k in ("name", "alias_name")):
            raise bad
    return {"tensor": doc["tensor"], "fetch_var_names": fetch, "log_id": int(log_id)}


def _json_int(v: Any) -> bool:
    """An integer as JSON Schema counts them (1 and 1.0, not true): what the endpoint's OpenAPI schema says."""
    return not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))


def feed(req: Any, spec: Spec, s: Settings, proto: bool) -> tuple[dict[str, np.ndarray], list[iospec.Tensor], int]:
    """A Request (protobuf message or checked JSON dict) -> the predictor's feeds (one tensor per model input,
    by `name` or `alias_name`, each checked as any tensor is, `validate.check_tensor`), the outputs to
    answer (those `fetch_var_names` names, in the model's order; none named: every output; names the
    model lacks are dropped, as Paddle Serving drops them) and the log id."""
    get = (lambda t, k: getattr(t, k)) if proto else (lambda t, k: t.get(k))
    tensors = list(req.tensor) if proto else req["tensor"]
    fetch = list(req.fetch_var_names) if proto else req["fetch_var_names"]
    log_id = int(req.log_id) if proto else req["log_id"]
    io_ = spec.io
    if not tensors:
        raise ApiError(422, "invalid_request", f"expected one feed tensor per input, named {names(io_.inputs)}")
    arrays: dict[str, np.ndarray] = {}
    for i, t in enumerate(tensors):
        inp = find(io_.inputs, get(t, "name")) or find(io_.inputs, get(t, "alias_name"))
        if inp is None:
            raise ApiError(422, "invalid_request", f"tensor[{i}]: no feed of this model; expected one feed tensor "
                                                   f"per input, named {names(io_.inputs)}")
        if inp.name in arrays:
            raise ApiError(422, "invalid_request", f"tensor[{i}]: feed {inp.public!r} given twice")
        arrays[inp.name] = _tensor(t, get, inp, spec, s, proto)
    feeds_ = validate_feeds(arrays, spec)
    outs = [o for o in io_.outputs if o.name in fetch or o.alias in fetch] if fetch else list(io_.outputs)
    if not outs:
        raise ApiError(422, "invalid_request", f"fetch_var_names: this model outputs {names(io_.outputs)}")
    return feeds_, outs, log_id


def _tensor(t: Any, get: Any, inp: iospec.Tensor, spec: Spec, s: Settings, proto: bool) -> np.ndarray:
    """One feed tensor's data as input `inp`: elem_type, shape against the data's length, then the values."""
    where = f"feed {inp.public!r}"
    code, field_name, _ = DTYPES[inp.dtype]
    elem_type = get(t, "elem_type")
    if (not proto and not _json_int(elem_type)) or elem_type != code:
        raise ApiError(422, "invalid_tensor", f"{where}: elem_type must be {code} ({inp.dtype}, in {field_name})")
    shape, data = get(t, "shape"), get(t, field_name)
    if not proto and (not isinstance(shape, list) or not isinstance(data, list)
                      or not all(_json_int(d) for d in shape)):
        raise ApiError(422, "invalid_tensor", f"{where}: shape (list of integers) and {field_name} (flat list) are "
                                              "required")
    shape = [int(d) for d in shape]
    if len(shape) > 16 or any(d < 0 for d in shape) or math.prod(shape) != len(data):
        raise ApiError(422, "invalid_tensor", f"{where}: {field_name} must hold prod(shape) values; expected "
                                              f"{expected(spec, s, inp)}")
    flat = np.asarray(data, np.float32 if code == 1 else inp.dtype) if proto else None
    if flat is None:
        try:
            flat = np.asarray(data)
        except (ValueError, TypeError, OverflowError):
            raise ApiError(422, "invalid_tensor", f"{where}: {field_name} must be a flat list of numbers") from None
        if flat.ndim != 1 or (flat.size and flat.dtype.kind not in "iuf"):
            raise ApiError(422, "invalid_tensor", f"{where}: {field_name} must be a flat list of numbers")
    return check_tensor(flat.reshape(shape), spec, s, inp, where)


def answer(outs: dict[str, np.ndarray], fetch: list[iospec.Tensor], log_id: int, proto: bool,
           messages: dict[str, Any]) -> Any:
    """The Response: one tensor per fetched output (`name` and `alias_name` both its public name: the
    program's stays inside the engine), in the request's format."""
    from fastapi.responses import JSONResponse, Response

    if proto:
        resp = messages["Response"](log_id=log_id, err_no=0, err_msg="")
        out = resp.outputs.add(engine_name=ENGINE_NAME)
        for o in fetch:
            y = outs[o.name]
            code, field_name, _ = DTYPES[o.dtype]
            t = out.tensor.add(elem_type=code, name=o.public, alias_name=o.public)
            t.shape.extend(int(d) for d in y.shape)
            getattr(t, field_name).extend(y.ravel().tolist())
        # The client parses protobuf only if Content-Type is exactly this (no charset).
        return Response(resp.SerializeToString(), media_type="application/proto")
    tensors = []
    for o in fetch:
        y = outs[o.name]
        code, field_name, _ = DTYPES[o.dtype]
        tensors.append({field_name: y.ravel().tolist(), "elem_type": code, "shape": list(y.shape), "name": o.public,
                        "alias_name": o.public, "lod": []})
    return JSONResponse({"outputs": [{"tensor": tensors, "engine_name": ENGINE_NAME}], "profile_time": [],
                         "profile_server": False, "log_id": log_id, "err_no": 0, "err_msg": ""})
