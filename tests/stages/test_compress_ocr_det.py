"""pipe compress on the real PP-OCRv4 detector (the session's import: 40 train, 6 val, 6 test generated pages):
OpenVINO's int8 from NNCF with its default preset (the task's `nncf_model_type` None: a CNN) and the per-layer
search, calibrated on all 40 train pages, keeps hmean within a point of fp32; throughput is timed at the task's
batch of 4 pages (its package's max_batch); `pipe package` then ships a measured variant and its reference check
passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import artifacts
from pipeline.cli import main
from pipeline.tasks import ocr_det

QUICK = ["--set", "compress.latency_runs=3", "--set", "compress.throughput_runs=2"]


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, ppocr_det_export) -> Path:
    out = tmp_path_factory.mktemp("ocr-det-int8") / "compress"
    assert main(["compress", str(ppocr_det_export), "--int8", "--backend", "openvino", "--out", str(out), *QUICK]) == 0
    return out


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
    assert m["calibration"]["lines"] == 40 and m["calibration"]["unit"] == "pages"
    assert "at batch 4" in ov8["note"] and "batch 32" not in ov8["note"]
    assert not any(k.startswith(("int8-onnx", "int8-paddle")) for k in v)  # --backend openvino: its route only


def test_package_ships_a_measured_variant_and_its_reference_check_passes(compressed, tmp_path):
    v = artifacts.verify(compressed, ("compress",)).manifest["metrics"]["variants"]
    assert main(["package", str(compressed), "--out", str(tmp_path / "package")]) == 0
    m = artifacts.verify(tmp_path / "package", ("package",)).manifest["metrics"]
    assert v[m["variant"]]["supported"] and v[m["variant"]]["shippable"]
    assert m["reference"]["agreement"] >= 0.99
