"""`pipe serve` as a real process on a free port on 127.0.0.1, started and stopped by these tests:
served outputs equal the Paddle predictor's; concurrent requests share one predictor run; every kind
of bad request gets its status with the fixed error schema (and the server stays up); fuzzed bodies
never get a 5xx; queue full -> 503; timeout -> 504; /readyz before warm-up and while draining; SIGTERM
drains and exits 0; a tampered package is refused; Paddle Serving's real client (Python 3.9) round-trips.

The PIPE_FAULT_HOLD_PREDICTOR hook (a file; predictors wait while it exists) makes the queue and drain
tests deterministic. Every request targets 127.0.0.1 (one test: 127.0.0.2, also loopback) and is bounded.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline import artifacts, data as data_mod
from pipeline.bench import loadgen
from pipeline.serving import batcher, predictor as predictor_mod, validate, wire
from tests.conftest import arrays
from tests.serving_helpers import (REPO, metric, package_predictor, packaged_run, serving_client_python, start_server,
                                   until as _until, wait_for)

CAP = 8 << 20  # the package's default body cap
MARK = "zq-MARKER-71"  # put into bad requests: must never come back in an answer
JSON_HDR = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def run(trained_digits, tmp_path_factory) -> Path:
    return packaged_run(trained_digits, tmp_path_factory.mktemp("serving"))


@pytest.fixture(scope="module")
def server(run):
    srv = start_server(run / "package")
    yield srv
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    # Nothing above got a 500 or a traceback, even from the fuzz tests.
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def predictor(run):
    return package_predictor(run / "package", np.float32)


@pytest.fixture(scope="module")
def digits(run) -> tuple[np.ndarray, np.ndarray]:
    """(raw uint8 test images N,1,8,8; the model inputs prepared from them)."""
    pre = json.loads((run / "export/manifest.json").read_text())["interface"]["preprocessing"]
    x, _ = arrays(data_mod.load(data_mod.DataConfig(source="digits")).test)
    return x, data_mod.prepare(x, pre)


def _error(r: httpx.Response, code: int, kind: str | None = None) -> dict[str, Any]:
    """The fixed error schema, the expected code, and no echo of the marker."""
    assert r.status_code == code, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "type", "message"}, body
    assert body["error"]["code"] == code and isinstance(body["error"]["message"], str)
    if kind is not None:
        assert body["error"]["type"] == kind, body
    assert MARK not in r.text and "Traceback" not in r.text and "/tmp" not in r.text
    return body["error"]


def _png(img: np.ndarray, fmt: str = "PNG", meta: int = 0) -> str:
    """`meta`: bytes of an extra text chunk (same pixels, bigger file)."""
    from PIL import Image, PngImagePlugin

    buf = io.BytesIO()
    info = PngImagePlugin.PngInfo()
    if meta:
        info.add_text("padding", "x" * meta)
    Image.fromarray(img[0]).save(buf, fmt, **({"pnginfo": info} if fmt == "PNG" else {}))
    return base64.b64encode(buf.getvalue()).decode()


# ------------------------------------------------------------------ outputs


@pytest.mark.slow
def test_served_outputs_equal_the_predictor(client, predictor, digits):
    """Tensors one at a time and in batches of 32, and the raw images as PNG, against the predictor on
    the same batches. Measured: max|diff| 0.0 (the same program, kernels and batch sizes)."""
    raw, x = digits
    got, want = [], []
    for i in range(24):
        r = client.post("/v1/predict", json={"inputs": x[i:i + 1].tolist()})
        assert r.status_code == 200, r.text
        got.append(np.asarray(r.json()["logits"], np.float32))
        want.append(predictor(x[i:i + 1]))
    for i in range(24, len(x), 32):
        r = client.post("/v1/predict", json={"inputs": x[i:i + 32].tolist()})
        body = r.json()
        y = np.asarray(body["logits"], np.float32)
        got.append(y)
        want.append(predictor(x[i:i + 32]))
        assert body["labels"] == [str(k) for k in y.argmax(1)]
        p = np.exp(y - y.max(1, keepdims=True))
        np.testing.assert_allclose(body["scores"], (p / p.sum(1, keepdims=True)).max(1), rtol=1e-6)
    got_all, want_all = np.concatenate(got), np.concatenate(want)
    assert got_all.shape == (len(x), 10)
    assert float(np.abs(got_all - want_all).max()) == 0.0
    # Small image bodies decode on the event loop, big ones on a thread: both give the predictor's outputs.
    # The big ones are the same pixels carrying a large text chunk, so the body passes the inline limit.
    for meta in (0, validate.INLINE_DECODE_BYTES):
        images = [_png(im, meta=meta) for im in raw[:16]]
        assert (sum(map(len, images)) > validate.INLINE_DECODE_BYTES) == (meta > 0)
        r = client.post("/v1/predict", json={"images": images})
        assert r.status_code == 200, r.text
        assert float(np.abs(np.asarray(r.json()["logits"], np.float32) - predictor(x[:16])).max()) == 0.0


@pytest.mark.slow
def test_paddle_serving_wire_format(client, predictor, digits):
    """/GeneralModelService/inference in protobuf (messages from pipe's own descriptor) and JSON."""
    _, x = digits
    msgs = wire.messages()
    req = msgs["Request"](fetch_var_names=["logits"], log_id=11)
    t = req.tensor.add(name="x", alias_name="x", elem_type=1)
    t.shape.extend([4, 1, 8, 8])
    t.float_data.extend(x[:4].ravel().tolist())
    r = client.post("/GeneralModelService/inference", content=req.SerializeToString(),
                    headers={"content-type": "application/proto"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
    resp = msgs["Response"]()
    resp.ParseFromString(r.content)
    (out,) = resp.outputs
    assert (resp.err_no, resp.log_id, out.engine_name) == (0, 11, "general_infer_0")
    (ot,) = out.tensor
    assert list(ot.shape) == [4, 10] and ot.alias_name == "logits" and ot.elem_type == 1
    np.testing.assert_array_equal(np.asarray(ot.float_data, np.float32).reshape(4, 10), predictor(x[:4]))
    body = {"fetch_var_names": ["logits"], "log_id": 3, "tensor": [{
        "float_data": x[:2].ravel().tolist(), "shape": [2, 1, 8, 8], "elem_type": 1, "name": "x", "alias_name": "x"}]}
    r = client.post("/GeneralModelService/inference", json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert (doc["err_no"], doc["log_id"]) == (0, 3)
    jt = doc["outputs"][0]["tensor"][0]
    assert jt["shape"] == [2, 10] and jt["alias_name"] == "logits"
    np.testing.assert_array_equal(np.asarray(jt["float_data"], np.float32).reshape(2, 10), predictor(x[:2]))


def test_only_small_images_decode_on_the_event_loop(digits):
    """Small in bytes and in the pixels their headers declare: a 16 kB PNG of 4096x4096 zeros is small
    in bytes but would block the event loop while it decodes, so it goes to a thread."""
    from PIL import Image

    raw, _ = digits
    assert validate.inline_decode([base64.b64decode(_png(im)) for im in raw[:32]])
    assert not validate.inline_decode([base64.b64decode(_png(raw[0], meta=validate.INLINE_DECODE_BYTES))])
    for fmt, side in (("PNG", 4096), ("JPEG", 512)):  # the PNG header is read directly, a JPEG's by PIL
        buf = io.BytesIO()
        Image.new("L", (side, side)).save(buf, fmt)
        assert len(buf.getvalue()) < validate.INLINE_DECODE_BYTES and not validate.inline_decode([buf.getvalue()])


def test_batches_run_at_bucket_sizes():
    """Few input shapes for oneDNN to cache (see pipeline/serving/predictor.py); every size up to the
    maximum has a bucket at least as big. Padded batches giving the predictor's own outputs is what
    the output tests above check (batches of 2, 3, 24, ... samples)."""
    assert predictor_mod.buckets(32) == [1, 2, 4, 8, 16, 32]
    assert predictor_mod.buckets(24) == [1, 2, 4, 8, 16, 24] and predictor_mod.buckets(1) == [1]
    for m in (1, 5, 24, 64):
        assert all(any(b >= n for b in predictor_mod.buckets(m)) for n in range(1, m + 1))


@pytest.mark.slow
def test_bench_load_generator_counts_answers_and_errors(server, digits):
    """The serving benchmark's load generator (`pipeline/bench/loadgen.py`) against this server: every request
    answered and counted, non-200 answers counted as errors."""
    _, x = digits
    good = json.dumps({"inputs": x[:1].tolist()}).encode()
    r = loadgen.run(server.url, [good], clients=4, count=5)
    assert (r["done"], r["errors"]) == (20, 0) and r["p99"] >= r["p50"] > 0
    r = loadgen.run(server.url, [good, b"{}"], clients=2, count=4)  # every other body is a 422
    assert (r["done"], r["errors"]) == (8, 4)


@pytest.mark.slow
def test_model_metrics_docs(client):
    m = client.get("/v1/model").json()
    assert m["name"] == "digits_cnn" and m["precision"] == "fp32" and m["accepts_images"] is True
    assert m["input"] == {"name": "x", "alias": "x", "dtype": "float32", "shape": [-1, 1, 8, 8]}
    assert m["batching"]["max_batch_size"] == 32 and m["limits"]["max_body_bytes"] == CAP
    assert "/tmp" not in json.dumps(m)  # no paths
    text = client.get("/metrics").text
    for name in ("pipe_requests_total", "pipe_request_duration_seconds_bucket", "pipe_batch_size_bucket",
                 "pipe_batch_requests_bucket", "pipe_queue_depth", "pipe_inflight_requests", "pipe_ready"):
        assert name in text, name
    assert metric(text, "pipe_ready") == 1.0
    spec = client.get("/openapi.json").json()
    assert {"/v1/predict", "/GeneralModelService/inference", "/v1/model", "/livez", "/readyz"} <= set(spec["paths"])
    assert not any(w in p for p in spec["paths"] for w in ("upload", "reload", "register", "load"))
    _docs_are_offline(client)
    assert client.get("/livez").json() == {"status": "alive"} and client.get("/readyz").json() == {"status": "ready"}


def _docs_are_offline(client: httpx.Client) -> None:
    """/docs loads Swagger UI from this server (fastapi-offline's vendored copy), never from a CDN; without
    that package there is no /docs page, and /openapi.json still answers."""
    import importlib.util

    page = client.get("/docs")
    if importlib.util.find_spec("fastapi_offline") is None:
        _error(page, 404, "not_found")
        return
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(refs) == ["/docs/favicon.png", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"], refs
    assert "http://" not in page.text and "https://" not in page.text
    js = client.get("/docs/swagger-ui-bundle.js")
    assert js.status_code == 200 and "SwaggerUIBundle" in js.text[:2000]
    assert client.get("/docs/swagger-ui.css").status_code == 200
    _error(client.get("/docs/..%2Fcore.py"), 404)
    _error(client.get("/docs/core.py"), 404)


# ------------------------------------------------------------------ bad requests


def _gz(data: bytes) -> bytes:
    return gzip.compress(data)


_SAMPLE = [[[[0.0] * 8] * 8]]
BAD = [
    # (id, path, headers, body, code, type)
    ("text/plain", "/v1/predict", {"content-type": "text/plain"}, b"{}", 415, "unsupported_media_type"),
    ("no content type", "/v1/predict", {}, b"{}", 415, "unsupported_media_type"),
    ("brotli", "/v1/predict", {**JSON_HDR, "content-encoding": "br"}, b"{}", 415, "unsupported_media_type"),
    ("truncated json", "/v1/predict", JSON_HDR, ('{"inputs": [1, "' + MARK).encode(), 400, "invalid_json"),
    ("NaN", "/v1/predict", JSON_HDR, b'{"inputs": [[[[NaN]]]]}', 400, "invalid_json"),
    ("Infinity", "/v1/predict", JSON_HDR, b'{"inputs": [[[[Infinity]]]]}', 400, "invalid_json"),
    ("-Infinity", "/v1/predict", JSON_HDR, b'{"inputs": [[[[-Infinity]]]]}', 400, "invalid_json"),
    ("depth 33", "/v1/predict", JSON_HDR, b"[" * 33 + b"]" * 33, 400, "invalid_json"),
    ("depth 5000", "/v1/predict", JSON_HDR, b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "invalid_json"),
    ("invalid utf-8", "/v1/predict", JSON_HDR, b'{"inputs": "\xff\xfe"}', 400, "invalid_json"),
    ("corrupt gzip", "/v1/predict", {**JSON_HDR, "content-encoding": "gzip"}, b"\x1f\x8bnot gzip", 400, "bad_request"),
    ("depth 32 ok, not an object", "/v1/predict", JSON_HDR, b"[" * 32 + b"]" * 32, 422, "invalid_request"),
    ("unknown field", "/v1/predict", JSON_HDR, json.dumps({MARK: 1}).encode(), 422, "invalid_request"),
    ("two fields", "/v1/predict", JSON_HDR, json.dumps({"inputs": _SAMPLE, "images": []}).encode(), 422,
     "invalid_request"),
    ("strings", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[MARK] * 8] * 8]]}).encode(), 422, "invalid_tensor"),
    ("booleans", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[True] * 8] * 8]]}).encode(), 422, "invalid_tensor"),
    ("rank 2", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[1.0, 2.0]]}).encode(), 422, "invalid_tensor"),
    ("dim 7", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[0.0] * 7] * 8]]}).encode(), 422, "invalid_tensor"),
    ("batch 33", "/v1/predict", JSON_HDR, json.dumps({"inputs": _SAMPLE * 33}).encode(), 422, "invalid_tensor"),
    ("ragged", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[0.0] * 8] * 7 + [[0.0] * 9]]]}).encode(), 422,
     "invalid_tensor"),
    ("float32 overflow", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[1e39] * 8] * 8]]}).encode(), 422,
     "invalid_tensor"),
    ("int beyond float32", "/v1/predict", JSON_HDR, json.dumps({"inputs": [[[[10 ** 40] * 8] * 8]]}).encode(), 422,
     "invalid_tensor"),
    ("number beyond double", "/v1/predict", JSON_HDR, b'{"inputs": [[[[1e400]]]]}', 400, "invalid_json"),
    ("bad base64", "/v1/predict", JSON_HDR, json.dumps({"images": [MARK + "!!"]}).encode(), 422, "invalid_image"),
    ("not an image", "/v1/predict", JSON_HDR,
     json.dumps({"images": [base64.b64encode(MARK.encode() * 20).decode()]}).encode(), 422, "invalid_image"),
    ("images not strings", "/v1/predict", JSON_HDR, json.dumps({"images": [[1, 2]]}).encode(), 422, "invalid_request"),
    ("text on an image model", "/v1/predict", JSON_HDR, json.dumps({"text": [MARK]}).encode(), 422, "invalid_request"),
    ("serving: text/plain", "/GeneralModelService/inference", {"content-type": "text/plain"}, b"x", 415,
     "unsupported_media_type"),
    ("serving: bad protobuf", "/GeneralModelService/inference", {"content-type": "application/proto"},
     b"\xff\xff\xff\xff" + MARK.encode(), 400, "invalid_protobuf"),
    ("serving: json not a request", "/GeneralModelService/inference", JSON_HDR, json.dumps({"tensor": MARK}).encode(),
     422, "invalid_request"),
    ("serving: wrong feed name", "/GeneralModelService/inference", JSON_HDR, json.dumps({"tensor": [{
        "float_data": [0.0] * 64, "shape": [1, 1, 8, 8], "elem_type": 1, "name": MARK, "alias_name": MARK}]}).encode(),
     422, "invalid_request"),
    ("serving: int64 elem_type", "/GeneralModelService/inference", JSON_HDR, json.dumps({"tensor": [{
        "int64_data": [0] * 64, "shape": [1, 1, 8, 8], "elem_type": 0, "name": "x", "alias_name": "x"}]}).encode(),
     422, "invalid_tensor"),
    ("serving: shape vs data", "/GeneralModelService/inference", JSON_HDR, json.dumps({"tensor": [{
        "float_data": [0.0] * 63, "shape": [1, 1, 8, 8], "elem_type": 1, "name": "x", "alias_name": "x"}]}).encode(),
     422, "invalid_tensor"),
    ("serving: unknown fetch", "/GeneralModelService/inference", JSON_HDR, json.dumps({
        "fetch_var_names": [MARK], "tensor": [{"float_data": [0.0] * 64, "shape": [1, 1, 8, 8], "elem_type": 1,
                                               "name": "x", "alias_name": "x"}]}).encode(), 422, "invalid_request"),
    ("not found", "/v1/upload", JSON_HDR, b"{}", 404, "not_found"),
]


@pytest.mark.parametrize("path, headers, body, code, kind", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests(client, path, headers, body, code, kind):
    _error(client.post(path, content=body, headers=headers), code, kind)


def test_more_bad_requests_and_still_up(client, digits):
    raw, x = digits
    _error(client.delete("/v1/predict"), 405, "method_not_allowed")
    _error(client.get("/v1/predict"), 405, "method_not_allowed")
    _error(client.post("/v1/predict", json={"images": [_png(raw[0], "GIF")]}), 422, "invalid_image")
    from PIL import Image  # a 5000x5000 PNG is ~25 kB but 25 Mpx: refused before decoding

    buf = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buf, "PNG")
    _error(client.post("/v1/predict", json={"images": [base64.b64encode(buf.getvalue()).decode()]}), 422,
           "invalid_image")
    # Larger images are resized as training did with data.image_size; RGB is converted to grayscale.
    rgb = np.repeat(np.kron(raw[0, 0], np.ones((4, 4), np.uint8))[None], 3, 0).transpose(1, 2, 0)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG")
    assert client.post("/v1/predict", json={"images": [base64.b64encode(buf.getvalue()).decode()]}).status_code == 200
    assert client.get("/livez").status_code == 200
    r = client.post("/v1/predict", json={"inputs": x[:1].tolist()})
    assert r.status_code == 200 and len(r.json()["logits"]) == 1


def test_body_cap(server, client, digits):
    """Exactly at the cap passes; one byte more is 413 from Content-Length (before reading), from the
    stream when there is no Content-Length (chunked), and after gzip decompression."""
    _, x = digits
    body = json.dumps({"inputs": x[:1].tolist()}).encode()
    exact = body + b" " * (CAP - len(body))
    assert len(exact) == CAP
    assert client.post("/v1/predict", content=exact, headers=JSON_HDR).status_code == 200
    _error(client.post("/v1/predict", content=exact + b" ", headers=JSON_HDR), 413, "body_too_large")

    def chunks():
        for i in range(0, CAP + 1, 1 << 20):
            yield (exact + b" ")[i:i + (1 << 20)]

    _error(client.post("/v1/predict", content=chunks(), headers=JSON_HDR), 413, "body_too_large")
    _error(client.post("/v1/predict", content=_gz(exact + b" "), headers={**JSON_HDR, "content-encoding": "gzip"}),
           413, "body_too_large")
    r = client.post("/v1/predict", content=_gz(body), headers={**JSON_HDR, "content-encoding": "gzip"})
    assert r.status_code == 200
    # Headers only, announcing 1 GiB: the answer comes without the server waiting for any body.
    host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1073741824\r\n\r\n")
        head = s.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head[:200]


# ------------------------------------------------------------------ fuzzing

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=40)
_floats = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.floats(allow_nan=False, allow_infinity=False)
_shapes = st.lists(st.integers(0, 9), min_size=0, max_size=5)


@st.composite
def _tensors(draw) -> Any:
    """Nested lists of a random shape, mostly near the model's [N, 1, 8, 8]."""
    shape = draw(st.one_of(_shapes, st.tuples(st.integers(0, 3), st.just(1), st.integers(7, 9), st.integers(7, 9))))
    value = draw(_floats)
    arr: Any = value
    for d in reversed(list(shape)):
        arr = [arr] * d
    return arr


_v1_bodies = st.one_of(
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.builds(lambda t: json.dumps({"inputs": t}).encode(), _tensors()),
    st.builds(lambda b: json.dumps({"images": [base64.b64encode(b).decode()]}).encode(), st.binary(max_size=200)),
    st.builds(lambda v: json.dumps({"images": v}).encode(), _json_values),
)
_ctypes = st.sampled_from(["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain",
                           "", "application/proto", "multipart/form-data"])


def _assert_not_5xx(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        _error(r, r.status_code)


def _nesting(v: Any) -> int:
    if isinstance(v, list):
        return 1 + max((_nesting(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_nesting(x) for x in v.values()), default=0)
    return 0


_tricky_text = st.text(alphabet='[]{}"\\ab\n', max_size=12)
_tricky_json = st.recursive(st.none() | st.integers() | _tricky_text,
                            lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_tricky_text, kids, max_size=3),
                            max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(value=_tricky_json, ensure_ascii=st.booleans(), indent=st.sampled_from([None, 1]))
def test_json_depth_scan_matches_the_parser(value, ensure_ascii, indent):
    """The vectorised pre-parse depth scan agrees with the real nesting, brackets/quotes/escapes in strings."""
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)
    assert validate.json_depth(text.encode()) == _nesting(value)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_v1_bodies, ctype=_ctypes)
def test_fuzz_predict_never_5xx(client, body, ctype):
    _assert_not_5xx(client.post("/v1/predict", content=body, headers={"content-type": ctype} if ctype else {}))


@st.composite
def _serving_protos(draw) -> bytes:
    msgs = wire.messages()
    req = msgs["Request"](log_id=draw(st.integers(0, 2 ** 64 - 1)))
    req.fetch_var_names.extend(draw(st.lists(st.sampled_from(["logits", "fetch_name_0", "other"]), max_size=2)))
    for _ in range(draw(st.integers(0, 2))):
        t = req.tensor.add(name=draw(st.sampled_from(["x", "y", ""])), alias_name=draw(st.sampled_from(["x", ""])),
                           elem_type=draw(st.sampled_from([0, 1, 2, 3, 20, -1])))
        t.shape.extend(draw(st.one_of(_shapes, st.just([1, 1, 8, 8]), st.lists(st.integers(-2 ** 31, 2 ** 31 - 1),
                                                                                max_size=4))))
        n = draw(st.sampled_from([0, 1, 63, 64, 128]))
        t.float_data.extend([draw(_floats)] * n)
        t.int64_data.extend(draw(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=3)))
    return req.SerializeToString()


_serving_bodies = st.one_of(
    st.tuples(_serving_protos(), st.just("application/proto")),
    st.tuples(st.binary(max_size=300), st.sampled_from(["application/proto", "application/json"])),
    st.tuples(_json_values.map(lambda v: json.dumps(v).encode()), st.just("application/json")),
    st.tuples(st.builds(lambda t, s, e, f: json.dumps({"tensor": [{"float_data": t, "shape": s, "elem_type": e,
                                                                   "name": "x"}], "fetch_var_names": f}).encode(),
                        st.lists(_floats, max_size=70) | _json_values, st.one_of(_shapes, _json_values),
                        st.sampled_from([1, 0, "1", None, True]), st.lists(st.text(max_size=4), max_size=2)),
              st.just("application/json")),
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=_serving_bodies)
def test_fuzz_paddle_serving_never_5xx(client, item):
    body, ctype = item
    _assert_not_5xx(client.post("/GeneralModelService/inference", content=body, headers={"content-type": ctype}))


# ------------------------------------------------------------------ load: batching, queue, timeout


@pytest.fixture(scope="module")
def held(run, tmp_path_factory):
    """A server whose predictor waits while `hold` exists: queue 4, timeout 4 s. One HTTP process: these tests
    count one queue and kill its one predictor (test_serve_workers.py runs several)."""
    hold = tmp_path_factory.mktemp("hold") / "hold"
    srv = start_server(run / "package", "--queue-size", "4", "--timeout", "4", "--http-workers", "1",
                       env={batcher.HOLD_ENV: str(hold)})
    yield srv, hold
    hold.unlink(missing_ok=True)
    assert srv.stop() == 0


def _post_many(url: str, xs: list[np.ndarray]) -> list[httpx.Response]:
    def one(x: np.ndarray) -> httpx.Response:
        return httpx.post(url + "/v1/predict", json={"inputs": x.tolist()}, timeout=30)

    with cf.ThreadPoolExecutor(len(xs)) as pool:
        return list(pool.map(one, xs))


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


def _post_held(pool: cf.ThreadPoolExecutor, url: str, xs: list[np.ndarray]) -> list[cf.Future]:
    """The first request is sent alone and taken by the held predictor thread; then the rest, which queue
    behind it (or are refused once the queue is full)."""
    first = [pool.submit(_post_many, url, xs[:1])]
    _until(lambda: (lambda m: metric(m, "pipe_inflight_requests") == 1 and metric(m, "pipe_queue_depth") == 0)(
        _metrics(url)))
    return first + [pool.submit(_post_many, url, xs[1:])]


@pytest.mark.slow
def test_concurrent_requests_share_one_run(held, predictor, digits):
    srv, hold = held
    _, x = digits
    hold.touch()
    m0 = _metrics(srv.url)
    with cf.ThreadPoolExecutor(2) as pool:
        futs = _post_held(pool, srv.url, [x[i:i + 1] for i in range(5)])
        # One request is taken by the (held) predictor thread, four wait in the queue behind it.
        _until(lambda: metric(_metrics(srv.url), "pipe_queue_depth") == 4)
        hold.unlink()
        answers = [r for f in futs for r in f.result(timeout=30)]
    m1 = _metrics(srv.url)
    assert [r.status_code for r in answers] == [200] * 5
    assert metric(m1, "pipe_batch_size_count") - metric(m0, "pipe_batch_size_count") == 1  # one run
    assert metric(m1, "pipe_batch_size_sum") - metric(m0, "pipe_batch_size_sum") == 5  # of five samples
    assert metric(m1, "pipe_batch_requests_sum") - metric(m0, "pipe_batch_requests_sum") == 5
    got = np.concatenate([np.asarray(r.json()["logits"], np.float32) for r in answers])
    want = np.concatenate([predictor(x[i:i + 1]) for i in range(5)])
    # Batch-of-5 vs batch-of-1 kernels: equal on this model, allow float rounding.
    assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())


@pytest.mark.slow
def test_queue_full_gets_503(held, digits):
    srv, hold = held
    _, x = digits
    hold.touch()
    refused = 'pipe_requests_total{code="503",endpoint="/v1/predict"}'
    before = metric(_metrics(srv.url), refused, 0)
    with cf.ThreadPoolExecutor(2) as pool:
        futs = _post_held(pool, srv.url, [x[:1]] * 8)
        # 1 taken by the held predictor + 4 queued; the other 3 are refused at once.
        _until(lambda: metric(_metrics(srv.url), refused, 0) - before >= 3)
        hold.unlink()
        answers = [r for f in futs for r in f.result(timeout=30)]
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 5 + [503] * 3
    for r in answers:
        if r.status_code == 503:
            _error(r, 503, "overloaded")
            assert r.headers["retry-after"] == "1"


@pytest.mark.slow
def test_timeout_gets_504_and_the_server_recovers(held, digits):
    srv, hold = held
    _, x = digits
    hold.touch()
    t0 = time.monotonic()
    r = httpx.post(srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=30)
    _error(r, 504, "timeout")
    assert 3.5 <= time.monotonic() - t0 < 10
    hold.unlink()
    assert httpx.post(srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=30).status_code == 200


@pytest.mark.slow
def test_a_dead_predictor_process_is_replaced(held, digits):
    """SIGKILL the predictor child (as the OOM killer would): its batch gets a 500, then the server
    starts a new one and answers again; the HTTP process never went down."""
    srv, _ = held
    _, x = digits
    (child,) = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    Path(f"/proc/{child}/cmdline").read_bytes().index(b"--predictor")  # it is the predictor, not something else
    os.kill(int(child), signal.SIGKILL)
    r = httpx.post(srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=30)
    _error(r, 500, "internal")
    deadline = time.monotonic() + 60
    while True:  # the restart (import, load, warm-up) takes a few seconds; requests meanwhile may time out
        r = httpx.post(srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=30)
        if r.status_code == 200:
            break
        _error(r, 504)
        assert time.monotonic() < deadline
    assert httpx.get(srv.url + "/livez", timeout=5).status_code == 200


# ------------------------------------------------------------------ lifecycle


@pytest.mark.slow
def test_readiness_and_sigterm_drain(run, tmp_path, digits):
    """--host 127.0.0.2 warns. /readyz is 503 until warm-up; then a request is held in flight, SIGTERM
    arrives: /readyz turns 503, new requests get 503, the in-flight one completes 200, exit 0."""
    _, x = digits
    hold = tmp_path / "hold"
    hold.touch()
    srv = start_server(run / "package", "--host", "127.0.0.2", "--drain", "20", env={batcher.HOLD_ENV: str(hold)},
                       ready=False)
    try:
        assert srv.url.startswith("http://127.0.0.2:")
        _until(lambda: "warning: listening on 127.0.0.2" in "".join(srv.err), 10)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            _error(c.get("/readyz"), 503, "not_ready")
            r = c.post("/v1/predict", json={"inputs": x[:1].tolist()})
            _error(r, 503, "not_ready")
            assert r.headers["retry-after"] == "1"
            hold.unlink()
            wait_for(srv, "/readyz", time.monotonic() + 30)
            hold.touch()
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(httpx.post, srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=30)
            _until(lambda: metric(_metrics(srv.url), "pipe_inflight_requests") == 1)
            t_sig = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            _until(lambda: httpx.get(srv.url + "/readyz", timeout=5).status_code == 503, 10)
            _error(httpx.get(srv.url + "/readyz", timeout=5), 503, "draining")
            _error(httpx.post(srv.url + "/v1/predict", json={"inputs": x[:1].tolist()}, timeout=5), 503, "draining")
            assert srv.proc.poll() is None  # still draining
            hold.unlink()
            r = fut.result(timeout=30)
        assert r.status_code == 200 and len(r.json()["logits"]) == 1
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - t_sig < 20
        assert any("stopped (" in line for line in srv.out)
    finally:
        hold.unlink(missing_ok=True)
        srv.kill()


def test_tampered_or_foreign_package_is_refused(run, tmp_path, cli):
    bad = tmp_path / "package"
    shutil.copytree(run / "package", bad)
    raw = bytearray((bad / "model.pdiparams").read_bytes())
    raw[64] ^= 0x01
    (bad / "model.pdiparams").write_bytes(bytes(raw))
    code, _, err = cli("serve", bad)
    assert code == 2 and "sha256 mismatch for model.pdiparams" in err and len(err.strip().splitlines()) == 1
    # A file outside the allowlist, even with a correct checksum in the manifest, is refused.
    extra = tmp_path / "extra"
    shutil.copytree(run / "package", extra)
    (extra / "model.pdparams").write_bytes(b"\x80\x04not really a pickle")
    m = json.loads((extra / "manifest.json").read_text())
    m["files"]["model.pdparams"] = {"sha256": artifacts.sha256_file(extra / "model.pdparams"),
                                    "bytes": (extra / "model.pdparams").stat().st_size}
    (extra / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli("serve", extra)
    assert code == 2 and "model.pdparams is not in the package allowlist" in err
    code, _, err = cli("serve", run / "export")
    assert code == 2 and "stage is 'export', expected package" in err


def test_port_in_use_and_bad_flags_exit_2(run, cli):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        code, _, err = cli("serve", run / "package", "--port", str(port))
    assert code == 2 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in err
    code, _, err = cli("serve", run / "package", "--max-batch-size", "0")
    assert code == 2 and "--max-batch-size: must be 1..4096" in err


def test_help_imports_no_server_stack():
    code = ("import sys; from pipeline.cli import main; main(['serve', '--help']); "
            "print(sorted(m for m in ('paddle', 'fastapi', 'uvicorn', 'starlette', 'onnxruntime', 'prometheus_client')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _json_values_in(text: str) -> list[Any]:
    dec, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        value, i = dec.raw_decode(text, i)
        out.append(value)
    return out


@pytest.mark.slow
def test_package_readme_examples_work(server, run, digits, tmp_path):
    """The README's curl and Python examples, run as written (port substituted) against the server."""
    raw, _ = digits
    readme = (run / "package/README.md").read_text().replace("127.0.0.1:8000", server.url.split("//", 1)[1])
    curl_block = _blocks(readme, "sh")[1]
    assert curl_block.count("curl -s") == 2
    if shutil.which("curl"):
        from PIL import Image

        Image.fromarray(raw[0, 0]).save(tmp_path / "picture.png")
        proc = subprocess.run(["bash", "-c", "set -e\n" + curl_block], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        answers = _json_values_in(proc.stdout)
        assert len(answers) == 2 and all(len(a["labels"]) == 1 for a in answers), proc.stdout[:500]
    py = _blocks(readme, "python")
    proc = subprocess.run([sys.executable, "-c", py[0]], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("['"), proc.stderr[-1000:]
    py39 = serving_client_python()
    if py39 is not None:
        proc = subprocess.run([str(py39), "-c", py[1]], cwd=run / "package", capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and len(proc.stdout.strip().splitlines()[-1].split(",")) == 10, \
            proc.stderr[-1000:] + proc.stdout[-500:]


# ------------------------------------------------------------------ the real Paddle Serving client


@pytest.mark.slow
def test_paddle_serving_client_roundtrip(server, run, predictor, digits, tmp_path):
    """paddle-serving-client==0.9.0's HttpClient, protobuf and JSON mode, from Python 3.9."""
    py = serving_client_python()
    if py is None:
        pytest.skip("no Python 3.9 with paddle-serving-client==0.9.0: set PIPE_SERVING_CLIENT_PYTHON or create "
                    ".venv39 (make test does where python3.9 exists); the client has no wheel for Python >= 3.10")
    _, x = digits
    (tmp_path / "x.json").write_text(json.dumps(x[:3].tolist()))
    endpoint = server.url.split("//", 1)[1]
    proc = subprocess.run([str(py), str(REPO / "tests/serving_client_roundtrip.py"),
                           str(run / "package/serving_client_conf.prototxt"), endpoint, str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-500:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = predictor(x[:3])
    assert out["proto"]["type"] == "Response" and out["json"]["type"] == "dict"
    for mode in ("proto", "json"):
        o = out[mode]
        assert (o["shape"], o["alias"], o["elem_type"], o["log_id"], o["err_no"], o["engine"]) == \
            ([3, 10], "logits", 1, 7, 0, "general_infer_0"), o
        np.testing.assert_array_equal(np.asarray(o["data"], np.float32).reshape(3, 10), want)
