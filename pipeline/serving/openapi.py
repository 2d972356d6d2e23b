"""The OpenAPI schemas of the bodies `pipe serve` reads by hand, and the offline Swagger UI page.

The request and response schemas of `POST /v1/predict` and `POST /GeneralModelService/inference` are
generated from the package's tensors (`spec.io`) and the server's settings, to say what the server
accepts: every input by name (a package of one input: its tensor as the field's value, as before names),
each input's dtype (number within float32 or integer within its range; token ids within the
vocabulary), shape (fixed dims as minItems = maxItems, the batch as 1..max_batch_size), base64 images of
an image input, non-blank text, every output of the answer, and every error status with its fixed body
and the `type`s it carries. A request valid against the schema is accepted (tests/stages/test_serve_openapi.py
generates them from it), except for what JSON Schema cannot state: that a base64 string decodes to a
PNG/JPEG of at most max_image_pixels, the body cap, that several inputs have one batch size, that a text
package's Paddle Serving tensor holds prod(shape) ids (an image package's schema states it), and a model
output that is not finite (422 non_finite_output). Each is in the schema's descriptions. The /v2
operations (the Open Inference Protocol, `v2.py`) get a simpler schema: the request's and answer's
structure, every input's and output's names and datatypes and the {"error": "..."} body of each status.

FastAPI's own /docs page loads Swagger UI's JavaScript and CSS from a CDN: blank on a machine without
internet. `pipe serve` instead serves the copies vendored by the pinned `fastapi-offline` package
(Swagger UI 5, which renders OpenAPI 3.1) from its own /docs/ paths; without that package it serves no
/docs page at all (a page that silently stays blank is worse), and /openapi.json stays available.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.serving import v2 as v2_mod
from pipeline.serving.spec import DTYPES, Settings, Spec
from pipeline.serving.validate import bounds, image_inputs, names, sample_shape, takes_images, task_images
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
    422: {"invalid_request": "the body is not an object of the request schema's fields: an unknown or missing "
                             "input, or one given twice",
          "invalid_tensor": "a tensor of another dtype, rank or shape, values outside the dtype's range, or "
                            "inputs of different batch sizes",
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


def install_ocr(app: Any, det: Spec, s: Settings, drop_score: float) -> None:
    """An OCR system server's `app.openapi`: FastAPI's document with POST /v1/ocr's body, answer and errors
    (`ocr`); each part's own endpoints keep FastAPI's generic entries."""
    generate = app.openapi

    def document() -> dict[str, Any]:
        doc = generate()
        doc["paths"]["/v1/ocr"]["post"].update(ocr(det, s, drop_score))
        return doc

    app.openapi = document


def ocr(det: Spec, s: Settings, drop_score: float) -> dict[str, Any]:
    """POST /v1/ocr (pipeline/ocr_system/serving.py): pages as base64 PNG/JPEG -> per page its lines."""
    request = {"type": "object", "required": ["images"], "additionalProperties": False, "properties": {
        "images": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size,
                   "description": f"pages, PNG or JPEG of at most {s.max_image_pixels} pixels each, any size",
                   "items": {"type": "string", "format": "byte", "contentEncoding": "base64", "pattern": BASE64,
                             "anyOf": [{"contentMediaType": "image/png"}, {"contentMediaType": "image/jpeg"}]}}},
               "description": f"a body of at most {s.max_body_bytes} bytes (413)"}
    point = {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"}}
    line = {"type": "object", "required": ["points", "text", "score"], "additionalProperties": False, "properties": {
        "points": {"type": "array", "minItems": 4, "maxItems": 4, "items": point,
                   "description": "the line's quadrilateral, [x, y] clockwise from the top left, in the page's pixels"},
        "text": {"type": "string"},
        "score": {"type": "number", "minimum": drop_score, "maximum": 1,
                  "description": f"the recognizer's score; lines below drop_score {drop_score} are dropped"}}}
    answer = {"type": "object", "required": ["pages"], "additionalProperties": False, "properties": {
        "pages": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size,
                  "items": {"type": "array", "items": line,
                            "description": "the page's lines in reading order (top to bottom, then left to right)"},
                  "description": "one list per page, in the order sent; a page without text: []"}}}
    errs = errors(det, "v1")
    for body in errs.values():  # no tensors, no text on this endpoint
        kinds = body["content"]["application/json"]["schema"]["properties"]["error"]["properties"]["type"]
        kinds["enum"] = [k for k in kinds["enum"] if k not in ("invalid_tensor", "empty_text")]
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": {"description": "Every page's text lines", "content": {
                "application/json": {"schema": answer}}}, **errs}}


def predict(spec: Spec, s: Settings) -> dict[str, Any]:
    """POST /v1/predict: the request body, the answer and the errors. A package of one input takes its
    tensor (or images) as the field's value; several inputs take an object of input name -> value, each
    input once, in `inputs` or (an image input) `images`."""
    n, io_ = s.max_batch_size, spec.io
    ins, imgs = io_.inputs, image_inputs(spec)
    one = len(ins) == 1
    props: dict[str, Any] = {}
    if spec.text is not None:
        t = spec.text
        props["text"] = {"type": "array", "minItems": 1, "maxItems": n, "example": ["这个手机很好用"],
                         "description": f"Encoded with the package's {t.vocab_size}-entry character vocabulary, "
                                        f"truncated to {t.max_len} characters" + (
                                            "" if one else f", filling every input ({names(ins)})"),
                         "items": {"type": "string", "pattern": NON_BLANK}}
    choose = not one and spec.text is None and bool(imgs)  # each input in `inputs` or, an image input, `images`
    props["inputs"] = (_tensor(spec, s, ins[0]) if one
                       else _by_name({t.public: _tensor(spec, s, t) for t in ins}, required=not choose))
    if imgs:
        props["images"] = (_images(spec, s, imgs[0]) if one
                           else _by_name({t.public: _images(spec, s, t) for t in imgs}, required=False))
    keys = " or ".join(f"`{k}`" for k in props)
    limits = f"a body of at most {s.max_body_bytes} bytes (413), nested at most max_json_depth deep (400)"
    request: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False,
                               "minProperties": 1, "maxProperties": 1}
    if one:
        request["description"] = (f"Exactly one of {keys}; `inputs` may also be an object naming the input "
                                  f"({{{ins[0].public!r}: ...}}); {limits}")
    elif not choose:
        request["description"] = f"Exactly one of {keys}, naming every input ({names(ins)}); {limits}"
    else:  # each input once, in inputs or in images: one alternative per choice of the images sent
        request.pop("maxProperties")
        request["anyOf"] = [_choice([t for t in ins if t not in sent], sent)
                            for k in range(len(imgs) + 1) for sent in itertools.combinations(imgs, k)]
        request["description"] = (f"Every input once ({names(ins)}): in `inputs` as a tensor, or an image input "
                                  f"({names(imgs)}) in `images` as base64 PNG/JPEG; all of one batch size; {limits}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": {"description": "One entry per sample", "content": {
                "application/json": {"schema": _answer(spec, s)}}}, **errors(spec, "v1")}}


def _answer(spec: Spec, s: Settings) -> dict[str, Any]:
    """/v1's answer: the package's task's (`pipeline/tasks/`): classification's labels, scores and logits
    (and every other output), detection's boxes per image; another task's, an object."""
    n, io_ = s.max_batch_size, spec.io
    if not spec.info.logits:
        return _TASK_ANSWERS.get(spec.task.name, _any_answer)(spec, s)
    labels = {"type": "array", "minItems": 1, "maxItems": n, "items": {"enum": spec.labels}}
    answer: dict[str, Any] = {
        "type": "object", "required": ["labels", "scores", "logits"], "additionalProperties": False,
        "properties": {
            "labels": labels,
            "scores": {**labels, "items": {"type": "number", "minimum": 0, "maximum": 1},
                       "description": "softmax probability of each sample's label"},
            "logits": {**labels, "items": {"type": "array", "minItems": len(spec.labels),
                                           "maxItems": len(spec.labels), "items": {"type": "number"}}}}}
    logits = io_.output(spec.info.logits)
    others = {t.public: _output(t, n) for t in io_.outputs if t.name != logits.name}
    if others:
        answer["required"].append("outputs")
        answer["properties"]["outputs"] = {**_by_name(others), "description": "every output but the logits "
                                                                             f"('{logits.public}'), by name"}
    return answer


def _detections(spec: Spec, s: Settings) -> dict[str, Any]:
    """pipeline.tasks.detection's answer, with serving.yaml's settings."""
    cfg = spec.info.settings
    box = {"type": "object", "required": ["label", "score", "box"], "additionalProperties": False, "properties": {
        "label": {"enum": spec.labels},
        "score": {"type": "number", "minimum": float(cfg.get("score_threshold", 0)), "maximum": 1,
                  "description": "the class-centre heatmap's sigmoid at the box's centre"},
        "box": {"type": "array", "minItems": 4, "maxItems": 4, "items": {"type": "number"},
                "description": "[x1, y1, x2, y2] in the sent image's pixels (tensors: model-input pixels)"}}}
    per = {"type": "array", "maxItems": int(cfg.get("max_detections", 100)), "items": box,
           "description": f"score >= {cfg.get('score_threshold')}, class-wise NMS at IoU {cfg.get('nms_iou')}, "
                          "highest score first"}
    return {"type": "object", "required": ["detections"], "additionalProperties": False, "properties": {
        "detections": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size, "items": per,
                       "description": "one list of boxes per image"}}}


def _any_answer(spec: Spec, s: Settings) -> dict[str, Any]:
    return {"type": "object", "description": f"the answer of task {spec.task.name!r} (its `answer`)"}


def _lines(spec: Spec, s: Settings) -> dict[str, Any]:
    """pipeline.tasks.ocr_rec's answer: a text and a score per line image, in the order sent."""
    line = {"type": "object", "required": ["text", "score"], "additionalProperties": False, "properties": {
        "text": {"type": "string", "description": "CTC greedy decode with the package's keys"},
        "score": {"type": "number", "minimum": 0, "maximum": 1,
                  "description": "the mean probability of the line's kept characters (0 for an empty text)"}}}
    return {"type": "object", "required": ["lines"], "additionalProperties": False, "properties": {
        "lines": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size, "items": line,
                  "description": "one per line image (or tensor row), in the order sent"}}}


def _text_boxes(spec: Spec, s: Settings) -> dict[str, Any]:
    """pipeline.tasks.ocr_det's answer: per page its text boxes, with serving.yaml's settings."""
    cfg = spec.info.settings
    point = {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"}}
    box = {"type": "object", "required": ["points", "score"], "additionalProperties": False, "properties": {
        "points": {"type": "array", "minItems": 4, "maxItems": 4, "items": point,
                   "description": "[x, y] clockwise from the top left, in the sent page's pixels (tensors: the "
                                  "map's)"},
        "score": {"type": "number", "minimum": float(cfg.get("box_thresh", 0)), "maximum": 1,
                  "description": "the probability map's mean inside the box"}}}
    per = {"type": "array", "maxItems": int(cfg.get("max_candidates", 1000)), "items": box,
           "description": f"DB post-processing: map > {cfg.get('thresh')}, box score >= {cfg.get('box_thresh')}, "
                          f"unclip ratio {cfg.get('unclip_ratio')}"}
    return {"type": "object", "required": ["boxes"], "additionalProperties": False, "properties": {
        "boxes": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size, "items": per,
                  "description": "one list of text boxes per page, in the order sent"}}}


def _orientations(spec: Spec, s: Settings) -> dict[str, Any]:
    """pipeline.tasks.ocr_cls's answer: a label and its probability per line image, in the order sent."""
    line = {"type": "object", "required": ["label", "score"], "additionalProperties": False, "properties": {
        "label": {"enum": spec.labels}, "score": {"type": "number", "minimum": 0, "maximum": 1,
                                                  "description": "the label's softmax probability"}}}
    return {"type": "object", "required": ["lines"], "additionalProperties": False, "properties": {
        "lines": {"type": "array", "minItems": 1, "maxItems": s.max_batch_size, "items": line,
                  "description": f"one per line image, in the order sent (turn a line by 180 degrees when its label "
                                 f"is 180 and its score above cls_thresh {spec.info.settings.get('cls_thresh')})"}}}


# /v1's answer schema of tasks without logits, by task name
_TASK_ANSWERS = {"detection": _detections, "ocr_rec": _lines, "ocr_det": _text_boxes, "ocr_cls": _orientations}


def _by_name(props: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """An object of `props` (each of them, or those an alternative requires: `_choice`)."""
    return {"type": "object", "properties": props, **({"required": list(props)} if required else {}),
            "additionalProperties": False}


def _choice(tensors: list[Any], images: tuple[Any, ...]) -> dict[str, Any]:
    """/v1's body sending `images` as images and `tensors` as tensors, each once."""
    required = (["inputs"] if tensors else []) + (["images"] if images else [])
    props = {}
    if tensors:
        props["inputs"] = {"required": [t.public for t in tensors], "maxProperties": len(tensors)}
    if images:
        props["images"] = {"required": [t.public for t in images], "maxProperties": len(images)}
    return {"required": required, "maxProperties": len(required), "properties": props}


def _images(spec: Spec, s: Settings, t: Any) -> dict[str, Any]:
    """Base64 PNG/JPEG files for image input `t`."""
    how = (f"any size, prepared by task {spec.task.name} (its own resize, normalisation and batching)"
           if task_images(spec) else
           f"converted to {'grayscale' if t.shape[1] == 1 else 'RGB'}, resized and normalised as at training time")
    return {"type": "array", "minItems": 1, "maxItems": s.max_batch_size,
            "description": f"PNG or JPEG of at most {s.max_image_pixels} pixels, {how}",
            "items": {"type": "string", "format": "byte", "contentEncoding": "base64", "pattern": BASE64,
                      "anyOf": [{"contentMediaType": "image/png"}, {"contentMediaType": "image/jpeg"}]}}


def _tensor(spec: Spec, s: Settings, t: Any) -> dict[str, Any]:
    """Input `t` in `inputs`: nested arrays [N, *sample] (text: N rows of token ids, each of any length)."""
    n = s.max_batch_size
    if spec.text is not None:
        text = spec.text
        ids = {"type": "integer", "minimum": 0, "maximum": text.vocab_size - 1}
        return {"type": "array", "minItems": 1, "maxItems": n,
                "description": f"int64 token ids, one row per text, each padded with {text.pad_id} or truncated to "
                               f"max_len {text.max_len}",
                "items": {"type": "array", "minItems": 1, "items": ids}}
    schema = _element(t.dtype)
    for lo, hi in reversed(bounds(spec, t)):
        schema = {"type": "array", "minItems": lo, "maxItems": hi, "items": schema}
    dims = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in bounds(spec, t))
    return {"type": "array", "minItems": 1, "maxItems": n, "items": schema,
            "description": f"{t.dtype} [N, {dims}], preprocessed as at training time"}


def _output(t: Any, n: int) -> dict[str, Any]:
    """Output `t` as nested arrays [N, ...] (a dynamic dim: any length)."""
    schema: dict[str, Any] = {"type": "number"} if t.dtype.startswith("float") else {"type": "integer"}
    for d in reversed(t.shape[1:]):
        schema = {"type": "array", **({"minItems": d, "maxItems": d} if d > 0 else {}), "items": schema}
    return {"type": "array", "minItems": 1, "maxItems": n, "items": schema,
            "description": f"{t.dtype} {list(t.shape)}"}


def _element(dtype: str) -> dict[str, Any]:
    if dtype == "float32":
        return {"type": "number", "minimum": -_FLOAT32_MAX, "maximum": _FLOAT32_MAX}
    info = np.iinfo(dtype)
    return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}


def serving(spec: Spec, s: Settings) -> dict[str, Any]:
    """POST /GeneralModelService/inference (Paddle Serving's HttpClient, `wire.py`): body, answers, errors.
    One feed tensor per input (any order; the same batch size, which JSON Schema cannot state)."""
    io_, n = spec.io, s.max_batch_size
    feeds = [_feed(spec, s, t) for t in io_.inputs]
    tensors: dict[str, Any] = {"type": "array", "minItems": len(feeds), "maxItems": len(feeds), "items": _any(feeds)}
    if len(feeds) > 1:  # each input once (one item alone states it)
        tensors["allOf"] = [{"contains": f} for f in feeds]
        tensors["description"] = f"one tensor per input ({names(io_.inputs)}), in any order, of one batch size"
    outs = sorted({k for t in io_.outputs for k in (t.name, t.public)})
    request = {"type": "object", "required": ["tensor"], "properties": {
        "tensor": tensors,
        "fetch_var_names": {"type": "array", "items": {"type": "string"},
                            "anyOf": [{"maxItems": 0}, {"contains": {"enum": outs}}],
                            "description": f"empty (every output), or naming some of {outs}"},
        "log_id": {"type": "integer", "minimum": 0, "maximum": 2 ** 64 - 1}},
        "description": f"A {PACKAGE}.Request in JSON (HttpClient after set_http_proto(False)); a body of at most "
                       f"{s.max_body_bytes} bytes (413)"}
    fetched = [_fetched(t, n) for t in io_.outputs]
    answer = {"type": "object", "required": ["outputs", "log_id", "err_no"], "properties": {
        "outputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["tensor", "engine_name"], "properties": {
                "tensor": {"type": "array", "minItems": 1, "maxItems": len(fetched), "items": _any(fetched),
                           "description": "the outputs fetch_var_names names (none: every one), in the model's "
                                          "order"},
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


def _any(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """One of `schemas` (the schema itself when there is one)."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _feed(spec: Spec, s: Settings, t: Any) -> dict[str, Any]:
    """A feed tensor of input `t` (by name or alias_name)."""
    code, field, _ = DTYPES[t.dtype]
    named_as = sorted({t.name, t.public})
    n, sample = s.max_batch_size, sample_shape(spec, t)
    if spec.text is not None:
        shape = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": n},
                                                  {"type": "integer", "minimum": 1}], "minItems": 2, "maxItems": 2}
        data = {"type": "array", "minItems": 1, "items": _tensor(spec, s, t)["items"]["items"],
                "description": "shape[0] x shape[1] ids, row by row"}
        sizes: dict[str, Any] = {}
    elif -1 in sample:  # a task's dynamic input (ocr_rec's width): each dim within its bounds
        dims = bounds(spec, t)
        shape = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": n},
                                                  *({"type": "integer", "minimum": lo, "maximum": hi}
                                                    for lo, hi in dims)],
                 "minItems": 1 + len(sample), "maxItems": 1 + len(sample)}
        data = {"type": "array", "minItems": 1, "maxItems": n * int(np.prod([hi for _, hi in dims])),
                "items": _element(t.dtype), "description": "prod(shape) values, C order"}
        sizes = {}
    else:
        shape = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 1, "maximum": n},
                                                  *({"const": d} for d in sample)],
                 "minItems": 1 + len(sample), "maxItems": 1 + len(sample)}
        per = int(np.prod(sample))
        data = {"type": "array", "minItems": per, "maxItems": n * per, "items": _element(t.dtype),
                "description": "prod(shape) values, C order"}
        # JSON Schema cannot relate two arrays' lengths; one alternative per batch size can.
        sizes = {"anyOf": [{"properties": {"shape": {"const": [b, *sample]}, field: {"minItems": b * per,
                                                                                      "maxItems": b * per}}}
                           for b in range(1, n + 1)]}
    named = [{"required": [k], "properties": {k: {"enum": named_as}}} for k in ("name", "alias_name")]
    return {"type": "object", "required": ["elem_type", "shape", field],
            "properties": {"name": {"type": "string"}, "alias_name": {"type": "string"},
                           "elem_type": {"const": code, "description": f"{code}: {t.dtype}"},
                           "shape": shape, field: data},
            "allOf": [{"anyOf": named, "description": f"name or alias_name is one of {named_as}"},
                      *([sizes] if sizes else [])]}


def _fetched(t: Any, n: int) -> dict[str, Any]:
    """An answered tensor of output `t`."""
    code, field, _ = DTYPES[t.dtype]
    dims = [{"const": d} if d > 0 else {"type": "integer", "minimum": 0} for d in t.shape[1:]]
    return {"type": "object", "required": [field, "elem_type", "shape", "name", "alias_name"],
            "properties": {field: {"type": "array", "items": {"type": "number" if code == 1 else "integer"}},
                           "elem_type": {"const": code},
                           "shape": {"type": "array", "prefixItems": [
                               {"type": "integer", "minimum": 1, "maximum": n}, *dims],
                               "minItems": len(t.shape), "maxItems": len(t.shape)},
                           "name": {"const": t.public}, "alias_name": {"const": t.public}}}


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
                  "unknown datatype, input, output or output parameter, a missing input or one given twice, inputs "
                  "of different batch sizes, classification of an output that is not the logits, a classification "
                  "count that is not an integer 0..4294967295, a tensor of another datatype, shape or range, JSON "
                  "that is not UTF-8 or nested deeper than max_json_depth, a model output that is not finite",
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
    io_ = spec.io
    text = spec.text is not None

    def given(t: Any) -> dict[str, Any]:  # a request's tensor for input t
        dts = [v2_mod.datatype(t.dtype)] + (["BYTES"] if text else [])
        return {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
            "name": {"enum": sorted({t.name, t.public})},
            "shape": {"type": "array", "maxItems": 16, "items": {"type": "integer", "minimum": 0}},
            "datatype": {"enum": dts, "description": "BYTES: UTF-8 texts of shape [N] or [N, 1], encoded with the "
                                                     "package's vocabulary (alone: they fill every input)"
                         if text else dts[0]},
            "data": {"type": "array", "description": "prod(shape) values in row-major order (BYTES: strings)"},
            "parameters": {"type": "object", "properties": {"binary_data_size": {
                "type": "integer", "minimum": 0,
                "description": "instead of data: this many bytes after the JSON header, after those of the inputs "
                               "before it (little-endian; BYTES: a 4-byte length before each element), = prod(shape) "
                               "x the datatype's size"}}}}}

    ins = [given(t) for t in io_.inputs]
    inputs: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": len(ins), "items": _any(ins)}
    if len(ins) > 1:
        inputs["description"] = (f"every input once ({names(io_.inputs)}), in any order, of one batch size"
                                 + ("; or BYTES texts alone" if text else ""))
    outs = sorted({k for t in io_.outputs for k in (t.name, t.public)})
    logits = io_.output(spec.info.logits) if spec.info.logits else None  # None: a task without logits
    out_params: dict[str, Any] = {"binary_data": {"type": "boolean"}}
    if logits is not None:
        out_params["classification"] = {
            "type": "integer", "minimum": 0, "maximum": v2_mod.MAX_CLASSIFICATION,
            "description": "Triton's classification extension, on the logits output "
                           f"('{logits.public}') only: answer each sample's top N classes as "
                           "BYTES \"<value>:<index>:<label>\" (0: the output)"}
    request = {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "inputs": inputs,
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"enum": outs},
            "parameters": {"type": "object", "additionalProperties": False, "properties": out_params}}},
            "description": "the outputs to answer (none: every output)"},
        "parameters": {"type": "object", "properties": {"binary_data_output": {
            "type": "boolean", "description": "the default of outputs[].parameters.binary_data (false)"}}}},
        "description": f"A JSON header, then (binary tensor data extension) the inputs' bytes; a body of at most "
                       f"{s.max_body_bytes} bytes (413)"}
    batch = {"type": "integer", "minimum": 1, "maximum": s.max_batch_size}
    binary_size = {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}}

    def answered(t: Any) -> dict[str, Any]:  # output t, as itself
        dims = [{"const": d} if d > 0 else {"type": "integer", "minimum": 0} for d in t.shape[1:]]
        return {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
            "name": {"enum": sorted({t.name, t.public})}, "datatype": {"const": v2_mod.datatype(t.dtype)},
            "shape": {"type": "array", "prefixItems": [batch, *dims], "minItems": len(t.shape),
                      "maxItems": len(t.shape)},
            "data": {"type": "array", "items": {"type": "number"}}, "parameters": binary_size}}

    classified = None if logits is None else {"type": "object", "required": ["name", "datatype", "shape"],
                                              "properties": {
        "name": {"enum": sorted({logits.name, logits.public})}, "datatype": {"const": "BYTES"},
        "shape": {"type": "array", "prefixItems": [batch, {"type": "integer", "minimum": 1,
                                                           "maximum": len(spec.labels)}], "minItems": 2, "maxItems": 2},
        "data": {"type": "array", "items": {"type": "string"},
                 "description": "\"<value>:<index>:<label>\", value as C's %f, each sample's highest first"},
        "parameters": binary_size},
        "description": "the logits asked for with parameters.classification N: min(N, classes) per sample"}
    answer = {"type": "object", "required": ["model_name", "model_version", "outputs"], "properties": {
        "model_name": {"const": spec.name}, "model_version": {"const": v2_mod.VERSION}, "id": {"type": "string"},
        "outputs": {"type": "array", "minItems": 1, "maxItems": len(outs),  # each output by name and by alias
                    "items": {"oneOf": [*map(answered, io_.outputs), *([classified] if classified else [])]}}}}
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
