"""The Open Inference Protocol over gRPC: KServe v2's `inference.GRPCInferenceService`, as Triton serves it,
so `tritonclient.grpc` works against `pipe serve --grpc-port PORT`.

The service and its messages are tritonclient's generated modules (`tritonclient.grpc.service_pb2`,
`model_config_pb2`: Triton's protobuf/grpc_service.proto and model_config.proto, BSD-3, NVIDIA), served by
grpcio's asyncio server on the HTTP server's event loop, beside it on its own port (this module is
imported only with `--grpc-port`). A request is checked
and run by the code /v2 over HTTP uses: its inputs become the same tensor entries (`raw_input_contents`
as binary data, or the typed `contents`), `v2.request` and `v2.tensors` check them and the batcher runs
them (`server.State.admitted` / `server.State.infer`: the same admission, limits, in-flight count, deadline and
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

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2 as pb, service_pb2_grpc

from pipeline import __version__
from pipeline.serving import v2
from pipeline.serving.validate import ApiError

log = logging.getLogger("pipe.serve")
# The typed contents field of each datatype the package's tensors can have (InferTensorContents).
_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents", "BYTES": "bytes_contents"}
# The server's HTTP statuses (ApiError.code) as gRPC status codes; anything else is INTERNAL.
_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
           408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
           415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
           503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


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


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The calls of the service this server has; the base class answers the others UNIMPLEMENTED."""

    def __init__(self, state: Any):
        self.state, self.spec = state, state.spec
        self.config = json_format.ParseDict(state.model_config, model_config_pb2.ModelConfig())

    async def _model(self, context: Any, name: str, version: str) -> None:
        """NOT_FOUND unless `name` (and `version`, when given) is the served model (`v2.check_model`)."""
        try:
            v2.check_model(self.spec, name, version or None)
        except ApiError as e:
            await context.abort(_STATUS[e.code], e.message)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.state.is_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        await self._model(context, request.name, request.version)
        return pb.ModelReadyResponse(ready=self.state.is_ready())

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="pipe", version=__version__, extensions=v2.EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self._model(context, request.name, request.version)
        return json_format.ParseDict(v2.model_metadata(self.spec), pb.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        await self._model(context, request.name, request.version)
        return pb.ModelConfigResponse(config=self.config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name:  # "" asks for every model: the one served
            await self._model(context, request.name, request.version)
        return json_format.ParseDict(self.state.stats.doc(self.spec.name, v2.VERSION), pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await self._model(context, request.model_name, request.model_version)
        try:
            return await self.state.admitted(lambda deadline: self._infer(request, deadline))
        except ApiError as e:
            await context.abort(_STATUS.get(e.code, grpc.StatusCode.INTERNAL), e.message)
        except Exception as e:  # noqa: BLE001 - a 500's equivalent, logged as the HTTP endpoints log it
            log.error("pipe serve: internal error (gRPC): %s: %s", e.__class__.__name__, e)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    async def _infer(self, request: Any, deadline: float) -> Any:
        spec, s = self.spec, self.state.s
        doc, binary = request_doc(request)
        found, outputs = v2.request(doc, binary, spec, s)
        ys = await self.state.infer(await v2.tensors(found, spec, s), deadline)
        resp = pb.ModelInferResponse(model_name=spec.name, model_version=v2.VERSION, id=request.id)
        for name, out, _, count in outputs:
            datatype, shape, raw = v2.encode(ys[out.name], out, count, spec)
            resp.outputs.add(name=name, datatype=datatype, shape=shape)
            resp.raw_output_contents.append(raw)
        return resp


async def start(state: Any, host: str, port: int, shared: bool = False) -> Any:
    """A started grpc.aio server on host:port (bound before: `stages.serve` checked the port), serving the
    package's model; `await server.stop(grace)` ends it. The port is never shared with another server;
    `shared`: every HTTP process of one server binds it (SO_REUSEPORT: the kernel spreads the connections;
    the supervisor found it free, and a later server's check, which binds without the option, is refused)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", state.s.max_body_bytes),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", int(shared))])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(state), server)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(where) != port:
        raise OSError(f"--grpc-port {port}: cannot listen on {where}")
    await server.start()
    return server
