"""One model's HTTP server, as `pipe serve` runs it in each HTTP process (`stages/serve.py`): the state (the
predictors' batcher, statistics, metrics, readiness, drain), the FastAPI application with its inference
endpoints dispatched past the router, uvicorn with lingering close, and the reference check before any of it
listens. The OCR system's server (`pipeline/ocr_system/serving.py`) is built from the same parts, one state per
part. The endpoints, limits and signals are described in `stages/serve.py`."""

import asyncio
import logging
import queue
import socket
import sys
import time
from typing import Any

import numpy as np

from pipeline import __version__
from pipeline.errors import GateError, InputError
from pipeline.serving import gcpause, openapi, v2, validate, wire, workers
from pipeline.serving import stats as stats_mod
from pipeline.serving.batcher import Batcher, Job
from pipeline.serving.metrics import Metrics
from pipeline.serving.predictor import PredictorProcess
from pipeline.serving.spec import Settings, Spec
from pipeline.serving.validate import ApiError

_PATHS = ("/v1/predict", "/GeneralModelService/inference", "/v1/model", "/livez", "/readyz", "/metrics",
          "/docs", "/openapi.json", *(f"/docs/{name}" for name in openapi.DOCS_ASSETS))
_KEEP_ALIVE_S = 15  # idle keep-alive connections close after this, s (longer than clients keep them)
_SHUTDOWN_GRACE_S = 2.0  # after the drain: idle keep-alive connections close, stragglers are cancelled
log = logging.getLogger("pipe.serve")


def reference_check(spec: Spec, s: Settings, preds: list[PredictorProcess]) -> dict[str, Any] | None:
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


def exit_while_loading(sig: int, frame: Any) -> None:
    raise SystemExit(0)


# ------------------------------------------------------------------ socket


def bind(host: str, port: int, flag: str = "--port") -> socket.socket:
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


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ------------------------------------------------------------------ the application


class State:
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
        self.metrics = Metrics(self)
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
                         "http_workers": s.http_workers, "predictors": s.predictors,
                         "predictor_mode": s.predictor_mode, "threads": s.threads},
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


async def serve_v1(state: State, request: Any, deadline: float) -> Any:
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


async def serve_v2(state: State, request: Any, deadline: float) -> Any:
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


def build_app(state: State) -> Any:
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
        """Everything that runs a predictor (`State.admitted`), with the request's own body to read."""
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

    return Observe(app, state, direct, handle)


def v2_paths(name: str) -> set[str]:
    """The Open Inference Protocol's paths of a server holding model `name` (metrics' endpoint label values)."""
    model = f"/v2/models/{name}"
    return {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/stats",
            *(m + end for m in (model, f"{model}/versions/{v2.VERSION}") for end in ("", "/ready", "/infer", "/config", "/stats"))}


class Observe:
    """ASGI wrapper: request count and latency per endpoint (known paths only: bounded label values),
    `Connection: close` on every answer once draining, and POSTs to the inference endpoints straight to
    their handlers."""

    def __init__(self, app: Any, state: Any, direct: dict[str, Any], handle: Any, paths: set[str] | None = None):
        self.app, self.state = app, state
        self.direct, self.handle = direct, handle  # POST path -> handler, run by handle() (build_app)
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


def make_server(state: Any, sock: socket.socket, app: Any = None) -> Any:
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
            if state.board is not None:
                state.publish()
            t = state.drain_started
            if t is not None and not self.should_exit:
                # several HTTP processes drain together: one with nothing in flight keeps answering 503 "draining"
                # while another finishes, rather than exiting with connections the shared socket gave it
                busy = state.inflight if state.board is None else state.board.total("inflight")
                if busy == 0 or time.monotonic() - t >= drain_s:
                    self.should_exit = True
            return await super().on_tick(counter)

    # Idle keep-alive connections outlive the clients' own pool expiry (httpx: 5 s), so a client never
    # reuses a connection the server is closing at that very moment ("Server disconnected without
    # sending a response" was seen in CI with both at 5 s).
    # httptools with nginx's lingering close: a client still sending its body reads an early 413 (or 415,
    # 503) instead of a connection reset (pipeline/serving/lingering.py).
    config = uvicorn.Config(build_app(state) if app is None else app, http=LingeringHttpToolsProtocol, log_level="warning",
                            access_log=False, lifespan="on",
                            timeout_keep_alive=_KEEP_ALIVE_S, timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
                            server_header=False,
                            limit_concurrency=max(256, 4 * state.s.queue_size))
    return _Server(config)
