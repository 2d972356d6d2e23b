"""pipeline/program_layer.py on the real PP-OCRv4 recognizer: the exported program run op by op as a dygraph layer
matches Paddle Inference on the same program, every weight gets a gradient, and the weights go back into a params
file Paddle Inference loads (byte for byte the source when nothing changed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import paddle_program, program_layer, runtime
from pipeline.engines import paddle as paddle_engine
from pipeline.errors import InputError


pytestmark = pytest.mark.slow(reason="runs the real PP-OCRv4 recognizer's program")


@pytest.fixture(scope="module")
def prefix(rec_src) -> Path:
    return rec_src / "inference"


@pytest.fixture(scope="module")
def lines() -> np.ndarray:
    """Two line-shaped inputs at PaddleOCR's width 320 (the values only need to exercise every op)."""
    return np.random.default_rng(0).uniform(-1, 1, (2, 3, 48, 320)).astype(np.float32)


def _inference(prefix: Path, x: np.ndarray) -> np.ndarray:
    eng = paddle_engine.load([prefix.with_suffix(".pdmodel"), prefix.with_suffix(".pdiparams")], threads=1)
    return eng.run({eng.inputs[0]: x})[eng.outputs[0]]


def test_the_layer_is_the_program_and_every_weight_learns(prefix, lines):
    paddle = runtime.import_paddle(1)
    layer = program_layer.build(paddle, prefix)
    assert len(layer.ops) == 321 and len(layer.parameters()) == 222  # 234 persistables: 12 are BN statistics
    assert len(layer.buffers()) == 12 and all(not p.stop_gradient for p in layer.parameters())
    layer.eval()
    with paddle.no_grad():
        got = layer(paddle.to_tensor(lines)).numpy()
    ref = _inference(prefix, lines)
    assert got.shape == ref.shape == (2, 40, 6625)
    assert np.abs(got - ref).max() < 1e-4  # measured 4.1e-6: other kernels, the same function
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    layer.train()
    layer(paddle.to_tensor(lines)).max(-1).mean().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in layer.parameters())
    bn = [b.numpy().copy() for b in layer.buffers()]
    layer(paddle.to_tensor(lines))  # a training-mode call moves no batch-norm statistic (frozen)
    assert all((a == b.numpy()).all() for a, b in zip(bn, layer.buffers()))


def test_weights_go_back_into_a_params_file_paddle_inference_runs(prefix, lines, tmp_path):
    paddle = runtime.import_paddle(1)
    prog = paddle_program.Program(prefix.with_suffix(".pdmodel"), prefix.with_suffix(".pdiparams"))
    io_ = paddle_program.read(prog)
    layer = program_layer.build(paddle, prefix)
    same = tmp_path / "same"
    same.mkdir()
    shutil.copyfile(prog.program, same / "inference.pdmodel")
    program_layer.write_params(prog.params, same / "inference.pdiparams", layer.values(), io_)
    assert (same / "inference.pdiparams").read_bytes() == prog.params.read_bytes()
    # one changed weight: the file still walks as the program's (paddle_program.check_params) and runs changed
    values = layer.values()
    head = next(n for n in layer.names if values[n].shape == (120, 6625))  # the CTC head's weight
    values[head] = values[head] * 0.5
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copyfile(prog.program, moved / "inference.pdmodel")
    program_layer.write_params(prog.params, moved / "inference.pdiparams", values, io_)
    paddle_program.check_params(paddle_program.Program(moved / "inference.pdmodel", moved / "inference.pdiparams"), io_)
    assert np.abs(_inference(moved / "inference", lines) - _inference(prefix, lines)).max() > 1e-3
    with pytest.raises(ValueError, match="shape"):
        program_layer.write_params(prog.params, tmp_path / "bad.pdiparams", {head: values[head][:10]}, io_)


def test_an_op_it_cannot_run_is_refused_in_one_line(prefix, tmp_path, monkeypatch):
    paddle = runtime.import_paddle(1)
    monkeypatch.delitem(program_layer._OPS, "layer_norm")  # as if the program used an op this does not know
    with pytest.raises(InputError, match=r"inference.pdmodel: pipe train cannot run op\(s\) layer_norm of this "
                                         r"program"):
        program_layer.build(paddle, prefix)
