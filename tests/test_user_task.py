"""A user's own task (`model.task: package.module:Task`, examples/counting) through every stage: trained on its
loss and monitored metric (lower is better), exported and compressed judged by it, packaged, served with its
answer on /v1 and the raw output on /v2; and a task that breaks the contract is refused in one line."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline import config as config_mod, data, tasks
from pipeline.errors import InputError
from tests.conftest import REPO
from tests.serving_helpers import start_server

CONFIG = str(REPO / "examples" / "counting" / "counting.yaml")
SPEC = "examples.counting.task:Counting"


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture(scope="module")
def counting_run(tmp_path_factory):
    from pipeline.cli import main

    run = tmp_path_factory.mktemp("counting") / "run"
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["all", "--config", CONFIG, "--set", "compress.latency_runs=10", "--set",
                     "compress.throughput_runs=3", "--run", str(run)])
    assert code == 0, buf.getvalue()[-3000:]
    return run, buf.getvalue()


@pytest.mark.slow
def test_every_stage_uses_the_users_task(counting_run):
    run, out = counting_run
    train = _manifest(run / "train")
    assert train["interface"]["task"] == {"name": "counting", "spec": SPEC, "settings": {}}
    assert [o.get("role", "") for o in _manifest(run / "export")["interface"]["outputs"]] == [""]  # no logits
    m = train["metrics"]
    # 8 epochs measured: test mae 0.32, 84% of counts exact; chance (always 2.5) is mae 1.5
    assert m["test_mae"] < 0.6 and m["test_exact"] > 0.6
    header, *rows = (run / "train" / "metrics.csv").read_text().splitlines()
    assert {"val_mae", "val_exact"} <= set(header.split(",")) and "val_acc" not in header
    maes = [float(r.split(",")[header.split(",").index("val_mae")]) for r in rows]
    assert min(maes) == pytest.approx(m["val_mae"], rel=1e-6)  # the kept model is the lowest-mae epoch
    exp = _manifest(run / "export")["metrics"]
    assert exp["test_mae"] == pytest.approx(m["test_mae"], abs=1e-4)
    comp = _manifest(run / "compress")["metrics"]
    assert comp["task"] == "counting" and comp["metric"] == "mae"
    v = comp["variants"]["int8-onnx"]
    assert v["top1_agreement"] is None and set(v["metrics"]) == {"mae", "exact"}
    assert v["accuracy"] == v["metrics"]["mae"]
    # the drop is the rise in error, in points (x 100): positive when int8 is worse
    best = comp["variants"][comp["best_int8"]]
    assert comp["int8_drop_points"] == pytest.approx((best["accuracy"] - comp["variants"]["fp32"]["accuracy"]) * 100)
    assert (run / "package" / "serving.yaml").is_file()


@pytest.mark.slow
def test_served_answer_is_the_tasks_and_v2_the_raw_output(counting_run):
    run, _ = counting_run
    cfg = config_mod.from_dict(_manifest(run / "train")["config"])
    ds = data.load(cfg.data)
    pos = np.arange(8)
    srv = start_server(run / "package")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/predict", json={"inputs": ds.test.feeds(pos, ds.preprocessing)["x"].tolist()})
            assert r.status_code == 200, r.text
            got = r.json()
            assert set(got) >= {"counts", "rounded"} and len(got["counts"]) == 8
            feeds = ds.test.feeds(pos, ds.preprocessing)["x"]
            body = {"inputs": [{"name": "x", "shape": list(feeds.shape), "datatype": "FP32",
                                "data": feeds.ravel().tolist()}]}
            r2 = c.post(f"/v2/models/{_model_name(run)}/infer", json=body)
            assert r2.status_code == 200, r2.text
            outs = {o["name"]: o for o in r2.json()["outputs"]}
            # /v2 names outputs as the model does (Triton's names too); the program's name is the engines'
            program = {o["name"]: o.get("program_name") for o in _manifest(run / "export")["interface"]["outputs"]}
            assert list(outs) == ["count"] and program == {"count": "fetch_name_0"}
            assert outs["count"]["shape"] == [8, 1]
            raw = np.asarray(outs["count"]["data"], np.float64)
            assert np.allclose(np.round(raw, 4), got["counts"], atol=1e-4)
            truth = ds.test.y[ds.test.idx[pos]]
            assert np.abs(np.asarray(got["counts"]) - truth).mean() < 1.0
    finally:
        assert srv.stop() == 0


def _model_name(run: Path) -> str:
    import yaml

    doc = yaml.safe_load((run / "package" / "serving.yaml").read_text())
    return str(doc.get("model_name") or doc.get("name") or "model")


class _NoLoss:
    name, metrics, monitor, maximize = "broken", ("err",), "err", False

    def targets(self, y, feeds, info):
        return y

    def metrics_of(self, outputs, y, info):
        return {}

    def answer(self, outputs, info, sizes=None):
        return {}


class _BadMonitor(_NoLoss):
    monitor = "acc"

    def loss(self, F, outputs, targets, info):
        return None


def test_a_task_missing_part_of_the_contract_is_refused(monkeypatch):
    mod = type(sys)("user_tasks_for_test")
    mod.NoLoss, mod.BadMonitor = _NoLoss, _BadMonitor
    monkeypatch.setitem(sys.modules, "user_tasks_for_test", mod)
    with pytest.raises(InputError, match=r"model.task 'user_tasks_for_test:NoLoss': a task needs loss "):
        tasks.get("user_tasks_for_test:NoLoss")
    with pytest.raises(InputError, match=r"monitor 'acc' is not one of its metrics err"):
        tasks.get("user_tasks_for_test:BadMonitor")
    with pytest.raises(InputError, match=r"model.task user_tasks_for_test:Nope: cannot import"):
        tasks.get("user_tasks_for_test:Nope")
    with pytest.raises(InputError, match=r"expected classification, detection, ocr_rec, ocr_det, ocr_cls or package.module:Task"):
        tasks.get("segmentation")


@pytest.mark.slow
def test_release_gate_on_a_lower_is_better_metric(counting_run, tmp_path, capsys):
    import shutil

    from pipeline.cli import main

    run = tmp_path / "run"
    shutil.copytree(counting_run[0], run)
    code = main(["all", "--config", CONFIG, "--set", "compress.latency_runs=10", "--set", "compress.throughput_runs=3",
                 "--set", "release.min_accuracy=0.01", "--run", str(run)])
    err = capsys.readouterr().err
    assert code == 4
    line = err.strip().splitlines()[-1]
    assert "release.min_accuracy wants at most 0.01 (task counting's monitored metric)" in line
    assert line.startswith("pipe all: release gate: packaged ") and " test mae 0." in line
    code = main(["all", "--config", CONFIG, "--set", "compress.latency_runs=10", "--set", "compress.throughput_runs=3",
                 "--set", "release.min_accuracy=0.9", "--run", str(run)])
    assert code == 0, capsys.readouterr().err[-2000:]  # mae 0.3 is at most 0.9
