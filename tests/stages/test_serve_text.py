"""`pipe package` and `pipe serve` on the built-in text task: a tiny text_cnn run (1 epoch, max_len 24, on a
generated Chinese review file) trained, exported and packaged once per session, served by a real
`pipe serve` process on 127.0.0.1.

The package carries vocab.json (checksummed), a `text:` section, an int64 variable-length client config
and Triton config. The server encodes text with the package's vocabulary by the training encoder
(`pipeline.data.encode_texts`) and feeds every sample at max_len: served logits equal the predictor's on
the same ids, alone or batched with texts of other lengths; over-long input is truncated; empty text is a
422, invalid UTF-8 a 400, images on a text model a 422 without echo; Paddle Serving's int64_data
round-trips (pipe's own descriptor, and the real client from Python 3.9 where it exists).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline import artifacts, data as data_mod
from pipeline.serving import batcher, spec as spec_mod, wire
from tests.serving_helpers import (REPO, client_config_class, metric, package_predictor, packaged_text_run,
                                   serving_client_python, start_server, triton_model_config_class, until as _until)

MARK = "zq-MARKER-71"  # put into bad requests: must never come back in an answer
JSON_HDR = {"content-type": "application/json"}
MAX_LEN = 24  # the run's data.max_len
TEXTS = ["这个东西很好", "差", "我们买了一次还是很满意的东西", "这个" * 20, "失望慢坏",
         "棒X好"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return packaged_text_run(tmp_path_factory.mktemp("text-serving"))


@pytest.fixture(scope="module")
def vocab(run) -> dict[str, int]:
    return {t: i for i, t in enumerate(json.loads((run / "package/vocab.json").read_text(encoding="utf-8")))}


def _encode(texts: list[str], vocab: dict[str, int]) -> np.ndarray:
    return data_mod.encode_texts(texts, vocab, MAX_LEN)


@pytest.fixture(scope="module")
def predictor(run):
    return package_predictor(run / "package", np.int64)


@pytest.fixture(scope="module")
def server(run):
    srv = start_server(run / "package")
    yield srv
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _error(r: httpx.Response, code: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == code, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "type", "message"}, body
    if kind is not None:
        assert body["error"]["type"] == kind, body
    assert MARK not in r.text and "Traceback" not in r.text and "/tmp" not in r.text
    return body["error"]


def _logits(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text[:300]
    return np.asarray(r.json()["logits"], np.float32)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Same program and kernels; batch-size-dependent oneDNN kernels may round differently."""
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-5 * max(1.0, float(np.abs(want).max()))


# ------------------------------------------------------------------ the package


def test_text_package_files_manifest_and_spec(run):
    pkg = run / "package"
    files = {p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file()}
    assert files == spec_mod.allowlist("pir", "text_cnn", "vocab.json", reference=True)
    art = artifacts.verify(pkg, ("package",))
    assert art.manifest["files"]["vocab.json"] == artifacts.verify(run / "export", ("export",)).manifest["files"][
        "vocab.json"]
    assert (pkg / "vocab.json").read_bytes() == (run / "train" / "vocab.json").read_bytes()
    doc = yaml.safe_load((pkg / "serving.yaml").read_text(encoding="utf-8"))
    assert doc["inputs"] == [{"name": "x", "dtype": "int64", "shape": [-1, -1]}]
    vocab_size = len(json.loads((pkg / "vocab.json").read_text(encoding="utf-8")))
    assert {k: doc["text"][k] for k in spec_mod.TEXT_KEYS} == {
        "tokenizer": "char", "max_len": MAX_LEN, "pad_id": 0, "unk_id": 1, "vocab_file": "vocab.json",
        "vocab_size": vocab_size}
    # The client config: int64 (feed type 0) with a variable-length dim.
    from google.protobuf import text_format

    conf = text_format.Parse((pkg / "serving_client_conf.prototxt").read_text(), client_config_class()())
    (feed,), (fetch,) = conf.feed_var, conf.fetch_var
    assert (feed.name, feed.alias_name, feed.feed_type, list(feed.shape), feed.is_lod_tensor) == \
        ("x", "x", 0, [-1], False)
    assert (fetch.alias_name, fetch.fetch_type, list(fetch.shape)) == ("logits", 1, [2])
    readme = (pkg / "README.md").read_text(encoding="utf-8")
    assert """-d '{"text": ["这个手机很好用"]}'""" in readme


def test_a_tampered_vocabulary_is_refused(run, tmp_path, cli):
    """A changed byte: the checksum. A vocabulary that does not fit serving.yaml, even re-checksummed in
    the manifest: refused before any predictor starts."""
    bad = tmp_path / "package"
    shutil.copytree(run / "package", bad)
    raw = bytearray((bad / "vocab.json").read_bytes())
    raw[-3] ^= 0x01
    (bad / "vocab.json").write_bytes(bytes(raw))
    code, _, err = cli("serve", bad)
    assert code == 2 and "sha256 mismatch for vocab.json" in err and len(err.strip().splitlines()) == 1
    (bad / "vocab.json").write_text(json.dumps(["[PAD]", "[UNK]", "好"]), encoding="utf-8")
    m = json.loads((bad / "manifest.json").read_text())
    m["files"]["vocab.json"] = {"sha256": artifacts.sha256_file(bad / "vocab.json"),
                                "bytes": (bad / "vocab.json").stat().st_size}
    (bad / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli("serve", bad)
    assert code == 2 and "vocab.json: expected a JSON list of" in err and len(err.strip().splitlines()) == 1


def test_text_package_from_a_compress_artifact(run, tmp_path):
    """`pipe package RUN/compress` on a text run: the vocabulary comes from the compress artifact's verified
    export lineage. A stand-in compress artifact (the layout stages/compress.py writes, as in
    tests/stages/test_package.py): the fp32 variant points back to the export, the legacy fp32 program
    stands in for int8-paddle."""
    from pipeline.cli import main

    exp = artifacts.verify(run / "export", ("export",))
    with artifacts.write_stage(tmp_path / "compress", "compress", exp.manifest["config"], exp) as w:
        (w.dir / "int8-paddle").mkdir()
        for f in ("model.pdmodel", "model.pdiparams"):
            shutil.copyfile(run / "export/legacy" / f, w.dir / "int8-paddle" / f)
        w.interface = exp.manifest["interface"]
        w.metrics = {"variants": {
            "fp32": {"engine": "paddle_inference", "format": "pir", "precision": "fp32", "files": [],
                     "source": "export", "accuracy": 0.9},  # measured numbers: what pipeline/choose.py ranks
            "int8-paddle": {"engine": "paddle_inference", "format": "legacy", "precision": "int8",
                            "source": "compress", "accuracy": 0.9,
                            "files": ["int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"]},
        }}
    for precision in ("fp32", "int8"):
        out = tmp_path / f"pkg-{precision}"
        assert main(["package", str(tmp_path / "compress"), "--out", str(out), "--precision", precision,
                     "--no-triton"]) == 0
        fmt = "pir" if precision == "fp32" else "legacy"
        assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == \
            spec_mod.allowlist(fmt, None, "vocab.json", reference=True)
        assert (out / "vocab.json").read_bytes() == (run / "export/vocab.json").read_bytes()
        assert yaml.safe_load((out / "serving.yaml").read_text(encoding="utf-8"))["text"]["max_len"] == MAX_LEN
        assert spec_mod.load_package(out).text.vocab == json_vocab(run)


def json_vocab(run: Path) -> dict[str, int]:
    return {t: i for i, t in enumerate(json.loads((run / "export/vocab.json").read_text(encoding="utf-8")))}


def test_triton_config_for_text_parses(run, predictor, vocab):
    """Triton's own ModelConfig schema: int64 input, dims [-1]; the ONNX takes any length and matches the
    packaged program on the same ids (at max_len and shorter)."""
    cls = triton_model_config_class()
    from google.protobuf import text_format

    root = run / "package/triton/text_cnn"
    conf = text_format.Parse((root / "config.pbtxt").read_text(), cls())
    (inp,), (out,) = conf.input, conf.output
    dt = type(conf).DESCRIPTOR.fields_by_name["input"].message_type.fields_by_name["data_type"].enum_type
    assert (inp.name, dt.values_by_number[inp.data_type].name, list(inp.dims)) == ("x", "TYPE_INT64", [-1])
    assert list(out.dims) == [2] and conf.max_batch_size == 32
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(root / "1/model.onnx"), so, providers=["CPUExecutionProvider"])
    ids = _encode(TEXTS, vocab)
    for x in (ids, ids[:, :7]):
        _close(sess.run(None, {"x": x})[0], predictor(x))


# ------------------------------------------------------------------ served outputs


@pytest.mark.slow
def test_text_is_encoded_as_in_training(client, predictor, vocab):
    """One text at a time and all at once, against the predictor on `encode_texts` of the same texts (the
    training encoder, padded to max_len); the unpadded ids and the padded ids give the same answer."""
    want = predictor(_encode(TEXTS, vocab))
    one = np.concatenate([_logits(client.post("/v1/predict", json={"text": [t]})) for t in TEXTS])
    _close(one, want)
    body = client.post("/v1/predict", json={"text": TEXTS}).json()
    _close(np.asarray(body["logits"], np.float32), want)
    assert body["labels"] == [["neg", "pos"][k] for k in want.argmax(1)]
    ids = _encode(TEXTS[:1], vocab)
    short = ids[:, :len(TEXTS[0])]
    assert (short > 0).all()
    _close(_logits(client.post("/v1/predict", json={"inputs": short.tolist()})), want[:1])
    _close(_logits(client.post("/v1/predict", json={"inputs": ids.tolist()})), want[:1])


@pytest.mark.slow
def test_over_long_input_is_truncated(client, vocab):
    long_text = "这个东西很好" * 10  # 60 characters, max_len 24
    a = _logits(client.post("/v1/predict", json={"text": [long_text]}))
    b = _logits(client.post("/v1/predict", json={"text": [long_text[:MAX_LEN]]}))
    np.testing.assert_array_equal(a, b)
    ids = np.asarray([[vocab.get(c, 1) for c in long_text]])
    assert ids.shape == (1, 60)
    np.testing.assert_array_equal(_logits(client.post("/v1/predict", json={"inputs": ids.tolist()})), a)


@pytest.mark.slow
def test_model_info_shows_the_text_interface(client):
    m = client.get("/v1/model").json()
    assert m["input"] == {"name": "x", "alias": "x", "dtype": "int64", "shape": [-1, -1]}
    assert m["accepts_text"] is True and m["accepts_images"] is False
    assert m["text"]["max_len"] == MAX_LEN and m["text"]["vocab_file"] == "vocab.json"
    assert (m["text"]["pad_id"], m["text"]["unk_id"], m["text"]["tokenizer"]) == (0, 1, "char")
    schema = client.get("/openapi.json").json()["paths"]["/v1/predict"]["post"]["requestBody"]
    assert "text" in schema["content"]["application/json"]["schema"]["properties"]


BAD = [
    ("empty text", b'{"text": [""]}', 422, "empty_text"),
    ("blank text", b'{"text": ["ok", "  \\n"]}', 422, "empty_text"),
    ("invalid utf-8", b'{"text": ["\xff\xfe' + MARK.encode() + b'"]}', 400, "invalid_json"),
    ("truncated utf-8", '{"text": ["好'.encode()[:-1] + b'"]}', 400, "invalid_json"),
    ("lone surrogate", b'{"text": ["\\ud800"]}', 400, "invalid_json"),
    ("text not a list", json.dumps({"text": MARK}).encode(), 422, "invalid_request"),
    ("text not strings", json.dumps({"text": [1, 2]}).encode(), 422, "invalid_request"),
    ("no texts", b'{"text": []}', 422, "invalid_request"),
    ("33 texts", json.dumps({"text": ["好"] * 33}).encode(), 422, "invalid_request"),
    ("images on a text model", json.dumps({"images": [MARK]}).encode(), 422, "invalid_request"),
    ("text and inputs", json.dumps({"text": ["好"], "inputs": [[2]]}).encode(), 422, "invalid_request"),
    ("id past the vocabulary", json.dumps({"inputs": [[2, 10 ** 6]]}).encode(), 422, "invalid_tensor"),
    ("negative id", json.dumps({"inputs": [[-1]]}).encode(), 422, "invalid_tensor"),
    ("float ids", json.dumps({"inputs": [[2.5]]}).encode(), 422, "invalid_tensor"),
    ("rank 1 ids", json.dumps({"inputs": [2, 3]}).encode(), 422, "invalid_tensor"),
    ("zero-length ids", json.dumps({"inputs": [[]]}).encode(), 422, "invalid_tensor"),
    ("ids beyond int64", json.dumps({"inputs": [[2 ** 70]]}).encode(), 422, "invalid_tensor"),
]


@pytest.mark.parametrize("body, code, kind", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_text_requests(client, body, code, kind):
    _error(client.post("/v1/predict", content=body, headers=JSON_HDR), code, kind)


def test_images_on_a_text_model_name_what_it_takes(client):
    err = _error(client.post("/v1/predict", json={"images": [MARK]}), 422, "invalid_request")
    assert "'text'" in err["message"] and "'inputs'" in err["message"]


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text(max_size=40), min_size=0, max_size=4))
def test_fuzz_text_never_5xx(client, texts):
    r = client.post("/v1/predict", json={"text": texts})
    assert r.status_code < 500, r.text[:300]
    if r.status_code == 200:
        assert len(r.json()["logits"]) == len(texts)


# ------------------------------------------------------------------ dynamic batching across lengths


@pytest.fixture(scope="module")
def held(run, tmp_path_factory):
    hold = tmp_path_factory.mktemp("hold") / "hold"
    srv = start_server(run / "package", "--queue-size", "8", "--http-workers", "1", env={batcher.HOLD_ENV: str(hold)})
    yield srv, hold
    hold.unlink(missing_ok=True)
    assert srv.stop() == 0


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


@pytest.mark.slow
def test_mixed_lengths_share_one_run(held, predictor, vocab):
    """Five texts of 1..60 characters (and ids of other lengths) wait behind a held predictor, then run as
    one batch (visible in /metrics); each gets the logits it gets alone."""
    srv, hold = held
    bodies = [{"text": [TEXTS[3]]}, {"text": [TEXTS[1]]}, {"text": [TEXTS[2], TEXTS[0]]},
              {"inputs": _encode(TEXTS[4:5], vocab)[:, :4].tolist()}, {"text": [TEXTS[5]]}]
    texts = [TEXTS[3], TEXTS[1], TEXTS[2], TEXTS[0], TEXTS[4], TEXTS[5]]
    hold.touch()
    m0 = _metrics(srv.url)

    def post(body: dict) -> httpx.Response:
        return httpx.post(srv.url + "/v1/predict", json=body, timeout=30)

    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        first = pool.submit(post, bodies[0])
        _until(lambda: (lambda m: metric(m, "pipe_inflight_requests") == 1 and metric(m, "pipe_queue_depth") == 0)(
            _metrics(srv.url)))
        rest = [pool.submit(post, b) for b in bodies[1:]]
        _until(lambda: metric(_metrics(srv.url), "pipe_queue_depth") == 4)
        hold.unlink()
        answers = [first.result(30)] + [f.result(30) for f in rest]
    m1 = _metrics(srv.url)
    assert metric(m1, "pipe_batch_size_count") - metric(m0, "pipe_batch_size_count") == 1
    assert metric(m1, "pipe_batch_size_sum") - metric(m0, "pipe_batch_size_sum") == 6
    assert metric(m1, "pipe_batch_requests_sum") - metric(m0, "pipe_batch_requests_sum") == 5
    got = np.concatenate([_logits(r) for r in answers])
    alone = np.concatenate([predictor(_encode([t], vocab)) for t in texts])
    _close(got, alone)


# ------------------------------------------------------------------ Paddle Serving int64_data


@pytest.mark.slow
def test_paddle_serving_int64_round_trip(client, predictor, vocab):
    """/GeneralModelService/inference with int64_data (elem_type 0), protobuf from pipe's own descriptor and
    JSON; ids of length 9 are padded to max_len as for /v1/predict. A float feed is refused."""
    ids = _encode(TEXTS[:3], vocab)[:, :9]
    want = predictor(_encode([t[:9] for t in TEXTS[:3]], vocab))
    msgs = wire.messages()
    req = msgs["Request"](fetch_var_names=["logits"], log_id=5)
    t = req.tensor.add(name="x", alias_name="x", elem_type=0)
    t.shape.extend(ids.shape)
    t.int64_data.extend(ids.ravel().tolist())
    r = client.post("/GeneralModelService/inference", content=req.SerializeToString(),
                    headers={"content-type": "application/proto"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
    resp = msgs["Response"]()
    resp.ParseFromString(r.content)
    (ot,) = resp.outputs[0].tensor
    assert (resp.err_no, resp.log_id, list(ot.shape), ot.alias_name) == (0, 5, [3, 2], "logits")
    _close(np.asarray(ot.float_data, np.float32).reshape(3, 2), want)
    body = {"fetch_var_names": ["logits"], "log_id": 6, "tensor": [{
        "int64_data": ids.ravel().tolist(), "shape": list(ids.shape), "elem_type": 0, "name": "x", "alias_name": "x"}]}
    doc = client.post("/GeneralModelService/inference", json=body).json()
    jt = doc["outputs"][0]["tensor"][0]
    assert (doc["err_no"], doc["log_id"], jt["shape"]) == (0, 6, [3, 2])
    _close(np.asarray(jt["float_data"], np.float32).reshape(3, 2), want)
    body["tensor"][0] = {"float_data": [2.0] * 9, "shape": [1, 9], "elem_type": 1, "name": "x", "alias_name": "x"}
    _error(client.post("/GeneralModelService/inference", json=body), 422, "invalid_tensor")
    body["tensor"][0] = {"int64_data": [10 ** 6], "shape": [1, 1], "elem_type": 0, "name": "x", "alias_name": "x"}
    _error(client.post("/GeneralModelService/inference", json=body), 422, "invalid_tensor")


@pytest.mark.slow
def test_paddle_serving_client_int64_roundtrip(server, run, predictor, vocab, tmp_path):
    """paddle-serving-client==0.9.0's HttpClient with an int64 feed, protobuf and JSON mode, from Python 3.9."""
    py = serving_client_python()
    if py is None:
        pytest.skip("no Python 3.9 with paddle-serving-client==0.9.0: set PIPE_SERVING_CLIENT_PYTHON or create "
                    ".venv39 (make test does where python3.9 exists); the client has no wheel for Python >= 3.10")
    ids = _encode(TEXTS[:2], vocab)[:, :11]
    (tmp_path / "x.json").write_text(json.dumps(ids.tolist()))
    proc = subprocess.run([str(py), str(REPO / "tests/serving_client_roundtrip.py"),
                           str(run / "package/serving_client_conf.prototxt"), server.url.split("//", 1)[1],
                           str(tmp_path / "x.json"), "int64"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-500:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = predictor(_encode([t[:11] for t in TEXTS[:2]], vocab))
    for mode in ("proto", "json"):
        o = out[mode]
        assert (o["shape"], o["alias"], o["elem_type"], o["log_id"], o["err_no"]) == ([2, 2], "logits", 1, 7, 0), o
        _close(np.asarray(o["data"], np.float32).reshape(2, 2), want)


# ------------------------------------------------------------------ the README, run as written


@pytest.mark.slow
def test_text_readme_examples_work(server, run):
    readme = (run / "package/README.md").read_text(encoding="utf-8").replace("127.0.0.1:8000",
                                                                              server.url.split("//", 1)[1])
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    if shutil.which("curl"):
        proc = subprocess.run(["bash", "-c", "set -e\n" + blocks[1]], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        dec, answers, i = json.JSONDecoder(), [], 0
        while i < len(proc.stdout):
            if proc.stdout[i].isspace():
                i += 1
                continue
            value, i = dec.raw_decode(proc.stdout, i)
            answers.append(value)
        assert len(answers) == 2 and answers[0] == answers[1], proc.stdout[:500]  # text == its ids
    py = re.findall(r"```python\n(.*?)```", readme, re.S)
    proc = subprocess.run([sys.executable, "-c", py[0]], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and re.fullmatch(r"\['(neg|pos)', '(neg|pos)'\]\n", proc.stdout), proc.stderr[-1000:]
