"""`pipe bench` rows: `pipe serve` and tritonserver measured by Triton's own load tool, perf_analyzer.

    python -m pipeline.bench.perf [--quick] bench/SERVING_PERF.md

What a user gets, nothing tuned for the bench: the digits package exactly as `pipe all --config
examples/digits.yaml` makes it (RUN/package: its variant, engine and batching; `--quick` trains 1 epoch and
skips compress's gates and most of its timing), served by
- `pipe serve RUN/package` at its defaults (no flag: the package's serving.yaml and `pipe serve`'s own
  predictors and threads); for the gRPC points a second one with `--grpc-port`, gRPC being off by default;
- tritonserver 2.51 on the package's own `triton/` repository, unchanged (`peers._triton`: the nvidia-pytriton
  wheel's C++ front ends and dynamic batching, the model through the python-based onnxruntime backend shim of
  tests/triton_backend, which reads the same config.pbtxt parameters as Triton's onnxruntime backend).
perf_analyzer drives each server's /v2 over HTTP and gRPC at concurrency 16 and 1, with the same flags for
every server: synchronous requests of one sample, from one file of the digits test split (`inputs_file`: real
samples, prepared as the package's serving.yaml says, the way a client sends them to /v2; perf_analyzer's own
random data is random bytes, NaN and infinities among them, which `pipe serve` refuses with a 400),
`--measurement-interval` ms windows until three in a row agree within `--stability-percentage`, at most
`--max-trials` windows. Every server and protocol first gets one short discarded run (tritonserver's model
is not warmed at load; pipe's is). The servers are measured in turn within a round, the rounds interleave,
and the rows give each round's figure, the load average, and the CPU time the server's processes spent per
inference (the rate on a shared machine is also the CPU share the scheduler gave each server; the CPU per
inference is what the server costs). A full run takes windows of 4 s within 20% (perf_analyzer's default is
10%: on a machine shared with other work windows rarely agree that closely). On a machine of 4 or more cores perf_analyzer
runs pinned to the last quarter of the cores and the servers to the rest (`taskset`); on fewer the rows say
it was not pinned.

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


WARM_UP = Flags(1000, 50, 2)  # one discarded run per server and protocol: any figure, or a failure, will do


@dataclass
class Point:
    """One perf_analyzer run: infer/s and latency percentiles in ms, or why it failed; `cpu_ms`: CPU time of
    the server's processes (the server and its children: pipe's predictor, Triton's python backend stub)
    per inference over the whole run, by the server's own statistics extension's inference_count."""
    rate: float = 0.0
    p50: float = 0.0
    p99: float = 0.0
    error: str = ""
    cpu_ms: float = 0.0


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


def inputs_file(meta: dict, spec: dict, source: str, out: Path, samples: int = 0) -> Path:
    """perf_analyzer's `--input-data` JSON for the model a server describes in `meta` (/v2/models/NAME): the
    test split of data `source` (`pipe train --data`'s, e.g. digits), at most `samples` (0: all), each input
    prepared as the package's serving.yaml (`spec`) says (`data.prepare_feeds`: what a client sends to /v2),
    one sample per entry (the batch dimension dropped). Written once and given to every server, so all of
    them answer the same requests."""
    import numpy as np

    from pipeline import data
    from pipeline.config import DataConfig

    test = data.load(DataConfig(source=source)).test
    idx = test.idx[:samples] if samples else test.idx
    feeds = data.prepare_feeds({k: v[idx] for k, v in test.inputs.items()}, spec["preprocessing"])
    wanted = [t["name"] for t in meta["inputs"]]
    if len(wanted) == len(feeds) == 1:  # one input: its served name may differ from the stored one
        feeds = {wanted[0]: next(iter(feeds.values()))}
    if sorted(feeds) != sorted(wanted):
        raise PipeError(f"perf: {source}'s inputs {', '.join(feeds)} are not the model's {', '.join(wanted)}")
    data_ = [{name: {"content": np.asarray(x[i], np.float32 if x.dtype.kind == "f" else x.dtype).ravel().tolist(),
                     "shape": list(x.shape[1:])} for name, x in feeds.items()} for i in range(len(idx))]
    out.write_text(json.dumps({"data": data_}), encoding="utf-8")
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
    try:
        return _digits_rows(quick, *found)
    except PipeError as e:
        return [(f"perf_analyzer, {NAME}", f"failed: {str(e)[-300:]}", "", "**failed**")]


NAME = "digits (`pipe all --config examples/digits.yaml`)"


def _digits_rows(quick: bool, cmd: list[str], env: dict[str, str]) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-perf-"))
    servers: list[peers._Peer] = []
    try:
        package = peers._digits(tmp, quick, repackage=False)
        spec = serving.yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
        if not spec.get("triton"):
            return [(f"perf_analyzer, {NAME}", "not measured: the package has no Triton repository", "", "")]
        model = spec["triton"]["model"]
        server_pin, client_pin, pinned = pinning(os.cpu_count() or 1)
        for key, grpc in (("pipe", False), ("pipe-grpc", True)):  # gRPC is off unless --grpc-port
            servers.append(peers._pipe(key, "pipe serve", package, tmp, grpc=grpc, prefix=server_pin, settings=()))
        triton = peers._triton(package, tmp, prefix=server_pin, one_thread=False)
        if triton is None:
            return [(f"perf_analyzer, {NAME}: tritonserver", f"not measured: no runnable tritonserver in "
                                                              f"{peers._PYTRITON}", "", "")]
        servers.append(triton)
        urls = {("pipe", "http"): servers[0].http.removeprefix("http://"), ("pipe", "grpc"): servers[1].grpc,
                ("triton", "http"): triton.http.removeprefix("http://"), ("triton", "grpc"): triton.grpc}
        peer = {("pipe", "http"): servers[0], ("pipe", "grpc"): servers[1], ("triton", "http"): triton,
                ("triton", "grpc"): triton}
        data = inputs_file(_get(f"{servers[0].http}/v2/models/{model}"), spec, "digits", tmp / "inputs.json")
        said = settings(_get(f"{servers[0].http}/v1/model"), _get(f"{triton.http}/v2/models/{model}/config"))
        for (key, proto), url in urls.items():  # one discarded run each: tritonserver loads its model cold
            measure([*client_pin, *cmd], env, model, url, proto, CONCURRENCY[0], WARM_UP, data, tmp / "perf.csv")
        flags, rounds = (Flags(1500, 15, 6), 1) if quick else (Flags(4000, 20), 3)
        results, loads = Results(), []
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for (key, proto), url in urls.items():
                for conc in CONCURRENCY:
                    results.add(key, proto, conc, costed(peer[key, proto], model, lambda: measure(
                        [*client_pin, *cmd], env, model, url, proto, conc, flags, data, tmp / "perf.csv")))
        return table(NAME, results, flags, rounds, pinned, goals=True, loads=loads, settings=said)
    finally:
        for s in servers:
            serving.stop(s.proc)
        shutil.rmtree(tmp, ignore_errors=True)


def costed(server: peers._Peer, model: str, run) -> Point:
    """`run()`'s Point with the CPU its server's processes spent per inference meanwhile (`Point.cpu_ms`)."""
    def now() -> tuple[float, int]:
        stats = _get(f"{server.http}/v2/models/{model}/stats")["model_stats"][0]
        return sum(serving._usage(server.proc.pid)[1][1:]), int(stats["inference_count"])

    (cpu0, n0), p, (cpu1, n1) = now(), run(), now()
    p.cpu_ms = (cpu1 - cpu0) * 1000 / max(1, n1 - n0)
    return p


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def settings(pipe_model: dict, triton_config: dict) -> str:
    """The serving settings each server ran at, from pipe's GET /v1/model and Triton's model configuration."""
    b = pipe_model["batching"]
    groups = triton_config.get("instance_group") or [{}]
    params = {k: v.get("string_value") for k, v in (triton_config.get("parameters") or {}).items()}
    delay = int((triton_config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0))
    workers = int(b.get("http_workers", 1))
    each = f"{workers} HTTP processes, each " if workers > 1 else ""
    return (f"pipe serve: {each}{b['predictors']} predictor(s) x {b['threads']} thread(s), batch <= {b['max_batch_size']}, "
            f"wait {b['max_wait_ms']:g} ms; tritonserver: {sum(int(g.get('count', 1)) for g in groups)} instance(s), "
            f"onnxruntime intra-op threads {params.get('intra_op_thread_count') or 'default (every core)'}, "
            f"batch <= {triton_config.get('max_batch_size')}, queue delay {delay / 1000:g} ms")


def table(name: str, r: Results, flags: Flags, rounds: int, pinned: str, goals: bool, loads: list[float] = (),
          settings: str = "") -> list[Row]:
    """The rows of one model: how it was measured (`loads`: the 1-minute load average as each round began;
    `settings`: what each server ran at), each server's points, then the ratios the issue set goals for."""
    what = f"perf_analyzer, {name}, /v2"
    labels = {"pipe": "pipe serve", "triton": "tritonserver 2.51"}
    load = f"; load average {'/'.join(f'{x:.1f}' for x in loads)} on {os.cpu_count()} cores" if loads else ""
    out: list[Row] = [(f"{what}: how", f"{rounds} interleaved round(s); windows of {flags.interval_ms} ms until 3 "
                                       f"agree within {flags.stability}%, at most {flags.trials}; {pinned}{load}",
                       "", "")]
    if settings:
        out.append((f"{what}: settings (each server at its package's defaults)", settings, "", ""))
    for key, label in labels.items():
        for proto in PROTOCOLS:
            for conc in CONCURRENCY:
                pts = r.points.get((key, proto, conc), [])
                bad = [p.error for p in pts if p.error]
                good = r.good(key, proto, conc)
                text = (f"{statistics.median(p.rate for p in good):.0f} "
                        f"({'/'.join(f'{p.rate:.0f}' for p in good)}), "
                        f"{statistics.median(p.p50 for p in good):.2f} / {statistics.median(p.p99 for p in good):.2f}"
                        + (f", {statistics.median(p.cpu_ms for p in good):.3f}" if any(p.cpu_ms for p in good) else "")
                        if good else "no stable measurement")
                if bad:
                    text += f"; {len(bad)} run(s) failed: {bad[-1]}"
                out.append((f"{what}: {label}, {proto.upper()}, concurrency {conc}: infer/s (per round), "
                            "p50 / p99 ms, server CPU ms per inference", text, "reported", "" if good else "**failed**"))

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
    cpu = med("pipe", "http", c, "cpu_ms"), med("triton", "http", c, "cpu_ms")
    if all(cpu):  # what each server costs: on a shared machine the rate is also the CPU the scheduler gave it
        out.append(ratio(f"HTTP server CPU per inference at concurrency {c}, pipe serve / tritonserver", *cpu, None,
                         False))
    return out


if __name__ == "__main__":
    import sys

    from pipeline import bench

    quick = "--quick" in sys.argv
    out_file = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/SERVING_PERF.md"))
    bench._write(out_file, rows(quick), quick)
