"""`pipe compress` of a model with two named inputs and two outputs (examples/two_inputs.yaml: `img` and
`feat` in, `embedding` and `logits` out): PaddleSlim and onnxruntime calibrated by name, every variant on
all three engines measured on every output (SQNR per float output, top-1 agreement on the logits), the
SQNR budget naming the output, and distillation. Real PaddleSlim, paddle2onnx, onnxruntime and OpenVINO.

Measured on this machine (10 epochs, 4 calibration batches, avg): embedding SQNR int8-onnx and
openvino-int8 34.6 dB (agreement 0.997), int8-paddle 15.0 dB (0.987: oneDNN's int8 fc; fake-quant of the
same file 37 dB), bf16 51.6 dB, onnx-fp32 143 dB, openvino-fp32 on the legacy program identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import artifacts, config as config_mod, data as data_mod, engines, iospec
from pipeline.cli import main
from tests.conftest import REPO, tree_hash

pytestmark = pytest.mark.slow(reason="each test compresses a two-input model trained here (~21 CPU-s first)")
YAML = REPO / "examples" / "two_inputs.yaml"
CALIB_BATCHES = 4
FAST = ["--calib-batches", str(CALIB_BATCHES), "--set", "compress.latency_runs=20",
        "--set", "compress.throughput_runs=5"]
VARIANTS = ["fp32", "bf16", "int8-paddle", "onnx-fp32", "int8-onnx", "openvino-fp32", "openvino-int8"]
MIN_INT8_AGREEMENT = 0.95  # measured 0.987-0.997 (above): a model fed in the wrong order is near chance


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch):
    """The example's factories resolve from the repo root: here and in compress's child processes."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(REPO))
    run = tmp_path_factory.mktemp("compress-multi-io") / "run"
    try:
        assert main(["train", "--config", str(YAML), "--run", str(run)]) == 0
        assert main(["export", str(run / "train"), "--onnx"]) == 0
    finally:
        mp.undo()
    return run


@pytest.fixture(scope="module")
def compressed(exported, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`pipe compress --int8 --backend both` as a user runs it (OpenVINO on by default)."""
    run = tmp_path_factory.mktemp("compress-multi-io-c") / "run"
    shutil.copytree(exported, run)
    before = tree_hash(run / "export")
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(run / "export"), "--int8",
                           "--backend", "both", *FAST], capture_output=True, text=True, cwd=REPO, timeout=900,
                          env=dict(_env(), COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    assert tree_hash(run / "export") == before, "compress must not touch its input"
    return run, proc


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _data(m: dict) -> data_mod.Dataset:
    return data_mod.load(config_mod.from_dict(m["config"]).data)


def test_every_variant_measured_on_every_output(compressed):
    run, proc = compressed
    m = _manifest(run / "compress")
    met, variants = m["metrics"], m["metrics"]["variants"]
    assert list(variants) == VARIANTS and m["interface"] == _manifest(run / "export")["interface"]
    assert (met["logits_output"], met["sqnr_budget_outputs"], met["min_sqnr_db"]) == ("logits", ["embedding"], 20.0)
    assert met["agreement_samples"] == 384 and met["test_samples"] == 64  # every split of 256/64/64
    for name, v in variants.items():
        if not v["supported"]:
            assert v["fidelity"] is None and v["status"].startswith("unsupported: "), name
            continue
        f = v["fidelity"]
        assert set(f) == {"embedding", "logits"}, name
        for out in f.values():
            assert set(out) == {"sqnr_db", "max_abs_diff"} and out["max_abs_diff"] >= 0, name
            assert out["sqnr_db"] is None if out["max_abs_diff"] == 0 else np.isfinite(out["sqnr_db"]), name
        assert v["max_abs_diff"] == f["logits"]["max_abs_diff"] and v["agreement_samples"] == 384, name
        agree, db = v["top1_agreement"], f["embedding"]["sqnr_db"]
        below = name != "fp32" and (agree < 0.99 or (db is not None and db < 20.0))
        assert v["status"].startswith("below budget: ") == below and v["shippable"] == (v["status"] == "ok"), \
            (name, v["status"])
        if name != "fp32" and agree >= 0.99 and db is not None and db < 20.0:
            assert v["status"] == f"below budget: output 'embedding' SQNR {db:.1f} dB < compress.min_sqnr_db 20"
    assert variants["fp32"]["fidelity"] == {"embedding": {"sqnr_db": None, "max_abs_diff": 0.0},
                                            "logits": {"sqnr_db": None, "max_abs_diff": 0.0}}
    for name in ("onnx-fp32", "openvino-fp32"):  # conversions: the same numbers up to float rounding
        f = variants[name]["fidelity"]
        assert variants[name]["top1_agreement"] == 1.0, name
        assert all(o["sqnr_db"] is None or o["sqnr_db"] > 90 for o in f.values()), (name, f)
    for name in ("int8-paddle", "int8-onnx", "openvino-int8"):  # every int8 variant calibrated and fed right
        v = variants[name]
        assert v["supported"] and v["precision"] == "int8", name
        assert v["top1_agreement"] >= MIN_INT8_AGREEMENT, (name, v["top1_agreement"])
        assert v["fidelity"]["embedding"]["sqnr_db"] > 10, (name, v["fidelity"])
    assert met["best_int8"] in ("int8-onnx", "openvino-int8") and variants[met["best_int8"]]["shippable"]
    assert met["onnx_parity_max_abs_diff"] == variants["onnx-fp32"]["max_abs_diff"]
    # the table has a column per budgeted output, and says why a variant is below budget
    assert proc.stderr == "", proc.stderr
    assert "(agree, max|diff| of logits, SQNR dB of embedding: 384 samples of all splits)" in proc.stdout
    rows = {ln.split("│")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.startswith("│ ") and ln[2] != " "}
    assert "exact" in rows["fp32"] and f"{variants['int8-onnx']['fidelity']['embedding']['sqnr_db']:.1f}" in rows["int8-onnx"]
    for name, v in variants.items():
        if v["supported"] and v["status"] != "ok":
            assert f"{name}: {v['status']}" in proc.stdout


def test_calibration_by_name_and_float_inputs_keep_the_default_op_types(compressed):
    """The recorded calibration is the seeded draw from the TRAIN split, every input of a sample together,
    prepared as at training time (recomputed here); float inputs only: onnxruntime's default op types."""
    run, _ = compressed
    m = _manifest(run / "compress")
    calib = m["metrics"]["calibration"]
    assert (calib["split"], calib["batches"], calib["batch_size"]) == ("train", CALIB_BATCHES, 32)
    assert calib["onnxruntime_op_types"] == "default" and calib["dtype"] == "float32/float32"
    assert calib["onnxruntime_op_types_rule"] == "float inputs only: onnxruntime's default op types"
    ds = _data(m)
    need = CALIB_BATCHES * 32
    pick = np.sort(np.random.default_rng(calib["seed"]).permutation(len(ds.train))[:need])
    feeds = ds.train.feeds(pick, m["interface"]["preprocessing"])
    assert list(feeds) == list(calib["inputs"]) == ["img", "feat"]
    digest = hashlib.sha256()
    for name, a in feeds.items():
        a = np.ascontiguousarray(a, np.float32)
        assert calib["inputs"][name] == {"dtype": "float32", "shape": [-1, *a.shape[1:]],
                                         "sha256": hashlib.sha256(a.tobytes()).hexdigest()}, name
        digest.update(a.tobytes())
    assert digest.hexdigest() == calib["inputs_sha256"]


def test_each_engine_keeps_its_own_names_and_answers_by_name(compressed):
    """OpenVINO lists the legacy program's inputs reversed; the manifest records each engine's own names,
    and fresh sessions on the committed ONNX files, fed by name with the inputs given in reversed order,
    reproduce the recorded accuracies."""
    import onnxruntime as ort

    run, _ = compressed
    out, m = run / "compress", _manifest(run / "compress")
    variants = m["metrics"]["variants"]
    assert variants["openvino-fp32"]["files"] == ["legacy/model.pdmodel", "legacy/model.pdiparams"]
    assert variants["openvino-fp32"]["inputs"] == ["feat", "img"]  # reversed (facts note section 14)
    for name in ("fp32", "int8-paddle", "onnx-fp32", "int8-onnx"):
        assert variants[name]["inputs"] == ["img", "feat"], name
    assert variants["int8-onnx"]["outputs"] == ["fetch_name_0", "fetch_name_1"]
    ds = _data(m)
    feeds = ds.test.feeds(np.arange(len(ds.test)), m["interface"]["preprocessing"])
    y = np.asarray(ds.test.y[ds.test.idx])
    for name in ("onnx-fp32", "int8-onnx"):
        v = variants[name]
        sess = ort.InferenceSession(str(out / v["files"][0]), providers=["CPUExecutionProvider"])
        got = dict(zip(v["outputs"], sess.run(None, {"feat": feeds["feat"], "img": feeds["img"]})))
        assert got["fetch_name_1"].shape == (len(y), 4) and got["fetch_name_0"].shape == (len(y), 16)
        assert float((got["fetch_name_1"].argmax(1) == y).mean()) == pytest.approx(v["accuracy"], abs=1e-12), name


def test_a_legacy_made_onnx_with_reversed_inputs_is_calibrated_and_run_by_name(compressed, tmp_path):
    """paddle2onnx of the LEGACY program lists the inputs reversed (feat, img). compress's onnxruntime route
    quantizes it with its calibration reader keyed by that file's own names: the int8 file, fed by name,
    agrees with Paddle fp32 (a model fed the wrong tensors would not)."""
    from pipeline import fidelity, quantize
    from pipeline.engines import ort as ort_engine, paddle as paddle_engine
    from stages import compress

    run, _ = compressed
    exp = artifacts.verify(run / "export", ("export",))
    legacy = exp.file("legacy/model.pdmodel")
    onnx32 = tmp_path / "legacy.onnx"
    proc = subprocess.run([sys.executable, "-m", "paddle2onnx.command", "--model_dir", str(legacy.parent),
                           "--model_filename", legacy.name, "--params_filename", "model.pdiparams",
                           "--save_file", str(onnx32), "--opset_version", "13", "--optimize_tool", "None"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=_env())
    assert proc.returncode == 0 and onnx32.is_file(), proc.stderr[-2000:]
    assert ort_engine.load([onnx32], threads=1).inputs == ["feat", "img"]

    io = compress._read_export(exp)
    ds = data_mod.load(config_mod.from_dict(exp.manifest["config"]).data)
    prep = compress._preparer(ds, io)
    ccfg = config_mod.CompressConfig(int8=True, calib_batches=CALIB_BATCHES)
    quantize.int8_onnx(onnx32, io, quantize.split_batches(compress._calibration_batches(ds, prep, ccfg)), ccfg, tmp_path / "q", 1)
    int8 = tmp_path / "q" / "model.onnx"
    assert ort_engine.load([int8], threads=1, precision="int8").inputs == ["feat", "img"]

    desc = io["desc"]
    pir = [exp.file("model.json"), exp.file("model.pdiparams")]
    ref = engines.bind(paddle_engine.load(pir, threads=1), desc, str(pir[0]))
    got = engines.bind(ort_engine.load([int8], threads=1, precision="int8"), desc, str(int8))
    chunks = list(compress.fidelity_batches(ds, prep))
    refs = [ref(f) for f in chunks]
    fid = fidelity.measure((got(f) for f in chunks), refs, "logits", "legacy int8")
    agree = float((fid["top"] == np.concatenate([r["logits"].argmax(1) for r in refs])).mean())
    assert agree >= MIN_INT8_AGREEMENT and fid["outputs"]["embedding"]["sqnr_db"] > 20, (agree, fid["outputs"])


def test_an_output_below_the_sqnr_budget_is_named_and_nothing_within_budget_exits_4(exported, tmp_path, cli):
    """compress.min_sqnr_db=200: no int8 embedding is that close to fp32 (measured ~35 dB), so every int8
    variant is below budget naming the output; exit 4 in one line, nothing written."""
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    code, out, err = cli("compress", run / "export", "--int8", "--backend", "onnxruntime", *FAST,
                         "--set", "compress.min_sqnr_db=200")
    assert code == 4, err
    assert err.startswith("pipe compress: int8 gate: no int8 variant within budget on this CPU (int8-onnx: "
                          "below budget: output 'embedding' SQNR "), err
    assert "dB < compress.min_sqnr_db 200; openvino-int8: below budget: output 'embedding' SQNR " in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "int8-onnx: below budget: output 'embedding' SQNR" in out  # the table still shows what was measured
    assert not (run / "compress").exists()


def test_distill_a_two_input_teacher_into_a_factory_student(exported, tmp_path, cli):
    """--distill on a two-input export: the student (a module:factory taking both inputs) is trained through
    `pipe train` from the teacher, exported and quantized; a built-in image student is refused in one line."""
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    code, _, err = cli("compress", run / "export", "--distill", "--student", "mlp", "--int8")
    assert code == 2 and err.count("\n") == 1, err
    assert "--student mlp: a built-in image model takes one input, the teacher's export takes 2 (img, feat)" in err
    assert not (run / "student-mlp").exists()

    student = "examples.two_inputs.model:build"
    code, out, err = cli("compress", run / "export", "--distill", "--student", student, "--int8",
                         "--backend", "onnxruntime", "--set", "train.epochs=3", *FAST,
                         "--set", "compress.min_agreement=0.95")
    assert code == 0, err
    m = _manifest(run / "compress")
    d = m["metrics"]["distill"]
    tag = "examples-two_inputs-model-build"
    assert d["student"] == student and Path(d["student_dir"]) == run / f"student-{tag}"
    chain = [a.path.resolve() for a, _ in artifacts.lineage(artifacts.verify(run / "compress", ("compress",)))]
    assert chain == [(run / p).resolve() for p in ("compress", f"student-{tag}/export", f"student-{tag}/train")]
    desc = iospec.IO.from_interface(m["interface"])
    assert [t.public for t in desc.inputs] == ["img", "feat"] and [t.public for t in desc.outputs] == ["embedding", "logits"]
    assert set(m["metrics"]["variants"]["int8-onnx"]["fidelity"]) == {"embedding", "logits"}


def test_the_other_cpu_class_branch_forced_on_two_inputs(exported, tmp_path):
    """The two-input model compressed as on a CPU without VNNI (PIPE_INT8_CAPABILITY=saturating, and oneDNN
    really on its AVX2 kernels): Paddle int8 leaves fc/matmul in fp32, every variant still gets its
    per-output fidelity by name, and bf16 is refused with the reason (AVX2 has no bf16 kernels)."""
    run = tmp_path / "run"
    shutil.copytree(exported, run)
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(run / "export"), "--int8",
                           "--backend", "both", *FAST], capture_output=True, text=True, cwd=REPO, timeout=900,
                          env=dict(_env(), COLUMNS="200", PIPE_INT8_CAPABILITY="saturating", ONEDNN_MAX_CPU_ISA="AVX2"))
    assert proc.returncode in (0, 4), proc.stderr
    assert "forced by PIPE_INT8_CAPABILITY=saturating" in proc.stdout
    if proc.returncode == 4:  # no int8 variant within budget on this class: the gate says so, nothing written
        assert "no int8 variant within budget on this CPU" in proc.stderr and not (run / "compress").exists()
        return
    m = _manifest(run / "compress")["metrics"]
    assert m["cpu"]["forced"] == "saturating" and m["cpu"]["onednn_max_cpu_isa"] == "AVX2"
    ops = set(m["variants"]["int8-paddle"]["engine_info"]["onednn_int8_ops"])
    assert ops and not ops & {"fc", "matmul", "matmul_v2", "mul"}
    for name in ("int8-onnx", "openvino-int8", "int8-paddle"):
        v = m["variants"][name]
        assert set(v["fidelity"]) >= {"embedding"} and 0.0 <= v["top1_agreement"] <= 1.0, name
    assert m["variants"]["bf16"]["status"].startswith("unsupported")
