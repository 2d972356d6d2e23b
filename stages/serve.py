"""pipe serve: a package over HTTP, FastAPI + uvicorn, a pool of engine predictors with dynamic batching.

    pipe serve runs/exp1/package
    pipe serve runs/exp1/package --port 9000 --max-batch-size 64 --max-wait-ms 5 --predictors 2
    pipe serve runs/exp1/package --http-workers 1                   # one HTTP process (the default: one per core)

Reads a `package/` artifact and nothing else: it refuses to start (exit 2) unless every file's sha256
matches its manifest and the file set is the package allowlist (`pipeline/serving/spec.py`). Each
predictor (the package's engine and precision: Paddle Inference, onnxruntime or OpenVINO; `--engine` runs
another that reads the package's files) runs in its own child process (`pipeline/serving/predictor.py`);
one thread per predictor forms batches from a bounded queue (`pipeline/serving/batcher.py`). Several HTTP
processes (`--http-workers`; by default one per core the process may use, at most 4) each run all of this,
their own predictors included, accepting on the one port, and answer as one server: statistics, metrics and
readiness summed over them (`pipeline/serving/workers.py`). Binds
127.0.0.1 unless `--host` says otherwise (then it warns: no authentication, no TLS). Endpoints:

    POST /v1/predict                    {"inputs": {"img": [...], "feat": [...]}} (every input by name; text:
                                        int64 token ids), an image input also as {"images": {"img": [base64
                                        PNG/JPEG]}}, or {"text": ["...", ...]} (text packages: fills every
                                        input) -> the task's answer (serving.yaml `task:`, pipeline/tasks/):
                                        classification {"labels", "scores", "logits"} from the logits output,
                                        and "outputs": {name: [...]} with every other output; detection
                                        {"detections": [[{"label", "score", "box": [x1, y1, x2, y2]}] per
                                        image]}, boxes in the sent image's pixels (decoded, thresholded and
                                        NMS'd with serving.yaml's task settings); ocr_rec {"lines": [{"text",
                                        "score"}]} per line image, any width (the task prepares and batches
                                        them by width: `tasks.dynamic`). A package of one
                                        input also takes the bare value: {"inputs": [[...]]}, {"images": [...]}
    POST /GeneralModelService/inference Paddle Serving's HttpClient: protobuf (application/proto) or JSON
                                        (`pipeline/serving/wire.py`): one feed per input, the fetched outputs
    POST /v2/models/NAME/infer          the Open Inference Protocol (KServe v2, tritonclient.http): JSON or
                                        binary tensors, every input, every output (raw: detection's heads,
                                        not boxes) or those asked for; text
                                        packages also BYTES (`pipeline/serving/v2.py`);
                                        GET /v2, /v2/health/live|ready, /v2/models/NAME[/ready] (NAME = spec.name),
                                        /v2/models/NAME/config and /stats (Triton's model configuration and
                                        statistics extensions: `v2.model_config`, `pipeline/serving/stats.py`)
    gRPC on --grpc-port (off by default)  the Open Inference Protocol's GRPCInferenceService, Triton's, for
                                        tritonclient.grpc (`pipeline/serving/grpcv2.py`): the same checks, limits,
                                        batching and statistics
    GET  /v1/model  /livez  /readyz  /metrics  /openapi.json  /docs (offline Swagger UI, if fastapi-offline
                                        is installed; see `pipeline/serving/openapi.py`)

Every tensor comes from the package's io description (`spec.io`: public name, dtype, shape, the logits
role; every endpoint shows and takes the public names, the program's stay inside the engines); requests
are checked per input and reach the batcher as a dict of named arrays (`pipeline/serving/validate.py`).
Text packages tokenize in the server with the package's vocab.json and
the training encoder (`pipeline.data.encode_texts`), and make every model input from the ids by the rule
the package's preprocessing records (`pipeline.data.text_inputs`); text and token ids are truncated to
max_len and padded to max_len, as in training, so a sample gets the same logits alone or batched with
texts of other lengths.

Limits (defaults in the package's serving.yaml, flags override; `pipeline/serving/validate.py`): body cap
-> 413 (Content-Length, then while reading; a client still sending reads it: `pipeline/serving/lingering.py`);
content type -> 415; JSON depth, NaN/Infinity, invalid UTF-8
-> 400; a missing, unknown or repeated input, one input's dtype, rank, shape or token ids against the
package's tensors, inputs of different batch sizes, empty text, text on an image model or images on a
text model -> 422 (one line naming the input and what was expected; never echoing input);
queue full -> 503 + Retry-After; per-request timeout -> 504 (408 while still reading the body). Errors
always have the schema {"error": {"code", "type", "message"}} (on /v2 the protocol's {"error": "..."}, a 422
answered 400). Before it listens, every predictor runs the package's
reference set (`pipeline/reference.py`): below the package's agreement budget it exits 4 with one line (the
engine, this CPU's int8 capability, the numbers, the fp32 re-package command). `/readyz` is 200 only after
every predictor ran a warm-up batch of each bucket size (batches run padded to 1, 2, 4, ... max_batch_size samples: see
`pipeline/serving/predictor.py`), and 503 while draining. SIGTERM (or Ctrl-C): stop admitting requests,
finish the in-flight ones (at most `drain_s`), exit 0; a second signal exits at once. After warm-up every
process freezes its start-up objects for the garbage collector (`pipeline/serving/gcpause.py`).
"""

import asyncio
import logging
import queue
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import __version__, runtime
from pipeline.errors import GateError, InputError, PipeError
from pipeline.serving import gcpause, openapi, spec as spec_mod, v2, validate, wire, workers
from pipeline.serving.batcher import Batcher, Job
from pipeline.serving.predictor import START_S, PredictorProcess, engine_for, start_predictors
from pipeline.serving import stats as stats_mod
from pipeline.serving.spec import Settings, Spec
from pipeline.serving.validate import ApiError

_PATHS = ("/v1/predict", "/GeneralModelService/inference", "/v1/model", "/livez", "/readyz", "/metrics",
          "/docs", "/openapi.json", *(f"/docs/{name}" for name in openapi.DOCS_ASSETS))
_KEEP_ALIVE_S = 15  # idle keep-alive connections close after this, s (longer than clients keep them)
_SHUTDOWN_GRACE_S = 2.0  # after the drain: idle keep-alive connections close, stragglers are cancelled
log = logging.getLogger("pipe.serve")


@dataclass(frozen=True)
class ServeConfig:
    """`pipe serve` flags; None takes the package's serving.yaml value."""

    host: str = "127.0.0.1"
    """Address to bind. Anything but 127.0.0.1 is reachable from elsewhere and warns."""
    port: int = 8000
    """TCP port; 0 picks a free one (printed at start)."""
    grpc_port: int = 0
    """The Open Inference Protocol over gRPC (`pipeline/serving/grpcv2.py`) on this port, beside HTTP; 0 = off."""
    engine: str = ""
    """The engine to run the package on; '' = serving.yaml's `model.engine`. It must run the package's files."""
    device: str = "cpu"
    """cpu, or gpu / gpu:N (CUDA for Paddle Inference and onnxruntime, OpenVINO's GPU plugin): the same code
    path, never run here (no machine of ours has a GPU); a device that is not there exits 2."""
    http_workers: int | None = None
    """HTTP processes accepting on the one port, each with its own predictors (`pipeline/serving/workers.py`);
    0 = one per core the process may use, at most 4."""
    predictors: int | None = None
    """Predictor processes in the pool (of each HTTP process), each running one engine instance."""
    threads: int | None = None
    """CPU math threads per predictor; 0 = (cores - HTTP processes) / (HTTP processes x predictors), at least 1."""
    max_batch_size: int | None = None
    """Most samples per predictor run; also the most samples one request may carry."""
    max_wait_ms: float | None = None
    """How long a batch waits for more requests after its first."""
    queue_size: int | None = None
    """Requests waiting for a predictor before new ones get 503."""
    timeout_s: float | None = None
    """Per-request deadline: 408 while reading the body, 504 while waiting for the result."""
    max_body_bytes: int | None = None
    """Request body cap (413), also after gzip decompression."""
    drain_s: float | None = None
    """On SIGTERM, how long in-flight requests may take before the server exits anyway."""


def run(cfg: ServeConfig, package_dir: Path) -> None:
    """Verify the package, load the predictors, serve until SIGTERM/SIGINT, drain, return (exit 0). An OCR system
    package (`pipeline/ocr_package.py`) is served by `pipeline/serving/system.py`."""
    from pipeline import ocr_package

    place = workers.current()
    if place is not None:  # one HTTP process of several: the supervisor's flags (pipeline/serving/workers.py)
        workers.die_with_parent()
        cfg = ServeConfig(**place.config)
    if (Path(package_dir) / ocr_package.SYSTEM_FILE).is_file():
        from pipeline.serving import system

        return system.run(cfg, Path(package_dir))
    spec = spec_mod.load_package(Path(package_dir))
    validate.check_text_rule(spec)  # text fills every input (exit 2 before anything starts)
    settings = spec_mod.settings(cfg, spec)
    engine = engine_for(spec, cfg.engine)  # exit 2 before anything starts: unknown, missing, cannot run these files
    runtime.device_index(cfg.device, "--device")
    if cfg.host != "127.0.0.1":
        print(f"pipe serve: warning: listening on {cfg.host}, reachable from other machines; this server has "
              "no authentication or TLS (put a proxy in front of it)", file=sys.stderr)
    if place is not None:
        return _run_worker(cfg, spec, settings, engine, place)
    sock = _bind(cfg.host, cfg.port)
    if cfg.grpc_port:
        if cfg.grpc_port == cfg.port:
            sock.close()
            raise InputError(f"--grpc-port {cfg.grpc_port}: the same port as --port")
        try:
            _bind(cfg.host, cfg.grpc_port, "--grpc-port").close()  # free now (exit 2 if not); gRPC binds it later
        except InputError:
            sock.close()
            raise
    if settings.http_workers > 1:
        return _supervise(cfg, spec, settings, engine, sock, Path(package_dir))
    # [signal] Until uvicorn installs its handlers nothing is in flight: a SIGTERM while loading exits 0.
    previous = signal.signal(signal.SIGTERM, _exit_while_loading)
    preds: list[PredictorProcess] = []
    try:
        preds = start_predictors(spec, settings.predictors, settings.threads, settings.max_batch_size, engine,
                                 cfg.device)
        checked = _reference_check(spec, settings, preds)
        state = _State(spec, settings, preds, checked)
        state.grpc_address = (cfg.host, cfg.grpc_port) if cfg.grpc_port else None
        server = _make_server(state, sock)
        if cfg.grpc_port:
            print(f"pipe serve: gRPC (Open Inference Protocol) on {_url_host(cfg.host)}:{cfg.grpc_port}", flush=True)
        print(_banner(spec, settings, engine, sock), flush=True)
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        for pred in preds:
            pred.close()
    _stopped(state.handled, state.inflight, settings)


def _banner(spec: Spec, s: Settings, engine: str, sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    each = f"{s.http_workers} HTTP processes, each " if s.http_workers > 1 else ""
    return (f"pipe serve: {spec.name} ({engine} {spec.precision}, {each}{s.predictors} predictor(s) x {s.threads} "
            f"thread(s), batch <= {s.max_batch_size}, wait {s.max_wait_ms:g} ms) listening on "
            f"http://{_url_host(host)}:{port}")


def _stopped(handled: int, left: int, s: Settings) -> None:
    print(f"pipe serve: stopped ({handled} inference requests handled"
          + (f", {left} still in flight after the {s.drain_s:g} s drain" if left else "") + ")", flush=True)


def _supervise(cfg: ServeConfig, spec: Spec, s: Settings, engine: str, sock: socket.socket, package: Path) -> None:
    """Several HTTP processes on the bound `sock` (`pipeline/serving/workers.py`); this one supervises them."""
    try:
        if cfg.grpc_port:
            print(f"pipe serve: gRPC (Open Inference Protocol) on {_url_host(cfg.host)}:{cfg.grpc_port}", flush=True)
        handled, left = workers.supervise(sock, s.http_workers, s.predictors, s.max_batch_size, asdict(cfg),
                                          package, _banner(spec, s, engine, sock), s.drain_s)
    finally:
        sock.close()
    _stopped(handled, left, s)


def _run_worker(cfg: ServeConfig, spec: Spec, s: Settings, engine: str, place: workers.Place) -> None:
    """One HTTP process of several: the supervisor's socket, its own predictors, the shared board (and gRPC's
    port, shared); worker 0 runs the reference check for all (the same engine, package and threads)."""
    sock = socket.socket(fileno=place.fd)
    board = workers.Board.at(place.dir, place.workers, s.predictors, s.max_batch_size)
    preds: list[PredictorProcess] = []
    state: _State | None = None
    previous = signal.signal(signal.SIGTERM, _exit_while_loading)
    try:
        try:
            preds = start_predictors(spec, s.predictors, s.threads, s.max_batch_size, engine, cfg.device)
            if place.index == 0:
                checked = _reference_check(spec, s, preds)
                workers.write_reference(place, checked)
            else:
                checked = workers.read_reference(place, START_S)
        except PipeError as e:  # the supervisor says it, once for every worker
            workers.write_failure(place, e)
            raise SystemExit(e.exit_code) from None
        state = _State(spec, s, preds, checked, board=board, index=place.index)
        state.grpc_address = (cfg.host, cfg.grpc_port) if cfg.grpc_port else None
        server = _make_server(state, sock)
        board.set_state(place.index, workers.LOADED)
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        if state is not None:
            state.publish()  # the last counts, for the supervisor's summary
        sock.close()
        for pred in preds:
            pred.close()


def _reference_check(spec: Spec, s: Settings, preds: list[PredictorProcess]) -> dict[str, Any] | None:
    """Run the package's reference set (`pipeline/reference.py`) on every predictor, before anything is
    served: the numbers this engine computes on this CPU. Below the package's budget: exit 4."""
    from pipeline import cpu, reference

    worst, budget = reference.check(spec, [p.run for p in preds], s.max_batch_size)
    if worst is None:
        print("pipe serve: warning: this package has no reference set (made by an older pipe): its numbers on "
              "this CPU are not checked; re-package it to get one", file=sys.stderr)
        return None
    engine = preds[0].engine
    where = f"{engine.get('engine', 'paddle_inference')} {spec.precision} on this CPU ({cpu.summary()})"
    if not reference.verdict(worst, budget):
        raise GateError(reference.failure(worst, budget, where, spec.dir))
    print(f"pipe serve: {reference.describe(worst, budget)} on {where}", flush=True)
    return {**worst, "min_agreement": budget, "passed": True, "engine": engine, "cpu": cpu.capability()}


def _exit_while_loading(sig: int, frame: Any) -> None:
    raise SystemExit(0)


# ------------------------------------------------------------------ socket


def _bind(host: str, port: int, flag: str = "--port") -> socket.socket:
    if not 0 <= port <= 65535:
        raise InputError(f"{flag}: must be 0..65535, got {port}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror:
        raise InputError(f"--host {host}: not an address of this machine") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise InputError(f"{flag} {port}: cannot listen on {host}:{port} ({e.strerror})") from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ------------------------------------------------------------------ metrics


def request_metrics(r: Any) -> tuple[Any, Any]:
    """The HTTP server's request count by endpoint and status code, and its latency by endpoint, in registry `r`
    (what `_Observe` records)."""
    from prometheus_client import Counter, Histogram

    return (Counter("pipe_requests", "HTTP requests by endpoint and status code", ["endpoint", "code"], registry=r),
            Histogram("pipe_request_duration_seconds", "Request latency, first byte in to response", ["endpoint"],
                      registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)))


class _Metrics:
    """prometheus-client metrics in a registry of our own (not the process-global one). In an HTTP process of
    several (`state.board`) the counters and histograms are prometheus-client's multiprocess values and the
    gauges come from the board (`_BoardCollector`): `exposition` sums every process's."""

    def __init__(self, state: "_State"):
        from prometheus_client import CollectorRegistry, Gauge, Histogram

        self.state = state
        r = self.registry = CollectorRegistry()
        self.requests, self.latency = request_metrics(r)
        sizes = tuple(float(2 ** i) for i in range(13))
        self.batch = Histogram("pipe_batch_size", "Samples per predictor run", registry=r, buckets=sizes)
        self.batch_requests = Histogram("pipe_batch_requests", "Requests merged into one predictor run",
                                        registry=r, buckets=sizes)
        self.infer = Histogram("pipe_inference_duration_seconds", "Predictor run time per batch", registry=r,
                               buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        if state.board is not None:
            return
        Gauge("pipe_queue_depth", "Requests waiting for a predictor", registry=r).set_function(
            lambda: state.batcher.q.qsize())
        Gauge("pipe_inflight_requests", "Inference requests being handled", registry=r).set_function(
            lambda: state.inflight)
        Gauge("pipe_ready", "1 once warmed up and not draining", registry=r).set_function(
            lambda: float(state.is_ready()))
        if state.reference is not None and state.reference.get("top1_agreement") is not None:  # at start-up
            Gauge("pipe_reference_top1_agreement", "Top-1 agreement with the package's fp32 reference outputs, "
                  "measured here at start-up", registry=r).set(state.reference["top1_agreement"])
            Gauge("pipe_reference_max_abs_diff", "max|diff| against the package's fp32 reference outputs, measured "
                  "here at start-up", registry=r).set(state.reference["max_abs_diff"])
        if state.reference is not None and state.reference.get("agreement") is not None:  # a task's digest
            Gauge("pipe_reference_agreement", "Share of the reference samples answered as fp32 answered them "
                  "(the task's reference_agreement, e.g. ocr_rec's decoded texts), measured here at start-up",
                  registry=r).set(state.reference["agreement"])

        r.register(_GcCollector(state))

    def exposition(self) -> bytes:
        """/metrics' body: this process's registry, or in a server of several every process's sum."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self.state.board is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        r = CollectorRegistry()
        MultiProcessCollector(r)  # PROMETHEUS_MULTIPROC_DIR, set by the supervisor
        r.register(_BoardCollector(self.state))
        return generate_latest(r)

    def observe_batch(self, samples: int, requests: int, seconds: float) -> None:
        self.batch.observe(samples)
        self.batch_requests.observe(requests)
        self.infer.observe(seconds)


class _GcCollector:
    """The cyclic collector's pauses (`pipeline/serving/gcpause.py`) of this process ("server") and of each
    predictor process (as of its last batch), by generation."""

    def __init__(self, state: "_State"):
        self.state = state

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        count = CounterMetricFamily("pipe_gc_collections", "Garbage collections by process and generation",
                                    labels=["process", "generation"])
        seconds = CounterMetricFamily("pipe_gc_pause_seconds", "Seconds spent in garbage collection by process "
                                      "and generation", labels=["process", "generation"])
        pauses = [("server", self.state.pauses.snapshot())]
        pauses += [(f"predictor-{i}", p.gc) for i, p in enumerate(self.state.batcher.preds) if p.gc]
        for process, gens in pauses:
            for g, (c, s) in enumerate(gens):
                count.add_metric([process, str(g)], c)
                seconds.add_metric([process, str(g)], s)
        yield count
        yield seconds


class _BoardCollector:
    """The gauges and garbage-collector counters of a server of several HTTP processes, from the board
    (`pipeline/serving/workers.py`): queue and in-flight summed, ready only when every process is, the reference
    check as worker 0 measured it, the collector's pauses of every process (labelled as in a server of one, and
    by `worker`), and the requests each HTTP process handled."""

    def __init__(self, state: "_State"):
        self.state = state

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st, board = self.state, self.state.board
        yield GaugeMetricFamily("pipe_queue_depth", "Requests waiting for a predictor", value=board.total("queue"))
        yield GaugeMetricFamily("pipe_inflight_requests", "Inference requests being handled",
                                value=board.total("inflight"))
        yield GaugeMetricFamily("pipe_ready", "1 once warmed up and not draining", value=float(st.is_ready()))
        ref = st.reference or {}
        for key, name, doc in (("top1_agreement", "pipe_reference_top1_agreement", "Top-1 agreement with the "
                                "package's fp32 reference outputs, measured here at start-up"),
                               ("max_abs_diff", "pipe_reference_max_abs_diff", "max|diff| against the package's "
                                "fp32 reference outputs, measured here at start-up"),
                               ("agreement", "pipe_reference_agreement", "Share of the reference samples answered "
                                "as fp32 answered them, measured here at start-up")):
            if ref.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=ref[key])
        count = CounterMetricFamily("pipe_gc_collections", "Garbage collections by process and generation",
                                    labels=["process", "generation", "worker"])
        seconds = CounterMetricFamily("pipe_gc_pause_seconds", "Seconds spent in garbage collection by process "
                                      "and generation", labels=["process", "generation", "worker"])
        for w, process, gens in board.gc():
            for g, (c, sec) in enumerate(gens):
                count.add_metric([process, str(g), str(w)], c)
                seconds.add_metric([process, str(g), str(w)], sec)
        yield count
        yield seconds
        handled = CounterMetricFamily("pipe_worker_inference_requests", "Inference requests handled by each HTTP "
                                      "process", labels=["worker"])
        for w, n in enumerate(board.handled()):
            handled.add_metric([str(w)], n)
        yield handled


# ------------------------------------------------------------------ the application


class _State:
    def __init__(self, spec: Spec, s: Settings, preds: list[Any], reference: dict[str, Any] | None = None,
                 board: workers.Board | None = None, index: int = 0):
        self.spec, self.s = spec, s
        self.reference = reference
        self.board, self.index = board, index  # a server of several HTTP processes: the shared board, our row
        # a process that replaces a dead one goes on from its count (the summary and the per-process counter)
        self.handled_before = board.handled()[index] if board is not None else 0
        self.engine = preds[0].engine if preds else {}
        self.model_config = v2.model_config(spec, s, self.engine.get("engine", spec.engine))
        self.inflight = 0
        self.handled = 0
        self.drain_started: float | None = None
        self.grpc_address: tuple[str, int] | None = None  # (host, port) of the gRPC server, if one
        self.pauses = gcpause.Pauses()
        self.stats = stats_mod.Stats(s.max_batch_size) if board is None else board.stats(index)
        self.metrics = _Metrics(self)
        # Once every predictor is warm, before /readyz says so: start-up's objects frozen (gcpause)
        self.batcher = Batcher(preds, spec, s, self.metrics, lambda: self.inflight, on_ready=self._warm,
                               stats=self.stats)
        self.messages = wire.messages()

    def _warm(self) -> None:
        gcpause.settle()
        if self.board is not None:
            self.board.set_state(self.index, workers.READY)

    def is_ready(self) -> bool:
        """Warm and not draining (and, in a server of several HTTP processes, every one of them warm)."""
        return (self.batcher.ready.is_set() and self.drain_started is None
                and (self.board is None or self.board.all_ready()))

    def publish(self) -> None:
        """This process's gauges onto the board (a server of several HTTP processes; every 0.1 s and at exit)."""
        if self.board is not None:
            self.board.publish(self.index, self.inflight, self.batcher.q.qsize(), self.handled_before + self.handled,
                               [self.pauses.snapshot(), *(p.gc for p in self.batcher.preds)])

    async def admitted(self, work: Any) -> Any:
        """Everything that runs a predictor, on any protocol: admission (ready, not draining), the in-flight
        count, the request's deadline (`work(deadline)`), Triton's success/fail statistics."""
        if self.drain_started is not None:
            raise ApiError(503, "draining", "the server is shutting down; retry on another instance",
                           {"Retry-After": "1", "Connection": "close"})
        if not self.batcher.ready.is_set():
            raise ApiError(503, "not_ready", "the model is warming up; retry shortly", {"Retry-After": "1"})
        self.inflight += 1
        t0 = time.perf_counter_ns()
        ok = False
        try:
            answer = await work(time.monotonic() + self.s.timeout_s)
            ok = True
            return answer
        finally:
            self.stats.request(ok, time.perf_counter_ns() - t0)
            self.inflight -= 1
            self.handled += 1

    async def infer(self, feeds: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
        """Checked feeds (every input by program name, one batch size) -> every output by program name."""
        s = self.s
        loop = asyncio.get_running_loop()
        job = Job(feeds, len(next(iter(feeds.values()))), loop.create_future(), loop)
        try:
            self.batcher.submit(job)
        except queue.Full:
            raise ApiError(503, "overloaded", f"{s.queue_size} requests are already waiting; retry later",
                           {"Retry-After": "1"}) from None
        try:
            ys = await asyncio.wait_for(job.future, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise ApiError(504, "timeout", f"no result within the {s.timeout_s:g} s request timeout") from None
        bad = next((name for name, y in ys.items() if y.dtype.kind == "f" and not np.isfinite(y).all()), None)
        if bad is not None:
            public = next(t.public for t in self.spec.io.outputs if t.name == bad)
            raise ApiError(422, "non_finite_output", f"the model's output {public!r} is not finite for these "
                                                      "inputs (values far outside the training range?)")
        return ys

    def model_info(self) -> dict[str, Any]:
        """GET /v1/model. `inputs` and `outputs` list every tensor (public name, also as `alias`, dtype,
        shape; the logits output's role); `output` is the logits output (None for a task without logits) and, for a
        package of one input, `input` that input (the fields of packages before names); `task` what /v1
        answers (name, spec, postprocessing settings)."""
        sp, s = self.spec, self.s
        io_ = sp.io
        one = {"input": _tensor_info(io_.inputs[0])} if len(io_.inputs) == 1 else {}
        return {
            "name": sp.name, "precision": sp.precision, "format": sp.fmt, **one,
            "output": _tensor_info(io_.output(sp.info.logits)) if sp.info.logits else None,
            "task": {"name": sp.task.name, "spec": (sp.doc.get("task") or {}).get("spec", "classification"),
                     "settings": sp.info.settings},
            "inputs": [_tensor_info(t) for t in io_.inputs],
            "outputs": [{**_tensor_info(t), **({"role": t.role} if t.role else {})} for t in io_.outputs],
            "labels": sp.labels, "preprocessing": sp.preprocessing,
            "accepts_images": validate.takes_images(sp),
            "accepts_text": sp.text is not None,
            "text": _text_info(sp),
            "batching": {"max_batch_size": s.max_batch_size, "max_wait_ms": s.max_wait_ms,
                         "http_workers": s.http_workers, "predictors": s.predictors, "threads": s.threads},
            "limits": {"max_body_bytes": s.max_body_bytes, "max_json_depth": s.max_json_depth,
                       "queue_size": s.queue_size, "timeout_s": s.timeout_s, "max_image_pixels": s.max_image_pixels},
            "package_manifest_sha256": sp.manifest_sha256,
            "engine": self.engine,
            "reference_check": self.reference,
        }


def _tensor_info(t: Any) -> dict[str, Any]:
    # `alias` kept, equal to `name`, for clients of /v1/model written when `name` was the program's
    return {"name": t.public, "alias": t.public, "dtype": t.dtype, "shape": list(t.shape)}


def _text_info(sp: Spec) -> dict[str, Any] | None:
    """How a text package reads its input (no vocabulary contents: that is the package's vocab.json)."""
    if sp.text is None:
        return None
    return {**sp.text.section, "padding": f"right, with pad_id to max_len ({sp.text.max_len})",
            "truncation": f"to max_len ({sp.text.max_len}) characters or ids",
            "fields": {"text": "list of 1..max_batch_size non-blank strings (filling every input)",
                       "inputs": "int64 token ids [N, L], L >= 1, by input name (one input: also bare)"}}


async def serve_v1(state: _State, request: Any, deadline: float) -> Any:
    """POST /v1/predict on `state`'s model (read, checked, batched, answered as its task answers)."""
    from fastapi.responses import JSONResponse

    spec, s, infer = state.spec, state.s, state.infer
    body = await validate.read_body(request, ("application/json",), s, deadline)
    doc = validate.parse_json(body, s.max_json_depth)
    if validate.task_images(spec) and isinstance(doc, dict) and "images" in doc:
        # a task that prepares images (ocr_rec: lines of any width): its batches, one shape each, run
        # through the batcher together with every other request's, answered in the request's order
        groups, sizes = await validate.v1_task_images(doc, spec, s)
        outs = await asyncio.gather(*(infer(feeds, deadline) for _, feeds in groups))
        return JSONResponse(validate.v1_answers(groups, list(outs), spec, sizes))
    feeds, sizes = await validate.v1_request(doc, spec, s)
    return JSONResponse(validate.v1_answer(await infer(feeds, deadline), spec, sizes))


async def serve_v2(state: _State, request: Any, deadline: float) -> Any:
    """POST /v2/models/NAME/infer on `state`'s model (the Open Inference Protocol, `pipeline/serving/v2.py`)."""
    spec, s = state.spec, state.s
    body = await validate.read_body(request, v2.ACCEPTED, s, deadline)
    doc, binary = v2.split(body, request.headers.get(v2.HEADER_LENGTH), s.max_json_depth)
    inputs, outputs = v2.request(doc, binary, spec, s)
    return v2.answer(await state.infer(await v2.tensors(inputs, spec, s), deadline), doc, outputs, spec)


def error_response(code: int, kind: str, message: str, headers: dict[str, str] | None = None,
                   request: Any = None) -> Any:
    """An error's answer: {"error": {"code", "type", "message"}}, or on /v2 the protocol's {"error": "..."}."""
    from fastapi.responses import JSONResponse

    path = request.url.path if request is not None else ""
    if path == "/v2" or path.startswith("/v2/"):  # the Open Inference Protocol's error body
        return JSONResponse({"error": message}, status_code=v2.error_status(code), headers=headers)
    return JSONResponse(validate.error_body(code, kind, message), status_code=code, headers=headers)


def install_errors(app: Any) -> Any:
    """The app's error handlers: every error answered as `error_response` answers it; returns the handler of
    last resort (an unexpected exception: 500, logged, nothing of it in the answer)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    error = error_response

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Any:
        return error(exc.code, exc.kind, exc.message, exc.headers, request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Any:
        code = exc.status_code
        message = str(exc.detail) if code in (404, 405) else "request refused"
        return error(code, validate.KINDS.get(code, "http_error"), message, dict(exc.headers or {}), request)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Any:
        return error(422, "invalid_input", "the request does not match the endpoint's schema", None, request)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Any:
        log.error("pipe serve: internal error: %s: %s", exc.__class__.__name__, exc)
        return error(500, "internal", "internal error", None, request)

    return _internal


def install_health(app: Any, ready: Any, when: str = "after warm-up") -> None:
    """GET /livez and /readyz, and the Open Inference Protocol's server endpoints /v2, /v2/health/live,
    /v2/health/ready (`ready()` raises the 503 while warming up or draining)."""

    @app.get("/livez", summary="The process is up")
    async def livez() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", summary=f"200 {when}; 503 before and while draining")
    async def readyz() -> Any:
        ready()
        return {"status": "ready"}

    @app.get("/v2", summary="Open Inference Protocol: server metadata")
    async def v2_server() -> dict[str, Any]:
        return v2.server_metadata()

    @app.get("/v2/health/live", summary="Open Inference Protocol: the process is up")
    async def v2_live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="Open Inference Protocol: 200 when /readyz is")
    async def v2_health_ready() -> dict[str, bool]:
        ready()
        return {"ready": True}


def _build_app(state: _State) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST
    from starlette.requests import ClientDisconnect

    spec, s = state.spec, state.s

    @asynccontextmanager
    async def lifespan(app: Any):
        state.batcher.start()
        grpc_server = None
        if state.grpc_address is not None:
            from pipeline.serving import grpcv2

            grpc_server = await grpcv2.start(state, *state.grpc_address, shared=state.board is not None)
        yield
        if grpc_server is not None:  # drained already (in-flight gRPC calls count): stop at once
            await grpc_server.stop(_SHUTDOWN_GRACE_S)
        await asyncio.to_thread(state.batcher.stop, 5.0)

    app = FastAPI(title=f"pipe serve: {spec.name}", version=__version__, lifespan=lifespan, redoc_url=None,
                  docs_url=None,
                  description="Inference for a pipe package. Errors: {\"error\": {\"code\", \"type\", \"message\"}} "
                              "(on /v2, the Open Inference Protocol's {\"error\": \"...\"}).")

    error = error_response
    _internal = install_errors(app)

    async def admitted(request: Request, handler: Any) -> Any:
        """Everything that runs a predictor (`_State.admitted`), with the request's own body to read."""
        try:
            return await state.admitted(lambda deadline: handler(request, deadline))
        except ClientDisconnect:
            raise ApiError(400, "client_disconnected", "the client went away before the body was read") from None

    infer = state.infer

    async def predict_v1(request: Request, deadline: float) -> JSONResponse:
        return await serve_v1(state, request, deadline)

    async def predict_serving(request: Request, deadline: float) -> Response:
        body = await validate.read_body(request, ("application/json", "application/proto"), s, deadline)
        proto = validate.media_type(request) == "application/proto"
        if proto:
            req = wire.parse_proto(body, state.messages["Request"])
        else:
            req = wire.check_json(validate.parse_json(body, s.max_json_depth))
        feeds, fetch, log_id = wire.feed(req, spec, s, proto)
        return wire.answer(await infer(feeds, deadline), fetch, log_id, proto, state.messages)

    def ready() -> None:
        """/readyz's and /v2's readiness: 503 before warm-up and while draining."""
        if state.drain_started is not None:
            raise ApiError(503, "draining", "the server is shutting down", {"Retry-After": "1"})
        if not state.batcher.ready.is_set() or (state.board is not None and not state.board.all_ready()):
            raise ApiError(503, "not_ready", "the model is warming up", {"Retry-After": "1"})

    async def predict_v2(request: Request, deadline: float) -> Response:
        return await serve_v2(state, request, deadline)

    what = "text or token ids" if spec.text is not None else "model-input tensors or PNG/JPEG images"
    summary = f"Classify {what}" if spec.info.logits else f"{str(spec.task.name).capitalize()} on {what}"

    @app.post("/v1/predict", summary=summary)
    async def v1_predict(request: Request) -> Any:
        return await admitted(request, predict_v1)

    @app.post("/GeneralModelService/inference", summary="Paddle Serving HttpClient endpoint (protobuf or JSON)")
    async def serving_inference(request: Request) -> Any:
        return await admitted(request, predict_serving)

    # The Open Inference Protocol (KServe v2, `pipeline/serving/v2.py`): tritonclient.http's endpoints.
    install_health(app, ready)

    # Before the model's routes, as in Triton: every model's statistics (get_inference_statistics() unnamed).
    @app.get("/v2/models/stats", summary="Triton's statistics extension: every model's (this server's one)")
    async def v2_all_stats() -> dict[str, Any]:
        return state.stats.doc(spec.name, v2.VERSION)

    model_path, version_path = "/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"

    def v2_model(model_name: str, model_version: str | None = None) -> dict[str, Any]:
        v2.check_model(spec, model_name, model_version)
        return v2.model_metadata(spec)

    def v2_model_ready(model_name: str, model_version: str | None = None) -> dict[str, Any]:
        v2.check_model(spec, model_name, model_version)
        ready()
        return {"name": spec.name, "ready": True}

    async def v2_infer(request: Request, model_name: str, model_version: str | None = None) -> Any:
        v2.check_model(spec, model_name, model_version)
        return await admitted(request, predict_v2)

    # Each twice: the model's path, and with its version (tritonclient's model_version="1").
    @app.get(model_path, summary="Open Inference Protocol: model metadata")
    async def v2_model_metadata(model_name: str) -> dict[str, Any]:
        return v2_model(model_name)

    @app.get(version_path, summary="Open Inference Protocol: model metadata")
    async def v2_version_metadata(model_name: str, model_version: str) -> dict[str, Any]:
        return v2_model(model_name, model_version)

    @app.get(model_path + "/config", summary="Triton's model configuration extension: config.pbtxt's JSON")
    async def v2_model_config(model_name: str) -> dict[str, Any]:
        v2.check_model(spec, model_name)
        return state.model_config

    @app.get(version_path + "/config", summary="Triton's model configuration extension: config.pbtxt's JSON")
    async def v2_version_config(model_name: str, model_version: str) -> dict[str, Any]:
        v2.check_model(spec, model_name, model_version)
        return state.model_config

    @app.get(model_path + "/stats", summary="Triton's statistics extension: counts and ns per stage")
    async def v2_model_stats(model_name: str) -> dict[str, Any]:
        v2.check_model(spec, model_name)
        return state.stats.doc(spec.name, v2.VERSION)

    @app.get(version_path + "/stats", summary="Triton's statistics extension: counts and ns per stage")
    async def v2_version_stats(model_name: str, model_version: str) -> dict[str, Any]:
        v2.check_model(spec, model_name, model_version)
        return state.stats.doc(spec.name, v2.VERSION)

    @app.get(model_path + "/ready", summary="Open Inference Protocol: 200 when /readyz is")
    async def v2_model_is_ready(model_name: str) -> dict[str, Any]:
        return v2_model_ready(model_name)

    @app.get(version_path + "/ready", summary="Open Inference Protocol: 200 when /readyz is")
    async def v2_version_is_ready(model_name: str, model_version: str) -> dict[str, Any]:
        return v2_model_ready(model_name, model_version)

    infer_summary = "Open Inference Protocol: inference (JSON or binary tensors)"

    @app.post(model_path + "/infer", summary=infer_summary)
    async def v2_model_infer(request: Request, model_name: str) -> Any:
        return await v2_infer(request, model_name)

    @app.post(version_path + "/infer", summary=infer_summary)
    async def v2_version_infer(request: Request, model_name: str, model_version: str) -> Any:
        return await v2_infer(request, model_name, model_version)

    # The inference bodies are read by hand (limits first): their schemas come from the package's spec.
    openapi.install(app, spec, s)

    @app.get("/v1/model", summary="Model metadata: io spec, labels, preprocessing, batching, limits")
    async def model() -> dict[str, Any]:
        return state.model_info()

    assets = openapi.docs_assets()
    if assets is not None:  # FastAPI's own /docs page would load Swagger UI from a CDN
        from fastapi.responses import FileResponse

        @app.get("/docs", include_in_schema=False)
        async def docs() -> Any:
            return openapi.docs_page(f"pipe serve: {spec.name}")

        @app.get("/docs/{name}", include_in_schema=False)
        async def docs_asset(name: str) -> Any:
            if name not in openapi.DOCS_ASSETS:  # a fixed set of files: no path from the request reaches disk
                raise ApiError(404, "not_found", "Not Found")
            return FileResponse(assets / name, media_type=openapi.DOCS_ASSETS[name])

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # This model's inference endpoints by their exact paths, past FastAPI: its routing, dependency and
    # middleware layers were ~10% of the HTTP process's CPU per /v2 request (py-spy, digits) and do nothing
    # for a body read by hand. Any other path or method, and the errors' bodies, are the app's.
    direct = {"/v1/predict": predict_v1, f"/v2/models/{spec.name}/infer": predict_v2,
              f"/v2/models/{spec.name}/versions/{v2.VERSION}/infer": predict_v2}

    async def handle(scope: dict, receive: Any, send: Any, handler: Any) -> None:
        request = Request(scope, receive)
        try:
            response = await admitted(request, handler)
        except ApiError as exc:
            response = error(exc.code, exc.kind, exc.message, exc.headers, request)
        except Exception as exc:  # what the app's handler of last resort answers
            response = await _internal(request, exc)
        await response(scope, receive, send)

    return _Observe(app, state, direct, handle)


def v2_paths(name: str) -> set[str]:
    """The Open Inference Protocol's paths of a server holding model `name` (metrics' endpoint label values)."""
    model = f"/v2/models/{name}"
    return {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/stats",
            *(m + end for m in (model, f"{model}/versions/{v2.VERSION}") for end in ("", "/ready", "/infer", "/config", "/stats"))}


class _Observe:
    """ASGI wrapper: request count and latency per endpoint (known paths only: bounded label values),
    `Connection: close` on every answer once draining, and POSTs to the inference endpoints straight to
    their handlers."""

    def __init__(self, app: Any, state: Any, direct: dict[str, Any], handle: Any, paths: set[str] | None = None):
        self.app, self.state = app, state
        self.direct, self.handle = direct, handle  # POST path -> handler, run by handle() (_build_app)
        self.paths = paths if paths is not None else {*_PATHS, *v2_paths(state.spec.name)}
        self.counted: dict[tuple[str, int], tuple[Any, Any]] = {}  # (endpoint, status) -> its two metrics' children

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in self.paths else "other"
        t0 = time.perf_counter()
        status = [500]

        async def _send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                if self.state.drain_started is not None:
                    headers = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"connection"]
                    msg = {**msg, "headers": headers + [(b"connection", b"close")]}
            await send(msg)

        handler = self.direct.get(path) if scope["method"] == "POST" else None
        try:
            if handler is not None:
                await self.handle(scope, receive, _send, handler)
            else:
                await self.app(scope, receive, _send)
        finally:
            # labels() looked up once per endpoint and status (bounded sets): it was half the metrics' cost
            # per request, more with several HTTP processes' multiprocess values
            counted = self.counted.get((endpoint, status[0]))
            if counted is None:
                m = self.state.metrics
                counted = self.counted[endpoint, status[0]] = (m.requests.labels(endpoint, str(status[0])),
                                                               m.latency.labels(endpoint))
            counted[0].inc()
            counted[1].observe(time.perf_counter() - t0)


def _make_server(state: Any, sock: socket.socket, app: Any = None) -> Any:
    """uvicorn for `app` (default: the one-model app of `state`); `state` drains it (drain_started, inflight,
    s.drain_s, s.queue_size)."""
    import uvicorn

    from pipeline.serving.lingering import LingeringHttpToolsProtocol

    drain_s = state.s.drain_s

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # [signal] The first SIGTERM/SIGINT starts the drain; a second one exits now. Unlike uvicorn's
            # own handler we do not re-raise the signal after shutdown: a drained server exits 0.
            if state.drain_started is None:
                state.drain_started = time.monotonic()
            else:
                self.force_exit = True
                self.should_exit = True

        async def on_tick(self, counter: int) -> bool:
            if getattr(state, "board", None) is not None:
                state.publish()
            t = state.drain_started
            if t is not None and not self.should_exit:
                if state.inflight == 0 or time.monotonic() - t >= drain_s:
                    self.should_exit = True
            return await super().on_tick(counter)

    # Idle keep-alive connections outlive the clients' own pool expiry (httpx: 5 s), so a client never
    # reuses a connection the server is closing at that very moment ("Server disconnected without
    # sending a response" was seen in CI with both at 5 s).
    # httptools with nginx's lingering close: a client still sending its body reads an early 413 (or 415,
    # 503) instead of a connection reset (pipeline/serving/lingering.py).
    config = uvicorn.Config(_build_app(state) if app is None else app, http=LingeringHttpToolsProtocol, log_level="warning",
                            access_log=False, lifespan="on",
                            timeout_keep_alive=_KEEP_ALIVE_S, timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
                            server_header=False,
                            limit_concurrency=max(256, 4 * state.s.queue_size))
    return _Server(config)
