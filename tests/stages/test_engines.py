"""The engine layer end to end on a real 2-epoch digits model: `pipe compress` measures Paddle Inference,
onnxruntime and OpenVINO; `pipe package --engine auto` ships what `pipeline/choose.py`'s rule says (checked
here against the rule written out independently); one package per engine is served by a real `pipe serve`
and its /v1 outputs are checked against the package's reference set; `pipe serve --engine` overrides when
the files allow and refuses in one line when not; bad engine input exits 2 writing nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import cpu, engines, reference
from pipeline.cli import main
from pipeline.serving import spec as spec_mod
from tests.serving_helpers import start_server
from tests.conftest import arrays

REPO = Path(__file__).resolve().parents[2]
ENGINE_OF = {"paddle": "paddle_inference", "onnxruntime": "onnxruntime", "openvino": "openvino"}


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture(scope="module")
def comp(trained_digits, tmp_path_factory) -> Path:
    """RUN/export and RUN/compress (--int8: every engine) of a copy of the shared digits run."""
    run = tmp_path_factory.mktemp("engines") / "run"
    shutil.copytree(trained_digits, run)
    assert main(["export", str(run / "train")]) == 0
    assert main(["compress", str(run / "export"), "--int8", "--set", "compress.latency_runs=60",
                 "--set", "compress.throughput_runs=12"]) == 0
    return run / "compress"


@pytest.fixture(scope="module")
def packages(comp, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-packages")
    out = {}
    for flag in ("auto", "paddle", "onnxruntime", "openvino"):
        out[flag] = root / flag
        assert main(["package", str(comp), "--engine", flag, "--out", str(out[flag])]) == 0
    return out


@pytest.mark.slow
def test_compress_measures_all_three_engines(comp):
    variants = _manifest(comp)["metrics"]["variants"]
    exp = _manifest(comp.parent / "export")
    assert {v["engine"] for v in variants.values()} == {"paddle_inference", "onnxruntime", "openvino"}
    ov32, ov8 = variants["openvino-fp32"], variants["openvino-int8"]
    assert (ov32["format"], ov32["source"], ov32["files"]) == ("legacy", "export", [exp["legacy"]["model"],
                                                                                   exp["legacy"]["params"]])
    assert (ov8["format"], ov8["source"], ov8["files"]) == ("onnx", "compress", ["int8-onnx/model.onnx"])
    for v in (ov32, ov8):
        assert v["supported"] and v["status"] == "ok", v.get("status")
        assert v["engine_info"]["engine"] == "openvino" and v["engine_info"]["hint"] == "LATENCY"
        assert v["latency_ms_p50_bs1"] > 0 and v["items_per_s_batch"] > 0 and v["size_bytes"] > 0
    assert ov32["max_abs_diff"] < 1e-3  # measured 1.9e-6 (facts note section 13)
    assert ov32["top1_agreement"] == 1.0  # fp32 on another engine: the same argmax on every sample
    assert ov32["size_bytes"] == sum(exp["files"][f]["bytes"] for f in ov32["files"])


@pytest.mark.slow
def test_every_engine_runs_the_contract(comp):
    """load -> run -> describe on each engine's own files reproduces compress's recorded accuracy."""
    from pipeline import config as config_mod, data as data_mod

    m = _manifest(comp)
    ds = data_mod.load(config_mod.from_dict(m["config"]).data)
    x, y = arrays(ds.test)
    x = np.ascontiguousarray(data_mod.prepare(x, m["interface"]["preprocessing"]))
    exp = comp.parent / "export"
    for name in ("onnx-fp32", "int8-onnx", "openvino-fp32", "openvino-int8"):
        v = m["metrics"]["variants"][name]
        base = exp if v["source"] == "export" else comp
        eng = engines.ENGINES[v["engine"]].load([base / f for f in v["files"]], threads=1, precision=v["precision"])
        info = eng.describe()
        assert {"engine", "version", "precision", "threads", "device", "files"} <= set(info), info
        assert (info["engine"], info["precision"], info["threads"], info["device"]) == (v["engine"], v["precision"],
                                                                                      1, "cpu")
        assert eng.inputs == ["x"] and len(eng.outputs) == 1
        (out,) = eng.outputs
        got = np.concatenate([eng.run({"x": x[i:i + 64]})[out] for i in range(0, len(x), 64)])
        assert got.shape == (len(x), 10) and got.dtype == np.float32
        assert float((got.argmax(1) == y).mean()) == pytest.approx(v["accuracy"], abs=1e-12), name


def _expected_pick(variants: dict, optimize: str, max_drop: float) -> str:
    """pipeline/choose.py's rule for --engine auto, written out again from its docstring."""
    ref = variants["fp32"]["accuracy"]

    def score(v: dict) -> float:
        s1, s32 = v["speedup_bs1"], v["speedup_batch"]
        return {"balanced": math.sqrt(s1 * s32), "latency": s1, "throughput": s32}[optimize]

    def other_ok(v: dict) -> bool:
        other = {"balanced": (v["speedup_bs1"], v["speedup_batch"]), "latency": (v["speedup_batch"],),
                 "throughput": (v["speedup_bs1"],)}[optimize]
        return min(other) >= 1 / 1.05

    ok = {n: v for n, v in variants.items() if v["supported"] and v["shippable"]
          and (ref - v["accuracy"]) * 100 <= max_drop + 1e-9}
    faster = [n for n, v in ok.items() if n != "fp32" and score(v) >= 1.05 and other_ok(v)]
    return max(faster, key=lambda n: score(ok[n])) if faster else "fp32"


@pytest.mark.slow
@pytest.mark.parametrize("optimize", ["balanced", "latency", "throughput"])
def test_auto_ships_what_the_rule_says(comp, tmp_path, capsys, optimize):
    m = _manifest(comp)
    want = _expected_pick(m["metrics"]["variants"], optimize, m["config"]["compress"]["max_drop"])
    out = tmp_path / "pkg"
    assert main(["package", str(comp), "--optimize", optimize, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    doc = yaml.safe_load((out / "serving.yaml").read_text())
    v = m["metrics"]["variants"][want]
    assert doc["model"]["variant"] == want and doc["model"]["engine"] == v["engine"]
    assert doc["engine"]["optimize"] == optimize and doc["engine"]["chosen"] == "auto"
    assert f"package: {want} on {v['engine']} (" in said and f"by {optimize}" in said
    pm = _manifest(out)
    assert pm["engine"] == v["engine"] and pm["chosen"]["optimize"] == optimize and pm["chosen"]["why"]


@pytest.mark.slow
def test_one_package_per_engine_files_and_spec(packages, comp):
    variants = _manifest(comp)["metrics"]["variants"]
    for flag, pkg in packages.items():
        doc = yaml.safe_load((pkg / "serving.yaml").read_text())
        engine = doc["model"]["engine"]
        if flag != "auto":
            assert engine == ENGINE_OF[flag]
        fmt = doc["model"]["format"]
        assert fmt in engines.FORMATS[engine] and variants[doc["model"]["variant"]]["engine"] == engine
        want = {"pir": {"model.json", "model.pdiparams"}, "legacy": {"model.pdmodel", "model.pdiparams"},
                "onnx": {"model.onnx"}}[fmt]
        held = {p.name for p in pkg.iterdir() if p.name.startswith("model.")}
        assert held == want, (flag, held)
        # the Triton repository's io names are the served ones: one v2 request works on both servers
        pbtxt = (pkg / "triton/digits_cnn/config.pbtxt").read_text()
        assert f'name: "{doc["inputs"][0]["name"]}"' in pbtxt and f'name: "{doc["outputs"][0]["name"]}"' in pbtxt
        check = _manifest(pkg)["metrics"]["reference"]
        assert check["engine"]["engine"] == engine and check["top1_agreement"] >= check["min_agreement"]


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["paddle", "onnxruntime", "openvino"])
def test_served_per_engine_matches_its_reference_set(packages, flag):
    """A real `pipe serve` of each engine's package: /v1 logits on the reference inputs agree with the fp32
    outputs stored in the package (top-1 within its budget) and equal the engine run directly here."""
    pkg = packages[flag]
    spec = spec_mod.load_package(pkg)
    (x,), (y,) = (list(d.values()) for d in reference.load_set(pkg / reference.FILE, spec.io))
    budget = yaml.safe_load((pkg / "serving.yaml").read_text())["reference"]["min_agreement"]
    srv = start_server(pkg)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            info = c.get("/v1/model").json()
            assert info["engine"]["engine"] == ENGINE_OF[flag] and info["reference_check"]["passed"] is True
            got = np.concatenate([np.asarray(c.post("/v1/predict", json={"inputs": x[i:i + 32].tolist()}).json()["logits"],
                                             np.float32) for i in range(0, len(x), 32)])
    finally:
        assert srv.stop() == 0
    assert got.shape == y.shape
    agree = float((got.argmax(1) == y.argmax(1)).mean())
    assert agree >= budget, (flag, agree)
    assert f"on {ENGINE_OF[flag]} " in "".join(srv.out)


@pytest.mark.slow
def test_serve_engine_override(packages, cli):
    """An ONNX package runs on OpenVINO as well as onnxruntime; Paddle cannot read it: one line, exit 2."""
    pkg = packages["onnxruntime"]
    srv = start_server(pkg, "--engine", "openvino")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/v1/model").json()["engine"]["engine"] == "openvino"
    finally:
        assert srv.stop() == 0
    code, _, err = cli("serve", pkg, "--port", "0", "--engine", "paddle")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "holds model.onnx" in err and "paddle_inference does not run" in err and "onnxruntime, openvino" in err
    code, _, err = cli("serve", pkg, "--port", "0", "--engine", "tensorrt")
    assert code == 2 and "--engine: unknown engine 'tensorrt'" in err


@pytest.mark.parametrize("args,needle", [
    (["--engine", "tensorrt"], "--engine: unknown engine 'tensorrt'"),
    (["--optimize", "fast"], "--optimize: must be one of balanced, latency, throughput"),
    (["--variant", "int4"], "--variant int4: "),
    (["--engine", "onnxruntime", "--precision", "bf16"], "no variant with engine onnxruntime precision bf16 was measured"),
    (["--engine", "openvino", "--variant", "int8-onnx"], "--engine openvino: variant int8-onnx runs onnxruntime"),
])
def test_bad_engine_input_exits_2_writing_nothing(comp, tmp_path, cli, args, needle):
    code, _, err = cli("package", comp, "--out", tmp_path / "p", *args)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "p").exists()


def test_an_engine_whose_library_is_missing(comp, tmp_path, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    code, _, err = cli("package", comp, "--engine", "openvino", "--out", tmp_path / "p")
    assert code == 2 and "--engine openvino: openvino is not installed" in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()
    # auto skips an engine it cannot import, and says so
    code, out, _ = cli("package", comp, "--out", tmp_path / "q", "--no-triton")
    assert code == 0 and "openvino is not installed" in out


def test_openvino_int8_probe_sees_the_avx2_kernels(tmp_path):
    """OpenVINO's own probe: exact here, and the saturated sum when oneDNN is held to AVX2 (what an
    AVX2-only CPU computes); the verdict is the probe, not the flags."""
    code = "from pipeline import cpu; c = cpu.capability(); print(c['probe_openvino']['got'], c['int8_exact']['openvino'])"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(cpu.FORCE_ENV, None)
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    avx2 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert avx2.stdout.split() == ["1048544", "False"], avx2.stderr[-500:]
    vnni = any(f in cpu.flags() for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    assert here.stdout.split() == (["2072640", "True"] if vnni else ["1048544", "False"]), here.stderr[-500:]


@pytest.mark.parametrize("flag,needle", [
    ("paddle", "--device gpu:0: Paddle Inference: this paddle build sees 0 CUDA device(s)"),
    ("onnxruntime", "--device gpu:0: onnxruntime: this onnxruntime has no CUDAExecutionProvider"),
    ("openvino", "--device gpu:0: OpenVINO: not among its devices here (CPU"),
])
@pytest.mark.slow
def test_serve_device_gpu_is_the_same_path_and_refused_here(packages, cli, flag, needle):
    """No GPU here: each engine's GPU branch runs up to its device check and refuses in one line, exit 2.
    (What it would do on a GPU has not been run by us.)"""
    if engines.missing(ENGINE_OF[flag]) or flag == "paddle" and _paddle_sees_a_gpu():
        pytest.skip("this machine has what the GPU path needs; the refusal cannot be checked here")
    code, _, err = cli("serve", packages[flag], "--port", "0", "--device", "gpu:0")
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    code, _, err = cli("serve", packages[flag], "--port", "0", "--device", "tpu")
    assert code == 2 and "--device: expected cpu, gpu or gpu:N, got 'tpu'" in err


def _paddle_sees_a_gpu() -> bool:
    import paddle

    return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def test_from_an_export(comp, tmp_path, cli):
    """An export measures no engine: auto is Paddle Inference; OpenVINO runs its legacy program (checked
    against the reference set at package time); onnxruntime needs an ONNX the export does not have."""
    exp = comp.parent / "export"
    code, out, err = cli("package", exp, "--engine", "openvino", "--out", tmp_path / "ov", "--no-triton")
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "ov/serving.yaml").read_text())
    assert (doc["model"]["engine"], doc["model"]["format"], doc["model"]["program"]) == ("openvino", "legacy",
                                                                                      "model.pdmodel")
    assert "reference check: 256 samples" in out and "on openvino fp32 here" in out
    code, _, err = cli("package", exp, "--engine", "onnxruntime", "--out", tmp_path / "ort")
    assert code == 2 and err.count("\n") == 1 and f"--engine onnxruntime: {exp} holds no file it runs" in err
    assert "pipe export --onnx" in err and not (tmp_path / "ort").exists()
    code, _, err = cli("package", exp, "--variant", "int8-onnx", "--out", tmp_path / "v")
    assert code == 2 and "--variant int8-onnx: names a compress variant" in err
