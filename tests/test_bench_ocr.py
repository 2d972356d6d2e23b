"""The OCR benchmark's served rows (pipeline/bench/ocr.py `served`): the import packaged on OpenVINO and run by
a real `pipe serve`, loaded from 1 and 8 clients with one line image per request; every request answered,
and the texts it served are the export's own (a direct Paddle run, each line at its own width bucket)."""

from __future__ import annotations

import pytest

from pipeline import artifacts, config as config_mod, engines, iospec
from pipeline.bench import ocr
from pipeline.engines import paddle as paddle_engine
from pipeline.tasks import ocr_rec


pytestmark = pytest.mark.slow(reason="benchmarks the real PP-OCRv4 recognizer's package")


def test_served_loads_the_openvino_package_and_reads_what_the_export_reads(ppocr_rec_export, tmp_path):
    got = ocr.served(ppocr_rec_export, tmp_path)
    m = artifacts.verify(ppocr_rec_export, ("export",)).manifest
    info = ocr_rec.info_of(m["interface"])
    test = ocr_rec.load_data(config_mod.from_dict(m["config"]).data, info).test
    assert got["lines"] == len(test) and got["threads"] >= 1
    assert (got["variant"], got["engine"]) == ("export-legacy", "openvino")  # no compress artifact: OpenVINO fp32
    assert set(got["clients"]) == {1, ocr._CLIENTS}
    for n, r in got["clients"].items():
        assert r["errors"] == 0 and r["done"] == (len(test) // n) * n and r["rate"] > 0, (n, r)
        assert 0 < r["p50"] <= r["p99"]
    eng = paddle_engine.load([ppocr_rec_export / "model.json", ppocr_rec_export / "model.pdiparams"], threads=1)
    run = engines.bind(eng, iospec.IO.from_interface(m["interface"]), "export")
    want = ocr_rec.score(ocr_rec.recognise(test.images, info, run, 1), test, info)["acc"]
    assert got["acc"] == want
    assert not list(tmp_path.glob("**/*.pdiparams.info"))
