"""The OpenAPI schemas of the bodies `pipe serve` reads by hand, and the offline Swagger UI page.

The request and response schemas of `POST /v1/predict` and `POST /GeneralModelService/inference` are
generated from the package's spec and the server's settings, to say what the server accepts: the input's
dtype (number within float32 or integer within its range; token ids within the vocabulary), shape (fixed
dims as minItems = maxItems, the batch as 1..max_batch_size), base64 images, non-blank text, and every
error status with its fixed body and the `type`s it carries. A request valid against the schema is
accepted (tests/stages/test_serve_openapi.py generates them from it), except for what JSON Schema cannot
state: that a base64 string decodes to a PNG/JPEG of at most max_image_pixels, the body cap, that a text
package's Paddle Serving tensor holds prod(shape) ids (an image package's schema states it), and a model
output that is not finite (422 non_finite_output). Each is in the schema's descriptions. The /v2
operations (the Open Inference Protocol, `v2.py`) get a simpler schema: the request's and answer's
structure, the input's name, datatypes and the {"error": "..."} body of each status.

FastAPI's own /docs page loads Swagger UI's JavaScript and CSS from a CDN: blank on a machine without
internet. `pipe serve` instead serves the copies vendored by the pinned `fastapi-offline` package
(Swagger UI 5, which renders OpenAPI 3.1) from its own /docs/ paths; without that package it serves no
/docs page at all (a page that silently stays blank is worse), and /openapi.json stays available.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.serving import v2 as v2_mod
from pipeline.serving.spec import DTYPES, Settings, Spec
from pipeline.serving.validate import takes_images
from pipeline.serving.wire import ENGINE_NAME, PACKAGE

DOCS_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}


def docs_assets() -> Path | None:
    """The directory holding Swagger UI's files (`DOCS_ASSETS`), or None when fastapi-offline is absent."""
    found = importlib.util.find_spec("fastapi_offline")
    if found is None or not found.submodule_search_locations:
        return None
    static = Path(found.submodule_search_locations[0]) / "static"
    return static if all((static / name).is_file() for name in DOCS_ASSETS) else None


def docs_page(title: str) -> Any:
    from fastapi.openapi.docs import get_swagger_ui_html

    return get_swagger_ui_html(openapi_url="/openapi.json", title=title, swagger_js_url="/docs/swagger-ui-bundle.js",
                               swagger_css_url="/docs/swagger-ui.css", swagger_favicon_url="/docs/favicon.png")


# Every error `type` the two inference endpoints answer, by status (a test checks the server raises no other).
ERRORS: dict[int, dict[str, str]] = {
    400: {"invalid_json": "not UTF-8 JSON, NaN or Infinity, a number beyond a double, or nested deeper than "
                          "max_json_depth",
          "bad_request": "an invalid Content-Length, or a corrupt or truncated gzip body",
          "invalid_protobuf": "not a Paddle Serving Request message",
          "client_disconnected": "the client went away before the body was read"},
    408: {"request_timeout": "the body did not arrive within the request timeout"},
    413: {"body_too_large": "the body, or the body after gzip decompression, exceeds max_body_bytes"},
    415: {"unsupported_media_type": "a Content-Type or Content-Encoding this endpoint does not take"},
    422: {"invalid_request": "the body is not an object of the request schema's fields",
          "invalid_tensor": "a tensor of another dtype, rank or shape, or values outside the dtype's range",
          "invalid_image": "not strict base64, or not a PNG/JPEG decodable to at most max_image_pixels pixels",
          "empty_text": "a text that is empty or only whitespace",
          "non_finite_output": "the model's output for these inputs is not finite (inputs far outside the "
                               "training range)"},
    500: {"internal": "a predictor process died (it is replaced)"},
    503: {"not_ready": "warming up", "draining": "shutting down", "overloaded": "the queue is full"},
    504: {"timeout": "no result within the request timeout"},
}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Strict base64 (the alphabet, padding only at the end), as `validate._unbase64` decodes it.
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# Not blank: a character that str.strip() keeps, which `validate._encode_text` asks of every text. Every
# str.isspace() character is below U+3001.
NON_BLANK = "[^" + "".join(f"\\u{c:04x}" for c in range(0x3001) if chr(c).isspace()) + "]"


def install(app: Any, spec: Spec, s: Settings) -> None:
    """`app.openapi` (what /openapi.json serves): FastAPI's document, with the request body and the answers
    of the inference operations, and the /v2 answers, as generated here. Not through `openapi_extra`: FastAPI's models turn
    integer bounds into floats (2 ** 64 - 1 became 1.8446744073709552e+19, a bound the server refuses)."""
    operations = {("/v1/predict", "post"): predict(spec, s),
                  ("/GeneralModelService/inference", "post"): serving(spec, s), **v2(spec, s)}
    generate = app.openapi  # builds the document once, then returns it from app.openapi_schema

    def document() -> dict[str, Any]:
        doc = generate()
        for (path, method), operation in operations.items():
            doc["paths"][path][method].update(operation)
        return doc

    app.openapi = document


def predict(spec: Spec, s: Settings) -> dict[str, Any]:
    """POST /v1/predict: the request body, the answer and the errors."""
    n = s.max_batch_size
    if spec.text is not None:
        t = spec.text
        props = {"text": {"type": "array", "minItems": 1, "maxItems": n, "example": ["这个手机很好用"],
                          "description": f"Encoded with the package's {t.vocab_size}-entry character vocabulary, "
                                         f"truncated to {t.max_len} characters",
                          "items": {"type": "string", "pattern": NON_BLANK}},
                 "inputs": _tensor(spec, s)}
    else:
        props = {"inputs": _tensor(spec, s)}
        if takes_images(spec):
            props["images"] = {
                "type": "array", "minItems": 1, "maxItems": n,
                "description": f"PNG or JPEG of at most {s.max_image_pixels} pixels, converted to "
                               f"{'grayscale' if spec.sample_shape[0] == 1 else 'RGB'}, resized and normalised "
                               "as at training time",
                "items": {"type": "string", "format": "byte", "contentEncoding": "base64", "pattern": BASE64,
                          "anyOf": [{"contentMediaType": "image/png"}, {"contentMediaType": "image/jpeg"}]}}
    fields = " or ".join(f"`{k}`" for k in props)
    request = {"type": "object", "properties": props, "additionalProperties": False, "minProperties": 1,
               "maxProperties": 1, "description": f"Exactly one of {fields}; a body of at most {s.max_body_bytes} "
                                                 "bytes (413), nested at most max_json_depth deep (400)"}
    labels = {"type": "array", "minItems": 1, "maxItems": n, "items": {"enum": spec.labels}}
    answer = {"type": "object", "required": ["labels", "scores", "logits"], "additionalProperties": False,
              "properties": {
                  "labels": labels,
                  "scores": {**labels, "items": {"type": "number", "minimum": 0, "maximum": 1},
                             "description": "softmax probability of each sample's label"},
                  "logits": {**labels, "items": {"type": "array", "minItems": len(spec.labels),
                                                 "maxItems": len(spec.labels), "items": {"type": "number"}}}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": {"description": "One entry per sample", "content": {
                "application/json": {"schema": answer}}}, **errors(spec, "v1")}}


def _tensor(spec: Spec, s: Settings) -> dict[str, Any]:
    """The `inputs` field: nested arrays [N, *sample] (text: N rows of token ids, each of any length)."""
    n = s.max_batch_size
    if spec.text is not None:
        t = spec.text
        ids = {"type": "integer", "minimum": 0, "maximum": t.vocab_size - 1}
        return {"type": "array", "minItems": 1, "maxItems": n,
                "description": f"int64 token ids, one row per text, each padded with {t.pad_id} or truncated to "
                               f"max_len {t.max_len}",
                "items": {"type": "array", "minItems": 1, "items": ids}}
    schema = _element(spec.inp["dtype"])
    for d in reversed(spec.sample_shape):
        schema = {"type": "array", "minItems": d, "maxItems": d, "items": schema}
    dims = ", ".join(str(d) for d in spec.sample_shape)
    return {"type": "array", "minItems": 1, "maxItems": n, "items": schema,
            "description": f"{spec.inp['dtype']} [N, {dims}], preprocessed as at training time"}


def _element(dtype: str) -> dict[str, Any]:
    if dtype == "float32":
        return {"type": "number", "minimum": -_FLOAT32_MAX, "maximum": _FLOAT32_MAX}
    info = np.iinfo(dtype)
    return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}


def serving(spec: Spec, s: Settings) -> dict[str, Any]:
    """POST /GeneralModelService/inference (Paddle Serving's HttpClient, `wire.py`): body, answers, errors."""
    code, field, _ = DTYPES[spec.inp["dtype"]]
    names = sorted({spec.inp["name"], spec.inp["alias"]})
    outs = sorted({spec.outp["name"], spec.outp["alias"]})
    n, sample = s.max_batch_size, spec.sample_shape
    if spec.text is not None:
        shape = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": n},
                                                  {"type": "integer", "minimum": 1}], "minItems": 2, "maxItems": 2}
        data = {"type": "array", "minItems": 1, "items": _tensor(spec, s)["items"]["items"],
                "description": "shape[0] x shape[1] ids, row by row"}
        sizes: dict[str, Any] = {}
    else:
        shape = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": n},
                                                  *({"const": d} for d in sample)],
                 "minItems": 1 + len(sample), "maxItems": 1 + len(sample)}
        per = int(np.prod(sample))
        data = {"type": "array", "minItems": per, "maxItems": n * per, "items": _element(spec.inp["dtype"]),
                "description": "prod(shape) values, C order"}
        # JSON Schema cannot relate two arrays' lengths; one alternative per batch size can.
        sizes = {"anyOf": [{"properties": {"shape": {"const": [b, *sample]}, field: {"minItems": b * per,
                                                                                      "maxItems": b * per}}}
                           for b in range(1, n + 1)]}
    named = [{"required": [k], "properties": {k: {"enum": names}}} for k in ("name", "alias_name")]
    tensor = {"type": "object", "required": ["elem_type", "shape", field],
              "properties": {"name": {"type": "string"}, "alias_name": {"type": "string"},
                             "elem_type": {"const": code, "description": f"{code}: {spec.inp['dtype']}"},
                             "shape": shape, field: data},
              "allOf": [{"anyOf": named, "description": f"name or alias_name is one of {names}"},
                        *([sizes] if sizes else [])]}
    request = {"type": "object", "required": ["tensor"], "properties": {
        "tensor": {"type": "array", "minItems": 1, "maxItems": 1, "items": tensor},
        "fetch_var_names": {"type": "array", "items": {"type": "string"},
                            "anyOf": [{"maxItems": 0}, {"contains": {"enum": outs}}],
                            "description": f"empty, or naming one of {outs}"},
        "log_id": {"type": "integer", "minimum": 0, "maximum": 2 ** 64 - 1}},
        "description": f"A {PACKAGE}.Request in JSON (HttpClient after set_http_proto(False)); a body of at most "
                       f"{s.max_body_bytes} bytes (413)"}
    o = spec.outp
    out_tensor = {"type": "object", "required": ["float_data", "elem_type", "shape", "name", "alias_name"],
                  "properties": {"float_data": {"type": "array", "items": {"type": "number"}},
                                 "elem_type": {"const": 1},
                                 "shape": {"type": "array", "prefixItems": [
                                     {"type": "integer", "minimum": 1, "maximum": n}, {"const": len(spec.labels)}],
                                     "minItems": 2, "maxItems": 2},
                                 "name": {"const": o["name"]}, "alias_name": {"const": o["alias"]}}}
    answer = {"type": "object", "required": ["outputs", "log_id", "err_no"], "properties": {
        "outputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["tensor", "engine_name"], "properties": {
                "tensor": {"type": "array", "minItems": 1, "maxItems": 1, "items": out_tensor},
                "engine_name": {"const": ENGINE_NAME}}}},
        "log_id": {"type": "integer", "minimum": 0, "maximum": 2 ** 64 - 1, "description": "the request's"},
        "err_no": {"const": 0}, "err_msg": {"const": ""}}}
    proto = {"type": "string", "format": "binary"}
    return {"requestBody": {"required": True, "content": {
        "application/proto": {"schema": {**proto, "description": f"{PACKAGE}.Request (HttpClient's default)"}},
        "application/json": {"schema": request}}},
        "responses": {"200": {"description": "A Response in the request's format", "content": {
            "application/proto": {"schema": {**proto, "description": f"{PACKAGE}.Response"}},
            "application/json": {"schema": answer}}}, **errors(spec, "serving")}}


def errors(spec: Spec, endpoint: str) -> dict[str, Any]:
    """Every error status of an inference endpoint with the fixed body and the `type`s it carries here."""
    absent = {"invalid_protobuf"} if endpoint == "v1" else {"invalid_image", "empty_text"}
    if spec.text is not None or not takes_images(spec):
        absent.add("invalid_image")
    if spec.text is None:
        absent.add("empty_text")
    out = {}
    for code, kinds in ERRORS.items():
        kinds = {k: v for k, v in kinds.items() if k not in absent}
        schema = {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {
            "error": {"type": "object", "required": ["code", "type", "message"], "additionalProperties": False,
                      "properties": {"code": {"const": code}, "type": {"enum": sorted(kinds)},
                                     "message": {"type": "string", "description": "never echoes the request"}}}}}
        out[str(code)] = {"description": "; ".join(f"{k}: {v}" for k, v in kinds.items()),
                          "content": {"application/json": {"schema": schema}}}
        if code == 503:
            out[str(code)]["headers"] = {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}
    return out


# The Open Inference Protocol's statuses (`pipeline/serving/v2.py`): the body is {"error": "<message>"}.
V2_ERRORS = {400: "a malformed request or binary framing (Inference-Header-Content-Length, binary_data_size), an "
                  "unknown datatype, input, output or output parameter, a classification count that is not an "
                  "integer 0..4294967295, a tensor of another datatype, shape or range, JSON that is "
                  "not UTF-8 or nested deeper than max_json_depth, a model output that is not finite",
             404: "no such model or version", 408: "the body did not arrive within the request timeout",
             413: "the body exceeds max_body_bytes", 415: "a Content-Type other than application/json, "
                  "application/octet-stream or none, or a Content-Encoding other than gzip",
             500: "a predictor process died (it is replaced)", 503: "warming up, shutting down, or the queue is full",
             504: "no result within the request timeout"}


def _v2_errors(codes: tuple[int, ...]) -> dict[str, Any]:
    schema = {"type": "object", "required": ["error"], "additionalProperties": False,
              "properties": {"error": {"type": "string", "description": "never echoes the request"}}}
    out = {str(c): {"description": V2_ERRORS[c], "content": {"application/json": {"schema": schema}}} for c in codes}
    if "503" in out:
        out["503"]["headers"] = {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}
    return out


def v2(spec: Spec, s: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """The /v2 operations' bodies and answers (a correct, simple schema: framing and values are checked
    by the server as described)."""
    model, version = "/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"
    meta = v2_mod.model_metadata(spec)
    dts = [meta["inputs"][0]["datatype"]] + (["BYTES"] if spec.text is not None else [])
    names = sorted({spec.inp["name"], spec.inp["alias"]})
    outs = sorted({spec.outp["name"], spec.outp["alias"]})
    tensor = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"enum": names},
        "shape": {"type": "array", "maxItems": 16, "items": {"type": "integer", "minimum": 0}},
        "datatype": {"enum": dts, "description": "BYTES: UTF-8 texts of shape [N] or [N, 1], encoded with the "
                                                 "package's vocabulary" if spec.text is not None else dts[0]},
        "data": {"type": "array", "description": "prod(shape) values in row-major order (BYTES: strings)"},
        "parameters": {"type": "object", "properties": {"binary_data_size": {
            "type": "integer", "minimum": 0,
            "description": "instead of data: this many bytes after the JSON header (little-endian; BYTES: a "
                           "4-byte length before each element), = prod(shape) x the datatype's size"}}}}}
    request = {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "inputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": tensor},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"enum": outs},
            "parameters": {"type": "object", "additionalProperties": False, "properties": {
                "binary_data": {"type": "boolean"},
                "classification": {"type": "integer", "minimum": 0, "maximum": v2_mod.MAX_CLASSIFICATION,
                                   "description": "Triton's classification extension: answer each sample's top N "
                                                  "classes as BYTES \"<value>:<index>:<label>\" (0: the output)"}}}}}},
        "parameters": {"type": "object", "properties": {"binary_data_output": {
            "type": "boolean", "description": "the default of outputs[].parameters.binary_data (false)"}}}},
        "description": f"A JSON header, then (binary tensor data extension) the inputs' bytes; a body of at most "
                       f"{s.max_body_bytes} bytes (413)"}
    batch = {"type": "integer", "minimum": 1, "maximum": s.max_batch_size}
    binary_size = {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}}
    output = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"enum": outs}, "datatype": {"const": "FP32"},
        "shape": {"type": "array", "prefixItems": [batch, {"const": len(spec.labels)}], "minItems": 2, "maxItems": 2},
        "data": {"type": "array", "items": {"type": "number"}}, "parameters": binary_size}}
    classified = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"enum": outs}, "datatype": {"const": "BYTES"},
        "shape": {"type": "array", "prefixItems": [batch, {"type": "integer", "minimum": 1,
                                                           "maximum": len(spec.labels)}], "minItems": 2, "maxItems": 2},
        "data": {"type": "array", "items": {"type": "string"},
                 "description": "\"<value>:<index>:<label>\", value as C's %f, each sample's highest first"},
        "parameters": binary_size},
        "description": "an output asked for with parameters.classification N: min(N, classes) per sample"}
    answer = {"type": "object", "required": ["model_name", "model_version", "outputs"], "properties": {
        "model_name": {"const": spec.name}, "model_version": {"const": v2_mod.VERSION}, "id": {"type": "string"},
        "outputs": {"type": "array", "minItems": 1, "items": {"oneOf": [output, classified]}}}}
    binary = {"type": "string", "format": "binary", "description": "the JSON header, then the binary tensors"}
    header = {"name": "Inference-Header-Content-Length", "in": "header", "required": False,
              "schema": {"type": "integer", "minimum": 0},
              "description": "the JSON header's length in bytes, when binary data follows it"}
    infer = {"requestBody": {"required": True, "content": {"application/json": {"schema": request},
                                                           "application/octet-stream": {"schema": binary}}},
             "responses": {"200": {"description": "The outputs, as JSON or binary after the JSON header",
                                   "headers": {"Inference-Header-Content-Length": {
                                       "description": "with binary outputs", "schema": {"type": "integer"}}},
                                   "content": {"application/json": {"schema": answer},
                                               "application/octet-stream": {"schema": binary}}},
                           **_v2_errors((400, 404, 408, 413, 415, 500, 503, 504))}}
    ok = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    ops = {(path, "get"): {"responses": {"200": ok, **_v2_errors(codes)}} for path, codes in (
        ("/v2", ()), ("/v2/health/live", ()), ("/v2/health/ready", (503,)), (model, (404,)), (version, (404,)),
        (model + "/ready", (404, 503)), (version + "/ready", (404, 503)))}
    for path, params in ((model, ["model_name"]), (version, ["model_name", "model_version"])):
        path_params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params]
        ops[(path + "/infer", "post")] = {**infer, "parameters": [*path_params, header]}
    return ops
