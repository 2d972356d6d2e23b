"""`pipe export` on the shared digits run: file set, manifest, parity and accuracy, lineage, and the
ways it must refuse (tampered or wrong-stage input: exit 2; parity gate: exit 5), writing nothing.

Every test works on a copy of the `trained_digits` run dir: the shared fixture is never written to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline import artifacts
from pipeline.cli import main
from tests.conftest import tree_hash

EXPECTED_FILES = {
    "manifest.json", "model.json", "model.pdiparams", "preprocess.yaml",
    "legacy/model.pdmodel", "legacy/model.pdiparams",
}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _copy_run(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _leftovers(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.fixture(scope="module")
def exported(trained_digits, tmp_path_factory) -> Path:
    """One export through the real CLI into a copy of the shared run (`<copy>/export`)."""
    run = _copy_run(trained_digits, tmp_path_factory.mktemp("export") / "run")
    before = tree_hash(run / "train")
    assert main(["export", str(run / "train")]) == 0
    assert tree_hash(run / "train") == before, "export must not touch its input"
    return run


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_file_set_and_manifest(exported):
    out, train = exported / "export", _manifest(exported / "train")
    assert _files(out) == EXPECTED_FILES  # no .pdiparams.info, no pickle, nothing extra
    m = _manifest(out)
    assert m["stage"] == "export"
    assert m["format"] == "pir"
    assert m["legacy"]["format"] == "legacy"
    assert m["legacy"]["model"] == "legacy/model.pdmodel" and m["legacy"]["inputs"] == ["x"]
    assert set(m["files"]) == EXPECTED_FILES - {"manifest.json"}
    # Model and data come from the train manifest; the export section from this command (defaults).
    assert {k: v for k, v in m["config"].items() if k != "export"} == \
        {k: v for k, v in train["config"].items() if k != "export"}
    assert m["config"]["export"] == {"parity_tol": 1e-4, "parity_samples": 64, "precision": "fp32"}
    iface, tif = m["interface"], train["interface"]
    assert iface["labels"] == tif["labels"] and iface["preprocessing"] == tif["preprocessing"]
    assert iface["model"] == "digits_cnn"
    (inp,), (outp,) = iface["inputs"], iface["outputs"]
    assert inp == {**tif["inputs"][0], "name": "x"}
    # PIR names an unnamed fetch `fetch_name_<i>`: the engines' name, kept as program_name; the public one leads.
    assert outp["name"] == "logits" and outp["shape"] == [-1, 10] and outp["program_name"] == "fetch_name_0"


def test_recorded_io_names_are_the_predictors(exported):
    """The names in the manifest are what a fresh predictor on the committed files reports."""
    import paddle

    out, m = exported / "export", _manifest(exported / "export")
    for model, params, names in (
        ("model.json", "model.pdiparams", {
            "inputs": [i.get("program_name", i["name"]) for i in m["interface"]["inputs"]],
            "outputs": [o.get("program_name", o["name"]) for o in m["interface"]["outputs"]]}),
        ("legacy/model.pdmodel", "legacy/model.pdiparams", {"inputs": m["legacy"]["inputs"],
                                                            "outputs": m["legacy"]["outputs"]}),
    ):
        c = paddle.inference.Config(str(out / model), str(out / params))
        c.disable_glog_info()
        pred = paddle.inference.create_predictor(c)
        assert pred.get_input_names() == names["inputs"]
        assert pred.get_output_names() == names["outputs"]


def test_preprocess_yaml(exported):
    m = _manifest(exported / "export")
    doc = yaml.safe_load((exported / "export" / "preprocess.yaml").read_text())
    pre = m["interface"]["preprocessing"]
    assert doc["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 1, 8, 8]}]
    (out,) = doc["outputs"]
    assert out == m["interface"]["outputs"][0] and out["name"] == "logits"
    assert out["role"] == "logits" and out["shape"] == [-1, 10] and out["dtype"] == "float32"
    assert (doc["layout"], doc["scale"], doc["mean"], doc["std"]) == \
        (pre["layout"], pre["scale"], pre["mean"], pre["std"])
    assert doc["labels"] == [str(i) for i in range(10)]


def test_parity_and_accuracy(exported):
    """Parity numbers are present and within the gate; predictor accuracy matches training.

    Tolerance on accuracy: the predictor may flip at most 2 of the 269 test samples against the
    train manifest's test_acc (float rounding at near-ties); the dygraph re-evaluation must equal it."""
    m = _manifest(exported / "export")["metrics"]
    train = _manifest(exported / "train")["metrics"]
    assert m["parity_samples"] == 64 and m["parity_tol"] == 1e-4
    assert m["parity_max_abs_logit"] > 1.0  # a trained model, not zeros
    assert 0.0 <= m["parity_max_abs_diff"] <= m["parity_tol"] * m["parity_max_abs_logit"]
    assert m["parity_rel"] == pytest.approx(m["parity_max_abs_diff"] / m["parity_max_abs_logit"])
    assert 0.0 <= m["legacy_parity_max_abs_diff"] <= m["parity_tol"] * m["parity_max_abs_logit"]
    n = m["test_samples"]
    assert n == train["samples"]["test"] == 269
    assert m["dygraph_test_acc"] == pytest.approx(train["test_acc"], abs=1e-12)
    assert abs(m["test_acc"] - train["test_acc"]) <= 2 / n
    assert m["top1_agreement"] >= 1 - 2 / n
    assert 0.0 < m["latency_ms_p50_bs1"] < 100.0
    assert m["threads"] >= 1


def test_verify_and_lineage(exported):
    art = artifacts.verify(exported / "export", ("export",))
    chain = artifacts.lineage(art)
    assert [(a.stage, note) for a, note in chain] == [("export", ""), ("train", "")]
    assert chain[1][0].path.resolve() == (exported / "train").resolve()
    assert art.manifest["input"]["manifest_sha256"] == artifacts.verify(exported / "train", ("train",)).manifest_sha256


def test_no_pickle_in_artifact(exported):
    for rel in EXPECTED_FILES:
        head = (exported / "export" / rel).read_bytes()[:2]
        assert head[:1] != b"\x80", f"{rel} looks like a pickle"


def test_tampered_input_exits_2(trained_digits, tmp_path, cli):
    run = _copy_run(trained_digits, tmp_path / "run")
    weights = run / "train" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    weights.write_bytes(bytes(blob))
    code, _, err = cli("export", run / "train")
    assert code == 2
    assert "sha256 mismatch for model.safetensors" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (run / "export").exists() and _leftovers(run) == []


def test_wrong_stage_input_exits_2(trained_digits, tmp_path, cli):
    run = _copy_run(trained_digits, tmp_path / "run")
    ckpt = run / "checkpoints" / (run / "checkpoints" / "best").read_text().strip()
    code, _, err = cli("export", ckpt)
    assert code == 2
    assert "stage is 'checkpoint', expected train" in err
    assert not (run / "checkpoints" / "export").exists() and _leftovers(run / "checkpoints") == []


def test_parity_gate_fails_exit_5(exported, trained_digits, tmp_path, cli):
    """A real failing gate, no mock and no fault hook.

    The oneDNN predictor folds BatchNorm into the conv weights (conv2d_bn_onednn_fuse_pass), so its
    logits genuinely differ from dygraph by float rounding (measured 1.4e-6 at 1 and 2 threads; 0.0
    with oneDNN off). The passing export recorded that difference; re-exporting with parity_tol a
    tenth of it must fail on the same real numbers. The test first asserts the difference is non-zero,
    so it cannot pass vacuously if a later Paddle makes the predictor bit-exact."""
    m = _manifest(exported / "export")["metrics"]
    assert m["parity_rel"] > 0, "the predictor matched dygraph bit for bit: find another honest failure"
    tol = m["parity_rel"] / 10

    run = _copy_run(trained_digits, tmp_path / "run")
    code, _, err = cli("export", run / "train", "--set", f"export.parity_tol={tol!r}")
    assert code == 5
    assert err.startswith("pipe export: parity gate: predictor vs trained model on output 'logits': max|diff|")
    assert f"{m['parity_max_abs_diff']:.3g}" in err and "on 64 test samples; nothing written" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (run / "export").exists() and _leftovers(run) == []

    # An export already in place stays exactly as it was.
    shutil.copytree(exported / "export", run / "export")
    before = tree_hash(run / "export")
    code, _, _ = cli("export", run / "train", "--set", f"export.parity_tol={tol!r}")
    assert code == 5
    assert tree_hash(run / "export") == before and _leftovers(run) == []


def test_precision_bf16_measured_or_refused(trained_digits, tmp_path, cli):
    """`--precision bf16`: on a CPU with avx512_bf16 the bf16 predictor is measured on the whole test
    split; without it the stage says so in one line and records why, exporting fp32 only."""
    from pipeline import runtime

    run = _copy_run(trained_digits, tmp_path / "run")
    code, out, err = cli("export", run / "train", "--precision", "bf16")
    assert code == 0, err
    m = _manifest(run / "export")["metrics"]
    bf16 = m["reduced_precision"]
    reason = runtime.bf16_unsupported()
    if reason:
        assert bf16 == {"precision": "bf16", "supported": False, "reason": reason}
        assert f"note: --precision bf16: {reason}; exported fp32 only" in err
        return
    assert bf16["supported"] is True and bf16["device"] == "cpu"
    assert bf16["fp32_accuracy"] == m["test_acc"]
    assert 0.95 <= bf16["top1_agreement"] <= 1.0 and abs(bf16["accuracy"] - m["test_acc"]) <= 0.02
    # bf16 keeps 8 mantissa bits: the logits differ from fp32, but not by much.
    assert 0 < bf16["max_abs_diff"] < 0.05 * m["parity_max_abs_logit"]
    assert bf16["latency_ms_p50_bs1"] > 0 and f"bf16: accuracy {bf16['accuracy']:.2%}" in out
    assert _files(run / "export") == EXPECTED_FILES  # precision is a predictor setting, not new files


def test_precision_bf16_on_a_cpu_without_it(trained_digits, tmp_path, cli, monkeypatch):
    """This machine has avx512_bf16, so the CPU-flag check is replaced by one that reports a CPU
    without it (the only thing faked): the export still succeeds, fp32, with a one-line notice."""
    from pipeline import runtime

    monkeypatch.setattr(runtime, "bf16_unsupported", lambda: "this CPU has no avx512_bf16/amx_bf16: test")
    run = _copy_run(trained_digits, tmp_path / "run")
    code, _, err = cli("export", run / "train", "--precision", "bf16")
    assert code == 0, err
    assert err.count("note: --precision bf16: this CPU has no avx512_bf16/amx_bf16: test; exported fp32 only") == 1
    assert "Traceback" not in err
    assert _manifest(run / "export")["metrics"]["reduced_precision"]["supported"] is False
