"""The predict benchmark's own parts (pipeline/bench/predict.py, paddleocr_peer.py): the model dirs and inference.yml
files the PaddleOCR peer gets from the pinned wheel's models, the scoring of predictions.jsonl rows against the
generated pages' ground truth, the RSS sampler on a real process tree, and (slow, where .venv/paddleocr exists:
`make bench` makes it) the peer itself, offline, on two generated pages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pipeline.bench import paddleocr_peer, predict


def test_peer_model_dirs_carry_the_inference_yml_paddlex_reads(tmp_path):
    models = predict.wheel_models()
    dirs = paddleocr_peer.model_dirs(models, tmp_path)
    keys = Path(models["keys"]).read_text(encoding="utf-8").splitlines()
    assert len(keys) == 6623
    for role, name in (("det", "PP-OCRv4_mobile_det"), ("rec", "PP-OCRv4_mobile_rec"),
                       ("cls", "PP-LCNet_x0_25_textline_ori")):
        d = dirs[role]
        assert d == tmp_path / name  # PaddleX picks the predictor by the name; the dir says it too
        assert sorted(p.name for p in d.iterdir()) == ["inference.pdiparams", "inference.pdmodel", "inference.yml"]
        for f in ("inference.pdmodel", "inference.pdiparams"):  # the wheel's own bytes, linked; never the pickle
            assert (d / f).resolve() == (Path(models[role]) / f).resolve()
        doc = yaml.safe_load((d / "inference.yml").read_text(encoding="utf-8"))
        assert doc["Global"]["model_name"] == name
        ops = [next(iter(op)) for op in doc["PreProcess"]["transform_ops"]]
        if role == "det":
            assert ops == ["DecodeImage", "DetLabelEncode", "DetResizeForTest", "NormalizeImage", "ToCHWImage",
                           "KeepKeys"]
            norm = doc["PreProcess"]["transform_ops"][3]["NormalizeImage"]
            assert norm["mean"] == [0.485, 0.456, 0.406] and norm["std"] == [0.229, 0.224, 0.225]
            assert doc["PostProcess"] == {"name": "DBPostProcess", "thresh": 0.3, "box_thresh": 0.6,
                                          "max_candidates": 1000, "unclip_ratio": 1.5}
        elif role == "rec":
            assert ops[2] == "RecResizeImg" and doc["PreProcess"]["transform_ops"][2]["RecResizeImg"] == {
                "image_shape": [3, 48, 320]}
            assert doc["PostProcess"] == {"name": "CTCLabelDecode", "character_dict": keys}  # + blank, space = 6,625
        else:
            assert doc["PreProcess"]["transform_ops"][0] == {"ResizeImage": {"size": [192, 48]}}
            assert doc["PostProcess"] == {"Topk": {"topk": 1, "label_list": ["0_degree", "180_degree"]}}
    again = paddleocr_peer.model_dirs(models, tmp_path)  # a second run over the same folder: the same files
    assert again == dirs
    with pytest.raises(ValueError, match="key file"):
        paddleocr_peer.inference_yml("rec", [])


def test_scoring_reads_each_row_by_its_source(tmp_path):
    pages = predict.write_pages(tmp_path / "pages", 3)
    assert [p.name for p in pages.paths] == ["000000.png", "000001.png", "000002.png"]
    lines = sum(len(t) for t in pages.texts)
    assert lines >= 9 and all(len(p) == len(t) for p, t in zip(pages.polys, pages.texts))

    def row(i: int, wrong: int = -1) -> dict:  # the answer: /v1/ocr's for the page alone
        lines = [{"points": np.asarray(p).tolist(), "text": t + ("?" if j == wrong else ""), "score": 0.99}
                 for j, (p, t) in enumerate(zip(pages.polys[i], pages.texts[i]))]
        return {"source": str(pages.paths[i]), "page": None, "sha256": "x", "answer": {"pages": [lines]}}

    rows = [row(2), row(0), row(1)]  # a job writes rows in the order its items finish
    got = predict.answers_by_page(rows, pages.paths)
    assert ocr_system_e2e(got, pages) == 1.0
    wide = [{**r, "answer": {"pages": [[{**a, "text": a["text"].replace(",", "\uff0c")}
                                        for a in r["answer"]["pages"][0]]]}} for r in rows]
    commas = sum("," in t for page in pages.texts for t in page)  # the full-width comma a model reads for ","
    scored = predict.score(predict.answers_by_page(wide, pages.paths), pages)
    assert scored["e2e_nfkc"] == 1.0 and scored["e2e_acc"] == pytest.approx(1 - commas / lines) and commas > 0
    assert ocr_system_e2e(predict.answers_by_page([row(2), row(0, wrong=0), row(1)], pages.paths), pages) \
        == pytest.approx((lines - 1) / lines)
    missing = predict.answers_by_page([row(0), row(1)], pages.paths)  # page 2 never written: its lines are missed
    assert missing[2] == [] and ocr_system_e2e(missing, pages) == pytest.approx(1 - len(pages.texts[2]) / lines)


def test_mixed_pages_are_exactly_the_files_asked_for_all_different(tmp_path):
    import hashlib

    from PIL import Image

    paths = predict.write_mixed(tmp_path / "mixed", 6, distinct=2)
    assert sorted(p.name for p in (tmp_path / "mixed").rglob("*")) == [f"{i:05d}.{e}" for i, e in
                                                                       enumerate(["png", "jpg"] * 3)]
    assert len({hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}) == 6
    sizes = [Image.open(p).size for p in paths]
    # page 0 at 3 scales, page 1 at 3 others: the sizes interleaved, not in blocks
    assert sizes[2][0] == round(sizes[0][0] * 1.25) and sizes[4][0] == round(sizes[0][0] * 1.5)
    assert [round(sizes[i][0] / sizes[1][0] * 0.6, 2) for i in (1, 3, 5)] == [0.6, 1.75, 2.0]


def ocr_system_e2e(answers, pages) -> float:
    from pipeline import ocr_system

    return ocr_system.end_to_end(answers, pages.polys, pages.texts)["e2e_acc"]


_TREE = """import subprocess, sys, time
out = open(sys.argv[1], "w")
kid = subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (120 * 2**20); time.sleep(2.5)"])
for i in range(5):
    out.write(f"row {i}\\n"); out.flush(); time.sleep(0.3)
out.write("torn"); out.flush()
kid.wait()
"""


def test_rss_sampler_sums_the_whole_process_tree_and_counts_whole_rows(tmp_path):
    rows = tmp_path / "predictions.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _TREE, str(rows)])
    with predict.RssSampler(proc.pid, interval=0.1, progress=predict.line_counter(rows)) as s:
        proc.wait(30)
    assert len(s.samples) >= 10
    t, mb, procs, done = zip(*s.samples)
    assert max(procs) == 2 and max(mb) >= 120 + 5  # the grandchild's 120 MB buffer plus two interpreters
    assert list(done) == sorted(done) and done[-1] == 5  # "torn" has no newline: not a row
    assert predict.tree_rss_mb(proc.pid) == (0.0, 0)  # gone
    g = predict.growth([(0.0, 100.0, 1, 0), (1.0, 200.0, 2, 150), (2.0, 210.0, 2, 200), (3.0, 220.5, 2, 400)], 200)
    assert g["base_mb"] == 210.0 and g["peak_mb"] == 220.5 and g["growth"] == pytest.approx(0.05)
    assert predict.growth(list(s.samples), 6) is None
    png = predict.plot(list(s.samples), tmp_path / "rss.png", "test")
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 100


def test_rows_without_pipe_predict_say_so(tmp_path):
    listed = subprocess.run([sys.executable, "-m", "pipeline.cli", "--help"], capture_output=True, text=True).stdout
    available = predict.predict_available()
    assert available == (" predict " in listed)
    if available:
        pytest.skip("pipe predict exists: its rows are measured by `make bench`")
    for got in (predict._memory_rows(tmp_path, True), predict._classifier_rows(tmp_path, True)):
        assert len(got) == 1 and got[0][1] == predict.NOT_AVAILABLE and got[0][3] == "**not run**"


@pytest.mark.slow
@pytest.mark.skipif(not predict._PEER.is_file(), reason=f"{predict._PEER} missing (make bench creates it)")
def test_paddleocr_peer_reads_generated_pages_offline(tmp_path):
    pages = predict.write_pages(tmp_path / "pages", 2)
    got = predict.peer(pages.paths, tmp_path / "peer", 2)
    assert "error" not in got, got  # an attempted network access is an error (the peer's audit hook refuses it)
    assert got["network"] == [] and got["settings"] == {"cpu_threads": 2, "workaround": True}
    assert got["versions"]["paddleocr"] == "3.7.0" and got["versions"]["paddlex"] == "3.7.2"
    assert len(got["answers"]) == 2 and got["pages_s"] > 0
    e2e = predict.ocr_system.end_to_end(got["answers"], pages.polys, pages.texts)
    assert e2e["lines"] == sum(len(t) for t in pages.texts) and e2e["hmean"] >= 0.9 and e2e["e2e_acc"] >= 0.7, e2e


_GUARDED = """import socket, sys
from pipeline.bench.paddleocr_peer import guard_network
refused = guard_network()
a, b = socket.socketpair(socket.AF_UNIX)  # local IPC passes
for call in (lambda: socket.socket().connect(("127.0.0.1", 9)), lambda: socket.getaddrinfo("pypi.org", 443)):
    try:
        call()
        print("NOT REFUSED")
    except OSError as e:
        print("refused:", e)
print(refused)
"""


def test_peer_guard_refuses_and_records_network_calls():
    r = subprocess.run([sys.executable, "-c", _GUARDED], capture_output=True, text=True, cwd=predict._REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "NOT REFUSED" not in r.stdout and r.stdout.count("network access refused") == 2, r.stdout
    assert r.stdout.strip().splitlines()[-1] == "[\"connect ('127.0.0.1', 9)\", \"getaddrinfo 'pypi.org'\"]"


@pytest.mark.slow
def test_a_real_classifier_against_its_engine_alone(ppocr_cls_export, tmp_path):
    """The classifier row on the real textline classifier (ocr_cls, a dynamic-shape task fed at its example shape):
    its engine alone at each batch, then `pipe predict` over PNGs of the input's size; the row names both rates."""
    from pipeline.cli import main

    package = tmp_path / "cls"
    assert main(["package", str(ppocr_cls_export), "--no-triton", "--out", str(package)]) == 0
    alone = predict.engine_alone(package, batches=(1, 8))
    assert alone["batch"] in (1, 8) and alone["items_s"] > 0
    what, result, goal, status = predict._versus_alone(package, tmp_path, 24, "cls", ">= 0.8x")
    assert status in ("met", "**missed**"), result
    ratio, rate = result.split("x (")[0], result.split("(")[1].split(" vs ")[0]
    assert float(ratio) > 0 and float(rate) > 0
    rows = (tmp_path / "predict-cls" / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == 24  # every image answered
    with Image.open(tmp_path / "images-cls" / "00000.png") as im:
        assert im.size == (192, 48)  # ocr_cls's 48 x 192 input, written as W x H
