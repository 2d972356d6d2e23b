"""The engine contract by name on a real two-input, two-output Paddle model (img [N,1,8,8] + feat [N,4] ->
logits [N,3], embedding [N,5]): the PIR program, the legacy program (exported in a FLAGS_enable_pir_api=0
child), and paddle2onnx of each, on Paddle Inference, onnxruntime and OpenVINO. Every output, fetched by
name, equals dygraph; the inputs go in reversed dict order, and the files that list them reversed (ONNX of
the legacy program, OpenVINO reading the legacy .pdmodel: facts note section 14) answer right. A missing or
unknown feed name is one line naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import engines, iospec
from pipeline.errors import InputError, PipeError

REPO = Path(__file__).resolve().parents[1]
SPECS = (("img", [None, 1, 8, 8]), ("feat", [None, 4]))  # InputSpec order
INTERFACE = {  # as export records it: the PIR program's names, the public ones as aliases
    "inputs": [{"name": "img", "dtype": "float32", "shape": [-1, 1, 8, 8]},
               {"name": "feat", "dtype": "float32", "shape": [-1, 4]}],
    "outputs": [{"name": "fetch_name_0", "dtype": "float32", "shape": [-1, 3], "alias": "logits"},
                {"name": "fetch_name_1", "dtype": "float32", "shape": [-1, 5], "alias": "embedding"}]}
# (engine, program, files): every file each engine reads; `reversed`: it lists the inputs feat, img.
CASES = [("paddle_inference", "pir", ("pir/model.json", "pir/model.pdiparams"), False),
         ("paddle_inference", "legacy", ("legacy/model.pdmodel", "legacy/model.pdiparams"), False),
         ("onnxruntime", "pir", ("pir/model.onnx",), False),
         ("onnxruntime", "legacy", ("legacy/model.onnx",), True),
         ("openvino", "pir", ("pir/model.onnx",), False),
         ("openvino", "legacy", ("legacy/model.onnx",), True),
         ("openvino", "legacy", ("legacy/model.pdmodel", "legacy/model.pdiparams"), True)]
IDS = [f"{e}-{p}-{Path(f[0]).suffix[1:]}" for e, p, f, _ in CASES]


def _net(paddle):
    class TwoInTwoOut(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(1, 2, 3, padding=1)
            self.img = paddle.nn.Linear(2 * 8 * 8, 6)
            self.feat = paddle.nn.Linear(4, 6)
            self.head = paddle.nn.Linear(6, 3)
            self.emb = paddle.nn.Linear(6, 5)

        def forward(self, img, feat):  # relu, not tanh: 3.3.1's tanh has no legacy branch (facts note section 14)
            h = paddle.nn.functional.relu(self.img(paddle.flatten(self.conv(img), 1)) + self.feat(feat))
            return self.head(h), self.emb(h)  # a tuple keeps its order: fetch_name_0 = logits

    return TwoInTwoOut()


def _save(paddle, net, prefix: Path) -> None:
    specs = [paddle.static.InputSpec(shape, "float32", name) for name, shape in SPECS]
    paddle.jit.save(paddle.jit.to_static(net, input_spec=specs, full_graph=True), str(prefix))


def _legacy_main(weights: str, prefix: str) -> None:
    """Child (FLAGS_enable_pir_api=0 before paddle is imported): the same weights as a legacy program."""
    from pipeline import runtime

    paddle = runtime.import_paddle(1)
    net = _net(paddle)
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in np.load(weights).items()})
    net.eval()
    _save(paddle, net, Path(prefix))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(dir with pir/ and legacy/ programs and their ONNX, the inputs, dygraph's outputs by public name)."""
    from pipeline import runtime, triton_repo

    root = tmp_path_factory.mktemp("named")
    paddle = runtime.import_paddle(1)
    paddle.seed(0)
    net = _net(paddle)
    net.eval()
    rng = np.random.RandomState(0)
    feeds = {"img": rng.standard_normal((3, 1, 8, 8)).astype(np.float32),
             "feat": rng.standard_normal((3, 4)).astype(np.float32)}
    with paddle.no_grad():  # before to_static, which converts `forward` in place
        logits, emb = net(paddle.to_tensor(feeds["img"]), paddle.to_tensor(feeds["feat"]))
    ref = {"logits": logits.numpy(), "embedding": emb.numpy()}
    np.savez(root / "weights.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
    _save(paddle, net, root / "pir/model")
    code = f"from tests.test_engines_named import _legacy_main; _legacy_main({str(root / 'weights.npz')!r}, " \
           f"{str(root / 'legacy/model')!r})"
    env = dict(os.environ, FLAGS_enable_pir_api="0", GLOG_minloglevel="2", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and (root / "legacy/model.pdmodel").is_file(), proc.stderr[-2000:]
    for d, program in (("pir", "model.json"), ("legacy", "model.pdmodel")):
        triton_repo.paddle2onnx(root / d / program, root / d / "model.pdiparams", root / d / "model.onnx", 1)
    return root, feeds, ref


def _load(engine: str, root: Path, files: tuple[str, ...]):
    if engine == "openvino" and engines.missing("openvino"):
        pytest.skip(engines.missing("openvino"))
    return engines.ENGINES[engine].load([root / f for f in files], threads=1)


@pytest.mark.parametrize("engine,program,files,rev", CASES, ids=IDS)
def test_every_output_by_name_equals_dygraph(model, engine, program, files, rev):
    root, feeds, ref = model
    eng = _load(engine, root, files)
    assert eng.inputs == (["feat", "img"] if rev else ["img", "feat"])  # the trap is there, in its own order
    if program == "pir" or files[0].endswith(".onnx"):  # paddle2onnx names both programs' outputs so too
        assert eng.outputs == ["fetch_name_0", "fetch_name_1"]
    else:  # the legacy program names them after their ops: the interface's map by position (`engines.names`)
        assert not set(eng.outputs) & {"fetch_name_0", "fetch_name_1"}, eng.outputs
    on = engines.names(eng, iospec.IO.from_interface(INTERFACE), str(files[0]))
    got = eng.run({on["feat"]: feeds["feat"], on["img"]: feeds["img"]})  # reversed: the spec says img, feat
    assert list(got) == eng.outputs  # every output, keyed by its name
    for public, want in ref.items():
        y = got[on[public]]
        assert y.shape == want.shape and y.dtype == np.float32, (public, y.shape)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max(), (public, np.abs(y - want).max())
    assert {"engine", "version", "precision", "threads", "device", "files"} <= set(eng.describe())


@pytest.mark.parametrize("engine,program,files,rev", CASES, ids=IDS)
def test_a_missing_or_unknown_feed_is_one_line_naming_it(model, engine, program, files, rev):
    root, feeds, _ = model
    eng = _load(engine, root, files)
    cases = [({"img": feeds["img"]}, "missing input 'feat'"),
             ({**feeds, "image": feeds["img"]}, "unknown input 'image'"),
             ({"image": feeds["img"], "feat": feeds["feat"]}, "unknown input 'image'")]
    for bad, needle in cases:
        with pytest.raises(PipeError) as e:
            eng.run(bad)
        msg = str(e.value)
        assert needle in msg and "\n" not in msg and Path(files[0]).name in msg, msg
        assert "the model takes 'feat', 'img'" in msg if rev else "the model takes 'img', 'feat'" in msg
    with pytest.raises(PipeError, match="run\\(\\) takes a dict of input name -> array, got ndarray"):
        eng.run(feeds["img"])  # the old positional call


def test_names_refuses_an_interface_the_file_does_not_have(model):
    root, _, _ = model
    eng = _load("onnxruntime", root, ("legacy/model.onnx",))
    other = {**INTERFACE, "inputs": [INTERFACE["inputs"][0], {**INTERFACE["inputs"][1], "name": "side"}]}
    with pytest.raises(InputError, match=r"model.onnx: input 'side' is not among the engine's inputs \('feat', 'img'\)"):
        engines.names(eng, iospec.IO.from_interface(other), "model.onnx")
    one = {**INTERFACE, "outputs": [{**INTERFACE["outputs"][0], "name": "linear_9.tmp_1"}]}
    with pytest.raises(InputError, match="the engine has 2 outputs .* the interface 1 \\('logits'\\)"):
        engines.names(eng, iospec.IO.from_interface(one), "model.onnx")
