"""`pipe serve` on a model with two named inputs and two outputs (examples/two_inputs.yaml: `img` [N,1,8,8] +
`feat` [N,4] in, `embedding` [N,16] + `logits` [N,4] out; trained briefly, exported with --onnx and packaged:
tests/multi_io_helpers.py), a real server on 127.0.0.1 started and stopped here.

Every endpoint takes both inputs by name and answers every output, equal to the model's own outputs (the
package's reference set: the fp32 program on real inputs) and identical across endpoints and framings:
/v2 from the real tritonclient (binary and JSON, inputs in either order, `outputs` selecting one, the
classification extension on the logits only), /v1/predict with named tensors (and a PNG for the image
input), Paddle Serving's wire with two feeds (JSON and protobuf; the real client needs Python 3.9 and is
skipped without it). Requests of several inputs batch together and get their own rows of every output.
Each kind of bad input (missing, unknown, twice, wrong dtype or shape for one input, batch sizes that
disagree) is a 400 (v2) / 422 with one line naming the tensor and what it expected, never echoing the
request, and the server serves on. The metadata (/v2, /v1/model, /openapi.json) lists every tensor.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonclient_http
from tritonclient.utils import InferenceServerException

from pipeline import data as data_mod
from pipeline.serving import batcher, predictor as predictor_mod, wire
from tests.multi_io_helpers import examples_importable, two_inputs_run
from tests.serving_helpers import REPO, metric, serving_client_python, start_server, until as _until

MODEL = "examples.two_inputs.model_build"  # serving.yaml's name: the model's factory, sanitised
INFER = f"/v2/models/{MODEL}/infer"
# public name -> the program's (jit.save: sorted keys): every answer uses the first, requests may use either
OUTS = {"embedding": "fetch_name_0", "logits": "fetch_name_1"}
PUBLIC = {program: public for public, program in OUTS.items()}
LABELS = ["top-left", "top-right", "bottom-left", "bottom-right"]
MARK = "zq-MARKER-71"  # put into bad requests: must never come back in an answer
SERVING = "/GeneralModelService/inference"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return two_inputs_run(tmp_path_factory.mktemp("multi-io-serving"))


@pytest.fixture(scope="module")
def hold(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def server(run, hold):
    """The package's server; its predictor waits while `hold` exists (absent: it never waits). One HTTP process:
    the batching test counts one queue."""
    srv = start_server(run / "package", "--http-workers", "1", env={batcher.HOLD_ENV: str(hold)})
    yield srv
    hold.unlink(missing_ok=True)
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def triton(server):
    c = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def ref(run) -> dict[str, np.ndarray]:
    """The package's reference set: real inputs (img, feat) and the fp32 program's outputs (embedding,
    logits), by public name."""
    from safetensors.numpy import load_file

    return {k.split("/", 1)[1]: v for k, v in load_file(str(run / "package/reference.safetensors")).items()}


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Served vs the reference (other batch sizes than the package's run: float rounding at most)."""
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _v1_body(img: np.ndarray, feat: np.ndarray) -> dict[str, Any]:
    return {"inputs": {"img": img.tolist(), "feat": feat.tolist()}}


def _error(r: httpx.Response, code: int, kind: str | None = None) -> str:
    """The fixed error schema (on /v2 the protocol's {"error": "..."}), the code, no echo; the message."""
    assert r.status_code == code, (r.status_code, r.text[:300])
    body = r.json()
    assert MARK not in r.text and "Traceback" not in r.text and "/tmp" not in r.text
    if isinstance(body.get("error"), str):
        return body["error"]
    assert set(body["error"]) == {"code", "type", "message"} and body["error"]["code"] == code, body
    if kind is not None:
        assert body["error"]["type"] == kind, body
    return body["error"]["message"]


# ------------------------------------------------------------------ metadata


@pytest.mark.slow
def test_metadata_lists_every_tensor(triton, client):
    meta = triton.get_model_metadata(MODEL)
    assert meta["inputs"] == [{"name": "img", "datatype": "FP32", "shape": [-1, 1, 8, 8]},
                              {"name": "feat", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 16]},
                               {"name": "logits", "datatype": "FP32", "shape": [-1, 4]}]
    m = client.get("/v1/model").json()
    assert [t["name"] for t in m["inputs"]] == ["img", "feat"] and "input" not in m
    assert m["outputs"] == [{"name": "embedding", "alias": "embedding", "dtype": "float32", "shape": [-1, 16]},
                            {"name": "logits", "alias": "logits", "dtype": "float32", "shape": [-1, 4],
                             "role": "logits"}]
    assert m["output"]["name"] == m["output"]["alias"] == "logits"
    assert m["accepts_images"] is True and m["labels"] == LABELS
    assert metric(client.get("/metrics").text, "pipe_ready") == 1.0
    doc = client.get("/openapi.json").json()
    v1 = doc["paths"]["/v1/predict"]["post"]
    request = v1["requestBody"]["content"]["application/json"]["schema"]
    inputs = request["properties"]["inputs"]
    assert inputs["type"] == "object" and list(inputs["properties"]) == ["img", "feat"]
    sample = inputs["properties"]["feat"]["items"]
    assert (sample["minItems"], sample["maxItems"]) == (4, 4)
    assert list(request["properties"]["images"]["properties"]) == ["img"]  # the image input only
    answer = v1["responses"]["200"]["content"]["application/json"]["schema"]
    assert "outputs" in answer["required"] and list(answer["properties"]["outputs"]["properties"]) == ["embedding"]
    feeds = doc["paths"][SERVING]["post"]["requestBody"]["content"]["application/json"]["schema"]
    tensor = feeds["properties"]["tensor"]
    assert (tensor["minItems"], tensor["maxItems"], len(tensor["allOf"])) == (2, 2, 2)
    infer = doc["paths"]["/v2/models/{model_name}/infer"]["post"]
    v2_inputs = infer["requestBody"]["content"]["application/json"]["schema"]["properties"]["inputs"]
    assert [t["properties"]["name"]["enum"] for t in v2_inputs["items"]["anyOf"]] == [["img"], ["feat"]]
    v2_answer = infer["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["outputs"]
    assert [o["properties"]["name"]["enum"] for o in v2_answer["items"]["oneOf"]] == [
        ["embedding", "fetch_name_0"], ["fetch_name_1", "logits"], ["fetch_name_1", "logits"]]


@pytest.mark.slow
def test_openapi_describes_what_the_server_takes(client, ref):
    """Bodies valid against the documented /v1 schema are accepted (each choice of sending the image input
    as a tensor or as a PNG); the Paddle Serving schema refuses a missing or repeated feed."""
    from tests.stages.test_serve_openapi import valid

    doc = client.get("/openapi.json").json()
    v1 = doc["paths"]["/v1/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    png = _png(np.zeros((1, 8, 8), np.uint8))
    good = [_v1_body(ref["img"][:2], ref["feat"][:2]),
            {"inputs": {"feat": ref["feat"][:1].tolist()}, "images": {"img": [png]}}]
    bad = [{"inputs": {"img": ref["img"][:1].tolist()}},
           {"inputs": {"img": ref["img"][:1].tolist(), "feat": ref["feat"][:1].tolist()}, "images": {"img": [png]}},
           {"images": {"img": [png]}}, {"inputs": ref["img"][:1].tolist()}]
    for body in good:
        assert valid(v1, body)
        assert client.post("/v1/predict", json=body).status_code == 200
    for body in bad:
        assert not valid(v1, body)
        _error(client.post("/v1/predict", json=body), 422)
    serving = doc["paths"][SERVING]["post"]["requestBody"]["content"]["application/json"]["schema"]
    img, feat = _feed("img", ref["img"][:1]), _feed("feat", ref["feat"][:1])
    assert valid(serving, {"tensor": [feat, img]}) and valid(serving, {"tensor": [img, feat]})
    assert not valid(serving, {"tensor": [img, img]}) and not valid(serving, {"tensor": [img]})


# ------------------------------------------------------------------ /v2 from tritonclient


def _infer(triton, img: np.ndarray, feat: np.ndarray, binary: bool, outputs: list[tuple[str, int]] | None = None,
           order: tuple[str, ...] = ("img", "feat")) -> Any:
    arrays = {"img": img, "feat": feat}
    inputs = []
    for name in order:
        inp = tritonclient_http.InferInput(name, list(arrays[name].shape), "FP32")
        inp.set_data_from_numpy(arrays[name], binary_data=binary)
        inputs.append(inp)
    requested = None if outputs is None else [
        tritonclient_http.InferRequestedOutput(name, binary_data=binary, class_count=count) for name, count in outputs]
    return triton.infer(MODEL, inputs, outputs=requested)


@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_both_inputs_equal_the_models_outputs(triton, ref, binary):
    """Batches of 1, 32 and 7: every output (by the model's name) close to the reference, and the same
    numbers whatever the framing or the order of the inputs."""
    for lo, hi in ((0, 1), (1, 33), (33, 40)):
        img, feat = ref["img"][lo:hi], ref["feat"][lo:hi]
        result = _infer(triton, img, feat, binary)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["embedding", "logits"]
        for public in OUTS:
            _close(result.as_numpy(public), ref[public][lo:hi])
        other = _infer(triton, img, feat, not binary, order=("feat", "img"))
        for name in OUTS:
            np.testing.assert_array_equal(other.as_numpy(name), result.as_numpy(name))


@pytest.mark.slow
def test_v2_outputs_select_and_classification_is_on_the_logits(triton, ref):
    img, feat = ref["img"][:5], ref["feat"][:5]
    everything = _infer(triton, img, feat, True)
    for asked in (["embedding"], ["fetch_name_1"], ["logits", "embedding"]):
        result = _infer(triton, img, feat, True, [(n, 0) for n in asked])
        assert [o["name"] for o in result.get_response()["outputs"]] == asked
        for n in asked:
            np.testing.assert_array_equal(result.as_numpy(n), everything.as_numpy(PUBLIC.get(n, n)))
    logits = everything.as_numpy("logits")
    top = _infer(triton, img, feat, False, [("logits", 2)]).as_numpy("logits")
    want = [["%f:%d:%s" % (row[i], i, LABELS[i]) for i in sorted(range(4), key=lambda i: (-row[i], i))[:2]]
            for row in logits.tolist()]
    assert top.tolist() == want
    with pytest.raises(InferenceServerException) as e:
        _infer(triton, img, feat, True, [("embedding", 2)])
    assert e.value.status() == "400" and "logits output 'logits'" in e.value.message()


# ------------------------------------------------------------------ /v1/predict by name


def _png(img: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img[0]).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.slow
def test_v1_named_tensors_and_an_image_input(client, triton, ref, run):
    """{"inputs": {"img": ..., "feat": ...}}: labels, scores and logits from the logits output, the embedding
    under `outputs`, equal to /v2's numbers; the image input also as PNGs (decoded and normalised by its own
    preprocessing), the same answer as its prepared tensor."""
    img, feat = ref["img"][:6], ref["feat"][:6]
    body = client.post("/v1/predict", json=_v1_body(img, feat)).json()
    assert set(body) == {"labels", "scores", "logits", "outputs"} and set(body["outputs"]) == {"embedding"}
    logits, embedding = np.asarray(body["logits"], np.float32), np.asarray(body["outputs"]["embedding"], np.float32)
    _close(logits, ref["logits"][:6])
    _close(embedding, ref["embedding"][:6])
    assert body["labels"] == [LABELS[k] for k in logits.argmax(1)]
    v2 = _infer(triton, img, feat, True)
    np.testing.assert_array_equal(logits, v2.as_numpy("logits"))
    np.testing.assert_array_equal(embedding, v2.as_numpy("embedding"))
    with examples_importable():
        from examples.two_inputs.data import load

        (raw, _) = load(None)["test"]
    pre = json.loads((run / "export/manifest.json").read_text())["interface"]["preprocessing"]["inputs"]["img"]
    images, side = raw["img"][:4], raw["feat"][:4]
    by_tensor = client.post("/v1/predict", json=_v1_body(data_mod.prepare(images, pre), side)).json()
    by_png = client.post("/v1/predict", json={"images": {"img": [_png(im) for im in images]},
                                              "inputs": {"feat": side.tolist()}})
    assert by_png.status_code == 200, by_png.text[:300]
    assert by_png.json() == by_tensor


# ------------------------------------------------------------------ Paddle Serving's wire


def _feed(name: str, a: np.ndarray) -> dict[str, Any]:
    return {"name": name, "alias_name": name, "elem_type": 1, "shape": list(a.shape), "float_data": a.ravel().tolist()}


@pytest.mark.slow
def test_paddle_serving_wire_two_feeds(client, triton, ref):
    """JSON and protobuf, feeds in either order: every fetched output (by the model's or the program's name,
    in the model's order; none named: all), under the model's names, the numbers /v2 answers."""
    img, feat = ref["img"][:3], ref["feat"][:3]
    v2 = _infer(triton, img, feat, True)
    want = {public: v2.as_numpy(public) for public in OUTS}
    for fetch, got in (([], ["embedding", "logits"]), (["logits", "embedding"], ["embedding", "logits"]),
                       (["fetch_name_0"], ["embedding"]), (["logits", "other"], ["logits"])):
        doc = client.post(SERVING, json={"tensor": [_feed("feat", feat), _feed("img", img)], "fetch_var_names": fetch,
                                         "log_id": 4}).json()
        assert (doc["err_no"], doc["log_id"]) == (0, 4)
        tensors = doc["outputs"][0]["tensor"]
        assert [t["alias_name"] for t in tensors] == got
        for t in tensors:
            assert t["name"] == t["alias_name"] and t["elem_type"] == 1
            np.testing.assert_array_equal(np.asarray(t["float_data"], np.float32).reshape(t["shape"]),
                                          want[t["alias_name"]])
    msgs = wire.messages()
    req = msgs["Request"](fetch_var_names=["logits", "embedding"], log_id=9)
    for name, a in (("img", img), ("feat", feat)):
        t = req.tensor.add(name=name, alias_name=name, elem_type=1)
        t.shape.extend(a.shape)
        t.float_data.extend(a.ravel().tolist())
    r = client.post(SERVING, content=req.SerializeToString(), headers={"content-type": "application/proto"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
    resp = msgs["Response"]()
    resp.ParseFromString(r.content)
    assert (resp.err_no, resp.log_id) == (0, 9)
    assert [(t.name, t.alias_name) for t in resp.outputs[0].tensor] == [("embedding", "embedding"),
                                                                         ("logits", "logits")]
    for t in resp.outputs[0].tensor:
        np.testing.assert_array_equal(np.asarray(t.float_data, np.float32).reshape(list(t.shape)), want[t.alias_name])


@pytest.mark.slow
def test_paddle_serving_client_two_feeds(server, run, ref, tmp_path):
    """paddle-serving-client==0.9.0's HttpClient with both feeds and both fetches, protobuf and JSON mode."""
    py = serving_client_python()
    if py is None:
        pytest.skip("no Python 3.9 with paddle-serving-client==0.9.0: set PIPE_SERVING_CLIENT_PYTHON or create "
                    ".venv39 (make test does where python3.9 exists); the client has no wheel for Python >= 3.10")
    feeds = {"img": ref["img"][:3].tolist(), "feat": ref["feat"][:3].tolist()}
    (tmp_path / "feeds.json").write_text(json.dumps(feeds))
    proc = subprocess.run([str(py), str(REPO / "tests/serving_client_feeds.py"),
                           str(run / "package/serving_client_conf.prototxt"), server.url.split("//", 1)[1],
                           str(tmp_path / "feeds.json"), "logits,embedding"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-500:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode in ("proto", "json"):
        assert sorted(out[mode]) == ["embedding", "logits"], out[mode]
        for public, t in out[mode].items():
            _close(np.asarray(t["data"], np.float32).reshape(t["shape"]), ref[public][:3])


# ------------------------------------------------------------------ batching several inputs


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


@pytest.mark.slow
def test_requests_batch_together_and_get_their_own_rows(server, hold, ref):
    """Four requests of 1..4 samples wait behind a held predictor, then run as one batch (every input
    concatenated): each gets its own rows of both outputs."""
    spans = [(0, 1), (1, 3), (3, 6), (6, 10)]

    def post(span: tuple[int, int]) -> httpx.Response:
        lo, hi = span
        return httpx.post(server.url + "/v1/predict", json=_v1_body(ref["img"][lo:hi], ref["feat"][lo:hi]), timeout=30)

    hold.touch()
    m0 = _metrics(server.url)
    try:
        with cf.ThreadPoolExecutor(len(spans)) as pool:
            first = pool.submit(post, spans[0])
            _until(lambda: (lambda m: metric(m, "pipe_inflight_requests") == 1 and metric(m, "pipe_queue_depth") == 0)(
                _metrics(server.url)))
            rest = [pool.submit(post, span) for span in spans[1:]]
            _until(lambda: metric(_metrics(server.url), "pipe_queue_depth") == 3)
            hold.unlink()
            answers = [first.result(30)] + [f.result(30) for f in rest]
    finally:
        hold.unlink(missing_ok=True)
    m1 = _metrics(server.url)
    assert metric(m1, "pipe_batch_size_count") - metric(m0, "pipe_batch_size_count") == 1
    assert metric(m1, "pipe_batch_size_sum") - metric(m0, "pipe_batch_size_sum") == 10
    assert metric(m1, "pipe_batch_requests_sum") - metric(m0, "pipe_batch_requests_sum") == 4
    for (lo, hi), r in zip(spans, answers):
        assert r.status_code == 200, r.text[:300]
        _close(np.asarray(r.json()["logits"], np.float32), ref["logits"][lo:hi])
        _close(np.asarray(r.json()["outputs"]["embedding"], np.float32), ref["embedding"][lo:hi])


def test_the_predictor_frames_carry_named_arrays():
    """The pipe to a predictor: several named arrays of any dtype (and no rows) in one frame, back as they went."""
    arrays = {"img": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "ids": np.array([[1, -2]], np.int64),
              "none": np.zeros((0, 5), np.int32)}
    buf = io.BytesIO()
    predictor_mod.write_frame(buf, *predictor_mod.pack("run", arrays))
    buf.seek(0)
    head, data = predictor_mod.read_frame(buf)
    got = predictor_mod.unpack(head["tensors"], data)
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape and (got[k] == a).all()
    with pytest.raises(ValueError):
        predictor_mod.unpack(head["tensors"], data + b"\0")


# ------------------------------------------------------------------ bad input names the tensor


_ONE_IMG = [[[0.0] * 8] * 8]  # one sample of img
_ONE_FEAT = [0.0] * 4


def _v1(**inputs: Any) -> dict[str, Any]:
    return {"inputs": inputs}


def _v2(*tensors: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"inputs": list(tensors), **extra}


def _t(name: str, n: int = 1, datatype: str = "FP32", shape: list[int] | None = None) -> dict[str, Any]:
    shape = shape or ([n, 1, 8, 8] if name == "img" else [n, 4])
    return {"name": name, "datatype": datatype, "shape": shape, "data": [0] * int(np.prod(shape))}


def _wire(*tensors: dict[str, Any], fetch: list[str] | None = None) -> dict[str, Any]:
    return {"tensor": list(tensors), "fetch_var_names": fetch or [], "log_id": 1}


def _f(name: str, n: int = 1, elem_type: int = 1, size: int | None = None) -> dict[str, Any]:
    shape = [n, 1, 8, 8] if name == "img" else [n, 4]
    count = int(np.prod(shape)) if size is None else size
    return {"name": name, "alias_name": name, "elem_type": elem_type, "shape": shape, "float_data": [0.0] * count}


BAD = [
    # (id, path, body, code, type (None on /v2), what the message says)
    ("v1 missing input", "/v1/predict", _v1(img=[_ONE_IMG]), 422, "invalid_request", ["missing input 'feat'"]),
    ("v1 unknown input", "/v1/predict", _v1(img=[_ONE_IMG], feat=[_ONE_FEAT], **{MARK: [1]}), 422, "invalid_request",
     ["no input of this model", "'img', 'feat'"]),
    ("v1 wrong dtype", "/v1/predict", _v1(img=[_ONE_IMG], feat=[[True] * 4]), 422, "invalid_tensor",
     ["input 'feat'", "expected float32 [N, 4]"]),
    ("v1 wrong shape", "/v1/predict", _v1(img=[_ONE_IMG], feat=[[0.0] * 3]), 422, "invalid_tensor",
     ["input 'feat'", "shape [1, 3]", "expected float32 [N, 4]"]),
    ("v1 batch sizes", "/v1/predict", _v1(img=[_ONE_IMG] * 2, feat=[_ONE_FEAT] * 3), 422, "invalid_tensor",
     ["inputs 'img' and 'feat' have batch sizes 2 and 3"]),
    ("v1 one input twice", "/v1/predict", {"inputs": {"img": [_ONE_IMG], "feat": [_ONE_FEAT]},
                                           "images": {"img": ["AAAA"]}}, 422, "invalid_request", ["'img'", "both"]),
    ("v1 a bare tensor", "/v1/predict", {"inputs": [_ONE_IMG]}, 422, "invalid_request", ["'img', 'feat'"]),
    ("v1 an image for feat", "/v1/predict", {"inputs": {"img": [_ONE_IMG]}, "images": {"feat": ["AAAA"]}}, 422,
     "invalid_request", ["input 'feat' is no image input"]),
    ("v1 text", "/v1/predict", {"text": [MARK]}, 422, "invalid_request", ["does not take text"]),
    ("v2 missing input", INFER, _v2(_t("img")), 400, None, ["missing input 'feat'", "'img', 'feat'"]),
    ("v2 unknown input", INFER, _v2(_t("img"), _t("feat"), {**_t("feat"), "name": MARK}), 400, None,
     ["inputs[2]: unknown input", "'img', 'feat'"]),
    ("v2 input twice", INFER, _v2(_t("img"), _t("feat"), _t("img")), 400, None, ["input 'img' given twice"]),
    ("v2 wrong datatype", INFER, _v2(_t("img"), _t("feat", datatype="INT64")), 400, None,
     ["input 'feat': datatype INT64, expected FP32: float32 [N, 4]"]),
    ("v2 wrong shape", INFER, _v2(_t("img"), _t("feat", shape=[1, 5])), 400, None,
     ["input 'feat'", "shape [1, 5]", "expected float32 [N, 4]"]),
    ("v2 batch sizes", INFER, _v2(_t("img", 2), _t("feat", 3)), 400, None,
     ["inputs 'img' and 'feat' have batch sizes 2 and 3"]),
    ("v2 unknown output", INFER, _v2(_t("img"), _t("feat"), outputs=[{"name": MARK}]), 400, None,
     ["unknown output", "'embedding', 'logits'"]),
    ("wire missing feed", SERVING, _wire(_f("feat")), 422, "invalid_request", ["missing input 'img'"]),
    ("wire unknown feed", SERVING, _wire(_f("img"), _f("feat"), {**_f("feat"), "name": MARK, "alias_name": MARK}), 422,
     "invalid_request", ["tensor[2]: no feed of this model", "'img', 'feat'"]),
    ("wire feed twice", SERVING, _wire(_f("feat"), _f("feat")), 422, "invalid_request", ["feed 'feat' given twice"]),
    ("wire wrong elem_type", SERVING, _wire(_f("img"), _f("feat", elem_type=0)), 422, "invalid_tensor",
     ["feed 'feat': elem_type must be 1 (float32"]),
    ("wire wrong shape", SERVING, _wire(_f("img"), _f("feat", size=3)), 422, "invalid_tensor",
     ["feed 'feat'", "prod(shape)", "float32 [N, 4]"]),
    ("wire batch sizes", SERVING, _wire(_f("img", 2), _f("feat", 1)), 422, "invalid_tensor",
     ["inputs 'img' and 'feat' have batch sizes 2 and 1"]),
    ("wire unknown fetch", SERVING, _wire(_f("img"), _f("feat"), fetch=[MARK]), 422, "invalid_request",
     ["fetch_var_names", "'embedding', 'logits'"]),
]


@pytest.mark.parametrize("path, body, code, kind, says", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_tensor(client, path, body, code, kind, says):
    message = _error(client.post(path, json=body), code, kind)
    assert "\n" not in message and all(s in message for s in says), message


def test_bad_binary_framing_of_two_inputs_and_still_serving(client, ref):
    """Two binary inputs whose sizes do not add up to the bytes after the header: 400; then a good request
    of the same framing answers."""
    img, feat = ref["img"][:1], ref["feat"][:1]

    def framed(sizes: tuple[int, int], blob: bytes) -> httpx.Response:
        head = json.dumps({"inputs": [
            {"name": "img", "shape": [1, 1, 8, 8], "datatype": "FP32", "parameters": {"binary_data_size": sizes[0]}},
            {"name": "feat", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": sizes[1]}}],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
        return client.post(INFER, content=head + blob, headers={"inference-header-content-length": str(len(head))})

    blob = img.tobytes() + feat.tobytes()
    for sizes, data in (((256, 16), blob[:-4]), ((256, 16), blob + b"\0" * 4), ((252, 16), blob)):
        _error(framed(sizes, data), 400)
    r = framed((256, 16), blob)
    assert r.status_code == 200, r.text[:300]
    n = int(r.headers["inference-header-content-length"])
    assert json.loads(r.content[:n])["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [1, 4],
                                                     "parameters": {"binary_data_size": 16}}]
    _close(np.frombuffer(r.content[n:], "<f4").reshape(1, 4), ref["logits"][:1])
    assert client.get("/livez").status_code == 200
    assert client.post("/v1/predict", json=_v1_body(img, feat)).status_code == 200


# ------------------------------------------------------------------ a two-input text model: text fills both


ERNIE = REPO / "examples" / "chinese_sentiment_ernie.yaml"
TEXTS = ["这个东西很好", "差", "我们买了一次还是很满意的东西", "这个" * 20]


@pytest.fixture(scope="module")
def ernie_run(tmp_path_factory) -> Path:
    """ernie_tiny (input_ids + token_type_ids) on a small review file: 1 epoch at max_len 32, packaged."""
    from pipeline.cli import main
    from tests.conftest import reviews

    root = tmp_path_factory.mktemp("ernie-serving")
    run, data = root / "run", reviews(root / "reviews.jsonl")
    assert main(["train", "--config", str(ERNIE), "--data", str(data), "--run", str(run), "--epochs", "1",
                 "--set", "data.max_len=32", "--set", "train.batch_size=16", "--set", "train.warmup_epochs=0"]) == 0
    assert main(["export", str(run / "train")]) == 0
    assert main(["package", str(run / "export"), "--engine", "paddle"]) == 0
    return run


@pytest.mark.slow
def test_text_fills_every_input_of_a_two_input_text_model(ernie_run):
    """{"text": [...]} on /v1 and BYTES on /v2 give exactly what the model answers for the training encoder's
    ids and a zero token type (data.text_inputs, the rule the package records), ragged id rows included;
    one input missing is a 422 naming it."""
    from safetensors.numpy import load_file

    vocab = {t: i for i, t in enumerate(json.loads((ernie_run / "package/vocab.json").read_text(encoding="utf-8")))}
    ids = data_mod.encode_texts(TEXTS, vocab, 32)
    srv = start_server(ernie_run / "package")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert [t["name"] for t in c.get("/v1/model").json()["inputs"]] == ["input_ids", "token_type_ids"]
            by_text = c.post("/v1/predict", json={"text": TEXTS}).json()
            by_ids = c.post("/v1/predict", json={"inputs": {"input_ids": ids.tolist(),
                                                            "token_type_ids": np.zeros_like(ids).tolist()}}).json()
            assert by_text == by_ids
            rows = [[int(i) for i in row if i] for row in ids]  # unpadded, of different lengths
            ragged = c.post("/v1/predict", json={"inputs": {"input_ids": rows,
                                                            "token_type_ids": [[0] * len(r) for r in rows]}})
            assert ragged.json() == by_text
            r = c.post("/v2/models/ernie_tiny/infer", json={"inputs": [
                {"name": "input_ids", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]})
            assert r.status_code == 200, r.text[:300]
            np.testing.assert_array_equal(np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(-1, 2),
                                          np.asarray(by_text["logits"], np.float32))
            ref = load_file(str(ernie_run / "package/reference.safetensors"))
            x = {k: ref[f"input/{k}"][:8].tolist() for k in ("input_ids", "token_type_ids")}
            _close(np.asarray(c.post("/v1/predict", json={"inputs": x}).json()["logits"], np.float32),
                   ref["output/logits"][:8])
            message = _error(c.post("/v1/predict", json={"inputs": {"input_ids": rows}}), 422, "invalid_request")
            assert "missing input 'token_type_ids'" in message
            # token types are bounded by what the model embeds (2), not by the character vocabulary
            ones = np.ones_like(ids)
            ok = c.post("/v1/predict", json={"inputs": {"input_ids": ids.tolist(), "token_type_ids": ones.tolist()}})
            assert ok.status_code == 200 and ok.json()["logits"] != by_ids["logits"]  # segment 1 is embedded
            message = _error(c.post("/v1/predict", json={"inputs": {"input_ids": ids.tolist(),
                                                                    "token_type_ids": (2 * ones).tolist()}}),
                             422, "invalid_tensor")
            assert "token_type_ids" in message and "ids must be in 0..1 (the token types the model embeds)" in message
            r = c.post("/v2/models/ernie_tiny/infer", json={"inputs": [
                {"name": n, "datatype": "INT64", "shape": list(ids.shape), "data": a.ravel().tolist()}
                for n, a in (("input_ids", ids), ("token_type_ids", 5 * ones))]})
            assert r.status_code == 400 and "token_type_ids" in r.json()["error"] and "0..1" in r.json()["error"]
    finally:
        assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-2000:]
