"""pipe package and pipe serve on the real PP-OCRv4 recognizer, imported (the session's `ppocr_rec_export`):
the package keeps the line width dynamic (serving.yaml, the Triton config, the client config), its reference
set is real lines prepared as served; the server reads line images of any width on /v1 and answers what a
direct Paddle Inference run of the export answers, runs concurrent requests of different widths in batches
of one shape each (never padded to each other), takes raw tensors of any width up to the task's limit on
/v1 and /v2, and refuses the rest in one line."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import artifacts, config as config_mod, engines, iospec, reference, tasks
from pipeline.cli import main
from pipeline.engines import paddle as paddle_engine
from pipeline.serving import spec as spec_mod
from pipeline.tasks import ocr_rec
from tests.serving_helpers import png_b64 as _png, metric, start_server
from tests.stages.test_triton import tritonserver  # noqa: F401 (a fixture)


pytestmark = pytest.mark.slow(reason="serves the real PP-OCRv4 recognizer")


@pytest.fixture(scope="module")
def package(ppocr_rec_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ocr-package") / "package"
    assert main(["package", str(ppocr_rec_export), "--out", str(out), "--engine", "paddle"]) == 0  # as compared
    return out


@pytest.fixture(scope="module")
def export(ppocr_rec_export):
    """(info, the test split's lines, a direct Paddle Inference run of the export: feeds -> outputs by public name)."""
    art = artifacts.verify(ppocr_rec_export, ("export",))
    iface = art.manifest["interface"]
    info = ocr_rec.info_of(iface)
    data = ocr_rec.load_data(config_mod.from_dict(art.manifest["config"]).data, info)
    eng = paddle_engine.load([art.file("model.json"), art.file("model.pdiparams")], threads=1)
    return info, data.test, engines.bind(eng, iospec.IO.from_interface(iface), "export")


@pytest.fixture(scope="module")
def server(package):
    srv = start_server(package)
    yield srv
    assert srv.stop() == 0


def _alone(export, images):
    """Each line recognised on its own by the export, at its own width bucket: what the server must answer."""
    info, _, run = export
    return ocr_rec.recognise(images, info, run, 1)


def test_the_package_keeps_the_line_width_dynamic(package, export, ppocr_rec_export):
    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    assert spec["task"]["name"] == "ocr_rec" and spec["preprocessing"] == {"kind": "ocr_rec"}
    assert [t["shape"] for t in spec["inputs"]] == [[-1, 3, 48, -1]]
    assert [t["shape"] for t in spec["outputs"]] == [[-1, -1, 6625]]
    assert len(spec["labels"]) == 6623
    assert spec["name"] == "ch_PP-OCRv4_rec_infer"  # the source folder's name: /v2/models/<it>, Triton's too
    pbtxt = (package / "triton" / spec["name"] / "config.pbtxt").read_text()
    assert "dims: [ 3, 48, -1 ]" in pbtxt and "dims: [ -1, 6625 ]" in pbtxt
    conf = (package / "serving_client_conf.prototxt").read_text()
    assert conf.count("shape: -1") == 2  # feed [3, 48, -1], fetch [-1, 6625]: the batch is left out
    # the reference set: the 16 narrowest of the export's test and val lines, prepared as served, one width
    info, test, run = export
    desc = iospec.IO.from_interface(artifacts.verify(package, ("package",)).manifest["interface"])
    x, y = reference.load_set(package / reference.FILE, desc)
    (arr,) = x.values()
    assert arr.shape[:3] == (16, 3, 48) and arr.shape[3] % 64 == 0 and arr.shape[3] >= 320
    # the outputs as the task's digest: per step the class and its probability, not [16, T, 6625] floats
    steps = arr.shape[3] // 8
    assert {k: (v.dtype, v.shape) for k, v in y.items()} == {
        "digest/steps": (np.dtype("int32"), (16, steps)), "digest/step_probs": (np.dtype("float32"), (16, steps))}
    assert (package / reference.FILE).stat().st_size < arr.nbytes + 16 * steps * 8 + 4096
    probs = run({"x": arr})["probs"]
    np.testing.assert_array_equal(y["digest/steps"], probs.argmax(-1))
    art = artifacts.verify(ppocr_rec_export, ("export",))
    want, texts = ocr_rec.reference_set(config_mod.from_dict(art.manifest["config"]).data, info, 256)
    np.testing.assert_array_equal(arr, want)
    assert len(texts) == 16 and set(texts) <= set(test.texts) | set(ocr_rec.load_data(
        config_mod.from_dict(art.manifest["config"]).data, info).val.texts)
    m = artifacts.verify(package, ("package",)).manifest["metrics"]["reference"]
    assert m["samples"] == 16 and m["task_metrics"]["fp32"] == m["task_metrics"]["packaged"]
    assert m["agreement"] == 1.0 and m["outputs"]["steps"]["equal"] == 1.0
    assert m["task_metrics"]["fp32"]["acc"] >= 0.8  # PP-OCRv4 on clean generated lines (facts §17: ~0.97)


def test_v1_reads_line_images_of_any_width_as_a_direct_run(server, export):
    info, test, _ = export
    images = test.images
    assert len({ocr_rec.lines.batch_width([ocr_rec.lines.prepare(im, 3200).shape[2]], 64, 320)
                for im in images}) >= 3, "the test lines should span several width buckets"
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(im) for im in images]}, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()["lines"]
    want = _alone(export, images)
    assert [g["text"] for g in got] == [t for t, _ in want]
    np.testing.assert_allclose([g["score"] for g in got], [s for _, s in want], atol=1e-4)
    acc = ocr_rec.score([(g["text"], g["score"]) for g in got], test, info)["acc"]
    assert acc >= 0.8, acc
    # by input name, as every image package takes it
    r = httpx.post(server.url + "/v1/predict", json={"images": {"x": [_png(images[0])]}}, timeout=60)
    assert r.status_code == 200 and r.json()["lines"][0]["text"] == want[0][0]


def test_concurrent_requests_of_different_widths_get_what_they_get_alone(server, export):
    """Requests of several widths in flight together: the batcher runs only equal shapes together, so every
    answer is the one its line gets alone (a line padded to another's width could read differently)."""
    _, test, _ = export
    images = test.images[:8]
    want = [t for t, _ in _alone(export, images)]
    batches_before = metric(httpx.get(server.url + "/metrics").text, "pipe_batch_size_count", 0.0)

    def ask(i: int) -> str:
        r = httpx.post(server.url + "/v1/predict", json={"images": [_png(images[i % len(images)])]}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["lines"][0]["text"]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(32)))
    assert got == [want[i % len(images)] for i in range(32)]
    assert metric(httpx.get(server.url + "/metrics").text, "pipe_batch_size_count", 0.0) > batches_before


def test_raw_tensors_of_any_width_up_to_the_limit(server, export):
    info, test, run = export
    x = ocr_rec.lines.collate([ocr_rec.lines.prepare(test.images[0], 3200)], 8, 1)  # an exact width, not bucketed
    assert x.shape[3] % 64 != 0 or x.shape[3] < 320
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    r = httpx.post(server.url + "/v2/models/ch_PP-OCRv4_rec_infer/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    probs = np.asarray(out["data"], np.float32).reshape(out["shape"])
    assert out["shape"] == [1, x.shape[3] // 8, 6625]
    np.testing.assert_allclose(probs, run({"x": x})["probs"], atol=1e-5)
    r = httpx.post(server.url + "/v1/predict", json={"inputs": x.tolist()}, timeout=60)
    assert r.status_code == 200 and r.json()["lines"][0]["text"] == ocr_rec.decode({"probs": probs}, info)[0][0]
    for shape, needle in (([1, 3, 32, 320], "[N, 3, 48, 1..3200]"), ([1, 3, 48, 3208], "[N, 3, 48, 1..3200]"),
                          ([1, 1, 48, 320], "[N, 3, 48, 1..3200]")):
        r = httpx.post(server.url + "/v1/predict", json={"inputs": np.zeros(shape).tolist()}, timeout=60)
        assert r.status_code == 422 and needle in r.json()["error"]["message"], r.text


def test_bad_line_images_are_refused_naming_the_image(server, export):
    _, test, _ = export
    for images, code, needle in (([_png(test.images[0]), "AAAA"], 422, "images[1]: not a decodable PNG/JPEG"),
                                 ([], 422, "images: a list of 1..32 base64 strings"),
                                 (["not base64!"], 422, "images[0]: not valid base64")):
        r = httpx.post(server.url + "/v1/predict", json={"images": images}, timeout=60)
        assert r.status_code == code and needle in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(test.images[0])], "inputs": [[0]]}, timeout=60)
    assert r.status_code == 422, r.text
    # a one-pixel-high sliver and a blank page are lines too: an answer, not an error
    blank = np.full((40, 900, 3), 255, np.uint8)
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(blank), _png(blank[:1])]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["lines"]) == 2, r.text


def test_model_info_and_openapi_describe_the_dynamic_width(server, export):
    from tests.stages.test_serve_openapi import valid

    info = httpx.get(server.url + "/v1/model").json()
    assert info["task"]["name"] == "ocr_rec" and info["accepts_images"] is True
    cfg = httpx.get(server.url + "/v2/models/ch_PP-OCRv4_rec_infer/config").json()
    assert cfg["input"][0]["dims"] == [3, 48, -1]
    post = httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/predict"]["post"]
    request = post["requestBody"]["content"]["application/json"]["schema"]
    answer = post["responses"]["200"]["content"]["application/json"]["schema"]
    _, test, _ = export
    body = {"images": [_png(im) for im in test.images[:3]]}
    assert valid(request, body) and valid(request, {"inputs": np.zeros((1, 3, 48, 100)).tolist()})
    assert not valid(request, {"inputs": np.zeros((1, 3, 32, 100)).tolist()})
    r = httpx.post(server.url + "/v1/predict", json=body, timeout=60)
    assert r.status_code == 200 and valid(answer, r.json()), r.text
    assert "1..3200" in request["properties"]["inputs"]["description"]


def test_a_package_on_openvino_reads_the_legacy_program(ppocr_rec_export, tmp_path, cli):
    """The export's legacy program, byte for byte as PaddleOCR shipped it, on OpenVINO: the reference check
    holds (the fastest fp32 engine for PP-OCRv4 on CPU, facts §17)."""
    code, out, err = cli("package", ppocr_rec_export, "--engine", "openvino", "--no-triton", "--out", tmp_path / "p")
    assert code == 0, err
    m = artifacts.verify(tmp_path / "p", ("package",)).manifest
    assert m["engine"] == "openvino" and m["format"] == "legacy"
    ref = m["metrics"]["reference"]
    assert ref["task_metrics"]["packaged"]["acc"] == ref["task_metrics"]["fp32"]["acc"]
    assert tasks.get("ocr_rec") is ocr_rec


def _two_widths(export) -> list[np.ndarray]:
    """Two real lines as the model takes them, at two different widths (each its own bucket)."""
    info, test, _ = export
    prepared = sorted((ocr_rec.lines.prepare(im, 3200) for im in test.images), key=lambda p: p.shape[2])
    return [ocr_rec.lines.collate([p], 64, 320) for p in (prepared[0], prepared[-1])]


def _triton_infer(client, name: str, x: np.ndarray, output: str) -> np.ndarray:
    import tritonclient.http as th

    inp = th.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return client.infer(name, [inp], outputs=[th.InferRequestedOutput(output, binary_data=True)]).as_numpy(output)


def test_tritonclient_on_v2_at_two_widths_in_one_run(server, package, export):
    """tritonclient.http against pipe serve's /v2: two requests of different widths, each answered at its own
    width with what the package's engine gives (a direct Paddle run of the export)."""
    import tritonclient.http as th

    _, _, run = export
    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    out = spec["outputs"][0]["name"]
    client = th.InferenceServerClient(server.url.removeprefix("http://"))
    xs = _two_widths(export)
    assert xs[0].shape[3] != xs[1].shape[3]
    try:
        for x in xs:
            got = _triton_infer(client, spec["name"], x, out)
            assert got.shape == (1, x.shape[3] // 8, 6625)
            np.testing.assert_allclose(got, run({"x": x})["probs"], atol=1e-5)
    finally:
        client.close()


def test_the_triton_repository_in_a_real_tritonserver_at_two_widths(tritonserver, package, export, tmp_path):
    """The package's Triton repository, unchanged, in tritonserver 2.51 (dims [3, 48, -1]): two widths in
    one run, each equal to onnxruntime on the repository's model.onnx, and decoding to the export's texts."""
    import onnxruntime as ort
    import tritonclient.http as th

    from tests.conftest import tree_hash
    from tests.stages.test_triton import start_triton

    info, _, run = export
    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    name, out = spec["triton"]["model"], spec["outputs"][0]["name"]
    repo = package / "triton"
    before = tree_hash(repo)
    sess = ort.InferenceSession(str(repo / name / "1/model.onnx"), providers=["CPUExecutionProvider"])
    triton = start_triton(tritonserver, repo, tmp_path / "triton.log")
    client = th.InferenceServerClient(triton.url)
    try:
        assert client.is_model_ready(name)
        for x in _two_widths(export):
            got = _triton_infer(client, name, x, out)
            np.testing.assert_allclose(got, sess.run([out], {"x": x})[0], rtol=1e-6, atol=1e-6)
            assert ocr_rec.decode({"probs": got}, info)[0][0] == ocr_rec.decode(run({"x": x}), info)[0][0]
    finally:
        client.close()
        assert triton.stop() == 0
    assert tree_hash(repo) == before


def test_the_reference_check_holds_decoded_texts_to_the_budget(package, export, cli):
    """`pipe inspect --verify` runs the digest check on this machine; agreement is per character (1 - the
    normalised edit distance of the two texts): a set whose stored paths read nothing on 2 of its 16 lines
    agrees 14/16 = 0.875 < 0.99, one character changed on those lines much less: below budget, said in one line."""
    code, out, err = cli("inspect", package, "--verify")
    assert code == 0, err
    assert "16 samples, answers agreeing with fp32 1.0000 (budget 0.99)" in out, out
    spec = spec_mod.load_package(package)
    x, y = reference.load_set(package / reference.FILE, spec.io)
    _, _, run = export
    got = {t.name: run({"x": next(iter(x.values()))})[t.public] for t in spec.io.outputs}
    bad = dict(y)
    bad["digest/steps"] = y["digest/steps"].copy()
    bad["digest/steps"][[3, 7]] = 0  # blank at every step: those two lines read nothing
    result = reference.compare(got, bad, spec.io, 20.0, logits="", task=spec.task, info=spec.info)
    assert result["agreement"] == 14 / 16 and not reference.verdict(result, 0.99)
    assert "answers agreeing with fp32 0.8750 (budget 0.99)" in reference.describe(result, 0.99)
    one = dict(y)
    one["digest/steps"] = y["digest/steps"].copy()
    one["digest/steps"][[3, 7], 0] = 17  # another character where those lines start: a part of each line
    part = reference.compare(got, one, spec.io, 20.0, logits="", task=spec.task, info=spec.info)["agreement"]
    assert 14 / 16 < part < 1.0
    # the step probabilities are read from the output the agreement judges: recorded, not held to min_sqnr_db
    # (an int8 package reads every line as fp32 with them some dB off)
    halved = dict(y)
    halved["digest/step_probs"] = y["digest/step_probs"] * 0.5
    res = reference.compare(got, halved, spec.io, 20.0, logits="", task=spec.task, info=spec.info)
    assert res["agreement"] == 1.0 and res["outputs"]["step_probs"]["sqnr_db"] < 20 and reference.verdict(res, 0.99)
    assert reference.verdict(reference.compare(got, y, spec.io, 20.0, logits="", task=spec.task, info=spec.info), 0.99)


def test_the_package_readme_examples_work(server, package, export, tmp_path):
    """The package README's curl and Python examples for line images, and its tritonclient example with a
    tensor of the first example width, run as written (port substituted) against the server."""
    import json
    import re
    import shutil
    import subprocess
    import sys

    from PIL import Image

    _, test, _ = export
    readme = (package / "README.md").read_text(encoding="utf-8").replace("127.0.0.1:8000",
                                                                          server.url.split("//", 1)[1])
    assert "np.zeros((1, 3, 48, 320)" in readme and "-1)" not in readme and len(readme) < 20_000
    blocks = {lang: re.findall(rf"```{lang}\n(.*?)```", readme, re.S) for lang in ("sh", "python")}
    Image.fromarray(test.images[0]).save(tmp_path / "picture.png")
    want = ocr_rec.recognise([test.images[0]], export[0], export[2], 1)[0][0]
    if shutil.which("curl"):
        curl = next(b for b in blocks["sh"] if "base64 -w0 picture.png" in b)
        proc = subprocess.run(["bash", "-c", "set -e\n" + curl], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and json.loads(proc.stdout)["lines"][0]["text"] == want, proc.stderr
    v1 = next(b for b in blocks["python"] if "picture.png" in b)
    proc = subprocess.run([sys.executable, "-c", v1], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and repr(want) in proc.stdout, proc.stderr[-1000:]
    v2 = next(b for b in blocks["python"] if "tritonclient" in b)
    proc = subprocess.run([sys.executable, "-c", v2], cwd=package, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "'lines'" in proc.stdout, proc.stderr[-1000:]


def test_a_batch_takes_its_shape_from_behind_other_shapes(package, export, tmp_path):
    """Requests of two widths queued alternately behind a held predictor run as two batches, one per width
    (a thread sets the other width aside and keeps taking its own behind it), each request answered what it
    gets alone; the queue in arrival order would have run nine batches of one."""
    import concurrent.futures as cf
    import time

    from pipeline.serving import batcher

    info, _, run = export
    a, b = _two_widths(export)
    hold = tmp_path / "hold"
    srv = start_server(package, "--max-batch-size", "8", "--http-workers", "1",  # one queue to fill
                       env={batcher.HOLD_ENV: str(hold)})

    def post(x: np.ndarray) -> str:
        r = httpx.post(srv.url + "/v1/predict", json={"inputs": x.tolist()}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["lines"][0]["text"]

    def gauge(name: str) -> float:
        return metric(httpx.get(srv.url + "/metrics").text, name, 0.0)

    try:
        runs0 = gauge("pipe_batch_size_count")
        hold.touch()
        order = [a, b] * 4 + [a]
        with cf.ThreadPoolExecutor(len(order)) as pool:
            futures = [pool.submit(post, order[0])]
            deadline = time.monotonic() + 30
            while gauge("pipe_inflight_requests") < 1 or gauge("pipe_queue_depth") > 0:  # taken and held
                assert time.monotonic() < deadline
                time.sleep(0.02)
            for i, x in enumerate(order[1:], 2):
                futures.append(pool.submit(post, x))
                while gauge("pipe_queue_depth") < i - 1:  # queued in this order
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            hold.unlink()
            texts = [f.result() for f in futures]
        assert gauge("pipe_batch_size_count") - runs0 == 2
        want = {x.shape[3]: ocr_rec.decode(run({"x": x}), info)[0][0] for x in (a, b)}
        assert texts == [want[x.shape[3]] for x in order]
    finally:
        hold.unlink(missing_ok=True)
        assert srv.stop() == 0
