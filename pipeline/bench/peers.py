"""`pipe bench` rows: `pipe serve` against KServe and its own past on the same package, side by side in one run.

    python -c "from pipeline.bench import peers; print(peers.rows(quick=True))"

For digits (`make demo`'s chain) and mobilenet_v3_small at 3x64x64, one package each, packaged with
`--engine onnxruntime` so that every server runs the same model.onnx on onnxruntime with 1 thread:
- `pipe serve` (HTTP and `--grpc-port`), this tree;
- `pipe serve` as it was before issue 21 (commit BEFORE, from a git worktree: no gc freeze, no gRPC),
  for the HTTP process's CPU per request before and after (digits only; skipped without git history);
- KServe 0.21's ModelServer (`pipeline/bench/kserve_peer.py`, FastAPI, in its own venv .venv/kserve).
tritonserver is measured against pipe serve by Triton's own perf_analyzer (`pipeline/bench/perf.py`, which
starts it with `_triton` here, onnxruntime held to 1 thread in its copy of the repository): at pipe's rate
this Python client, not the server, can saturate first (issue 34: 1.22x by this client, 0.72x by
perf_analyzer on that issue's machine). KServe's ModelServer has no Triton model
configuration for perf_analyzer to read, so it stays on this client. One load client for all, in this
process: `pipeline/bench/loadgen.py` for HTTP (the same /v2 JSON infer body to every server), and for
gRPC a grpc.aio client sending one pre-serialised ModelInferRequest (raw tensor bytes) from 16 concurrent
calls on one channel. Every point runs a fixed time; the servers are
measured in turn within a round, and the rounds interleave. Reported per server: requests/s and p50/p99
at 16 connections, p50 at 1 connection, the CPU ms per request of the server's own process (pipe: the
HTTP process, not its predictor; KServe: its one process), and for pipe the collector's pauses per 10,000
requests from its /metrics. On a 2-core machine the client, the server and the model share the CPU: quote the ratios with that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench import loadgen, serving
from pipeline.errors import PipeError

Row = serving.Row

BEFORE = "78594aa"
"""The last commit before issue 21's serving work (gc freeze, gRPC, Triton's extensions)."""
_REPO = serving._REPO
_PYTRITON = _REPO / ".venv/pytriton"
_KSERVE = _REPO / ".venv/kserve/bin/python"
_SHIM = _REPO / "tests/triton_backend/onnxruntime/model.py"
_START_S = 120.0
_CONNS = 16


@dataclass
class _Peer:
    key: str
    label: str
    proc: subprocess.Popen
    http: str  # http://127.0.0.1:PORT
    grpc: str = ""  # 127.0.0.1:PORT, or "" without gRPC
    results: dict[str, list[dict]] = field(default_factory=dict)
    """load name (http16, grpc16, http1) -> one loadgen result per round, with "cpu_ms" added."""


def rows(quick: bool) -> list[Row]:
    out: list[Row] = []
    for name, build in (("digits_cnn 1x8x8", _digits), ("mobilenet_v3_small 3x64x64", _mobilenet)):
        try:
            out += _model_rows(name, build, quick)
        except PipeError as e:
            out.append((f"serve vs peers, {name}", f"failed: {str(e)[-300:]}", "", "**failed**"))
    return out


def _model_rows(name: str, build: Any, quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-peers-"))
    peers: list[_Peer] = []
    worktree = None
    try:
        package = build(tmp, quick)
        spec = serving.yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
        model = spec["triton"]["model"]
        inp = spec["inputs"][0]
        x = np.random.RandomState(0).standard_normal((64, *inp["shape"][1:])).astype(np.float32)
        bodies = [json.dumps({"inputs": [{"name": inp["name"], "shape": [1, *x.shape[1:]], "datatype": "FP32",
                                          "data": x[i].ravel().tolist()}]}).encode() for i in range(len(x))]
        grpc_request = _grpc_request(model, inp["name"], x[:1])
        packaged = (f"serve {name}: what `pipe package --engine onnxruntime` packaged (every server below runs "
                    "its model.onnx)", f"{spec['model'].get('variant')} ({spec.get('precision')})", "", "")
        peers.append(_pipe("pipe", "pipe serve", package, tmp, grpc=True))
        if name.startswith("digits"):
            worktree = _worktree(tmp)
            if worktree is not None:
                peers.append(_pipe("before", f"pipe serve before ({BEFORE})", package, tmp, cwd=worktree,
                                   settings=("--predictors", "1", "--threads", "1")))  # one HTTP process then
        kserve = _kserve(package, model, tmp)
        if kserve is not None:
            peers.append(kserve)
        seconds, rounds = (2.0, 1) if quick else (8.0, 2)
        path = f"/v2/models/{model}/infer"
        gc_before = {p.key: _gc_seconds(p.http) for p in peers if p.key == "pipe"}
        for _ in range(rounds):
            for p in peers:
                _measure(p, "http16", lambda: loadgen.run(p.http, bodies, _CONNS, seconds=seconds, path=path))
                if p.grpc:
                    _measure(p, "grpc16", lambda: _grpc_load(p.grpc, grpc_request, _CONNS, seconds))
                _measure(p, "http1", lambda: loadgen.run(p.http, bodies, 1, seconds=seconds / 2, path=path))
        gc_after = {p.key: _gc_seconds(p.http) for p in peers if p.key == "pipe"}
        return [packaged, *_rows(name, peers, gc_before, gc_after, kserve is not None)]
    finally:
        for p in peers:
            serving.stop(p.proc)
        if worktree is not None:
            subprocess.run(["git", "-C", str(_REPO), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(p: _Peer, load: str, go: Any) -> None:
    cpu0 = _cpu_s(p.proc.pid)
    r = go()
    r["cpu_ms"] = (_cpu_s(p.proc.pid) - cpu0) * 1000 / max(1, r["done"])
    if r["errors"]:
        raise PipeError(f"bench: {p.label}: {r['errors']} errors in {load}")
    p.results.setdefault(load, []).append(r)


def _rows(name: str, peers: list[_Peer], gc0: dict, gc1: dict, kserve: bool) -> list[Row]:
    def med(p: _Peer, load: str, key: str) -> float:
        return statistics.median(r[key] for r in p.results[load])

    def each(p: _Peer, load: str, key: str, fmt: str = "{:.0f}") -> str:
        return "/".join(fmt.format(r[key]) for r in p.results[load])

    out: list[Row] = []
    what = f"serve {name}, /v2 JSON infer, onnxruntime 1 thread"
    by = {p.key: p for p in peers}
    for p in peers:
        out.append((f"{what}: {p.label}, {_CONNS} connections: requests/s (per round), p50 / p99 ms",
                    f"{med(p, 'http16', 'rate'):.0f} ({each(p, 'http16', 'rate')}), "
                    f"{med(p, 'http16', 'p50'):.1f} / {med(p, 'http16', 'p99'):.1f}", "", ""))
        if p.grpc:
            out.append((f"{what}: {p.label}, gRPC (raw tensor bytes), {_CONNS} concurrent calls: requests/s, "
                        "p50 / p99 ms, and gRPC / HTTP requests/s",
                        f"{med(p, 'grpc16', 'rate'):.0f} ({each(p, 'grpc16', 'rate')}), "
                        f"{med(p, 'grpc16', 'p50'):.1f} / {med(p, 'grpc16', 'p99'):.1f}; "
                        f"{med(p, 'grpc16', 'rate') / med(p, 'http16', 'rate'):.2f}x", "reported", ""))
        out.append((f"{what}: {p.label}, 1 connection: p50 ms (per round)",
                    f"{med(p, 'http1', 'p50'):.2f} ({each(p, 'http1', 'p50', '{:.2f}')})", "reported", ""))
        out.append((f"{what}: {p.label}: CPU ms per request of the server's own process, {_CONNS} connections "
                    "HTTP (per round)", f"{med(p, 'http16', 'cpu_ms'):.3f} ({each(p, 'http16', 'cpu_ms', '{:.3f}')})",
                    "reported", ""))
    pipe = by["pipe"]
    requests = sum(r["done"] for rs in pipe.results.values() for r in rs)
    gc = {proc: (gc1["pipe"].get(proc, 0.0) - gc0["pipe"].get(proc, 0.0)) * 1e4 / max(1, requests)
          for proc in sorted(gc1["pipe"])}
    out.append((f"{what}: pipe serve: collector pause seconds per 10,000 requests (every load above, "
                f"{requests} requests), by process", ", ".join(f"{k} {v:.4f}" for k, v in gc.items()) or "none",
                "reported", ""))
    if "before" in by:
        a, b = med(pipe, "http16", "cpu_ms"), med(by["before"], "http16", "cpu_ms")
        out.append((f"{what}: HTTP process CPU ms per request, pipe serve / before ({BEFORE})",
                    f"{a / b:.2f}x ({a:.3f} vs {b:.3f} ms)", "< 1x", "met" if a < b else "**missed**"))
        out.append((f"{what}: p99 at {_CONNS} connections, pipe serve / before ({BEFORE})",
                    f"{med(pipe, 'http16', 'p99') / med(by['before'], 'http16', 'p99'):.2f}x", "reported", ""))
    if kserve:
        k = by["kserve"]
        out.append((f"{what}: requests/s at {_CONNS} connections, pipe serve / KServe ModelServer",
                    f"{med(pipe, 'http16', 'rate') / med(k, 'http16', 'rate'):.2f}x", "reported", ""))
    else:
        out.append((f"{what}: KServe ModelServer", f"not measured: no {_KSERVE} (`make bench` creates it)", "", ""))
    return out


# ------------------------------------------------------------------ packages


def _digits(tmp: Path, quick: bool, repackage: bool = True) -> Path:
    """`pipe all --config examples/digits.yaml`'s run, packaged again by `_package`, or (not `repackage`) its
    own RUN/package as a user gets it."""
    from pipeline.bench import compress as bc

    run = tmp / "run"
    sets = ("train.epochs=1", "compress.max_drop=100", "compress.min_agreement=0", *bc.QUICK_TIMING) if quick else ()
    bc.pipe("all", "--config", str(_REPO / "examples/digits.yaml"), "--run", str(run), *bc.sets(sets), cwd=tmp)
    return _package(run / "compress") if repackage else run / "package"


def _mobilenet(tmp: Path, quick: bool) -> Path:
    from pipeline.bench import compress as bc

    run = tmp / "run"
    data = bc.synthetic(tmp / "synthetic.npz")
    bc.pipe("train", "--data", str(data), "--model", "mobilenet_v3_small", "--epochs", "1", "--run", str(run), cwd=tmp)
    bc.pipe("export", str(run / "train"), cwd=tmp)
    bc.pipe("compress", str(run / "export"), "--int8", "--backend", "onnxruntime", "--calib-batches", "4", "--max-drop", "100",
            *bc.sets(("compress.min_agreement=0", *bc.QUICK_TIMING)), cwd=tmp)
    return _package(run / "compress")


def _package(comp: Path) -> Path:
    """The fastest onnxruntime variant, with its Triton repository (the same model.onnx) and 1 thread."""
    from pipeline.bench import compress as bc

    out = comp.parent / "package"
    bc.pipe("package", str(comp), "--engine", "onnxruntime", "--out", str(out), cwd=comp.parent)
    model = serving.yaml.safe_load((out / "serving.yaml").read_text(encoding="utf-8"))["triton"]["model"]
    if (out / "model.onnx").read_bytes() != (out / "triton" / model / "1/model.onnx").read_bytes():
        raise PipeError(f"bench: {out}: the Triton repository's model.onnx is not the one pipe serves")
    return out


# ------------------------------------------------------------------ servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pipe(key: str, label: str, package: Path, tmp: Path, grpc: bool = False, cwd: Path | None = None,
          prefix: list[str] | None = None,
          settings: tuple[str, ...] = ("--http-workers", "1", "--predictors", "1", "--threads", "1")) -> _Peer:
    """`pipe serve` with `settings` (default one HTTP process, 1 predictor x 1 thread, as the single-process
    peers; () = the package's defaults); from `cwd`
    (a worktree) its own code is imported first; `prefix` runs it under another command (perf.pinning's taskset)."""
    grpc_port = _free_port() if grpc else 0
    cmd = [*(prefix or []), sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0", *settings,
           *(["--grpc-port", str(grpc_port)] if grpc else [])]
    env = dict(os.environ, PYTHONPATH=str(cwd)) if cwd else None
    log = tmp / f"{key}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=cwd or _REPO, stdout=sink, stderr=subprocess.STDOUT, env=env)
    m = _wait(proc, log, re.compile(r"listening on (http://127\.0\.0\.1:\d+)"), "/readyz")
    return _Peer(key, label, proc, m, f"127.0.0.1:{grpc_port}" if grpc else "")


def _worktree(tmp: Path) -> Path | None:
    path = tmp / "before"
    r = subprocess.run(["git", "-C", str(_REPO), "worktree", "add", "--detach", str(path), BEFORE],
                       capture_output=True, text=True, check=False)
    return path if r.returncode == 0 else None


def _triton(package: Path, tmp: Path, prefix: list[str] | None = None, one_thread: bool = True) -> _Peer | None:
    """tritonserver on the package's Triton repository: a copy with onnxruntime held to 1 thread (`one_thread`,
    as `_pipe`'s default), else the package's own `triton/` as `pipe package` wrote it."""
    server = _PYTRITON / "pytriton/tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not (server / "bin/tritonserver").is_file() or not stub.is_file():
        return None
    backends = tmp / "triton-backends"  # copies: Triton refuses a backend whose real path escapes the directory
    (backends / "python").mkdir(parents=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends/python" / f, backends / "python" / f)
    shutil.copy2(stub, backends / "python/triton_python_backend_stub")
    (backends / "onnxruntime").mkdir()
    shutil.copy2(_SHIM, backends / "onnxruntime/model.py")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(_PYTRITON / "nvidia_pytriton.libs"),
                                                             sysconfig.get_config_var("LIBDIR"),
                                                             os.environ.get("LD_LIBRARY_PATH")])),
               **({"OMP_NUM_THREADS": "1"} if one_thread else {}))
    repo = package / "triton"
    if one_thread:  # a copy of the package's repository with onnxruntime held to 1 thread
        repo = tmp / "triton-repo"
        shutil.copytree(package / "triton", repo)
        for config in repo.glob("*/config.pbtxt"):
            with config.open("a", encoding="utf-8") as f:
                f.write("".join(f'parameters {{ key: "{k}" value: {{ string_value: "1" }} }}\n'
                                for k in ("intra_op_thread_count", "inter_op_thread_count")))
    http, grpc = _free_port(), _free_port()
    cmd = [*(prefix or []), str(server / "bin/tritonserver"), f"--model-repository={repo}",
           f"--backend-directory={backends}", "--http-address=127.0.0.1", f"--http-port={http}",
           "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false"]
    log = tmp / "triton.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    url = f"http://127.0.0.1:{http}"
    _wait(proc, log, None, "/v2/health/ready", url)
    return _Peer("triton", "tritonserver 2.51", proc, url, f"127.0.0.1:{grpc}")


def _kserve(package: Path, model: str, tmp: Path) -> _Peer | None:
    if not _KSERVE.is_file():
        return None
    http, grpc = _free_port(), _free_port()
    log = tmp / "kserve.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(_KSERVE), str(_REPO / "pipeline/bench/kserve_peer.py"), str(package / "model.onnx"),
                                 model, str(http), str(grpc), "1"], stdout=sink, stderr=subprocess.STDOUT, cwd=tmp,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    url = f"http://127.0.0.1:{http}"
    _wait(proc, log, None, f"/v2/models/{model}/ready", url)
    return _Peer("kserve", "KServe 0.21 ModelServer", proc, url, f"127.0.0.1:{grpc}")


def _wait(proc: subprocess.Popen, log: Path, line: re.Pattern | None, ready: str, url: str = "") -> str:
    """Until `ready` answers 200 (the URL from `line` in the log, else `url`); the URL."""
    import httpx

    deadline = time.monotonic() + _START_S
    with httpx.Client(timeout=5) as c:
        while True:
            text = log.read_text(errors="replace")
            m = line.search(text) if line else None
            base = m[1] if m else url
            if base:
                with contextlib.suppress(httpx.TransportError):
                    if c.get(base + ready).status_code == 200:
                        return base
            if proc.poll() is not None or time.monotonic() > deadline:
                serving.stop(proc)
                raise PipeError(f"bench: {proc.args[0]} not ready (exit {proc.poll()}): {text.strip()[-400:]}")
            time.sleep(0.2)


def _cpu_s(pid: int) -> float:
    f = serving._stat(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else 0.0


def _gc_seconds(url: str) -> dict[str, float]:
    """pipe_gc_pause_seconds_total summed over generations, by process."""
    import httpx

    out: dict[str, float] = {}
    for m in re.finditer(r'^pipe_gc_pause_seconds_total\{([^}]*)\} (\S+)$', httpx.get(url + "/metrics").text, re.M):
        proc = re.search(r'process="([^"]+)"', m[1])[1]
        out[proc] = out.get(proc, 0.0) + float(m[2])
    return out


# ------------------------------------------------------------------ gRPC load


def _grpc_request(model: str, name: str, x: np.ndarray) -> bytes:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(np.ascontiguousarray(x, np.float32).tobytes())
    return req.SerializeToString()


def _grpc_load(address: str, request: bytes, calls: int, seconds: float) -> dict:
    return asyncio.run(_grpc_run(address, request, calls, seconds))


async def _grpc_run(address: str, request: bytes, calls: int, seconds: float) -> dict:
    import grpc

    latencies: list[float] = []
    errors = [0]
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        with contextlib.suppress(grpc.aio.AioRpcError):  # connected before the clock starts
            await infer(request, timeout=30)
        start = time.perf_counter()
        end = start + seconds

        async def caller() -> None:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    await infer(request, timeout=30)
                except grpc.aio.AioRpcError:
                    errors[0] += 1
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(caller() for _ in range(calls)))
        wall = time.perf_counter() - start
    lat = np.asarray(latencies) * 1000
    return {"rate": len(lat) / wall, "wall": wall, "done": len(lat), "errors": errors[0],
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))}
