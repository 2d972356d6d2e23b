"""pipe package and pipe serve on the real PP-OCRv4 detector, imported (the session's `ppocr_det_export`): the
package keeps both page sides dynamic and runs 4 pages at most at once (the task's `max_batch`), its reference
set is real pages fitted into one square; the server reads pages of any size on /v1 and answers the boxes a
direct Paddle Inference run of the export gives, in each page's own pixels; concurrent pages of different
sizes each get what they get alone; raw tensors up to the task's limit on /v1 and /v2; a page without text is
an empty list; bad input is refused in one line naming the image."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import artifacts, config as config_mod, engines, iospec, reference
from pipeline.cli import main
from pipeline.engines import paddle as paddle_engine
from pipeline.tasks import ocr_det
from pipeline.tasks.ocr_det import db
from tests.serving_helpers import png_b64 as _png, metric, start_server

pytestmark = pytest.mark.slow(reason="serves the real PP-OCRv4 detector")
NAME = "ch_PP-OCRv4_det_infer"


@pytest.fixture(scope="module")
def package(ppocr_det_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ocr-det-package") / "package"
    assert main(["package", str(ppocr_det_export), "--out", str(out), "--engine", "paddle"]) == 0  # as compared
    return out


@pytest.fixture(scope="module")
def export(ppocr_det_export):
    """(info, the test split's pages, a direct Paddle Inference run of the export: feeds -> outputs by public name)."""
    art = artifacts.verify(ppocr_det_export, ("export",))
    iface = art.manifest["interface"]
    info = ocr_det.info_of(iface)
    data = ocr_det.load_data(config_mod.from_dict(art.manifest["config"]).data, info)
    eng = paddle_engine.load([art.file("model.json"), art.file("model.pdiparams")], threads=1)
    return info, data.test, engines.bind(eng, iospec.IO.from_interface(iface), "export")


@pytest.fixture(scope="module")
def server(package):
    srv = start_server(package)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-2000:]


def _alone(export, images) -> list[list[dict]]:
    """Each page detected on its own by the export, its boxes mapped to its pixels: what the server must answer."""
    info, _, run = export
    out = []
    for im in images:
        (pos, x), = ocr_det.prepare_images([im], info, 1)
        (page,) = ocr_det.decode(run({"x": x}), info)
        boxes = db.to_source(page, *im.shape[:2])
        out.append([{"points": b.tolist(), "score": s} for b, s in zip(boxes, page.scores)])
    return out


def _same(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert [[b["points"] for b in p] for p in got] == [[b["points"] for b in p] for p in want]
    np.testing.assert_allclose([b["score"] for p in got for b in p], [b["score"] for p in want for b in p], atol=1e-4)


def test_the_package_keeps_both_sides_dynamic(package, export):
    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    assert spec["task"]["name"] == "ocr_det" and spec["preprocessing"] == {"kind": "ocr_det"}
    assert [t["shape"] for t in spec["inputs"]] == [[-1, 3, -1, -1]]
    assert [t["shape"] for t in spec["outputs"]] == [[-1, 1, -1, -1]] and spec["outputs"][0]["name"] == "maps"
    assert spec["name"] == NAME and spec["labels"] == ["text"]
    # the task's default batch (`max_batch`): pages of one shape, ~0.25 s each; not every other package's 32
    assert spec["batching"]["max_batch_size"] == ocr_det.max_batch == 4
    m = artifacts.verify(package, ("package",)).manifest
    assert m["config"]["package"]["max_batch_size"] == 4
    pbtxt = (package / "triton" / NAME / "config.pbtxt").read_text()
    assert "dims: [ 3, -1, -1 ]" in pbtxt and "dims: [ 1, -1, -1 ]" in pbtxt and "max_batch_size: 4" in pbtxt
    # the reference set: the export's first test and val pages fitted into one 480 square, maps as float16
    info, test, run = export
    desc = iospec.IO.from_interface(m["interface"])
    x, y = reference.load_set(package / reference.FILE, desc)
    (arr,) = x.values()
    assert arr.shape == (4, 3, ocr_det.REFERENCE_SIDE, ocr_det.REFERENCE_SIDE)
    assert {k: (v.dtype, v.shape) for k, v in y.items()} == {"digest/maps": (np.dtype("float16"), (4, 1, 480, 480))}
    np.testing.assert_array_equal(y["digest/maps"], run({"x": arr})["maps"].astype(np.float16))
    ref = m["metrics"]["reference"]
    assert ref["samples"] == 4 and ref["agreement"] == 1.0
    assert ref["task_metrics"]["fp32"] == ref["task_metrics"]["packaged"]
    assert ref["task_metrics"]["fp32"]["hmean"] >= 0.9  # PP-OCRv4 on clean generated pages, at 480 px


def test_v1_boxes_in_each_pages_pixels_as_a_direct_run(server, export):
    info, test, _ = export
    images = test.images[:4]
    assert len({ocr_det.prepare_images([im], info, 1)[0][1].shape for im in images}) >= 3, "pages of several shapes"
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(im) for im in images]}, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()["boxes"]
    _same(got, _alone(export, images))
    pages = ocr_det.subset(test, range(4))
    answers = [db.Page(np.asarray([b["points"] for b in p], np.float32).reshape(-1, 4, 2), [b["score"] for b in p],
                       im.shape[:2]) for p, im in zip(got, images)]  # page pixels: to_source leaves them as sent
    assert ocr_det.score(answers, pages, info)["hmean"] >= 0.95
    # by input name, as every image package takes it
    r = httpx.post(server.url + "/v1/predict", json={"images": {"x": [_png(images[0])]}}, timeout=60)
    assert r.status_code == 200 and r.json()["boxes"][0] == got[0]


def test_concurrent_pages_of_different_sizes_get_what_they_get_alone(server, export):
    _, test, _ = export
    images = test.images
    want = _alone(export, images)
    batches_before = metric(httpx.get(server.url + "/metrics").text, "pipe_batch_size_count", 0.0)

    def ask(i: int) -> list[dict]:
        r = httpx.post(server.url + "/v1/predict", json={"images": [_png(images[i % len(images)])]}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["boxes"][0]

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, range(12)))
    _same(got, [want[i % len(images)] for i in range(12)])
    assert metric(httpx.get(server.url + "/metrics").text, "pipe_batch_size_count", 0.0) > batches_before


def test_raw_tensors_up_to_the_limit_on_v1_and_v2(server, export):
    info, test, run = export
    ((_, x),) = ocr_det.prepare_images([test.images[1][:200, :300]], info, 1)  # a corner: JSON under the body cap
    assert x.shape == (1, 3, 192, 288)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    r = httpx.post(server.url + f"/v2/models/{NAME}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["shape"] == [1, 1, *x.shape[2:]]
    maps = np.asarray(out["data"], np.float32).reshape(out["shape"])
    np.testing.assert_allclose(maps, run({"x": x})["maps"], atol=1e-5)
    # /v1 with a tensor: the boxes in the map's pixels (no page size to map them to)
    r = httpx.post(server.url + "/v1/predict", json={"inputs": x.tolist()}, timeout=60)
    assert r.status_code == 200, r.text
    (page,) = ocr_det.decode({"maps": maps}, info)
    assert len(page.boxes) >= 1
    assert [b["points"] for b in r.json()["boxes"][0]] == page.boxes.tolist()
    for shape in ([1, 3, 992, 64], [1, 1, 64, 64]):  # beyond the 960 side the settings give; one channel
        r = httpx.post(server.url + "/v1/predict", json={"inputs": np.zeros(shape).tolist()}, timeout=60)
        assert r.status_code == 422 and "[N, 3, 1..960, 1..960]" in r.json()["error"]["message"], r.text


def test_a_page_without_text_is_an_empty_list_and_bad_images_are_refused(server, export):
    _, test, _ = export
    blank = np.full((300, 400, 3), 255, np.uint8)
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(blank), _png(blank[:1, :1])]}, timeout=60)
    assert r.status_code == 200 and r.json() == {"boxes": [[], []]}, r.text
    for images, needle in (([_png(test.images[0]), "AAAA"], "images[1]: not a decodable PNG/JPEG"),
                           ([], "images: a list of 1..4 base64 strings"),
                           ([_png(blank)] * 5, "images: a list of 1..4 base64 strings"),
                           (["not base64!"], "images[0]: not valid base64")):
        r = httpx.post(server.url + "/v1/predict", json={"images": images}, timeout=60)
        assert r.status_code == 422 and needle in r.json()["error"]["message"], r.text


def test_model_info_openapi_and_the_readme_describe_pages(server, package, export, tmp_path):
    import re
    import subprocess
    import sys

    from PIL import Image

    from tests.stages.test_serve_openapi import valid

    info = httpx.get(server.url + "/v1/model").json()
    assert info["task"]["name"] == "ocr_det" and info["accepts_images"] is True
    post = httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/predict"]["post"]
    request = post["requestBody"]["content"]["application/json"]["schema"]
    answer = post["responses"]["200"]["content"]["application/json"]["schema"]
    _, test, _ = export
    body = {"images": [_png(im) for im in test.images[:2]]}
    assert valid(request, body)
    r = httpx.post(server.url + "/v1/predict", json=body, timeout=60)
    assert r.status_code == 200 and valid(answer, r.json()), r.text
    assert not valid(answer, {"boxes": [[{"points": [[0, 0]], "score": 0.9}]]})  # 4 points a box
    # the package README's Python example for pages runs as written (port substituted)
    readme = (package / "README.md").read_text(encoding="utf-8").replace("127.0.0.1:8000",
                                                                          server.url.split("//", 1)[1])
    v1 = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "picture.png" in b)
    Image.fromarray(test.images[0]).save(tmp_path / "picture.png")
    proc = subprocess.run([sys.executable, "-c", v1], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "'points'" in proc.stdout, proc.stderr[-1000:]
    assert "\"boxes\"" in readme and "one list of text boxes per page" in readme
