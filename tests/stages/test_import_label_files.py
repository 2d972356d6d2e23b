"""`--data` as PaddleOCR gives labelled data (issue 51): one label file, several comma-separated (label_file_list)
or a folder holding only some of train/val/test. pipe import of the real PP-OCRv4 models measures on what is
there and says which split in its output and manifest; compress calibrates on the split there is and says so in
one line; pipe train refuses data without a train split in one line. Lines and pages are rendered with the
tasks' own font and generators, a few of each."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import artifacts
from pipeline.cli import main
from pipeline.tasks.ocr_det import data as det_data
from pipeline.tasks.ocr_rec import data as rec_data

pytestmark = [pytest.mark.slow(reason="imports, compresses and trains the real PP-OCRv4 models on label files"), pytest.mark.timeout(900)]


def _lines(folder: Path, texts: list[str], seed: int) -> Path:
    """PNGs of `texts` rendered as ocr_rec's generated lines, and rec_gt.txt naming them relative to `folder`."""
    from PIL import Image

    (folder / "img").mkdir(parents=True)
    font = rec_data.font_path()
    rows = []
    for i, (t, rng) in enumerate(zip(texts, np.random.default_rng(seed).spawn(len(texts)))):
        Image.fromarray(rec_data.render(t, rng, font)).save(folder / "img" / f"{i}.png")
        rows.append(f"img/{i}.png\t{t}\n")
    (folder / "rec_gt.txt").write_text("".join(rows), encoding="utf-8")
    return folder / "rec_gt.txt"


@pytest.fixture(scope="module")
def rec_file(tmp_path_factory, rec_src, keys) -> tuple[Path, Path, str]:
    """(the label file, the export of `pipe import --data` that one file, what the import printed): 10 rendered
    lines."""
    root = tmp_path_factory.mktemp("rec-file")
    label = _lines(root / "my_lines", ["中文识别", "价格100元", "OK好的", "今天天气很好", "USB接口", "第3.5章",
                                       "质量不错", "发货很快", "Wi-Fi信号", "包装完好"], seed=1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["import", str(rec_src), "--task", "ocr_rec", "--keys", str(keys), "--data", str(label),
                     "--no-onnx", "--out", str(root / "export")])
    assert code == 0
    return label, root / "export", printed.getvalue()


def test_import_measures_one_label_file_as_its_test_split(rec_file):
    label, out, stdout = rec_file
    assert f"import: measured on test (10 lines of {label})" in stdout, stdout
    m = artifacts.verify(out, ("export",)).manifest
    assert m["data"] == {"measured_on": ["test"], "label_files": {"test": [str(label)]}}
    assert m["metrics"]["samples"] == {"train": 0, "val": 0, "test": 10}
    assert m["metrics"]["test_acc"] >= 0.7  # PP-OCRv4 reads clean rendered lines
    assert not any(k.startswith("val_") for k in m["metrics"]), m["metrics"]
    assert m["metrics"]["parity_samples"] == 10


def test_compress_calibrates_on_the_test_split_and_says_so(rec_file, cli, tmp_path, monkeypatch):
    label, export, _ = rec_file
    # the calibration split is tested, not int8's speed: where int8 saturates (no VNNI) compress refuses Paddle's
    # int8 as slower than fp32 there, so the verdict is forced exact on either CPU class
    monkeypatch.setenv("PIPE_INT8_CAPABILITY", "exact")
    code, stdout, err = cli("compress", export, "--int8", "--backend", "paddle", "--set", "compress.openvino=false",
                            "--set", "compress.max_drop=100", "--set", "compress.min_agreement=0",
                            "--set", "compress.latency_runs=2", "--set", "compress.throughput_runs=1",
                            "--out", tmp_path / "c")
    assert code == 0, err
    said = [ln for ln in stdout.splitlines() if ln.startswith("compress: no train split")]
    assert said == [f"compress: no train split in data.source {str(label)!r}: calibrating on the test split "
                    f"(10 lines)"], stdout
    m = artifacts.verify(tmp_path / "c", ("compress",)).manifest["metrics"]
    assert m["calibration"]["split"] == "test" and m["calibration"]["lines"] == 10
    assert m["splits"] == {"train": "test", "val": "test", "test": "test"}


def test_train_refuses_data_without_a_train_split_in_one_line(rec_file, cli, tmp_path):
    label, export, _ = rec_file
    code, _, err = cli("train", "--init", export, "--set", "model.task=ocr_rec", "--data", label,
                       "--run", tmp_path / "run")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--data {label}: no train split to train on (only test); pipe train needs" in err, err
    assert not (tmp_path / "run").exists()


def test_import_det_on_two_label_files_comma_separated(det_src, cli, tmp_path):
    """Two folders of rendered pages, each label file naming its pages relative to itself."""
    from PIL import Image

    font = rec_data.font_path()
    files = []
    for k, folder in enumerate((tmp_path / "a", tmp_path / "b")):
        (folder / "pages").mkdir(parents=True)
        rows = []
        for i, rng in enumerate(np.random.default_rng(k).spawn(2)):
            img, polys, texts = det_data.page(rec_data.corpus_lines(None, 4, seed=10 * k + i), rng, font)
            Image.fromarray(img).save(folder / "pages" / f"{i}.png")
            labels = [{"transcription": t, "points": p.round().astype(int).tolist()} for t, p in zip(texts, polys)]
            rows.append(f"pages/{i}.png\t{json.dumps(labels, ensure_ascii=False)}\n")
        (folder / "det_gt.txt").write_text("".join(rows), encoding="utf-8")
        files.append(folder / "det_gt.txt")
    given = ",".join(map(str, files))
    code, stdout, err = cli("import", det_src, "--task", "ocr_det", "--data", given, "--no-onnx",
                            "--out", tmp_path / "export")
    assert code == 0, err
    assert f"import: measured on test (4 pages of {files[0]}, {files[1]})" in stdout, stdout
    m = artifacts.verify(tmp_path / "export", ("export",)).manifest
    assert m["data"]["measured_on"] == ["test"] and m["metrics"]["samples"]["test"] == 4
    assert m["metrics"]["test_hmean"] > 0.5, m["metrics"]


def test_import_cls_on_a_folder_holding_only_test_txt(cls_src, cli, tmp_path):
    root = tmp_path / "cls"
    root.mkdir()
    texts = rec_data.corpus_lines(None, 6, seed=3)
    rows = []
    from PIL import Image

    for i, (t, rng) in enumerate(zip(texts, np.random.default_rng(3).spawn(6))):
        img = rec_data.render(t, rng, rec_data.font_path())
        turned = i % 2 == 1
        Image.fromarray(np.ascontiguousarray(img[::-1, ::-1]) if turned else img).save(root / f"{i}.png")
        rows.append(f"{i}.png\t{'180' if turned else '0'}\n")
    (root / "test.txt").write_text("".join(rows), encoding="utf-8")
    code, stdout, err = cli("import", cls_src, "--task", "ocr_cls", "--data", root, "--no-onnx",
                            "--out", tmp_path / "export")
    assert code == 0, err
    assert f"import: measured on test (6 lines of {root / 'test.txt'})" in stdout, stdout
    m = artifacts.verify(tmp_path / "export", ("export",)).manifest
    assert m["data"] == {"measured_on": ["test"], "label_files": {"test": [str(root / "test.txt")]}}
    assert m["metrics"]["samples"] == {"train": 0, "val": 0, "test": 6}
