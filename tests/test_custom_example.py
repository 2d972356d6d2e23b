"""examples/custom: a user's own model and dataset as `module:factory`, trained through the real `pipe` script."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from pipeline import artifacts, config

YAML = REPO / "examples" / "custom" / "custom.yaml"
COMMAND = "pipe train --config examples/custom/custom.yaml --run runs/custom"
# Measured: 2 epochs reach test_acc 1.0 on the 60 test images (3 classes, chance 0.33).
MIN_TEST_ACC = 0.9


def _pipe() -> Path:
    """The installed console script: its sys.path[0] is its own dir, not the cwd, as for a user."""
    script = Path(sys.executable).parent / "pipe"
    assert script.is_file(), f"{script} missing: install the package (make venv)"
    return script


def _header_command() -> list[str]:
    lines = [ln.lstrip("# ").strip() for ln in YAML.read_text().splitlines() if ln.startswith("#")]
    found = [ln for ln in lines if ln.startswith("pipe ")]
    assert found == [COMMAND]
    return shlex.split(found[0])


def test_yaml_names_the_example_factories():
    cfg = config.load(YAML)
    assert cfg.data.source == "examples.custom.data:load"
    assert cfg.model.name == "examples.custom.model:build"


def test_dataset_factory_is_deterministic(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from examples.custom import data as custom_data

    cfg = config.load(YAML).data
    a, b = custom_data.load(cfg), custom_data.load(cfg)
    assert a["labels"] == ["red", "green", "blue"]
    for split, n in (("train", 240), ("val", 60), ("test", 60)):
        x, y = a[split]
        assert x.shape == (n, 3, 16, 16) and x.dtype == np.uint8
        assert y.dtype == np.int64 and np.bincount(y).tolist() == [n // 3] * 3
        np.testing.assert_array_equal(x, b[split][0])
        np.testing.assert_array_equal(y, b[split][1])
    assert not np.array_equal(a["train"][0][:60], a["test"][0])


@pytest.mark.slow
def test_custom_example_trains_end_to_end(tmp_path):
    argv = _header_command()
    run = tmp_path / "custom"
    argv[argv.index("--run") + 1] = str(run)
    proc = subprocess.run([str(_pipe()), *argv[1:], "--epochs", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    art = artifacts.verify(run / "train", ("train",))
    assert set(art.manifest["files"]) == {"model.safetensors", "metrics.csv", "steps.csv", "curves.png"}
    m = art.manifest
    assert m["config"]["data"]["source"] == "examples.custom.data:load"
    assert m["config"]["model"]["name"] == "examples.custom.model:build"
    assert m["config"]["train"]["epochs"] == 2
    assert m["interface"]["inputs"][0]["shape"] == [-1, 3, 16, 16]
    assert m["interface"]["labels"] == ["red", "green", "blue"]
    assert m["metrics"]["epochs_run"] == 2
    assert m["metrics"]["samples"] == {"train": 240, "val": 60, "test": 60}
    assert m["metrics"]["test_acc"] >= MIN_TEST_ACC, m["metrics"]
    assert (run / "checkpoints" / "last").is_file()
    assert json.loads((run / "train" / "manifest.json").read_text()) == m


def test_factories_resolve_from_the_working_directory(tmp_path):
    """From another directory the example modules are not importable: one line, exit 2, nothing written."""
    proc = subprocess.run([str(_pipe()), "train", "--config", str(YAML), "--run", str(tmp_path / "run")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["pipe train: error: --data examples.custom.data:load: cannot import (No module named 'examples')"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape", [(3, 16, 16), (1, 8, 8)])
def test_model_factory_maps_a_batch_to_logits(shape, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from pipeline.nets import models

    from pipeline.runtime import import_paddle

    paddle = import_paddle()
    net = models.build("examples.custom.model:build", 3, shape)
    assert isinstance(net, paddle.nn.Layer)
    out = net(paddle.zeros([5, *shape], dtype="float32"))
    assert list(out.shape) == [5, 3]
