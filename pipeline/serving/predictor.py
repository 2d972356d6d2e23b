"""Engine predictors: in child processes (`python -m pipeline.serving.predictor --predictor SPEC`), or in the
server's own process for an engine that releases the GIL while it runs (`spec.mode_for`, `--predictor-mode`).

Each predictor loads the package's model on its engine (`pipeline/engines/`: Paddle Inference, onnxruntime or
OpenVINO; serving.yaml's `model.engine`, or `pipe serve --engine`) and runs the batches the server sends.
Paddle Inference's Python `run()` holds the GIL for the whole inference on CPU (its binding releases it
only for custom devices): predictors on threads would stall the HTTP event loop and each other. In a
child process the predictor runs while the server waits on a pipe with the GIL released. onnxruntime's and
OpenVINO's `run` release the GIL: `--predictor-mode auto` (the default) runs them in the HTTP process, called by
the batcher's threads (`InProcessPredictor`), with no pipe, no copy of the batch and no second process (on the
digits package at concurrency 16: 10-27% less CPU per inference, docs/serve.md);
a crash of the engine then takes its HTTP process down, as in Triton's onnxruntime backend. A batch is a dict of named
arrays (the package's inputs by program name, `spec.io`, one batch size), answered with every output by
program name. Frames on the child's stdin/stdout: 4-byte header length, JSON header (each tensor's
[name, dtype, shape]), 8-byte payload length, the tensors' raw C-order bytes one after the other (`pack`:
no pickle, no copy of a contiguous array). The child ignores SIGINT/SIGTERM: the server drains first,
then closes its stdin.

Batch shapes: dynamic batching makes batches of every size, and Paddle Inference's oneDNN kernels are
built per input shape; with its default cache a change of batch size rebuilt them (mobilenet_v3_small
3x64x64, 1 thread: 1.7-2.0 ms per sample at random batch sizes 1-16 against 0.9 at a fixed 8). So a
batch runs at the next of a few bucket sizes (powers of two up to max_batch, and max_batch), every input
padded with copies of its first sample whose outputs are dropped, and the predictor caches one set of
kernels per bucket (0.84-1.05 ms per sample at random sizes). A cache of every size instead cost 180 MB (mobilenet)
to 750 MB (resnet18) at max_batch 32. Samples are independent in inference, so padding changes no
real sample's output (measured: 0.0 on the image models, <= 4e-7 on the text models).
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import engines, runtime, tasks
from pipeline.errors import InputError, PipeError
from pipeline.serving import gcpause
from pipeline.serving.spec import Spec, engine_for, mode_for

START_S = 600.0  # a big program on a busy machine can take minutes to load


class PredictorProcess:
    """One predictor child: `start`, `hello` (it loaded), `run(feeds)`, `warm_up`, `close`."""

    def __init__(self, spec: Spec, threads: int, max_batch: int, engine: str = "", device: str = "cpu"):
        warm = warm_shapes(spec)
        self.doc = {"package": str(spec.dir), "engine": engine_for(spec, engine), "device": device,
                    "precision": spec.precision, "threads": threads, "warm": warm, "buckets": buckets(max_batch)}
        self.proc: subprocess.Popen | None = None
        self.engine: dict[str, Any] = {}  # the child's engine, as it describes itself (after `hello`)
        self.gc: list[list[float]] = []  # the child's collections and seconds per generation (`gcpause`)

    def start(self) -> None:
        env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS=str(self.doc["threads"]),
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.serving.predictor", "--predictor",
                                      json.dumps(self.doc)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def hello(self, timeout: float) -> None:
        """The child's first frame: it loaded the program (or why not: InputError for a fixable cause)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise PipeError(f"{self.doc['package']}: the predictor process did not start within {timeout:g} s")
        try:
            head, _ = read_frame(self.proc.stdout)
        except EOFError:
            raise PipeError(f"{self.doc['package']}: the predictor process exited ({self.proc.wait()}) while "
                            "loading; its stderr is above") from None
        if not head.get("ok"):
            raise (InputError if head.get("input_error") else PipeError)(head.get("error", "predictor failed"))
        self.engine = head.get("engine") or {}

    def call(self, head: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        write_frame(self.proc.stdin, head, payload)
        reply, data = read_frame(self.proc.stdout)
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error", "predictor failed"))
        return reply, data

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch of named inputs (program names; one batch size) -> every output by program name."""
        head, payload = pack("run", feeds)
        reply, data = self.call(head, payload)
        self.gc = reply.get("gc", self.gc)
        return unpack(reply["tensors"], data)

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


def bucketed(eng: Any, on: dict[str, str], fetch: list[tuple[str, str]], sizes: list[int]) -> Any:
    """`eng.run` at the next bucket size (module docstring): named inputs (program names) -> every output by
    program name, the padding's rows dropped."""
    def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(feeds.values())))
        size = next((b for b in sizes if b >= n), n)
        if size > n:  # padded with copies of a real sample (a valid input for any model), outputs dropped
            feeds = {k: np.concatenate([x, np.repeat(x[:1], size - n, axis=0)]) for k, x in feeds.items()}
        ys = eng.run({on[k]: x for k, x in feeds.items()})
        return {name: ys[real][:n] for name, real in fetch}

    return infer


def warm(infer: Any, doc: dict[str, Any]) -> None:
    """oneDNN builds its kernels per input shape on first sight: every warm shape at every bucket, before /readyz."""
    for shapes in doc["warm"]:
        for n in doc["buckets"]:
            infer({name: np.zeros((n, *shape), dtype) for name, dtype, shape in shapes})


class InProcessPredictor:
    """A predictor in this process, for an engine whose `run` releases the GIL (onnxruntime, OpenVINO): the
    batcher's thread calls it directly, no pipe and no second process. The same interface as PredictorProcess."""

    def __init__(self, spec: Spec, threads: int, max_batch: int, engine: str = "", device: str = "cpu"):
        self.spec = spec
        self.doc = {"package": str(spec.dir), "engine": engine_for(spec, engine), "device": device,
                    "precision": spec.precision, "threads": threads, "warm": warm_shapes(spec),
                    "buckets": buckets(max_batch)}
        self.proc = None
        self.engine: dict[str, Any] = {}
        self.gc: list[list[float]] = []  # this process's collections are the server's own
        self._infer: Any = None

    def start(self) -> None:
        d = self.doc
        eng = load_engine(self.spec, d["engine"], d["threads"], cache_capacity=len(d["buckets"]) * len(d["warm"]),
                          device=d["device"])
        on = engines.names(eng, self.spec.io, str(self.spec.files[0]))
        self._infer = bucketed(eng, on, [(t.name, on[t.name]) for t in self.spec.io.outputs], d["buckets"])
        self.engine = eng.describe()

    def hello(self, timeout: float) -> None:
        pass

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._infer(feeds)

    def warm_up(self) -> None:
        warm(self._infer, self.doc)

    def close(self, timeout: float = 5.0) -> None:
        self._infer = None


def warm_shapes(spec: Spec) -> list[list[list[Any]]]:
    """The input shapes warm-up runs, each a [[name, dtype, per-sample shape], ...] for every input: the
    package's fixed shapes, or for a task with a dynamic input (ocr_rec's width) its `example_shapes`."""
    from pipeline import tasks
    from pipeline.serving.validate import sample_shape

    if tasks.dynamic(spec.task):
        t = spec.io.inputs[0]
        return [[[t.name, t.dtype, [int(d) for d in shape]]] for shape in spec.task.example_shapes(spec.info)]
    return [[[t.name, t.dtype, list(sample_shape(spec, t))] for t in spec.io.inputs]]


def buckets(max_batch: int) -> list[int]:
    """The batch sizes a predictor runs: 1, 2, 4, ... below max_batch, and max_batch."""
    return [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch] + [max_batch]


def start_predictors(spec: Spec, n: int, threads: int, max_batch: int, engine: str = "",
                     device: str = "cpu", mode: str = "auto") -> list[Any]:
    """`n` predictors of the package on `engine`, loaded (PipeError/InputError: why not), in processes or in this
    process as `mode_for` says."""
    kind = InProcessPredictor if mode_for(engine_for(spec, engine), mode) == "in-process" else PredictorProcess
    preds = [kind(spec, threads, max_batch, engine, device) for _ in range(n)]
    try:
        for pred in preds:  # processes start together: their paddle imports overlap
            pred.start()
        for pred in preds:
            pred.hello(START_S)
    except BaseException:
        for pred in preds:
            pred.close()
        raise
    return preds


def pack(op: str, arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], list[Any]]:
    """A frame's header and payload for named arrays: [name, dtype, shape] each, then their raw C-order
    bytes one after the other (written as they are: no copy of a contiguous array, no pickle)."""
    tensors, payload = [], []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        tensors.append([name, a.dtype.str, list(a.shape)])
        if a.nbytes:
            payload.append(a.reshape(-1).view(np.uint8).data)
    return {"op": op, "tensors": tensors}, payload


def unpack(tensors: list[Any], data: bytes) -> dict[str, np.ndarray]:
    """`pack`'s arrays back from a frame (views of its payload, no copy)."""
    out, at = {}, 0
    for name, dtype, shape in tensors:
        dt = np.dtype(dtype)
        n = math.prod(shape)
        out[name] = np.frombuffer(data, dt, n, at).reshape(shape)
        at += n * dt.itemsize
    if at != len(data):
        raise ValueError(f"a frame of {len(data)} bytes carries tensors of {at}")
    return out


def write_frame(f: Any, head: dict[str, Any], payload: bytes | list[Any] = b"") -> None:
    parts = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
    raw = json.dumps(head).encode()
    f.write(struct.pack("<I", len(raw)) + raw + struct.pack("<Q", sum(memoryview(p).nbytes for p in parts)))
    for p in parts:
        f.write(p)
    f.flush()


def _read_exact(f: Any, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError("predictor pipe closed")
    return data


def read_frame(f: Any) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<I", _read_exact(f, 4))
    head = json.loads(_read_exact(f, n))
    (m,) = struct.unpack("<Q", _read_exact(f, 8))
    return head, _read_exact(f, m) if m else b""


def load_engine(spec: Spec, engine: str, threads: int, cache_capacity: int = 0, device: str = "cpu") -> Any:
    """The package's model on `engine` (`pipeline/engines/`) on `device`, its io names checked against
    serving.yaml (`engines.names`: every input and output found). A GPU device is the same code path; no
    machine of ours has run it."""
    if spec.precision == "bf16" and runtime.bf16_unsupported():
        raise InputError(f"{spec.dir}: a bf16 package, but {runtime.bf16_unsupported()}; package the "
                         "model with --precision fp32")
    extra = {}
    if engine == "paddle_inference" or (engine == "openvino" and tasks.dynamic(spec.task)):
        # oneDNN's (and OpenVINO's) kernels per input shape, capped: a task whose shapes come from the data (a
        # page's size) otherwise grows the cache with every new shape (pipeline/engines/openvino.py)
        extra = {"cache_capacity": cache_capacity}
    try:
        eng = engines.ENGINES[engine].load(list(spec.files), threads=threads, precision=spec.precision,
                                           device=device, **extra)
    except InputError:
        raise
    except PipeError as e:  # the engine's C++ error: one line, naming the file
        raise PipeError(f"{spec.files[0]}: {engine} cannot load it ({str(e)[-200:]})") from None
    engines.names(eng, spec.io, str(spec.files[0]))  # every tensor of serving.yaml, or one line naming it
    return eng


def _create_predictor(doc: dict[str, Any]) -> tuple[Any, Spec]:
    """The package's model on the doc's engine, one oneDNN kernel set per bucket (module docstring)."""
    from pipeline.serving.spec import load_package

    spec = load_package(Path(doc["package"]))
    eng = load_engine(spec, doc["engine"], doc["threads"], cache_capacity=len(doc["buckets"]) * len(doc["warm"]),
                      device=doc["device"])
    return eng, spec


def _predictor_main(doc: dict[str, Any]) -> int:
    """Child: load the predictor, then answer frames until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # [signal] a terminal's Ctrl-C reaches the whole group:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent drains first, then closes our stdin
    channel = os.fdopen(os.dup(1), "wb")  # stdout carries frames; anything printed goes to stderr
    os.dup2(2, 1)
    source = sys.stdin.buffer
    try:
        if doc["engine"] == "paddle_inference":
            runtime.import_paddle(doc["threads"])
        eng, spec = _create_predictor(doc)
        io_ = spec.io
        on = engines.names(eng, io_, str(spec.files[0]))  # program name -> the engine's, inputs and outputs
    except PipeError as e:
        write_frame(channel, {"ok": False, "error": str(e), "input_error": isinstance(e, InputError)})
        return 2
    fetch = [(t.name, on[t.name]) for t in io_.outputs]
    pauses = gcpause.Pauses()

    infer = bucketed(eng, on, fetch, doc["buckets"])

    write_frame(channel, {"ok": True, "engine": eng.describe()})
    while True:
        try:
            head, payload = read_frame(source)
        except EOFError:
            return 0
        try:
            if head["op"] == "warm":
                # oneDNN builds its kernels per input shape on first sight: pay it before /readyz.
                warm(infer, doc)
                gcpause.settle()  # loaded and warm: nothing of start-up is walked by a collection again
                write_frame(channel, {"ok": True})
            else:
                head, data = pack("ok", infer(unpack(head["tensors"], payload)))
                write_frame(channel, {**head, "ok": True, "gc": pauses.snapshot()}, data)
        except Exception as e:  # reported to the parent as this batch's failure; the child keeps serving
            write_frame(channel, {"ok": False, "error": f"{e.__class__.__name__}: {str(e)[:300]}"})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--predictor":
        sys.exit(_predictor_main(json.loads(sys.argv[2])))
    print("usage: python -m pipeline.serving.predictor --predictor SPEC_JSON (internal; use `pipe serve`)",
          file=sys.stderr)
    sys.exit(2)
