"""pipe package and pipe serve on the real text-line orientation classifier (ch_ppocr_mobile_v2 cls, the session's
`ppocr_cls_export`): one input shape for every line, a reference set of real lines; /v1 reads line images of any
width, upright and turned, and answers each line's label as a direct Paddle Inference run of the export does;
the OpenAPI schema describes the answer."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import artifacts, config as config_mod, engines, iospec, ocr_system
from pipeline.cli import main
from pipeline.engines import paddle as paddle_engine
from pipeline.tasks import ocr_cls
from tests.serving_helpers import png_b64 as _png, start_server


pytestmark = pytest.mark.slow(reason="serves the real PP-OCRv4 text-line classifier")


@pytest.fixture(scope="module")
def package(ppocr_cls_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ocr-cls-package") / "package"
    assert main(["package", str(ppocr_cls_export), "--out", str(out), "--engine", "paddle"]) == 0  # as compared
    return out


@pytest.fixture(scope="module")
def server(package):
    srv = start_server(package)
    yield srv
    assert srv.stop() == 0


def test_served_labels_are_a_direct_runs_and_the_schema_holds(server, package, ppocr_cls_export):
    from tests.stages.test_serve_openapi import valid

    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    assert spec["task"]["name"] == "ocr_cls" and spec["labels"] == ["0", "180"]
    assert [t["shape"] for t in spec["inputs"]] == [[-1, 3, -1, -1]] and spec["batching"]["max_batch_size"] == 32
    m = artifacts.verify(package, ("package",)).manifest["metrics"]["reference"]
    assert m["samples"] == 16 and m["top1_agreement"] is None and m["task_metrics"]["fp32"]["acc"] >= 0.9
    art = artifacts.verify(ppocr_cls_export, ("export",))
    iface = art.manifest["interface"]
    info = ocr_cls.info_of(iface)
    test = ocr_cls.load_data(config_mod.from_dict(art.manifest["config"]).data, info).test
    images = test.images[:12]
    eng = paddle_engine.load([art.file("model.json"), art.file("model.pdiparams")], threads=1)
    want = ocr_system.answer_lines(ocr_cls, ocr_system.Model(info, engines.bind(
        eng, iospec.IO.from_interface(iface), "export"), 1), images)
    assert {t for t in test.texts[:12]} == {"0", "180"}  # both orientations among the lines sent
    r = httpx.post(server.url + "/v1/predict", json={"images": [_png(im) for im in images]}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()["lines"]
    assert [g["label"] for g in got] == [a[0] for a in want]
    np.testing.assert_allclose([g["score"] for g in got], [a[1] for a in want], atol=1e-5)
    assert np.mean([g["label"] == t for g, t in zip(got, test.texts[:12])]) >= 0.9
    answer = httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/predict"]["post"]["responses"]["200"][
        "content"]["application/json"]["schema"]
    assert valid(answer, r.json()) and not valid(answer, {"lines": [{"label": "90", "score": 0.5}]})
