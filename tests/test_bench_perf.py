"""pipeline/bench/perf.py: `pipe serve` against tritonserver measured by Triton's perf_analyzer.

The table's logic on given points (the goals of issue 34 marked met or missed, a failed run shown as
failed, never as a number), perf_analyzer's CSV read as it writes it, the pinning decision by core count,
and the one-line reason when perf_analyzer is not installed. perf_analyzer itself against a real `pipe
serve` is tests/stages/test_serve_grpc.py::test_perf_analyzer_drives_http_and_grpc.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.bench import perf

# perf_analyzer 2.45.0's `-f` file, as one of its runs against pipe serve wrote it
CSV = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
       "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
       "16,6144.98,21,1695,381,15,440,47,0,2502,2769,3170,4175\n")


def _results(pipe_grpc: float | None) -> perf.Results:
    r = perf.Results()
    for rnd in range(2):
        r.add("pipe", "http", 16, perf.Point(6000 + rnd * 100, 2.5, 4.0))
        r.add("triton", "http", 16, perf.Point(5000, 3.0, 5.5))
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
    assert rows["pipe serve, HTTP, concurrency 16: infer/s (per round), p50 / p99 ms"][1] == "6050 (6000/6100), 2.50 / 4.00"
    assert "2 interleaved round(s); windows of 4000 ms until 3 agree within 10%, at most 10; not pinned" in rows["how"][1]
    # a model without goals reports the same ratios
    other = perf.table("mobilenet", _results(2900), perf.Flags(4000), 2, "not pinned", False)
    assert all(r[2] in ("", "reported") and "met" not in r[3] for r in other)


def test_a_failed_run_is_shown_failed_never_as_a_number():
    rows = {r[0].split(": ", 1)[1]: r for r in perf.table("digits", _results(None), perf.Flags(4000), 2, "", True)}
    point = rows["pipe serve, GRPC, concurrency 16: infer/s (per round), p50 / p99 ms"]
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
