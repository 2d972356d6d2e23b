"""The Python peer of the serving benchmark (`pipeline/bench/peers.py`): KServe's ModelServer (FastAPI and
uvicorn, the Open Inference Protocol over HTTP and gRPC) running a package's model.onnx on onnxruntime.

    .venv/kserve/bin/python pipeline/bench/kserve_peer.py MODEL.onnx NAME HTTP_PORT GRPC_PORT THREADS

It runs in its own environment (kserve's pins are not pipe's: `make bench` creates .venv/kserve), so it
imports nothing from pipe. One worker process, as `pipe serve`'s one HTTP process; KServe's defaults but
its per-request latency log, which is off (its uvicorn access log stays on, as it ships); no batching (the
ModelServer has none).
"""

from __future__ import annotations

import sys

import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxModel(Model):
    def __init__(self, name: str, path: str, threads: int):
        super().__init__(name)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.ready = True

    def predict(self, payload: InferRequest, headers: dict | None = None,
                response_headers: dict | None = None) -> InferResponse:
        feeds = {t.name: t.as_numpy() for t in payload.inputs}
        answers = []
        for name, y in zip(self.outputs, self.session.run(self.outputs, feeds)):
            out = InferOutput(name=name, shape=list(y.shape), datatype="FP32")
            out.set_data_from_numpy(y, binary_data=False)
            answers.append(out)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=answers,
                             from_grpc=payload.from_grpc)


def main(argv: list[str]) -> None:
    path, name, http_port, grpc_port, threads = argv
    ModelServer(http_port=int(http_port), grpc_port=int(grpc_port), workers=1, enable_latency_logging=False,
                access_log_format=None).start([OnnxModel(name, path, int(threads))])


if __name__ == "__main__":
    main(sys.argv[1:])
