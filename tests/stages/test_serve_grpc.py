"""The Open Inference Protocol over gRPC (`pipe serve --grpc-port`), Triton's model configuration and
statistics extensions, and the collector's pauses in /metrics, against a real server on 127.0.0.1
started here and Triton's own clients (`tritonclient.grpc`, `tritonclient.http`).

gRPC answers health, readiness, server and model metadata and the model configuration as /v2 over HTTP
does; its outputs (raw_input_contents, and the typed contents a hand-built request carries) are exactly
/v2 HTTP's and /v1's logits, classification strings byte for byte; bad inputs get INVALID_ARGUMENT with
/v2's one-line message naming the input, an unknown model NOT_FOUND, a message over the body cap
RESOURCE_EXHAUSTED, and the server serves on. The statistics extension counts every inference request
of every protocol, the same over HTTP and gRPC. The port flags fail in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tritonclient_grpc
import tritonclient.http as tritonclient_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
import yaml

from tests.serving_helpers import REPO, metric, start_server
from tests.stages.test_serve import MARK, digits, run  # noqa: F401 (fixtures)

MODEL, OUT = "digits_cnn", "logits"
CAP = 64 << 10  # this server's body cap: 32 digits (8 KB raw, ~20 KB JSON) fit, 300 (77 KB raw) do not


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(run):
    """(server, gRPC address) with --grpc-port and a 64 KB body cap; stopped by SIGTERM, exit 0."""
    port = _free_port()
    srv = start_server(run / "package", "--grpc-port", str(port), "--max-body-bytes", str(CAP))
    yield srv, f"127.0.0.1:{port}"
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "Traceback" not in "".join(srv.err) and "internal error" not in "".join(srv.err), "".join(srv.err)[-2000:]


@pytest.fixture(scope="module")
def clients(served):
    srv, address = served
    g = tritonclient_grpc.InferenceServerClient(address)
    h = tritonclient_http.InferenceServerClient(srv.url.removeprefix("http://"))
    yield g, h, srv
    g.close()
    h.close()


@pytest.fixture(scope="module")
def x(digits) -> np.ndarray:
    return digits[1][:40].astype(np.float32)


def _grpc(g, x: np.ndarray, name: str = "x", datatype: str = "FP32", class_count: int = 0, model: str = MODEL):
    inp = tritonclient_grpc.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    out = tritonclient_grpc.InferRequestedOutput(OUT, class_count=class_count)
    return g.infer(model, [inp], outputs=[out]).as_numpy(OUT)


def _http(h, x: np.ndarray, class_count: int = 0) -> np.ndarray:
    inp = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = tritonclient_http.InferRequestedOutput(OUT, binary_data=True, class_count=class_count)
    return h.infer(MODEL, [inp], outputs=[out]).as_numpy(OUT)


_INT64 = {"dims", "shape", "max_queue_delay_microseconds", "count", "ns", "inference_count", "execution_count",
          "last_inference", "batch_size"}  # the int64 fields protobuf's JSON writes as strings


def _ints(doc, key: str = ""):
    """gRPC's JSON (protobuf's: int64 as strings) with numbers as numbers, as the HTTP extensions answer."""
    if isinstance(doc, dict):
        return {k: _ints(v, k) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_ints(v, key) for v in doc]
    return int(doc) if key in _INT64 and isinstance(doc, str) else doc


def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    assert MARK not in e.value.message() and "Traceback" not in e.value.message()
    return getattr(grpc.StatusCode, e.value.status().removeprefix("StatusCode.")), e.value.message()


@pytest.mark.slow
def test_health_metadata_and_config_answer_as_http(clients):
    g, h, srv = clients
    assert g.is_server_live() and g.is_server_ready() and g.is_model_ready(MODEL) and g.is_model_ready(MODEL, "1")
    meta = g.get_server_metadata(as_json=True)
    assert meta["name"] == "pipe" and meta["extensions"] == h.get_server_metadata()["extensions"]
    assert {"model_configuration", "statistics"} <= set(meta["extensions"])
    assert _ints(g.get_model_metadata(MODEL, as_json=True)) == h.get_model_metadata(MODEL)
    config = h.get_model_config(MODEL)
    assert _ints(g.get_model_config(MODEL, as_json=True)["config"]) == config == h.get_model_config(MODEL, "1")
    # The served model: the package's tensors and labels, this server's batching (its package defaults).
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}]
    assert config["output"] == [{"name": OUT, "data_type": "TYPE_FP32", "dims": [10], "label_filename": "labels.txt"}]
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        model = c.get("/v1/model").json()
        assert config["backend"] == model["engine"]["engine"]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == round(
            model["batching"]["max_wait_ms"] * 1000)
        assert c.get(f"/v2/models/{MODEL}/versions/2/config").status_code == 404
        assert c.get("/v2/models/other/stats").json() == {"error": "unknown model; this server serves 'digits_cnn'"}


@pytest.mark.slow
def test_outputs_equal_v1_and_v2_http(clients, x):
    g, h, srv = clients
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for batch in (x[:1], x[1:33]):
            r = c.post("/v1/predict", json={"inputs": batch.tolist()})
            assert r.status_code == 200, r.text[:300]
            got = _grpc(g, batch)
            assert got.dtype == np.float32 and got.shape == (len(batch), 10)
            np.testing.assert_array_equal(got, _http(h, batch))
            np.testing.assert_array_equal(got, np.asarray(r.json()["logits"], np.float32))
            for count in (1, 3, 11):  # Triton's classification strings, past the class count too
                top = _grpc(g, batch, class_count=count)
                assert top.shape == (len(batch), min(count, 10))
                assert top.tolist() == _http(h, batch, class_count=count).tolist()


@pytest.mark.slow
def test_typed_contents_equal_raw_contents(served, x):
    """A request carrying InferTensorContents.fp32_contents (what tritonclient never sends) runs as raw."""
    _, address = served
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        batch = x[:4]
        req = service_pb2.ModelInferRequest(model_name=MODEL, id="r-7")
        req.inputs.add(name="x", datatype="FP32", shape=list(batch.shape)).contents.fp32_contents.extend(
            batch.ravel().tolist())
        resp = stub.ModelInfer(req, timeout=30)
        assert (resp.model_name, resp.model_version, resp.id) == (MODEL, "1", "r-7")
        assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [(OUT, "FP32", [4, 10])]
        typed = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(4, 10)
        raw = service_pb2.ModelInferRequest(model_name=MODEL)
        raw.inputs.add(name="x", datatype="FP32", shape=list(batch.shape))
        raw.raw_input_contents.append(batch.tobytes())
        np.testing.assert_array_equal(typed, np.frombuffer(stub.ModelInfer(raw, timeout=30).raw_output_contents[0],
                                                           "<f4").reshape(4, 10))
        # raw contents for some inputs only: one entry per input, in order
        bad = service_pb2.ModelInferRequest(model_name=MODEL)
        bad.inputs.add(name="x", datatype="FP32", shape=list(batch.shape))
        bad.raw_input_contents.extend([batch.tobytes(), b"\0" * 4])
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(bad, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "raw_input_contents holds 2 entries for 1 inputs (one per input, in order)"


@pytest.mark.slow
def test_bad_requests_get_status_codes_and_the_server_serves_on(clients, x):
    g, h, _ = clients
    code, msg = _status(lambda: _grpc(g, np.zeros((2, 1, 8, 9), np.float32)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert msg == "input 'x': shape [2, 1, 8, 9], expected float32 [N, 1, 8, 8] with 1 <= N <= 32"
    code, msg = _status(lambda: _grpc(g, x[:2], name=MARK))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "inputs[0]: unknown input; this model takes 'x'"
    code, msg = _status(lambda: _grpc(g, x[:2].astype(np.int64), datatype="INT64"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("input 'x': datatype INT64, expected FP32")
    code, msg = _status(lambda: _grpc(g, x[:2], model="other"))
    assert code == grpc.StatusCode.NOT_FOUND and msg == "unknown model; this server serves 'digits_cnn'"
    code, msg = _status(lambda: g.get_model_config(MODEL, "2"))
    assert code == grpc.StatusCode.NOT_FOUND and msg == "unknown version; 'digits_cnn' has version 1"
    big = np.zeros((300, 1, 8, 8), np.float32)  # 77 KB of raw contents, over the 64 KB cap
    code, msg = _status(lambda: _grpc(g, big))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in msg
    code, _ = _status(lambda: _grpc(g, big[:33]))  # under the cap, over max_batch_size
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert g.is_server_live() and g.is_model_ready(MODEL)
    np.testing.assert_array_equal(_grpc(g, x[:3]), _http(h, x[:3]))


@pytest.mark.slow
def test_statistics_count_every_protocol_alike(clients, x):
    g, h, srv = clients

    def stats() -> dict:
        over_http = h.get_inference_statistics(MODEL)["model_stats"][0]
        over_grpc = _ints(g.get_inference_statistics(MODEL, as_json=True))["model_stats"][0]
        for k in ("name", "version", "inference_count", "execution_count"):  # protobuf's JSON omits zeros
            assert over_grpc.get(k, 0) == over_http[k], k
        for k, v in over_http["inference_stats"].items():
            assert over_grpc.get("inference_stats", {}).get(k, {}).get("count", 0) == v["count"], k
        return over_http

    before = stats()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for n in (1, 2, 3):
            _grpc(g, x[:n])
            _http(h, x[:n])
        assert c.post("/v1/predict", json={"inputs": x[:4].tolist()}).status_code == 200
        assert c.post("/v1/predict", json={"inputs": [[0.0]]}).status_code == 422  # admitted, then refused
    after = stats()
    assert (after["name"], after["version"]) == (MODEL, "1")
    d = {k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"]
         for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")}
    assert d == {"success": 7, "fail": 1, "queue": 7, "compute_input": 7, "compute_infer": 7, "compute_output": 7}
    assert after["inference_count"] - before["inference_count"] == 2 * (1 + 2 + 3) + 4
    runs = after["execution_count"] - before["execution_count"]
    assert 1 <= runs <= 7
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sum(size * count for size, count in sizes.items()) == after["inference_count"]
    # every model's statistics (no name: GET /v2/models/stats, gRPC with an empty name): this one's
    assert h.get_inference_statistics()["model_stats"] == [after]
    assert _ints(g.get_inference_statistics(as_json=True))["model_stats"][0]["inference_count"] == after["inference_count"]


@pytest.mark.slow
def test_metrics_expose_the_collectors_pauses(clients, x):
    g, _, srv = clients
    _grpc(g, x[:2])  # a batch: the predictor reports its collector with it
    time.sleep(0.3)  # several HTTP processes publish their gauges every 0.1 s (pipeline/serving/workers.py)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        text = c.get("/metrics").text
        several = c.get("/v1/model").json()["batching"]["http_workers"] > 1
    worker = ',worker="0"' if several else ""  # gRPC is served by HTTP process 0
    for process in ("server", "predictor-0"):
        for gen in "012":
            labels = f'{{generation="{gen}",process="{process}"{worker}}}'
            assert metric(text, "pipe_gc_collections_total" + labels) >= 0
            assert metric(text, "pipe_gc_pause_seconds_total" + labels) >= 0
    # the server's start-up collection (gcpause.settle) was a generation-2 one, timed
    assert metric(text, f'pipe_gc_collections_total{{generation="2",process="server"{worker}}}') >= 1
    assert metric(text, f'pipe_gc_pause_seconds_total{{generation="2",process="server"{worker}}}') > 0


@pytest.mark.slow
def test_the_benchmarks_grpc_load_counts_answers_and_errors(served, x):
    """pipeline/bench/peers.py's gRPC client (pre-serialised ModelInferRequest bytes, concurrent calls) and
    its reader of the collector's pauses, against this server: answers counted, a refused request an error."""
    from pipeline.bench import peers

    srv, address = served
    # In a process of its own, as in the bench: grpc.aio's poller thread left in this one made a later
    # subprocess's stderr (test_grpc_port_flags_fail_in_one_line) start with grpc's epoll_wait error line.
    code = textwrap.dedent(f"""
        import json, numpy as np
        from pipeline.bench import peers
        x = np.asarray({x[:1].tolist()!r}, np.float32)
        print(json.dumps([peers._grpc_load({address!r}, peers._grpc_request({MODEL!r}, name, x), 2, 0.3)
                          for name in ("x", "nope")]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    good, bad = json.loads(out.stdout)
    assert good["done"] > 0 and good["errors"] == 0 and good["p50"] <= good["p99"]
    assert bad["done"] > 0 and bad["errors"] == bad["done"]
    pauses = peers._gc_seconds(srv.url)
    assert set(pauses) == {"server", "predictor-0"} and pauses["server"] > 0  # settle's timed collection


def test_settle_freezes_start_up_and_pauses_are_timed():
    """In a fresh interpreter: settle() leaves the start-up objects frozen (never walked again) and the
    thresholds set; Pauses times collections by generation."""
    code = textwrap.dedent("""
        import gc, json
        from pipeline.serving import gcpause
        p = gcpause.Pauses()
        garbage = [[] for _ in range(1000)]
        for a in garbage:
            a.append(a)  # cycles: only the collector frees them
        del garbage, a
        assert gc.get_freeze_count() == 0
        gcpause.settle()
        frozen = gc.get_freeze_count()
        gc.collect(0)
        print(json.dumps([frozen, list(gc.get_threshold()), p.snapshot()]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    from pipeline.serving import gcpause

    frozen, threshold, snap = json.loads(out.stdout)
    assert frozen > 1000 and threshold == list(gcpause.THRESHOLDS)
    assert snap[2][0] >= 1 and snap[2][1] > 0  # settle's full collection
    assert snap[0][0] >= 1  # the young one after it


def test_grpc_port_flags_fail_in_one_line(run, tmp_path):
    def serve(*flags: str) -> subprocess.CompletedProcess:
        # posix_spawn (close_fds=False, no cwd), not fork: this process holds tritonclient.grpc's poller, and a
        # forked child runs grpc's at-fork handler before exec, which could print its own "epoll_wait error:
        # Bad file descriptor" line into the child's stderr (a fresh clone's make test: 888 passed, this failed)
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "serve", str(run / "package"), *flags],
                              capture_output=True, text=True, close_fds=False, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        port = str(_free_port())
        cases = {("--port", port, "--grpc-port", port): f"--grpc-port {port}: the same port as --port",
                 ("--port", "0", "--grpc-port", str(taken)): f"--grpc-port {taken}: cannot listen on 127.0.0.1:{taken}",
                 ("--port", "0", "--grpc-port", "70000"): "--grpc-port: must be 0..65535, got 70000"}
        for flags, want in cases.items():
            r = serve(*flags)
            assert r.returncode == 2, (flags, r.stderr[-500:])
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and want in lines[0] and "Traceback" not in r.stderr, (flags, r.stderr)


@pytest.mark.slow
def test_perf_analyzer_drives_http_and_grpc(served, run, tmp_path):
    """Triton's own load tool (perf_analyzer 2.45.0, `make test` puts it in .venv/perf), as the bench runs it
    (`pipeline/bench/perf.py`), against this server over HTTP and gRPC: it reads the model's metadata and
    configuration, loads it, and reads the statistics extension's server-side times."""
    import csv

    from pipeline.bench import perf

    found = perf.binary()
    if isinstance(found, str):
        pytest.skip(found)
    cmd, env = found
    srv, address = served
    meta = httpx.get(f"{srv.url}/v2/models/{MODEL}").json()
    spec = yaml.safe_load((run / "package/serving.yaml").read_text(encoding="utf-8"))
    data = perf.inputs_file(meta, spec, "digits", tmp_path / "inputs.json", samples=3)
    entries = json.loads(data.read_text())["data"]
    assert len(entries) == 3 and all(np.isfinite(e[n]["content"]).all() for e in entries for n in e), entries
    for proto, url in (("http", srv.url.removeprefix("http://")), ("grpc", address)):
        # what is tested is that perf_analyzer drives the server, not a figure: any stability will do, since the
        # other xdist worker loads the 2 cores unevenly (CI failed once on 50% with "Failed to obtain stable measurement")
        point = perf.measure(cmd, env, MODEL, url, proto, 2, perf.Flags(1000, 100, 10), data, tmp_path / f"{proto}.csv")
        assert not point.error, (proto, point.error)
        assert point.rate > 100 and 0 < point.p50 <= point.p99, (proto, point)
        with (tmp_path / f"{proto}.csv").open(newline="") as f:
            row = next(csv.DictReader(f))
        assert int(row["Server Compute Infer"]) > 0, (proto, row)  # from /v2/models/NAME/stats (or gRPC's)
