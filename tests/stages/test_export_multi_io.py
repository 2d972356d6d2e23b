"""`pipe export` of a model with two named inputs and two outputs (examples/two_inputs.yaml): one named
InputSpec per input, every output named and parity-gated in Paddle Inference (PIR and legacy) and
onnxruntime, the names recorded being the programs' own, fed by name, and a parity failure naming the output."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import yaml

from pipeline import data as data_mod, iospec
from pipeline.cli import main
from pipeline.config import DataConfig
from tests.conftest import REPO

YAML = REPO / "examples" / "two_inputs.yaml"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A 3-epoch training of the example and its export with --onnx (module:factory resolved from the repo)."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(REPO))
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    run = tmp_path_factory.mktemp("multi-io") / "run"
    try:
        assert main(["train", "--config", str(YAML), "--run", str(run), "--epochs", "3"]) == 0
        assert main(["export", str(run / "train"), "--onnx"]) == 0
        yield run
    finally:
        mp.undo()


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _test_feeds(n: int = 32) -> tuple[dict[str, np.ndarray], np.ndarray]:
    import sys

    sys.path.insert(0, str(REPO))
    try:
        ds = data_mod.load(DataConfig(source="examples.two_inputs.data:load"))
    finally:
        sys.path.remove(str(REPO))
    return ds.test.feeds(np.arange(n), ds.preprocessing), np.asarray(ds.test.y[ds.test.idx[:n]])


def test_interface_names_and_parity_of_every_output(exported):
    m = _manifest(exported / "export")
    desc = iospec.IO.from_interface(m["interface"])
    assert [(t.name, t.public, t.dtype, t.shape) for t in desc.inputs] == [
        ("img", "img", "float32", (-1, 1, 8, 8)), ("feat", "feat", "float32", (-1, 4))]
    # a dict output: paddle.jit.save gives it in sorted key order, named fetch_name_<i>
    assert [(t.name, t.public, t.shape) for t in desc.outputs] == [
        ("fetch_name_0", "embedding", (-1, 16)), ("fetch_name_1", "logits", (-1, 4))]
    assert desc.logits().public == "logits"
    # the manifest leads with the model's own names; the program's stay as program_name (issue 51)
    assert [(o["name"], o.get("program_name")) for o in m["interface"]["outputs"]] == [
        ("embedding", "fetch_name_0"), ("logits", "fetch_name_1")]
    assert [i["name"] for i in m["interface"]["inputs"]] == ["img", "feat"]
    per = m["metrics"]["parity_outputs"]
    assert set(per) == {"embedding", "logits"}
    for name, p in per.items():
        assert p["max_abs"] > 0.5 and 0 <= p["max_abs_diff"] <= m["metrics"]["parity_tol"] * p["max_abs"], name
    assert m["metrics"]["parity_max_abs_diff"] == per["logits"]["max_abs_diff"]
    assert m["metrics"]["legacy_parity_max_abs_diff"] is not None and m["metrics"]["onnx_parity_max_abs_diff"] is not None
    assert m["legacy"]["inputs"] == ["img", "feat"] and len(m["legacy"]["outputs"]) == 2
    assert m["onnx"]["inputs"] == ["img", "feat"] and m["onnx"]["outputs"] == ["fetch_name_0", "fetch_name_1"]
    doc = yaml.safe_load((exported / "export" / "preprocess.yaml").read_text())
    assert [i["name"] for i in doc["inputs"]] == ["img", "feat"]
    assert [(o["name"], o["program_name"]) for o in doc["outputs"]] == [("embedding", "fetch_name_0"),
                                                                        ("logits", "fetch_name_1")]
    assert doc["kind"] == "inputs" and set(doc["per_input"]) == {"img", "feat"}


def test_each_program_fed_by_name_answers_as_the_manifest_says(exported):
    """Fresh predictors and an onnxruntime session on the committed files, inputs given in reversed order,
    outputs read by the recorded names: the logits give the export's accuracy, the three programs agree."""
    import onnxruntime as ort
    import paddle

    d, m = exported / "export", _manifest(exported / "export")
    feeds, y = _test_feeds()
    got = {}
    for key, model, params in (("pir", "model.json", "model.pdiparams"),
                               ("legacy", "legacy/model.pdmodel", "legacy/model.pdiparams")):
        c = paddle.inference.Config(str(d / model), str(d / params))
        c.disable_glog_info()
        pred = paddle.inference.create_predictor(c)
        names_out = m["legacy"]["outputs"] if key == "legacy" else [t["program_name"] for t in m["interface"]["outputs"]]
        assert sorted(pred.get_input_names()) == ["feat", "img"] and pred.get_output_names() == names_out
        for name in reversed(list(feeds)):
            pred.get_input_handle(name).copy_from_cpu(feeds[name])
        pred.run()
        got[key] = [pred.get_output_handle(n).copy_to_cpu() for n in names_out]
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    got["onnx"] = sess.run(m["onnx"]["outputs"], {k: feeds[k] for k in reversed(list(feeds))})
    for key in ("legacy", "onnx"):
        for a, b in zip(got[key], got["pir"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
    embedding, logits = got["pir"]
    assert embedding.shape == (32, 16) and logits.shape == (32, 4)
    assert (logits.argmax(1) == y).mean() >= 0.5  # a trained model (3 epochs), read from the right output


def test_a_parity_failure_names_the_output(exported, tmp_path, cli):
    m = _manifest(exported / "export")["metrics"]
    worst = max(m["parity_outputs"].values(), key=lambda p: p["rel"])
    assert worst["rel"] > 0
    run = tmp_path / "run"
    shutil.copytree(exported / "train", run / "train")
    code, _, err = cli("export", run / "train", "--set", f"export.parity_tol={worst['rel'] / 10!r}")
    assert code == 5 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("pipe export: parity gate: predictor vs trained model on output ")
    assert "'embedding'" in err or "'logits'" in err
    assert not (run / "export").exists()
