"""pipe compress on the real PP-OCRv4 detector (the session's import: 40 train, 6 val, 6 test generated pages):
OpenVINO's int8 from NNCF with its default preset (the task's `nncf_model_type` None: a CNN) and the per-layer
search, calibrated on the 40 train pages (the task's calib_max: at most 40), keeps hmean within a point of fp32;
throughput is timed at the task's batch of 4 pages (its package's max_batch), which every variant's record and
choose.py's reason say; `pipe package` then ships a measured variant and its reference check passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import artifacts, compress_owned
from pipeline.cli import main
from pipeline.config import CompressConfig
from pipeline.tasks import ocr_det, ocr_rec


@pytest.fixture()
def compressed(ppocr_det_int8) -> Path:
    """The session's compress of the detector import (tests/conftest.py: --int8 --backend openvino, brief timing)."""
    return ppocr_det_int8


@pytest.mark.slow
def test_openvino_int8_holds_hmean_within_a_point_timed_at_four_pages(compressed):
    m = artifacts.verify(compressed, ("compress",)).manifest["metrics"]
    v = m["variants"]
    assert m["task"] == "ocr_det" and m["metric"] == "hmean" and m["test_samples"] == 6
    ov8 = v["openvino-int8"]
    assert ov8["supported"] and ov8["shippable"] and ov8["status"] == "ok", ov8["status"]
    assert (v["fp32"]["accuracy"] - ov8["accuracy"]) * 100 <= 1.0
    assert m["best_int8"] == "openvino-int8" and m["int8_drop_points"] <= m["max_drop"]
    assert m["openvino_search"]["model_type"] is None  # NNCF's default preset, not the recognizer's transformer
    assert m["timing"]["batch"] == ocr_det.timing_batch == 4 and m["timing"]["shape"][0] == 4
    assert m["calibration"]["lines"] == m["calibration"]["max"] == 40 and m["calibration"]["unit"] == "pages"
    assert not m["calibration"]["thin"]  # 40 pages is the task's default, not thin
    assert "at batch 4" in ov8["note"] and "batch 32" not in ov8["note"]
    for name, x in v.items():  # the batch items_per_s_batch / speedup_batch were timed at, read by choose.py
        assert x["throughput_batch"] == 4, name
        assert "batch 32" not in (x["note"] or ""), (name, x["note"])
    assert not any(k.startswith(("int8-onnx", "int8-paddle")) for k in v)  # --backend openvino: its route only


@pytest.mark.slow
def test_package_ships_a_measured_variant_and_its_reference_check_passes(compressed, tmp_path):
    v = artifacts.verify(compressed, ("compress",)).manifest["metrics"]["variants"]
    assert main(["package", str(compressed), "--out", str(tmp_path / "package")]) == 0
    pkg = artifacts.verify(tmp_path / "package", ("package",)).manifest
    m = pkg["metrics"]
    assert v[m["variant"]]["supported"] and v[m["variant"]]["shippable"]
    assert m["reference"]["agreement"] >= 0.99
    why = pkg["chosen"]["why"]  # choose.py's reason: the speeds' batch is the task's 4 pages
    assert "at batch 4" in why and "batch 32" not in why, why


def test_calibration_takes_at_most_the_tasks_calib_max(capsys):
    """By default ocr_det calibrates on at most 40 train pages (the count its int8 was measured at)
    (a seeded draw), not thin at 40; an explicit count is the user's; a task without calib_max (ocr_rec) keeps
    every compress's default of up to 10 x calib_batch_size."""
    rows = compress_owned._calibration_rows(100, CompressConfig(), ocr_det, "pages")
    assert len(rows) == ocr_det.calib_max == 40 and len(set(rows)) == 40 and list(rows) == sorted(rows)
    assert "warning" not in capsys.readouterr().err
    assert len(compress_owned._calibration_rows(40, CompressConfig(), ocr_det, "pages")) == 40
    few = compress_owned._calibration_rows(12, CompressConfig(), ocr_det, "pages")
    assert len(few) == 12 and "fewer than 40 may set poor ranges" in capsys.readouterr().err
    asked = CompressConfig(calib_batches=2, calib_batch_size=30)
    assert len(compress_owned._calibration_rows(100, asked, ocr_det, "pages")) == 60
    assert not hasattr(ocr_rec, "calib_max")
    assert len(compress_owned._calibration_rows(1000, CompressConfig(), ocr_rec, "lines")) == 10 * 32
