"""Paddle Inference on the CPU with oneDNN: fp32 and bf16 on the PIR program, int8 on PaddleSlim's
legacy program (oneDNN int8 kernels; without `enable_onednn_int8` the quantized program runs its
fake-quant ops, slower than fp32).

int8 on a CPU without VNNI: oneDNN's `fc`/matmul int8 kernels saturate int16 there (`pipeline/cpu.py`),
so the matmul family is left out of the int8 op set and runs in fp32; `describe()` says which set ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline import cpu, runtime
from pipeline.engines import feeds as feeds_mod
from pipeline.errors import InputError, PipeError

NAME = "paddle_inference"


@dataclass
class Engine:
    predictor: Any
    info: dict[str, Any]
    inputs: list[str] = field(default_factory=list)  # the program's names, in its order
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inputs = list(self.predictor.get_input_names())
        self.outputs = list(self.predictor.get_output_names())
        self._in = {n: self.predictor.get_input_handle(n) for n in self.inputs}
        self._out = {n: self.predictor.get_output_handle(n) for n in self.outputs}
        self._names = frozenset(self.inputs)
        self._where = f"{self.info['files'][0]}: {NAME}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every input by name -> every output by name."""
        feeds_mod.check(feeds, self._names, self.inputs, self._where)
        for name, handle in self._in.items():
            handle.copy_from_cpu(np.ascontiguousarray(feeds[name]))
        self.predictor.run()
        return {name: handle.copy_to_cpu() for name, handle in self._out.items()}

    def describe(self) -> dict[str, Any]:
        return dict(self.info)


def load(files: list[Path], *, threads: int, precision: str = "fp32", cache_capacity: int = 0,
         device: str = "cpu", int8_ops: set[str] | None = None) -> Engine:
    """`files` = [program (model.json | model.pdmodel), params]. `cache_capacity` > 0 caps oneDNN's
    per-shape kernel cache (the server's one set per batch bucket). `int8_ops`: the oneDNN int8 op set
    (empty = all); None = this CPU's (`cpu.onednn_int8_ops`). device: cpu, or gpu[:N] (CUDA, fp32/fp16: the same
    code path, never run here)."""
    gpu = runtime.device_index(device, "--device")
    program, params = (Path(f) for f in files)
    paddle = runtime.import_paddle(threads)
    c = paddle.inference.Config(str(program), str(params))
    info: dict[str, Any] = {"engine": NAME, "version": paddle.__version__, "precision": precision,
                            "threads": threads, "device": device, "files": [program.name, params.name]}
    if gpu is not None:  # written as the CPU path is; not run here (no machine of ours has a GPU)
        if gpu >= runtime.gpu_count(paddle):
            raise InputError(f"--device {device}: Paddle Inference: this paddle build sees {runtime.gpu_count(paddle)} "
                            "CUDA device(s) (the CPU build sees none; install paddlepaddle-gpu)")
        if precision not in ("fp32", "fp16"):
            raise InputError(f"--device {device}: Paddle Inference: precision {precision!r} is not built here (fp32, fp16)")
        half = paddle.inference.PrecisionType.Half if precision == "fp16" else paddle.inference.PrecisionType.Float32
        c.enable_use_gpu(256, gpu, half)
    else:
        _onednn(c, precision, int8_ops, info)
        if f64_interp_scales(program):
            # Paddle 3.3.1's oneDNN executor cannot take an interpolation's float64 `scale` array ("Convert
            # PirAttribute2RuntimeAttribute not support [pir::ArrayAttribute<pir::DoubleAttribute>]": open bug
            # PaddlePaddle/Paddle#79749, PaddleOCR#17869; facts §16), which PIR requires of it (float32 fails
            # its verifier): such a program (a PIR source imported as given; import's own translation writes
            # whole-factor upsamplings as tiles, paddle_program.py) runs without oneDNN's op placement, correct
            # but ~2x slower (PP-OCRv4 det on 30 pages of ~800 x 700: 514-581 ms/page, tiled 264)
            c.delete_pass("onednn_placement_pass")
            info["onednn_placement"] = "off: the program's interpolations hold float64 scales"
    c.set_cpu_math_library_num_threads(threads)
    if cache_capacity and gpu is None:
        c.set_onednn_cache_capacity(cache_capacity)
    c.disable_glog_info()
    with quiet_fd2(f"{program}: Paddle Inference predictor"):  # the int8/bf16 passes print past glog, on fd 2
        pred = paddle.inference.create_predictor(c)
    return Engine(pred, info)


def f64_interp_scales(program: Path) -> bool:
    """Whether a PIR program has an interpolation op (nearest_interp, bilinear_interp, ...) with a float64
    `scale` entry: what a legacy program with one translates to (PP-OCRv4's detector's FPN upsampling)."""
    if program.suffix != ".json":
        return False
    raw = program.read_bytes()
    if b'_interp"' not in raw:  # most programs: no need to parse
        return False
    from pipeline.nets import paddle_program

    return bool(paddle_program.f64_interp_scales(json.loads(raw)))


def _onednn(c: Any, precision: str, int8_ops: set[str] | None, info: dict[str, Any]) -> None:
    """The CPU path: oneDNN kernels at `precision` (int8 on this CPU's op set, see the module docstring)."""
    c.enable_onednn()
    if precision == "int8":
        ops = cpu.onednn_int8_ops() if int8_ops is None else set(int8_ops)
        c.enable_onednn_int8(ops)
        info["onednn_int8_ops"] = sorted(ops) or "all"
        if ops:
            info["note"] = ("no exact oneDNN int8 matmul here (no VNNI): fc/matmul run in fp32, the other "
                            "quantized ops in int8")
    elif precision == "bf16":
        c.enable_onednn_bfloat16()
    elif precision != "fp32":
        raise PipeError(f"Paddle Inference precision {precision!r}: expected fp32, bf16 or int8")


@contextlib.contextmanager
def quiet_fd2(what: str) -> Iterator[None]:
    """fd 2 goes to a scratch file meanwhile; on an error, its last line joins the one-line message."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except Exception as e:
            sink.seek(0)
            said = [ln for ln in sink.read().decode(errors="replace").splitlines() if ln.strip()]
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
            # Paddle's enforce messages end with a "[Hint: ...]" line; the "(InvalidArgument) ..." line says more
            last = next((ln for ln in lines if ln.startswith("(") and ") " in ln[:40]), lines[-1])
            raise PipeError(f"{what} failed: {e.__class__.__name__}: {last}"
                            + (f" ({said[-1]})" if said else "")) from e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
