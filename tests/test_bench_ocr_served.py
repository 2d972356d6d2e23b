"""The served OCR system benchmark (pipeline/bench/ocr_served.py `measure`) on the session's det, rec and cls
imports, 2 pages, one engine: a real system package, a real `pipe serve` driven at concurrency 1 and 8, stopped;
RapidOCR's row where its venv exists (`make bench` makes it; `make test` does not); the table's goal rows
computed from the measurement."""

from __future__ import annotations

import pytest

from pipeline.bench import ocr_served as bench


pytestmark = pytest.mark.slow(reason="serves and benchmarks the real PP-OCRv4 system")


def test_measure_serves_the_system_package_and_reads_every_page(ppocr_det_export, ppocr_rec_export, ppocr_cls_export,
                                                               tmp_path):
    for role, src in (("det", ppocr_det_export), ("rec", ppocr_rec_export), ("cls", ppocr_cls_export)):
        (tmp_path / role).symlink_to(src, target_is_directory=True)
    got = bench.measure(tmp_path, ("onnxruntime",), limit=2)
    assert got["pages"] == 2 and got["lines"] >= 8
    v = got["systems"]["onnxruntime"]
    assert "error" not in v, v
    assert v["lines"] == got["lines"] and v["hmean"] >= 0.95 and v["e2e_acc"] >= 0.7, v
    for c in ("c1", f"c{bench.CONCURRENCY}"):
        assert v[c]["pages_s"] > 0 and 0 < v[c]["p50_s"] <= v[c]["p99_s"], (c, v)
    assert (tmp_path / "system-onnxruntime" / "system.yaml").is_file()
    assert "stopped (" in (tmp_path / "serve-onnxruntime.log").read_text()  # drained and exited on SIGTERM
    rows = bench._rows(got)
    assert rows[0][0].startswith("OCR system served") and f"{v['e2e_acc']:.1%}" in rows[0][1]
    if bench._PEER.is_file():
        assert got["rapidocr"]["lines"] == got["lines"] and got["rapidocr"]["c1"]["pages_s"] > 0
        peer = got["rapidocr_same_limit"]  # the goal rows' peer: RapidOCR at pipe's det side limit
        assert got["det_limit"] == "960 'max'" and peer["lines"] == got["lines"] and peer["c1"]["pages_s"] > 0
        ratio = v[f"c{bench.CONCURRENCY}"]["pages_s"] / peer["c1"]["pages_s"]
        assert rows[-2][1].startswith(f"{ratio:.2f}x") and rows[-2][3] in ("met", "**missed**")
    else:
        assert "make bench creates it" in got["rapidocr"]["error"] and "make bench creates it" in rows[-1][1]
