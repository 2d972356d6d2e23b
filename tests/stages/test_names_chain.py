"""A model's own names are its public names through the whole chain (issue 51, item 2): the two-input,
two-output factory model (examples/two_inputs.yaml: `img` + `feat` in, a dict of `embedding` + `logits`
out) trained, exported, compressed (--int8, PaddleSlim: a legacy program whose outputs are named after
their ops), packaged on that int8 program and served. Every manifest's interface, serving.yaml, the
client config, the Triton repository (config.pbtxt and the ONNX inside it), /v1, /v2 over HTTP and gRPC
(the real tritonclient) and Paddle Serving's wire list and take `embedding` and `logits`; the program's
names (`fetch_name_<i>`, `linear_*.tmp_*`) appear only as `program_name` in the manifests and
serving.yaml, never in an answer. Requests by those names get the model's outputs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tritonclient_grpc
import tritonclient.http as tritonclient_http
import yaml

from pipeline.cli import main
from tests.multi_io_helpers import EPOCHS, YAML, examples_importable
from tests.serving_helpers import REPO, start_server

pytestmark = pytest.mark.slow(reason="train, export, compress --int8, package and serve a two-output model (~60 s)")
MODEL = "examples.two_inputs.model_build"
INS, OUTS = ["img", "feat"], ["embedding", "logits"]  # the factory's InputSpec names and its dict's keys (sorted)
# names, not int8 accuracy, are tested here: a briefly trained model's int8 gate is opened wide
FAST = ["--backend", "paddle", "--calib-batches", "4", "--set", "compress.openvino=false",
        "--set", "compress.latency_runs=5", "--set", "compress.throughput_runs=2",
        "--set", "compress.min_agreement=0.5", "--set", "compress.min_sqnr_db=1", "--max-drop", "50"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _internal(text: str) -> bool:
    """True when `text` holds a program's own tensor name."""
    return "fetch_name" in text or ".tmp_" in text


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("names-chain") / "run"
    with examples_importable():
        assert main(["train", "--config", str(YAML), "--run", str(run), "--epochs", str(EPOCHS)]) == 0
        assert main(["export", str(run / "train"), "--onnx"]) == 0
        # PaddleSlim's legacy int8 program is the one whose outputs are named after their ops; on a CPU whose int8
        # saturates (no VNNI) compress refuses it as no faster than fp32 there, so its verdict is forced exact:
        # the names are what is tested, on either CPU class
        proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(run / "export"), "--int8",
                               *FAST], capture_output=True, text=True, cwd=REPO, timeout=900, check=False,
                              env={**os.environ, "PIPE_INT8_CAPABILITY": "exact"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert main(["package", str(run / "compress"), "--engine", "paddle", "--variant", "int8-paddle"]) == 0
    return run


@pytest.fixture(scope="module")
def served(run):
    port = _free_port()
    srv = start_server(run / "package", "--grpc-port", str(port))
    yield srv, f"127.0.0.1:{port}"
    assert srv.stop() == 0, "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def ref(run) -> dict[str, np.ndarray]:
    """The package's reference set (real inputs, the fp32 program's outputs), by public name."""
    from safetensors.numpy import load_file

    return {k.split("/", 1)[1]: v for k, v in load_file(str(run / "package/reference.safetensors")).items()}


def test_manifests_serving_yaml_and_client_config_name_the_models_tensors(run):
    for stage in ("train", "export", "compress", "package"):
        iface = _manifest(run / stage)["interface"]
        assert [t["name"] for t in iface["inputs"]] == INS, stage
        assert [t["name"] for t in iface["outputs"]] == OUTS, stage
        assert not any("alias" in t for t in iface["inputs"] + iface["outputs"]), stage
    # the engines' names stay, as program_name, where the program's differ: PIR's and the int8 program's
    assert [t["program_name"] for t in _manifest(run / "export")["interface"]["outputs"]] == \
        ["fetch_name_0", "fetch_name_1"]
    served = [t["program_name"] for t in _manifest(run / "package")["interface"]["outputs"]]
    assert all(".tmp_" in n for n in served), served  # the legacy int8 program names them after their ops
    spec = yaml.safe_load((run / "package/serving.yaml").read_text())
    assert [t["name"] for t in spec["inputs"]] == INS and [t["name"] for t in spec["outputs"]] == OUTS
    assert [t["program_name"] for t in spec["outputs"]] == served
    client = (run / "package/serving_client_conf.prototxt").read_text()
    readme = (run / "package/README.md").read_text()
    assert not _internal(client) and not _internal(readme)
    assert all(f'name: "{n}"' in client for n in INS + OUTS)


def test_the_triton_repository_names_the_models_tensors(run):
    import onnxruntime as ort
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    root = run / "package/triton" / MODEL
    text = (root / "config.pbtxt").read_text()
    conf = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert [i.name for i in conf.input] == INS and [o.name for o in conf.output] == OUTS and not _internal(text)
    assert [o.label_filename for o in conf.output] == ["", "labels.txt"]
    sess = ort.InferenceSession(str(root / "1/model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == sorted(INS)
    assert [o.name for o in sess.get_outputs()] == OUTS


def test_every_endpoint_shows_and_takes_the_models_names(served, ref):
    srv, address = served
    x = {"img": ref["img"][:5], "feat": ref["feat"][:5]}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        info = c.get("/v1/model").json()
        assert [t["name"] for t in info["inputs"]] == INS and [t["name"] for t in info["outputs"]] == OUTS
        v1 = c.post("/v1/predict", json={"inputs": {k: v.tolist() for k, v in x.items()}})
        assert v1.status_code == 200 and not _internal(v1.text), v1.text[:300]
        meta = c.get(f"/v2/models/{MODEL}")
        config = c.get(f"/v2/models/{MODEL}/config")
        assert not _internal(meta.text) and not _internal(config.text)
        assert [t["name"] for t in meta.json()["outputs"]] == OUTS
        assert [t["name"] for t in config.json()["output"]] == OUTS
        body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
                           for k, v in x.items()]}
        plain = c.post(f"/v2/models/{MODEL}/infer", json=body)  # no outputs asked: all, by the model's names
        assert [o["name"] for o in plain.json()["outputs"]] == OUTS
        wire = c.post("/GeneralModelService/inference", json={"tensor": [
            {"name": k, "alias_name": k, "elem_type": 1, "shape": list(v.shape), "float_data": v.ravel().tolist()}
            for k, v in x.items()], "fetch_var_names": OUTS, "log_id": 1})
        tensors = wire.json()["outputs"][0]["tensor"]
        assert [(t["name"], t["alias_name"]) for t in tensors] == [(n, n) for n in OUTS] and not _internal(wire.text)

    h = tritonclient_http.InferenceServerClient(srv.url.removeprefix("http://"))
    g = tritonclient_grpc.InferenceServerClient(address)
    try:
        assert [t["name"] for t in h.get_model_metadata(MODEL)["outputs"]] == OUTS
        assert [t.name for t in g.get_model_metadata(MODEL).outputs] == OUTS
        assert [t.name for t in g.get_model_config(MODEL).config.output] == OUTS
        for mod, client in ((tritonclient_http, h), (tritonclient_grpc, g)):
            inputs = []
            for k, v in x.items():
                inputs.append(mod.InferInput(k, list(v.shape), "FP32"))
                inputs[-1].set_data_from_numpy(v)
            result = client.infer(MODEL, inputs, outputs=[mod.InferRequestedOutput(n) for n in ("logits", "embedding")])
            v1_out = v1.json()
            for n in OUTS:
                got = result.as_numpy(n)
                assert got is not None and got.shape == (5, *ref[n].shape[1:]), (mod.__name__, n)
                assert np.isfinite(got).all()
            np.testing.assert_allclose(result.as_numpy("logits"), np.asarray(v1_out["logits"], np.float32),
                                       rtol=1e-5, atol=1e-5)
    finally:
        h.close()
        g.close()
