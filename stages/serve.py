"""pipe serve: a package over HTTP, FastAPI + uvicorn, a pool of Paddle Inference predictors with dynamic batching.

    pipe serve runs/exp1/package
    pipe serve runs/exp1/package --port 9000 --max-batch-size 64 --max-wait-ms 5 --predictors 2

Each predictor (oneDNN, the package's precision) runs in its own child process: Paddle Inference's
Python `run()` holds the GIL for the whole inference on CPU, so predictor threads would stall the event
loop and each other. One thread per predictor forms batches from a bounded queue (the first waiting
request, then whatever else is queued, waiting up to max_wait while more requests are still being read)
and ships them over a pipe as raw bytes. A predictor process that dies fails its batch (500) and is
restarted.

Reads a `package/` artifact and nothing else: it refuses to start (exit 2) unless every file's sha256
matches its manifest and the file set is the package allowlist. Binds 127.0.0.1 unless `--host` says
otherwise (then it warns: no authentication, no TLS). Endpoints:

    POST /v1/predict                    {"inputs": [[...]]} (model-input tensors) or {"images": [base64 PNG/JPEG]}
                                        -> {"labels", "scores", "logits"}
    POST /GeneralModelService/inference Paddle Serving's HttpClient: protobuf (application/proto) or JSON
    GET  /v1/model  /livez  /readyz  /metrics  /docs  /openapi.json

Limits (defaults in the package's serving.yaml, flags override): body cap -> 413 (Content-Length, then
while reading); content type -> 415; JSON depth, NaN/Infinity, invalid UTF-8 -> 400; dtype, rank, shape
against the package's input spec -> 422 (the message names the expected shape and never echoes input);
queue full -> 503 + Retry-After; per-request timeout -> 504 (408 while still reading the body). Errors
always have the schema {"error": {"code", "type", "message"}}. `/readyz` is 200 only after every predictor
ran a warm-up batch of each size, and 503 while draining. SIGTERM (or Ctrl-C): stop admitting requests,
finish the in-flight ones (at most `drain_s`), exit 0; a second signal exits at once.

Test hook: while the file named by PIPE_FAULT_HOLD_PREDICTOR exists, each predictor thread waits before
its warm-up and, holding the request it just took, before forming a batch: tests can keep the server
unready, fill the queue behind it, or hold a request in flight.
"""

import asyncio
import base64
import binascii
import io
import json
import logging
import math
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pipeline import __version__, artifacts, data as data_mod, runtime
from pipeline.errors import InputError, PipeError
from stages import package as package_mod

HOLD_ENV = "PIPE_FAULT_HOLD_PREDICTOR"
_SERVING_PKG = "baidu.paddle_serving.predictor.general_model"
_ENGINE_NAME = "general_infer_0"
_PATHS = ("/v1/predict", "/GeneralModelService/inference", "/v1/model", "/livez", "/readyz", "/metrics",
          "/docs", "/openapi.json")
_PREDICTOR_START_S = 600.0  # a big program on a busy machine can take minutes to load
_KEEP_ALIVE_S = 15  # idle keep-alive connections close after this, s (longer than clients keep them)
_SHUTDOWN_GRACE_S = 2.0  # after the drain: idle keep-alive connections close, stragglers are cancelled
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')  # deleted before the depth scan
log = logging.getLogger("pipe.serve")


@dataclass(frozen=True)
class ServeConfig:
    """`pipe serve` flags; None takes the package's serving.yaml value."""

    host: str = "127.0.0.1"
    """Address to bind. Anything but 127.0.0.1 is reachable from elsewhere and warns."""
    port: int = 8000
    """TCP port; 0 picks a free one (printed at start)."""
    predictors: int | None = None
    """Paddle Inference predictors in the pool, each on its own thread."""
    threads: int | None = None
    """CPU math threads per predictor; 0 = (cores - 1) / predictors, at least 1 (a core for HTTP)."""
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


@dataclass(frozen=True)
class _Settings:
    predictors: int
    threads: int
    max_batch_size: int
    max_wait_ms: float
    queue_size: int
    timeout_s: float
    max_body_bytes: int
    max_json_depth: int
    max_image_pixels: int
    drain_s: float


@dataclass(frozen=True)
class _Spec:
    """serving.yaml, checked."""

    name: str
    precision: str
    fmt: str
    program: Path
    params: Path
    inp: dict[str, Any]
    outp: dict[str, Any]
    labels: list[str]
    preprocessing: dict[str, Any]
    doc: dict[str, Any]
    manifest_sha256: str

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.inp["shape"][1:])


def run(cfg: ServeConfig, package_dir: Path) -> None:
    """Verify the package, load the predictors, serve until SIGTERM/SIGINT, drain, return (exit 0)."""
    spec = _load_package(Path(package_dir))
    settings = _settings(cfg, spec)
    if cfg.host != "127.0.0.1":
        print(f"pipe serve: warning: listening on {cfg.host}, reachable from other machines; this server has "
              "no authentication or TLS (put a proxy in front of it)", file=sys.stderr)
    sock = _bind(cfg.host, cfg.port)
    # [signal] Until uvicorn installs its handlers nothing is in flight: a SIGTERM while loading exits 0.
    previous = signal.signal(signal.SIGTERM, _exit_while_loading)
    preds: list[_PredictorProcess] = []
    try:
        preds = _start_predictors(spec, settings)
        state = _State(spec, settings, preds)
        server = _make_server(state, sock)
        host, port = sock.getsockname()[:2]
        print(f"pipe serve: {spec.name} ({spec.precision}, {settings.predictors} predictor(s) x "
              f"{settings.threads} thread(s), batch <= {settings.max_batch_size}, wait {settings.max_wait_ms:g} ms) "
              f"listening on http://{_url_host(host)}:{port}", flush=True)
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        for pred in preds:
            pred.close()
    left = state.inflight
    print(f"pipe serve: stopped ({state.handled} inference requests handled"
          + (f", {left} still in flight after the {settings.drain_s:g} s drain" if left else "") + ")", flush=True)


def _exit_while_loading(sig: int, frame: Any) -> None:
    raise SystemExit(0)


# ------------------------------------------------------------------ package and settings


def _load_package(path: Path) -> _Spec:
    art = artifacts.verify(path, ("package",))
    where = path / "serving.yaml"
    if "serving.yaml" not in art.manifest["files"]:
        raise InputError(f"{path / artifacts.MANIFEST}: lists no serving.yaml")
    try:
        doc = yaml.safe_load(where.read_text(encoding="utf-8"))
        fmt = doc["model"]["format"]
        program, params = doc["model"]["program"], doc["model"]["params"]
        inp, outp, labels = doc["input"], doc["output"], [str(s) for s in doc["labels"]]
        ok = (doc["schema"] == package_mod.SERVING_SCHEMA and doc["precision"] in package_mod.PRECISIONS
              and program == package_mod.MODEL_FILES.get(fmt) and params == package_mod.PARAMS_FILE
              and isinstance(doc["preprocessing"], dict) and isinstance(doc["name"], str))
        for io_ in (inp, outp):
            shape = io_["shape"]
            ok = ok and io_["dtype"] in package_mod.DTYPES and isinstance(io_["name"], str) \
                and isinstance(shape, list) and len(shape) >= 2 and shape[0] == -1 \
                and all(isinstance(d, int) and d >= 1 for d in shape[1:])
        ok = ok and outp["dtype"] == "float32" and outp["shape"] == [-1, len(labels)]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: not a serving spec this pipe reads (schema {package_mod.SERVING_SCHEMA})")
    triton = doc.get("triton") or {}
    allowed = package_mod.allowlist(fmt, triton.get("model") if triton else None)
    found = set(art.manifest["files"]) | {artifacts.MANIFEST}
    if found != allowed:
        odd = sorted(found - allowed) or sorted(allowed - found)
        raise InputError(f"{path / artifacts.MANIFEST}: {odd[0]} is not in the package allowlist "
                         "(inference-format files only)")
    return _Spec(doc["name"], doc["precision"], fmt, path / program, path / params, inp, outp, labels,
                 doc["preprocessing"], doc, art.manifest_sha256)


def _settings(cfg: ServeConfig, spec: _Spec) -> _Settings:
    server = {**package_mod.SERVER_DEFAULTS, **(spec.doc.get("server") or {})}
    batching = spec.doc.get("batching") or {}

    def pick(flag: str, given: Any, default: Any, kind: type, low: float, high: float) -> Any:
        value = default if given is None else given
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise InputError(f"{flag}: expected {kind.__name__}, got {value!r}") from None
        if not (low <= value <= high) or (kind is float and not math.isfinite(value)):
            raise InputError(f"{flag}: must be {low:g}..{high:g}, got {value:g}")
        return value

    predictors = pick("--predictors", cfg.predictors, server["predictors"], int, 1, 64)
    threads = pick("--threads", cfg.threads, server["threads"], int, 0, 256)
    if threads == 0:
        threads = max(1, ((os.cpu_count() or 1) - 1) // predictors)
    return _Settings(
        predictors=predictors,
        threads=threads,
        max_batch_size=pick("--max-batch-size", cfg.max_batch_size, batching.get("max_batch_size", 32), int, 1, 4096),
        max_wait_ms=pick("--max-wait-ms", cfg.max_wait_ms, batching.get("max_wait_ms", 2.0), float, 0, 1000),
        queue_size=pick("--queue-size", cfg.queue_size, server["queue_size"], int, 1, 100_000),
        timeout_s=pick("--timeout", cfg.timeout_s, server["timeout_s"], float, 0.001, 3600),
        max_body_bytes=pick("--max-body-bytes", cfg.max_body_bytes, server["max_body_bytes"], int, 64, 1 << 31),
        max_json_depth=pick("serving.yaml server.max_json_depth", None, server["max_json_depth"], int, 4, 256),
        max_image_pixels=pick("serving.yaml server.max_image_pixels", None, server["max_image_pixels"], int, 1,
                              1 << 28),
        drain_s=pick("--drain", cfg.drain_s, server["drain_s"], float, 0, 3600),
    )


def _bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise InputError(f"--port: must be 0..65535, got {port}")
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
        raise InputError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror})") from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ------------------------------------------------------------------ predictor processes


class _PredictorProcess:
    """One Paddle Inference predictor in a child process, `python -m stages.serve --predictor SPEC`.

    Paddle Inference's Python `run()` holds the GIL for the whole inference on CPU (its binding releases
    it only for custom devices): predictors on threads would stall the HTTP event loop and each other. In
    a child process the predictor runs while this side waits on a pipe with the GIL released. Frames on
    the child's stdin/stdout: 4-byte header length, JSON header, 8-byte payload length, raw C-order bytes
    (no pickle). The child ignores SIGINT/SIGTERM: the server drains first, then closes its stdin."""

    def __init__(self, spec: _Spec, threads: int, max_batch: int):
        self.doc = {"program": str(spec.program), "params": str(spec.params), "precision": spec.precision,
                    "threads": threads, "input": spec.inp["name"], "output": spec.outp["name"],
                    "dtype": spec.inp["dtype"], "sample_shape": list(spec.sample_shape), "max_batch": max_batch}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS=str(self.doc["threads"]),
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "stages.serve", "--predictor", json.dumps(self.doc)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def hello(self, timeout: float) -> None:
        """The child's first frame: it loaded the program (or why not: InputError for a fixable cause)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise PipeError(f"{self.doc['program']}: the predictor process did not start within {timeout:g} s")
        try:
            head, _ = _read_frame(self.proc.stdout)
        except EOFError:
            raise PipeError(f"{self.doc['program']}: the predictor process exited ({self.proc.wait()}) while "
                            "loading; its stderr is above") from None
        if not head.get("ok"):
            raise (InputError if head.get("input_error") else PipeError)(head.get("error", "predictor failed"))

    def call(self, head: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        _write_frame(self.proc.stdin, head, payload)
        reply, data = _read_frame(self.proc.stdout)
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error", "predictor failed"))
        return reply, data

    def run(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        reply, data = self.call({"op": "run", "shape": list(x.shape), "dtype": str(x.dtype)}, x.tobytes())
        return np.frombuffer(data, reply["dtype"]).reshape(reply["shape"])

    def warm_up(self) -> None:
        self.call({"op": "warm"})

    def close(self, timeout: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.close()  # the child's EOF: it exits
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout)


def _start_predictors(spec: _Spec, s: _Settings) -> list[_PredictorProcess]:
    preds = [_PredictorProcess(spec, s.threads, s.max_batch_size) for _ in range(s.predictors)]
    try:
        for pred in preds:  # started together: their paddle imports overlap
            pred.start()
        for pred in preds:
            pred.hello(_PREDICTOR_START_S)
    except BaseException:
        for pred in preds:
            pred.close()
        raise
    return preds


def _write_frame(f: Any, head: dict[str, Any], payload: bytes = b"") -> None:
    raw = json.dumps(head).encode()
    f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<Q", len(payload)))
    f.write(payload)
    f.flush()


def _read_exact(f: Any, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError("predictor pipe closed")
    return data


def _read_frame(f: Any) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<I", _read_exact(f, 4))
    head = json.loads(_read_exact(f, n))
    (m,) = struct.unpack("<Q", _read_exact(f, 8))
    return head, _read_exact(f, m) if m else b""


def _create_predictor(paddle: Any, doc: dict[str, Any]) -> Any:
    program = Path(doc["program"])
    c = paddle.inference.Config(str(program), doc["params"])
    if not c.onednn_enabled():
        c.enable_onednn()
    if doc["precision"] == "bf16":
        if not paddle.base.core.supports_bfloat16():
            raise InputError(f"{program.parent}: a bf16 package, but this CPU has no bf16 support "
                             "(avx512_bf16); package the model with --precision fp32")
        c.enable_onednn_bfloat16()
    elif doc["precision"] == "int8":
        c.enable_onednn_int8()
    c.set_cpu_math_library_num_threads(doc["threads"])
    c.disable_glog_info()
    try:
        pred = paddle.inference.create_predictor(c)
    except Exception as e:  # Paddle's C++ error: one line, naming the file
        raise PipeError(f"{program}: Paddle Inference cannot load it ({e.__class__.__name__})") from None
    if pred.get_input_names() != [doc["input"]] or pred.get_output_names() != [doc["output"]]:
        raise InputError(f"{program}: io names {pred.get_input_names()} -> {pred.get_output_names()} do not "
                         f"match serving.yaml ({doc['input']} -> {doc['output']})")
    return pred


def _predictor_main(doc: dict[str, Any]) -> int:
    """Child: load the predictor, then answer frames until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # [signal] a terminal's Ctrl-C reaches the whole group:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent drains first, then closes our stdin
    channel = os.fdopen(os.dup(1), "wb")  # stdout carries frames; anything printed goes to stderr
    os.dup2(2, 1)
    source = sys.stdin.buffer
    try:
        paddle = runtime.import_paddle(doc["threads"])
        pred = _create_predictor(paddle, doc)
    except PipeError as e:
        _write_frame(channel, {"ok": False, "error": str(e), "input_error": isinstance(e, InputError)})
        return 2
    h_in, h_out = pred.get_input_handle(doc["input"]), pred.get_output_handle(doc["output"])

    def infer(x: np.ndarray) -> np.ndarray:
        h_in.copy_from_cpu(x)
        pred.run()
        return h_out.copy_to_cpu()

    _write_frame(channel, {"ok": True})
    while True:
        try:
            head, payload = _read_frame(source)
        except EOFError:
            return 0
        try:
            if head["op"] == "warm":
                # oneDNN builds its kernels per input shape on first sight (~3 ms each): pay it before /readyz.
                zeros = np.zeros((doc["max_batch"], *doc["sample_shape"]), doc["dtype"])
                for n in range(1, doc["max_batch"] + 1):
                    infer(zeros[:n])
                _write_frame(channel, {"ok": True})
            else:
                x = np.frombuffer(payload, head["dtype"]).reshape(head["shape"])
                y = np.ascontiguousarray(infer(x))
                _write_frame(channel, {"ok": True, "shape": list(y.shape), "dtype": str(y.dtype)}, y.tobytes())
        except Exception as e:  # reported to the parent as this batch's failure; the child keeps serving
            _write_frame(channel, {"ok": False, "error": f"{e.__class__.__name__}: {str(e)[:300]}"})


# ------------------------------------------------------------------ dynamic batching


class _ApiError(Exception):
    """An HTTP error with the fixed schema; `message` never contains request content."""

    def __init__(self, code: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.kind, self.message, self.headers = code, kind, message, headers or {}


@dataclass
class _Job:
    x: np.ndarray
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def _settle(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.done():  # timed out (cancelled) while it ran
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class _Batcher:
    """One queue, one thread per predictor process. A thread takes the first waiting request, then whatever
    else is queued (waiting up to max_wait while admitted requests are still on their way) until
    max_batch_size samples, and runs them as one batch; it waits on the pipe with the GIL released."""

    def __init__(self, preds: list[Any], spec: _Spec, s: _Settings, metrics: "_Metrics", inflight: Any):
        self.preds, self.spec, self.s, self.metrics = preds, spec, s, metrics
        self.inflight = inflight  # () -> requests admitted and not answered (some still reading their body)
        self.taken = 0  # jobs out of the queue, in a batch being formed or run
        self.q: queue.Queue = queue.Queue(maxsize=s.queue_size)
        self.threads: list[threading.Thread] = []
        self.warm = 0
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._hold = os.environ.get(HOLD_ENV, "")

    def start(self) -> None:
        for i, pred in enumerate(self.preds):
            t = threading.Thread(target=self._worker, args=(pred,), name=f"predictor-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self, timeout: float) -> None:
        for _ in self.threads:
            try:
                self.q.put(None, timeout=timeout)
            except queue.Full:
                break
        for t in self.threads:
            t.join(timeout)

    def submit(self, job: _Job) -> None:
        self.q.put_nowait(job)  # raises queue.Full: the caller answers 503

    def _wait_hold(self) -> None:
        while self._hold and os.path.exists(self._hold):  # test hook (see module docstring)
            time.sleep(0.01)

    def _warm_up(self, pred: "_PredictorProcess") -> None:
        self._wait_hold()
        pred.warm_up()
        with self._lock:
            self.warm += 1
            if self.warm == len(self.preds):
                self.ready.set()

    def _worker(self, pred: Any) -> None:
        try:
            self._warm_up(pred)
        except Exception:
            log.exception("pipe serve: warm-up failed; /readyz stays 503")
            return
        carry: _Job | None = None
        stop = False
        while not stop:
            job = carry or self.q.get()
            carry = None
            if job is None:
                break
            self._wait_hold()  # test hook: the job is taken, the queue fills behind it
            batch, rows = [job], len(job.x)
            self._take(1)
            deadline = time.monotonic() + self.s.max_wait_ms / 1000
            while rows < self.s.max_batch_size:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    # Wait only while more requests are on their way (admitted, not yet queued): a lone
                    # request at low load would otherwise pay max_wait for nothing.
                    if left <= 0 or self.inflight() <= self.taken:
                        break
                    try:
                        nxt = self.q.get(timeout=left)
                    except queue.Empty:
                        break
                if nxt is None:
                    stop = True
                    break
                if nxt.future.done():
                    continue
                if rows + len(nxt.x) > self.s.max_batch_size:
                    carry = nxt
                    break
                self._take(1)
                batch.append(nxt)
                rows += len(nxt.x)
            try:
                self._run_batch(pred, [j for j in batch if not j.future.done()])
            finally:
                self._take(-len(batch))

    def _take(self, n: int) -> None:
        with self._lock:
            self.taken += n

    def _restart(self, pred: "_PredictorProcess") -> None:
        """A predictor process died (crash, OOM kill): start a new one, warm it, serve on."""
        log.error("pipe serve: predictor process exited with %s; restarting it", pred.proc.returncode)
        pred.close()
        try:
            pred.start()
            pred.hello(_PREDICTOR_START_S)
            pred.warm_up()
        except (PipeError, RuntimeError, EOFError, OSError) as e:
            log.error("pipe serve: predictor restart failed: %s", e)

    def _run_batch(self, pred: "_PredictorProcess", batch: list[_Job]) -> None:
        if not batch:
            return
        x = batch[0].x if len(batch) == 1 else np.concatenate([j.x for j in batch])
        t0 = time.perf_counter()
        try:
            y = pred.run(x)
        except (RuntimeError, EOFError, OSError, ValueError) as e:  # a 500 for this batch; the thread goes on
            log.error("pipe serve: predictor run failed: %s: %s", e.__class__.__name__, e)
            for j in batch:
                j.loop.call_soon_threadsafe(_settle, j.future, None, e)
            if pred.proc.poll() is not None:
                self._restart(pred)
            return
        self.metrics.observe_batch(len(x), len(batch), time.perf_counter() - t0)
        at = 0
        for j in batch:
            n = len(j.x)
            j.loop.call_soon_threadsafe(_settle, j.future, y[at:at + n], None)
            at += n




# ------------------------------------------------------------------ metrics


class _Metrics:
    """prometheus-client metrics in a registry of our own (not the process-global one)."""

    def __init__(self, state: "_State"):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("pipe_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.latency = Histogram("pipe_request_duration_seconds", "Request latency, first byte in to response",
                                 ["endpoint"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        sizes = tuple(float(2 ** i) for i in range(13))
        self.batch = Histogram("pipe_batch_size", "Samples per predictor run", registry=r, buckets=sizes)
        self.batch_requests = Histogram("pipe_batch_requests", "Requests merged into one predictor run",
                                        registry=r, buckets=sizes)
        self.infer = Histogram("pipe_inference_duration_seconds", "Predictor run time per batch", registry=r,
                               buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        Gauge("pipe_queue_depth", "Requests waiting for a predictor", registry=r).set_function(
            lambda: state.batcher.q.qsize())
        Gauge("pipe_inflight_requests", "Inference requests being handled", registry=r).set_function(
            lambda: state.inflight)
        Gauge("pipe_ready", "1 once warmed up and not draining", registry=r).set_function(
            lambda: float(state.is_ready()))

    def observe_batch(self, samples: int, requests: int, seconds: float) -> None:
        self.batch.observe(samples)
        self.batch_requests.observe(requests)
        self.infer.observe(seconds)


# ------------------------------------------------------------------ the application


class _State:
    def __init__(self, spec: _Spec, s: _Settings, preds: list[Any]):
        self.spec, self.s = spec, s
        self.inflight = 0
        self.handled = 0
        self.drain_started: float | None = None
        self.metrics = _Metrics(self)
        self.batcher = _Batcher(preds, spec, s, self.metrics, lambda: self.inflight)
        self.messages = _serving_messages()

    def is_ready(self) -> bool:
        return self.batcher.ready.is_set() and self.drain_started is None

    def model_info(self) -> dict[str, Any]:
        sp, s = self.spec, self.s
        return {
            "name": sp.name, "precision": sp.precision, "format": sp.fmt,
            "input": {k: sp.inp[k] for k in ("name", "alias", "dtype", "shape")},
            "output": {k: sp.outp[k] for k in ("name", "alias", "dtype", "shape")},
            "labels": sp.labels, "preprocessing": sp.preprocessing,
            "accepts_images": _takes_images(sp),
            "batching": {"max_batch_size": s.max_batch_size, "max_wait_ms": s.max_wait_ms,
                         "predictors": s.predictors, "threads": s.threads},
            "limits": {"max_body_bytes": s.max_body_bytes, "max_json_depth": s.max_json_depth,
                       "queue_size": s.queue_size, "timeout_s": s.timeout_s, "max_image_pixels": s.max_image_pixels},
            "package_manifest_sha256": sp.manifest_sha256,
        }


def _error_body(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "type": kind, "message": message}}


_KINDS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
          413: "body_too_large", 415: "unsupported_media_type", 422: "invalid_input", 500: "internal",
          503: "unavailable", 504: "timeout"}


def _build_app(state: _State) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    spec, s = state.spec, state.s

    @asynccontextmanager
    async def lifespan(app: Any):
        state.batcher.start()
        yield
        await asyncio.to_thread(state.batcher.stop, 5.0)

    app = FastAPI(title=f"pipe serve: {spec.name}", version=__version__, lifespan=lifespan, redoc_url=None,
                  description="Inference for a pipe package. Errors: {\"error\": {\"code\", \"type\", \"message\"}}.")

    def error(code: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(_error_body(code, kind, message), status_code=code, headers=headers)

    @app.exception_handler(_ApiError)
    async def _api_error(request: Request, exc: _ApiError) -> JSONResponse:
        return error(exc.code, exc.kind, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = exc.status_code
        return error(code, _KINDS.get(code, "http_error"), str(exc.detail) if code in (404, 405) else "request refused",
                     dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "invalid_input", "the request does not match the endpoint's schema")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("pipe serve: internal error: %s: %s", exc.__class__.__name__, exc)
        return error(500, "internal", "internal error")

    async def admitted(request: Request, handler: Any) -> Any:
        """Everything that runs a predictor: admission (ready, not draining), in-flight count, deadline."""
        if state.drain_started is not None:
            raise _ApiError(503, "draining", "the server is shutting down; retry on another instance",
                            {"Retry-After": "1", "Connection": "close"})
        if not state.batcher.ready.is_set():
            raise _ApiError(503, "not_ready", "the model is warming up; retry shortly", {"Retry-After": "1"})
        state.inflight += 1
        try:
            return await handler(request, time.monotonic() + s.timeout_s)
        except ClientDisconnect:
            raise _ApiError(400, "client_disconnected", "the client went away before the body was read") from None
        finally:
            state.inflight -= 1
            state.handled += 1

    async def infer(x: np.ndarray, deadline: float) -> np.ndarray:
        loop = asyncio.get_running_loop()
        job = _Job(x, loop.create_future(), loop)
        try:
            state.batcher.submit(job)
        except queue.Full:
            raise _ApiError(503, "overloaded", f"{s.queue_size} requests are already waiting; retry later",
                            {"Retry-After": "1"}) from None
        try:
            y = await asyncio.wait_for(job.future, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise _ApiError(504, "timeout", f"no result within the {s.timeout_s:g} s request timeout") from None
        if not np.isfinite(y).all():
            raise _ApiError(422, "non_finite_output", "the model's output is not finite for these inputs "
                                                      "(values far outside the training range?)")
        return y

    async def predict_v1(request: Request, deadline: float) -> JSONResponse:
        body = await _read_body(request, ("application/json",), s, deadline)
        doc = _parse_json(body, s.max_json_depth)
        x = await _v1_inputs(doc, spec, s)
        y = await infer(x, deadline)
        return JSONResponse(_v1_answer(y, spec.labels))

    async def predict_serving(request: Request, deadline: float) -> Response:
        body = await _read_body(request, ("application/json", "application/proto"), s, deadline)
        proto = _media_type(request) == "application/proto"
        if proto:
            req = _parse_proto(body, state.messages["Request"])
        else:
            req = _serving_json(_parse_json(body, s.max_json_depth))
        x, fetch, log_id = _serving_inputs(req, spec, s, proto)
        y = await infer(x, deadline)
        return _serving_answer(y, spec, fetch, log_id, proto, state.messages)

    @app.post("/v1/predict", summary="Classify model-input tensors or PNG/JPEG images",
              openapi_extra=_openapi_predict(spec), response_description="labels, scores and logits per sample")
    async def v1_predict(request: Request) -> Any:
        return await admitted(request, predict_v1)

    @app.post("/GeneralModelService/inference", summary="Paddle Serving HttpClient endpoint (protobuf or JSON)",
              openapi_extra=_openapi_serving())
    async def serving_inference(request: Request) -> Any:
        return await admitted(request, predict_serving)

    @app.get("/v1/model", summary="Model metadata: io spec, labels, preprocessing, batching, limits")
    async def model() -> dict[str, Any]:
        return state.model_info()

    @app.get("/livez", summary="The process is up")
    async def livez() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", summary="200 after warm-up; 503 before and while draining")
    async def readyz() -> Any:
        if state.drain_started is not None:
            return error(503, "draining", "the server is shutting down", {"Retry-After": "1"})
        if not state.batcher.ready.is_set():
            return error(503, "not_ready", "the model is warming up", {"Retry-After": "1"})
        return {"status": "ready"}

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return _Observe(app, state)


class _Observe:
    """ASGI wrapper: request count and latency per endpoint (known paths only: bounded label values), and
    `Connection: close` on every answer once draining."""

    def __init__(self, app: Any, state: _State):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in _PATHS else "other"
        t0 = time.perf_counter()
        status = [500]

        async def _send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                if self.state.drain_started is not None:
                    headers = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"connection"]
                    msg = {**msg, "headers": headers + [(b"connection", b"close")]}
            await send(msg)

        try:
            await self.app(scope, receive, _send)
        finally:
            m = self.state.metrics
            m.requests.labels(endpoint, str(status[0])).inc()
            m.latency.labels(endpoint).observe(time.perf_counter() - t0)


def _make_server(state: _State, sock: socket.socket) -> Any:
    import uvicorn

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
            t = state.drain_started
            if t is not None and not self.should_exit:
                if state.inflight == 0 or time.monotonic() - t >= drain_s:
                    self.should_exit = True
            return await super().on_tick(counter)

    # Idle keep-alive connections outlive the clients' own pool expiry (httpx: 5 s), so a client never
    # reuses a connection the server is closing at that very moment ("Server disconnected without
    # sending a response" was seen in CI with both at 5 s).
    config = uvicorn.Config(_build_app(state), log_level="warning", access_log=False, lifespan="on",
                            timeout_keep_alive=_KEEP_ALIVE_S, timeout_graceful_shutdown=_SHUTDOWN_GRACE_S, server_header=False,
                            limit_concurrency=max(256, 4 * state.s.queue_size))
    return _Server(config)


# ------------------------------------------------------------------ request parsing (no echo of input)


def _media_type(request: Any) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def _read_body(request: Any, accepted: tuple[str, ...], s: _Settings, deadline: float) -> bytes:
    """Content type (415), then the size cap: on Content-Length before reading, and while reading (413)."""
    if _media_type(request) not in accepted:
        raise _ApiError(415, "unsupported_media_type", f"Content-Type must be {' or '.join(accepted)}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise _ApiError(415, "unsupported_media_type", "Content-Encoding must be gzip or absent")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > s.max_body_bytes):
        if not length.isdigit():
            raise _ApiError(400, "bad_request", "invalid Content-Length")
        raise _ApiError(413, "body_too_large", f"the body exceeds {s.max_body_bytes} bytes")

    async def read() -> bytes:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > s.max_body_bytes:
                raise _ApiError(413, "body_too_large", f"the body exceeds {s.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        body = await asyncio.wait_for(read(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise _ApiError(408, "request_timeout", f"the body did not arrive within {s.timeout_s:g} s") from None
    if encoding == "gzip":
        body = _gunzip(body, s.max_body_bytes)
    return body


def _gunzip(body: bytes, cap: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, cap + 1)
    except zlib.error:
        raise _ApiError(400, "bad_request", "the gzip body is corrupt") from None
    if len(out) > cap:
        raise _ApiError(413, "body_too_large", f"the decompressed body exceeds {cap} bytes")
    if not d.eof:
        raise _ApiError(400, "bad_request", "the gzip body is truncated")
    return out


def _json_depth(body: bytes) -> int:
    """Deepest [/{ nesting outside strings, at C/numpy speed (no Python loop over the body).

    Escapes first: `\\\\` pairs, then `\\"`, removed left to right as JSON reads them; then only brackets
    and quotes are kept; a bracket is inside a string when an odd number of quotes precede it."""
    if b"\\" in body:  # most bodies (numbers, base64) have no escapes: skip two passes
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    residue = body.translate(None, _NOT_STRUCTURE)
    if not residue:
        return 0
    v = np.frombuffer(residue, np.uint8)
    quote = v == 0x22
    outside = (np.cumsum(quote, dtype=np.int32) & 1) == 0
    brackets = v[outside & ~quote]
    if not brackets.size:
        return 0
    steps = np.where((brackets == 0x5B) | (brackets == 0x7B), 1, -1).astype(np.int32)
    return int(np.cumsum(steps, dtype=np.int32).max())


def _parse_json(body: bytes, max_depth: int) -> Any:
    """Strict UTF-8 JSON (RFC 8259: no NaN/Infinity, no number overflowing a double) with nesting
    <= max_depth, checked before parsing. orjson: 6x json.loads on float arrays (0.9 vs 5.9 ms for a
    3x64x64 input), which is most of what the event loop does per request."""
    import orjson

    if _json_depth(body) > max_depth:
        raise _ApiError(400, "invalid_json", f"JSON nested deeper than {max_depth} levels")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _ApiError(400, "invalid_json", "the body is not valid UTF-8 JSON (NaN and Infinity are not JSON "
                                             "numbers)") from None


def _expected(spec: _Spec, s: _Settings) -> str:
    dims = ", ".join(str(d) for d in spec.sample_shape)
    return f"{spec.inp['dtype']} [N, {dims}] with 1 <= N <= {s.max_batch_size}"


def _as_tensor(obj: Any, spec: _Spec, s: _Settings, where: str) -> np.ndarray:
    """A JSON array (nested lists) -> the model's dtype and shape, or 422 naming what was expected."""
    want = _expected(spec, s)
    try:
        arr = np.asarray(obj)
    except (ValueError, TypeError, OverflowError):
        raise _ApiError(422, "invalid_tensor", f"{where}: not a rectangular array; expected {want}") from None
    if arr.dtype.kind not in "iuf":
        raise _ApiError(422, "invalid_tensor", f"{where}: must hold numbers only; expected {want}")
    return _check_tensor(arr, spec, s, where)


def _check_tensor(arr: np.ndarray, spec: _Spec, s: _Settings, where: str) -> np.ndarray:
    want, sample = _expected(spec, s), spec.sample_shape
    if arr.ndim != len(sample) + 1:
        raise _ApiError(422, "invalid_tensor", f"{where}: rank {arr.ndim}, expected {want}")
    if tuple(arr.shape[1:]) != sample or not 1 <= arr.shape[0] <= s.max_batch_size:
        got = ", ".join(str(d) for d in arr.shape)
        raise _ApiError(422, "invalid_tensor", f"{where}: shape [{got}], expected {want}")
    dtype = spec.inp["dtype"]
    if dtype == "float32":
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(np.float32)
        if not np.isfinite(out).all():
            raise _ApiError(422, "invalid_tensor", f"{where}: values must be finite float32 numbers")
        return out
    if arr.dtype.kind == "f":
        raise _ApiError(422, "invalid_tensor", f"{where}: must hold integers; expected {want}")
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise _ApiError(422, "invalid_tensor", f"{where}: values out of {dtype} range")
    return arr.astype(dtype)


def _takes_images(spec: _Spec) -> bool:
    pre = spec.preprocessing
    return (pre.get("kind") == "image" and pre.get("layout") == "NCHW" and spec.inp["dtype"] == "float32"
            and len(spec.sample_shape) == 3 and spec.sample_shape[0] in (1, 3))


async def _v1_inputs(doc: Any, spec: _Spec, s: _Settings) -> np.ndarray:
    if not isinstance(doc, dict) or len(doc) != 1 or not ({"inputs", "images"} & set(doc)):
        raise _ApiError(422, "invalid_request", "the body must be an object with exactly one field, "
                                                "'inputs' (tensors) or 'images' (base64 PNG/JPEG)")
    if "inputs" in doc:
        return _as_tensor(doc["inputs"], spec, s, "inputs")
    images = doc["images"]
    if not _takes_images(spec):
        raise _ApiError(422, "invalid_request", "this model takes tensors only ('inputs')")
    if not isinstance(images, list) or not 1 <= len(images) <= s.max_batch_size \
            or not all(isinstance(im, str) for im in images):
        raise _ApiError(422, "invalid_request", f"images: a list of 1..{s.max_batch_size} base64 strings")
    # Decoding is CPU work: off the event loop.
    return await asyncio.to_thread(_decode_images, images, spec, s)


def _decode_images(images: list[str], spec: _Spec, s: _Settings) -> np.ndarray:
    from PIL import Image

    c, h, w = spec.sample_shape
    out = np.empty((len(images), c, h, w), np.uint8)
    for i, b64 in enumerate(images):
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise _ApiError(422, "invalid_image", f"images[{i}]: not valid base64") from None
        try:
            with Image.open(io.BytesIO(raw)) as im:
                if im.format not in ("PNG", "JPEG"):
                    raise _ApiError(422, "invalid_image", f"images[{i}]: must be PNG or JPEG")
                if im.width * im.height > s.max_image_pixels:
                    raise _ApiError(422, "invalid_image", f"images[{i}]: more than {s.max_image_pixels} pixels")
                if im.mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):
                    raise _ApiError(422, "invalid_image", f"images[{i}]: unsupported image mode (need grayscale "
                                                          "or RGB)")
                im = im.convert("L" if c == 1 else "RGB")
                if im.size != (w, h):
                    im = im.resize((w, h), Image.BILINEAR)  # as `data.image_size` does at training time
                arr = np.asarray(im, np.uint8)
        except _ApiError:
            raise
        except Exception:  # an untrusted file: any decoder failure is the sender's, never a 500
            raise _ApiError(422, "invalid_image", f"images[{i}]: not a decodable PNG/JPEG") from None
        out[i] = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return data_mod.prepare(out, spec.preprocessing)


def _v1_answer(y: np.ndarray, labels: list[str]) -> dict[str, Any]:
    z = y.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = p.argmax(axis=1)
    return {"labels": [labels[i] for i in top], "scores": [float(p[r, i]) for r, i in enumerate(top)],
            "logits": y.tolist()}


# ------------------------------------------------------------------ Paddle Serving wire format


def _serving_messages() -> dict[str, Any]:
    """Paddle Serving 0.9.0's general_model_service.proto messages, built from a FileDescriptorProto here
    (no generated code from Serving): Tensor, Request, Response, ModelOutput."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="pipe/general_model_service.proto", package=_SERVING_PKG,
                                            syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, ref in fields:
            repeated = ftype < 0
            f = m.field.add(name=fname, number=number, type=abs(ftype),
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if ref:
                f.type_name = f".{_SERVING_PKG}.{ref}"

    R = -1  # sign marks a repeated field
    message("Tensor", [("int64_data", 1, R * F.TYPE_INT64, ""), ("float_data", 2, R * F.TYPE_FLOAT, ""),
                       ("int_data", 3, R * F.TYPE_INT32, ""), ("float64_data", 4, R * F.TYPE_DOUBLE, ""),
                       ("uint32_data", 5, R * F.TYPE_UINT32, ""), ("bool_data", 6, R * F.TYPE_BOOL, ""),
                       ("complex64_data", 7, R * F.TYPE_FLOAT, ""), ("complex128_data", 8, R * F.TYPE_DOUBLE, ""),
                       ("data", 9, R * F.TYPE_STRING, ""), ("elem_type", 10, F.TYPE_INT32, ""),
                       ("shape", 11, R * F.TYPE_INT32, ""), ("lod", 12, R * F.TYPE_INT32, ""),
                       ("name", 13, F.TYPE_STRING, ""), ("alias_name", 14, F.TYPE_STRING, ""),
                       ("tensor_content", 15, F.TYPE_BYTES, "")])
    message("Request", [("tensor", 1, R * F.TYPE_MESSAGE, "Tensor"), ("fetch_var_names", 2, R * F.TYPE_STRING, ""),
                        ("profile_server", 3, F.TYPE_BOOL, ""), ("log_id", 4, F.TYPE_UINT64, "")])
    message("ModelOutput", [("tensor", 1, R * F.TYPE_MESSAGE, "Tensor"), ("engine_name", 2, F.TYPE_STRING, "")])
    message("Response", [("outputs", 1, R * F.TYPE_MESSAGE, "ModelOutput"), ("profile_time", 2, R * F.TYPE_INT64, ""),
                         ("profile_server", 3, F.TYPE_BOOL, ""), ("log_id", 4, F.TYPE_UINT64, ""),
                         ("err_no", 5, F.TYPE_INT32, ""), ("err_msg", 6, F.TYPE_STRING, "")])
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fd.SerializeToString())
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_SERVING_PKG}.{n}"))
            for n in ("Tensor", "Request", "ModelOutput", "Response")}


def _parse_proto(body: bytes, cls: Any) -> Any:
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError):
        raise _ApiError(400, "invalid_protobuf", "the body is not a Paddle Serving Request message") from None
    return msg


def _serving_json(doc: Any) -> dict[str, Any]:
    """Shape-check HttpClient's JSON body: {"tensor": [{...}], "fetch_var_names": [...], "log_id": n}."""
    bad = _ApiError(422, "invalid_request", "expected a Paddle Serving Request: tensor (list of objects), "
                                            "fetch_var_names (list of strings), log_id (integer >= 0)")
    if not isinstance(doc, dict) or not isinstance(doc.get("tensor"), list):
        raise bad
    fetch, log_id = doc.get("fetch_var_names", []), doc.get("log_id", 0)
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise bad
    if isinstance(log_id, bool) or not isinstance(log_id, int) or not 0 <= log_id < 2 ** 64:
        raise bad
    for t in doc["tensor"]:
        if not isinstance(t, dict) or not all(isinstance(t.get(k, ""), str) for k in ("name", "alias_name")):
            raise bad
    return {"tensor": doc["tensor"], "fetch_var_names": fetch, "log_id": log_id}


def _serving_inputs(req: Any, spec: _Spec, s: _Settings, proto: bool) -> tuple[np.ndarray, list[str], int]:
    """The feed tensor of a Request (protobuf message or checked JSON dict) as the model's input."""
    get = (lambda t, k: getattr(t, k)) if proto else (lambda t, k: t.get(k))
    tensors = list(req.tensor) if proto else req["tensor"]
    fetch = list(req.fetch_var_names) if proto else req["fetch_var_names"]
    log_id = int(req.log_id) if proto else req["log_id"]
    names = {spec.inp["name"], spec.inp["alias"]}
    code, field_name, _ = package_mod.DTYPES[spec.inp["dtype"]]
    if len(tensors) != 1 or not ({get(tensors[0], "name"), get(tensors[0], "alias_name")} & names):
        raise _ApiError(422, "invalid_request", f"expected one feed tensor named '{spec.inp['alias']}'")
    t = tensors[0]
    if get(t, "elem_type") != code:
        raise _ApiError(422, "invalid_tensor", f"elem_type must be {code} ({spec.inp['dtype']}, in {field_name})")
    shape, data = get(t, "shape"), get(t, field_name)
    if not proto and (not isinstance(shape, list) or not isinstance(data, list)
                      or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
        raise _ApiError(422, "invalid_tensor", f"shape (list of integers) and {field_name} (flat list) are required")
    shape = [int(d) for d in shape]
    if len(shape) > 16 or any(d < 0 for d in shape) or math.prod(shape) != len(data):
        raise _ApiError(422, "invalid_tensor", f"{field_name} must hold prod(shape) values; expected "
                                               f"{_expected(spec, s)}")
    flat = np.asarray(data, np.float32 if code == 1 else spec.inp["dtype"]) if proto else None
    if flat is None:
        try:
            flat = np.asarray(data)
        except (ValueError, TypeError, OverflowError):
            raise _ApiError(422, "invalid_tensor", f"{field_name} must be a flat list of numbers") from None
        if flat.ndim != 1 or (flat.size and flat.dtype.kind not in "iuf"):
            raise _ApiError(422, "invalid_tensor", f"{field_name} must be a flat list of numbers")
    arr = _check_tensor(flat.reshape(shape), spec, s, "tensor")
    outs = {spec.outp["name"], spec.outp["alias"]}
    if fetch and not set(fetch) & outs:
        raise _ApiError(422, "invalid_request", f"fetch_var_names: this model outputs '{spec.outp['alias']}'")
    return arr, fetch, log_id


def _serving_answer(y: np.ndarray, spec: _Spec, fetch: list[str], log_id: int, proto: bool,
                    messages: dict[str, Any]) -> Any:
    from fastapi.responses import JSONResponse, Response

    o = spec.outp
    if proto:
        resp = messages["Response"](log_id=log_id, err_no=0, err_msg="")
        out = resp.outputs.add(engine_name=_ENGINE_NAME)
        t = out.tensor.add(elem_type=1, name=o["name"], alias_name=o["alias"])
        t.shape.extend(int(d) for d in y.shape)
        t.float_data.extend(y.ravel().tolist())
        # The client parses protobuf only if Content-Type is exactly this (no charset).
        return Response(resp.SerializeToString(), media_type="application/proto")
    tensor = {"float_data": y.ravel().tolist(), "elem_type": 1, "shape": list(y.shape), "name": o["name"],
              "alias_name": o["alias"], "lod": []}
    return JSONResponse({"outputs": [{"tensor": [tensor], "engine_name": _ENGINE_NAME}], "profile_time": [],
                         "profile_server": False, "log_id": log_id, "err_no": 0, "err_msg": ""})


# ------------------------------------------------------------------ OpenAPI (bodies are read by hand)


def _openapi_predict(spec: _Spec) -> dict[str, Any]:
    dims = ", ".join(str(d) for d in spec.sample_shape)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object",
        "description": f"Exactly one of `inputs` ({spec.inp['dtype']} [N, {dims}], preprocessed) or `images` "
                       "(base64 PNG/JPEG, resized and normalised as at training time).",
        "properties": {
            "inputs": {"type": "array", "items": {}, "description": f"{spec.inp['dtype']} [N, {dims}]"},
            "images": {"type": "array", "items": {"type": "string", "format": "byte"}},
        }}}}},
        "responses": {"200": {"description": "One entry per sample", "content": {"application/json": {"schema": {
            "type": "object", "properties": {
                "labels": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "array", "items": {"type": "number"}},
                "logits": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}}}},
            **_openapi_errors()}}


def _openapi_serving() -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/proto": {"schema": {"type": "string", "format": "binary",
                                         "description": f"{_SERVING_PKG}.Request"}},
        "application/json": {"schema": {"type": "object", "properties": {
            "tensor": {"type": "array", "items": {"type": "object"}},
            "fetch_var_names": {"type": "array", "items": {"type": "string"}},
            "log_id": {"type": "integer"}}}}}},
        "responses": {"200": {"description": "A Response in the request's format"}, **_openapi_errors()}}


def _openapi_errors() -> dict[str, Any]:
    schema = {"type": "object", "properties": {"error": {"type": "object", "properties": {
        "code": {"type": "integer"}, "type": {"type": "string"}, "message": {"type": "string"}}}}}
    return {str(code): {"description": kind, "content": {"application/json": {"schema": schema}}}
            for code, kind in _KINDS.items() if code not in (404, 405)}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--predictor":
        sys.exit(_predictor_main(json.loads(sys.argv[2])))
    print("usage: python -m stages.serve --predictor SPEC_JSON (internal; use `pipe serve`)", file=sys.stderr)
    sys.exit(2)
