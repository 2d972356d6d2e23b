"""`pipe all --config examples/chinese_sentiment_ernie.yaml` end to end on a small learnable Chinese review
file (the example's model, two named inputs input_ids + token_type_ids; only the data, length and epochs are
shrunk for CI): every stage carries both inputs, and the package served answers /v2 with both inputs from
the real tritonclient, /v1/predict with text, and Paddle Serving's JSON wire with two feeds, each equal to
the packaged model's own outputs run here by name."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline import data as data_mod, engines
from pipeline.serving import spec as spec_mod
from tests.conftest import REPO, reviews
from tests.serving_helpers import start_server
from tests.stages.test_triton import start_triton, tritonserver  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow(reason="pipe all of ERNIE tiny, served and in tritonserver")
EXAMPLE = REPO / "examples/chinese_sentiment_ernie.yaml"
TEXTS = ["好棒满意这个东西", "差烂失望这个东西", "这个还是很好"]


@pytest.fixture(scope="module")
def ernie_run(tmp_path_factory) -> Path:
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("all-ernie")
    data = reviews(root / "reviews.jsonl")
    args = ["all", "--config", str(EXAMPLE), "--run", str(root / "run"), "--set", f"data.source={data}",
            "--set", "data.max_len=24", "--set", "data.min_count=1", "--set", "train.epochs=6",
            "--set", "train.batch_size=16", "--set", "compress.calib_batches=4", "--set", "compress.latency_runs=20",
            "--set", "compress.throughput_runs=5", "--set", "compress.max_drop=100",
            "--set", "compress.min_agreement=0", "--set", "release.min_accuracy=0"]
    assert main(args) == 0
    return root / "run"


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _own_outputs(package: Path, texts: list[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], spec_mod.Spec]:
    """The packaged model run here on its own engine, fed by name: (feeds by public name, outputs by public name)."""
    spec = spec_mod.load_package(package)
    ids = spec.text.encode(texts)
    feeds = data_mod.text_inputs(ids, spec.preprocessing)
    eng = engines.ENGINES[spec.engine].load(list(spec.files), threads=1, precision=spec.precision)
    names = engines.names(eng, spec.io, "test")
    got = eng.run({names[t.name]: feeds[t.public] for t in spec.io.inputs})
    return feeds, {t.public: got[names[t.name]] for t in spec.io.outputs}, spec


def test_every_stage_carries_both_inputs(ernie_run):
    run = ernie_run
    for stage in ("train", "export", "package"):
        iface = _manifest(run / stage).get("interface") or {}
        if iface:
            assert [t.get("alias", t["name"]) for t in iface["inputs"]] == ["input_ids", "token_type_ids"], stage
    variants = _manifest(run / "compress")["metrics"]["variants"]
    assert {"fp32", "int8-onnx"} <= set(variants)
    spec = spec_mod.load_package(run / "package")
    assert [t.public for t in spec.io.inputs] == ["input_ids", "token_type_ids"]
    assert all(t.dtype == "int64" and t.shape == (-1, -1) for t in spec.io.inputs)


def test_the_package_serves_v2_v1_and_the_serving_wire_alike(ernie_run):
    import tritonclient.http as th

    pkg = ernie_run / "package"
    feeds, own, spec = _own_outputs(pkg, TEXTS)
    logits = own["logits"]
    srv = start_server(pkg)
    try:
        # /v1/predict with text: every model input filled from the text
        r = httpx.post(srv.url + "/v1/predict", json={"text": TEXTS}, timeout=30)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()["logits"], np.float32), logits, rtol=1e-5, atol=1e-5)
        # /v2 with both inputs from the real tritonclient, binary and JSON
        client = th.InferenceServerClient(srv.url.removeprefix("http://"))
        try:
            meta = client.get_model_metadata(spec.name)
            assert [i["name"] for i in meta["inputs"]] == ["input_ids", "token_type_ids"]
            for binary in (True, False):
                ins = []
                for t in spec.io.inputs:
                    inp = th.InferInput(t.public, list(feeds[t.public].shape), "INT64")
                    inp.set_data_from_numpy(feeds[t.public], binary_data=binary)
                    ins.append(inp)
                res = client.infer(meta["name"], ins)
                np.testing.assert_allclose(res.as_numpy(spec.io.logits().public), logits, rtol=1e-5, atol=1e-5)
        finally:
            client.close()
        # Paddle Serving's wire (its JSON form of the protobuf Request), one tensor per feed: int64 ids
        tensors = [{"int64_data": feeds[t.public].ravel().tolist(), "shape": list(feeds[t.public].shape),
                    "elem_type": 0, "name": t.public, "alias_name": t.public} for t in spec.io.inputs]
        r = httpx.post(srv.url + "/GeneralModelService/inference",
                       json={"fetch_var_names": ["logits"], "log_id": 5, "tensor": tensors}, timeout=30)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert (doc["err_no"], doc["log_id"]) == (0, 5)
        (jt,) = doc["outputs"][0]["tensor"]
        assert jt["alias_name"] == "logits" and jt["shape"] == list(logits.shape)
        np.testing.assert_allclose(np.asarray(jt["float_data"], np.float32).reshape(logits.shape), logits,
                                   rtol=1e-5, atol=1e-5)
    finally:
        assert srv.stop() == 0


def test_the_real_tritonserver_loads_its_repository_and_answers_alike(ernie_run, tritonserver, tmp_path):
    """The package's Triton repository, unchanged, in a real tritonserver 2.51: both int64 inputs, logits
    equal to onnxruntime on the repository's model.onnx, and to the package's own answer when it serves that
    file (an onnxruntime package)."""
    import onnxruntime as ort
    import tritonclient.http as th
    import yaml

    from tests.conftest import tree_hash

    pkg = ernie_run / "package"
    feeds, own, spec = _own_outputs(pkg, TEXTS)
    name = yaml.safe_load((pkg / "serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
    repo = pkg / "triton"
    before = tree_hash(repo)
    sess = ort.InferenceSession(str(repo / name / "1/model.onnx"), providers=["CPUExecutionProvider"])
    logits_name = spec.io.logits().public  # the model's name: the repository's ONNX and config.pbtxt use it
    want = sess.run([logits_name], {t.public: feeds[t.public] for t in spec.io.inputs})[0]
    triton = start_triton(tritonserver, repo, tmp_path / "triton.log")
    client = th.InferenceServerClient(triton.url)
    try:
        assert client.is_model_ready(name)
        meta = client.get_model_metadata(name)
        assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("input_ids", "INT64"), ("token_type_ids", "INT64")]
        ins = []
        for key in ("token_type_ids", "input_ids"):  # not the config's order
            ins.append(th.InferInput(key, list(feeds[key].shape), "INT64"))
            ins[-1].set_data_from_numpy(feeds[key])
        got = client.infer(name, ins).as_numpy(logits_name)
        np.testing.assert_array_equal(got, want)
        if spec.engine == "onnxruntime":
            np.testing.assert_allclose(got, own["logits"], rtol=1e-6, atol=1e-6)
    finally:
        client.close()
        code = triton.stop()
    assert code == 0, triton.tail()
    assert tree_hash(repo) == before


def test_the_demo_client_feeds_both_inputs_by_name(ernie_run):
    """examples/serve_demo.py on the two-input package: /v1/predict with every reference input by name, /v2
    from tritonclient with both as binary tensors, the same logits from both."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO / "examples/serve_demo.py"), str(ernie_run / "package")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "reference inputs (input_ids, token_type_ids), top-1 agreement with fp32 " in proc.stdout
    # the package's own reference check (same engine, same inputs) recorded this agreement at package time
    check = _manifest(ernie_run / "package")["metrics"]["reference"]
    served = float(proc.stdout.split("top-1 agreement with fp32 ")[1].split()[0])
    assert served >= check["min_agreement"] and abs(served - check["top1_agreement"]) <= 1 / check["samples"]
    assert float(proc.stdout.split("(tritonclient, binary tensors): max|diff| from /v1 ")[1].split()[0]) <= 1e-5
    assert "server stopped (exit 0)" in proc.stdout


def test_pipe_bench_measures_the_two_input_package(ernie_run):
    """`pipe bench DIR` on the two-input artifacts: every model fed both inputs by name, its test accuracy
    the one compress measured for the same variant on the same engine."""
    from pipeline.bench import measure

    compressed = _manifest(ernie_run / "compress")["metrics"]
    shipped = _manifest(ernie_run / "package")["metrics"]["variant"]
    rows = measure.measure([ernie_run / "package"], quick=True)
    row = next(r for r in rows if r.variant == shipped)
    assert row.status == "ok" and row.test_samples == compressed["test_samples"]
    assert abs(row.accuracy - compressed["variants"][shipped]["accuracy"]) <= 1 / row.test_samples
    assert row.p50_ms > 0 and row.items_per_s > 0
