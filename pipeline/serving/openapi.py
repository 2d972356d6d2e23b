"""OpenAPI fragments for the bodies `pipe serve` reads by hand, and the offline Swagger UI page.

FastAPI's own /docs page loads Swagger UI's JavaScript and CSS from a CDN: blank on a machine without
internet. `pipe serve` instead serves the copies vendored by the pinned `fastapi-offline` package
(Swagger UI 5, which renders OpenAPI 3.1) from its own /docs/ paths; without that package it serves no
/docs page at all (a page that silently stays blank is worse), and /openapi.json stays available.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from pipeline.serving.spec import Spec
from pipeline.serving.validate import KINDS
from pipeline.serving.wire import PACKAGE

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


def predict(spec: Spec) -> dict[str, Any]:
    if spec.text is not None:
        t = spec.text
        description = (f"Exactly one of `text` (1..N strings, encoded with the package's {t.vocab_size}-entry "
                       f"character vocabulary, truncated to {t.max_len}) or `inputs` (int64 token ids [N, L], "
                       f"padded with {t.pad_id} or truncated to {t.max_len}).")
        props = {"text": {"type": "array", "items": {"type": "string", "minLength": 1},
                          "example": ["这个手机很好用"]},
                 "inputs": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}},
                            "description": "int64 [N, L] token ids"}}
    else:
        dims = ", ".join(str(d) for d in spec.sample_shape)
        description = (f"Exactly one of `inputs` ({spec.inp['dtype']} [N, {dims}], preprocessed) or `images` "
                       "(base64 PNG/JPEG, resized and normalised as at training time).")
        props = {"inputs": {"type": "array", "items": {}, "description": f"{spec.inp['dtype']} [N, {dims}]"},
                 "images": {"type": "array", "items": {"type": "string", "format": "byte"}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "description": description, "properties": props}}}},
        "responses": {"200": {"description": "One entry per sample", "content": {"application/json": {"schema": {
            "type": "object", "properties": {
                "labels": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "array", "items": {"type": "number"}},
                "logits": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}}}},
            **errors()}}


def serving() -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/proto": {"schema": {"type": "string", "format": "binary", "description": f"{PACKAGE}.Request"}},
        "application/json": {"schema": {"type": "object", "properties": {
            "tensor": {"type": "array", "items": {"type": "object"}},
            "fetch_var_names": {"type": "array", "items": {"type": "string"}},
            "log_id": {"type": "integer"}}}}}},
        "responses": {"200": {"description": "A Response in the request's format"}, **errors()}}


def errors() -> dict[str, Any]:
    schema = {"type": "object", "properties": {"error": {"type": "object", "properties": {
        "code": {"type": "integer"}, "type": {"type": "string"}, "message": {"type": "string"}}}}}
    return {str(code): {"description": kind, "content": {"application/json": {"schema": schema}}}
            for code, kind in KINDS.items() if code not in (404, 405)}
