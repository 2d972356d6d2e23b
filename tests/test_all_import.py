"""`pipe all` from an `import:` section (examples/ppocr_rec.yaml): the real PP-OCRv4 recognizer imported in
place of train and export, packaged and reported; cached on a second run, rebuilt by --force import; training
flags refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline import artifacts, pretrained
from pipeline.cli import main

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "ppocr_rec.yaml"
SMALL = ["--set", "data.ocr_lines=120"]


@pytest.mark.slow
def test_pipe_all_imports_packages_and_reports(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["all", "--config", str(CONFIG), "--run", str(run), *SMALL]) == 0
    said = capsys.readouterr().out
    assert "[1/2] export (pipe import pretrained:ch_PP-OCRv4_rec_infer)" in said and "[2/2] package" in said
    assert not (run / "train").exists()
    exp = artifacts.verify(run / "export", ("export",)).manifest
    src = exp["source"]
    assert src["kind"] == "import" and src["train"] is None
    assert src["pretrained"] == {"name": "pretrained:ch_PP-OCRv4_rec_infer", "wheel": pretrained.WHEEL,
                                 "wheel_sha256": pretrained.WHEEL_SHA256}
    assert {Path(f).name for f in src["files"]} == {"inference.pdmodel", "inference.pdiparams", pretrained.KEYS}
    assert exp["interface"]["model"] == "ch_PP-OCRv4_rec_infer"
    pkg = artifacts.verify(run / "package", ("package",))
    spec = yaml.safe_load((run / "package" / "serving.yaml").read_text(encoding="utf-8"))
    assert spec["name"] == "ch_PP-OCRv4_rec_infer" and spec["task"]["name"] == "ocr_rec"
    # release.engine openvino (the example's): no compress stage measured engines, so the export's legacy
    # program, as PaddleOCR shipped it, on OpenVINO
    assert (pkg.manifest["engine"], pkg.manifest["format"]) == ("openvino", "legacy")
    assert [a.stage for a, _ in artifacts.lineage(pkg, check=True)] == ["package", "export"]
    report = (run / "report.md").read_text(encoding="utf-8")
    assert "Task `ocr_rec`" in report and "No train stage in this run" in report
    record = json.loads((run / "pipeline.json").read_text())
    assert set(record["stages"]) == {"export", "package"}

    assert main(["all", "--config", str(CONFIG), "--run", str(run), *SMALL]) == 0
    assert "cached: export, package" in capsys.readouterr().out
    assert main(["all", "--config", str(CONFIG), "--run", str(run), *SMALL, "--force", "import"]) == 0
    out = capsys.readouterr().out
    assert "ran: export" in out and "package" in out.split("ran:")[1].split("cached:")[0]


def test_training_flags_are_refused_for_an_import_chain(tmp_path, capsys):
    code = main(["all", "--config", str(CONFIG), "--run", str(tmp_path / "run"), *SMALL, "--resume", "auto"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "import.source" in err and "--resume" in err, err
    assert not (tmp_path / "run" / "export").exists()
