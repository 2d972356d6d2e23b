"""`pipeline.report.write` for tasks other than classification (pipeline/tasks): a tiny detection run
(1 epoch of CenterNet on 60 generated shapes, then export) and a user task (examples/counting: mae, exact).

The detection report plots val_map and val_map50, shows the task's metrics in its tables (as % with 2
decimals, as accuracy is) without a top-1 agreement column, and draws the export's detections on a few test
images (`report-detections.png`, embedded in the HTML); the counting report shows mae with 4 decimals.
The detection run's score_threshold is 0.01 and max_detections 4, so a barely trained model still draws boxes.
"""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import report
from pipeline.cli import main
from tests.conftest import REPO, tree_hash
from tests.test_report import _section, _tables

MAX_DETS = 4


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _pngs(html: str) -> list[bytes]:
    return [base64.b64decode(d, validate=True)
            for d in re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def detection_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("det")
    run = tmp / "run"
    assert main(["train", "--config", str(REPO / "examples/detection.yaml"), "--run", str(run), "--epochs", "1",
                 "--set", "data.shapes_images=60", "--set", f"data.cache_dir={tmp / 'cache'}",
                 "--set", "train.warmup_epochs=0", "--set", "postprocess.score_threshold=0.01",
                 "--set", f"postprocess.max_detections={MAX_DETS}"]) == 0
    assert main(["export", str(run / "train")]) == 0
    return run


@pytest.fixture(scope="module")
def det_reported(detection_run, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("det-report") / "run"
    for s in ("train", "export"):
        shutil.copytree(detection_run / s, run / s)
    before = {s: tree_hash(run / s) for s in ("train", "export")}
    report.write(run)
    assert {s: tree_hash(run / s) for s in ("train", "export")} == before, "the report must not touch the stage dirs"
    return run


@pytest.mark.slow
def test_detection_curves_and_tables_use_the_tasks_metrics(det_reported):
    md = (det_reported / "report.md").read_text(encoding="utf-8")
    assert "Task `detection` (model.task detection): metrics mAP@[.5:.95], mAP@.5" in md
    curves = _section(md, "Training curves")
    assert "*Plot: loss and validation mAP@[.5:.95] and mAP@.5 per epoch" in curves
    tm = _manifest(det_reported / "train")["metrics"]
    assert f"test mAP@[.5:.95] {tm['test_map']:.2%}, test mAP@.5 {tm['test_map50']:.2%}, test loss" in curves
    (table,) = _tables(curves)
    csv_rows = _csv_rows(det_reported / "train" / "metrics.csv")
    assert table[0] == ["epoch", "train_loss", "val_loss", "val_map", "val_map50", "lr"]
    assert [r[3:5] for r in table[1:]] == [[f"{float(r['val_map']):.2%}", f"{float(r['val_map50']):.2%}"]
                                           for r in csv_rows]

    (variants,) = [t for t in _tables(_section(md, "Model variants: mAP@[.5:.95], size")) if t[0][0] == "variant"]
    head, row = variants[0], dict(zip(variants[0], variants[1]))
    assert "top-1 agreement" not in head and "accuracy" not in head
    em = _manifest(det_reported / "export")["metrics"]
    assert (row["variant"], row["mAP@[.5:.95]"], row["mAP@.5"]) == \
        ("fp32 (export)", f"{em['test_map']:.2%}", f"{em['test_map50']:.2%}")
    parity = _section(md, "Parity")
    assert (f"Export test mAP@[.5:.95] {em['test_map']:.2%} (predictor) vs {em['dygraph_test_map']:.2%} "
            "(trained model), mAP@.5") in parity
    assert "top-1 agreement" not in parity and "max|output|" in _tables(parity)[0][0]


@pytest.mark.slow
def test_detection_picture(det_reported, tmp_path):
    """The picture is a file the Markdown links and the HTML embeds (the same bytes); its table lists each
    drawn image's ground truth as the data holds it and the predictions decode gave (score >= the
    interface's threshold, best first, at most max_detections); the PNG has the boxes' colours."""
    from matplotlib.image import imread

    from pipeline import config, data

    md = (det_reported / "report.md").read_text(encoding="utf-8")
    sec = _section(md, "Detections on test images")
    assert f"]({report.DETECTIONS_PNG})" in sec and "score_threshold 0.01" in sec
    png = (det_reported / report.DETECTIONS_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    html = (det_reported / "report.html").read_text(encoding="utf-8")
    pngs = _pngs(html)
    assert len(pngs) == 3 and pngs[2] == png  # curves, variant chart, detections
    assert "<h2>Detections on test images</h2>" in html

    (table,) = _tables(sec)
    assert table[0] == ["test image", "ground truth", "predicted (label score)"]
    m = _manifest(det_reported / "export")
    labels = m["interface"]["labels"]
    ds = data.load(config.from_dict(m["config"]).data)
    pos = [int(r[0]) for r in table[1:]]
    assert len(pos) == min(report._DET_IMAGES, len(ds.test)) and pos[0] == 0 and pos[-1] == len(ds.test) - 1
    drawn = 0
    for p, (_, truth, predicted) in zip(pos, table[1:]):
        y = ds.test.y[ds.test.idx[p]]
        assert truth == ", ".join(labels[int(c)] for c in y[:, 4] if c >= 0)
        dets = [] if predicted == "none" else [d.rsplit(" ", 1) for d in predicted.split(", ")]
        scores = [float(s) for _, s in dets]
        assert len(dets) <= MAX_DETS and all(lab in labels for lab, _ in dets)
        assert scores == sorted(scores, reverse=True) and all(s >= 0.01 for s in scores)
        drawn += len(dets)
    assert drawn > 0, "a threshold of 0.01 keeps some of a 1-epoch model's boxes"

    # The same images with a threshold no score reaches (the manifest edited; export verifies its files):
    # no predictions, so the red of the predicted boxes is gone and the green of the truth stays.
    run = tmp_path / "run"
    shutil.copytree(det_reported, run)
    m["interface"]["task"]["settings"]["score_threshold"] = 1.01
    (run / "export" / "manifest.json").write_text(json.dumps(m))
    report.write(run)
    (none,) = _tables(_section((run / "report.md").read_text(encoding="utf-8"), "Detections on test images"))
    assert [r[0] for r in none[1:]] == [str(p) for p in pos] and {r[2] for r in none[1:]} == {"none"}

    def colours(path: Path) -> tuple[int, int]:
        rgb = (imread(str(path))[..., :3] * 255).round().astype(int)
        near = lambda c: int((np.abs(rgb - c).max(-1) < 40).sum())  # noqa: E731 - antialiased edges
        return near([255, 0, 0]), near([0, 0xD0, 0])

    (red, green), (red0, green0) = colours(det_reported / report.DETECTIONS_PNG), colours(run / report.DETECTIONS_PNG)
    assert red > red0 + 200, f"predicted boxes are drawn in red ({red} red pixels, {red0} without predictions)"
    assert green0 > 500 and green > 200, "ground-truth boxes are drawn in green"


@pytest.mark.slow
def test_detection_picture_missing_says_why(det_reported, tmp_path):
    """An export that no longer verifies: no picture (and an earlier one is removed), the reason instead."""
    run = tmp_path / "run"
    shutil.copytree(det_reported, run)
    (run / "export" / "model.pdiparams").unlink()
    report.write(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    sec = _section(md, "Detections on test images")
    assert "No picture of detections: the export stage is not verified (" in sec and "model.pdiparams" in sec
    assert not (run / report.DETECTIONS_PNG).exists()
    assert len(_pngs((run / "report.html").read_text(encoding="utf-8"))) == 2


def test_user_task_counting_reports_mae_not_as_percent(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # model.task examples.counting.task:Counting imports from the working directory
    run = tmp_path / "run"
    assert main(["train", "--config", "examples/counting/counting.yaml", "--run", str(run), "--epochs", "2"]) == 0
    assert main(["export", str(run / "train")]) == 0
    report.write(run)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "Task `counting` (model.task examples.counting.task:Counting): metrics mae, exact; training and " \
           "compress monitor mae (lower is better)." in md
    tm, em = _manifest(run / "train")["metrics"], _manifest(run / "export")["metrics"]
    curves = _section(md, "Training curves")
    assert f"test mae {tm['test_mae']:.4f}, test exact {tm['test_exact']:.4f}, test loss" in curves
    (table,) = _tables(curves)
    assert table[0][3:5] == ["val_mae", "val_exact"]
    csv_rows = _csv_rows(run / "train" / "metrics.csv")
    assert [r[3] for r in table[1:]] == [f"{float(r['val_mae']):.4f}" for r in csv_rows]
    (variants,) = [t for t in _tables(_section(md, "Model variants: mae, size")) if t[0][0] == "variant"]
    row = dict(zip(variants[0], variants[1]))
    assert (row["mae"], row["exact"]) == (f"{em['test_mae']:.4f}", f"{em['test_exact']:.4f}")
    assert "top-1 agreement" not in variants[0]
    assert not re.search(r"mae [0-9.]+%", md) and "%" not in row["mae"] + "".join(r[3] for r in table[1:])
    assert "Detections on test images" not in md and not (run / report.DETECTIONS_PNG).exists()
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "loss and validation mae and exact per epoch" in html and len(_pngs(html)) == 2
