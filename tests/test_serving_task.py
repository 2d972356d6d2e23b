"""Package and serve through the task contract (pipeline/tasks/), without a trained model: serving.yaml's
`task:` section and its reader, /v1's answer for classification (unchanged) and detection (boxes in the sent
image's pixels), the image sizes /v1 keeps, the reference check of a model without logits, the README and the
OpenAPI schema of a detection package, and Triton's repository without labels."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline import iospec, reference, tasks
from pipeline.errors import InputError
from pipeline.serving import openapi, readme, spec as spec_mod, validate
from pipeline.tasks import detection as det

LABELS = ["rectangle", "ellipse", "triangle"]
DET_SETTINGS = {"score_threshold": 0.3, "nms_iou": 0.6, "max_detections": 100}
PRE = {"kind": "image", "layout": "NCHW", "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
DET_IFACE = {
    "inputs": [{"name": "image", "dtype": "float32", "shape": [-1, 3, 64, 64]}],
    "outputs": [{"name": f"fetch_name_{i}", "alias": a, "dtype": "float32", "shape": [-1, c, 16, 16]}
                for i, (a, c) in enumerate((("heatmap", 3), ("size", 2), ("offset", 2)))],
    "labels": LABELS, "preprocessing": PRE,
    "task": {"name": "detection", "spec": "detection", "settings": DET_SETTINGS},
}
CLS_IFACE = {
    "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 1, 8, 8]}],
    "outputs": [{"name": "linear_1.tmp_1", "alias": "logits", "dtype": "float32", "shape": [-1, 3]},
                {"name": "emb", "alias": "embedding", "dtype": "float32", "shape": [-1, 2]}],
    "labels": ["a", "b", "c"], "preprocessing": {"kind": "none"},
}
SETTINGS = spec_mod.Settings(predictors=1, threads=1, max_batch_size=8, max_wait_ms=1.0, queue_size=8, timeout_s=5.0,
                             max_body_bytes=1 << 20, max_json_depth=32, max_image_pixels=1 << 20, drain_s=1.0)


def _spec(iface: dict, section: dict | None) -> spec_mod.Spec:
    """A Spec as load_package makes it from serving.yaml (no files are read)."""
    io_ = iospec.IO.from_interface(iface)
    task, info = spec_mod.read_task(section, io_, iface["labels"], "serving.yaml")
    doc = {"task": section} if section is not None else {}
    return spec_mod.Spec("m", "fp32", "pir", (Path("/nowhere/model.json"),), "paddle_inference", io_,
                         list(iface["labels"]), iface["preprocessing"], doc, "0" * 64, None, task, info)


def _heads(n: int, centres: list[list[tuple[int, int, int]]]) -> dict[str, np.ndarray]:
    """Raw detection heads by public name: per image, (class, cell x, cell y) peaks of logit 4 (score 0.982)
    with size 4x2 cells (16x8 px) and offset 0.5."""
    heat = np.full((n, 3, 16, 16), -8.0, np.float32)
    size = np.zeros((n, 2, 16, 16), np.float32)
    off = np.full((n, 2, 16, 16), 0.5, np.float32)
    for i, cs in enumerate(centres):
        for k, cx, cy in cs:
            heat[i, k, cy, cx] = 4.0
            size[i, :, cy, cx] = (4.0, 2.0)
    return {"heatmap": heat, "size": size, "offset": off}


def _by_program(spec: spec_mod.Spec, named: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {spec.io.output(k).name: v for k, v in named.items()}


def test_task_section_round_trip():
    """package writes interface.task (its settings over the task's defaults) as serving.yaml's `task:`;
    serve reads it back into the task module and its Info; a package without one is classification."""
    partial = {**DET_IFACE, "task": {"name": "detection", "spec": "detection", "settings": {"nms_iou": 0.5}}}
    section = spec_mod.task_section(partial, "interface")
    assert section == {"name": "detection", "spec": "detection",
                       "settings": {"score_threshold": 0.05, "nms_iou": 0.5, "max_detections": 100}}
    io_ = iospec.IO.from_interface(DET_IFACE)
    task, info = spec_mod.read_task(section, io_, LABELS, "serving.yaml")
    assert task is det and info.logits == "" and info.labels == tuple(LABELS)
    assert info.settings == section["settings"]
    cls_io = iospec.IO.from_interface(CLS_IFACE)
    assert spec_mod.task_section(CLS_IFACE, "interface") == {"name": "classification", "spec": "classification",
                                                             "settings": {}}
    task, info = spec_mod.read_task(None, cls_io, CLS_IFACE["labels"], "serving.yaml")
    assert task is tasks.get("classification") and info.logits == "logits"
    with pytest.raises(InputError, match="serving.yaml: task must name a spec"):
        spec_mod.read_task({"settings": {}}, io_, LABELS, "serving.yaml")
    with pytest.raises(InputError, match="serving.yaml: model.task 'nope'"):
        spec_mod.read_task({"spec": "nope", "settings": {}}, io_, LABELS, "serving.yaml")


def test_check_io_and_allowlist_follow_the_task():
    """A model without a logits output is servable for a task without logits; classification still needs
    float32 [-1, K]. Triton's labels.txt is in the allowlist only for a task with logits."""
    io_ = iospec.IO.from_interface(DET_IFACE)
    spec_mod.check_io(io_, LABELS, False, "serving.yaml", logits=False)
    with pytest.raises(InputError, match="outputs have the logits role"):
        spec_mod.check_io(io_, LABELS, False, "serving.yaml")
    full = spec_mod.allowlist("pir", "m", reference=True)
    assert "triton/m/labels.txt" in full
    assert spec_mod.allowlist("pir", "m", reference=True, labels=False) == full - {"triton/m/labels.txt"}


def test_v1_answer_classification_unchanged():
    """The softmax label, score and logits of the logits output, every other output under `outputs`: what
    /v1 answered before the task contract, now through pipeline.tasks.classification."""
    spec = _spec(CLS_IFACE, None)
    z = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 0.0]], np.float32)
    emb = np.array([[0.1, 0.2], [0.3, 0.4]], np.float32)
    got = validate.v1_answer({"linear_1.tmp_1": z, "emb": emb}, spec)
    p = np.exp(z.astype(np.float64) - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert got == {"labels": ["b", "a"], "scores": [float(p[0, 1]), float(p[1, 0])], "logits": z.tolist(),
                   "outputs": {"embedding": emb.tolist()}}
    assert list(got) == ["labels", "scores", "logits", "outputs"]


def test_v1_answer_detection_in_the_sent_images_pixels():
    """Detection's answer is {"detections": [...]}, one list per image of {label, score, box}; each box is
    decode's (model-input pixels) scaled by the image's own (height, width) over the input's 64x64."""
    spec = _spec(DET_IFACE, spec_mod.task_section(DET_IFACE, "interface"))
    heads = _heads(2, [[(1, 5, 6)], [(0, 2, 3), (2, 12, 12)]])
    got = validate.v1_answer(_by_program(spec, heads), spec)
    assert list(got) == ["detections"] and len(got["detections"]) == 2
    (one,), two = got["detections"]
    # centre (5.5, 6.5) cells, 4x2 cells: x 3.5..7.5, y 5.5..7.5 cells, x4 px
    assert one["label"] == "ellipse" and one["box"] == [14.0, 22.0, 30.0, 30.0]
    assert one["score"] == pytest.approx(1 / (1 + np.exp(-4.0)), abs=1e-6)
    assert sorted(d["label"] for d in two) == ["rectangle", "triangle"]
    scaled = validate.v1_answer(_by_program(spec, heads), spec, [(128, 32), (64, 64)])
    assert scaled["detections"][0][0]["box"] == [7.0, 44.0, 15.0, 60.0]  # x * 32/64, y * 128/64
    assert scaled["detections"][1] == two
    # below serving.yaml's score_threshold (0.3): no box
    heads["heatmap"][:] = -8.0
    assert validate.v1_answer(_by_program(spec, heads), spec) == {"detections": [[], []]}


def _png(h: int, w: int, seed: int) -> str:
    from PIL import Image

    arr = np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_v1_request_keeps_each_images_original_size():
    """Images are resized to the model's input (as at training) and their own (height, width) travel to the
    answer; tensors are model inputs already: no sizes."""
    spec = _spec(DET_IFACE, spec_mod.task_section(DET_IFACE, "interface"))
    feeds, sizes = asyncio.run(validate.v1_request({"images": [_png(80, 100, 0), _png(64, 64, 1)]}, spec, SETTINGS))
    assert feeds["image"].shape == (2, 3, 64, 64) and feeds["image"].dtype == np.float32
    assert sizes == [(80, 100), (64, 64)]
    x = np.zeros((1, 3, 64, 64), np.float32)
    feeds, sizes = asyncio.run(validate.v1_request({"inputs": x.tolist()}, spec, SETTINGS))
    assert sizes is None and feeds["image"].shape == (1, 3, 64, 64)
    assert asyncio.run(validate.v1_inputs({"inputs": x.tolist()}, spec, SETTINGS))["image"].shape == (1, 3, 64, 64)


def test_reference_check_without_logits():
    """A detection model's reference check compares every output (max|diff|, SQNR against min_sqnr_db) and
    has no top-1 agreement; a head below the SQNR budget fails it."""
    io_ = iospec.IO.from_interface(DET_IFACE)
    ref = {io_.output(k).name: v for k, v in _heads(4, [[(0, 1, 1)]] * 4).items()}
    same = reference.compare(ref, ref, io_, 30.0, logits="")
    assert same["top1_agreement"] is None and same["logits"] is None
    assert set(same["outputs"]) == {"heatmap", "size", "offset"}
    assert reference.verdict(same, 0.99)
    assert reference.describe(same, 0.99).startswith("reference check: 4 samples against fp32; heatmap max|diff| 0")
    noisy = dict(ref)
    noisy["fetch_name_1"] = ref["fetch_name_1"] + 1.0  # size head: SQNR far below 30 dB
    bad = reference.compare(noisy, ref, io_, 30.0, logits="")
    assert reference.below_sqnr(bad) == ["size"] and not reference.verdict(bad, 0.99)
    assert "size max|diff| 1, SQNR" in reference.describe(bad, 0.99)
    cls_io = iospec.IO.from_interface(CLS_IFACE)
    z = {"linear_1.tmp_1": np.eye(3, dtype=np.float32), "emb": np.ones((3, 2), np.float32)}
    flipped = {**z, "linear_1.tmp_1": np.eye(3, dtype=np.float32)[[0, 2, 1]]}
    r = reference.compare(flipped, z, cls_io, None, logits="logits")
    assert r["top1_agreement"] == pytest.approx(1 / 3) and r["logits"] == "logits"


def test_detection_readme_and_openapi():
    """A detection package's README and OpenAPI schema: /v1 answers boxes, /v2 and Triton serve the raw
    heads, and the client decodes them with serving.yaml's settings."""
    spec = _spec(DET_IFACE, spec_mod.task_section(DET_IFACE, "interface"))
    doc = {"schema": 1, "name": "m", "precision": "fp32",
           "model": {"format": "pir", "program": "model.json", "params": "model.pdiparams", "variant": "export-fp32",
                     "engine": "paddle_inference"},
           "engine": {"name": "paddle_inference", "why": "an export"},
           "inputs": spec_mod.entries(spec.io.inputs), "outputs": spec_mod.entries(spec.io.outputs),
           "labels": LABELS, "task": spec.doc["task"], "preprocessing": PRE,
           "batching": {"max_batch_size": 8, "max_wait_ms": 2.0},
           "triton": {"model": "m", "onnx_source": "paddle2onnx", "onnx_precision": "fp32", "repository": "triton"}}
    text = readme.render(doc, None)
    assert "\"detections\"" in text and "argmax" not in text
    assert "detection.decode(outputs, settings)" in text and "score_threshold': 0.3" in text
    assert 'fetch=["heatmap", "size", "offset"]' in text
    assert "Triton (and /v2 on `pipe serve`) serves the raw outputs (`heatmap`, `size`, `offset`)" in text
    answer = openapi.predict(spec, SETTINGS)["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer["required"] == ["detections"]
    box = answer["properties"]["detections"]["items"]["items"]
    assert box["properties"]["label"] == {"enum": LABELS} and box["properties"]["score"]["minimum"] == 0.3
    ops = openapi.v2(spec, SETTINGS)
    infer = ops[("/v2/models/{model_name}/infer", "post")]
    req = infer["requestBody"]["content"]["application/json"]["schema"]
    assert "classification" not in req["properties"]["outputs"]["items"]["properties"]["parameters"]["properties"]


def test_triton_config_labels_only_on_logits():
    from pipeline import triton_repo
    from stages import package as package_mod

    t = SimpleNamespace(name="heatmap", type="tensor(float)", shape=["N", 3, 16, 16])
    x = SimpleNamespace(name="image", type="tensor(float)", shape=["N", 3, 64, 64])
    cfg = package_mod.PackageConfig()
    assert "label_filename" not in triton_repo.config("m", [x], [t], None, cfg)
    assert 'label_filename: "labels.txt"' in triton_repo.config("m", [x], [t], "heatmap", cfg)
