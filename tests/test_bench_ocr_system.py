"""The OCR system benchmark (pipeline/bench/ocr_system.py `measure`) on the session's det, rec and cls imports,
3 pages: pipe's system on Paddle Inference and on onnxruntime, at RapidOCR's det limit and at its own, each
reading the pages as the other engine does, timed page by page; RapidOCR's rows where its venv exists (`make
bench` makes it; `make test` does not)."""

from __future__ import annotations

import pytest

from pipeline.bench import ocr_system as bench
from pipeline.tasks import ocr_det


@pytest.mark.slow
def test_measure_runs_every_engine_and_limit_on_the_same_pages(ppocr_det_export, ppocr_rec_export, ppocr_cls_export,
                                                              tmp_path):
    for role, src in (("det", ppocr_det_export), ("rec", ppocr_rec_export), ("cls", ppocr_cls_export)):
        (tmp_path / role).symlink_to(src, target_is_directory=True)
    got = bench.measure(tmp_path, limit=3)
    assert got["pages"] == 3 and got["lines"] >= 10
    assert set(got["systems"]) == {f"{e}, det limit {lim}" for e in ("paddle_inference", "onnxruntime")
                                   for lim in ("736 'min'", "960 'max'")}
    for name, v in got["systems"].items():
        assert v["lines"] == got["lines"] and v["hmean"] >= 0.95 and v["e2e_acc"] >= 0.75, (name, v)
        assert v["pages_s"] > 0 and 0 < v["p50_s"] <= v["p99_s"], (name, v)
        # pipe's system cuts its lines out of boxes grown by the det import's system_unclip_ratio
        assert v["det_settings"]["unclip_ratio"] == ocr_det.settings["system_unclip_ratio"], (name, v)
    # the engines run the same programs: the same lines read at each limit
    for lim in ("736 'min'", "960 'max'"):
        a, b = (got["systems"][f"{e}, det limit {lim}"] for e in ("paddle_inference", "onnxruntime"))
        assert abs(a["e2e_acc"] - b["e2e_acc"]) <= 1 / got["lines"] + 1e-9, (a, b)
    if bench._PEER.is_file():
        assert got["rapidocr"]["lines"] == got["lines"] and got["rapidocr"]["pages_s"] > 0
    else:
        assert "make bench creates it" in got["rapidocr_error"]


def test_half_normalised_feeds_what_rapidocr_feeds():
    """RapidOCR's det normalisation, (x / 255 - 0.5) / 0.5 of the same resized BGR page, from ocr_det's
    ImageNet-normalised tensor."""
    import cv2
    import numpy as np

    from pipeline.tasks.ocr_det import pages

    page = np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)
    x, _ = pages.prepare(page, 960, "max")
    got = bench._half_normalised(lambda feeds: feeds)({"x": x[None]})["x"][0]
    bgr = cv2.resize(np.ascontiguousarray(page[:, :, ::-1]), (x.shape[2], x.shape[1])).astype(np.float32)
    np.testing.assert_allclose(got, ((bgr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1), atol=1e-5)


@pytest.mark.slow
def test_ablation_scores_every_det_setting_on_the_same_pages(ppocr_det_export, ppocr_rec_export, ppocr_cls_export,
                                                            tmp_path):
    for role, src in (("det", ppocr_det_export), ("rec", ppocr_rec_export), ("cls", ppocr_cls_export)):
        (tmp_path / role).symlink_to(src, target_is_directory=True)
    got = bench.ablation(tmp_path, limit=2)
    assert list(got) == list(bench.ABLATION)
    lines = {v["lines"] for v in got.values()}
    assert len(lines) == 1 and lines.pop() >= 5
    for name, v in got.items():
        assert v["hmean"] >= 0.9 and 0.0 <= v["e2e_acc"] <= 1.0, (name, v)
