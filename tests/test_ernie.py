"""ernie_tiny (pipeline/nets/ernie.py): two named int64 inputs through every export route, by name.

A randomly initialised instance of the shipped size and a small one trained for a few steps on a rule
that needs both inputs: dygraph shapes and padding invariance; the PIR program (dynamic batch and
sequence length) in Paddle Inference with oneDNN; the legacy program written in a FLAGS_enable_pir_api=0
child (as stages/export.py's `_export_legacy`: the child re-imports the model by module path and loads
the safetensors weights) in Paddle Inference; paddle2onnx (opset 13) of the PIR program in onnxruntime.
Every engine is fed by name, at two sequence lengths.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.nets import ernie
from pipeline.runtime import import_paddle

REPO = Path(__file__).resolve().parent.parent
TOL = 1e-5  # max|diff| <= TOL * max|logit|
LENGTHS = (24, 9)  # two sequence lengths fed to one dynamic program
# the shipped size at a small vocabulary, and a smaller one that gets trained
SIZES = {"random": dict(vocab_size=300, num_classes=2, max_len=32),
         "trained": dict(vocab_size=40, num_classes=3, max_len=32, hidden=32, heads=2)}
MARK = 7  # ids 7, 8, 9 mark the classes (see _batch)

# The legacy child: paddle imported with PIR off, the model rebuilt from its module path (as
# stages/export.py's `_legacy_main` rebuilds it through pipeline.nets.models).
_CHILD = """
import importlib, json, sys
from pathlib import Path
from pipeline import runtime
spec = json.loads(sys.argv[1])
paddle = runtime.import_paddle(1)
mod_name, _, fn = spec["factory"].partition(":")
mod = importlib.import_module(mod_name)
net = getattr(mod, fn)(**spec["kwargs"])
net.set_state_dict(runtime.load_safetensors(paddle, spec["weights"]))
net.eval()
static = paddle.jit.to_static(net, input_spec=mod.input_specs(paddle), full_graph=True)
paddle.jit.save(static, spec["prefix"])
Path(spec["prefix"] + ".pdiparams.info").unlink(missing_ok=True)
"""


def _batch(rng: np.random.RandomState, n: int, length: int, vocab: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Two segments (token type 1 from a random cut on), trailing padding, and a class c in {0, 1, 2} that
    needs the token types: marker MARK + c sits in segment 1, a decoy marker of another class in segment 0."""
    y = rng.randint(0, 3, n)
    ids = rng.randint(MARK + 3, vocab, (n, length)).astype(np.int64)
    types = np.zeros((n, length), np.int64)
    for i in range(n):
        end = rng.randint(length // 2, length + 1)
        cut = rng.randint(2, end - 1)
        types[i, cut:end] = 1
        ids[i, end:] = 0
        ids[i, rng.choice(cut, 1 + (rng.rand() < 0.5))] = MARK + (y[i] + rng.randint(1, 3)) % 3
        ids[i, cut + rng.choice(end - cut, 1)] = MARK + y[i]
    return {"input_ids": ids, "token_type_ids": types}, y.astype(np.int64)


def _logits(paddle, net, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with paddle.no_grad():
        return net(**{k: paddle.to_tensor(v) for k, v in feeds.items()}).numpy()


def _close(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    diff = float(np.abs(got.astype(np.float64) - ref).max())
    assert diff <= TOL * float(np.abs(ref).max()), (diff, float(np.abs(ref).max()))
    return diff


@pytest.fixture(scope="module")
def paddle():
    return import_paddle(1)


@functools.lru_cache(maxsize=None)
def _instance(name: str):
    """The eval-mode net: `random` as built, `trained` after 150 seeded AdamW steps on `_batch`."""
    paddle = import_paddle(1)
    kwargs = SIZES[name]
    paddle.seed(0)
    net = ernie.build_ernie_tiny(**kwargs)
    if name == "trained":
        rng = np.random.RandomState(0)
        opt = paddle.optimizer.AdamW(3e-3, parameters=net.parameters())
        net.train()
        for _ in range(150):
            feeds, y = _batch(rng, 32, 16, kwargs["vocab_size"])
            logits = net(**{k: paddle.to_tensor(v) for k, v in feeds.items()})
            loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(y))
            loss.backward()
            opt.step()
            opt.clear_grad()
    net.eval()
    return net


@pytest.fixture(scope="module", params=sorted(SIZES))
def model(request, paddle, tmp_path_factory):
    """(name, eval-mode net, kwargs, directory holding model.safetensors)."""
    net = _instance(request.param)
    d = tmp_path_factory.mktemp(f"ernie-{request.param}")
    paddle.save(net.state_dict(), str(d / "model.safetensors"), safetensors=True)
    return request.param, net, SIZES[request.param], d


@pytest.fixture(scope="module")
def feeds_at(model):
    """Test feeds per sequence length, and the dygraph logits for each."""
    name, net, kwargs, _ = model
    paddle = import_paddle(1)
    out = {}
    for length in LENGTHS:
        feeds, _ = _batch(np.random.RandomState(length), 5, length, kwargs["vocab_size"])
        out[length] = (feeds, _logits(paddle, net, feeds))
    return out


@pytest.fixture(scope="module")
def pir_dir(model, paddle):
    _, net, _, d = model
    static = paddle.jit.to_static(net, input_spec=ernie.input_specs(paddle), full_graph=True)
    paddle.jit.save(static, str(d / "pir" / "model"))
    return d / "pir"


def _predictor(paddle, model_file: Path, params: Path):
    c = paddle.inference.Config(str(model_file), str(params))
    c.enable_onednn()
    c.set_cpu_math_library_num_threads(1)
    c.disable_glog_info()
    return paddle.inference.create_predictor(c)


def _run_by_name(pred, feeds: dict[str, np.ndarray]) -> np.ndarray:
    assert sorted(pred.get_input_names()) == sorted(feeds)
    for name, a in feeds.items():
        pred.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(a))
    pred.run()
    (out,) = pred.get_output_names()
    return pred.get_output_handle(out).copy_to_cpu()


# ------------------------------------------------------------------ the model in dygraph


def test_text_feeds_is_the_two_input_text_rule():
    ids = np.array([[5, 3, 0, 0], [2, 0, 0, 0]], np.int32)
    feeds = ernie.text_feeds(ids)
    assert list(feeds) == list(ernie.INPUT_NAMES) == ["input_ids", "token_type_ids"]
    assert feeds["input_ids"].dtype == feeds["token_type_ids"].dtype == np.int64
    assert feeds["input_ids"].tolist() == ids.tolist() and not feeds["token_type_ids"].any()
    assert feeds["token_type_ids"].shape == (2, 4)
    assert ernie.interface_inputs() == [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]},
                                        {"name": "token_type_ids", "dtype": "int64", "shape": [-1, -1]}]
    with pytest.raises(InputError, match="expected ids of shape"):
        ernie.text_feeds(np.zeros(4, np.int64))


def test_importing_the_module_leaves_paddle_out():
    code = "import sys, pipeline.nets.ernie; assert 'paddle' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


def test_gelu_and_tanh_are_exact_forms(paddle):
    x = paddle.to_tensor(np.linspace(-12, 12, 4001, dtype=np.float32).reshape(1, -1))
    f = paddle.nn.functional
    assert float((ernie._gelu(paddle, x) - f.gelu(x)).abs().max()) < 2e-6
    assert float((ernie._tanh(paddle, x) - paddle.tanh(x)).abs().max()) < 5e-7


def test_shipped_size(paddle):
    """The defaults at the chinese_sentiment vocabulary (3,648 characters, max_len 160)."""
    net = ernie.build_ernie_tiny(3648, 2, 160)
    assert sum(int(np.prod(p.shape)) for p in net.parameters()) == 348_354
    with pytest.raises(InputError, match="not a multiple of heads"):
        ernie.build_ernie_tiny(10, 2, 8, hidden=30, heads=4)


def test_shapes_and_padding_invariance(model, paddle):
    name, net, kwargs, _ = model
    rng = np.random.RandomState(1)
    feeds, _ = _batch(rng, 6, 12, kwargs["vocab_size"])
    ref = _logits(paddle, net, feeds)
    assert ref.shape == (6, kwargs["num_classes"]) and ref.dtype == np.float32 and np.isfinite(ref).all()
    assert _logits(paddle, net, {k: v[:1] for k, v in feeds.items()}).shape == (1, kwargs["num_classes"])
    # appending [PAD] (id 0, token type 0) up to max_len changes no logit
    for extra in (1, kwargs["max_len"] - 12):
        padded = {k: np.pad(v, ((0, 0), (0, extra))) for k, v in feeds.items()}
        assert np.abs(_logits(paddle, net, padded) - ref).max() <= 1e-5
    # an all-padding row stays finite (the model's own [CLS] is never masked)
    empty = _logits(paddle, net, ernie.text_feeds(np.zeros((2, 5), np.int64)))
    assert np.isfinite(empty).all()


def test_the_trained_instance_uses_both_inputs(paddle):
    net, kwargs = _instance("trained"), SIZES["trained"]
    feeds, y = _batch(np.random.RandomState(2), 256, 16, kwargs["vocab_size"])
    acc = float((_logits(paddle, net, feeds).argmax(1) == y).mean())
    assert acc >= 0.9  # chance is 1/3, and 1/2 for a model that ignores the token types
    flipped = dict(feeds, token_type_ids=(1 - feeds["token_type_ids"]) * (feeds["input_ids"] != 0))
    assert float((_logits(paddle, net, flipped).argmax(1) == y).mean()) < acc - 0.2


# ------------------------------------------------------------------ programs, fed by name


def test_pir_program_in_paddle_inference(model, paddle, pir_dir, feeds_at):
    assert {p.name for p in pir_dir.iterdir()} == {"model.json", "model.pdiparams"}
    pred = _predictor(paddle, pir_dir / "model.json", pir_dir / "model.pdiparams")
    assert pred.get_input_names() == ["input_ids", "token_type_ids"]
    for length, (feeds, ref) in feeds_at.items():
        _close(_run_by_name(pred, feeds), ref)
        _close(_run_by_name(pred, dict(reversed(list(feeds.items())))), ref)  # the order of the feed dict is irrelevant


def test_legacy_program_in_paddle_inference(model, paddle, feeds_at):
    _, _, kwargs, d = model
    prefix = d / "legacy" / "model"
    spec = {"factory": "pipeline.nets.ernie:build_ernie_tiny", "kwargs": kwargs,
            "weights": str(d / "model.safetensors"), "prefix": str(prefix)}
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in prefix.parent.iterdir()} == {"model.pdmodel", "model.pdiparams"}
    pred = _predictor(paddle, prefix.with_suffix(".pdmodel"), prefix.with_suffix(".pdiparams"))
    assert sorted(pred.get_input_names()) == ["input_ids", "token_type_ids"]
    for length, (feeds, ref) in feeds_at.items():
        _close(_run_by_name(pred, feeds), ref)


def test_onnx_of_the_pir_program_in_onnxruntime(model, pir_dir, feeds_at):
    import onnxruntime as ort

    dest = pir_dir.parent / "model.onnx"
    code = ("import sys; from pipeline import runtime; runtime.import_paddle(1); import paddle2onnx; "
            "paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], opset_version=13, "
            "enable_onnx_checker=True, optimize_tool='none')")
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    # a child: paddle2onnx aborts the process on an op it cannot convert
    proc = subprocess.run([sys.executable, "-c", code, str(pir_dir / "model.json"), str(pir_dir / "model.pdiparams"),
                           str(dest)], capture_output=True, text=True, env=env, cwd=pir_dir.parent, timeout=300,
                          check=False)
    assert proc.returncode == 0 and dest.is_file(), proc.stderr[-2000:]
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    sess = ort.InferenceSession(str(dest), so, providers=["CPUExecutionProvider"])
    inputs = sess.get_inputs()
    assert [i.name for i in inputs] == ["input_ids", "token_type_ids"]
    for i in inputs:  # batch and sequence dims are symbolic
        assert i.type == "tensor(int64)" and len(i.shape) == 2 and not any(isinstance(s, int) for s in i.shape)
    (out,) = sess.get_outputs()
    for length, (feeds, ref) in feeds_at.items():
        _close(sess.run([out.name], feeds)[0], ref)
