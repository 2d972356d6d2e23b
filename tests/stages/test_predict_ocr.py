"""`pipe predict` on the real PP-OCRv4 OCR system package (det, cls, rec: the session's imports): each page's row
is what a real `pipe serve` answers on /v1/ocr for that page alone, for PNG pages and for PDF pages; most lines
read as they were rendered; each part's own package (det on pages, cls and rec on line images) answers as the
server's /v1/models/ROLE/predict; `--draw` writes each page with its polygons where the rows say."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline import artifacts, config as config_mod, ocr_system
from pipeline.cli import main
from pipeline.predict import output
from pipeline.tasks import ocr_det
from tests.serving_helpers import png_b64, start_server

pytestmark = [pytest.mark.slow(reason="the real PP-OCRv4 models (imported), a server, predictors"), pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def package(ppocr_det_export, ppocr_cls_export, ppocr_rec_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("predict-ocr") / "ocr"
    assert main(["package", str(ppocr_det_export), str(ppocr_cls_export), str(ppocr_rec_export), "--out", str(out),
                 "--no-triton"]) == 0
    return out


@pytest.fixture(scope="module")
def pages(ppocr_det_export) -> tuple[list[np.ndarray], list[list[str]]]:
    """The detector's generated test pages (RGB) and the texts drawn on each."""
    art = artifacts.verify(ppocr_det_export, ("export",))
    info = ocr_det.info_of(art.manifest["interface"])
    test = ocr_det.load_data(config_mod.from_dict(art.manifest["config"]).data, info).test
    return list(test.images[:4]), list(test.texts[:4])


def _same(got: list[dict], want: list[dict]) -> None:
    """Two pages' lines: the same polygons and texts, scores within float noise (batches of other sizes)."""
    assert [(line["points"], line["text"]) for line in got] == [(line["points"], line["text"]) for line in want]
    np.testing.assert_allclose([line["score"] for line in got], [line["score"] for line in want], atol=1e-4)


def _same_boxes(got: list[dict], want: list[dict]) -> None:
    assert [b["points"] for b in got] == [b["points"] for b in want]
    np.testing.assert_allclose([b["score"] for b in got], [b["score"] for b in want], atol=1e-4)


def _png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


def test_ocr_rows_are_what_serve_answers_on_v1_ocr(package, pages, tmp_path):
    import pypdfium2 as pdfium
    from PIL import Image

    images, texts = pages
    (tmp_path / "in").mkdir()
    for i, im in enumerate(images[:3]):
        (tmp_path / "in" / f"page{i}.png").write_bytes(_png_bytes(im))
    pdf = tmp_path / "in" / "scan.pdf"
    Image.fromarray(images[3]).save(pdf, "PDF", resolution=100.0)
    out = tmp_path / "out"
    assert main(["predict", str(package), str(tmp_path / "in"), "--out", str(out), "--workers", "1", "--threads",
                 "2", "--batch", "2", "--dpi", "100", "--draw"]) == 0
    rows = {(Path(r["source"]).name, r["page"]): r for r in
            map(json.loads, (out / output.PREDICTIONS).read_text().splitlines())}
    assert set(rows) == {("page0.png", None), ("page1.png", None), ("page2.png", None), ("scan.pdf", 1)}
    doc = pdfium.PdfDocument(str(pdf))
    rendered = np.asarray(doc[0].render(scale=100 / 72).to_pil().convert("RGB"))
    doc.close()
    sent = {("page0.png", None): images[0], ("page1.png", None): images[1], ("page2.png", None): images[2],
            ("scan.pdf", 1): rendered}
    # each part alone: its own package (the system's det/, cls/, rec/ folders), pages for det, lines for cls, rec
    lines = [ocr_system.crop(images[0], np.asarray(p, np.float32)) for p in
             [line["points"] for line in rows[("page0.png", None)]["answer"]["pages"][0]][:6]]
    lines.append(np.ascontiguousarray(lines[0][::-1, ::-1]))  # upside down: cls says 180
    (tmp_path / "lines").mkdir()
    for i, line in enumerate(lines):
        (tmp_path / "lines" / f"line{i}.png").write_bytes(_png_bytes(line))
    parts = {}
    for role, src in (("det", tmp_path / "in" / "page1.png"), ("cls", tmp_path / "lines"), ("rec", tmp_path / "lines")):
        assert main(["predict", str(package / role), str(src), "--out", str(tmp_path / role), "--workers", "1"]) == 0
        parts[role] = {Path(r["source"]).name: r["answer"] for r in
                       map(json.loads, (tmp_path / role / output.PREDICTIONS).read_text().splitlines())}
    assert len(parts["rec"]) == len(parts["cls"]) == len(lines) and len(parts["det"]) == 1
    assert parts["cls"][f"line{len(lines) - 1}.png"]["lines"][0]["label"] == "180"
    srv = start_server(package, timeout=240)
    try:
        for key, image in sent.items():
            r = httpx.post(srv.url + "/v1/ocr", json={"images": [png_b64(image)]}, timeout=180)
            assert r.status_code == 200, r.text
            (want,) = r.json()["pages"]
            (got,) = rows[key]["answer"]["pages"]
            _same(got, want)
        for role, answers in parts.items():
            for file, got in answers.items():
                folder = tmp_path / ("in" if role == "det" else "lines")
                r = httpx.post(srv.url + f"/v1/models/{role}/predict",
                               json={"images": [base64.b64encode((folder / file).read_bytes()).decode()]}, timeout=120)
                assert r.status_code == 200, r.text
                want = r.json()
                if role == "det":
                    _same_boxes(got["boxes"][0], want["boxes"][0])
                else:
                    assert [x["text" if role == "rec" else "label"] for x in got["lines"]] == \
                        [x["text" if role == "rec" else "label"] for x in want["lines"]]
                    np.testing.assert_allclose(got["lines"][0]["score"], want["lines"][0]["score"], atol=1e-4)
    finally:
        assert srv.stop() == 0
    for i in range(3):  # most lines read exactly as they were rendered
        got_texts = {line["text"] for line in rows[(f"page{i}.png", None)]["answer"]["pages"][0]}
        assert len(got_texts & set(texts[i])) >= len(texts[i]) // 2
    s = json.loads((out / output.SUMMARY).read_text())
    assert s["task"] == "ocr_system" and s["done"] == 4 and s["failed"] == 0 and s["workers"] == 1
    assert s["engine"].startswith("det:") and "rec:" in s["engine"]
    _check_drawn(out, rows)


def _check_drawn(out: Path, rows: dict) -> None:
    """--draw: one PNG per page, decodable, the page's size, and red polygon outlines where the rows put lines
    (a pixel on each polygon's first edge is red) and not where there is none (the page's own corner)."""
    from PIL import Image

    from pipeline.predict import draw

    assert sorted(p.name for p in (out / "draw").iterdir()) == sorted(draw.name(r["source"], r["page"])
                                                                      for r in rows.values())
    for row in rows.values():
        file = draw.name(row["source"], row["page"])
        with Image.open(out / "draw" / file) as im:
            im.load()
            arr = np.asarray(im.convert("RGB"))
        lines = row["answer"]["pages"][0]
        assert lines
        for line in lines:
            (x0, y0), (x1, y1) = line["points"][0], line["points"][1]
            x, y = int(round((x0 + x1) / 2)), int(round((y0 + y1) / 2))
            patch = arr[max(0, y - 1):y + 2, max(0, x - 1):x + 2].reshape(-1, 3).astype(int)
            assert any(r > 200 and g < 80 and b < 80 for r, g, b in patch), (file, line["points"])


_GROWTH = """
import sys
from pathlib import Path
import numpy as np
from pipeline.engines import openvino
from pipeline.serving import predictor
from pipeline.serving.spec import load_package

det = load_package(Path(sys.argv[1]))
if sys.argv[2] == "capped":
    eng = predictor.load_engine(det, "openvino", 1, cache_capacity=1)
    assert eng.describe()["runtime_cache"] == openvino.RUNTIME_CACHE_PER_SHAPE
else:
    eng = openvino.load(list(det.files), threads=1)
    assert "runtime_cache" not in eng.describe()
name = det.io.inputs[0].name
rss = lambda: int(Path("/proc/self/statm").read_text().split()[1]) * 4096 // 2**20
eng.run({name: np.zeros((1, 3, 640, 640), np.float32)})  # the largest page first: every later buffer fits in its
before = rss()
shapes = [(h, w) for h in range(320, 641, 32) for w in range(320, 641, 32) if h * w < 640 * 640][:80]
for h, w in shapes:  # 80 new shapes, none larger than the first
    eng.run({name: np.zeros((1, 3, h, w), np.float32)})
print(rss() - before)
"""


def test_openvino_caps_its_kernel_cache_for_pages_of_any_size(package):
    """PP-OCRv4 det on OpenVINO sees a new input shape with nearly every page of another size; its CPU plugin keeps
    kernels per shape in a cache of 5,000 entries by default (each det predictor grew 0.4 -> 1.0 GB over 600 mixed
    pages). A predictor caps it per shape as Paddle's oneDNN cache is capped (the server's buckets x warm shapes):
    over the same 80 new page shapes, each engine in a fresh process, the capped engine's memory grows by less than half
    the default's."""
    import subprocess
    import sys

    def growth(how: str) -> int:
        r = subprocess.run([sys.executable, "-c", _GROWTH, str(package / "det"), how], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(r.stdout.split()[-1])

    capped_mb, plain_mb = growth("capped"), growth("plain")
    assert capped_mb < plain_mb / 2, (capped_mb, plain_mb)
