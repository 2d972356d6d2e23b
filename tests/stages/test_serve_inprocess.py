"""`--predictor-mode`: onnxruntime and OpenVINO predictors run in the HTTP process (they release the GIL while
they run), Paddle Inference's in child processes (`pipeline/serving/spec.py` `mode_for`). A real onnxruntime
package of the digits run, served both ways by real `pipe serve` processes and run by `pipe predict`: the same
answers, no predictor process in-process, and an engine error in-process fails only its batch."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.errors import InputError
from pipeline.serving import batcher as batcher_mod, predictor as predictor_mod, spec as spec_mod
from stages.serve import ServeConfig
from tests.serving_helpers import start_server
from tests.stages.test_serve import digits, run  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow(reason="packages the digits export for onnxruntime and starts servers")


def test_the_mode_by_engine():
    assert spec_mod.mode_for("onnxruntime") == "in-process"
    assert spec_mod.mode_for("openvino") == "in-process"
    assert spec_mod.mode_for("paddle_inference") == "process"
    assert spec_mod.mode_for("onnxruntime", "process") == "process"
    assert spec_mod.mode_for("openvino", "in-process") == "in-process"
    with pytest.raises(InputError, match=r"--predictor-mode in-process: paddle_inference holds the GIL"):
        spec_mod.mode_for("paddle_inference", "in-process")
    with pytest.raises(InputError, match=r"--predictor-mode: one of auto, process, in-process, got 'threads'"):
        spec_mod.mode_for("onnxruntime", "threads")


@pytest.fixture(scope="module")
def onnx_package(run, tmp_path_factory) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("onnx")
    out = root / "package"
    assert main(["export", str(run / "train"), "--onnx", "--out", str(root / "export")]) == 0
    assert main(["package", str(root / "export"), "--engine", "onnxruntime", "--no-triton", "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())  # a package, verified below by serve
    return out


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_settings_resolve_the_mode(onnx_package, run):  # noqa: F811
    spec = spec_mod.load_package(onnx_package)
    assert spec_mod.settings(ServeConfig(), spec).predictor_mode == "in-process"
    assert spec_mod.settings(ServeConfig(predictor_mode="process"), spec).predictor_mode == "process"
    assert spec.doc["server"]["predictor_mode"] == "auto"  # what `pipe package` writes into serving.yaml
    spec.doc["server"]["predictor_mode"] = "process"  # serving.yaml's server.predictor_mode, below the flag
    assert spec_mod.settings(ServeConfig(), spec).predictor_mode == "process"
    assert spec_mod.settings(ServeConfig(predictor_mode="auto"), spec).predictor_mode == "in-process"
    paddle = spec_mod.load_package(run / "package")  # packaged for Paddle Inference (serving_helpers)
    assert spec_mod.settings(ServeConfig(), paddle).predictor_mode == "process"
    with pytest.raises(InputError, match="paddle_inference holds the GIL"):
        spec_mod.settings(ServeConfig(predictor_mode="in-process"), paddle)


def test_in_process_answers_as_predictor_processes_do(onnx_package, digits):  # noqa: F811
    _, x = digits
    body = {"inputs": x[:24].tolist()}
    inproc = start_server(onnx_package, "--http-workers", "1")
    try:
        assert "predictors in-process" in "".join(inproc.out)
        assert _children(inproc.proc.pid) == []  # no predictor process
        model = httpx.get(inproc.url + "/v1/model", timeout=10).json()
        assert model["batching"]["predictor_mode"] == "in-process"
        got = httpx.post(inproc.url + "/v1/predict", json=body, timeout=30).json()
        v2 = httpx.post(inproc.url + "/v2/models/" + model["name"] + "/infer", timeout=30, json={
            "inputs": [{"name": model["inputs"][0]["name"], "datatype": "FP32", "shape": list(x[:3].shape),
                        "data": x[:3].ravel().tolist()}]})
        assert v2.status_code == 200, v2.text
    finally:
        assert inproc.stop() == 0
    proc = start_server(onnx_package, "--http-workers", "1", "--predictor-mode", "process")
    try:
        assert "predictors process" in "".join(proc.out)
        (child,) = _children(proc.proc.pid)
        assert b"--predictor" in Path(f"/proc/{child}/cmdline").read_bytes()
        want = httpx.post(proc.url + "/v1/predict", json=body, timeout=30).json()
    finally:
        assert proc.stop() == 0
    assert got["labels"] == want["labels"]
    np.testing.assert_allclose(np.array(got["logits"]), np.array(want["logits"]), rtol=0, atol=1e-6)


def test_an_engine_error_in_process_fails_only_its_batch(onnx_package, digits):  # noqa: F811
    """The batcher's thread calls a real in-process onnxruntime engine: a batch it refuses (float64 where the model
    takes float32) gets that error, and the next batch is answered."""
    _, x = digits
    spec = spec_mod.load_package(onnx_package)
    s = spec_mod.settings(ServeConfig(), spec)
    (pred,) = predictor_mod.start_predictors(spec, 1, 1, s.max_batch_size, mode="in-process")
    assert isinstance(pred, predictor_mod.InProcessPredictor) and pred.proc is None
    pred.warm_up()
    runs: list[int] = []

    class Sink:  # the batcher's metrics sink: what it was told
        def observe_batch(self, samples: int, requests: int, seconds: float) -> None:
            runs.append(samples)

    b = batcher_mod.Batcher([pred], spec, s, Sink(), inflight=lambda: 0)
    name = spec.io.inputs[0].name

    async def both() -> tuple[BaseException | None, dict[str, np.ndarray]]:
        loop = asyncio.get_running_loop()
        bad = batcher_mod.Job({name: x[:2].astype(np.float64)}, 2, loop.create_future(), loop)
        good = batcher_mod.Job({name: x[:3]}, 3, loop.create_future(), loop)
        t = threading.Thread(target=lambda: (b._run_batch(pred, [bad]), b._run_batch(pred, [good])))
        t.start()
        try:
            await bad.future
            err = None
        except Exception as e:  # the engine's own error, as the batch's failure
            err = e
        out = await good.future
        t.join()
        return err, out

    err, out = asyncio.run(both())
    pred.close()
    assert err is not None and "float" in str(err).lower()
    assert runs == [3]  # only the good batch ran to the end
    assert next(iter(out.values())).shape[0] == 3


def test_predict_in_process_and_in_processes_write_the_same_rows(onnx_package, tmp_path):
    from PIL import Image

    images = tmp_path / "in"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):
        Image.fromarray(rng.integers(0, 256, (8 + i % 5, 8), dtype=np.uint8)).save(images / f"{i:02d}.png")
    rows = {}
    for mode in ("in-process", "process"):
        out = tmp_path / mode
        assert main(["predict", str(onnx_package), str(images), "--out", str(out), "--predictor-mode", mode]) == 0
        got = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        rows[mode] = {r["source"]: r["answer"] for r in got}
    assert len(rows["process"]) == 40 and rows["in-process"].keys() == rows["process"].keys()
    for k, want in rows["process"].items():
        got = rows["in-process"][k]
        assert got["labels"] == want["labels"]
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-6)
