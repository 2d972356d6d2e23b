"""pipeline/nets/program_layer.py on the real PP-OCRv4 recognizer: the exported program run op by op as a dygraph layer
matches Paddle Inference on the same program, every weight gets a gradient, and the weights go back into a params
file Paddle Inference loads (byte for byte the source when nothing changed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import runtime
from pipeline.engines import paddle as paddle_engine
from pipeline.errors import InputError
from pipeline.nets import paddle_program, program_layer


pytestmark = pytest.mark.slow(reason="runs the real PP-OCRv4 recognizer's program")


@pytest.fixture(scope="module")
def prefix(rec_src) -> Path:
    return rec_src / "inference"


@pytest.fixture(scope="module")
def lines() -> np.ndarray:
    """Two line-shaped inputs at PaddleOCR's width 320 (the values only need to exercise every op)."""
    return np.random.default_rng(0).uniform(-1, 1, (2, 3, 48, 320)).astype(np.float32)


def _inference(prefix: Path, x: np.ndarray, program: str = ".pdmodel") -> np.ndarray:
    eng = paddle_engine.load([prefix.with_suffix(program), prefix.with_suffix(".pdiparams")], threads=1)
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


# ------------------------------------------------------------------ a PIR program (PaddleOCR 3.x's inference.json)


def test_a_pir_program_is_the_same_trainable_layer(rec_pir_src, prefix, lines):
    """PP-OCRv4 rec as PaddleOCR 3.x ships its models (inference.json, read with json.loads): Paddle Inference's
    output on that program, the legacy layer's output to the bit, the same parameters by name, and a gradient in
    every weight."""
    paddle = runtime.import_paddle(1)
    pir = program_layer.build(paddle, rec_pir_src / "inference")
    legacy = program_layer.build(paddle, prefix)
    assert pir.feeds == legacy.feeds == ["x"]
    assert sorted(pir.state_dict()) == sorted(legacy.state_dict())
    assert len(pir.parameters()) == 222 and len(pir.buffers()) == 12
    pir.eval()
    legacy.eval()
    with paddle.no_grad():
        got = pir(paddle.to_tensor(lines)).numpy()
        same = legacy(paddle.to_tensor(lines)).numpy()
    ref = _inference(rec_pir_src / "inference", lines, ".json")
    assert got.shape == ref.shape == (2, 40, 6625)
    assert np.abs(got - ref).max() < 1e-4  # measured 4.1e-6, as the legacy layer against its program
    assert (got == same).all()  # the same ops with the same kernels: PIR's bias reshape + add is legacy's axis add
    pir.train()
    pir(paddle.to_tensor(lines)).max(-1).mean().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in pir.parameters())


def test_pir_params_are_what_paddle_loads(rec_pir_src):
    """The params file's tensors, by name in the program's sorted order, equal to the bit what Paddle's own
    load_inference_model of the PIR program puts in its scope."""
    paddle = runtime.import_paddle(1)
    prog = paddle_program.Program(rec_pir_src / "inference.json", rec_pir_src / "inference.pdiparams")
    mine = program_layer.read_params(prog, paddle_program.read(prog))
    paddle.enable_static()
    try:
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope), paddle.pir_utils.IrGuard():
            paddle.static.load_inference_model(str(rec_pir_src / "inference"), paddle.static.Executor(paddle.CPUPlace()))
            theirs = {n: np.array(scope.find_var(n).get_tensor()) for n in scope.local_var_names()}
    finally:
        paddle.disable_static()
    assert set(theirs) == set(mine) and len(mine) == 234
    assert all(theirs[n].dtype == mine[n].dtype and (theirs[n] == mine[n]).all() for n in mine)


def test_a_pir_op_it_cannot_run_is_refused_in_one_line(rec_pir_src, tmp_path):
    paddle = runtime.import_paddle(1)
    src = tmp_path / "gelu"
    src.mkdir()
    shutil.copyfile(rec_pir_src / "inference.pdiparams", src / "inference.pdiparams")
    text = (rec_pir_src / "inference.json").read_text()
    assert text.count('"#":"1.swish"') + text.count('"#": "1.swish"') > 0
    (src / "inference.json").write_text(text.replace('"1.swish"', '"1.gelu"'))  # a program using an op not covered
    with pytest.raises(InputError, match=r"^\S+inference.json: pipe train cannot run op\(s\) pd_op.gelu of this program "
                                         r"\(it runs \d+ pd_op types: pipeline/nets/program_layer.py\)$"):
        program_layer.build(paddle, src / "inference")


@pytest.mark.parametrize("case", ["truncated", "flipped", "missing"])
def test_a_bad_pir_params_file_is_refused_in_one_line(case, rec_pir_src, tmp_path):
    paddle = runtime.import_paddle(1)
    src = tmp_path / case
    src.mkdir()
    shutil.copyfile(rec_pir_src / "inference.json", src / "inference.json")
    data = (rec_pir_src / "inference.pdiparams").read_bytes()
    if case == "truncated":
        (src / "inference.pdiparams").write_bytes(data[:-100])
    elif case == "flipped":  # a byte of the first tensor's header: its dtype no longer reads as the program's
        (src / "inference.pdiparams").write_bytes(data[:20] + bytes([data[20] ^ 0xFF]) + data[21:])
    with pytest.raises(InputError) as e:
        program_layer.build(paddle, src / "inference")
    msg = str(e.value)
    assert msg.startswith(str(src / "inference.pdiparams")) and "\n" not in msg, msg


def test_the_other_pir_models_run_or_are_refused_by_name(cls_src, det_src, tmp_path):
    """PP-OCR's text-line classifier translated to PIR runs as a layer within Paddle Inference's noise; the
    detector is refused naming the two ops this does not run (its upsampling as tile, its transposed convs)."""
    paddle = runtime.import_paddle(1)
    for src, name in ((cls_src, "cls"), (det_src, "det")):
        (tmp_path / name).mkdir()
        paddle_program.translate_to_pir(paddle, src / "inference", tmp_path / name / "inference")
    x = np.random.default_rng(0).uniform(-1, 1, (3, 3, 48, 192)).astype(np.float32)
    layer = program_layer.build(paddle, tmp_path / "cls" / "inference")
    layer.eval()
    with paddle.no_grad():
        got = layer(paddle.to_tensor(x)).numpy()
    ref = _inference(tmp_path / "cls" / "inference", x, ".json")
    assert got.shape == ref.shape == (3, 2) and np.abs(got - ref).max() < 1e-4  # measured 8.3e-7
    with pytest.raises(InputError, match=r"det/inference.json: pipe train cannot run op\(s\) pd_op.conv2d_transpose, "
                                         r"pd_op.tile of this program"):
        program_layer.build(paddle, tmp_path / "det" / "inference")


def test_trainable_tensors_come_in_program_order_and_l2sp_pulls_them_back(prefix, lines):
    """finetune.freeze_early counts from the program's first reads (the backbone's stem first, the CTC head's weight
    last); finetune.l2sp's penalty is alpha/2 ||w - w0||^2 and its gradient alpha (w - w0)."""
    from pipeline.trainer import l2sp_penalty

    paddle = runtime.import_paddle(1)
    layer = program_layer.build(paddle, prefix)
    order = layer.trainable_in_order()
    assert len(order) == 222 and {id(p) for p in order} == {id(p) for p in layer.parameters()}
    first_conv = next(op for op in layer.ops if op.type in ("conv2d", "depthwise_conv2d"))
    assert order[0] is getattr(layer, program_layer.key(first_conv.ins["Filter"][0]))
    assert [tuple(p.shape) for p in order[-2:]] == [(120, 6625), (6625,)]  # the CTC head's weight and bias last
    w = order[-2:]
    anchors = [(p, p.detach().clone()) for p in w]
    assert float(l2sp_penalty(paddle, anchors, 3.0)) == 0.0  # at the pretrained weights: nothing to pull
    with paddle.no_grad():
        for p in w:
            p.set_value(p + 0.5)
    pen = l2sp_penalty(paddle, anchors, 3.0)
    n = sum(int(np.prod(p.shape)) for p in w)
    assert abs(float(pen) - 3.0 / 2 * 0.25 * n) < 1e-3 * n
    pen.backward()
    assert all(np.allclose(p.grad.numpy(), 3.0 * 0.5) for p in w)
