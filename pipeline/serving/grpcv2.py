"""The Open Inference Protocol over gRPC: KServe v2's `inference.GRPCInferenceService`, as Triton serves it,
so `tritonclient.grpc` works against `pipe serve --grpc-port PORT`.

The service and its messages are tritonclient's generated modules (`tritonclient.grpc.service_pb2`,
`model_config_pb2`: Triton's protobuf/grpc_service.proto and model_config.proto, BSD-3, NVIDIA), served by
grpcio's asyncio server on the HTTP server's event loop, beside it on its own port. A request is checked
and run by the code /v2 over HTTP uses: its inputs become the same tensor entries (`raw_input_contents`
as binary data, or the typed `contents`), `v2.request` and `v2.tensors` check them and the batcher runs
them (`_State.admitted` / `_State.infer`: the same admission, limits, in-flight count, deadline and
statistics); every output is answered as `raw_output_contents`, classification (`parameters.classification`
on the logits output) as Triton's BYTES strings (`v2.classify`). Messages over the package's body cap
(`--max-body-bytes`) are refused by gRPC itself with RESOURCE_EXHAUSTED.

Errors are gRPC status codes with the HTTP endpoints' one-line message: a bad request INVALID_ARGUMENT,
an unknown model NOT_FOUND, warming up, draining or a full queue UNAVAILABLE, the request timeout
DEADLINE_EXCEEDED, anything else INTERNAL. The calls Triton has and this server does not (repository,
shared memory, trace, logging, streaming) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline import __version__
from pipeline.serving import v2
from pipeline.serving.validate import ApiError

log = logging.getLogger("pipe.serve")
# The typed contents field of each datatype the package's tensors can have (InferTensorContents).
_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents", "BYTES": "bytes_contents"}


def _status(code: int) -> Any:
    import grpc

    return {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
            408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
            415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
            503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}.get(
        code, grpc.StatusCode.INTERNAL)


def request_doc(req: Any) -> tuple[dict[str, Any], bytes]:
    """A ModelInferRequest as /v2's JSON header and binary data (`v2.request`'s input): each input's
    raw_input_contents as binary data, or its typed contents as `data`."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise ApiError(422, "invalid_request", f"raw_input_contents holds {len(raw)} entries for "
                                               f"{len(req.inputs)} inputs (one per input, in order)")
    inputs, parts = [], []
    for i, t in enumerate(req.inputs):
        e: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        params = {k: True for k in t.parameters if k.startswith("shared_memory")}  # refused by v2.request
        if raw:
            params["binary_data_size"] = len(raw[i])
            parts.append(raw[i])
        elif t.datatype == "BYTES":
            try:
                e["data"] = [b.decode("utf-8") for b in t.contents.bytes_contents]
            except UnicodeDecodeError:
                raise ApiError(422, "invalid_tensor", f"input '{t.name}': BYTES elements must be UTF-8 text") from None
        else:
            field = _CONTENTS.get(t.datatype)
            e["data"] = list(getattr(t.contents, field)) if field else []
        if params:
            e["parameters"] = params
        inputs.append(e)
    outputs = []
    for o in req.outputs:
        out: dict[str, Any] = {"name": o.name}
        if "classification" in o.parameters:
            out["parameters"] = {"classification": o.parameters["classification"].int64_param}
        outputs.append(out)
    doc: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
    if req.id:
        doc["id"] = req.id
    return doc, b"".join(parts)


class Service:
    """The servicer (built on tritonclient's generated base class in `service`)."""

    def __init__(self, state: Any):
        from tritonclient.grpc import model_config_pb2, service_pb2

        self.state, self.spec, self.pb = state, state.spec, service_pb2
        from google.protobuf import json_format

        self.config = json_format.ParseDict(state.model_config, model_config_pb2.ModelConfig())
        self.json_format = json_format

    async def _abort(self, context: Any, e: ApiError) -> None:
        await context.abort(_status(e.code), e.message)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return self.pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return self.pb.ServerReadyResponse(ready=self.state.is_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            v2.check_model(self.spec, request.name, request.version or None)
        except ApiError as e:
            await self._abort(context, e)
        return self.pb.ModelReadyResponse(ready=self.state.is_ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self.pb.ServerMetadataResponse(name="pipe", version=__version__, extensions=v2.EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            v2.check_model(self.spec, request.name, request.version or None)
        except ApiError as e:
            await self._abort(context, e)
        meta = v2.model_metadata(self.spec)
        tensor = self.pb.ModelMetadataResponse.TensorMetadata
        return self.pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]], outputs=[tensor(**t) for t in meta["outputs"]])

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            v2.check_model(self.spec, request.name, request.version or None)
        except ApiError as e:
            await self._abort(context, e)
        return self.pb.ModelConfigResponse(config=self.config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            if request.name:  # "" asks for every model: the one served
                v2.check_model(self.spec, request.name, request.version or None)
        except ApiError as e:
            await self._abort(context, e)
        doc = self.state.stats.doc(self.spec.name, v2.VERSION)
        return self.json_format.ParseDict(doc, self.pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        try:
            v2.check_model(self.spec, request.model_name, request.model_version or None)
            return await self.state.admitted(lambda deadline: self._infer(request, deadline))
        except ApiError as e:
            await self._abort(context, e)
        except Exception as e:  # noqa: BLE001 - a 500's equivalent, logged as the HTTP endpoints log it
            if type(e).__name__ == "AbortError":  # grpc.aio's own abort, already answered
                raise
            log.error("pipe serve: internal error (gRPC): %s: %s", e.__class__.__name__, e)
            await context.abort(_status(500), "internal error")

    async def _infer(self, request: Any, deadline: float) -> Any:
        spec, s = self.spec, self.state.s
        doc, binary = request_doc(request)
        found, outputs = v2.request(doc, binary, spec, s)
        ys = await self.state.infer(await v2.tensors(found, spec, s), deadline)
        resp = self.pb.ModelInferResponse(model_name=spec.name, model_version=v2.VERSION, id=request.id)
        for name, out, _, count in outputs:
            datatype, shape, raw = v2.encode(ys[out.name], out, count, spec)
            resp.outputs.add(name=name, datatype=datatype, shape=shape)
            resp.raw_output_contents.append(raw)
        return resp


async def start(state: Any, host: str, port: int) -> Any:
    """A started grpc.aio server on host:port (bound before: `stages.serve` checked the port), serving the
    package's model; `await server.stop(grace)` ends it."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    servicer = type("GRPCInferenceService", (Service, service_pb2_grpc.GRPCInferenceServiceServicer), {})(state)
    cap = state.s.max_body_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", cap),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", 0)])  # never share the port with another server
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(where) != port:
        raise OSError(f"--grpc-port {port}: cannot listen on {where}")
    await server.start()
    return server

