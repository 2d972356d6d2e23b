"""`pipe package` on the shared digits run: the exact file set (the allowlist: inference-format files
only), manifest and lineage, serving.yaml, the Paddle Serving client config, the Triton repository
(parsed with Triton's own ModelConfig protobuf, its ONNX run in onnxruntime against the Paddle predictor)
and the refusals (exit 2, nothing written).

The export comes from `tests/serving_helpers.exported_run` (one export of the shared `trained_digits`
run per session, in a copy); tests that package again write to their own directories.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import artifacts, data as data_mod
from pipeline.cli import main
from stages import package as package_mod
from tests.conftest import arrays, tree_hash
from tests.serving_helpers import client_config_class, packaged_run, triton_model_config_class

ALLOWLIST_PIR = {
    "manifest.json", "model.json", "model.pdiparams", "serving.yaml", "serving_client_conf.prototxt", "README.md",
    "triton/digits_cnn/config.pbtxt", "triton/digits_cnn/1/model.onnx", "triton/digits_cnn/labels.txt",
    "reference.safetensors",
}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture(scope="module")
def run(trained_digits, tmp_path_factory) -> Path:
    return packaged_run(trained_digits, tmp_path_factory.mktemp("serving"))


def _predictor(paddle, model: Path, params: Path):
    c = paddle.inference.Config(str(model), str(params))
    c.disable_glog_info()
    c.set_cpu_math_library_num_threads(1)
    return paddle.inference.create_predictor(c)


def _predict(pred, x: np.ndarray) -> np.ndarray:
    pred.get_input_handle(pred.get_input_names()[0]).copy_from_cpu(np.ascontiguousarray(x))
    pred.run()
    return pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()


def _test_inputs(run: Path) -> np.ndarray:
    """The digits test split, preprocessed as the export recorded it."""
    m = _manifest(run / "export")
    ds = data_mod.load(data_mod.DataConfig(source="digits"))
    x, _ = arrays(ds.test)
    return data_mod.prepare(x, m["interface"]["preprocessing"])


def test_reference_set_is_real_data_and_fp32_outputs(run):
    """reference.safetensors: 256 inputs drawn from the digits splits (each one a preprocessed sample of the
    data, not noise), the fp32 export's outputs on them, the budget in serving.yaml, and the agreement the
    packaged program (fp32 here: exactly 1.0) reached on this CPU in the manifest."""
    from safetensors.numpy import load_file

    import paddle

    pkg = run / "package"
    t = load_file(str(pkg / "reference.safetensors"))
    t = {"inputs": t.pop("input/x"), "outputs": t.pop("output/logits"), **t}  # every tensor, by public name
    assert sorted(t) == ["inputs", "outputs"] and t["inputs"].shape == (256, 1, 8, 8) and t["outputs"].shape == (256, 10)
    assert t["inputs"].dtype == np.float32 and t["outputs"].dtype == np.float32
    m = _manifest(run / "export")
    ds = data_mod.load(data_mod.DataConfig(source="digits"))
    every = np.concatenate([data_mod.prepare(arrays(sp)[0], m["interface"]["preprocessing"])
                            for sp in (ds.train, ds.val, ds.test)]).reshape(-1, 64)
    rows = {r.tobytes() for r in every}
    assert all(r.tobytes() in rows for r in t["inputs"].reshape(-1, 64)), "reference inputs are not data samples"
    assert len({r.tobytes() for r in t["inputs"].reshape(-1, 64)}) > 200  # a draw, not one sample repeated
    pred = _predictor(paddle, run / "export/model.json", run / "export/model.pdiparams")
    np.testing.assert_allclose(_predict(pred, t["inputs"]), t["outputs"], rtol=0, atol=1e-5)
    doc = yaml.safe_load((pkg / "serving.yaml").read_text())
    assert doc["reference"]["file"] == "reference.safetensors" and doc["reference"]["samples"] == 256
    assert doc["reference"]["min_agreement"] == 0.99
    ref = _manifest(pkg)["metrics"]["reference"]
    assert ref["top1_agreement"] == 1.0 and ref["max_abs_diff"] < 1e-4 and ref["samples"] == 256
    assert ref["engine"]["engine"] == "paddle_inference" and ref["engine"]["precision"] == "fp32"
    assert _manifest(pkg)["metrics"]["cpu"]["probe"]["expected"] == 2072640


def test_file_set_is_the_allowlist(run):
    pkg = run / "package"
    assert _files(pkg) == ALLOWLIST_PIR == package_mod.allowlist("pir", "digits_cnn", reference=True)
    for rel in _files(pkg):  # no pickle anywhere (protocol 2+ starts with 0x80)
        assert (pkg / rel).read_bytes()[:1] != b"\x80", rel
    art = artifacts.verify(pkg, ("package",))
    assert set(art.manifest["files"]) == ALLOWLIST_PIR - {"manifest.json"}
    # The model files are the export's, byte for byte.
    exp = _manifest(run / "export")["files"]
    assert art.manifest["files"]["model.json"] == exp["model.json"]
    assert art.manifest["files"]["model.pdiparams"] == exp["model.pdiparams"]


def test_manifest_and_lineage(run):
    m, exp = _manifest(run / "package"), _manifest(run / "export")
    assert m["stage"] == "package" and m["format"] == "pir" and m["precision"] == "fp32" and m["name"] == "digits_cnn"
    assert m["input"]["stage"] == "export" and m["input"]["path"] == "../export"
    assert m["input"]["manifest_sha256"] == artifacts.verify(run / "export", ("export",)).manifest_sha256
    assert m["config"]["package"] == {"precision": "", "engine": "paddle", "optimize": "balanced", "variant": "",
                                      "name": "", "max_batch_size": 32, "max_wait_ms": 2.0,
                                      "triton": True, "onnx_parity_tol": 1e-4}
    assert m["engine"] == "paddle_inference" and m["chosen"]["engine"] == "paddle"  # the fixture asks for Paddle
    assert m["chosen"]["why"] == "--engine paddle" and "engine_measurement" not in m["metrics"]  # nothing measured
    assert {k: v for k, v in m["config"].items() if k != "package"} == exp["config"]
    assert m["interface"]["inputs"] == exp["interface"]["inputs"]
    assert m["interface"]["outputs"] == exp["interface"]["outputs"]
    chain = [a.stage for a, _ in artifacts.lineage(artifacts.verify(run / "package", ("package",)))]
    assert chain == ["package", "export", "train"]


def test_serving_yaml(run):
    doc = yaml.safe_load((run / "package" / "serving.yaml").read_text())
    iface = _manifest(run / "export")["interface"]
    assert doc["schema"] == 1 and doc["name"] == "digits_cnn" and doc["precision"] == "fp32"
    assert doc["model"] == {"format": "pir", "program": "model.json", "params": "model.pdiparams",
                            "variant": "export-fp32", "engine": "paddle_inference"}
    assert doc["engine"]["name"] == "paddle_inference" and doc["engine"]["chosen"] == "paddle"
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 1, 8, 8]}]
    # the public name leads; the program's (PIR's fetch_name_0) is the engines' detail
    assert doc["outputs"] == [{"name": "logits", "program_name": iface["outputs"][0]["program_name"],
                               "dtype": "float32", "shape": [-1, 10], "role": "logits"}]
    assert doc["labels"] == iface["labels"] and doc["preprocessing"] == iface["preprocessing"]
    assert doc["batching"] == {"max_batch_size": 32, "max_wait_ms": 2.0}
    assert doc["server"] == package_mod.SERVER_DEFAULTS
    assert doc["triton"] == {"model": "digits_cnn", "onnx_source": "paddle2onnx", "onnx_precision": "fp32",
                             "repository": "triton"}
    readme = (run / "package" / "README.md").read_text()
    assert "curl -s http://127.0.0.1:8000/v1/predict" in readme and "HttpClient" in readme


def test_serving_client_conf_parses(run):
    """serving_client_conf.prototxt against Paddle Serving's GeneralModelConfig schema (proto2), built here."""
    from google.protobuf import text_format

    cls = client_config_class()
    conf = text_format.Parse((run / "package" / "serving_client_conf.prototxt").read_text(), cls())
    (feed,), (fetch,) = conf.feed_var, conf.fetch_var
    assert (feed.name, feed.alias_name, feed.feed_type, list(feed.shape)) == ("x", "x", 1, [1, 8, 8])
    assert (fetch.name, fetch.alias_name, fetch.fetch_type, list(fetch.shape)) == ("logits", "logits", 1, [10])


def _triton_model_config():
    return triton_model_config_class()


def test_triton_config_parses_with_tritons_schema(run):
    from google.protobuf import text_format

    root = run / "package" / "triton" / "digits_cnn"
    conf = text_format.Parse((root / "config.pbtxt").read_text(), _triton_model_config()())
    assert conf.name == "digits_cnn" and conf.backend == "onnxruntime" and conf.max_batch_size == 32
    (inp,), (out,) = conf.input, conf.output
    assert (inp.name, list(inp.dims)) == ("x", [1, 8, 8]) and out.label_filename == "labels.txt"
    assert list(out.dims) == [10]
    dt = type(conf).DESCRIPTOR.fields_by_name["input"].message_type.fields_by_name["data_type"].enum_type
    assert dt.values_by_number[inp.data_type].name == "TYPE_FP32"
    assert conf.dynamic_batching.max_queue_delay_microseconds == 2000
    assert conf.instance_group[0].count == 1
    assert (root / "labels.txt").read_text().split() == [str(i) for i in range(10)]
    # An unknown field is a ParseError: the check has teeth.
    with pytest.raises(text_format.ParseError):
        text_format.Parse("name: \"m\"\nnot_a_field: 1\n", _triton_model_config()())


def test_onnx_matches_the_predictor_on_test_data(run):
    """The Triton ONNX in onnxruntime vs the packaged Paddle program on the 269 digits test samples.

    Measured: max|diff| ~1e-6 against logits up to ~9 (gate 1e-4 x max|logit|); top-1 identical."""
    import onnxruntime as ort
    import paddle

    pkg = run / "package"
    x = _test_inputs(run)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(pkg / "triton/digits_cnn/1/model.onnx"), so, providers=["CPUExecutionProvider"])
    y_onnx = sess.run(None, {"x": x})[0]
    y_pd = _predict(_predictor(paddle, pkg / "model.json", pkg / "model.pdiparams"), x)
    peak = float(np.abs(y_pd).max())
    assert float(np.abs(y_onnx - y_pd).max()) <= 1e-4 * peak
    assert (y_onnx.argmax(1) == y_pd.argmax(1)).all()
    m = _manifest(pkg)["metrics"]
    assert 0 <= m["onnx_max_abs_diff"] <= m["onnx_parity_tol"] * m["onnx_max_abs_logit"]


def test_bf16_and_flags(run, tmp_path):
    """--precision bf16 from an export: the same PIR files, precision recorded; --no-triton drops the
    Triton directory; --name and batching flags land in serving.yaml and Triton's config."""
    out = tmp_path / "bf16"
    assert main(["package", str(run / "export"), "--out", str(out), "--precision", "bf16", "--no-triton",
                 "--name", "digits-bf16", "--max-batch-size", "8", "--max-wait-ms", "0.5"]) == 0
    assert _files(out) == package_mod.allowlist("pir", None, reference=True)
    doc = yaml.safe_load((out / "serving.yaml").read_text())
    assert (doc["precision"], doc["name"], doc["triton"]) == ("bf16", "digits-bf16", None)
    assert doc["batching"] == {"max_batch_size": 8, "max_wait_ms": 0.5}
    assert _manifest(out)["precision"] == "bf16"


def test_bf16_where_oneDNN_has_no_bf16_kernels(run, tmp_path, monkeypatch):
    """The other CPU class's bf16 branch, forced on any CPU: with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN kept off
    its bf16 kernels, as on a CPU without avx512_bf16) the package records that its reference check could
    not run here, and `pipe serve` refuses the package with one line (exit 2) instead of serving it."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    from pipeline import runtime

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    # a CPU with bf16 kernels is kept off them by the variable; one without (an AVX2 EPYC) says so first
    why = runtime.bf16_unsupported()
    assert why in ("ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN off its bf16 kernels",
                   "this CPU has no avx512_bf16/amx_bf16: oneDNN bf16 kernels cannot run here")
    out = tmp_path / "bf16"
    assert main(["package", str(run / "export"), "--out", str(out), "--precision", "bf16", "--no-triton"]) == 0
    ref = _manifest(out)["metrics"]["reference"]
    assert ref["not_run_here"] == why and "top1_agreement" not in ref and ref["samples"] == 256
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "serve", str(out), "--port", "0"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"pipe serve: error: {out}: a bf16 package, but {why}; package the model with "
                           "--precision fp32\n")


@pytest.mark.slow
def test_export_onnx_is_reused(run, tmp_path):
    """`pipe export --onnx` already wrote (and parity-gated) model.onnx: the package takes it, its output
    renamed from the program's fetch_name_0 to the model's `logits` and nothing else changed."""
    import onnx

    exp = tmp_path / "export"
    assert main(["export", str(run / "train"), "--out", str(exp), "--onnx"]) == 0
    out = tmp_path / "package"
    assert main(["package", str(exp), "--out", str(out), "--engine", "paddle"]) == 0
    assert _manifest(out)["metrics"]["onnx_io_renamed"] == {"fetch_name_0": "logits"}
    given, served = onnx.load(str(exp / "model.onnx")), onnx.load(str(out / "triton/digits_cnn/1/model.onnx"))
    assert [o.name for o in given.graph.output] == ["fetch_name_0"]
    assert [o.name for o in served.graph.output] == ["logits"]
    assert [i.SerializeToString() for i in served.graph.initializer] == \
        [i.SerializeToString() for i in given.graph.initializer]
    assert [n.op_type for n in served.graph.node] == [n.op_type for n in given.graph.node]
    assert yaml.safe_load((out / "serving.yaml").read_text())["triton"]["onnx_source"] == "export"
    assert _files(out) == ALLOWLIST_PIR  # the export's model.onnx is not copied beside the program


@pytest.mark.parametrize("args, needle", [
    (["--precision", "int8"], "needs a compress artifact"),
    (["--precision", "fp16"], "--precision: must be one of fp32, bf16, int8"),
    (["--name", "../evil"], "--name:"),
    (["--max-batch-size", "-1"], "--max-batch-size: must be 1..4096 (0: the task's default)"),
    (["--max-batch-size", "4097"], "--max-batch-size: must be 1..4096"),
])
def test_bad_flags_exit_2(run, tmp_path, cli, args, needle):
    before = tree_hash(run / "export")
    code, _, err = cli("package", run / "export", "--out", tmp_path / "p", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p").exists() and tree_hash(run / "export") == before


def test_wrong_stage_and_tampered_input_exit_2(run, tmp_path, cli):
    code, _, err = cli("package", run / "train", "--out", tmp_path / "p")
    assert code == 2 and "stage is 'train', expected export or compress" in err
    bad = tmp_path / "export"
    shutil.copytree(run / "export", bad)
    raw = bytearray((bad / "model.pdiparams").read_bytes())
    raw[100] ^= 0xFF
    (bad / "model.pdiparams").write_bytes(bytes(raw))
    code, _, err = cli("package", bad, "--out", tmp_path / "p")
    assert code == 2 and "sha256 mismatch for model.pdiparams" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def _stand_in_compress(run: Path, dest: Path) -> Path:
    """A compress artifact laid out as `pipe compress` writes it (metrics.variants), built through the
    artifact contract from the export's own files, in a second instead of a real run's ~90 s: the legacy
    fp32 program stands in for int8-paddle (its content is not what is tested here; PaddleSlim is not
    installed here), the package's ONNX for onnx-fp32, and bf16 is marked unsupported."""
    exp = artifacts.verify(run / "export", ("export",))
    with artifacts.write_stage(dest, "compress", exp.manifest["config"], exp) as w:
        (w.dir / "int8-paddle").mkdir()
        shutil.copyfile(run / "export/legacy/model.pdmodel", w.dir / "int8-paddle/model.pdmodel")
        shutil.copyfile(run / "export/legacy/model.pdiparams", w.dir / "int8-paddle/model.pdiparams")
        (w.dir / "onnx-fp32").mkdir()
        shutil.copyfile(run / "package/triton/digits_cnn/1/model.onnx", w.dir / "onnx-fp32/model.onnx")
        w.interface = exp.manifest["interface"]
        pd, ort = {"engine": "paddle_inference", "supported": True}, {"engine": "onnxruntime", "supported": True}
        w.metrics = {"variants": {  # the keys stages/compress.py writes (checked against a real run)
            "fp32": {**pd, "format": "pir", "precision": "fp32", "files": [], "source": "export", "accuracy": 0.99},
            "bf16": {**pd, "format": "pir", "precision": "bf16", "files": [], "source": "export",
                     "supported": False, "reason": "no avx512_bf16 (stand-in)"},
            "int8-paddle": {**pd, "format": "legacy", "precision": "int8", "source": "compress", "accuracy": 0.98,
                            "top1_agreement": 0.99,
                            "files": ["int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"]},
            "onnx-fp32": {**ort, "format": "onnx", "precision": "fp32", "source": "compress",
                          "files": ["onnx-fp32/model.onnx"]},
        }}
    return dest


def test_compress_layout_int8_and_fp32(run, tmp_path):
    comp = _stand_in_compress(run, tmp_path / "compress")
    int8 = tmp_path / "pkg-int8"
    assert main(["package", str(comp), "--out", str(int8), "--precision", "int8"]) == 0
    assert _files(int8) == package_mod.allowlist("legacy", "digits_cnn", reference=True)
    doc = yaml.safe_load((int8 / "serving.yaml").read_text())
    legacy_out = _manifest(run / "export")["legacy"]["outputs"][0]
    assert doc["precision"] == "int8" and doc["model"]["variant"] == "int8-paddle"
    assert doc["model"]["program"] == "model.pdmodel" and doc["outputs"][0]["program_name"] == legacy_out
    assert doc["outputs"][0]["name"] == "logits"
    assert doc["triton"]["onnx_source"] == "compress:onnx-fp32" and doc["triton"]["onnx_precision"] == "fp32"
    assert _manifest(int8)["metrics"]["variant_accuracy"] == 0.98
    fp32 = tmp_path / "pkg-fp32"
    assert main(["package", str(comp), "--out", str(fp32), "--no-triton"]) == 0
    assert (fp32 / "model.json").read_bytes() == (run / "export/model.json").read_bytes()
    assert yaml.safe_load((fp32 / "serving.yaml").read_text())["model"]["variant"] == "fp32"
    assert _manifest(fp32)["input"]["stage"] == "compress"


def test_a_variant_below_the_agreement_budget_is_never_packaged(run, tmp_path, cli):
    """compress recorded int8-paddle as below budget (agreement < compress.min_agreement): exit 4 naming it,
    nothing written."""
    comp = _stand_in_compress(run, tmp_path / "compress")
    m = json.loads((comp / "manifest.json").read_text())
    status = "below budget: top-1 agreement 0.9711 < compress.min_agreement 0.99"
    m["metrics"]["variants"]["int8-paddle"].update(status=status, shippable=False)
    (comp / "manifest.json").write_text(json.dumps(m))  # the manifest is not in its own files list
    code, _, err = cli("package", comp, "--out", tmp_path / "pkg", "--precision", "int8")
    assert code == 4, err
    assert err.startswith(f"pipe package: package: {comp / 'manifest.json'}: no variant with precision int8 within 1 "
                          f"points of fp32 is shippable here (int8-paddle ({status}))"), err
    code, _, err = cli("package", comp, "--out", tmp_path / "pkg", "--variant", "int8-paddle")  # asked by name
    assert code == 4, err
    assert err == f"pipe package: {comp / 'manifest.json'}: the int8-paddle variant is {status}; pick another\n"
    assert not (tmp_path / "pkg").exists()


def test_compress_verdict_is_what_package_and_the_report_say(run, tmp_path, cli):
    """Issue 51 item 4, on the digits model: compress called int8 "ok" (its status left out compress.max_drop)
    while package refused it for "drop 4.33 points > 1". A manifest as compress wrote it then (status "ok", no
    `drop_points`), int8 4.33 points below fp32: its verdict is made once at read time by compress's own rule
    (`fidelity.verdict`), and package (auto and by name) and the report all give that one reason."""
    from pipeline import report

    work = tmp_path / "run"
    for stage in ("train", "export", "package"):
        shutil.copytree(run / stage, work / stage)
    comp = _stand_in_compress(work, work / "compress")
    m = json.loads((comp / "manifest.json").read_text())
    m["metrics"]["variants"]["int8-paddle"].update(accuracy=0.9467, status="ok", shippable=True)
    m["metrics"]["variants"]["fp32"].update(status="ok", shippable=True)
    (comp / "manifest.json").write_text(json.dumps(m))  # the manifest is not in its own files list
    status = "over budget: acc drop 4.33 points > compress.max_drop 1"
    code, _, err = cli("package", comp, "--out", tmp_path / "pkg", "--engine", "paddle", "--precision", "int8")
    assert code == 4, err
    assert f"no variant with engine paddle_inference precision int8 within 1 points of fp32 is shippable here " \
           f"(int8-paddle ({status}))" in err, err
    code, _, err = cli("package", comp, "--out", tmp_path / "pkg", "--variant", "int8-paddle")
    assert code == 4 and err == f"pipe package: {comp / 'manifest.json'}: the int8-paddle variant is {status}; " \
                                "pick another\n", err
    assert not (tmp_path / "pkg").exists()
    md, _ = report.write(work)
    row = next(line for line in md.read_text(encoding="utf-8").splitlines() if line.startswith("| int8-paddle |"))
    assert f"| {status} |" in row, row
    fp32 = next(line for line in md.read_text(encoding="utf-8").splitlines() if line.startswith("| fp32 |"))
    assert "| ok |" in fp32, fp32


@pytest.mark.slow
def test_an_export_package_measures_its_engines_once_and_ships_the_fastest(run, tmp_path, monkeypatch):
    """Issue 51 item 7: `pipe package EXPORT` (--engine auto) measures the fp32 engines the export has files for
    (Paddle on the PIR program, OpenVINO on the legacy one; onnxruntime when it has model.onnx) on the reference
    set, records the measurement, and ships what choose.py's rule picks from it: the best score within budget
    if it beats Paddle fp32 by 5%, else Paddle. A second package of the same export reuses the measurement
    (nothing timed again: the same numbers, `measured_here` false); --engine still forces one, measuring
    nothing."""
    from pipeline import choose

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))  # this test's own measurement cache
    exp = run / "export"
    assert main(["package", str(exp), "--out", str(tmp_path / "p1"), "--no-triton"]) == 0
    m = _manifest(tmp_path / "p1")
    rec = m["metrics"]["engine_measurement"]
    v = rec["variants"]
    assert rec["measured_here"] is True and (tmp_path / "cache" / "engines").is_dir()
    assert {"fp32", "openvino-fp32"} <= set(v) and v["fp32"]["engine"] == "paddle_inference"
    for name, x in v.items():
        if x["supported"]:
            assert x["latency_ms_p50_bs1"] > 0 and x["items_per_s_batch"] > 0 and x["reference_samples"] == 256, name
            assert x["status"] == "ok" and x["reference_agreement"] >= 0.99, (name, x["status"])
    ok = {n: x for n, x in v.items() if x["shippable"]}
    best = max(ok, key=lambda n: choose.score(ok[n], "balanced"))
    want = best if choose.score(ok[best], "balanced") >= choose.FASTER and best != "fp32" and \
        min(ok[best]["speedup_bs1"], ok[best]["speedup_batch"]) >= 1 / choose.FASTER else "fp32"
    assert rec["chosen"] == want and m["engine"] == v[want]["engine"] and m["format"] == v[want]["format"], rec
    assert m["chosen"]["why"].startswith("measured here: ") and m["metrics"]["reference"]["top1_agreement"] >= 0.99
    doc = yaml.safe_load((tmp_path / "p1" / "serving.yaml").read_text())
    assert doc["engine"]["measured"]["speedup_bs1"] == v[want]["speedup_bs1"]

    assert main(["package", str(exp), "--out", str(tmp_path / "p2"), "--no-triton"]) == 0
    again = _manifest(tmp_path / "p2")
    assert again["metrics"]["engine_measurement"]["measured_here"] is False
    assert again["metrics"]["engine_measurement"]["variants"] == v  # every timing as recorded: none was taken again
    assert again["engine"] == m["engine"] and "from " + rec["cache"] in again["chosen"]["why"]
    Path(rec["cache"]).write_text('{"key": {"schema": 1}, "varia')  # a cache that does not parse: measured again
    assert main(["package", str(exp), "--out", str(tmp_path / "p4"), "--no-triton"]) == 0
    assert _manifest(tmp_path / "p4")["metrics"]["engine_measurement"]["measured_here"] is True
    assert json.loads(Path(rec["cache"]).read_text())["variants"].keys() == v.keys()

    assert main(["package", str(exp), "--out", str(tmp_path / "p3"), "--no-triton", "--engine", "onnxruntime"]) == 2
    assert main(["package", str(exp), "--out", str(tmp_path / "p3"), "--no-triton", "--engine", "paddle"]) == 0
    forced = _manifest(tmp_path / "p3")
    assert forced["engine"] == "paddle_inference" and "engine_measurement" not in forced["metrics"]


def test_compress_refuses_a_changed_export(run, tmp_path, cli):
    work = tmp_path / "run"
    shutil.copytree(run / "train", work / "train")
    shutil.copytree(run / "export", work / "export")
    shutil.copytree(run / "package", work / "package")
    comp = _stand_in_compress(work, work / "compress")
    code, _, err = cli("package", comp, "--out", tmp_path / "p", "--precision", "bf16")
    assert code == 2 and "bf16 could not run where it was made (no avx512_bf16 (stand-in))" in err
    (work / "export" / "preprocess.yaml").write_text("changed: true\n")
    code, _, err = cli("package", comp, "--out", tmp_path / "p")
    assert code == 2 and "mismatch for preprocess.yaml" in err
    assert not (tmp_path / "p").exists()
