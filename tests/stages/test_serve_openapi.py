"""/openapi.json says what `pipe serve` accepts: requests generated from the schema it serves (a hypothesis
strategy built here from the JSON Schema, for the keywords `pipeline/serving/openapi.py` emits) are
answered 200 by a real server on 127.0.0.1, for an image package (digits) and a text package; requests
the schema refuses get the 4xx it documents, with an error `type` it lists. Also: the document is
OpenAPI 3.1 with exact integer bounds, every error type the server raises is documented, and the text
and base64 patterns agree with the server's own checks.

What JSON Schema cannot state is kept out of the generated requests and said where: a base64 string is
generated as a real PNG/JPEG (the schema's contentMediaType), a text package's Paddle Serving tensor gets
prod(shape) ids (its schema's description), and a float input whose model output is not finite gets the
documented 422 non_finite_output (where the package's bare predictor agrees).
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from pipeline.serving import openapi, validate
from tests.serving_helpers import REPO, package_predictor, packaged_run, packaged_text_run, start_server
from tests.stages.test_serve import JSON_HDR, _error

V1, SERVING = "/v1/predict", "/GeneralModelService/inference"
CODES = {"200", "400", "408", "413", "415", "422", "500", "503", "504"}
_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class _Served:
    kind: str
    doc: dict[str, Any]
    model: dict[str, Any]  # GET /v1/model
    predict: Callable[[np.ndarray], np.ndarray]
    client: httpx.Client

    def request_schema(self, path: str) -> dict[str, Any]:
        return self.doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    def responses(self, path: str) -> dict[str, Any]:
        return self.doc["paths"][path]["post"]["responses"]


@pytest.fixture(scope="module", params=["image", "text"])
def served(request, trained_digits, tmp_path_factory):
    """A real server of the digits package or of the tiny text package, its /openapi.json, its predictor."""
    if request.param == "image":
        run, dtype = packaged_run(trained_digits, tmp_path_factory.mktemp("openapi-image")), np.float32
    else:
        run, dtype = packaged_text_run(tmp_path_factory.mktemp("openapi-text")), np.int64
    srv = start_server(run / "package")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            yield _Served(request.param, c.get("/openapi.json").json(), c.get("/v1/model").json(),
                          package_predictor(run / "package", dtype), c)
    finally:
        assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-2000:]


# ------------------------------------------------------------------ JSON Schema: validate and generate


def _json_eq(a: Any, b: Any) -> bool:
    """Equality as JSON Schema's const/enum define it: 1 == 1.0, true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_eq, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return a == b


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPES = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
          "string": lambda v: isinstance(v, str), "number": _number,
          "integer": lambda v: _number(v) and float(v).is_integer() if isinstance(v, float) else _number(v)}


def _match(pattern: str, text: str) -> bool:
    """ECMA-262 semantics for the patterns emitted: ^...$ anchors the whole string (Python's $ would also
    match before a final newline), otherwise a search."""
    if pattern.startswith("^") and pattern.endswith("$"):
        return re.fullmatch(pattern[1:-1], text) is not None
    return re.search(pattern, text) is not None


def valid(sc: dict[str, Any], v: Any) -> bool:
    """JSON Schema 2020-12, for the keywords pipeline/serving/openapi.py emits (annotations ignored)."""
    if not all(valid(p, v) for p in sc.get("allOf", [])):
        return False
    if "anyOf" in sc and not any(valid(p, v) for p in sc["anyOf"]):
        return False
    if "const" in sc and not _json_eq(v, sc["const"]):
        return False
    if "enum" in sc and not any(_json_eq(v, e) for e in sc["enum"]):
        return False
    if "type" in sc and not _TYPES[sc["type"]](v):
        return False
    if isinstance(v, dict):
        props = sc.get("properties", {})
        if any(k not in v for k in sc.get("required", [])) or \
                (sc.get("additionalProperties") is False and any(k not in props for k in v)):
            return False
        if not sc.get("minProperties", 0) <= len(v) <= sc.get("maxProperties", math.inf):
            return False
        return all(valid(props[k], x) for k, x in v.items() if k in props)
    if isinstance(v, list):
        if not sc.get("minItems", 0) <= len(v) <= sc.get("maxItems", math.inf):
            return False
        prefix = sc.get("prefixItems", [])
        if not all(valid(p, x) for p, x in zip(prefix, v)):
            return False
        if "items" in sc and not all(valid(sc["items"], x) for x in v[len(prefix):]):
            return False
        return "contains" not in sc or any(valid(sc["contains"], x) for x in v)
    if isinstance(v, str):
        return (sc.get("minLength", 0) <= len(v) <= sc.get("maxLength", math.inf)
                and ("pattern" not in sc or _match(sc["pattern"], v)))
    if _number(v):
        return sc.get("minimum", -math.inf) <= v <= sc.get("maximum", math.inf)
    return True


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Both schemas at once (for the generator): properties merged, required joined, two anyOf crossed."""
    out = dict(a)
    for k, v in b.items():
        if k == "properties":
            out[k] = {**a.get(k, {}), **{p: _merge(a.get(k, {}).get(p, {}), s) for p, s in v.items()}}
        elif k == "required":
            out[k] = sorted(set(a.get(k, [])) | set(v))
        elif k == "anyOf" and "anyOf" in a:
            out[k] = [_merge(x, y) for x in a[k] for y in v]
        else:
            out[k] = v
    return out


_POOL = 4  # distinct values drawn for a long array, then repeated: keeps examples within hypothesis' budget


@st.composite
def _image(draw, media: str) -> str:
    from PIL import Image

    w, h = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    mode = draw(st.sampled_from(["L", "RGB", "RGBA", "P", "LA", "1"] if media == "image/png" else ["L", "RGB"]))
    rng = np.random.RandomState(draw(st.integers(0, 2 ** 31 - 1)))
    im = Image.fromarray(rng.randint(0, 256, (h, w, 3), np.uint8)).convert(mode)
    buf = io.BytesIO()
    im.save(buf, "PNG" if media == "image/png" else "JPEG")
    return base64.b64encode(buf.getvalue()).decode()


def from_schema(sc: dict[str, Any]) -> st.SearchStrategy:
    """Values valid against `sc` (the keywords `valid` knows). Strings with an image contentMediaType are
    real images of that type (what the server decodes); long arrays repeat a few drawn values."""
    if "allOf" in sc:
        base = {k: v for k, v in sc.items() if k != "allOf"}
        for part in sc["allOf"]:
            base = _merge(base, part)
        return from_schema(base)
    if "anyOf" in sc:
        rest = {k: v for k, v in sc.items() if k != "anyOf"}
        return st.one_of([from_schema(_merge(rest, alt)) for alt in sc["anyOf"]])
    if "const" in sc:
        return st.just(sc["const"])
    if "enum" in sc:
        return st.sampled_from(sc["enum"])
    kind = sc["type"]
    if kind == "object":
        props, req = sc.get("properties", {}), sc.get("required", [])
        optional = [k for k in props if k not in req]
        lo, hi = sc.get("minProperties", 0), sc.get("maxProperties", len(props))
        keys = st.lists(st.sampled_from(optional), unique=True, min_size=max(0, lo - len(req)),
                        max_size=hi - len(req)) if optional else st.just([])
        return keys.flatmap(lambda ks: st.fixed_dictionaries({k: from_schema(props[k]) for k in [*req, *ks]}))
    if kind == "array":
        if "prefixItems" in sc:
            return st.tuples(*map(from_schema, sc["prefixItems"])).map(list)
        item = from_schema(sc.get("items", {"type": "integer"}))
        lo = sc.get("minItems", 0)
        hi = sc.get("maxItems", lo + 30)
        if hi <= 8:
            values = st.lists(item, min_size=lo, max_size=hi)
        else:
            values = st.tuples(st.integers(lo, hi), st.lists(item, min_size=1, max_size=_POOL)).map(
                lambda t: [t[1][i % len(t[1])] for i in range(t[0])])
        if "contains" in sc:
            values = st.tuples(values, from_schema(sc["contains"])).map(lambda t: [*t[0][:hi - 1], t[1]])
        return values
    if kind == "string":
        if sc.get("contentMediaType", "").startswith("image/"):
            return _image(sc["contentMediaType"])
        if "pattern" in sc:
            return st.from_regex(sc["pattern"]).filter(lambda t: len(t) <= 40)
        return st.text(min_size=sc.get("minLength", 0), max_size=sc.get("maxLength", 12))
    low, high = sc.get("minimum"), sc.get("maximum")
    ints = st.integers(None if low is None else math.ceil(low), None if high is None else math.floor(high))
    if kind == "integer":
        return ints
    return ints | st.floats(low, high, allow_nan=False, allow_infinity=False)


# ------------------------------------------------------------------ the document


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


@pytest.mark.slow
def test_the_document_states_the_package(served):
    doc = served.doc
    assert doc["openapi"].startswith("3.1.")
    for path in (V1, SERVING):
        op = doc["paths"][path]["post"]
        assert set(op["responses"]) == CODES and op["requestBody"]["required"] is True
        for code, answer in op["responses"].items():
            if code == "200":
                continue
            schema = answer["content"]["application/json"]["schema"]["properties"]["error"]
            assert schema["properties"]["code"] == {"const": int(code)}
            assert set(schema["properties"]["type"]["enum"]) <= set(openapi.ERRORS[int(code)])
            assert set(schema["required"]) == {"code", "type", "message"}
        assert "Retry-After" in op["responses"]["503"]["headers"]
    for node in _walk(doc["paths"]):  # integer bounds stay integers (FastAPI's models made them floats)
        if node.get("type") == "integer":
            assert all(type(node[k]) is int for k in ("minimum", "maximum") if k in node), node
        if "pattern" in node:
            re.compile(node["pattern"])
    v1 = served.request_schema(V1)
    m = served.model
    n = m["batching"]["max_batch_size"]
    inputs = v1["properties"]["inputs"]
    assert (inputs["minItems"], inputs["maxItems"]) == (1, n)
    if served.kind == "image":
        assert set(v1["properties"]) == {"inputs", "images"}
        sample = inputs["items"]
        for d in m["input"]["shape"][1:]:  # fixed dims: minItems = maxItems
            assert (sample["minItems"], sample["maxItems"]) == (d, d)
            sample = sample["items"]
        assert sample["type"] == "number" and sample["maximum"] == float(np.finfo(np.float32).max)
        assert v1["properties"]["images"]["items"]["contentEncoding"] == "base64"
    else:
        assert set(v1["properties"]) == {"text", "inputs"}
        assert inputs["items"]["items"] == {"type": "integer", "minimum": 0, "maximum": m["text"]["vocab_size"] - 1}
        assert v1["properties"]["text"]["maxItems"] == n
    log_id = served.request_schema(SERVING)["properties"]["log_id"]
    assert log_id["maximum"] == 2 ** 64 - 1


def test_every_error_type_is_documented():
    """Each ApiError(code, "type") in the server's sources is in openapi.ERRORS (bar the docs' 404)."""
    found = set()
    for path in ("pipeline/serving/validate.py", "pipeline/serving/wire.py", "pipeline/serving/v2.py",
                 "pipeline/serving/server.py", "pipeline/ocr_system/serving.py"):
        found |= {(int(c), k) for c, k in re.findall(r'ApiError\((\d+), "(\w+)"', (REPO / path).read_text())}
    documented = {(c, k) for c, kinds in openapi.ERRORS.items() for k in kinds}
    assert found - {(404, "not_found")} <= documented, found - documented
    assert len(found) >= 15


def test_the_text_pattern_is_what_the_server_calls_blank():
    """NON_BLANK matches a string exactly when str.strip() leaves something (every code point tested)."""
    pattern = re.compile(openapi.NON_BLANK)
    mismatched = [c for c in range(sys.maxunicode + 1)
                  if not 0xD800 <= c < 0xE000 and bool(pattern.search(chr(c))) != bool(chr(c).strip())]
    assert mismatched == []


@settings(max_examples=300, deadline=None)
@example("AAAA=")  # Python 3.11's strict mode decodes '=' past the padding; the server refuses it
@example("AAAA===")
@example("AAA=")
@example("AA==")
@example("AAAA\n")  # Python's $ would match before this newline
@given(text=st.text(alphabet="AQUJDabz09+/= \n-_", max_size=14) | st.binary(max_size=10).map(
    lambda b: base64.b64encode(b).decode()))
def test_the_base64_pattern_is_what_the_server_decodes(text):
    try:
        validate._unbase64(text, 0)
        decodes = True
    except validate.ApiError:
        decodes = False
    assert _match(openapi.BASE64, text) == decodes


# ------------------------------------------------------------------ requests from the schema


def _expect_answer(served: _Served, path: str, r: httpx.Response, x: np.ndarray | None) -> None:
    """200 with a body valid against the documented answer, or the documented 422 non_finite_output where
    the package's bare predictor also gives a non-finite output for the tensor the server fed. (The bare
    predictor only sees what the server accepted: an id past the vocabulary crashes it.)"""
    if r.status_code == 422 and r.json()["error"]["type"] == "non_finite_output":
        _error(r, 422, "non_finite_output")
        assert x is not None and not np.isfinite(served.predict(x)).all()
        return
    assert r.status_code == 200, (r.status_code, r.text[:300])
    answer = served.responses(path)["200"]["content"]["application/json"]["schema"]
    assert valid(answer, r.json()), r.text[:300]


def _fed(served: _Served, x: Any, shape: list[int] | None = None) -> np.ndarray:
    """What the server feeds the predictor for these inputs: float32, or id rows at max_len."""
    if served.kind == "image":
        return np.asarray(x, np.float64).astype(np.float32).reshape(-1, *served.model["input"]["shape"][1:])
    rows = np.asarray(x).reshape(shape).tolist() if shape else x
    text = served.model["text"]
    out = np.full((len(rows), text["max_len"]), text["pad_id"], np.int64)
    for i, row in enumerate(rows):
        out[i, :min(len(row), text["max_len"])] = row[:text["max_len"]]
    return out


@pytest.mark.slow
@_SETTINGS
@given(data=st.data())
def test_v1_requests_from_the_schema_are_accepted(served, data):
    schema = served.request_schema(V1)
    body = data.draw(from_schema(schema))
    assert valid(schema, body)
    _expect_answer(served, V1, served.client.post(V1, json=body), _fed(served, body["inputs"]) if "inputs" in body
                   else None)


@pytest.mark.slow
@_SETTINGS
@given(data=st.data())
def test_paddle_serving_requests_from_the_schema_are_accepted(served, data):
    schema = served.request_schema(SERVING)
    field = "float_data" if served.kind == "image" else "int64_data"
    drawn = schema
    if served.kind == "text":  # L is unbounded but for the body cap: drawn up to 2 max_len
        drawn = json.loads(json.dumps(schema))
        shape = drawn["properties"]["tensor"]["items"]["properties"]["shape"]
        shape["prefixItems"][1]["maximum"] = 2 * served.model["text"]["max_len"]
    body = data.draw(from_schema(drawn))
    assert valid(schema, body)
    (t,) = body["tensor"]
    if served.kind == "text":  # prod(shape) ids: the schema's description, not expressible in JSON Schema
        n = math.prod(t["shape"])
        t[field] = [t[field][i % len(t[field])] for i in range(n)]
        assert valid(schema, body)
    _expect_answer(served, SERVING, served.client.post(SERVING, json=body), _fed(served, t[field], t["shape"]))


@pytest.mark.slow
def test_the_largest_requests_the_schema_allows(served):
    """max_batch_size samples (from_schema rarely draws that many)."""
    v1 = served.request_schema(V1)
    n = v1["properties"]["inputs"]["maxItems"]
    bodies = [{"inputs": [_zero(v1["properties"]["inputs"]["items"])] * n}]
    if served.kind == "image":
        png = _png_of(1, 1)
        bodies.append({"images": [png] * n})
    else:
        bodies += [{"text": ["好" * 100] * n}, {"inputs": [[1] * k for k in range(1, n + 1)]}]
    for body in bodies:
        assert valid(v1, body)
        _expect_answer(served, V1, served.client.post(V1, json=body), None)


def _zero(sc: dict[str, Any]) -> Any:
    """The smallest sample of zeros the schema allows."""
    return [_zero(sc["items"])] * max(1, sc.get("minItems", 1)) if sc.get("type") == "array" else 0


def _png_of(w: int, h: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


# ------------------------------------------------------------------ requests the schema refuses


def _invalid_v1(served: _Served) -> list[tuple[str, Any, str]]:
    """(id, body, error type): each invalid against the schema."""
    v1 = served.request_schema(V1)
    inputs = v1["properties"]["inputs"]
    n = inputs["maxItems"]
    one = [_zero(inputs["items"])]
    common = [("no field", {}, "invalid_request"),
              ("unknown field", {"tensor": [1]}, "invalid_request"),
              ("batch over max", {"inputs": one * (n + 1)}, "invalid_tensor"),
              ("empty batch", {"inputs": []}, "invalid_tensor"),
              ("strings", {"inputs": [["a"]]}, "invalid_tensor")]
    if served.kind == "image":
        wrong_dim = json.loads(json.dumps(one))
        wrong_dim[0][0][0].append(0)
        big = json.loads(json.dumps(one))
        big[0][0][0][0] = 1e39
        return common + [
            ("two fields", {"inputs": one, "images": [_png_of(1, 1)]}, "invalid_request"),
            ("a fixed dim off by one", {"inputs": wrong_dim}, "invalid_tensor"),
            ("beyond float32", {"inputs": big}, "invalid_tensor"),
            ("booleans", {"inputs": json.loads(json.dumps(one).replace("0", "true"))}, "invalid_tensor"),
            ("not base64", {"images": ["iVBOR!!"]}, "invalid_image"),
            ("no images", {"images": []}, "invalid_request"),
            ("images over max", {"images": [_png_of(1, 1)] * (n + 1)}, "invalid_request"),
            ("text on an image model", {"text": ["好"]}, "invalid_request")]
    vocab = inputs["items"]["items"]["maximum"] + 1
    return common + [
        ("an id past the vocabulary", {"inputs": [[1, vocab]]}, "invalid_tensor"),
        ("a negative id", {"inputs": [[-1]]}, "invalid_tensor"),
        ("a fractional id", {"inputs": [[1.5]]}, "invalid_tensor"),
        ("an empty row", {"inputs": [[1], []]}, "invalid_tensor"),
        ("blank text", {"text": ["好", " \u3000\n"]}, "empty_text"),
        ("empty text", {"text": [""]}, "empty_text"),
        ("no texts", {"text": []}, "invalid_request"),
        ("texts over max", {"text": ["好"] * (n + 1)}, "invalid_request"),
        ("images on a text model", {"images": [_png_of(1, 1)]}, "invalid_request")]


def _invalid_serving(served: _Served) -> list[tuple[str, Any, str]]:
    image = served.kind == "image"
    field, code = ("float_data", 1) if image else ("int64_data", 0)
    shape = [1, 1, 8, 8] if image else [1, 3]
    size = math.prod(shape)

    def req(**tensor: Any) -> dict[str, Any]:
        return {"tensor": [{"name": "x", "alias_name": "x", "elem_type": code, "shape": shape, field: [0] * size,
                            **tensor}]}

    return [("no tensor", {"fetch_var_names": []}, "invalid_request"),
            ("two tensors", {"tensor": req()["tensor"] * 2}, "invalid_request"),
            ("another feed name", req(name="y", alias_name="y"), "invalid_request"),
            ("another elem_type", req(elem_type=1 - code), "invalid_tensor"),
            ("elem_type true", req(elem_type=True) if code == 1 else req(elem_type=False), "invalid_tensor"),
            ("data not prod(shape)" if image else "a zero dim", req(**{field: [0] * (size - 1)}) if image
             else req(shape=[1, 0], **{field: []}), "invalid_tensor"),
            ("another fetch name", {**req(), "fetch_var_names": ["nope"]}, "invalid_request"),
            ("a negative log_id", {**req(), "log_id": -1}, "invalid_request"),
            ("log_id beyond uint64", {**req(), "log_id": 2 ** 64}, "invalid_request")]


def _refused(served: _Served, path: str, body: Any, kind: str, content: bytes | None = None,
             headers: dict[str, str] | None = None, code: int = 422) -> None:
    r = served.client.post(path, content=content if content is not None else json.dumps(body).encode(),
                           headers=headers or JSON_HDR)
    err = _error(r, code, kind)
    answer = served.responses(path)[str(code)]["content"]["application/json"]["schema"]
    assert valid(answer, r.json()) and err["type"] in answer["properties"]["error"]["properties"]["type"]["enum"]


@pytest.mark.slow
def test_requests_the_schema_refuses_get_the_documented_code(served):
    for path, cases in ((V1, _invalid_v1(served)), (SERVING, _invalid_serving(served))):
        schema = served.request_schema(path)
        for name, body, kind in cases:
            assert not valid(schema, body), name
            _refused(served, path, body, kind)
    # What is not about the JSON document: content type (415), syntax (400), size (413).
    for path in (V1, SERVING):
        _refused(served, path, None, "unsupported_media_type", b"{}", {"content-type": "text/plain"}, 415)
        _refused(served, path, None, "invalid_json", b'{"inputs": [NaN]}', None, 400)
        cap = served.model["limits"]["max_body_bytes"]
        _refused(served, path, None, "body_too_large", b" " * (cap + 1), None, 413)
