"""The benchmark's engine rows render from their inputs, without timing anything (`pipeline/bench/compress.py`,
`pipeline/bench/serving.py`, `pipeline/bench/loadgen.py`): the auto pick said as `pipe package` picks, the
OpenVINO rows and their int8 tag, goals met or missed from the numbers, the predictor runs read off the
batch histogram, and the /v2 body byte for byte as tritonclient.http builds it."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from pipeline.bench import compress as bench_compress, loadgen, serving as bench_serving

CAP = {"vnni": True, "forced": None, "int8_saturates": False,
       "int8_exact": {"onnxruntime": True, "paddle_inference": True, "openvino": True}}


def _variant(engine: str, precision: str, s1: float, s32: float, accuracy: float = 0.9) -> dict:
    return {"engine": engine, "precision": precision, "supported": True, "accuracy": accuracy, "shippable": True,
            "status": "ok", "speedup_bs1": s1, "speedup_batch": s32, "latency_ms_p50_bs1": 5.0 / s1,
            "items_per_s_batch": 1000.0 * s32, "top1_agreement": 1.0, "reason": ""}


def _metrics(**faster: tuple[float, float]) -> dict:
    engines = {"onnx-fp32": ("onnxruntime", "fp32"), "int8-onnx": ("onnxruntime", "int8"),
               "openvino-fp32": ("openvino", "fp32"), "openvino-int8": ("openvino", "int8")}
    variants = {"fp32": _variant("paddle_inference", "fp32", 1.0, 1.0)}
    variants.update({k: _variant(*engines[k], *v) for k, v in faster.items()})
    return {"variants": variants, "max_drop": 1.0, "cpu": CAP, "test_samples": 100}


def test_pick_row_says_what_pipe_package_ships_in_every_run():
    runs = [_metrics(**{"openvino-fp32": (3.0, 2.0), "onnx-fp32": (2.0, 1.2)})] * 2 + \
        [_metrics(**{"openvino-fp32": (1.5, 1.2), "onnx-fp32": (4.0, 1.5)})]
    label, result, _, status = bench_compress.pick_row("compress m", runs, packaged="openvino-fp32")
    assert "int8 exact on this CPU (VNNI)" in label
    assert result.startswith("openvino-fp32 (openvino fp32) in 2 of 3 runs; onnx-fp32 (onnxruntime fp32) in 1 of 3 runs")
    assert "the package made from run 1 shipped openvino-fp32" in result and "DIFFERENT" not in result and status == ""
    assert "Why (run 1): fastest here within 1.00 points of fp32 by balanced" in result

    _, result, _, status = bench_compress.pick_row("compress m", runs[:1], packaged="fp32")
    assert "(DIFFERENT)" in result and status == "**mismatch**"


def test_pick_row_when_nothing_is_within_budget():
    m = _metrics(**{"onnx-fp32": (2.0, 2.0)})
    for v in m["variants"].values():
        v["shippable"], v["status"] = False, "below budget: test"
    _, result, _, _ = bench_compress.pick_row("compress m", [m])
    assert result.startswith("nothing shippable. Why (run 1): compress: no variant within 1 points")


def test_speed_rows_have_every_engine_with_its_int8_tag():
    m = _metrics(**{"onnx-fp32": (2.0, 1.5), "int8-onnx": (3.0, 2.0), "openvino-fp32": (0.9, 1.0),
                    "openvino-int8": (4.0, 3.0)})
    m["agreement_samples"] = 64
    rows = bench_compress.speed_rows("compress m", [m], {}, "samples")
    by = {r[0]: r for r in rows}
    assert by["compress m: OpenVINO int8 items/s bs32 vs Paddle fp32 [int8 exact on this CPU (VNNI)]"][1] \
        .startswith("3.00x (3000 items/s")
    slow = by["compress m: OpenVINO fp32 speed-up at bs1 (fp32 p50 / its p50) [int8 exact on this CPU (VNNI)]"]
    assert slow[1].endswith("SLOWER than Paddle fp32") and slow[3] == "**slower**"
    assert by["compress m: int8 top-1 agreement with fp32 (64 samples of all splits) [int8 exact on this CPU (VNNI)]"][1] \
        == "int8-onnx 1.000, openvino-int8 1.000"
    missing = by["compress m: Paddle bf16"]
    assert missing[1] == "not measured: not built" and missing[3] == "**failed**"
    goal = dict((r[0], r) for r in bench_compress._goal_rows("compress m", [m]))
    assert goal["compress m goal: best int8 engine, items/s bs32 vs Paddle fp32"][1:] == \
        ("3.00x (openvino-int8)", ">= 3.5x", "**missed**")


def test_int8_tag_per_engine():
    cap = {**CAP, "vnni": False, "int8_saturates": True,
           "int8_exact": {"onnxruntime": False, "paddle_inference": False, "openvino": True}}
    assert bench_compress.int8_tag({"cpu": cap}, "openvino-int8") == "int8 exact on this CPU (no VNNI)"
    assert bench_compress.int8_tag({"cpu": cap}, "onnxruntime") == "int8 saturating on this CPU (no VNNI)"
    assert bench_compress.int8_tag({"cpu": cap}) == "int8 saturating on this CPU (no VNNI)"


def test_runs_by_bucket_from_the_batch_histogram():
    before = {1.0: 2, 2.0: 2, 4.0: 3, 8.0: 3, 16.0: 3, 32.0: 3, 64.0: 3}
    after = {1.0: 5, 2.0: 5, 4.0: 9, 8.0: 109, 16.0: 110, 32.0: 112, 64.0: 112}
    assert bench_serving._runs_by_bucket(before, after, 32) == {1: 3, 4: 3, 8: 100, 16: 1, 32: 2}
    assert bench_serving._runs_by_bucket(before, after, 24) == {1: 3, 4: 3, 8: 100, 16: 1, 24: 2}


def _server(key: str, engine: str, variant: str) -> bench_serving._Server:
    spec = {"model": {"variant": variant}, "name": "m", "input": {"name": "x"}}
    return bench_serving._Server(key, None, None, "", engine, "fp32", 1, 32, spec)


@pytest.mark.parametrize("goals", [True, False])
def test_versus_rows_state_goals_from_the_numbers(goals, monkeypatch):
    monkeypatch.setattr(bench_serving.cpu, "capability", lambda: CAP)
    fp32, auto = _server("fp32", "paddle_inference", "fp32"), _server("auto", "onnxruntime", "onnx-fp32")
    served = {"auto": bench_serving._Served(rates=[800.0, 760.0]), "fp32": bench_serving._Served(rates=[500.0, 520.0])}
    latency = {"auto": [2.0, 2.2], "fp32": [5.0, 4.0]}
    rate, p50 = bench_serving._versus_rows("m", fp32, auto, served, latency, goals)
    assert "[onnxruntime fp32 vs paddle_inference fp32; int8 exact on this CPU (VNNI)]" in rate[0]
    assert rate[1] == "1.53x (780/s vs 510/s; per round 1.60/1.46)"
    assert p50[1] == "0.47x (2.10 ms vs 4.50 ms; per round 0.40/0.55)"
    if goals:
        assert (rate[2], rate[3], p50[2], p50[3]) == (">= 1.5x", "met", "<= 0.5x", "met")
    else:
        assert (rate[2], rate[3], p50[2], p50[3]) == ("reported", "", "reported", "")
    served["auto"].errors = 1
    assert bench_serving._versus_rows("m", fp32, auto, served, {"auto": [3.0], "fp32": [5.0]}, True)[0][3] == \
        "**missed**"
    assert bench_serving._versus_rows("m", fp32, auto, served, {"auto": [3.0], "fp32": [5.0]}, True)[1][3] == \
        "**missed**"


def test_v2_request_is_tritonclients_body():
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a test extra")
    from tritonclient.http import _utils

    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    body, json_size = _utils._get_inference_request([inp], "", None, 0, False, False, 0, None, None)
    ours, headers = bench_serving.v2_request(x, "x")
    assert ours == body and headers == {"Inference-Header-Content-Length": str(json_size)}


def test_loadgen_sends_the_extra_headers_and_no_content_type_when_asked():
    seen: list[bytes] = []
    srv = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"BODY"):
                data += conn.recv(4096)
            seen.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    t = threading.Thread(target=answer)
    t.start()
    got = loadgen.run(f"http://127.0.0.1:{srv.getsockname()[1]}", [b"BODY"], 1, count=1, path="/v2/models/m/infer",
                      content_type="", headers={"Inference-Header-Content-Length": "0"})
    t.join(10)
    srv.close()
    assert got["done"] == 1 and got["errors"] == 0
    head = seen[0].split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    assert head[0] == b"post /v2/models/m/infer http/1.1"
    assert b"inference-header-content-length: 0" in head and b"content-length: 4" in head
    assert not any(h.startswith(b"content-type") for h in head)
