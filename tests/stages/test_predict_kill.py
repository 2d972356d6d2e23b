"""A real `pipe predict` process SIGKILLed at random moments while it writes, then run again until it finishes:
every item is in predictions.jsonl exactly once, every line whole JSON, and no predictor process outlives the
job it belonged to."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.predict import output
from tests.serving_helpers import REPO
from tests.stages.test_predict import _images, package  # noqa: F401 (the module's package fixture)

pytestmark = pytest.mark.slow(reason="four runs, each starting a predictor process")


def _predictors_of(package: Path) -> list[int]:
    """Pids of predictor processes serving this package (their command line names it)."""
    found = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmd.read_bytes()
        except OSError:
            continue
        if b"pipeline.serving.predictor" in raw and str(package).encode() in raw:
            found.append(int(cmd.parent.name))
    return found


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_sigkill_at_random_moments_then_resume_gives_each_item_once(package, tmp_path):  # noqa: F811
    paths = _images(tmp_path / "in", n=300)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pipeline.cli", "predict", str(package), str(tmp_path / "in"), "--out", str(out),
           "--workers", "1", "--batch", "2"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rng = random.Random(47)
    kills = 0
    for _ in range(3):
        start = _lines(out / output.PREDICTIONS)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 180
        while _lines(out / output.PREDICTIONS) <= start and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere mid-run: between writes, or in one
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.wait(30)
        proc.stderr.close()
        gone = time.monotonic() + 20  # its predictor reads EOF on its stdin and exits
        while _predictors_of(package) and time.monotonic() < gone:
            time.sleep(0.2)
        assert _predictors_of(package) == []
    assert kills >= 2, "the runs ended before they could be killed: make the job longer"
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    raw = (out / output.PREDICTIONS).read_bytes()
    assert raw.endswith(b"\n")
    rows = [json.loads(line) for line in raw.splitlines()]  # every line whole JSON
    assert sorted(row["source"] for row in rows) == sorted(map(str, paths))  # each item exactly once
    s = json.loads((out / output.SUMMARY).read_text())
    assert s["done"] + s["skipped"] == len(paths) and s["failed"] == 0 and s["skipped"] > 0
    assert _predictors_of(package) == []
