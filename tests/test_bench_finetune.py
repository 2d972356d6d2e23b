"""The fine-tuning benchmark rows (pipeline/bench/finetune.py) run real trainings and report what they read."""

from __future__ import annotations

import re

import pytest

from pipeline.bench import finetune


pytestmark = pytest.mark.slow(reason="runs real trainings from scratch and from an init, side by side")


def test_finetune_rows_compare_init_and_scratch_side_by_side():
    rows = finetune.rows()
    assert [r[0].split(":")[0] for r in rows] == ["fine-tuning"] * 4
    assert "loaded 15 tensors, 2 head tensors fresh" in rows[0][0]  # digits_cnn: all but the 10-class head
    for measurement, result, goal, status in rows:
        pairs = re.fullmatch(r"(\S+) / (\S+)", result)
        assert pairs, result
        if status:
            assert status in ("met", "**missed**")
    init, scratch = (float(v) for v in rows[2][1].split(" / "))
    assert 0.5 < scratch < 1.0 and 0.5 < init <= 1.0  # digits 0-4 weights help the first epoch or not: read, not assumed
