"""Detection through the stages (model.task detection): the data sources (shapes, a COCO folder), the task/data
check, the int8 rule that keeps the heads' last layers fp32, and a COCO folder a test writes through `pipe train`
and `pipe all` (train on mAP, export parity on every output, int8 on every engine judged by mAP, a package).
Serving a detection package: tests/stages/test_serve_detection.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import data, quantize
from pipeline.tasks.detection import coco
from pipeline.config import DataConfig
from tests.conftest import REPO

CONFIG = str(REPO / "examples" / "detection.yaml")


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


# ------------------------------------------------------------------ data


def test_shapes_source_is_a_detection_dataset(tmp_path):
    ds = data.load(DataConfig(source="shapes", shapes_images=40, cache_dir=str(tmp_path)))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (40, 6, 6)
    assert ds.targets == "boxes" and ds.input_names == ("image",) and ds.input_shapes == {"image": (3, 64, 64)}
    assert ds.labels == coco.SHAPES
    y = ds.train.y[ds.train.idx]
    assert y.dtype == np.float32 and y.shape[2] == 5
    real = y[y[..., 4] >= 0]
    assert len(real) >= 40 and set(np.unique(real[:, 4]).astype(int)) <= {0, 1, 2}
    assert (real[:, :2] >= 0).all() and (real[:, 2:4] <= 64).all() and (real[:, 2:4] > real[:, :2]).all()
    assert ds.sizes.tolist() == [[64, 64]] * 52
    # generated once under the cache directory; a second load reads the same files
    again = data.load(DataConfig(source="shapes", shapes_images=40, cache_dir=str(tmp_path)))
    assert np.array_equal(again.train.y, ds.train.y)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("shapes-")] == ["shapes-40-6-6"]


def _generate(root: str) -> None:
    coco.generate(Path(root), counts=(60, 9, 9))


@pytest.mark.slow
def test_ranks_generating_the_same_shapes_at_once_both_succeed(tmp_path):
    """Every rank of a data-parallel run loads the data: two processes generating one root at the same
    time both return, and the root holds one complete dataset (os.replace of whole directories)."""
    import multiprocessing as mp

    root = tmp_path / "shapes"
    ctx = mp.get_context("spawn")
    for _ in range(3):  # the race is timing-dependent: a few rounds, each from scratch
        shutil.rmtree(root, ignore_errors=True)
        procs = [ctx.Process(target=_generate, args=(str(root),)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        assert len(coco.read(root, 0).files) == 78
        assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes"]  # no temp dir left behind


def test_coco_folder_without_val_and_test_carves_them_from_train_and_resizes(tmp_path):
    root = tmp_path / "coco"
    coco.generate(root, counts=(50, 0, 0), size=80)
    cfg = DataConfig(source=str(root), image_size=64, cache_dir=str(tmp_path / "cache"), split_seed=3)
    ds = data.load(cfg)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (34, 8, 8)  # round(50 * 0.15) = round(7.5) = 8
    assert ds.input_shapes == {"image": (3, 64, 64)} and ds.sizes.tolist() == [[80, 80]] * 50
    raw = coco.read(root, 0)
    # boxes in the model input's pixels: the 80 px originals scaled by 64/80
    assert raw.boxes.shape == ds.train.y.shape and (raw.boxes[..., 4] >= 0).sum() >= 50
    assert np.allclose(ds.train.y[..., :4], raw.boxes[..., :4] * 0.8, atol=1e-4)
    assert np.array_equal(ds.train.y[..., 4], raw.boxes[..., 4])
    again = data.load(cfg)
    assert np.array_equal(again.val.idx, ds.val.idx) and np.array_equal(again.test.idx, ds.test.idx)
    other = data.load(DataConfig(source=str(root), image_size=64, cache_dir=str(tmp_path / "cache"), split_seed=4))
    assert not np.array_equal(other.val.idx, ds.val.idx)


def test_task_and_data_must_match(cli, tmp_path):
    code, _, err = cli("train", "--set", "model.task=detection", "--set", "model.name=centernet_tiny",
                       "--run", str(tmp_path / "a"), "--epochs", "1")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "pipe train: error: model.task detection: needs boxes (a detection source: data.source shapes or a COCO "
        "folder); data.source digits has class labels")
    code, _, err = cli("train", "--set", "data.source=shapes", "--set", "data.shapes_images=20",
                       "--set", f"data.cache_dir={tmp_path}", "--run", str(tmp_path / "b"), "--epochs", "1")
    assert code == 2
    assert "model.task classification: needs class labels; data.source shapes has boxes" in err
    assert not (tmp_path / "a" / "train").exists() and not (tmp_path / "b" / "train").exists()


def test_a_bad_coco_file_is_one_line_exit_2_and_nothing_written(cli, tmp_path):
    root = tmp_path / "coco"
    coco.generate(root, counts=(12, 0, 0), size=64)
    path = root / "annotations" / "instances_train.json"
    doc = json.loads(path.read_text())
    ann = doc["annotations"][0]
    ann["bbox"] = [70, 2, 10, 5]  # wholly outside (a box only past the edge is clipped: tests/test_coco.py)
    path.write_text(json.dumps(doc))
    run = tmp_path / "run"
    code, out, err = cli("train", "--config", CONFIG, "--set", f"data.source={root}",
                         "--set", f"data.cache_dir={tmp_path / 'cache'}", "--run", str(run), "--epochs", "1")
    assert code == 2
    assert err.strip().splitlines() == [
        f"pipe train: error: data.source {path}: annotation {ann['id']}: box [70, 2, 10, 5] lies outside image "
        f"{ann['image_id']} (64x64)"]
    assert not (run / "train").exists() and not list((tmp_path / "cache").glob("coco-*"))
    (root / "images" / doc["images"][0]["file_name"]).unlink()
    ann["bbox"] = [1, 2, 10, 5]
    path.write_text(json.dumps(doc))
    code, _, err = cli("train", "--config", CONFIG, "--set", f"data.source={root}",
                       "--set", f"data.cache_dir={tmp_path / 'cache'}", "--run", str(run), "--epochs", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert doc["images"][0]["file_name"] in err and f"image {doc['images'][0]['id']}" in err


# ------------------------------------------------------------------ the int8 rule


def test_output_layers_stops_at_the_first_quantizable_op_on_every_path():
    # x -> conv1 -> relu -> conv2 -> add(bias) -> out_a; conv1 -> conv3 -> identity -> out_b; matmul feeds only conv2
    nodes = [("conv1", "Conv", ["x", "w1"], ["c1"]), ("relu", "Relu", ["c1"], ["r"]),
             ("conv2", "Conv", ["r", "w2"], ["c2"]), ("add", "Add", ["c2", "b"], ["out_a"]),
             ("conv3", "Conv", ["c1", "w3"], ["c3"]), ("id", "Identity", ["c3"], ["out_b"])]
    assert quantize.output_layers(nodes, ["out_a", "out_b"], {"Conv"}) == ["conv2", "conv3"]
    assert quantize.output_layers(nodes, ["out_a"], {"Conv"}) == ["conv2"]
    assert quantize.output_layers(nodes, ["r"], {"Conv"}) == ["conv1"]
    assert quantize.output_layers(nodes, ["x"], {"Conv"}) == []  # a graph input is produced by no node


# ------------------------------------------------------------------ a COCO folder through train and all


@pytest.fixture(scope="module")
def coco_run(tmp_path_factory):
    """`pipe all` on a COCO folder the test writes (80x80 images resized to 64, train file only), every int8
    route, then the same folder through `pipe train` alone."""
    from pipeline.cli import main
    import io
    from contextlib import redirect_stdout

    tmp = tmp_path_factory.mktemp("det")
    root = tmp / "my_coco"
    coco.generate(root, counts=(160, 0, 0), size=80, seed=7)
    args = ["--config", CONFIG, "--set", f"data.source={root}", "--set", "data.image_size=64",
            "--set", f"data.cache_dir={tmp / 'cache'}", "--set", "train.epochs=3", "--set", "train.warmup_epochs=0",
            "--set", "compress.calib_batches=3", "--set", "compress.latency_runs=10",
            "--set", "compress.throughput_runs=3", "--set", "compress.max_drop=100", "--set", "compress.min_sqnr_db=0",
            "--set", "compress.min_agreement=0", "--set", "postprocess.score_threshold=0.25",
            "--set", "postprocess.max_detections=20"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["all", *args, "--run", str(tmp / "run")])
    assert code == 0, buf.getvalue()[-3000:]
    return tmp, root, args, buf.getvalue()


@pytest.mark.slow
def test_coco_folder_through_pipe_all(coco_run):
    tmp = coco_run[0]
    run = tmp / "run"
    train = _manifest(run / "train")
    assert train["interface"]["task"]["name"] == "detection"
    assert [o["name"] for o in train["interface"]["outputs"]] == ["heatmap", "offset", "size"]
    m = train["metrics"]
    assert {"test_map", "test_map50", "val_map", "val_map50", "best_checkpoint"} <= set(m)
    assert 0 <= m["test_map"] <= m["test_map50"] <= 1
    header, *rows = (run / "train" / "metrics.csv").read_text().splitlines()
    assert {"val_map", "val_map50", "val_loss"} <= set(header.split(",")) and len(rows) == 3
    exp = _manifest(run / "export")["metrics"]
    assert exp["test_map"] == pytest.approx(m["test_map"], abs=1e-3)
    comp = _manifest(run / "compress")["metrics"]
    assert comp["task"] == "detection" and comp["metric"] == "map"
    variants = comp["variants"]
    assert {"int8-paddle", "int8-onnx", "openvino-int8"} <= set(variants)
    for name in ("int8-paddle", "int8-onnx"):
        v = variants[name]
        assert v["supported"] and v["top1_agreement"] is None and set(v["metrics"]) == {"map", "map50"}
    kept = comp["calibration"]["fp32_layers"]
    assert kept["rule"] == quantize.KEEP_OUTPUTS_RULE
    assert len(kept["int8-paddle"]) == 3 and len(kept["int8-onnx"]) == 3  # the three heads' last convs
    import yaml

    served = yaml.safe_load((run / "package" / "serving.yaml").read_text())["task"]
    assert served == {"name": "detection", "spec": "detection",
                      "settings": {"score_threshold": 0.25, "nms_iou": 0.6, "max_detections": 20}}
    assert json.loads((run / "pipeline.json").read_text())["packaged"]["variant"] is not None


@pytest.mark.slow
def test_int8_onnx_keeps_the_recorded_convs_in_fp32(coco_run):
    import onnx

    tmp = coco_run[0]
    kept = set(_manifest(tmp / "run" / "compress")["metrics"]["calibration"]["fp32_layers"]["int8-onnx"])
    g = onnx.load(str(tmp / "run" / "compress" / "int8-onnx" / "model.onnx")).graph
    producer = {o: n for n in g.node for o in n.output}
    convs = [n for n in g.node if n.op_type == "Conv"]
    fp32 = {n.name for n in convs if producer.get(n.input[1]) is None or producer[n.input[1]].op_type != "DequantizeLinear"}
    assert fp32 == kept
    assert len(convs) - len(fp32) >= 10  # every other conv is int8


@pytest.mark.slow
def test_coco_folder_through_pipe_train(coco_run, cli):
    tmp, _, args, _ = coco_run
    code, out, err = cli("train", *args, "--set", "train.epochs=1", "--run", str(tmp / "alone"))
    assert code == 0, err
    m = _manifest(tmp / "alone" / "train")["metrics"]
    assert m["epochs_run"] == 1 and 0 <= m["test_map"] <= 1
