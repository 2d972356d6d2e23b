"""`pipe package` of a model with two named inputs and two outputs (examples/two_inputs.yaml, trained briefly and
exported with --onnx: tests/multi_io_helpers.py): serving.yaml's `inputs:`/`outputs:` lists, the reference set
with every tensor (and its check, which refuses a reference whose logits or embedding differ: top-1 agreement
on the logits, SQNR on the other float outputs, as compress gates variants), Triton's config.pbtxt with an
entry per tensor under the ONNX's own names (also for an ONNX made from the legacy program, whose inputs come
in reversed order), the Paddle Serving client conf with two feeds and two fetches, on Paddle Inference and on
onnxruntime; `pipe inspect --verify` passes. And packages made before every tensor was listed (serving.yaml's
single `input:`/`output:`, a two-key reference set) still load and check.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import iospec
from pipeline.cli import main
from pipeline.errors import InputError
from pipeline.serving import spec as spec_mod
from tests.multi_io_helpers import examples_importable, stand_in_compress, two_inputs_run
from tests.serving_helpers import client_config_class, packaged_run, triton_model_config_class

NAME = "examples.two_inputs.model_build"  # the model's factory, sanitised
INPUTS = [{"name": "img", "dtype": "float32", "shape": [-1, 1, 8, 8]},
          {"name": "feat", "dtype": "float32", "shape": [-1, 4]}]
# a dict output: jit.save gives it in sorted key order, fetch_name_<i> in the PIR program (the engines' name)
OUTPUTS = [{"name": "embedding", "program_name": "fetch_name_0", "dtype": "float32", "shape": [-1, 16]},
           {"name": "logits", "program_name": "fetch_name_1", "dtype": "float32", "shape": [-1, 4], "role": "logits"}]
KEYS = ["input/feat", "input/img", "output/embedding", "output/logits"]


@pytest.fixture(autouse=True)
def _examples_importable():
    """Packaging again draws the reference set from the example's data factory."""
    with examples_importable():
        yield


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return two_inputs_run(tmp_path_factory.mktemp("multi-io-package"))


@pytest.fixture(scope="module")
def ort_package(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("multi-io-ort") / "package"
    with examples_importable():
        assert main(["package", str(run / "export"), "--engine", "onnxruntime", "--out", str(out)]) == 0
    return out


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _yaml(d: Path) -> dict:
    return yaml.safe_load((d / "serving.yaml").read_text(encoding="utf-8"))


def _rehash(pkg: Path, *names: str) -> None:
    """Record edited files' sha256 in the package manifest (not in its own files list), as a forger would."""
    m = _manifest(pkg)
    for name in names:
        raw = (pkg / name).read_bytes()
        m["files"][name] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    (pkg / "manifest.json").write_text(json.dumps(m, indent=2))


def _reference(pkg: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(pkg / "reference.safetensors"), "numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _onnx_io(path: Path) -> tuple[list, list]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.get_inputs(), sess.get_outputs()


# ------------------------------------------------------------------ the package's documents


@pytest.mark.parametrize("which", ["paddle", "onnxruntime"])
def test_serving_yaml_lists_every_tensor(run, ort_package, which):
    pkg = run / "package" if which == "paddle" else ort_package
    doc = _yaml(pkg)
    engine, fmt = {"paddle": ("paddle_inference", "pir"), "onnxruntime": ("onnxruntime", "onnx")}[which]
    assert doc["model"]["engine"] == engine and doc["model"]["format"] == fmt
    assert "input" not in doc and "output" not in doc
    assert doc["inputs"] == INPUTS and doc["outputs"] == OUTPUTS
    sp = spec_mod.load_package(pkg)
    assert sp.io == iospec.IO.from_interface({"inputs": INPUTS, "outputs": OUTPUTS})
    assert sp.io.logits().public == "logits" and [t.public for t in sp.io.inputs] == ["img", "feat"]
    # the manifest's interface: the export's, under the served names
    m, exp = _manifest(pkg), _manifest(run / "export")
    assert m["interface"]["inputs"] == exp["interface"]["inputs"]
    assert m["interface"]["outputs"] == exp["interface"]["outputs"]
    readme = (pkg / "README.md").read_text(encoding="utf-8")
    for t in INPUTS + OUTPUTS:
        assert f"| `{t['name']}` | {t['dtype']} | {t['shape']} |" in readme
    assert "fetch_name" not in readme
    assert 'feed={"img": x_0, "feat": x_1}, fetch=["embedding", "logits"]' in readme


def test_reference_set_holds_every_tensor_and_the_fp32_outputs(run):
    """Both inputs (256 data samples) and both outputs, equal to a fresh Paddle predictor's fed by name in
    reversed order; the check at package time covers both outputs."""
    import paddle

    pkg = run / "package"
    t, meta = _reference(pkg)
    assert sorted(t) == KEYS and meta == {"pipe.reference": "2", "logits": "logits"}
    assert t["input/img"].shape == (256, 1, 8, 8) and t["input/feat"].shape == (256, 4)
    assert t["output/embedding"].shape == (256, 16) and t["output/logits"].shape == (256, 4)
    assert all(a.dtype == np.float32 for a in t.values())
    c = paddle.inference.Config(str(pkg / "model.json"), str(pkg / "model.pdiparams"))
    c.disable_glog_info()
    c.set_cpu_math_library_num_threads(1)
    pred = paddle.inference.create_predictor(c)
    for name in ("feat", "img"):
        pred.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(t[f"input/{name}"]))
    pred.run()
    for out in OUTPUTS:
        np.testing.assert_allclose(pred.get_output_handle(out["program_name"]).copy_to_cpu(), t[f"output/{out['name']}"],
                                   rtol=0, atol=1e-5)
    assert _yaml(pkg)["reference"]["min_sqnr_db"] == 20.0  # compress.min_sqnr_db
    ref = _manifest(pkg)["metrics"]["reference"]
    assert ref["top1_agreement"] == 1.0 and ref["samples"] == 256 and ref["logits"] == "logits"
    assert set(ref["outputs"]) == {"embedding", "logits"}
    assert ref["outputs"]["embedding"]["max_abs_diff"] < 1e-4


@pytest.mark.parametrize("which", ["paddle", "onnxruntime"])
def test_triton_config_has_every_tensor_under_the_models_names(run, ort_package, which):
    from google.protobuf import text_format

    cls = triton_model_config_class()
    pkg = run / "package" if which == "paddle" else ort_package
    root = pkg / "triton" / NAME
    conf = text_format.Parse((root / "config.pbtxt").read_text(), cls())
    ins, outs = _onnx_io(root / "1/model.onnx")
    assert [i.name for i in conf.input] == ["img", "feat"] and {i.name for i in ins} == {"img", "feat"}
    assert [o.name for o in conf.output] == ["embedding", "logits"] == [o.name for o in outs]
    dims = {i.name: list(i.dims) for i in (*conf.input, *conf.output)}
    assert dims == {"img": [1, 8, 8], "feat": [4], "embedding": [16], "logits": [4]}
    dt = type(conf).DESCRIPTOR.fields_by_name["input"].message_type.fields_by_name["data_type"].enum_type
    assert {dt.values_by_number[t.data_type].name for t in (*conf.input, *conf.output)} == {"TYPE_FP32"}
    assert [o.label_filename for o in conf.output] == ["", "labels.txt"]  # the logits only
    assert (root / "labels.txt").read_text().split() == ["top-left", "top-right", "bottom-left", "bottom-right"]
    m = _manifest(pkg)["metrics"]
    assert set(m["onnx_outputs"]) == {"embedding", "logits"}
    assert m["onnx_max_abs_diff"] == m["onnx_outputs"]["logits"]["max_abs_diff"]
    for p in m["onnx_outputs"].values():
        assert 0 <= p["max_abs_diff"] <= m["onnx_parity_tol"] * p["max_abs"]


@pytest.mark.parametrize("which", ["paddle", "onnxruntime"])
def test_serving_client_conf_has_two_feeds_and_two_fetches(run, ort_package, which):
    from google.protobuf import text_format

    pkg = run / "package" if which == "paddle" else ort_package
    conf = text_format.Parse((pkg / "serving_client_conf.prototxt").read_text(), client_config_class()())
    assert [(f.name, f.alias_name, f.feed_type, list(f.shape)) for f in conf.feed_var] == [
        ("img", "img", 1, [1, 8, 8]), ("feat", "feat", 1, [4])]
    assert [(f.name, f.alias_name, f.fetch_type, list(f.shape)) for f in conf.fetch_var] == [
        ("embedding", "embedding", 1, [16]), ("logits", "logits", 1, [4])]


# ------------------------------------------------------------------ an ONNX made from the legacy program


def test_a_legacy_made_onnx_is_named_by_name(run, tmp_path):
    """compress's ONNX of the legacy program lists its inputs feat, img. Packaged as the served file (on
    onnxruntime) its names stay and config.pbtxt finds each tensor by name; packaged beside the legacy int8
    stand-in (its program's names relu_2.tmp_0, linear_3.tmp_1), the Triton copy's outputs are renamed to the
    model's own, as every other package's."""
    from google.protobuf import text_format

    comp = stand_in_compress(run, tmp_path / "compress")
    ins, _ = _onnx_io(comp / "onnx-fp32/model.onnx")
    assert [i.name for i in ins] == ["feat", "img"]
    cls = triton_model_config_class()

    onnx_pkg = tmp_path / "onnx"
    assert main(["package", str(comp), "--variant", "onnx-fp32", "--out", str(onnx_pkg)]) == 0
    assert _yaml(onnx_pkg)["inputs"] == INPUTS and _yaml(onnx_pkg)["outputs"] == OUTPUTS
    assert _manifest(onnx_pkg)["metrics"]["reference"]["top1_agreement"] == 1.0
    pbtxt = (onnx_pkg / "triton" / NAME / "config.pbtxt").read_text()
    if cls is not None:
        conf = text_format.Parse(pbtxt, cls())
        assert {i.name: list(i.dims) for i in conf.input} == {"img": [1, 8, 8], "feat": [4]}

    int8 = tmp_path / "int8"
    assert main(["package", str(comp), "--precision", "int8", "--out", str(int8)]) == 0
    assert [o["name"] for o in _yaml(int8)["outputs"]] == ["embedding", "logits"]
    served = [o["program_name"] for o in _yaml(int8)["outputs"]]
    assert served == _manifest(run / "export")["legacy"]["outputs"] and served != ["fetch_name_0", "fetch_name_1"]
    m = _manifest(int8)["metrics"]
    assert m["onnx_io_renamed"] == {"fetch_name_0": "embedding", "fetch_name_1": "logits"}
    _, outs = _onnx_io(int8 / "triton" / NAME / "1/model.onnx")
    assert [o.name for o in outs] == ["embedding", "logits"]
    conf = (int8 / "triton" / NAME / "config.pbtxt").read_text()
    assert all(f'name: "{n}"' in conf for n in ["img", "feat", "embedding", "logits"])
    assert conf.index('name: "logits"') < conf.index('label_filename: "labels.txt"')
    assert not any(n in conf for n in served)
    client = (int8 / "serving_client_conf.prototxt").read_text()
    assert client.count("feed_var {") == 2 and client.count("fetch_var {") == 2
    assert 'name: "logits"\n  alias_name: "logits"' in client and not any(n in client for n in served)


# ------------------------------------------------------------------ the check where the package runs


def test_inspect_verify_checks_every_output(run, ort_package, cli):
    for pkg, engine in ((run / "package", "paddle_inference"), (ort_package, "onnxruntime")):
        code, out, err = cli("inspect", pkg, "--verify")
        assert code == 0, err
        line = next(ln for ln in out.splitlines() if ln.startswith("reference check:"))
        assert line.startswith("reference check: 256 samples, top-1 agreement with fp32 1.0000 (budget 0.99)")
        assert "; embedding max|diff| " in line and f"on {engine} fp32 on this CPU" in line


def test_a_tampered_reference_is_refused(run, tmp_path, cli):
    """Logits in the reference that the model does not give: exit 4, one line with the numbers. An
    embedding that differs (logits intact): exit 4 too, its SQNR below the package's min_sqnr_db (20 dB,
    compress's). A set lacking an output: exit 2 naming it. A changed byte without a forged manifest: the
    checksum, exit 2."""
    from safetensors.numpy import save_file

    pkg = tmp_path / "package"
    shutil.copytree(run / "package", pkg)
    t, meta = _reference(pkg)
    good = dict(t)

    t["output/logits"] = np.ascontiguousarray(-t["output/logits"])  # every top-1 changes
    save_file(t, str(pkg / "reference.safetensors"), metadata=meta)
    _rehash(pkg, "reference.safetensors")
    code, out, err = cli("inspect", pkg, "--verify")
    assert code == 4, err
    assert err.startswith("pipe inspect: reference check: 256 samples, top-1 agreement with fp32 0.")
    assert err.count("\n") == 1 and "below the budget" in err and "Re-package fp32: pipe package" in err

    t = {**good, "output/embedding": np.ascontiguousarray(good["output/embedding"] + 0.5)}
    save_file(t, str(pkg / "reference.safetensors"), metadata=meta)
    _rehash(pkg, "reference.safetensors")
    code, out, err = cli("inspect", pkg, "--verify")
    assert code == 4 and err.count("\n") == 1, err
    assert "top-1 agreement with fp32 1.0000 (budget 0.99)" in err and "; embedding max|diff| 0.5, SQNR " in err
    assert " dB < min_sqnr_db 20 on paddle_inference fp32 on this CPU (" in err and "below the budget" in err
    assert float(err.split("SQNR ")[1].split(" dB")[0]) < 20

    del t["output/embedding"]  # a set without one of the package's outputs
    save_file(t, str(pkg / "reference.safetensors"), metadata=meta)
    _rehash(pkg, "reference.safetensors")
    code, _, err = cli("inspect", pkg, "--verify")
    assert code == 2 and err.count("\n") == 1 and "output/embedding" in err, err

    raw = bytearray((pkg / "reference.safetensors").read_bytes())
    raw[-1] ^= 0xFF
    (pkg / "reference.safetensors").write_bytes(bytes(raw))
    code, _, err = cli("inspect", pkg, "--verify")
    assert code == 2 and "sha256 mismatch for reference.safetensors" in err, err


# ------------------------------------------------------------------ packages made before


def test_an_old_style_package_still_loads_and_checks(trained_digits, tmp_path_factory, tmp_path, cli):
    """A digits package rewritten as pipe wrote them before every tensor was listed: serving.yaml's single
    `input:` and `output:` (no role; `name` the program's, `alias` the public one), a reference set of two
    keys `inputs`, `outputs`. It loads to the same Spec.io, `pipe inspect --verify` checks it, and logits
    that differ are refused (exit 4)."""
    from safetensors.numpy import save_file

    new = packaged_run(trained_digits, tmp_path_factory.mktemp("old-style")) / "package"
    old = tmp_path / "package"
    shutil.copytree(new, old)
    doc = _yaml(old)
    (inp_now,), (outp_now,) = doc.pop("inputs"), doc.pop("outputs")
    inp = {**inp_now, "alias": inp_now["name"]}
    outp = {"name": outp_now["program_name"], "alias": outp_now["name"], "dtype": outp_now["dtype"],
            "shape": outp_now["shape"]}
    doc = {**{k: v for k, v in doc.items() if k != "labels"}, "input": inp, "output": outp, "labels": doc["labels"]}
    (old / "serving.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    t, _ = _reference(old)
    save_file({"inputs": t["input/x"], "outputs": t["output/logits"]}, str(old / "reference.safetensors"))
    _rehash(old, "serving.yaml", "reference.safetensors")

    sp, now = spec_mod.load_package(old), spec_mod.load_package(new)
    assert sp.io == now.io and sp.io.logits().name == outp["name"] and sp.io.logits().public == "logits"
    assert spec_mod.entries(sp.io.inputs) == [inp_now] and spec_mod.entries(sp.io.outputs) == [outp_now]
    code, out, err = cli("inspect", old, "--verify")
    assert code == 0, err
    assert "reference check: 256 samples, top-1 agreement with fp32 1.0000 (budget 0.99)" in out

    save_file({"inputs": t["input/x"], "outputs": np.ascontiguousarray(-t["output/logits"])},
              str(old / "reference.safetensors"))
    _rehash(old, "reference.safetensors")
    code, _, err = cli("inspect", old, "--verify")
    assert code == 4 and "below the budget" in err, err


def test_a_package_needs_a_logits_output_of_its_labels(run, tmp_path, cli):
    """serving.yaml whose logits are not float32 [-1, len(labels)], or a text package whose inputs are not
    int64 [-1, -1]: refused in one line naming the tensor, before any predictor starts."""
    pkg = tmp_path / "package"
    shutil.copytree(run / "package", pkg)
    doc = _yaml(pkg)
    doc["labels"] = doc["labels"][:3]
    (pkg / "serving.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    _rehash(pkg, "serving.yaml")
    with pytest.raises(InputError) as e:
        spec_mod.load_package(pkg)
    assert "the logits output 'logits' must be float32 [-1, 3], got float32 [-1, 4]" in str(e.value)
    doc["labels"] = _yaml(run / "package")["labels"]
    doc["preprocessing"] = {**doc["preprocessing"], "kind": "text"}
    doc["text"] = {}
    (pkg / "serving.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    _rehash(pkg, "serving.yaml")
    code, _, err = cli("inspect", pkg, "--verify")
    assert code == 2 and err.count("\n") == 1
    assert "a text model takes int64 ids of shape [-1, -1]; input 'img' is float32 [-1, 1, 8, 8]" in err, err
