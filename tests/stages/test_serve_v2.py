"""The Open Inference Protocol (KServe v2) on `pipe serve`, against a real server on 127.0.0.1 started here:
Triton's own client (`tritonclient.http.InferenceServerClient`) checks health, readiness and metadata and
infers with binary and JSON inputs and outputs, getting exactly /v1/predict's logits for the same inputs;
an unknown model is a 404, a wrong shape or datatype a 400 naming what was expected. Triton's
classification extension (`class_count`) answers each sample's top classes as "value:index:label"
strings, what /v1's logits and labels give written out as Triton's source writes them (binary and JSON).
A text package takes BYTES strings and answers as /v1 does for {"text": [...]}. Raw requests check
the binary framing errors (Inference-Header-Content-Length, binary_data_size), unknown datatypes,
inputs, outputs and output parameters, classification counts that are not integers 0..2**32-1 (400
with {"error": "..."}, never echoing input), the content type (415) and the body cap (413); fuzzed
framings never get a 5xx. /openapi.json documents the /v2 operations.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonclient_http
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from tritonclient.utils import InferenceServerException

from tests.serving_helpers import metric, packaged_text_run, start_server
from tests.stages.test_serve import CAP, MARK, client, digits, run, server  # noqa: F401 (fixtures)

MODEL, OUT = "digits_cnn", "logits"  # the package's spec.name and its output's name (Triton's too)
PROGRAM_OUT = "fetch_name_0"  # the program's own name for it: still taken in requests, never answered unasked
LABELS = [str(k) for k in range(10)]  # the digits package's labels (serving.yaml; the Triton labels.txt)
TEXTS = ["这个东西很好", "差", "我们买了一次还是很满意的东西", "这个" * 20]


@pytest.fixture(scope="module")
def triton(server):
    c = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def x(digits) -> np.ndarray:
    """The first 40 digits test images as model inputs (float32 [N, 1, 8, 8])."""
    return digits[1][:40].astype(np.float32)


def _v1(client: httpx.Client, body: dict[str, Any]) -> np.ndarray:
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 200, r.text[:300]
    return np.asarray(r.json()["logits"], np.float32)


def _v2_error(r: httpx.Response, code: int) -> str:
    """The protocol's error body {"error": "<message>"}, the status, no echo of the marker."""
    assert r.status_code == code, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    assert MARK not in r.text and "Traceback" not in r.text and "/tmp" not in r.text
    return body["error"]


def _infer(triton, x: np.ndarray, binary_in: bool, binary_out: bool | None, version: str = "",
           output: str = OUT, datatype: str = "FP32", name: str = "x", class_count: int = 0) -> Any:
    inp = tritonclient_http.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outputs = None if binary_out is None else [
        tritonclient_http.InferRequestedOutput(output, binary_data=binary_out, class_count=class_count)]
    return triton.infer(MODEL, [inp], outputs=outputs, model_version=version)


def _tritons_classes(logits: np.ndarray, count: int, labels: list[str]) -> list[list[str]]:
    """Triton's classification written out from its source (server src/classification.cc, AddClassResults):
    per sample the `count` highest values (at most all), highest first, equal ones by index, each
    std::to_string(value) (C's "%f") + ":" + index + ":" + the index's label."""
    return [["%f:%d:%s" % (row[i], i, labels[i]) for i in sorted(range(len(row)), key=lambda i: (-row[i], i))[:count]]
            for row in logits.tolist()]


def _strings(top: np.ndarray) -> list[list[str]]:
    """tritonclient's BYTES output (bytes elements from binary, str from JSON) as lists of str."""
    return [[t.decode() if isinstance(t, bytes) else t for t in row] for row in top.tolist()]


# ------------------------------------------------------------------ tritonclient: health, metadata


@pytest.mark.slow
def test_health_readiness_and_metadata(triton, client):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(MODEL) and triton.is_model_ready(MODEL, "1")
    assert not triton.is_model_ready("other") and not triton.is_model_ready(MODEL, "2")
    meta = triton.get_server_metadata()
    assert meta["name"] == "pipe" and meta["extensions"] == ["classification", "model_configuration", "binary_tensor_data", "statistics"] and meta["version"]
    want = {"name": MODEL, "versions": ["1"], "platform": "paddle_inference",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
            "outputs": [{"name": OUT, "datatype": "FP32", "shape": [-1, 10]}]}
    assert triton.get_model_metadata(MODEL) == want
    assert triton.get_model_metadata(MODEL, "1") == want
    for name, version in (("other", ""), (MODEL, "2")):
        with pytest.raises(InferenceServerException) as e:
            triton.get_model_metadata(name, version)
        assert e.value.status() == "404" and MODEL in e.value.message()
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert client.get(f"/v2/models/{MODEL}/ready").json() == {"name": MODEL, "ready": True}
    _v2_error(client.get("/v2/models/other/ready"), 404)
    _v2_error(client.get("/v2/nothing-here"), 404)


# ------------------------------------------------------------------ tritonclient: inference


@pytest.mark.slow
@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False, None], ids=["binary-out", "json-out", "default-out"])
def test_infer_equals_v1(triton, client, x, binary_in, binary_out):
    """The same inputs: exactly /v1/predict's logits, one sample and a batch of 32, whatever the framing."""
    for batch in (x[:1], x[1:33]):
        want = _v1(client, {"inputs": batch.tolist()})
        result = _infer(triton, batch, binary_in, binary_out)
        got = result.as_numpy(OUT)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        out = result.get_output(OUT)
        # No output requested: tritonclient asks for binary_data_output (all outputs binary).
        if binary_out is False:
            assert "data" in out and "parameters" not in out
        else:
            assert out["parameters"] == {"binary_data_size": got.nbytes} and "data" not in out
        assert result.get_response()["model_name"] == MODEL and result.get_response()["model_version"] == "1"


@pytest.mark.slow
def test_versions_alias_and_request_id(triton, client, x):
    want = _v1(client, {"inputs": x[:3].tolist()})
    np.testing.assert_array_equal(_infer(triton, x[:3], True, True, version="1").as_numpy(OUT), want)
    np.testing.assert_array_equal(_infer(triton, x[:3], True, False, output=PROGRAM_OUT).as_numpy(PROGRAM_OUT),
                                  want)
    inp = tritonclient_http.InferInput("x", [3, 1, 8, 8], "FP32").set_data_from_numpy(x[:3])
    assert triton.infer(MODEL, [inp], request_id="req-7").get_response()["id"] == "req-7"


@pytest.mark.slow
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
@pytest.mark.parametrize("count", [1, 3])
def test_classification_is_v1s_logits_and_labels(triton, client, x, count, binary_out):
    """class_count N: a BYTES [batch, N] output of "value:index:label", each sample's top N of the logits
    /v1 answers for the same inputs, the first one /v1's label; binary as 4-byte lengths and the strings."""
    for batch in (x[:1], x[1:33]):
        v1 = client.post("/v1/predict", json={"inputs": batch.tolist()}).json()
        logits = np.asarray(v1["logits"], np.float32)
        result = _infer(triton, batch, True, binary_out, class_count=count)
        top = result.as_numpy(OUT)
        assert top.dtype == np.object_ and top.shape == (len(batch), count)
        assert all(isinstance(t, bytes if binary_out else str) for t in top.ravel())
        want = _tritons_classes(logits, count, LABELS)
        assert _strings(top) == want
        assert [row[0].split(":")[2] for row in want] == v1["labels"]
        scores = np.asarray([[float(t.split(":")[0]) for t in row] for row in want])
        np.testing.assert_allclose(scores, -np.sort(-logits, 1)[:, :count], rtol=0, atol=5e-7)  # six decimals
        out = result.get_output(OUT)
        assert out["datatype"] == "BYTES" and out["shape"] == [len(batch), count]
        if binary_out:
            assert out["parameters"] == {"binary_data_size": sum(4 + len(t) for row in want for t in row)}
        else:
            assert "parameters" not in out and out["data"] == [t for row in want for t in row]


@pytest.mark.slow
def test_classification_framing_counts_and_outputs(client, x):
    """Raw requests: the binary BYTES framing, a count past the classes (all of them, as Triton clamps),
    0 (the output itself, as on Triton), and the output (under the program's name, as clients written
    before names were public ask) plus its classification under its name."""
    v1 = np.asarray(_v1(client, {"inputs": x[:2].tolist()}), np.float32)
    body, headers = _framed({"inputs": [_tensor(512, shape=[2, 1, 8, 8])],
                             "outputs": [{"name": OUT, "parameters": {"classification": 3, "binary_data": True}}]},
                            x[:2].tobytes())
    r = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text[:300]
    n = int(r.headers["inference-header-content-length"])
    head, blob = json.loads(r.content[:n]), r.content[n:]
    want = [t.encode() for row in _tritons_classes(v1, 3, LABELS) for t in row]
    assert head["outputs"] == [{"name": OUT, "datatype": "BYTES", "shape": [2, 3],
                                "parameters": {"binary_data_size": len(blob)}}]
    assert blob == b"".join(struct.pack("<I", len(t)) + t for t in want)
    for count, shape in ((10, [2, 10]), (11, [2, 10]), (2**32 - 1, [2, 10]), (0, [2, 10])):
        r = client.post(f"/v2/models/{MODEL}/infer", json={
            "inputs": [_tensor(data=x[:2].ravel().tolist(), shape=[2, 1, 8, 8])],
            "outputs": [{"name": OUT, "parameters": {"classification": count}}]})
        assert r.status_code == 200, r.text[:300]
        (out,) = r.json()["outputs"]
        assert out["shape"] == shape
        if count:
            assert out["datatype"] == "BYTES"
            assert out["data"] == [t for row in _tritons_classes(v1, 10, LABELS) for t in row]
        else:
            assert out["datatype"] == "FP32"
            assert np.asarray(out["data"], np.float32).reshape(2, 10).tolist() == v1.tolist()
    r = client.post(f"/v2/models/{MODEL}/infer", json={
        "inputs": [_tensor(data=x[:2].ravel().tolist(), shape=[2, 1, 8, 8])],
        "outputs": [{"name": PROGRAM_OUT}, {"name": "logits", "parameters": {"classification": 1}}]})
    assert r.status_code == 200, r.text[:300]
    raw, top = r.json()["outputs"]
    assert np.asarray(raw["data"], np.float32).reshape(2, 10).tolist() == v1.tolist()
    assert top == {"name": "logits", "datatype": "BYTES", "shape": [2, 1],
                   "data": [row[0] for row in _tritons_classes(v1, 1, LABELS)]}


def test_unknown_model_wrong_shape_and_datatype(triton, x):
    with pytest.raises(InferenceServerException) as e:
        triton.infer("no_such_model", [tritonclient_http.InferInput("x", [1, 1, 8, 8], "FP32").set_data_from_numpy(
            x[:1])])
    assert e.value.status() == "404" and "digits_cnn" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _infer(triton, x[:2, :, :, :7].copy(), True, True)
    assert e.value.status() == "400" and "expected float32 [N, 1, 8, 8]" in e.value.message(), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _infer(triton, x[:2].astype(np.int64), True, True, datatype="INT64")
    assert e.value.status() == "400" and "datatype INT64, expected FP32" in e.value.message(), e.value.message()
    with pytest.raises(InferenceServerException) as e:  # more samples than max_batch_size
        _infer(triton, np.concatenate([x, x]), False, True)
    assert e.value.status() == "400" and "1 <= N <= 32" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _infer(triton, np.full((1, 1, 8, 8), np.nan, np.float32), True, True)
    assert e.value.status() == "400" and "finite" in e.value.message()


# ------------------------------------------------------------------ raw requests: framing and limits


def _framed(header: dict[str, Any], binary: bytes = b"", length: str | None = "auto") -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    headers = {"content-type": "application/octet-stream"}
    if length == "auto":
        headers["inference-header-content-length"] = str(len(head))
    elif length is not None:
        headers["inference-header-content-length"] = length
    return head + binary, headers


def _tensor(binary: int | None = None, **kw: Any) -> dict[str, Any]:
    t = {"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", **kw}
    if binary is not None:
        t["parameters"] = {"binary_data_size": binary}
    return t


_ONE = np.zeros((1, 1, 8, 8), np.float32).tobytes()  # 256 bytes
BAD = [
    ("header-not-a-number", {"inputs": [_tensor(256)]}, _ONE, "abc"),
    ("header-negative", {"inputs": [_tensor(256)]}, _ONE, "-1"),
    ("header-past-the-body", {"inputs": [_tensor(256)]}, _ONE, "100000"),
    ("header-too-short", {"inputs": [_tensor(256)]}, _ONE, "5"),
    ("header-exponent", {"inputs": [_tensor(256)]}, _ONE, "1e2"),
    ("size-over-the-body", {"inputs": [_tensor(512)]}, _ONE, "auto"),
    ("size-under-the-body", {"inputs": [_tensor(128)]}, _ONE, "auto"),
    ("size-not-shape-x-datatype", {"inputs": [_tensor(128, shape=[2, 1, 8, 8])]}, _ONE[:128], "auto"),
    ("size-negative", {"inputs": [_tensor(-1)]}, b"", "auto"),
    ("size-without-header", {"inputs": [_tensor(256)]}, _ONE, None),
    ("bytes-no-input-claims", {"inputs": [_tensor(data=[0.0] * 64)]}, _ONE, "auto"),
    ("data-and-size", {"inputs": [_tensor(256, data=[0.0] * 64)]}, _ONE, "auto"),
    ("unknown-datatype", {"inputs": [_tensor(256, datatype=f"FP128{MARK}")]}, _ONE, "auto"),
    ("datatype-not-a-string", {"inputs": [_tensor(256, datatype=["FP32"])]}, _ONE, "auto"),
    ("missing-input", {"inputs": []}, b"", "auto"),
    ("other-input-name", {"inputs": [_tensor(256, name=MARK)]}, _ONE, "auto"),
    ("two-inputs", {"inputs": [_tensor(256), _tensor(256)]}, _ONE + _ONE, "auto"),
    ("unknown-output", {"inputs": [_tensor(256)], "outputs": [{"name": MARK}]}, _ONE, "auto"),
    ("output-name-not-a-string", {"inputs": [_tensor(256)], "outputs": [{"name": [OUT]}]}, _ONE, "auto"),
    ("output-twice", {"inputs": [_tensor(256)], "outputs": [{"name": OUT}, {"name": OUT}]}, _ONE, "auto"),
    # Triton answers these counts 500 "Unable to set 'classification'"; bad input is never a 5xx here.
    *((f"classification-{name}", {"inputs": [_tensor(256)], "outputs": [{"name": OUT, "parameters": {
        "classification": count}}]}, _ONE, "auto")
      for name, count in (("negative", -1), ("fraction", 1.5), ("float", 3.0), ("string", "3"), ("true", True),
                          ("null", None), ("2**32", 2**32), ("list", [3]))),
    ("output-parameter-unknown", {"inputs": [_tensor(256)], "outputs": [{"name": OUT, "parameters": {"x": 1}}]},
     _ONE, "auto"),
    ("binary-data-not-bool", {"inputs": [_tensor(256)], "outputs": [{"name": OUT, "parameters": {
        "binary_data": 1, "classification": 1}}]}, _ONE, "auto"),
    ("shared-memory", {"inputs": [_tensor(shape=[1, 1, 8, 8], parameters={"shared_memory_region": MARK})]}, b"",
     "auto"),
    ("no-inputs-field", {"input": [_tensor(256)]}, _ONE, "auto"),
    ("shape-not-integers", {"inputs": [_tensor(data=[0.0] * 64, shape=[1, 1, 8, "8"])]}, b"", "auto"),
    ("shape-rank-100", {"inputs": [_tensor(data=[0.0], shape=[1] * 100)]}, b"", "auto"),
    ("data-count-not-shape", {"inputs": [_tensor(data=[0.0] * 63)]}, b"", "auto"),
    ("data-strings", {"inputs": [_tensor(data=[MARK] * 64)]}, b"", "auto"),
    ("data-ragged", {"inputs": [_tensor(data=[[0.0], [0.0, 1.0]])]}, b"", "auto"),
    ("id-not-a-string", {"id": 7, "inputs": [_tensor(256)]}, _ONE, "auto"),
    ("binary-nan", {"inputs": [_tensor(256)]}, np.full(64, np.nan, np.float32).tobytes(), "auto"),
]


@pytest.mark.parametrize("doc, binary, length", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_requests_get_400(client, doc, binary, length):
    body, headers = _framed(doc, binary, length)
    _v2_error(client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers), 400)


@pytest.mark.slow
def test_framing_that_is_right_is_accepted(client, x):
    """The same raw framing as the table, done right: JSON data without the header, binary after it."""
    want = _v1(client, {"inputs": x[:1].tolist()})
    body, headers = _framed({"inputs": [_tensor(256)], "outputs": [{"name": OUT, "parameters": {"binary_data": True}}]},
                            x[:1].tobytes())
    r = client.post(f"/v2/models/{MODEL}/versions/1/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text[:300]
    n = int(r.headers["inference-header-content-length"])
    head = json.loads(r.content[:n])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 40}
    np.testing.assert_array_equal(np.frombuffer(r.content[n:], "<f4").reshape(1, 10), want)
    r = client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [_tensor(data=x[:1].ravel().tolist())]})
    assert r.status_code == 200 and "inference-header-content-length" not in r.headers
    np.testing.assert_array_equal(np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(1, 10), want)


def test_content_type_body_cap_and_bad_json(client, server):
    path = f"/v2/models/{MODEL}/infer"
    _v2_error(client.post(path, content=b"{}", headers={"content-type": "text/plain"}), 415)
    _v2_error(client.post(path, content=b"{" * 100, headers={"content-type": "application/json"}), 400)
    _v2_error(client.post(path, content=b'{"inputs": [NaN]}', headers={"content-type": "application/json"}), 400)
    body, headers = _framed({"inputs": [_tensor(CAP)]}, b"\0" * CAP)
    assert len(body) > CAP
    _v2_error(client.post(path, content=body, headers=headers), 413)
    _v2_error(client.post(path, content=iter([body[:CAP // 2], body[CAP // 2:]]), headers=headers), 413)  # chunked
    text = client.get("/metrics").text
    assert metric(text, f'pipe_requests_total{{code="413",endpoint="{path}"}}') >= 2


# Header values HTTP can carry (visible characters, no edge whitespace; non-ASCII goes as UTF-8 bytes).
_header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x3000, exclude_categories=("Cc", "Cs", "Zs")),
                       max_size=5)
_header_lengths = st.one_of(st.none(), st.integers(-3, 400).map(str), _header_text,
                            st.sampled_from(["", "0x10", "１２", "1 2", "99999999999999999999"]))
_docs = st.fixed_dictionaries({}, optional={
    "inputs": st.lists(st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["x", "y", 1, None]),
        "shape": st.one_of(st.just([1, 1, 8, 8]), st.lists(st.integers(-1, 40), max_size=5), st.just("1")),
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "FP64", "X", 3]),
        "parameters": st.one_of(st.fixed_dictionaries({"binary_data_size": st.integers(-1, 600)}),
                                st.just([]), st.just({})),
        "data": st.one_of(st.lists(st.floats(allow_nan=False), max_size=70), st.text(max_size=3)),
    }), max_size=2),
    "outputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from([OUT, PROGRAM_OUT, "z"])}, optional={
        "parameters": st.dictionaries(st.sampled_from(["binary_data", "classification", "x"]),
                                      st.booleans() | st.integers() | st.floats(allow_nan=False))}),
        max_size=2),
    "parameters": st.dictionaries(st.sampled_from(["binary_data_output", "timeout"]), st.booleans() | st.none()),
})


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_docs, binary=st.binary(max_size=300), length=_header_lengths, junk=st.binary(max_size=40),
       mode=st.sampled_from(["raw", "random", "exact"]))
def test_fuzz_v2_framing_never_5xx(client, doc, binary, length, junk, mode):
    """Random header lengths, JSON headers and binary bodies, or plain bytes, or a framing whose lengths are
    right around random shapes, datatypes and bytes: a 200 or a 4xx with the protocol's error body, never
    a 5xx."""
    headers = {"content-type": "application/octet-stream"}
    if mode == "exact":
        for t in doc.get("inputs", [])[:1]:
            t["parameters"] = {"binary_data_size": len(binary)}
            t.pop("data", None)
        length = str(len(json.dumps(doc).encode()))
    body = junk if mode == "raw" else json.dumps(doc).encode() + binary
    if length is not None:
        headers["inference-header-content-length"] = length.encode("utf-8")
    r = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        _v2_error(r, r.status_code)


@pytest.mark.slow
def test_openapi_documents_v2(client):
    doc = client.get("/openapi.json").json()
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model_name}",
                 "/v2/models/{model_name}/ready", "/v2/models/{model_name}/versions/{model_version}/ready"):
        assert "get" in doc["paths"][path]
    for path in ("/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{model_version}/infer"):
        op = doc["paths"][path]["post"]
        assert set(op["responses"]) == {"200", "400", "404", "408", "413", "415", "500", "503", "504"}
        error = op["responses"]["400"]["content"]["application/json"]["schema"]
        assert error["properties"] == {"error": {"type": "string", "description": "never echoes the request"}}
        request = op["requestBody"]["content"]["application/json"]["schema"]
        assert request["properties"]["inputs"]["items"]["properties"]["datatype"]["enum"] == ["FP32"]
        out_params = request["properties"]["outputs"]["items"]["properties"]["parameters"]["properties"]
        assert out_params["classification"] == {**out_params["classification"], "type": "integer", "minimum": 0,
                                                "maximum": 2**32 - 1}
        answer = op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["outputs"]["items"]
        assert [o["properties"]["datatype"]["const"] for o in answer["oneOf"]] == ["FP32", "BYTES"]
        assert "Inference-Header-Content-Length" in {p["name"] for p in op["parameters"]}


def _readme_block(run: Path, url: str) -> str:
    """The package README's tritonclient example (its third Python block), port substituted."""
    readme = (run / "package/README.md").read_text(encoding="utf-8")
    block = re.findall(r"```python\n(.*?)```", readme, re.S)[2]
    assert "tritonclient" in block
    return block.replace("127.0.0.1:8000", url.removeprefix("http://"))


@pytest.mark.slow
def test_package_readme_example_works(server, run):
    proc = subprocess.run([sys.executable, "-c", _readme_block(run, server.url)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and re.fullmatch(r"\[\d\]\n", proc.stdout), proc.stderr[-1000:]


# ------------------------------------------------------------------ a text package


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Path:
    return packaged_text_run(tmp_path_factory.mktemp("text-serving-v2"))


@pytest.fixture(scope="module")
def text_server(text_run):
    srv = start_server(text_run / "package")
    yield srv
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.mark.slow
def test_text_readme_example_works(text_server, text_run):
    proc = subprocess.run([sys.executable, "-c", _readme_block(text_run, text_server.url)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and re.fullmatch(r"\[[01] [01]\]\n", proc.stdout), proc.stderr[-1000:]


def _bytes_tensor(texts: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


@pytest.mark.slow
def test_text_bytes_inputs_equal_v1_text(text_server):
    """BYTES strings of shape [N] and [N, 1], binary and JSON, through tritonclient: /v1's {"text": [...]}
    answer exactly; INT64 token ids too; the metadata states the int64 [-1, -1] input."""
    triton = tritonclient_http.InferenceServerClient(text_server.url.removeprefix("http://"))
    with httpx.Client(base_url=text_server.url, timeout=30) as client:
        meta = triton.get_model_metadata("text_cnn")
        assert meta["inputs"] == [{"name": "x", "datatype": "INT64", "shape": [-1, -1]}]
        for texts in (TEXTS[:1], TEXTS):
            want = _v1(client, {"text": texts})
            for shape in ([len(texts)], [len(texts), 1]):
                for binary in (True, False):
                    inp = tritonclient_http.InferInput("x", shape, "BYTES")
                    inp.set_data_from_numpy(np.array([t.encode() for t in texts], np.object_).reshape(shape),
                                            binary_data=binary)
                    got = triton.infer("text_cnn", [inp]).as_numpy(OUT)
                    np.testing.assert_array_equal(got, want)
            ids = np.asarray([[3, 4, 5]] * len(texts), np.int64)
            inp = tritonclient_http.InferInput("x", list(ids.shape), "INT64").set_data_from_numpy(ids)
            np.testing.assert_array_equal(triton.infer("text_cnn", [inp]).as_numpy(OUT),
                                          _v1(client, {"inputs": ids.tolist()}))
        path = "/v2/models/text_cnn/infer"
        for texts, data, code in ((["  "], None, 400), (["好"], struct.pack("<I", 2) + b"\xff\xfe", 400),
                                  (["好", "差"], None, 400)):
            raw = data if data is not None else _bytes_tensor(texts)
            shape = [1] if texts == ["好", "差"] else [len(texts)]  # two elements under a shape of one
            body, headers = _framed({"inputs": [{"name": "x", "shape": shape, "datatype": "BYTES",
                                                 "parameters": {"binary_data_size": len(raw)}}]}, raw)
            _v2_error(client.post(path, content=body, headers=headers), code)
        message = _v2_error(client.post(path, json={"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                                                "data": [1.0]}]}), 400)
        assert "expected INT64" in message and "BYTES" in message
        ids = [[40]]  # past the 40-entry vocabulary
        message = _v2_error(client.post(path, json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "INT64",
                                                                "data": ids}]}), 400)
        assert "vocabulary" in message
    triton.close()


@pytest.mark.slow
def test_text_classification_of_bytes_inputs(text_server, text_run):
    """class_count on a text package's BYTES texts: its own labels (serving.yaml's, the Triton labels.txt),
    ordered by the logits /v1 answers for {"text": [...]}, binary and JSON; 5 clamps to the 2 classes."""
    labels = yaml.safe_load((text_run / "package/serving.yaml").read_text(encoding="utf-8"))["labels"]
    assert len(labels) == 2
    with httpx.Client(base_url=text_server.url, timeout=30) as client:
        v1 = client.post("/v1/predict", json={"text": TEXTS}).json()
    triton = tritonclient_http.InferenceServerClient(text_server.url.removeprefix("http://"))
    inp = tritonclient_http.InferInput("x", [len(TEXTS)], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS], np.object_))
    for count, binary in ((1, True), (2, False), (5, True)):
        out = tritonclient_http.InferRequestedOutput(OUT, binary_data=binary, class_count=count)
        top = _strings(triton.infer("text_cnn", [inp], outputs=[out]).as_numpy(OUT))
        assert top == _tritons_classes(np.asarray(v1["logits"], np.float32), count, labels)
        assert [row[0].split(":")[2] for row in top] == v1["labels"]
    triton.close()
