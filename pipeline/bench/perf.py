"""`pipe bench` rows: `pipe serve` and tritonserver measured by Triton's own load tool, perf_analyzer.

    python -m pipeline.bench.perf [--quick] bench/SERVING_PERF.md

The same package as `peers` (digits, and mobilenet_v3_small 3x64x64 in a full run: `pipe package --engine
onnxruntime`, 1 thread, so both servers run the same model.onnx), served by
- `pipe serve` (HTTP and `--grpc-port`, 1 predictor x 1 thread), this tree;
- tritonserver 2.51 on the package's own `triton/` repository (`peers._triton`: the nvidia-pytriton wheel's
  C++ front ends and dynamic batching, the model through the python-based onnxruntime backend shim).
perf_analyzer drives each server's /v2 over HTTP and gRPC at concurrency 16 and 1, with the same flags for
every server: synchronous requests of one sample, from the same file of 8 samples of standard normal float32
(`inputs_file`; perf_analyzer's own random data is random bytes, NaN and infinities among them, which `pipe
serve` refuses with a 400 and tritonserver runs), `--measurement-interval` ms windows until
three in a row agree within `--stability-percentage`, at most `--max-trials` windows. The servers are measured in
turn within a round and the rounds interleave. On a machine of 4 or more cores perf_analyzer runs pinned to
the last quarter of the cores and the servers to the rest (`taskset`); on fewer the rows say it was not pinned.

perf_analyzer comes from the `tritonclient==2.45.0` wheel (its last release on the index with the binary),
installed by `make bench` into .venv/perf beside `nvidia-cuda-runtime-cu12` (the binary links libcudart even
on a CPU; its directory goes on LD_LIBRARY_PATH here); it also needs libb64 (Debian's `libb64-0d`). Without
them the rows say what is missing. The bench's own Python client (`peers`, `serving`) stays for what
perf_analyzer cannot drive: /v1 JSON with images, KServe's ModelServer (no Triton model configuration).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.bench import peers, serving
from pipeline.errors import PipeError

Row = serving.Row

VENV = serving._REPO / ".venv/perf"
SETUP = ("`make bench` installs it: .venv/perf with tritonclient==2.45.0 and nvidia-cuda-runtime-cu12, and "
         "`apt-get install libb64-0d`")
CONCURRENCY = (16, 1)
PROTOCOLS = ("http", "grpc")
GOAL_RATE, GOAL_P99, GOAL_GRPC = 1.0, 1.5, 0.9  # issue 34, digits at concurrency 16


@dataclass
class Flags:
    """perf_analyzer's measurement settings, the same for every server and point."""
    interval_ms: int
    stability: int = 10
    trials: int = 10

    def args(self) -> list[str]:
        return ["--measurement-interval", str(self.interval_ms), "--stability-percentage", str(self.stability),
                "--max-trials", str(self.trials)]


@dataclass
class Point:
    """One perf_analyzer run: infer/s and latency percentiles in ms, or why it failed."""
    rate: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    error: str = ""


@dataclass
class Results:
    """(server key, protocol, concurrency) -> one Point per round."""
    points: dict[tuple[str, str, int], list[Point]] = field(default_factory=dict)

    def add(self, key: str, proto: str, conc: int, p: Point) -> None:
        self.points.setdefault((key, proto, conc), []).append(p)

    def good(self, key: str, proto: str, conc: int) -> list[Point]:
        return [p for p in self.points.get((key, proto, conc), []) if not p.error]


def binary() -> tuple[list[str], dict[str, str]] | str:
    """The perf_analyzer command and its environment, or what is missing (one line)."""
    exe = VENV / "bin/perf_analyzer"
    if not exe.is_file():
        return f"no {exe}: {SETUP}"
    libs = sorted(VENV.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        [*map(str, libs), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]))
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0 or "Perf Analyzer Version" not in r.stdout + r.stderr:
        return f"{exe} does not run ({(r.stderr or r.stdout).strip()[-200:]}): {SETUP}"
    return [str(exe)], env


def pinning(cores: int) -> tuple[list[str], list[str], str]:
    """(prefix for the servers, prefix for perf_analyzer, what the rows say): the last quarter of the cores for
    perf_analyzer from 4 cores on; nothing pinned below that (one core each would halve every server)."""
    if cores < 4 or shutil.which("taskset") is None:
        return [], [], f"not pinned ({cores} cores: perf_analyzer shares them with the servers)"
    load = max(1, cores // 4)
    servers, client = f"0-{cores - load - 1}", f"{cores - load}-{cores - 1}"
    return (["taskset", "-c", servers], ["taskset", "-c", client],
            f"perf_analyzer pinned to cores {client}, the servers to {servers}")


def parse(path: Path) -> Point:
    """perf_analyzer's `-f` CSV (one concurrency): infer/s, p50 and p99 in ms."""
    with path.open(newline="") as f:
        row = next(csv.DictReader(f))
    return Point(float(row["Inferences/Second"]), int(row["p50 latency"]) / 1000, int(row["p99 latency"]) / 1000)


def inputs_file(http: str, model: str, out: Path, samples: int = 8, seed: int = 0) -> Path:
    """perf_analyzer's `--input-data` JSON for `model` as the server at `http` describes it (/v2/models/NAME):
    `samples` entries of standard normal values for every FP32 input, one sample each (the batch dimension
    dropped). Written once and given to every server, so all of them answer the same requests."""
    import numpy as np

    with urllib.request.urlopen(f"{http}/v2/models/{model}", timeout=10) as r:
        meta = json.load(r)
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(samples):
        entry = {}
        for t in meta["inputs"]:
            if t["datatype"] != "FP32" or any(d < 0 for d in t["shape"][1:]):
                raise PipeError(f"perf: input {t['name']!r} of {model} is {t['datatype']} {t['shape']}; the bench "
                                "writes data for fixed-shape FP32 inputs only")
            shape = t["shape"][1:]
            entry[t["name"]] = {"content": rng.standard_normal(shape, dtype=np.float32).ravel().tolist(),
                                "shape": shape}
        data.append(entry)
    out.write_text(json.dumps({"data": data}), encoding="utf-8")
    return out


def measure(cmd: list[str], env: dict[str, str], model: str, url: str, proto: str, conc: int, flags: Flags,
            data: Path, out: Path) -> Point:
    out.unlink(missing_ok=True)
    r = subprocess.run([*cmd, "-m", model, "-u", url, "-i", proto, "--concurrency-range", str(conc), *flags.args(),
                        "--input-data", str(data), "-f", str(out)], capture_output=True, text=True, env=env, check=False, timeout=600)
    if r.returncode != 0 or not out.is_file():
        lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        return Point(error=(lines[-1] if lines else f"exit {r.returncode}")[:200])
    return parse(out)


def rows(quick: bool) -> list[Row]:
    found = binary()
    if isinstance(found, str):
        return [("serve vs tritonserver, perf_analyzer", f"not measured: {found}", "", "")]
    out: list[Row] = []
    models = (("digits_cnn 1x8x8", peers._digits),) if quick else (
        ("digits_cnn 1x8x8", peers._digits), ("mobilenet_v3_small 3x64x64", peers._mobilenet))
    for name, build in models:
        try:
            out += _model_rows(name, build, quick, *found)
        except PipeError as e:
            out.append((f"perf_analyzer, {name}", f"failed: {str(e)[-300:]}", "", "**failed**"))
    return out


def _model_rows(name: str, build, quick: bool, cmd: list[str], env: dict[str, str]) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-perf-"))
    servers: list[peers._Peer] = []
    try:
        package = build(tmp, quick)
        model = serving.yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
        server_pin, client_pin, pinned = pinning(os.cpu_count() or 1)
        servers.append(peers._pipe("pipe", "pipe serve", package, tmp, grpc=True, prefix=server_pin))
        triton = peers._triton(package, tmp, prefix=server_pin)
        if triton is None:
            return [(f"perf_analyzer, {name}: tritonserver", f"not measured: no runnable tritonserver in "
                                                              f"{peers._PYTRITON}", "", "")]
        servers.append(triton)
        data = inputs_file(servers[0].http, model, tmp / "inputs.json")
        flags, rounds = (Flags(1500, 15, 6), 1) if quick else (Flags(4000), 2)
        results = Results()
        for _ in range(rounds):
            for s in servers:
                for proto in PROTOCOLS:
                    for conc in CONCURRENCY:
                        url = s.http.removeprefix("http://") if proto == "http" else s.grpc
                        results.add(s.key, proto, conc, measure([*client_pin, *cmd], env, model, url, proto, conc,
                                                                flags, data, tmp / "perf.csv"))
        return table(name, results, flags, rounds, pinned, goals=name.startswith("digits"))
    finally:
        for s in servers:
            serving.stop(s.proc)
        shutil.rmtree(tmp, ignore_errors=True)


def table(name: str, r: Results, flags: Flags, rounds: int, pinned: str, goals: bool) -> list[Row]:
    """The rows of one model: each server's points, then the ratios the issue set goals for."""
    what = f"perf_analyzer, {name}, /v2, onnxruntime 1 thread"
    labels = {"pipe": "pipe serve", "triton": "tritonserver 2.51"}
    out: list[Row] = [(f"{what}: how", f"{rounds} interleaved round(s); windows of {flags.interval_ms} ms until 3 "
                                       f"agree within {flags.stability}%, at most {flags.trials}; {pinned}",
                       "", "")]
    for key, label in labels.items():
        for proto in PROTOCOLS:
            for conc in CONCURRENCY:
                pts = r.points.get((key, proto, conc), [])
                bad = [p.error for p in pts if p.error]
                good = r.good(key, proto, conc)
                text = (f"{statistics.median(p.rate for p in good):.0f} "
                        f"({'/'.join(f'{p.rate:.0f}' for p in good)}), "
                        f"{statistics.median(p.p50 for p in good):.2f} / {statistics.median(p.p99 for p in good):.2f}"
                        if good else "no stable measurement")
                if bad:
                    text += f"; {len(bad)} run(s) failed: {bad[-1]}"
                out.append((f"{what}: {label}, {proto.upper()}, concurrency {conc}: infer/s (per round), "
                            "p50 / p99 ms", text, "reported", "" if good else "**failed**"))

    def med(key: str, proto: str, conc: int, attr: str) -> float | None:
        good = r.good(key, proto, conc)
        return statistics.median(getattr(p, attr) for p in good) if good else None

    def ratio(label: str, a: float | None, b: float | None, goal: float | None, at_least: bool) -> Row:
        if a is None or b is None:
            return (f"{what}: {label}", "not measured (a run above failed)", "", "**failed**" if goal else "")
        x = a / b
        if goal is None or not goals:
            return (f"{what}: {label}", f"{x:.2f}x", "reported", "")
        met = x >= goal if at_least else x <= goal
        return (f"{what}: {label}", f"{x:.2f}x", f"{'>=' if at_least else '<='} {goal}x",
                "met" if met else "**missed**")

    c = CONCURRENCY[0]
    out += [
        ratio(f"HTTP infer/s at concurrency {c}, pipe serve / tritonserver", med("pipe", "http", c, "rate"),
              med("triton", "http", c, "rate"), GOAL_RATE, True),
        ratio(f"HTTP p99 at concurrency {c}, pipe serve / tritonserver", med("pipe", "http", c, "p99"),
              med("triton", "http", c, "p99"), GOAL_P99, False),
        ratio(f"gRPC / HTTP infer/s at concurrency {c}, pipe serve", med("pipe", "grpc", c, "rate"),
              med("pipe", "http", c, "rate"), GOAL_GRPC, True),
        ratio(f"gRPC / HTTP infer/s at concurrency {c}, tritonserver", med("triton", "grpc", c, "rate"),
              med("triton", "http", c, "rate"), None, True),
        ratio(f"gRPC infer/s at concurrency {c}, pipe serve / tritonserver", med("pipe", "grpc", c, "rate"),
              med("triton", "grpc", c, "rate"), None, True),
        ratio("HTTP p50 at concurrency 1, pipe serve / tritonserver", med("pipe", "http", 1, "p50"),
              med("triton", "http", 1, "p50"), None, False),
    ]
    return out


if __name__ == "__main__":
    import sys

    from pipeline import bench

    quick = "--quick" in sys.argv
    out_file = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/SERVING_PERF.md"))
    bench._write(out_file, rows(quick), quick)
