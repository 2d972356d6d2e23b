"""A real Triton server loads the model repository `pipe package` writes (`package/triton/`), unchanged,
and answers Triton's own client (`tritonclient.http`) as `pipe serve` answers the same package: the
same model metadata but for the platform, logits equal to /v1/predict's within the package's ONNX parity
gate (and exactly those of the package's `model.onnx` run here by onnxruntime), the labels through
`class_count`; for a digits (image) package and a text package (int64 ids, dims [-1]). Triton's
classification strings ("value:index:label") are what `pipe serve` writes from the same values: a package
that serves on onnxruntime (the same model.onnx as its Triton repository) gets byte-identical strings
from both servers, binary and JSON, for counts 1, 3, the class count and past it. A repository whose
config.pbtxt disagrees with its ONNX (an input's name, dims or datatype, an output's dims, no batch dim)
never becomes ready, and the server says why. Triton's model configuration and statistics extensions
answer alike on both servers, to tritonclient.http and tritonclient.grpc: the configuration fields `pipe
serve` sets (exactly config.pbtxt's: name, backend, batching, tensors, labels file, instances) are
tritonserver's, which adds its defaults; after the same requests both count the same samples and requests,
by model and version and for every model, in a statistics document with every key of Triton's. A package
of two named inputs and two outputs (examples/two_inputs.yaml) loads unchanged too, beside one whose ONNX
was made from the legacy program (inputs in reversed order), and answers every output, by name, as
onnxruntime does here.

tritonserver 2.51 comes from the nvidia-pytriton 0.7.0 wheel, which the Makefile installs beside the venv
(--no-deps: never imported, only its files are used):

    pip install --no-deps --target .venv/pytriton nvidia-pytriton==0.7.0

The wheel has only the python backend; tests/triton_backend/onnxruntime/model.py is a python-based
backend named `onnxruntime` that runs `1/model.onnx` and checks the config against the ONNX at load as
Triton's onnxruntime backend does. Without the wheel, or where its binaries cannot run (glibc older than
its manylinux_2_35, no shared libpython), these tests are skipped and say why. Every server here is
started on 127.0.0.1 by the test that uses it and stopped in its fixture's teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonclient_http
import yaml

from pipeline.cli import main
from pipeline.serving import v2
from tests.conftest import arrays, tree_hash
from tests.serving_helpers import REPO, packaged_run, packaged_text_run, start_server
from tests.multi_io_helpers import examples_importable, stand_in_compress, two_inputs_run

pytestmark = pytest.mark.slow(reason="runs a real tritonserver")
PYTRITON = Path(sys.prefix) / "pytriton"  # the venv's; the Makefile's $(STAMP) recipe installs it there
INSTALL = "pip install --no-deps --target .venv/pytriton nvidia-pytriton==0.7.0"
SHIM = REPO / "tests/triton_backend/onnxruntime/model.py"
OUT = "logits"  # the model's output name: the ONNX's (renamed from the program's fetch_name_0) and config.pbtxt's
TEXTS = ["这个东西很好", "差", "我们买了一次还是很满意的东西", "这个" * 20]


@dataclass
class Triton:
    """A tritonserver child process on 127.0.0.1; its stdout and stderr go to `log`."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> int:
        """SIGTERM (clients closed first, or it waits out its 30 s exit timeout and exits 1); kill if stuck."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"tritonserver did not exit within 40 s of SIGTERM: {self.tail()}") from None


@pytest.fixture(scope="session")
def tritonserver(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(the tritonserver binary, a backend directory, its environment), or a skip that says why."""
    server = PYTRITON / "pytriton/tritonserver"
    binary = server / "bin/tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not binary.is_file():
        pytest.skip(f"no tritonserver at {binary}: the nvidia-pytriton wheel is not installed ({INSTALL})")
    if not stub.is_file():
        pytest.skip(f"nvidia-pytriton has no python backend stub for Python {version} ({stub})")
    # The stub embeds this Python: it finds its prefix (the venv, so numpy and onnxruntime) through the
    # `python3` first on PATH, and libpython through LD_LIBRARY_PATH, as pytriton itself arranges.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(PYTRITON / "nvidia_pytriton.libs"),
                                                             sysconfig.get_config_var("LIBDIR"),
                                                             os.environ.get("LD_LIBRARY_PATH")])))
    # Both binaries print their usage only if the dynamic loader accepted them (glibc, libpython).
    for cmd, marker in (([binary, "--help"], "Usage: tritonserver"), ([stub], "Expected 9 arguments")):
        probe = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
        if marker not in probe.stdout + probe.stderr:
            lines = (probe.stderr + probe.stdout).strip().splitlines() or [f"exit {probe.returncode}"]
            pytest.skip(f"{cmd[0].name} cannot run on this machine: {lines[-1]}")
    backends = tmp_path_factory.mktemp("triton-backends")
    # Copies, not symlinks: Triton refuses a backend library whose real path escapes its backend directory.
    (backends / "python").mkdir()
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends/python" / f, backends / "python" / f)
    shutil.copy2(stub, backends / "python/triton_python_backend_stub")
    (backends / "onnxruntime").mkdir()
    shutil.copy2(SHIM, backends / "onnxruntime/model.py")
    return binary, backends, env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_triton(tritonserver: tuple[Path, Path, dict[str, str]], repository: Path, log: Path,
                 *flags: str, timeout: float = 60.0, grpc_port: int = 0) -> Triton:
    """Start tritonserver on `repository` and wait until it is live (it listens only after loading); gRPC
    too, on 127.0.0.1:`grpc_port`, if one is given."""
    binary, backends, env = tritonserver
    port = _free_port()
    grpc = ["--allow-grpc=true", f"--grpc-port={grpc_port}", "--grpc-address=127.0.0.1"] if grpc_port else [
        "--allow-grpc=false"]
    cmd = [str(binary), f"--model-repository={repository}", f"--backend-directory={backends}",
           "--http-address=127.0.0.1", f"--http-port={port}", *grpc, "--allow-metrics=false", *flags]
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    srv = Triton(proc, port, log)
    deadline = time.monotonic() + timeout
    try:
        with httpx.Client(timeout=5) as c:
            while True:
                try:
                    if c.get(f"http://{srv.url}/v2/health/live").status_code == 200:
                        return srv
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise AssertionError(f"tritonserver exited {proc.returncode}: {srv.tail()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"tritonserver not live within {timeout} s: {srv.tail()}")
                time.sleep(0.1)
    except BaseException:
        srv.proc.kill()
        srv.proc.wait(10)
        raise


def _onnx(model: Path):
    """The repository's model.onnx in onnxruntime here: what Triton's outputs must equal exactly."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    return lambda x: sess.run([OUT], {"x": x})[0]


def _v1(url: str, body: dict) -> dict:
    with httpx.Client(timeout=30) as c:
        r = c.post(url + "/v1/predict", json=body)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def _infer(client, name: str, x: np.ndarray, datatype: str, binary: bool = True,
           class_count: int = 0) -> np.ndarray:
    inp = tritonclient_http.InferInput("x", list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    out = tritonclient_http.InferRequestedOutput(OUT, binary_data=binary, class_count=class_count)
    return client.infer(name, [inp], outputs=[out]).as_numpy(OUT)


def _classified(client, name: str, x: np.ndarray, datatype: str, count: int, binary: bool) -> tuple[list, dict]:
    """The classification output of one request: its elements (bytes if binary, str if JSON) and its JSON."""
    inp = tritonclient_http.InferInput("x", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    result = client.infer(name, [inp], outputs=[
        tritonclient_http.InferRequestedOutput(OUT, binary_data=binary, class_count=count)])
    return result.as_numpy(OUT).tolist(), result.get_output(OUT)


def _labels(s: "Served") -> list[str]:
    """The repository's labels.txt, one label a line, as Triton reads it."""
    return (s.package / "triton" / s.name / "labels.txt").read_text(encoding="utf-8").splitlines()


def _as_bytes(top: list) -> list[list[bytes]]:
    return [[t if isinstance(t, bytes) else t.encode() for t in row] for row in top]


def _classes(top: np.ndarray) -> list[list[tuple[float, int, str]]]:
    """Triton's classification output, "score:index:label" per entry (bytes if binary, str if JSON)."""
    def one(t: bytes | str) -> tuple[float, int, str]:
        score, index, label = (t.decode() if isinstance(t, bytes) else t).split(":", 2)
        return float(score), int(index), label

    return [[one(t) for t in row] for row in top]


def _gate(package: Path) -> float:
    """The package's own ONNX parity gate, onnx_parity_tol x max|logit|, as an absolute bound."""
    m = json.loads((package / "manifest.json").read_text())["metrics"]
    return m["onnx_parity_tol"] * m["onnx_max_abs_logit"]


@dataclass
class Served:
    """One package served both ways: `pipe serve` (url) and tritonserver on its triton/ (client)."""

    package: Path
    name: str
    url: str
    client: object
    onnx: object
    triton_url: str  # tritonserver's, http://127.0.0.1:PORT
    grpc: str = ""  # pipe serve's gRPC address, 127.0.0.1:PORT, if `_serve_both(grpc=True)`
    triton_grpc: str = ""  # tritonserver's, likewise


def _serve_both(tritonserver, package: Path, log: Path, grpc: bool = False):
    """Yield a Served (both servers with gRPC too if `grpc`); on teardown both servers stop with exit 0 and
    the package is byte-for-byte unchanged."""
    before = tree_hash(package)
    name = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
    pipe_grpc = triton_grpc = 0
    while grpc and pipe_grpc == triton_grpc:
        pipe_grpc, triton_grpc = _free_port(), _free_port()
    pipe_srv = start_server(package, *(("--grpc-port", str(pipe_grpc)) if grpc else ()))
    try:
        triton = start_triton(tritonserver, package / "triton", log, grpc_port=triton_grpc)
        client = tritonclient_http.InferenceServerClient(triton.url, concurrency=4)
        try:
            yield Served(package, name, pipe_srv.url, client, _onnx(package / "triton" / name / "1/model.onnx"),
                         f"http://{triton.url}", f"127.0.0.1:{pipe_grpc}" if grpc else "",
                         f"127.0.0.1:{triton_grpc}" if grpc else "")
        finally:
            client.close()
            code = triton.stop()
        assert code == 0, triton.tail()
    finally:
        assert pipe_srv.stop() == 0, "".join(pipe_srv.err)[-2000:]
    assert tree_hash(package) == before, "tritonserver or pipe serve changed the package"


@pytest.fixture(scope="module")
def digits_package(tritonserver, trained_digits, tmp_path_factory) -> Path:
    return packaged_run(trained_digits, tmp_path_factory.mktemp("triton-digits")) / "package"


@pytest.fixture(scope="module")
def digits_served(tritonserver, digits_package, tmp_path_factory):
    yield from _serve_both(tritonserver, digits_package, tmp_path_factory.mktemp("triton-log") / "digits.log")


@pytest.fixture(scope="module")
def text_served(tritonserver, tmp_path_factory):
    run = packaged_text_run(tmp_path_factory.mktemp("triton-text"))
    yield from _serve_both(tritonserver, run / "package", tmp_path_factory.mktemp("triton-log") / "text.log")


@pytest.fixture(scope="module")
def x(digits_package) -> np.ndarray:
    """The first 40 digits test images as model inputs (float32 [N, 1, 8, 8]), as test_serve prepares them."""
    from pipeline import data as data_mod

    pre = json.loads((digits_package / "manifest.json").read_text())["interface"]["preprocessing"]
    images, _ = arrays(data_mod.load(data_mod.DataConfig(source="digits")).test)
    return data_mod.prepare(images[:40], pre).astype(np.float32)


def _same_metadata(s: Served) -> None:
    """Both servers describe the model alike to a v2 client; only the platform names the engine."""
    with httpx.Client(timeout=30) as c:
        pipe_meta = c.get(f"{s.url}/v2/models/{s.name}").json()
    meta = s.client.get_model_metadata(s.name)
    assert meta["platform"] == "onnxruntime_onnx" and s.client.is_model_ready(s.name, "1")
    assert {**meta, "platform": None} == {**pipe_meta, "platform": None}


# ------------------------------------------------------------------ the image package


def test_image_repository_loads_unchanged_and_answers_as_pipe_serve(digits_served, x):
    s = digits_served
    assert s.client.is_server_live() and s.client.is_server_ready()
    _same_metadata(s)
    bound = _gate(s.package)
    for batch in (x[:1], x[1:33]):  # one sample; max_batch_size (32)
        v1 = _v1(s.url, {"inputs": batch.tolist()})
        want = np.asarray(v1["logits"], np.float32)
        local = s.onnx(batch)
        for binary in (True, False):
            got = _infer(s.client, s.name, batch, "FP32", binary)
            assert got.dtype == np.float32 and got.shape == want.shape == (len(batch), 10)
            np.testing.assert_array_equal(got, local)
            assert float(np.abs(got - want).max()) <= bound, (np.abs(got - want).max(), bound)
        # Triton's classification extension over labels.txt: "score:index:label", top 1.
        top = _infer(s.client, s.name, batch, "FP32", class_count=1)
        assert top.shape == (len(batch), 1)
        parsed = [row[0] for row in _classes(top)]
        assert [label for _, _, label in parsed] == v1["labels"]
        assert [i for _, i, _ in parsed] == local.argmax(1).tolist()
        np.testing.assert_allclose([v for v, _, _ in parsed], local.max(1), rtol=1e-6)
        # pipe serve writes Triton's strings from Triton's values; its own values (Paddle here, not the
        # ONNX) may differ in the sixth decimal, so only the top class is compared across the servers.
        pipe = tritonclient_http.InferenceServerClient(s.url.removeprefix("http://"))
        for count in (3, 11):
            top, _ = _classified(s.client, s.name, batch, "FP32", count, True)
            assert _as_bytes(top) == [v2.classify(row[None], count, _labels(s)) for row in local]
            mine, _ = _classified(pipe, s.name, batch, "FP32", count, True)
            assert [row[0].split(b":")[1:] for row in mine] == [row[0].split(b":")[1:] for row in top]
        pipe.close()


@pytest.fixture(scope="module")
def onnx_package(tritonserver, trained_digits, tmp_path_factory) -> Path:
    """A digits package that serves on onnxruntime (`pipe export --onnx`, `pipe package --engine
    onnxruntime`): pipe serve runs the model.onnx its Triton repository holds (there with its output
    renamed from the program's fetch_name_0 to the model's name), so both compute the same values."""
    import onnx

    run = tmp_path_factory.mktemp("triton-onnx") / "run"
    shutil.copytree(trained_digits, run)
    assert main(["export", str(run / "train"), "--onnx"]) == 0
    assert main(["package", str(run / "export"), "--engine", "onnxruntime"]) == 0
    package = run / "package"
    assert yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))["model"]["engine"] == "onnxruntime"
    given, served = (onnx.load(str(p)) for p in (package / "model.onnx", package / "triton/digits_cnn/1/model.onnx"))
    assert [o.name for o in given.graph.output] == ["fetch_name_0"] and [o.name for o in served.graph.output] == [OUT]
    assert [i.SerializeToString() for i in served.graph.initializer] == \
        [i.SerializeToString() for i in given.graph.initializer]
    assert [(n.op_type, list(n.attribute)) for n in served.graph.node] == \
        [(n.op_type, list(n.attribute)) for n in given.graph.node]
    return package


@pytest.fixture(scope="module")
def onnx_served(tritonserver, onnx_package, tmp_path_factory):
    """The onnxruntime package served both ways: any difference in the classification strings is the
    formatting's."""
    yield from _serve_both(tritonserver, onnx_package, tmp_path_factory.mktemp("triton-log") / "onnx.log")


def _post(url: str, count: object, x: np.ndarray) -> httpx.Response:
    """A JSON v2 request asking for `count` classes (any JSON value) of the output."""
    with httpx.Client(timeout=30) as c:
        return c.post(f"{url}/v2/models/digits_cnn/infer", json={
            "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
            "outputs": [{"name": OUT, "parameters": {"classification": count}}]})


def test_classification_strings_are_byte_identical(onnx_served, x):
    """The same request to tritonserver and to pipe serve: the same values, the same BYTES output (name,
    datatype, shape, binary_data_size) and byte-identical "value:index:label" strings, binary and JSON.
    Both list the extension. Counts that are not integers >= 0: Triton 500, pipe serve 400."""
    s = onnx_served
    pipe = tritonclient_http.InferenceServerClient(s.url.removeprefix("http://"))
    try:
        assert "classification" in s.client.get_server_metadata()["extensions"]
        assert "classification" in pipe.get_server_metadata()["extensions"]
        for batch in (x[:1], x[1:33], x[33:40]):
            np.testing.assert_array_equal(_infer(pipe, s.name, batch, "FP32"),
                                          _infer(s.client, s.name, batch, "FP32"))
            for count in (1, 3, 10, 11):
                for binary in (True, False):
                    theirs, their_out = _classified(s.client, s.name, batch, "FP32", count, binary)
                    mine, my_out = _classified(pipe, s.name, batch, "FP32", count, binary)
                    assert my_out == their_out and len(theirs) == len(batch)
                    assert all(isinstance(t, bytes if binary else str) for row in theirs + mine for t in row)
                    assert mine == theirs, (count, binary)
        batch = x[:2]
        # 0 is the output itself on both.
        theirs, mine = _post(s.triton_url, 0, batch), _post(s.url, 0, batch)
        assert theirs.status_code == mine.status_code == 200 and theirs.json() == mine.json()
        for bad in (-1, 1.5, 3.0, "3", True, None):
            theirs, mine = _post(s.triton_url, bad, batch), _post(s.url, bad, batch)
            assert theirs.status_code == 500 and "Unable to set 'classification'" in theirs.json()["error"], theirs.text
            assert mine.status_code == 400 and "classification" in mine.json()["error"], mine.text
        # Triton keeps the count in 32 bits: 2**32 silently answers the raw output there; refused here.
        theirs, mine = _post(s.triton_url, 2**32, batch), _post(s.url, 2**32, batch)
        assert theirs.status_code == 200 and theirs.json()["outputs"][0]["datatype"] == "FP32"
        assert mine.status_code == 400
    finally:
        pipe.close()


@pytest.fixture(scope="module")
def onnx_grpc_served(tritonserver, onnx_package, tmp_path_factory):
    """The onnxruntime package served both ways again, gRPC too on both, for the extensions' test alone: its
    statistics count only that test's requests."""
    yield from _serve_both(tritonserver, onnx_package, tmp_path_factory.mktemp("triton-log") / "onnx-grpc.log",
                           grpc=True)


def _config(c) -> dict:
    """The fields of a ModelConfig that both servers set: what must be the same on both."""
    from tritonclient.grpc import model_config_pb2 as pb

    assert c.HasField("dynamic_batching"), c
    return {"name": c.name, "backend": c.backend, "max_batch_size": c.max_batch_size,
            "input": [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in c.input],
            "output": [(t.name, pb.DataType.Name(t.data_type), list(t.dims), t.label_filename) for t in c.output],
            "max_queue_delay_microseconds": c.dynamic_batching.max_queue_delay_microseconds,
            "instance_group": [(g.count, pb.ModelInstanceGroup.Kind.Name(g.kind)) for g in c.instance_group]}


def _stats_after(client, name: str, samples: int, requests: int) -> dict:
    """tritonclient.http's statistics of `name` once they count `samples` and `requests` (Triton records a
    request after its response is sent: the last one may lag the answer)."""
    deadline = time.monotonic() + 10
    while True:
        stats = client.get_inference_statistics(name)
        one = stats["model_stats"][0]
        if (one["inference_count"], one["inference_stats"]["success"]["count"]) == (samples, requests) \
                or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_model_configuration_and_statistics_answer_as_tritonserver(onnx_grpc_served, x):
    """The same package's configuration from both servers, over HTTP and gRPC: the same name, backend,
    batching, tensors, labels file and instances. The same requests to both (five of one sample, one of
    four): the same model, version, samples and requests in the statistics, over HTTP and gRPC, in a
    document with every key of Triton's."""
    import tritonclient.grpc as tritonclient_grpc
    from google.protobuf import json_format, text_format

    from tests.serving_helpers import triton_model_config_class

    s = onnx_grpc_served
    ModelConfig = triton_model_config_class()
    pipe = tritonclient_http.InferenceServerClient(s.url.removeprefix("http://"))
    grpcs = {"pipe": tritonclient_grpc.InferenceServerClient(s.grpc),
             "triton": tritonclient_grpc.InferenceServerClient(s.triton_grpc)}
    https = {"pipe": pipe, "triton": s.client}
    try:
        # The configuration. tritonserver answers config.pbtxt with the defaults it fills in at load, which
        # pipe serve does not report: platform (onnxruntime_onnx, from the backend), runtime (model.py: this
        # test's python shim of the onnxruntime backend), version_policy, default_model_filename, optimization,
        # the tensors' format/is_shape_tensor/allow_ragged_batch/optional/is_non_linear_format_io,
        # dynamic_batching's preferred_batch_size ([max_batch_size]), preserve_ordering and priorities, the
        # instance group's name (digits_cnn_0), empty batch_input/batch_output/parameters/model_warmup. pipe
        # serve reports its own serving: backend = its engine, max_batch_size / max_queue_delay / instance
        # count = --max-batch-size / --max-wait-ms / its predictors, the package's defaults here, so they equal
        # config.pbtxt's. protobuf's JSON (gRPC as_json) would drop zeros: the protobufs are compared instead.
        pbtxt = (s.package / "triton" / s.name / "config.pbtxt").read_text(encoding="utf-8")
        want = _config(text_format.Parse(pbtxt, ModelConfig()))
        assert want["input"] == [("x", "TYPE_FP32", [1, 8, 8])] and want["instance_group"] == [(1, "KIND_CPU")]
        for server in ("pipe", "triton"):
            doc = https[server].get_model_config(s.name)
            assert doc == https[server].get_model_config(s.name, "1"), server
            # HTTP's JSON holds only ModelConfig's fields (ParseDict refuses any other), numbers as numbers.
            assert _config(json_format.ParseDict(doc, ModelConfig())) == want, (server, doc)
            assert isinstance(doc["input"][0]["dims"][0], int) and isinstance(
                doc["dynamic_batching"]["max_queue_delay_microseconds"], int), (server, doc)
            assert _config(grpcs[server].get_model_config(s.name).config) == want, server
            assert _config(grpcs[server].get_model_config(s.name, "1").config) == want, server
        # pipe serve sets exactly config.pbtxt's fields, nothing else, over both protocols.
        assert json_format.ParseDict(pipe.get_model_config(s.name), ModelConfig()) == text_format.Parse(
            pbtxt, ModelConfig()) == grpcs["pipe"].get_model_config(s.name).config

        # The statistics, after the same requests to each (sequential: batches may still differ).
        batches = [x[i:i + 1] for i in range(5)] + [x[5:9]]
        samples, requests = sum(len(b) for b in batches), len(batches)
        for b in batches:
            np.testing.assert_array_equal(_infer(pipe, s.name, b, "FP32"), _infer(s.client, s.name, b, "FP32"))
        docs = {k: _stats_after(c, s.name, samples, requests) for k, c in https.items()}
        mine, theirs = docs["pipe"], docs["triton"]

        def keys(doc: dict) -> dict:
            one = doc["model_stats"][0]
            return {"": set(doc), "model": set(one), "inference": set(one["inference_stats"]),
                    "batch": set().union(*(set(b) for b in one["batch_stats"]))}

        assert all(keys(theirs)[k] <= keys(mine)[k] for k in keys(theirs)), (keys(theirs), keys(mine))
        assert len(mine["model_stats"]) == len(theirs["model_stats"]) == 1
        for server, doc in docs.items():
            one = doc["model_stats"][0]
            assert (one["name"], one["version"], one["inference_count"]) == (s.name, "1", samples), (server, one)
            counts = {k: v["count"] for k, v in one["inference_stats"].items()}
            # each request, whatever the batches: counted once as a success, once in the queue and once in
            # each compute phase (charged its batch's time)
            assert counts == {"success": requests, "fail": 0, "queue": requests, "compute_input": requests,
                              "compute_infer": requests, "compute_output": requests, "cache_hit": 0,
                              "cache_miss": 0}, (server, counts)
            assert 1 <= one["execution_count"] <= requests and one["last_inference"] > 0, (server, one)
            assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in one["batch_stats"]) == samples, server
            assert sum(b["compute_infer"]["count"] for b in one["batch_stats"]) == one["execution_count"], server
            # gRPC's ModelStatistics: the same document (no request in between), by name and for all models
            for got in (grpcs[server].get_inference_statistics(s.name), grpcs[server].get_inference_statistics()):
                assert len(got.model_stats) == 1, (server, got)
                g = got.model_stats[0]
                assert (g.name, g.version, g.inference_count, g.execution_count) == (
                    s.name, "1", samples, one["execution_count"]), (server, g)
                assert {k: getattr(g.inference_stats, k).count for k in counts} == counts, (server, g)
        # Every model's, GET /v2/models/stats (get_inference_statistics() without a name): the one model's.
        assert pipe.get_inference_statistics() == mine and s.client.get_inference_statistics() == theirs
    finally:
        pipe.close()
        for g in grpcs.values():
            g.close()


# ------------------------------------------------------------------ the text package


def test_text_repository_takes_token_ids_and_answers_as_pipe_serve(text_served):
    from pipeline import data as data_mod
    from pipeline.serving.spec import check_vocab

    s = text_served
    _same_metadata(s)
    text = yaml.safe_load((s.package / "serving.yaml").read_text(encoding="utf-8"))["text"]
    ids = data_mod.encode_texts(TEXTS, check_vocab(s.package / text["vocab_file"], text), text["max_len"])
    # Triton has no tokenizer: the ids padded to max_len, as the package README says, are what /v1 runs.
    v1 = _v1(s.url, {"text": TEXTS})
    want = np.asarray(v1["logits"], np.float32)
    for batch, rows in ((ids[:1], want[:1]), (ids, want)):
        got = _infer(s.client, s.name, batch, "INT64")
        assert got.dtype == np.float32 and got.shape == rows.shape
        np.testing.assert_array_equal(got, s.onnx(batch))
        assert float(np.abs(got - rows).max()) <= _gate(s.package), (np.abs(got - rows).max(), _gate(s.package))
    top = _classes(_infer(s.client, s.name, ids, "INT64", binary=False, class_count=2))  # JSON this time
    assert [row[0][2] for row in top] == v1["labels"]
    labels = (s.package / "triton" / s.name / "labels.txt").read_text(encoding="utf-8").split()
    assert all(sorted(label for _, _, label in row) == sorted(labels) for row in top)
    assert all(labels[i] == label for row in top for _, i, label in row)
    theirs, _ = _classified(s.client, s.name, ids, "INT64", 2, True)  # pipe serve's strings from Triton's values
    assert _as_bytes(theirs) == [v2.classify(row[None], 2, labels) for row in s.onnx(ids)]
    pipe = tritonclient_http.InferenceServerClient(s.url.removeprefix("http://"))
    mine, _ = _classified(pipe, s.name, ids, "INT64", 2, True)
    pipe.close()
    index_label = [[[t.split(b":", 1)[1] for t in row] for row in top] for top in (mine, theirs)]
    assert index_label[0] == index_label[1]  # values may differ in the last decimal: Paddle vs the ONNX
    # dims [-1]: other lengths run too (5 ids unpadded, 40 past max_len), as in the ONNX.
    for batch in (ids[:, :5].copy(), np.tile(ids[:, :5], (1, 8))):
        np.testing.assert_array_equal(_infer(s.client, s.name, batch, "INT64"), s.onnx(batch))


# ------------------------------------------------------------------ two named inputs, two outputs


@pytest.fixture(scope="module")
def two_inputs_triton(tritonserver, tmp_path_factory):
    """One tritonserver on two repositories, both as `pipe package` wrote them: the two-input example's
    package (its ONNX from `pipe export --onnx`) and an int8 stand-in package of it whose Triton ONNX compress
    made from the legacy program (model `two_legacy`; outputs renamed to the legacy program's names). Yields
    (client, {model: its repository directory}); the packages are unchanged afterwards."""
    run = two_inputs_run(tmp_path_factory.mktemp("triton-multi-io"))
    comp = stand_in_compress(run, run.parent / "compress")
    legacy = run.parent / "package-legacy"
    with examples_importable():
        assert main(["package", str(comp), "--precision", "int8", "--name", "two_legacy", "--out", str(legacy)]) == 0
    name = yaml.safe_load((run / "package/serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
    repos = {name: run / "package/triton", "two_legacy": legacy / "triton"}
    before = {k: tree_hash(v) for k, v in repos.items()}
    triton = start_triton(tritonserver, repos[name], run.parent / "triton.log",
                          f"--model-repository={repos['two_legacy']}")
    client = tritonclient_http.InferenceServerClient(triton.url)
    try:
        yield client, {k: v / k for k, v in repos.items()}
    finally:
        client.close()
        code = triton.stop()
    assert code == 0, triton.tail()
    assert {k: tree_hash(v) for k, v in repos.items()} == before, "tritonserver changed a package"


def test_two_input_repositories_load_unchanged_and_answer_every_output_by_name(two_inputs_triton):
    """Both models READY; their metadata lists both inputs and both outputs under config.pbtxt's names;
    inputs sent in reversed order, every output equals onnxruntime's on the repository's model.onnx fed
    and fetched by name (exactly), a request for one output gets that one, and labels come with the
    logits output only."""
    import onnxruntime as ort

    client, models = two_inputs_triton
    rng = np.random.RandomState(0)
    feeds = {"img": rng.standard_normal((5, 1, 8, 8)).astype(np.float32),
             "feat": rng.standard_normal((5, 4)).astype(np.float32)}
    labels = ["top-left", "top-right", "bottom-left", "bottom-right"]
    for name, root in models.items():
        assert client.is_model_ready(name), name
        served = yaml.safe_load((root.parent.parent / "serving.yaml").read_text(encoding="utf-8"))["outputs"]
        outs = [o["name"] for o in served]
        logits = next(o["name"] for o in served if o.get("role") == "logits")
        meta = client.get_model_metadata(name)
        assert {i["name"]: i["shape"] for i in meta["inputs"]} == {"img": [-1, 1, 8, 8], "feat": [-1, 4]}
        assert [(o["name"], o["shape"]) for o in meta["outputs"]] == list(zip(outs, [[-1, 16], [-1, 4]]))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(root / "1/model.onnx"), so, providers=["CPUExecutionProvider"])
        want = dict(zip(outs, sess.run(outs, feeds)))
        inputs = []
        for key in ("feat", "img"):  # not the config's order
            inputs.append(tritonclient_http.InferInput(key, list(feeds[key].shape), "FP32"))
            inputs[-1].set_data_from_numpy(feeds[key])
        result = client.infer(name, inputs)
        for out in outs:
            np.testing.assert_array_equal(result.as_numpy(out), want[out])
        one = client.infer(name, inputs, outputs=[tritonclient_http.InferRequestedOutput(logits)])
        assert [o["name"] for o in one.get_response()["outputs"]] == [logits]
        np.testing.assert_array_equal(one.as_numpy(logits), want[logits])
        top = client.infer(name, inputs, outputs=[tritonclient_http.InferRequestedOutput(logits, class_count=1)])
        assert [_classes(top.as_numpy(logits))[i][0][1:] for i in range(5)] == [
            (int(k), labels[k]) for k in want[logits].argmax(1)]


@pytest.fixture(scope="module")
def detection_triton(tritonserver, tmp_path_factory):
    """A detection package (examples/detection.yaml, 1 epoch on 60 generated images, fp32) and one
    tritonserver on its repository, unchanged. Yields (client, model name, repository model dir, package)."""
    tmp = tmp_path_factory.mktemp("triton-detection")
    run = tmp / "run"
    assert main(["train", "--config", str(REPO / "examples/detection.yaml"), "--run", str(run), "--epochs", "1",
                 "--set", "data.shapes_images=60", "--set", f"data.cache_dir={tmp / 'cache'}",
                 # a 1-epoch model scores below the example's 0.3: keep low-scoring boxes so there are some
                 "--set", "postprocess.score_threshold=0.01", "--set", "postprocess.max_detections=10"]) == 0
    assert main(["export", str(run / "train")]) == 0
    assert main(["package", str(run / "export"), "--engine", "paddle"]) == 0
    package = run / "package"
    name = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
    before = tree_hash(package / "triton")
    triton = start_triton(tritonserver, package / "triton", tmp / "triton.log")
    client = tritonclient_http.InferenceServerClient(triton.url)
    try:
        yield client, name, package / "triton" / name, package
    finally:
        client.close()
        code = triton.stop()
    assert code == 0, triton.tail()
    assert tree_hash(package / "triton") == before, "tritonserver changed the package"


def test_detection_repository_serves_the_raw_heads(detection_triton):
    """A detector's repository loads unchanged and answers its three raw heads by name, exactly as
    onnxruntime runs the repository's model.onnx here (no labels file: Triton serves no classification for
    a model without logits); decoded with serving.yaml's settings as the package README tells a Triton
    client, they give the boxes `pipe serve` answers on /v1 for the same tensors."""
    from pipeline.tasks import detection as det

    client, name, root, package = detection_triton
    assert client.is_model_ready(name)
    assert not (root / "labels.txt").exists() and "label_filename" not in (root / "config.pbtxt").read_text()
    doc = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    outs = [o["name"] for o in doc["outputs"]]
    aliases = {o["name"]: o.get("alias") or o["name"] for o in doc["outputs"]}
    assert sorted(aliases.values()) == ["heatmap", "offset", "size"]
    meta = client.get_model_metadata(name)
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [
        (o, [-1, 3 if aliases[o] == "heatmap" else 2, 16, 16]) for o in outs]
    x = np.random.RandomState(0).standard_normal((3, 3, 64, 64)).astype(np.float32)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(root / "1/model.onnx"), so, providers=["CPUExecutionProvider"])
    want = dict(zip(outs, sess.run(outs, {meta["inputs"][0]["name"]: x})))
    inp = tritonclient_http.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(name, [inp])
    for out in outs:
        np.testing.assert_array_equal(result.as_numpy(out), want[out])
    settings = doc["task"]["settings"]
    assert settings == {"score_threshold": 0.01, "nms_iou": 0.6, "max_detections": 10}
    srv = start_server(package)
    try:
        v1 = _v1(srv.url, {"inputs": x.tolist()})
    finally:
        assert srv.stop() == 0
    mine = det.decode({aliases[o]: result.as_numpy(o) for o in outs}, settings)
    assert all(len(b) > 0 for b in mine)
    assert [[d["box"] for d in image] for image in v1["detections"]] == [
        np.round(b[:, :4].astype(np.float64), 2).tolist() for b in mine]


# ------------------------------------------------------------------ edited copies: the backend's own checks


_BAD = {  # model name -> (edit of the package's config.pbtxt, what the load error must say)
    "bad_input_name": (lambda c: c.replace('name: "x"', 'name: "image"'),
                       "unexpected inference input 'image', allowed inputs are: x"),
    "bad_input_dims": (lambda c: c.replace("dims: [ 1, 8, 8 ]", "dims: [ 1, 8, 7 ]"),
                       "tensor 'x': the model expects 4 dimensions (shape [-1,1,8,8]) but the model configuration "
                       "specifies 4 dimensions (shape [-1,1,8,7])"),
    "bad_input_dtype": (lambda c: c.replace("data_type: TYPE_FP32\n    dims: [ 1", "data_type: TYPE_INT64\n    dims: [ 1"),
                        "configuration expects datatype TYPE_INT64 for input 'x', model provides TYPE_FP32"),
    "bad_output_dims": (lambda c: c.replace("dims: [ 10 ]", "dims: [ 9 ]"),
                        f"tensor '{OUT}': the model expects 2 dimensions (shape [-1,10]) but the model "
                        "configuration specifies 2 dimensions (shape [-1,9])"),
    "no_batch_dim": (lambda c: c.replace("max_batch_size: 32", "max_batch_size: 0").split("dynamic_batching")[0],
                     "tensor 'x': the model expects 4 dimensions (shape [-1,1,8,8]) but the model configuration "
                     "specifies 3 dimensions (shape [1,8,8])"),
}
# A copy that waits 300 ms for more requests, so concurrent ones reach the backend in one execute call.
_SLOW_BATCHER = ("digits_batched", lambda c: c.replace("max_queue_delay_microseconds: 2000",
                                                       "max_queue_delay_microseconds: 300000"))


@pytest.fixture(scope="module")
def edited(tritonserver, digits_package, tmp_path_factory):
    """One tritonserver (--exit-on-error=false) on a repository of the package's model: an unchanged copy,
    the _BAD edits and the slow batcher; yields (client, server, the ONNX run here)."""
    src = digits_package / "triton/digits_cnn"
    repo = tmp_path_factory.mktemp("triton-edited") / "repo"
    shutil.copytree(src, repo / "digits_cnn")  # the unchanged copy loads: the edits are what fails
    config = (src / "config.pbtxt").read_text(encoding="utf-8")
    for name, edit in [*((n, e) for n, (e, _) in _BAD.items()), _SLOW_BATCHER]:
        shutil.copytree(src, repo / name)
        renamed = config.replace('name: "digits_cnn"', f'name: "{name}"')
        assert edit(renamed) != renamed, name
        (repo / name / "config.pbtxt").write_text(edit(renamed), encoding="utf-8")
    triton = start_triton(tritonserver, repo, repo.parent / "triton.log", "--exit-on-error=false")
    client = tritonclient_http.InferenceServerClient(triton.url, concurrency=8)
    try:
        yield client, triton, _onnx(src / "1/model.onnx")
    finally:
        client.close()
        code = triton.stop()
    assert code == 0, triton.tail()


def test_a_config_that_disagrees_with_the_onnx_never_becomes_ready(edited):
    client, triton, _ = edited
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["digits_cnn"]["state"] == "READY" and client.is_model_ready("digits_cnn")
    assert client.is_server_live() and not client.is_server_ready()  # strict readiness: every model
    log = triton.tail(10**6)
    for name, (_, message) in _BAD.items():
        assert not client.is_model_ready(name)
        assert index[name]["state"] == "UNAVAILABLE" and message in index[name]["reason"], index[name]
        assert message in log, (name, log[-3000:])


def test_requests_batched_together_are_split_back_to_their_callers(edited, x):
    """Eight requests of 1..8 samples at once: the batcher hands the backend several in one execute call
    (the statistics show a batch larger than any one request) and each caller gets exactly its own rows."""
    client, _, onnx = edited
    name = _SLOW_BATCHER[0]
    starts = np.cumsum([0, *range(1, 9)])
    pending = []
    for a, b in zip(starts[:-1], starts[1:]):
        inp = tritonclient_http.InferInput("x", [int(b - a), 1, 8, 8], "FP32").set_data_from_numpy(x[a:b])
        pending.append((a, b, client.async_infer(name, [inp])))
    for a, b, request in pending:
        np.testing.assert_array_equal(request.get_result().as_numpy(OUT), onnx(x[a:b]))
    # Triton records a request's statistics after its response is sent: the last one may lag the answer
    deadline = time.monotonic() + 10
    while (stats := client.get_inference_statistics(name)["model_stats"][0])["inference_count"] < 36 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats["inference_count"] == 36 and stats["execution_count"] < 8, stats
    assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 8, stats["batch_stats"]
