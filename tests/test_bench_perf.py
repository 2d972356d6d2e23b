"""pipeline/bench/perf.py: `pipe serve` against tritonserver measured by Triton's perf_analyzer.

The table's logic on given points (the goals of issue 34 marked met or missed, a failed run shown as
failed, never as a number, the load average of each round), perf_analyzer's CSV read as it writes it, the
input file of real digits samples, the settings row, the pinning decision by core count, and the one-line
reason when perf_analyzer is not installed. perf_analyzer itself against a real `pipe
serve` is tests/stages/test_serve_grpc.py::test_perf_analyzer_drives_http_and_grpc.
"""

from __future__ import annotations

from pathlib import Path

import json

import numpy as np

from pipeline import data
from pipeline.bench import perf
from pipeline.config import DataConfig

# perf_analyzer 2.45.0's `-f` file, as one of its runs against pipe serve wrote it
CSV = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
       "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
       "16,6144.98,21,1695,381,15,440,47,0,2502,2769,3170,4175\n")


def _results(pipe_grpc: float | None) -> perf.Results:
    r = perf.Results()
    for rnd in range(2):
        r.add("pipe", "http", 16, perf.Point(6000 + rnd * 100, 2.5, 4.0, cpu_ms=0.15 + rnd * 0.01))
        r.add("triton", "http", 16, perf.Point(5000, 3.0, 5.5, cpu_ms=0.1))
        r.add("triton", "grpc", 16, perf.Point(4600, 3.3, 7.3))
        r.add("pipe", "http", 1, perf.Point(1600, 0.6, 0.8))
        r.add("triton", "http", 1, perf.Point(400, 2.5, 2.6))
        r.add("pipe", "grpc", 16, perf.Point(pipe_grpc, 5.5, 9.0) if pipe_grpc else perf.Point(error="Failed to obtain stable measurement."))
    return r


def test_the_table_marks_the_goals_on_the_medians():
    rows = {r[0].split(": ", 1)[1]: r for r in perf.table("digits", _results(2900), perf.Flags(4000), 2, "not pinned", True)}
    http = rows["HTTP infer/s at concurrency 16, pipe serve / tritonserver"]
    assert http[1:] == ("1.21x", ">= 1.0x", "met")  # median 6050 / 5000
    assert rows["HTTP p99 at concurrency 16, pipe serve / tritonserver"][1:] == ("0.73x", "<= 1.5x", "met")
    assert rows["gRPC / HTTP infer/s at concurrency 16, pipe serve"][1:] == ("0.48x", ">= 0.9x", "**missed**")
    assert rows["gRPC / HTTP infer/s at concurrency 16, tritonserver"][1:] == ("0.92x", "reported", "")
    assert rows["HTTP p50 at concurrency 1, pipe serve / tritonserver"][1] == "0.24x"
    assert rows["pipe serve, HTTP, concurrency 16: infer/s (per round), p50 / p99 ms, server CPU ms per inference"][1] \
        == "6050 (6000/6100), 2.50 / 4.00, 0.155"
    assert rows["pipe serve, HTTP, concurrency 1: infer/s (per round), p50 / p99 ms, server CPU ms per inference"][1] \
        == "1600 (1600/1600), 0.60 / 0.80"  # no CPU figure: none measured
    assert rows["HTTP server CPU per inference at concurrency 16, pipe serve / tritonserver"][1:] == ("1.55x", "reported", "")
    assert "2 interleaved round(s); windows of 4000 ms until 3 agree within 10%, at most 10; not pinned" in rows["how"][1]
    # a model without goals reports the same ratios
    other = perf.table("mobilenet", _results(2900), perf.Flags(4000), 2, "not pinned", False)
    assert all(r[2] in ("", "reported") and "met" not in r[3] for r in other)


def test_the_how_row_gives_each_rounds_load_and_the_settings_row_what_each_server_ran_at():
    rows = {r[0].split(": ", 1)[1]: r for r in perf.table("digits", _results(2900), perf.Flags(4000, 20), 3, "not pinned",
                                                          True, loads=[12.25, 9.0, 17.5], settings="pipe: a; triton: b")}
    assert rows["how"][1].endswith("windows of 4000 ms until 3 agree within 20%, at most 10; not pinned; "
                                   f"load average 12.2/9.0/17.5 on {perf.os.cpu_count()} cores")
    assert rows["settings (each server at its package's defaults)"][1] == "pipe: a; triton: b"
    said = perf.settings({"batching": {"predictors": 1, "threads": 1, "max_batch_size": 32, "max_wait_ms": 2.0}},
                         {"max_batch_size": 32, "dynamic_batching": {"max_queue_delay_microseconds": "2000"},
                          "instance_group": [{"count": 1, "kind": "KIND_CPU"}]})
    assert said == ("pipe serve: 1 predictor(s) x 1 thread(s), batch <= 32, wait 2 ms; tritonserver: 1 instance(s), "
                    "onnxruntime intra-op threads default (every core), batch <= 32, queue delay 2 ms")
    two = perf.settings({"batching": {"http_workers": 2, "predictors": 1, "threads": 1, "max_batch_size": 32,
                                      "max_wait_ms": 2.0}}, {"max_batch_size": 32})
    assert two.startswith("pipe serve: 2 HTTP processes, each 1 predictor(s) x 1 thread(s), batch <= 32")


def test_the_input_file_holds_the_digits_test_split_prepared_as_the_package_says(tmp_path: Path):
    pre = {"kind": "image", "layout": "NCHW", "scale": 1 / 255, "mean": [0.3], "std": [0.4]}
    meta = {"inputs": [{"name": "img", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]}
    doc = json.loads(perf.inputs_file(meta, {"preprocessing": pre}, "digits", tmp_path / "in.json").read_text())
    test = data.load(DataConfig(source="digits")).test
    want = data.prepare(test.inputs["x"][test.idx], pre)
    got = np.asarray([e["img"]["content"] for e in doc["data"]], np.float32).reshape(want.shape)
    assert len(doc["data"]) == len(test.idx) > 100 and doc["data"][0]["img"]["shape"] == [1, 8, 8]
    np.testing.assert_array_equal(got, want)  # real samples, as a client sends them: not random values


def test_a_failed_run_is_shown_failed_never_as_a_number():
    rows = {r[0].split(": ", 1)[1]: r for r in perf.table("digits", _results(None), perf.Flags(4000), 2, "", True)}
    point = rows["pipe serve, GRPC, concurrency 16: infer/s (per round), p50 / p99 ms, server CPU ms per inference"]
    assert point[1].startswith("no stable measurement; 2 run(s) failed: Failed to obtain stable measurement.")
    assert point[3] == "**failed**"
    assert rows["gRPC / HTTP infer/s at concurrency 16, pipe serve"][1:] == ("not measured (a run above failed)", "",
                                                                             "**failed**")


def test_perf_analyzers_csv_is_read_as_it_writes_it(tmp_path: Path):
    (tmp_path / "p.csv").write_text(CSV)
    assert perf.parse(tmp_path / "p.csv") == perf.Point(6144.98, 2.502, 4.175)


def test_the_load_generator_is_pinned_away_only_from_4_cores():
    assert perf.pinning(2)[:2] == ([], []) and "not pinned (2 cores" in perf.pinning(2)[2]
    servers, client, said = perf.pinning(8)
    assert servers == ["taskset", "-c", "0-5"] and client == ["taskset", "-c", "6-7"]
    assert said == "perf_analyzer pinned to cores 6-7, the servers to 0-5"


def test_without_perf_analyzer_the_rows_say_how_to_install_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(perf, "VENV", tmp_path / "perf")
    rows = perf.rows(quick=True)
    assert len(rows) == 1 and rows[0][1].startswith(f"not measured: no {tmp_path}/perf/bin/perf_analyzer: `make bench`")
    assert "libb64-0d" in rows[0][1]
