"""`pipe serve` on an OCR system package (`pipeline/ocr_system/package.py`): one server, every part's predictors.

    pipe serve runs/ocr_system

Each part (det, cls, rec) is served as `pipe serve` serves a package (`pipeline/serving/server.py`'s `State`: its own
predictor processes on the engine its package chose, its own dynamic batcher, its reference set checked at
start-up), behind one HTTP server:

    POST /v1/ocr                        {"images": [base64 PNG/JPEG, ...]} (1..the detector's max_batch_size
                                        pages) -> {"pages": [[{"points": [[x, y] x 4], "text", "score"}, ...]]}:
                                        per page its lines in reading order, in the page's own pixels
                                        (`pipeline/ocr_system/__init__.py`'s steps, as PaddleOCR's TextSystem);
                                        a page without text -> []
    POST /v1/models/ROLE/predict        each part's own /v1/predict (ROLE: det, cls, rec)
    POST /v2/models/NAME/infer          each part's Open Inference Protocol endpoint (NAME: its package's name),
                                        with GET /v2/models/NAME[/ready|/config|/stats]
    GET  /v1/model  /livez  /readyz  /metrics  /v2  /v2/health/live|ready

A request's pages run through the detector's batcher (pages of one prepared shape together), then every line
of the request through the classifier's and the recognizer's batchers, where they batch with the lines of
every other request in flight (ocr_rec's by width bucket: a line reads the same whichever lines share its run).
Limits and errors are the parts' (serving.yaml; the detector's for /v1/ocr's body, pixels and timeout); a
request's deadline covers all its stages. /readyz is 200 once every part is warm. /metrics: the server's
request counts and latency per endpoint, `pipe_ocr_stage_seconds{stage}` (det, cls, rec per request: each
stage's wall time, queueing included), `pipe_ocr_lines_per_page`, and every part's batching and predictor
metrics labelled `model` (det, cls, rec). SIGTERM drains as `pipe serve` does. gRPC is not served for a system.
"""


import asyncio
import dataclasses
import signal
import sys
import time
from typing import Any, Sequence

import numpy as np

from pipeline import __version__, ocr_system
from pipeline.errors import InputError
from pipeline.serving import spec as spec_mod, v2, validate
from pipeline.serving.validate import ApiError

LINE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_OWN = ("pipe_requests", "pipe_request_duration_seconds", "pipe_inflight_requests", "pipe_ready")


class SystemState:
    """The parts' states (`server.State` each) and what the server itself counts; drains them together."""

    board = None  # one HTTP process: no board of several (pipeline/serving/workers.py)

    def __init__(self, system: Any, parts: dict[str, Any]):
        self.system, self.parts = system, parts
        self.s = parts["det"].s  # the detector's limits and drain time for /v1/ocr
        self.inflight_own = 0
        self.handled_own = 0
        self._drain: float | None = None
        self.metrics = _Metrics(self)

    @property
    def drain_started(self) -> float | None:
        return self._drain

    @drain_started.setter
    def drain_started(self, t: float | None) -> None:
        self._drain = t
        for part in self.parts.values():
            part.drain_started = t

    @property
    def inflight(self) -> int:
        return self.inflight_own + sum(p.inflight for p in self.parts.values())

    @property
    def handled(self) -> int:
        return self.handled_own + sum(p.handled for p in self.parts.values())

    def is_ready(self) -> bool:
        return self._drain is None and all(p.batcher.ready.is_set() for p in self.parts.values())

    async def admitted(self, work: Any) -> Any:
        """/v1/ocr's admission: ready (every part warm) and not draining; counted in flight until answered."""
        if self._drain is not None:
            raise ApiError(503, "draining", "the server is shutting down; retry on another instance",
                           {"Retry-After": "1", "Connection": "close"})
        if not self.is_ready():
            raise ApiError(503, "not_ready", "the models are warming up; retry shortly", {"Retry-After": "1"})
        self.inflight_own += 1
        try:
            return await work(time.monotonic() + self.s.timeout_s)
        finally:
            self.inflight_own -= 1
            self.handled_own += 1

    async def ocr(self, doc: Any, deadline: float) -> dict[str, Any]:
        """A /v1/ocr body -> {"pages": [...]}: the pages decoded, detected, their lines cut out, turned upright
        (with a classifier) and read, each model's batches through its part's batcher."""
        from pipeline.tasks import ocr_cls, ocr_rec

        det = self.parts["det"]
        raws = validate.image_list(doc, det.s.max_batch_size)
        t0 = time.perf_counter()
        if validate.inline_decode(raws):
            images, groups = _pages(raws, det)
        else:
            images, groups = await asyncio.to_thread(_pages, raws, det)
        runs = await _run(det, groups, deadline)
        boxes = await asyncio.to_thread(ocr_system.page_boxes, images, det.spec.info, runs)
        lines = await asyncio.to_thread(ocr_system.crops, images, boxes)
        t1 = time.perf_counter()
        self.metrics.stage.labels("det").observe(t1 - t0)
        if "cls" in self.parts and lines:
            answers = await _answers(self.parts["cls"], ocr_cls, lines, deadline)
            lines = ocr_cls.turn_upright(lines, answers, self.parts["cls"].spec.info)
            t2 = time.perf_counter()
            self.metrics.stage.labels("cls").observe(t2 - t1)
            t1 = t2
        texts = await _answers(self.parts["rec"], ocr_rec, lines, deadline) if lines else []
        self.metrics.stage.labels("rec").observe(time.perf_counter() - t1)
        pages = ocr_system.page_lines(boxes, texts, self.system.drop_score)
        for page in pages:
            self.metrics.lines.observe(len(page))
        return {"pages": pages}

    def model_info(self) -> dict[str, Any]:
        """GET /v1/model: the system's settings, what it measured when packaged, and each part's /v1/model."""
        sy = self.system
        return {"system": "ocr", "parts": {role: p.model_info() for role, p in self.parts.items()},
                "drop_score": sy.drop_score, "max_pages": self.parts["det"].s.max_batch_size,
                "measured": sy.doc.get("measured"), "package_manifest_sha256": sy.manifest_sha256}


def _pages(raws: list[bytes], det: Any) -> tuple[list[np.ndarray], list[tuple[list[int], dict[str, np.ndarray]]]]:
    """The pages decoded (RGB) and the detector's batches of them (`prepare_images`), feeds by program name."""
    images = validate.open_images(raws, det.s)
    name = det.spec.io.inputs[0].name
    groups = [(pos, {name: x}) for pos, x in det.spec.task.prepare_images(images, det.spec.info, det.s.max_batch_size)]
    return images, groups


async def _run(part: Any, groups: Sequence[tuple[list[int], dict[str, np.ndarray]]], deadline: float
               ) -> list[tuple[list[int], dict[str, np.ndarray]]]:
    """Every batch through the part's batcher at once: (positions, outputs by public name) per batch."""
    outs = await asyncio.gather(*(part.infer(feeds, deadline) for _, feeds in groups))
    io_ = part.spec.io
    return [(pos, {t.public: out[t.name] for t in io_.outputs}) for (pos, _), out in zip(groups, outs, strict=True)]


async def _answers(part: Any, task: Any, lines: list[np.ndarray], deadline: float) -> list[Any]:
    """The part's task's answer for each line image, its batches (`prepare_images`) through the part's batcher."""
    name = part.spec.io.inputs[0].name

    def prepare() -> list[tuple[list[int], dict[str, np.ndarray]]]:
        return [(pos, {name: x}) for pos, x in task.prepare_images(lines, part.spec.info, part.s.max_batch_size)]

    groups = await asyncio.to_thread(prepare)
    return ocr_system.answers(task, part.spec.info, len(lines), await _run(part, groups, deadline))


class _Metrics:
    """The server's own metrics, and each part's (its registry's families, labelled model=ROLE)."""

    def __init__(self, state: SystemState):
        from prometheus_client import CollectorRegistry, Gauge, Histogram

        from pipeline.serving.metrics import request_metrics

        r = self.registry = CollectorRegistry()
        self.requests, self.latency = request_metrics(r)
        self.stage = Histogram("pipe_ocr_stage_seconds", "/v1/ocr: each stage's wall time per request (det: decode, "
                               "detect, cut the lines out; cls; rec), waiting for the batchers included",
                               ["stage"], registry=r,
                               buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.lines = Histogram("pipe_ocr_lines_per_page", "/v1/ocr: lines answered per page", registry=r,
                               buckets=LINE_BUCKETS)
        Gauge("pipe_inflight_requests", "Inference requests being handled (every endpoint)", registry=r
              ).set_function(lambda: state.inflight)
        Gauge("pipe_ready", "1 once every part is warm and not draining", registry=r).set_function(
            lambda: float(state.is_ready()))
        r.register(_ByPart({role: p.metrics.registry for role, p in state.parts.items()}))


class _ByPart:
    """Each part's own registry, its families merged across parts with a `model` label (the server's own
    request counts are this registry's, not the parts')."""

    def __init__(self, registries: dict[str, Any]):
        self.registries = registries

    def describe(self) -> list[Any]:
        return []  # no names to check against the server's own: they never overlap (`_OWN` skipped)

    def collect(self) -> Any:
        from prometheus_client.metrics_core import Metric

        families: dict[str, Any] = {}
        for role, reg in self.registries.items():
            for fam in reg.collect():
                if fam.name in _OWN:
                    continue
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                out.samples.extend(s._replace(labels={**s.labels, "model": role}) for s in fam.samples)
        yield from families.values()


def part_settings(cfg: Any, spec: Any, parts: int) -> spec_mod.Settings:
    """A part's settings (`spec_mod.settings`: flags over its serving.yaml), except the automatic thread count
    (`--threads` unset, serving.yaml's 0): the cores but one shared by every part's predictors, not each
    part's alone (three parts on 16 cores: 5 threads each, not 15). A system is one HTTP process."""
    from pipeline import runtime

    s = dataclasses.replace(spec_mod.settings(cfg, spec), http_workers=1)
    if cfg.threads is None and int((spec.doc.get("server") or {}).get("threads", 0)) == 0:
        s = dataclasses.replace(s, threads=max(1, (runtime.available_cores() - 1) // (s.predictors * parts)))
    return s


def run(cfg: Any, package_dir: Any) -> None:
    """Verify the system package, start every part's predictors (each checked on its reference set), serve
    until SIGTERM/SIGINT, drain, return."""
    from pipeline import runtime
    from pipeline.ocr_system import package as ocr_package
    from pipeline.serving import server as serve_mod
    from pipeline.serving.predictor import PredictorProcess, start_predictors
    from pipeline.serving.spec import engine_for

    system = ocr_package.load(package_dir)
    if cfg.grpc_port:
        raise InputError(f"--grpc-port {cfg.grpc_port}: an OCR system package is served over HTTP only (serve a "
                         "part's own package for gRPC)")
    if (cfg.http_workers or 1) > 1:
        raise InputError(f"--http-workers {cfg.http_workers}: an OCR system package is served by one HTTP process "
                         "(its parts' predictors batch across pages there)")
    if cfg.max_batch_size is not None:
        raise InputError(f"--max-batch-size {cfg.max_batch_size}: an OCR system package keeps each part's own "
                         "(pages for det, lines for cls and rec); re-package a part to change it")
    settings = {role: part_settings(cfg, sp, len(system.parts)) for role, sp in system.parts.items()}
    engines = {role: engine_for(sp, cfg.engine) for role, sp in system.parts.items()}
    runtime.device_index(cfg.device, "--device")
    if cfg.host != "127.0.0.1":
        print(f"pipe serve: warning: listening on {cfg.host}, reachable from other machines; this server has "
              "no authentication or TLS (put a proxy in front of it)", file=sys.stderr)
    sock = serve_mod.bind(cfg.host, cfg.port)
    preds: dict[str, list[PredictorProcess]] = {}
    state: SystemState | None = None
    previous = signal.signal(signal.SIGTERM, serve_mod.exit_while_loading)
    try:
        parts = {}
        for role, sp in system.parts.items():
            s = settings[role]
            preds[role] = start_predictors(sp, s.predictors, s.threads, s.max_batch_size, engines[role], cfg.device,
                                           s.predictor_mode)
            checked = serve_mod.reference_check(sp, s, preds[role])
            parts[role] = serve_mod.State(sp, s, preds[role], checked)
        state = SystemState(system, parts)
        server = serve_mod.make_server(state, sock, build_app(state))
        host, port = sock.getsockname()[:2]
        desc = ", ".join(f"{role} {sp.name} ({sp.precision} {system.variants.get(role) or '?'} on {engines[role]}, "
                         f"{settings[role].predictors} x "
                         f"{settings[role].threads} thread(s), batch <= {settings[role].max_batch_size})"
                         for role, sp in system.parts.items())
        print(f"pipe serve: OCR system: {desc}; /v1/ocr listening on http://{serve_mod.url_host(host)}:{port}",
              flush=True)
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        for ps in preds.values():
            for p in ps:
                p.close()
    left = state.inflight if state is not None else 0
    handled = state.handled if state is not None else 0
    drain = settings["det"].drain_s
    print(f"pipe serve: stopped ({handled} inference requests handled"
          + (f", {left} still in flight after the {drain:g} s drain" if left else "") + ")", flush=True)


def build_app(state: SystemState) -> Any:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.requests import ClientDisconnect

    from pipeline.serving import server as serve_mod

    parts = state.parts
    by_name = {p.spec.name: p for p in parts.values()}

    @asynccontextmanager
    async def lifespan(app: Any):
        for p in parts.values():
            p.batcher.start()
        yield
        await asyncio.gather(*(asyncio.to_thread(p.batcher.stop, 5.0) for p in parts.values()))

    app = FastAPI(title="pipe serve: OCR system", version=__version__, lifespan=lifespan, redoc_url=None,
                  docs_url=None, description="An OCR system (text detection, orientation, recognition) from one pipe "
                                             "package. Errors: {\"error\": {\"code\", \"type\", \"message\"}} (on "
                                             "/v2, the Open Inference Protocol's {\"error\": \"...\"}).")
    internal = serve_mod.install_errors(app)

    async def admitted(gate: Any, request: Request, handler: Any) -> Any:
        try:
            return await gate.admitted(lambda deadline: handler(request, deadline))
        except ClientDisconnect:
            raise ApiError(400, "client_disconnected", "the client went away before the body was read") from None

    async def ocr(request: Request, deadline: float) -> Any:
        body = await validate.read_body(request, ("application/json",), state.s, deadline)
        return JSONResponse(await state.ocr(validate.parse_json(body, state.s.max_json_depth), deadline))

    def ready() -> None:
        if state.drain_started is not None:
            raise ApiError(503, "draining", "the server is shutting down", {"Retry-After": "1"})
        if not state.is_ready():
            raise ApiError(503, "not_ready", "the models are warming up", {"Retry-After": "1"})

    def part_of(model_name: str, model_version: str | None = None) -> Any:
        part = by_name.get(model_name)
        if part is None:
            raise ApiError(404, "not_found", f"no model {model_name!r} here; this server has "
                                             f"{', '.join(repr(n) for n in by_name)}")
        v2.check_model(part.spec, model_name, model_version)
        return part

    @app.post("/v1/ocr", summary="Read every text line of each page: points, text, score, in reading order")
    async def v1_ocr(request: Request) -> Any:
        return await admitted(state, request, ocr)

    def v1_part(part: Any) -> Any:
        async def predict(request: Request) -> Any:
            return await admitted(part, request, lambda r, d: serve_mod.serve_v1(part, r, d))

        return predict

    for role, part in parts.items():
        app.post(f"/v1/models/{role}/predict", summary=f"The {role} model's own /v1/predict")(v1_part(part))

    async def v2_infer(request: Request, model_name: str, model_version: str | None = None) -> Any:
        part = part_of(model_name, model_version)
        return await admitted(part, request, lambda r, d: serve_mod.serve_v2(part, r, d))

    serve_mod.install_health(app, ready, "once every part is warm")

    model_path = "/v2/models/{model_name}"

    @app.get(model_path, summary="Open Inference Protocol: model metadata")
    async def v2_model(model_name: str) -> dict[str, Any]:
        return v2.model_metadata(part_of(model_name).spec)

    @app.get(model_path + "/ready", summary="Open Inference Protocol: 200 when the model is warm")
    async def v2_model_ready(model_name: str) -> dict[str, Any]:
        part = part_of(model_name)
        if not part.is_ready():
            raise ApiError(503, "not_ready", "the model is warming up", {"Retry-After": "1"})
        return {"name": model_name, "ready": True}

    @app.get(model_path + "/config", summary="Triton's model configuration extension")
    async def v2_config(model_name: str) -> dict[str, Any]:
        return part_of(model_name).model_config

    @app.get(model_path + "/stats", summary="Triton's statistics extension")
    async def v2_stats(model_name: str) -> dict[str, Any]:
        return part_of(model_name).stats.doc(model_name, v2.VERSION)

    @app.post(model_path + "/infer", summary="Open Inference Protocol: inference")
    async def v2_model_infer(request: Request, model_name: str) -> Any:
        return await v2_infer(request, model_name)

    @app.post(model_path + "/versions/{model_version}/infer", summary="Open Inference Protocol: inference")
    async def v2_version_infer(request: Request, model_name: str, model_version: str) -> Any:
        return await v2_infer(request, model_name, model_version)

    from pipeline.serving import openapi

    openapi.install_ocr(app, parts["det"].spec, state.s, state.system.drop_score)

    @app.get("/v1/model", summary="The system: parts, settings, what it measured when packaged")
    async def model() -> dict[str, Any]:
        return state.model_info()

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    direct = {"/v1/ocr": ocr}

    async def handle(scope: dict, receive: Any, send: Any, handler: Any) -> None:
        request = Request(scope, receive)
        try:
            response = await admitted(state, request, handler)
        except ApiError as exc:
            response = serve_mod.error_response(exc.code, exc.kind, exc.message, exc.headers, request)
        except Exception as exc:
            response = await internal(request, exc)
        await response(scope, receive, send)

    paths = {"/v1/ocr", "/v1/model", "/livez", "/readyz", "/metrics",
             *(f"/v1/models/{role}/predict" for role in parts),
             *(p for part in parts.values() for p in serve_mod.v2_paths(part.spec.name))}
    return serve_mod.Observe(app, state, direct, handle, paths)
