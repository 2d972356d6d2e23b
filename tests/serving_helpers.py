"""Helpers for the package and serve tests: one packaged digits run and one packaged tiny text run per
session, real `pipe serve` processes on a free port on 127.0.0.1 (started and stopped by the test that
uses them), and the protobuf schemas the package files are checked against."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import numpy as np

from pipeline.cli import main
from tests.conftest import reviews

REPO = Path(__file__).resolve().parent.parent
_BUILT: dict[str, Path] = {}


def png_b64(image: np.ndarray) -> str:
    """An RGB uint8 [H, W, 3] image as a base64 PNG, what /v1's "images" take."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def exported_run(trained_digits: Path, tmp_root: Path) -> Path:
    """A copy of the shared digits run with `export/` added (built once per session)."""
    if "export" not in _BUILT:
        run = tmp_root / "run"
        shutil.copytree(trained_digits, run)
        assert main(["export", str(run / "train")]) == 0
        _BUILT["export"] = run
    return _BUILT["export"]


def packaged_run(trained_digits: Path, tmp_root: Path) -> Path:
    """The exported run with `package/` (fp32, Triton repository included), built once per session."""
    run = exported_run(trained_digits, tmp_root)
    if "package" not in _BUILT:
        assert main(["package", str(run / "export"), "--engine", "paddle"]) == 0  # Paddle's predictor is compared
        _BUILT["package"] = run
    return run



def packaged_text_run(tmp_root: Path) -> Path:
    """A tiny text_cnn run (1 epoch, max_len 24) trained, exported and packaged once per session."""
    if "text" not in _BUILT:
        run = tmp_root / "text-run"
        src = reviews(tmp_root / "reviews.jsonl")
        assert main(["train", "--data", str(src), "--model", "text_cnn", "--run", str(run), "--epochs", "1",
                     "--batch-size", "32", "--set", "data.max_len=24", "--set", "data.min_count=1"]) == 0
        assert main(["export", str(run / "train")]) == 0
        assert main(["package", str(run / "export"), "--engine", "paddle"]) == 0
        _BUILT["text"] = run
    return _BUILT["text"]


def package_predictor(package: Path, dtype: type) -> Callable[[np.ndarray], np.ndarray]:
    """The package's program in a bare Paddle Inference predictor (1 thread): what served outputs must equal."""
    import paddle

    c = paddle.inference.Config(str(package / "model.json"), str(package / "model.pdiparams"))
    c.disable_glog_info()
    c.set_cpu_math_library_num_threads(1)
    pred = paddle.inference.create_predictor(c)

    def predict(x: np.ndarray) -> np.ndarray:
        pred.get_input_handle("x").copy_from_cpu(np.ascontiguousarray(x, dtype))
        pred.run()
        return pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()

    return predict


def client_config_class():
    """Paddle Serving's GeneralModelConfig (proto2) message, built here: serving_client_conf.prototxt
    is parsed against it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="t/general_model_config.proto",
                                            package="baidu.paddle_serving.configure", syntax="proto2")
    for var, kind in (("FeedVar", "feed_type"), ("FetchVar", "fetch_type")):
        m = fd.message_type.add(name=var)
        for name, num, typ, label in (("name", 1, F.TYPE_STRING, F.LABEL_OPTIONAL),
                                      ("alias_name", 2, F.TYPE_STRING, F.LABEL_OPTIONAL),
                                      ("is_lod_tensor", 3, F.TYPE_BOOL, F.LABEL_OPTIONAL),
                                      (kind, 4, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("shape", 5, F.TYPE_INT32, F.LABEL_REPEATED)):
            m.field.add(name=name, number=num, type=typ, label=label)
    g = fd.message_type.add(name="GeneralModelConfig")
    g.field.add(name="feed_var", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                type_name=".baidu.paddle_serving.configure.FeedVar")
    g.field.add(name="fetch_var", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                type_name=".baidu.paddle_serving.configure.FetchVar")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fd.SerializeToString())
    name = "baidu.paddle_serving.configure.GeneralModelConfig"
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def triton_model_config_class():
    """Triton's ModelConfig message, from tritonclient's generated modules (the grpc extra, a dependency of
    `pipe serve --grpc-port`)."""
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelConfig


@dataclass
class Server:
    """A `pipe serve` child process; `url` is http://127.0.0.1:PORT."""

    proc: subprocess.Popen
    url: str = ""
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"pipe serve did not exit within {timeout} s of signal {sig}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _pump(stream, sink: list[str], lines: "queue.Queue[str] | None") -> None:
    for line in stream:
        sink.append(line)
        if lines is not None:
            lines.put(line)


def start_server(package: Path, *flags: str, env: dict[str, str] | None = None, ready: bool = True,
                 timeout: float = 90.0) -> Server:
    """Start `pipe serve PACKAGE --port 0 FLAGS` and wait for its URL (and for /readyz 200 if `ready`)."""
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **(env or {})})
    srv = Server(proc)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, srv.out, lines), daemon=True).start()
    threading.Thread(target=_pump, args=(proc.stderr, srv.err, None), daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        while not srv.url:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None:
                    raise AssertionError(f"pipe serve exited {proc.returncode}: {''.join(srv.err)[-2000:]}") from None
                if time.monotonic() > deadline:
                    raise AssertionError("pipe serve printed no URL in time") from None
                continue
            if "listening on http://" in line:
                srv.url = line.rsplit(" ", 1)[-1].strip()
        assert srv.url.startswith("http://127.0.0.") or srv.url.startswith("http://[::1]"), srv.url
        wait_for(srv, "/readyz" if ready else "/livez", deadline)
    except BaseException:
        srv.kill()
        raise
    return srv


def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll `cond` every 20 ms until it holds; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def wait_for(srv: Server, path: str, deadline: float) -> None:
    with httpx.Client(timeout=5) as c:
        while True:
            try:
                if c.get(srv.url + path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if srv.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{path} never answered 200: {''.join(srv.err)[-2000:]}")
            time.sleep(0.05)


def metric(text: str, name: str, missing: float | None = None) -> float:
    """The value of one sample (`name` or `name{labels}`), or the sum over a name's label sets, in
    Prometheus text; `missing` is returned for a sample not (yet) exported."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == name or key.startswith(name + "{"):
            total += float(value)
            seen = True
    if not seen and missing is not None:
        return missing
    assert seen, f"no metric {name}"
    return total


def serving_client_python() -> Path | None:
    """A Python 3.9 interpreter with paddle-serving-client==0.9.0: $PIPE_SERVING_CLIENT_PYTHON, or the
    repo's .venv39 (which `make test` creates where python3.9 exists)."""
    for cand in (os.environ.get("PIPE_SERVING_CLIENT_PYTHON", ""), str(REPO / ".venv39/bin/python")):
        if cand and Path(cand).is_file():
            probe = subprocess.run([cand, "-c", "import paddle_serving_client.httpclient"], capture_output=True,
                                   timeout=60, check=False)
            if probe.returncode == 0:
                return Path(cand)
    return None
