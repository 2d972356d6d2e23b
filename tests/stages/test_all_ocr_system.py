"""`pipe all` of an OCR system (the `system:` section): each part's config (small generated sets here) runs as its
own chain in RUN/<role>, the three packages are composed into RUN/ocr_system with its end-to-end figures; a rerun
reuses everything; a new drop_score recomposes only the system; a system without a recognizer is refused in one
line before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline import artifacts
from pipeline.cli import main
from pipeline.ocr_system import package as ocr_package


def _configs(tmp: Path, rec: bool = True) -> Path:
    parts = {"det": ("pretrained:ch_PP-OCRv4_det_infer", "ocr_det", {"source": "ocr_pages", "ocr_pages": 40}),
             "cls": ("pretrained:ch_ppocr_mobile_v2_cls_infer", "ocr_cls", {"source": "ocr_lines", "ocr_lines": 120}),
             "rec": ("pretrained:ch_PP-OCRv4_rec_infer", "ocr_rec", {"source": "ocr_lines", "ocr_lines": 120})}
    system = {}
    for role, (source, task, data) in parts.items():
        if role == "rec" and not rec:
            continue
        path = tmp / f"{role}.yaml"
        path.write_text(yaml.safe_dump({"import": {"source": source, "task": task}, "data": data,
                                        "release": {"engine": "onnxruntime"}}))
        system[role] = str(path)
    path = tmp / "system.yaml"
    path.write_text(yaml.safe_dump({"system": system}))
    return path


@pytest.mark.slow
def test_pipe_all_builds_caches_and_recomposes_the_system(ppocr, tmp_path, capsys):
    cfg, run = _configs(tmp_path), tmp_path / "run"
    assert main(["all", "--config", str(cfg), "--run", str(run)]) == 0
    out = capsys.readouterr().out
    system = ocr_package.load(run / ocr_package.STAGE)
    assert set(system.parts) == {"det", "cls", "rec"} and {p.engine for p in system.parts.values()} == {"onnxruntime"}
    for role in ("det", "cls", "rec"):  # each part its own run: import, package, report
        assert (run / role / "report.md").is_file()
        assert system.parts[role].manifest_sha256 == artifacts.verify(run / role / "package", ("package",)).manifest_sha256
    measured = system.doc["measured"]
    assert measured["det_hmean"] >= 0.95 and measured["e2e_acc"] >= 0.6 and measured["lines"] > 0
    assert "ran: det export" in out and "ocr_system" in out
    sha = artifacts.verify(run / ocr_package.STAGE, (ocr_package.STAGE,)).manifest_sha256

    assert main(["all", "--config", str(cfg), "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "ran: nothing" in out and "ocr_system: cached" in out
    assert artifacts.verify(run / ocr_package.STAGE, (ocr_package.STAGE,)).manifest_sha256 == sha

    assert main(["all", "--config", str(cfg), "--run", str(run), "--set", "system.drop_score=0.995"]) == 0
    out = capsys.readouterr().out
    assert "ran: ocr_system" in out and "cached: det export, det package, cls export" in out
    assert ocr_package.load(run / ocr_package.STAGE).drop_score == 0.995


def test_a_system_without_a_recognizer_is_refused_before_anything_runs(tmp_path, capsys):
    cfg, run = _configs(tmp_path, rec=False), tmp_path / "run"
    assert main(["all", "--config", str(cfg), "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "system: an OCR system needs system.det and system.rec" in err and len(err.strip().splitlines()) == 1
    assert not run.exists()


def test_the_example_system_is_int8_where_compress_takes_the_part_and_an_fp32_route_stays():
    """examples/ppocr_system.yaml: every part compressed (OpenVINO's NNCF route, each judged by its own metric: det
    hmean, cls and rec line accuracy); examples/ppocr_system_fp32.yaml: every part without compress."""
    from pipeline import config as config_mod

    repo = Path(__file__).resolve().parents[2]
    for name, int8 in (("ppocr_system.yaml", {"det", "cls", "rec"}), ("ppocr_system_fp32.yaml", set())):
        system = config_mod.load(repo / "examples" / name).system
        parts = {role: config_mod.load(repo / getattr(system, role)) for role in ("det", "cls", "rec")}
        assert {role for role, c in parts.items() if c.compress.int8} == int8, name
        assert {c.import_.task for c in parts.values()} == {"ocr_det", "ocr_cls", "ocr_rec"}
        for role in int8:
            assert parts[role].compress.backend == "openvino" and parts[role].release.engine == "openvino"
            assert parts[role].compress.max_drop == 1.0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_part_whose_int8_misses_its_budget_ships_fp32_said_in_one_line(ppocr, tmp_path, capsys):
    """rec compressed by onnxruntime's plain QDQ int8 only (compress.openvino false): on this recognizer it loses
    tens of points (tests/stages/test_compress_ocr_rec.py), so compress's int8 gate refuses it; pipe all says so in
    one line, ships rec's fp32 import, and still composes the system."""
    cfg, run = _configs(tmp_path), tmp_path / "run"
    rec = yaml.safe_load((tmp_path / "rec.yaml").read_text())
    rec["compress"] = {"int8": True, "backend": "onnxruntime", "openvino": False, "latency_runs": 3,
                       "throughput_runs": 1}
    (tmp_path / "rec.yaml").write_text(yaml.safe_dump(rec))
    system = yaml.safe_load(cfg.read_text())
    del system["system"]["cls"]
    cfg.write_text(yaml.safe_dump(system))
    assert main(["all", "--config", str(cfg), "--run", str(run)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("system.rec: ships fp32")]
    assert len(said) == 1 and "no int8 within compress.max_drop 1 (int8 gate: " in said[0], out[-3000:]
    assert not (run / "rec" / "compress").exists()
    m = artifacts.verify(run / ocr_package.STAGE, (ocr_package.STAGE,)).manifest
    assert (m["parts"]["rec"]["precision"], m["parts"]["rec"]["variant"]) == ("fp32", "export-onnx"), m["parts"]
    assert f"{ocr_package.STAGE}: det fp32 (" in out and "rec fp32 (export-onnx on onnxruntime)" in out
