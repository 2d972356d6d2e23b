"""The detection benchmark rows (pipeline/bench/detection.py), quick: one real train (2 epochs of 200 images),
export, compress on every engine, package --engine auto and serve of centernet_tiny, and the rows read off
them: every row there, its numbers parsed and in range, the auto pick a variant compress measured and the one
the package shipped, served images/s > 0 without errors."""

from __future__ import annotations

import re

import pytest

from pipeline.bench import detection

pytestmark = pytest.mark.slow(reason="trains, compresses, packages and serves a detection model")
NAME = "centernet_tiny shapes (`examples/detection.yaml`, quick: 2 epochs of 200 images)"
VARIANTS = {"fp32", "bf16", "int8-paddle", "onnx-fp32", "int8-onnx", "openvino-fp32", "openvino-int8"}


@pytest.fixture(scope="module")
def rows() -> dict[str, tuple[str, str, str]]:
    got = detection.rows(quick=True)
    failed = [r for r in got if r[3] == "**failed**"]
    assert not failed, failed
    by = {r[0]: r[1:] for r in got}
    assert len(by) == len(got), "row names repeat"
    return by


def _one(rows: dict, start: str) -> tuple[str, str, str]:
    hits = [k for k in rows if k.startswith(start)]
    assert len(hits) == 1, (start, hits)
    return rows[hits[0]]


def test_train_rows_read_the_manifest(rows):
    result, goal, status = _one(rows, f"train {NAME}: test mAP@.5 / mAP@[.5:.95] (2 epochs of 200 images")
    m = re.match(r"(\d\.\d{3}) / (\d\.\d{3}) \(val (\d\.\d{3}) / (\d\.\d{3}); 30 test images\)$", result)
    assert m, result
    assert all(0.0 <= float(v) <= 1.0 for v in m.groups())
    assert float(m[2]) <= float(m[1])  # mAP@[.5:.95] averages stricter IoUs than mAP@.5
    result, _, _ = _one(rows, f"train {NAME}: training samples/s")
    ips, s_step = re.match(r"(\d+) samples/s, (\d+\.\d+) s/step", result).groups()
    assert float(ips) > 0 and float(s_step) > 0 and " s (1-min load average" in result
    for metric in ("mAP@.5", "mAP@[.5:.95]"):
        result, goal, status = _one(rows, f"train {NAME} goal: test {metric} within 5 minutes")
        assert status in ("met", "**missed**") and goal.endswith("within 300 s")
        assert re.search(rf"{re.escape(metric)} (met|missed), time (met|missed)$", result), result
        assert status == "met" or "missed" in result
    assert _one(rows, f"train {NAME}: validation mAP@.5 / mAP@[.5:.95] at the last epoch")[0].startswith("epoch 2 of 2")


def test_compress_rows_every_engine_and_int8_drops(rows):
    base = _one(rows, f"compress {NAME}: Paddle fp32 (oneDNN)")[0]
    assert re.match(r"\d+ items/s bs32, \d+\.\d\d ms p50 bs1$", base), base
    assert not [k for k in rows if "top-1 agreement" in k]  # a detector has no logits: SQNR per head instead
    sqnr = _one(rows, f"compress {NAME}: int8 SQNR vs Paddle fp32 per head")[0]
    assert "heatmap" in sqnr and "size" in sqnr and "offset" in sqnr, sqnr
    drops = {k: v for k, v in rows.items() if k.startswith(f"compress {NAME}: int8 mAP drop vs Paddle fp32, ")}
    engines = {k.split("vs Paddle fp32, ")[1].split(" ")[0] for k in drops}
    assert engines == {"int8-paddle", "int8-onnx", "openvino-int8"}
    for label, (result, _, status) in drops.items():
        if status == "**unsupported**":
            continue
        m = re.match(r"(-?\d+\.\d\d) points mAP@\[\.5:\.95\] \((\d\.\d{4}) -> (\d\.\d{4})\), (-?\d+\.\d\d) points "
                     r"mAP@\.5 \((\d\.\d{4}) -> (\d\.\d{4})\)", result)
        assert m, result
        drop, fp, q = float(m[1]), float(m[2]), float(m[3])
        assert 0 <= fp <= 1 and 0 <= q <= 1 and abs(drop - (fp - q) * 100) < 0.02
    kept = _one(rows, f"compress {NAME}: layers kept fp32 in int8")[0]
    assert "int8-onnx: " in kept and "int8-paddle: " in kept, kept


def test_pick_row_names_the_packaged_variant(rows):
    result, _, status = _one(rows, f"compress {NAME}: `pipe package --engine auto` picks")
    picked = result.split(" ", 1)[0]
    assert picked in VARIANTS, result
    assert f"the package made from run 1 shipped {picked}" in result and status == ""
    result, goal, status = _one(rows, f"compress {NAME} goal: mAP@[.5:.95] drop of the packaged variant ({picked},")
    assert goal == "<= 0.5 point" and status in ("met", "**missed**")
    assert (status == "met") == (float(result.split(" ")[0]) <= 0.5)
    assert _one(rows, f"serve {NAME}: what `pipe package --engine auto` packaged")[0].startswith(f"{picked} on ")


def test_served_rows(rows):
    result, _, _ = _one(rows, f"serve {NAME}: /v1/predict answers on the 30 test images as PNGs")
    m = re.match(r"(\d\.\d{3}) / (\d\.\d{3}) \(compress: (\d\.\d{3}) / (\d\.\d{3})\); (\d+) boxes for (\d+) objects$",
                 result)
    assert m, result
    assert all(0.0 <= float(v) <= 1.0 for v in m.groups()[:4]) and int(m[6]) >= 30  # 1-4 objects per image
    result, _, status = _one(rows, f"serve {NAME}: 16 keep-alive clients x 25 one-PNG requests, images/s")
    rate, p50, p99, errors = re.match(r"(\d+) \((\d+\.\d)/(\d+\.\d)\), (\d+) errors$", result).groups()
    assert float(rate) > 0 and 0 < float(p50) <= float(p99) and errors == "0" and status == ""
    result, _, _ = _one(rows, f"serve {NAME}: p50 latency at 1 client")
    assert float(re.match(r"(\d+\.\d\d) ms$", result)[1]) > 0
