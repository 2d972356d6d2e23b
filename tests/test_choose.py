"""pipeline/choose.py's reason names the batch the throughput speeds were measured at: each variant's
`throughput_batch` (ocr_det's compress times 4 pages), 32 for a manifest without the field."""

from __future__ import annotations

import pytest

from pipeline import choose, fidelity


def _variants(**extra) -> dict[str, dict]:
    base = {"engine": "paddle_inference", "supported": True, "shippable": True, "metric": "hmean", **extra}
    return {"fp32": {**base, "precision": "fp32", "accuracy": 1.0, "speedup_bs1": 1.0, "speedup_batch": 1.0},
            "int8-paddle": {**base, "precision": "int8", "accuracy": 0.998, "speedup_bs1": 1.8,
                            "speedup_batch": 2.2}}


@pytest.mark.parametrize("optimize", choose.OPTIMIZE)
def test_the_reason_says_the_variants_throughput_batch(optimize):
    got = choose.pick(_variants(throughput_batch=4), ref_accuracy=1.0, ref_name="fp32", max_drop=1.0,
                      optimize=optimize)
    assert got.variant == "int8-paddle"
    assert "2.20x at batch 4" in got.why and "batch 32" not in got.why, got.why
    if optimize != "latency":
        assert f"({choose.criterion(optimize, 4)})" in got.why and "batch 4" in choose.criterion(optimize, 4)


def test_a_manifest_without_throughput_batch_reads_as_32():
    v = _variants()
    assert choose.throughput_batch(v) == 32 and choose.throughput_batch({}) == 32
    assert choose.throughput_batch(_variants(throughput_batch=4)) == 4
    got = choose.pick(v, ref_accuracy=1.0, ref_name="fp32", max_drop=1.0)
    assert "2.20x at batch 32" in got.why and "batch 4" not in got.why, got.why
    assert choose.criterion("throughput") == "items/s at batch 32"


def test_speed_note_says_the_batch_it_is_given():
    v = {"latency_ms_p50_bs1": 5.0, "items_per_s_batch": 40.0}
    base = {"latency_ms_p50_bs1": 10.0, "items_per_s_batch": 10.0}
    assert fidelity.speed_fields("x", v, base, 4)["note"] == ("2.00x faster than fp32 at batch 1; 4.00x faster "
                                                               "than fp32 at batch 4")
    assert fidelity.speed_fields("x", v, base)["note"].endswith("4.00x faster than fp32 at batch 32")
