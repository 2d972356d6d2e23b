"""Detection end to end: `pipe all` on examples/detection.yaml (tiny: 300 generated shapes images, 4 epochs,
short compress timing, serving threshold 0.05 so the barely trained model answers boxes), then `pipe serve`
on 127.0.0.1. The package carries the task (serving.yaml `task:`, Triton without labels, a README on decoding
in the client, a reference check on every head without top-1 agreement); /v1/predict answers per image a list
of {label, score, box} in the sent image's pixels (PNGs resized by the server, boxes scaled back); the COCO
mAP of /v1's boxes over the test split equals the mAP of the engine's raw outputs decoded offline with the
package's settings; /v2 answers the engine's raw outputs."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import config as config_mod, data as data_mod, engines
from pipeline.cli import main
from pipeline.serving import spec as spec_mod
from pipeline.tasks import detection as det
from tests.conftest import REPO
from tests.serving_helpers import start_server

pytestmark = pytest.mark.slow(reason="pipe all of a detection model, then a real pipe serve")
LABELS = ["rectangle", "ellipse", "triangle"]
SETTINGS = {"score_threshold": 0.05, "nms_iou": 0.6, "max_detections": 20}
BIG = (96, 128)  # (height, width) the test images are also sent at: the server resizes them to 64x64


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("detection") / "run"
    sets = ["data.shapes_images=300", "train.epochs=4", "train.warmup_epochs=0", "train.batch_size=16", "train.lr=1e-2",
            "compress.calib_batches=4", "compress.latency_runs=20", "compress.throughput_runs=3",
            "postprocess.score_threshold=0.05", "postprocess.max_detections=20"]
    code = main(["all", "--config", str(REPO / "examples/detection.yaml"), "--run", str(run),
                 *(a for s in sets for a in ("--set", s))])
    assert code == 0
    return run


@pytest.fixture(scope="module")
def spec(run) -> spec_mod.Spec:
    return spec_mod.load_package(run / "package")


@pytest.fixture(scope="module")
def test_split(run, spec) -> tuple[np.ndarray, np.ndarray]:
    """(the test images as stored: uint8 [N, 3, 64, 64], their boxes [N, M, 5] in model-input pixels)."""
    cfg = json.loads((run / "export/manifest.json").read_text())["config"]
    ds = data_mod.load(config_mod.from_dict(cfg).data)
    t = ds.test
    assert (ds.sizes[t.idx] == [64, 64]).all()  # shapes images are 64x64: original pixels = model input's
    return np.asarray(t.inputs["image"][t.idx]), np.asarray(t.y[t.idx])


@pytest.fixture(scope="module")
def engine(spec):
    """The package's files on the package's engine, as `pipe serve` loads them: model inputs -> every raw
    output by public name."""
    eng = engines.ENGINES[spec.engine].load(list(spec.files), threads=1, precision=spec.precision)
    on = engines.names(eng, spec.io, str(spec.files[0]))

    def raw(images: np.ndarray) -> dict[str, np.ndarray]:
        x = data_mod.prepare(images, spec.preprocessing)
        got = eng.run({on[spec.io.inputs[0].name]: x})
        return {t.public: got[on[t.name]] for t in spec.io.outputs}

    return raw


@pytest.fixture(scope="module")
def server(run):
    srv = start_server(run / "package")
    yield srv
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert srv.proc.poll() is not None
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _png(chw: np.ndarray, size: tuple[int, int] | None = None) -> bytes:
    from PIL import Image

    im = Image.fromarray(np.ascontiguousarray(chw.transpose(1, 2, 0)))
    if size is not None:
        im = im.resize((size[1], size[0]), Image.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _as_server_resizes(png: bytes) -> np.ndarray:
    """A PNG decoded and resized to 64x64 as `pipe serve` does (pipeline/serving/validate.py): uint8 CHW."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB").resize((64, 64), Image.BILINEAR), np.uint8).transpose(2, 0, 1)


def _v1(client: httpx.Client, body: dict) -> list[list[dict]]:
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 200, r.text[:300]
    doc = r.json()
    assert list(doc) == ["detections"]
    return doc["detections"]


def _rows(answer: list[dict], scale: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """One image's answer as decode's rows [x1, y1, x2, y2, score, class], boxes divided by (sy, sx)."""
    sy, sx = scale
    return np.array([[d["box"][0] / sx, d["box"][1] / sy, d["box"][2] / sx, d["box"][3] / sy, d["score"],
                      LABELS.index(d["label"])] for d in answer], np.float64).reshape(-1, 6)


def test_the_package_carries_the_task(run, spec):
    """serving.yaml's task section (the training's postprocess settings), no logits output, a Triton
    repository without labels.txt or label_filename, a README on decoding the raw heads in the client, and a
    reference check over every head with no top-1 agreement."""
    pkg = run / "package"
    doc = yaml.safe_load((pkg / "serving.yaml").read_text())
    assert doc["task"] == {"name": "detection", "spec": "detection", "settings": SETTINGS}
    assert spec.task is det and spec.info.logits == "" and spec.info.settings == SETTINGS
    assert sorted(o["name"] for o in doc["outputs"]) == ["heatmap", "offset", "size"]
    assert not any(o.get("role") for o in doc["outputs"])
    name = doc["triton"]["model"]
    assert sorted(p.relative_to(pkg / "triton").as_posix() for p in (pkg / "triton").rglob("*") if p.is_file()) == \
        [f"{name}/1/model.onnx", f"{name}/config.pbtxt"]
    assert "label_filename" not in (pkg / "triton" / name / "config.pbtxt").read_text()
    readme = (pkg / "README.md").read_text()
    assert "detection.decode(outputs, settings)" in readme and "serves the raw outputs" in readme
    ref = json.loads((pkg / "manifest.json").read_text())["metrics"]["reference"]
    assert ref["top1_agreement"] is None and set(ref["outputs"]) == {"heatmap", "size", "offset"}
    assert set(ref["task_metrics"]["fp32"]) == {"map", "map50"}


def test_v1_boxes_in_the_sent_images_pixels(client, spec, test_split, engine):
    """Test images sent as PNG at 64x64 and at 128x96 (width x height): each gets a list of {label, score,
    box}, score >= 0.05, at most 20, highest first; the big ones' boxes are what the engine's outputs on the
    server-resized image decode to, scaled to 128x96 (x by 2, y by 1.5). Tensors sent as model inputs get
    the same answer as the same images at 64x64."""
    images = test_split[0][:6]
    big = [_png(im, BIG) for im in images]
    got_small = _v1(client, {"images": [_b64(_png(im)) for im in images]})
    got_big = _v1(client, {"images": [_b64(p) for p in big]})
    assert len(got_small) == len(got_big) == len(images)
    assert sum(map(len, got_small)) > 0
    for answer in (*got_small, *got_big):
        assert len(answer) <= SETTINGS["max_detections"]
        assert [d["score"] for d in answer] == sorted((d["score"] for d in answer), reverse=True)
        for d in answer:
            assert set(d) == {"label", "score", "box"} and d["label"] in LABELS and 0.05 <= d["score"] <= 1
    for answer in got_big:
        for d in answer:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 <= x2 <= BIG[1] and 0 <= y1 <= y2 <= BIG[0]
    want = det.decode(engine(np.stack([_as_server_resizes(p) for p in big])), SETTINGS)
    sy, sx = BIG[0] / 64, BIG[1] / 64
    for got, w in zip(got_big, want):
        rows = _rows(got)
        assert rows.shape == w.shape
        np.testing.assert_allclose(rows[:, :4], w[:, :4] * [sx, sy, sx, sy], rtol=0, atol=0.011)
        np.testing.assert_allclose(rows[:, 4], w[:, 4], rtol=1e-5, atol=1e-6)
        assert (rows[:, 5] == w[:, 5]).all()
    x = data_mod.prepare(images, spec.preprocessing)
    assert _v1(client, {"inputs": x.tolist()}) == got_small


def test_v1_map_equals_the_engines_decoded_offline(client, test_split, engine):
    """COCO mAP over the test split of /v1's boxes (PNGs at their own 64x64) equals that of the engine's raw
    outputs decoded offline with the package's settings (boxes rounded to 2 decimals, as /v1 answers)."""
    images, y = test_split
    answers = []
    for i in range(0, len(images), 16):
        answers += _v1(client, {"images": [_b64(_png(im)) for im in images[i:i + 16]]})
    served = [_rows(a) for a in answers]
    decoded = det.decode(engine(images), SETTINGS)
    offline = [np.c_[np.round(d[:, :4].astype(np.float64), 2), d[:, 4:]] for d in decoded]
    assert [len(d) for d in served] == [len(d) for d in offline] and sum(map(len, served)) > 0
    got, want = det.coco_map(served, y, len(LABELS)), det.coco_map(offline, y, len(LABELS))
    assert want["map50"] > 0  # the model finds some objects: the mAPs compare matched boxes, not only misses
    assert got["map"] == pytest.approx(want["map"], abs=1e-6) and got["map50"] == pytest.approx(want["map50"], abs=1e-6)


def test_v2_answers_the_raw_outputs(client, spec, test_split, engine):
    """/v2 (Open Inference Protocol, as Triton serves this model) answers every raw head, under the model's
    names (never the program's fetch_name_<i>), equal to the engine's outputs on the same inputs."""
    images = test_split[0][:8]
    x = data_mod.prepare(images, spec.preprocessing)
    inp = spec.io.inputs[0]
    r = client.post(f"/v2/models/{spec.name}/infer", json={"inputs": [
        {"name": inp.name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert r.status_code == 200, r.text[:300]
    outs = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}
    assert set(outs) == {"heatmap", "offset", "size"} == {t.public for t in spec.io.outputs}
    want = engine(images)
    for t in spec.io.outputs:
        peak = float(np.abs(want[t.public]).max())
        np.testing.assert_allclose(outs[t.public], want[t.public], rtol=1e-5, atol=1e-5 * peak)
    r = client.post(f"/v2/models/{spec.name}/infer", json={
        "inputs": [{"name": inp.name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "heatmap", "parameters": {"classification": 2}}]})
    assert r.status_code == 400 and "has none" in r.json()["error"]
