"""`pipe compress --int8` on the shared digits run: file set, manifest variants and their numbers, the
int8 accuracy drop, the files loading in their engines, the gate (exit 4) and the ways it must refuse
bad input (exit 2), writing nothing. Real PaddleSlim, paddle2onnx and onnxruntime; no mocks.

Every test works on a copy of the `trained_digits` run dir (2 epochs): the shared fixture is never written to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import artifacts, cpu
from pipeline.cli import main
from tests.conftest import REPO, arrays, tree_hash

EXPECTED_FILES = {
    "manifest.json", "int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams",
    "onnx-fp32/model.onnx", "int8-onnx/model.onnx",
}
VARIANT_KEYS = {
    "format", "precision", "engine", "files", "source", "inputs", "outputs", "size_bytes", "supported",
    "accuracy", "top1_agreement", "max_abs_diff", "latency_ms_p50_bs1", "latency_ms_p99_bs1",
    "items_per_s_batch", "speedup_bs1", "speedup_batch", "faster_than_fp32", "note",
    "engine_info", "agreement_samples", "test_top1_agreement", "status", "shippable", "fidelity",
    "metric", "metrics",  # the task's monitored metric (its value is `accuracy`) and all its metrics
    "drop_points",  # the drop against fp32 its verdict (`status`) judged
}
MEASURED = ("accuracy", "top1_agreement", "max_abs_diff", "latency_ms_p50_bs1", "latency_ms_p99_bs1",
            "items_per_s_batch", "speedup_bs1", "speedup_batch")


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _leftovers(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _cpu_has_bf16() -> bool:
    """The CPU flags, and no ONEDNN_MAX_CPU_ISA keeping oneDNN off its bf16 kernels (as the stage decides)."""
    from pipeline import runtime

    return not runtime.bf16_unsupported()


@pytest.fixture(scope="module")
def exported(trained_digits, tmp_path_factory) -> Path:
    """A copy of the shared run with `export/`, made with `--onnx` (no compress yet)."""
    run = tmp_path_factory.mktemp("compress") / "run"
    shutil.copytree(trained_digits, run)
    assert main(["export", str(run / "train"), "--onnx"]) == 0
    return run


def test_export_onnx(exported):
    """`pipe export --onnx` (kept here beside the other ONNX checks): model.onnx is committed, recorded with
    its io names, and held to the export parity bound in onnxruntime; a fresh session reproduces it."""
    import onnxruntime as ort

    from pipeline import config as config_mod, data as data_mod

    out = exported / "export"
    assert _files(out) == {"manifest.json", "model.json", "model.pdiparams", "model.onnx", "preprocess.yaml",
                           "legacy/model.pdmodel", "legacy/model.pdiparams"}
    m = _manifest(out)
    assert m["onnx"] == {"format": "onnx", "model": "model.onnx", "opset": 13,
                         "inputs": ["x"], "outputs": [m["interface"]["outputs"][0]["program_name"]]}
    met = m["metrics"]
    assert 0.0 <= met["onnx_parity_max_abs_diff"] <= met["parity_tol"] * met["parity_max_abs_logit"]
    assert met["onnx_parity_rel"] == pytest.approx(met["onnx_parity_max_abs_diff"] / met["parity_max_abs_logit"])
    ds = data_mod.load(config_mod.from_dict(m["config"]).data)
    x, y = arrays(ds.test)
    x = data_mod.prepare(x, m["interface"]["preprocessing"])
    got = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert abs(float((got.argmax(1) == y).mean()) - met["test_acc"]) <= 1 / len(y)


@pytest.fixture(scope="module")
def compressed(exported, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`pipe compress RUN/export --int8` as a user runs it (a fresh process: stdout, stderr, exit code)."""
    run = tmp_path_factory.mktemp("compressed") / "run"
    shutil.copytree(exported, run)
    before = tree_hash(run / "export")
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(run / "export"), "--int8"],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    assert tree_hash(run / "export") == before, "compress must not touch its input"
    return run, proc


@pytest.mark.slow
def test_file_set_and_manifest(compressed):
    run, _ = compressed
    out = run / "compress"
    assert _files(out) == EXPECTED_FILES  # no .pdiparams.info, no calibration cache, no pickle
    m = _manifest(out)
    assert m["stage"] == "compress" and m["format"] == "variants"
    assert set(m["files"]) == EXPECTED_FILES - {"manifest.json"}
    assert m["config"]["compress"] == {
        "int8": True, "backend": "both", "algo": "avg", "calib_batches": 0, "calib_batch_size": 32,
        "calib_seed": 0, "max_drop": 1.0, "min_agreement": 0.99, "min_sqnr_db": 20.0, "reduce_range": True, "openvino": True, "latency_runs": 200,
        "throughput_runs": 30, "distill": False, "student": "", "baseline": False}
    exp = _manifest(run / "export")
    assert {k: v for k, v in m["config"].items() if k != "compress"} == \
        {k: v for k, v in exp["config"].items() if k != "compress"}
    assert m["interface"] == exp["interface"]
    assert set(m["tools"]) == {"paddle2onnx", "onnx"}
    assert {"paddleslim", "onnxruntime", "paddlepaddle"} <= set(m["versions"])
    chain = artifacts.lineage(artifacts.verify(out, ("compress",)))
    assert [(a.stage, note) for a, note in chain] == [("compress", ""), ("export", ""), ("train", "")]

    variants = m["metrics"]["variants"]
    exp_files = exp["files"]
    assert list(variants) == ["fp32", "bf16", "int8-paddle", "onnx-fp32", "int8-onnx", "openvino-fp32", "openvino-int8"]
    for name, v in variants.items():
        assert set(v) == VARIANT_KEYS | ({"reason"} if not v["supported"] else set()), name
        for rel in v["files"]:  # relative to this artifact, or with source "export" to the export's
            listed = exp_files if v["source"] == "export" else m["files"]
            assert rel in listed, f"{name}: {rel} is not a committed file of its {v['source']}"
    assert (variants["fp32"]["files"], variants["fp32"]["source"]) == ([], "export")
    assert (variants["bf16"]["files"], variants["bf16"]["source"]) == ([], "export")
    assert variants["int8-paddle"]["files"] == ["int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"]
    assert [(v["format"], v["precision"], v["engine"]) for v in variants.values()] == [
        ("pir", "fp32", "paddle_inference"), ("pir", "bf16", "paddle_inference"),
        ("legacy", "int8", "paddle_inference"), ("onnx", "fp32", "onnxruntime"), ("onnx", "int8", "onnxruntime"),
        ("legacy", "fp32", "openvino"), ("onnx", "int8", "openvino")]
    # OpenVINO runs files the other routes made: the export's legacy program, int8-onnx's QDQ model
    assert (variants["openvino-fp32"]["source"], variants["openvino-int8"]["files"]) == ("export", ["int8-onnx/model.onnx"])
    calib = m["metrics"]["calibration"]
    assert (calib["split"], calib["batches"], calib["batch_size"], calib["paddleslim_algo"]) == ("train", 10, 32, "avg")
    assert (calib["samples"], calib["thin"]) == (320, False)  # the default takes up to 10 batches


@pytest.mark.slow
def test_numbers_present_and_int8_drop_within_one_point(compressed):
    """Every supported variant carries measured numbers; the best int8 variant loses <= 1.0 point.

    Measured on this machine (2-epoch fixture, 269 test samples): fp32 95.91%, int8-paddle and int8-onnx
    95.54% each (one sample flipped, 0.37 points); the assert message prints this run's numbers."""
    run, _ = compressed
    m = _manifest(run / "compress")["metrics"]
    exp = _manifest(run / "export")["metrics"]
    variants, n = m["variants"], m["test_samples"]
    assert n == exp["test_samples"] == 269
    assert variants["fp32"]["accuracy"] == pytest.approx(exp["test_acc"], abs=1 / n + 1e-12)
    for name, v in variants.items():
        if not v["supported"]:
            continue
        assert all(isinstance(v[k], float) and np.isfinite(v[k]) for k in MEASURED), name
        assert 0.0 < v["latency_ms_p50_bs1"] <= v["latency_ms_p99_bs1"], name
        assert v["items_per_s_batch"] > 0 and v["size_bytes"] > 0, name
    if _cpu_has_bf16():
        assert variants["bf16"]["supported"] and variants["bf16"]["top1_agreement"] >= 0.98
    else:
        from pipeline import runtime

        assert not variants["bf16"]["supported"] and variants["bf16"]["reason"] == runtime.bf16_unsupported()

    accs = {k: round(v["accuracy"] * 100, 2) for k, v in variants.items() if v["supported"]}
    assert m["int8_drop_points"] <= 1.0, f"int8 drop {m['int8_drop_points']:.2f} points > 1.0: {accs}"
    assert m["int8_drop_points"] == pytest.approx((m["fp32_accuracy"] - m["best_int8_accuracy"]) * 100)
    assert m["best_int8"] in ("int8-paddle", "int8-onnx")
    for name in ("int8-paddle", "int8-onnx"):
        drop = (m["fp32_accuracy"] - variants[name]["accuracy"]) * 100
        assert drop <= 1.0, f"{name} drops {drop:.2f} points: {accs}"
        assert variants[name]["top1_agreement"] >= 0.98, accs
    # The conversion to ONNX is held to the export's parity bound.
    assert m["onnx_parity_max_abs_diff"] == variants["onnx-fp32"]["max_abs_diff"]
    assert variants["onnx-fp32"]["max_abs_diff"] <= 1e-4 * exp["parity_max_abs_logit"] * 2
    assert variants["int8-onnx"]["size_bytes"] < variants["onnx-fp32"]["size_bytes"] / 2


@pytest.mark.slow
def test_table_and_plain_speed_verdict(compressed):
    """The table is printed; whether int8 is faster is a measured verdict, stated in the manifest and on screen."""
    run, proc = compressed
    m = _manifest(run / "compress")["metrics"]
    assert proc.stderr == "", proc.stderr  # no pass logs, ORT warnings or paddle import noise
    assert "fp32 vs each variant: 269 test samples" in proc.stdout
    for name in ("fp32", "bf16", "int8-paddle", "onnx-fp32", "int8-onnx"):
        assert f"│ {name} " in proc.stdout, name
    margin = 1.05
    for name, v in m["variants"].items():
        if name == "fp32" or not v["supported"]:
            continue
        assert v["faster_than_fp32"] == (min(v["speedup_bs1"], v["speedup_batch"]) >= margin), name
        assert f"{name}: {v['note']}" in proc.stdout
    int8_fast = [k for k in ("int8-paddle", "int8-onnx") if m["variants"][k]["faster_than_fp32"]]
    assert m["int8_faster_than_fp32"] == bool(int8_fast)
    assert ("int8 is not faster than fp32 here" in proc.stdout) == (not int8_fast)


@pytest.mark.slow
def test_variants_load_in_their_engines(compressed):
    """A fresh predictor / session on the committed files reports the recorded io names and reproduces
    the recorded int8 accuracies exactly (CPU inference is deterministic here)."""
    import onnxruntime as ort
    import paddle

    from pipeline import config as config_mod, data as data_mod

    run, _ = compressed
    out, m = run / "compress", _manifest(run / "compress")
    variants = m["metrics"]["variants"]
    ds = data_mod.load(config_mod.from_dict(m["config"]).data)
    x, y = arrays(ds.test)
    x = data_mod.prepare(x, m["interface"]["preprocessing"])

    c = paddle.inference.Config(str(out / "int8-paddle/model.pdmodel"), str(out / "int8-paddle/model.pdiparams"))
    c.enable_onednn()
    c.enable_onednn_int8(cpu.onednn_int8_ops())  # the op set this CPU gets (fc/matmul in fp32 without VNNI)
    c.disable_glog_info()
    pred = paddle.inference.create_predictor(c)
    v = variants["int8-paddle"]
    assert (pred.get_input_names(), pred.get_output_names()) == (v["inputs"], v["outputs"])
    h = pred.get_input_handle(v["inputs"][0])
    h.copy_from_cpu(np.ascontiguousarray(x))
    pred.run()
    got = pred.get_output_handle(v["outputs"][0]).copy_to_cpu()
    assert float((got.argmax(1) == y).mean()) == pytest.approx(v["accuracy"], abs=1 / len(y) + 1e-12)

    for name in ("onnx-fp32", "int8-onnx"):
        v = variants[name]
        sess = ort.InferenceSession(str(out / v["files"][0]), providers=["CPUExecutionProvider"])
        assert [i.name for i in sess.get_inputs()] == v["inputs"] == ["x"]
        assert [o.name for o in sess.get_outputs()] == v["outputs"]
        got = sess.run(None, {"x": x})[0]
        assert float((got.argmax(1) == y).mean()) == pytest.approx(v["accuracy"], abs=1e-12), name


@pytest.mark.slow
def test_cpu_capability_agreement_over_all_splits_and_status(compressed):
    """The CPU's int8 capability is recorded and printed; agreement and max|diff| are over every sample of
    digits (1,797 of all splits, not the 269 of test); each variant's status follows the rule; the int8
    ONNX model says in itself that its weights are 7-bit (reduce_range: exact on any x86 CPU)."""
    from pipeline.engines import ort as ort_engine

    run, proc = compressed
    m = _manifest(run / "compress")["metrics"]
    assert m["cpu"] == cpu.capability() and m["agreement_samples"] == 1797 and m["min_agreement"] == 0.99
    assert f"CPU: {cpu.summary()}" in proc.stdout and "1797 samples of all splits" in proc.stdout
    assert m["onnxruntime_reduce_range"] is True
    assert ort_engine.saturation_safe(run / "compress/int8-onnx/model.onnx") is True
    base = m["variants"]["fp32"]
    for name, v in m["variants"].items():
        if not v["supported"]:
            assert v["status"].startswith("unsupported: ") and v["shippable"] is False
            continue
        assert v["agreement_samples"] == 1797 and 0 <= v["top1_agreement"] <= 1, name
        assert v["engine_info"]["engine"] == v["engine"] and v["engine_info"]["precision"] == v["precision"]
        paddle_int8_here = name == "int8-paddle" and not cpu.int8_exact("paddle_inference")
        below = v["top1_agreement"] < 0.99 and name != "fp32"
        drop = (base["accuracy"] - v["accuracy"]) * 100
        unreliable = paddle_int8_here and not below and (drop > 1.0 + 1e-9 or not v["faster_than_fp32"])
        over = drop > 1.0 + 1e-9
        want = "below budget" if below else "unreliable on this CPU" if unreliable else "over budget" if over else "ok"
        assert v["drop_points"] == pytest.approx(drop), name
        assert v["status"].split(":")[0] == want and v["shippable"] == (want == "ok"), (name, v["status"])
    shippable = [n for n in ("int8-paddle", "int8-onnx") if m["variants"][n]["shippable"]]
    assert m["best_int8"] in shippable and set(m["int8_not_shippable"]) == {"int8-paddle", "int8-onnx"} - set(shippable)
    ops = m["variants"]["int8-paddle"]["engine_info"]["onednn_int8_ops"]
    assert (ops == "all") == cpu.int8_exact("paddle_inference")


@pytest.mark.slow
def test_the_other_cpu_class_branch_forced(exported, tmp_path):
    """As on a CPU without VNNI, on any CPU: PIPE_INT8_CAPABILITY=saturating, and ONEDNN_MAX_CPU_ISA=AVX2 so
    oneDNN really runs its AVX2 kernels. Paddle int8 runs with fc/matmul left in fp32 and its status follows
    the unreliable rule; a full-range int8 ONNX (compress.reduce_range=false) is loaded with
    session.x64quantprecision=1, which the table says."""
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(run / "export"), "--int8",
                           "--set", "compress.reduce_range=false", "--set", "compress.latency_runs=20",
                           "--set", "compress.throughput_runs=5"], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200",
                                                PIPE_INT8_CAPABILITY="saturating", ONEDNN_MAX_CPU_ISA="AVX2"))
    assert proc.returncode in (0, 4), proc.stderr
    assert "int8 SATURATES" in proc.stdout and "forced by PIPE_INT8_CAPABILITY=saturating" in proc.stdout
    if proc.returncode == 4:  # then no int8 variant was within budget: the gate says why, nothing written
        assert "no int8 variant within budget on this CPU" in proc.stderr and not (run / "compress").exists()
        return
    m = _manifest(run / "compress")["metrics"]
    assert m["cpu"]["forced"] == "saturating" and m["cpu"]["onednn_max_cpu_isa"] == "AVX2"
    paddle_v, onnx_v = m["variants"]["int8-paddle"], m["variants"]["int8-onnx"]
    ops = set(paddle_v["engine_info"]["onednn_int8_ops"])
    assert "conv2d" in ops and not ops & {"fc", "matmul", "matmul_v2", "mul"}
    assert paddle_v["status"] == "ok" or paddle_v["status"].startswith(("unreliable on this CPU: ", "below budget: "))
    if paddle_v["status"] == "ok":
        assert paddle_v["faster_than_fp32"] and paddle_v["top1_agreement"] >= 0.99
    assert onnx_v["engine_info"]["x64quantprecision"] is True and onnx_v["engine_info"]["int8_weight_range"] == "full"
    assert "int8-onnx: int8 with full-range weights on a CPU whose int8 saturates: session.x64quantprecision=1" \
        in proc.stdout
    assert m["onnxruntime_reduce_range"] is False
    # OpenVINO's own probe really saturates on oneDNN's AVX2 kernels, and the full-range file gets its note
    assert m["cpu"]["int8_exact"]["openvino"] is False and m["cpu"]["probe_openvino"]["got"] == 1048544
    ov = m["variants"]["openvino-int8"]["engine_info"]
    assert ov["int8_weight_range"] == "full" and "OpenVINO has no exact mode for it" in ov["note"]
    bf16 = m["variants"]["bf16"]  # oneDNN kept off its bf16 kernels, as on a CPU without avx512_bf16
    # (a CPU without avx512_bf16, e.g. an AVX2 EPYC, says that first)
    assert not bf16["supported"] and bf16["reason"] in (
        "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN off its bf16 kernels",
        "this CPU has no avx512_bf16/amx_bf16: oneDNN bf16 kernels cannot run here")


@pytest.mark.slow
def test_agreement_gate_exit_4(compressed, exported, tmp_path, cli):
    """compress.min_agreement=1.0: int8 flips some of the 1,797 samples (measured by the passing run), so
    no int8 variant is within budget; exit 4 with the numbers, nothing written."""
    m = _manifest(compressed[0] / "compress")["metrics"]
    onnx = m["variants"]["int8-onnx"]
    assert onnx["top1_agreement"] < 1.0, "int8-onnx agreed on every sample: the gate needs another case"
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    code, out, err = cli("compress", run / "export", "--int8", "--backend", "onnxruntime",
                         "--set", "compress.min_agreement=1.0", "--set", "compress.latency_runs=20",
                         "--set", "compress.throughput_runs=5")
    assert code == 4, err
    assert err.startswith("pipe compress: int8 gate: no int8 variant within budget on this CPU (int8-onnx: "
                          "below budget: top-1 agreement "), err
    assert "< compress.min_agreement 1); CPU: " in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (run / "compress").exists() and _leftovers(run) == []


@pytest.mark.slow
def test_no_pickle_in_artifact(compressed):
    run, _ = compressed
    for rel in EXPECTED_FILES:
        assert not rel.endswith((".info", ".pkl", ".npy", ".pdparams"))
        assert (run / "compress" / rel).read_bytes()[:1] != b"\x80", f"{rel} looks like a pickle"


@pytest.mark.slow
def test_gate_fails_exit_4_and_writes_nothing(compressed, exported, tmp_path, cli):
    """A real failing gate: no mock, no fault hook.

    On the 2-epoch fixture int8 genuinely flips one of 269 test samples (0.37 points, measured by the
    passing run above, onnxruntime route). `--max-drop 0` admits no drop at all, so the same
    quantization must now fail with those numbers. The test first asserts the drop is non-zero, so it
    cannot pass vacuously if a later stack quantizes this model losslessly (then find another honest
    failure, e.g. a less trained fixture). --backend onnxruntime keeps it quick; an existing compress
    dir stays as it was."""
    m = _manifest(compressed[0] / "compress")["metrics"]
    onnx = m["variants"]["int8-onnx"]
    drop = (m["fp32_accuracy"] - onnx["accuracy"]) * 100
    assert drop > 0, "int8-onnx lost nothing on this fixture: the gate needs another honest failure"

    run = tmp_path / "run"
    shutil.copytree(exported, run)
    shutil.copytree(compressed[0] / "compress", run / "compress")
    before = tree_hash(run / "compress")
    code, out, err = cli("compress", run / "export", "--int8", "--backend", "onnxruntime", "--max-drop", "0")
    assert code == 4, err
    assert err.startswith("pipe compress: int8 gate: best int8 variant int8-onnx "), err
    assert f"{onnx['accuracy']:.2%} vs fp32 {m['fp32_accuracy']:.2%} on 269 test samples" in err
    assert f"drop {drop:.2f} points > max_drop 0" in err and err.endswith("; nothing written\n")
    assert err.count("\n") == 1 and "Traceback" not in err
    # the table shows what was measured, with the verdict the gate acted on: not "faster" (issue 51 item 4:
    # the table called a variant ok that package then refused)
    row = next(line for line in out.splitlines() if line.strip("│┃ ").startswith("int8-onnx "))
    assert "over budget" in row and "faster" not in row, row  # (its cell may wrap: "(below)" on the next line)
    assert f"int8-onnx: over budget: acc drop {drop:.2f} points > compress.max_drop 0\n" in out, out
    assert tree_hash(run / "compress") == before and _leftovers(run) == []


@pytest.mark.parametrize("target, expect", [
    ("train", "stage is 'train', expected export"),
    ("tampered", "sha256 mismatch for legacy/model.pdiparams"),
    ("missing", "missing file model.json"),
])
def test_wrong_input_exits_2_naming_the_file(exported, tmp_path, cli, target, expect):
    run = tmp_path / "run"
    shutil.copytree(exported, run, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    if target == "tampered":
        params = run / "export" / "legacy" / "model.pdiparams"
        blob = bytearray(params.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        params.write_bytes(bytes(blob))
        src = run / "export"
    elif target == "missing":
        (run / "export" / "model.json").unlink()
        src = run / "export"
    else:
        src = run / "train"
    code, _, err = cli("compress", src, "--int8")
    assert code == 2, err
    assert err.startswith(f"pipe compress: error: {src / 'manifest.json'}: ") and expect in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (run / "compress").exists() and _leftovers(run) == []


@pytest.mark.parametrize("args, expect", [
    ([], "nothing to do: pass --int8"),
    (["--int8", "--max-drop", "-1"], "--max-drop: must be >= 0, got -1.0"),
    (["--int8", "--backend", "tensorrt"], "--backend: must be one of paddle, onnxruntime, both, openvino, got 'tensorrt'"),
    (["--int8", "--backend", "openvino"], "--backend openvino: OpenVINO's own int8 route (NNCF with a per-layer search) "
                                          "is for ocr_rec models so far"),
    (["--int8", "--algo", "max"], "--algo: must be one of avg, KL, hist, mse, got 'max'"),
    (["--int8", "--calib-batches", "1000"], "--calib-batches 1000 (compress.calib_batches) x compress.calib_batch_size "
                                            "32 = 32000 samples, but the train split has"),
])
def test_bad_flags_exit_2(exported, tmp_path, cli, args, expect):
    run = tmp_path / "run"
    shutil.copytree(exported / "export", run / "export")
    code, _, err = cli("compress", run / "export", *args)
    assert code == 2, err
    assert expect in err and err.count("\n") == 1, err
    assert not (run / "compress").exists() and _leftovers(run) == []


def test_compress_help_imports_no_engine():
    code = ("import sys; from pipeline.cli import main; main(['compress', '--help']); "
            "print('paddle' in sys.modules, 'onnxruntime' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--int8" in proc.stdout and "--max-drop" in proc.stdout
    assert proc.stdout.strip().endswith("False False")


@pytest.mark.slow
def test_distill_then_int8_quantizes_the_student(exported, tmp_path, cli):
    """`--distill --student mlp --baseline --int8`: the student is trained from the export's model through
    `pipe train`, exported (parity-gated), measured against its own baseline and quantized. The gain is
    recorded as measured: on digits the MLP student did not beat its baseline (see the README)."""
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    args = ["compress", run / "export", "--distill", "--student", "mlp", "--baseline", "--int8",
            "--backend", "onnxruntime", "--set", "train.epochs=2", "--set", "compress.latency_runs=20",
            "--set", "compress.throughput_runs=5",
            # The 2-epoch MLP student's int8 agreed with its fp32 on 0.9900 of digits (measured): at the edge
            # of the default budget. This test is about distillation's lineage, not that budget.
            "--set", "compress.min_agreement=0.97"]
    code, out, err = cli(*args)
    assert code == 0, err
    m = _manifest(run / "compress")
    d = m["metrics"]["distill"]
    teacher = _manifest(run / "train")["metrics"]["test_acc"]
    student = _manifest(run / "student-mlp" / "train")
    baseline = _manifest(run / "student-mlp-baseline" / "train")
    assert d["teacher_test_acc"] == teacher and d["student_test_acc"] == student["metrics"]["test_acc"]
    assert d["baseline_test_acc"] == baseline["metrics"]["test_acc"]
    assert d["gain_points"] == pytest.approx((d["student_test_acc"] - d["baseline_test_acc"]) * 100)
    assert student["config"]["distill"]["teacher"] == str((run / "train").resolve())
    assert baseline["config"]["distill"]["teacher"] == ""
    # what was quantized is the student: compress -> student export -> student train
    chain = [a.path.resolve() for a, _ in artifacts.lineage(artifacts.verify(run / "compress", ("compress",)))]
    assert chain == [(run / p).resolve() for p in ("compress", "student-mlp/export", "student-mlp/train")]
    assert m["metrics"]["fp32_accuracy"] == pytest.approx(student["metrics"]["test_acc"])
    assert "int8-onnx" in m["metrics"]["variants"] and "distill: teacher digits_cnn" in out
    # a second run reuses both trainings instead of refusing their checkpoints
    code, out, err = cli(*args)
    assert code == 0, err
    assert out.count("already trained with this config, reused") == 2


def test_distill_needs_a_student(exported, cli):
    code, _, err = cli("compress", exported / "export", "--distill")
    assert code == 2 and "--student" in err


def _small_split(tmp_path: Path, n: int):
    """The first `n` digits as a user's own .npz (15% val and test carved out), loaded and prepared as compress does."""
    from pipeline import config as config_mod, data as data_mod, iospec
    from stages import compress as stage

    z = np.load(REPO / "pipeline/assets/digits.npz")
    np.savez(tmp_path / "small.npz", x=z["x"][:n], y=z["y"][:n])
    ds = data_mod.load(config_mod.load(None, [f"data.source={tmp_path / 'small.npz'}"]).data)
    desc = iospec.IO(ds.inputs(), (iospec.Tensor("logits", "float32", (-1, 10), role="logits"),))
    return ds, stage._preparer(ds, {"desc": desc, "pre": ds.preprocessing})


@pytest.mark.parametrize("n, batches, thin", [(300, 6, False), (60, 1, True)])
def test_calibration_takes_what_a_small_train_split_has(tmp_path, capsys, n, batches, thin):
    """By default compress calibrates on up to 10 whole batches, fewer for a small train split, all of it when
    it is smaller than one batch; under 100 samples it warns and goes on. Today's main refused 300 samples."""
    from pipeline import config as config_mod
    from stages import compress as stage

    ds, prep = _small_split(tmp_path, n)
    (x,) = stage._calibration_batches(ds, prep, config_mod.CompressConfig(int8=True)).values()
    assert x.shape[:2] == (batches, 32) and len(ds.train) // 32 == batches
    assert ("fewer than 100 may set poor ranges" in capsys.readouterr().err) == thin
    (x,) = stage._calibration_batches(ds, prep, config_mod.CompressConfig(int8=True, calib_batch_size=512)).values()
    assert x.shape[:2] == (1, len(ds.train))  # one batch of the whole split
    with pytest.raises(Exception, match=r"--calib-batches 11 .* but the train split has"):
        stage._calibration_batches(ds, prep, config_mod.CompressConfig(int8=True, calib_batches=11))
