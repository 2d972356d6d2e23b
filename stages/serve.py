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

import signal
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline import runtime
from pipeline.errors import InputError, PipeError
from pipeline.serving import spec as spec_mod, validate, workers
from pipeline.serving.predictor import START_S, PredictorProcess, start_predictors
from pipeline.serving.server import State, bind, exit_while_loading, make_server, reference_check, url_host
from pipeline.serving.spec import Settings, Spec, engine_for


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
    """Predictors in the pool (of each HTTP process), each running one engine instance."""
    predictor_mode: str | None = None
    """Where predictors run: auto (in the HTTP process for onnxruntime and OpenVINO, which release the GIL while
    they run; a child process each for Paddle Inference), process, or in-process; None = serving.yaml's."""
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
    package (`pipeline/ocr_system/package.py`) is served by `pipeline/ocr_system/serving.py`."""
    from pipeline.ocr_system import package as ocr_package

    place = workers.current()
    if place is not None:  # one HTTP process of several: the supervisor's flags (pipeline/serving/workers.py)
        workers.die_with_parent()
        cfg = ServeConfig(**place.config)
    if (Path(package_dir) / ocr_package.SYSTEM_FILE).is_file():
        from pipeline.ocr_system import serving as system

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
    sock = bind(cfg.host, cfg.port)
    if cfg.grpc_port:
        if cfg.grpc_port == cfg.port:
            sock.close()
            raise InputError(f"--grpc-port {cfg.grpc_port}: the same port as --port")
        try:
            bind(cfg.host, cfg.grpc_port, "--grpc-port").close()  # free now (exit 2 if not); gRPC binds it later
        except InputError:
            sock.close()
            raise
    if settings.http_workers > 1:
        return _supervise(cfg, spec, settings, engine, sock, Path(package_dir))
    # [signal] Until uvicorn installs its handlers nothing is in flight: a SIGTERM while loading exits 0.
    previous = signal.signal(signal.SIGTERM, exit_while_loading)
    preds: list[PredictorProcess] = []
    try:
        preds = start_predictors(spec, settings.predictors, settings.threads, settings.max_batch_size, engine,
                                 cfg.device, settings.predictor_mode)
        checked = reference_check(spec, settings, preds)
        state = State(spec, settings, preds, checked)
        state.grpc_address = (cfg.host, cfg.grpc_port) if cfg.grpc_port else None
        server = make_server(state, sock)
        if cfg.grpc_port:
            print(f"pipe serve: gRPC (Open Inference Protocol) on {url_host(cfg.host)}:{cfg.grpc_port}", flush=True)
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
            f"thread(s), batch <= {s.max_batch_size}, wait {s.max_wait_ms:g} ms, predictors {s.predictor_mode}) "
            f"listening on http://{url_host(host)}:{port}")


def _stopped(handled: int, left: int, s: Settings) -> None:
    print(f"pipe serve: stopped ({handled} inference requests handled"
          + (f", {left} still in flight after the {s.drain_s:g} s drain" if left else "") + ")", flush=True)


def _supervise(cfg: ServeConfig, spec: Spec, s: Settings, engine: str, sock: socket.socket, package: Path) -> None:
    """Several HTTP processes on the bound `sock` (`pipeline/serving/workers.py`); this one supervises them."""
    try:
        if cfg.grpc_port:
            print(f"pipe serve: gRPC (Open Inference Protocol) on {url_host(cfg.host)}:{cfg.grpc_port}", flush=True)
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
    state: State | None = None
    previous = signal.signal(signal.SIGTERM, exit_while_loading)
    try:
        try:
            preds = start_predictors(spec, s.predictors, s.threads, s.max_batch_size, engine, cfg.device,
                                     s.predictor_mode)
            if place.index == 0:
                checked = reference_check(spec, s, preds)
                workers.write_reference(place, checked)
            else:
                checked = workers.read_reference(place, START_S)
        except PipeError as e:  # the supervisor says it, once for every worker
            workers.write_failure(place, e)
            raise SystemExit(e.exit_code) from None
        state = State(spec, s, preds, checked, board=board, index=place.index)
        state.grpc_address = (cfg.host, cfg.grpc_port) if cfg.grpc_port else None
        server = make_server(state, sock)
        board.set_state(place.index, workers.LOADED)
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        if state is not None:
            state.publish()  # the last counts, for the supervisor's summary
        sock.close()
        for pred in preds:
            pred.close()
