"""pipe compress on the real PP-OCRv4 recognizer, imported with 300 generated lines (45 val, 45 test): every
variant is measured on the task's own width-bucketed batches; OpenVINO's int8 comes from NNCF with a per-layer
search that puts the layers whose quantization costs line accuracy on the val split back in fp32 (recorded),
onnxruntime's plain QDQ int8 is measured and refused with its figures (it loses tens of points on this model);
`pipe package` then ships the fastest variant within budget, and the server answers with it."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline import artifacts, choose, config as config_mod, cpu, engines, iospec, quantize
from pipeline.cli import main
from pipeline.engines import openvino as ov_engine
from pipeline.tasks import ocr_rec
from tests.serving_helpers import start_server
from tests.stages.test_serve_ocr_rec import _png

# Its fixture (an import, then compress's NNCF search: ~2 min alone here, longer beside the other worker, and where
# int8 saturates the search puts back ~4x the layers) counts towards pytest-timeout's 600 s: a margin.
pytestmark = pytest.mark.timeout(1800)
# import.nfkc: the generated lines hold both the full-width and the ASCII forms of , ~ ( which the font draws
# alike, and on 45 test lines one line is 2.2 points, past max_drop 1. Without it, on an AMX Xeon (int8 exact), the
# search kept 4 layers in fp32 and read the 45 val lines as fp32 does, yet one test line came back "，" for ","
# (97.8% vs 100%: refused), a flip between two spellings of one glyph; with it, 100% vs 100%.
LINES = ["--set", "data.ocr_lines=300", "--set", "import.nfkc=true"]
# Timing only orders the variants for `pipe package` (openvino-int8 ran ~4x fp32 here); speed is `make bench`'s.
QUICK = ["--set", "compress.latency_runs=5", "--set", "compress.throughput_runs=1"]


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, rec_src, keys) -> tuple[Path, int, str]:
    """(the run folder, compress's exit code, its stderr). Peaks at 4.2 GB (onnxruntime's calibration once took it
    to 16 GB and needed a lock against the fine-tune beside it: quantize._ort_ranges)."""
    import contextlib
    import io

    d = tmp_path_factory.mktemp("ocr-int8")
    assert main(["import", str(rec_src), "--task", "ocr_rec", "--keys", str(keys), "--out", str(d / "export"), *LINES]) == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["compress", str(d / "export"), "--out", str(d / "compress"), "--int8", "--backend", "onnxruntime",
                     *QUICK])
    return d, code, err.getvalue()


@pytest.fixture()
def runs(compressed) -> Path:
    """The compress artifact where it was written. Where int8 saturates (no VNNI), NNCF's overflow fix puts
    7-bit weights on every layer; measured on an AMX Xeon with that branch forced (PIPE_INT8_CAPABILITY=
    saturating): the search kept 21 of 47 layers in fp32 (5 where exact) and passed, 100% vs 100% on test; it
    may be refused on that class (test_the_gate_by_cpu_class: without import.nfkc, on an AMD EPYC, it was)."""
    d, code, err = compressed
    if code == 4 and not cpu.int8_exact(ov_engine.NAME):
        pytest.skip("int8 saturates on this CPU and compress refused openvino-int8 (its own test checks how)")
    assert code == 0, err
    return d


@pytest.mark.slow
def test_the_gate_by_cpu_class(compressed):
    """Where int8 is exact (VNNI) this model passes (the tests below check how); where it saturates it may be
    refused, in one line naming the variant and its figures, nothing written."""
    d, code, err = compressed
    if cpu.int8_exact(ov_engine.NAME):
        assert code == 0, err
        return
    assert code in (0, 4), err
    if code == 4:
        assert "int8 gate: best int8 variant openvino-int8" in err and "> max_drop 1" in err, err
        assert "nothing written" in err and not (d / "compress").exists()


@pytest.mark.slow
def test_openvino_int8_keeps_the_costly_layers_in_fp32_and_holds_the_budget(runs):
    exp = artifacts.verify(runs / "export", ("export",))
    art = artifacts.verify(runs / "compress", ("compress",))
    m = art.manifest["metrics"]
    v = m["variants"]
    assert m["task"] == "ocr_rec" and m["metric"] == "acc" and m["test_samples"] == 45
    # fp32 is the program import measured, on the same lines: the same line accuracy
    assert v["fp32"]["accuracy"] == pytest.approx(exp.manifest["metrics"]["test_acc"])
    for name in ("openvino-fp32", "onnx-fp32"):  # fp32 on other engines reads every line alike
        assert v[name]["supported"] and v[name]["char_agreement"] == pytest.approx(1.0), name
    ov8 = v["openvino-int8"]
    assert ov8["format"] == "ir" and ov8["files"] == ["openvino-int8/model.xml", "openvino-int8/model.bin"]
    assert m["best_int8"] == "openvino-int8" and m["int8_drop_points"] <= m["max_drop"]
    assert ov8["status"] == "ok" and ov8["char_agreement"] >= m["min_agreement"]
    assert ov8["reference_samples"] == 16 and ov8["reference_agreement"] >= m["min_agreement"]  # what package checks
    s = m["openvino_search"]
    assert s["method"] == "nncf.quantize_with_accuracy_control" and s["val_lines"] == 45
    assert s["layers_int8"] + len(s["fp32_layers"]) == s["layers_quantizable"] > 40
    fp32_val = v["fp32"]["val_metrics"]["acc"]
    assert s["score_fp32"] == pytest.approx(fp32_val)  # the same lines on OpenVINO fp32 read as on Paddle
    assert s["reached"] and s["score"] >= fp32_val - m["max_drop"] / 100 - 1e-9  # the search's own budget, on val
    if s["fp32_layers"]:  # a layer went back to fp32 only because int8 everywhere missed the budget
        assert s["score_int8_everywhere"] < fp32_val - m["max_drop"] / 100
    # what the manifest says stayed fp32 is what the saved model runs in fp32
    import openvino as ov

    kept = quantize._ov_quantized(ov.Core().read_model(str(runs / "compress/openvino-int8/model.xml")))
    assert len(kept) == s["layers_int8"] and not kept & set(s["fp32_layers"])
    # onnxruntime's plain int8 is measured on the same lines and refused with its figures
    q = v["int8-onnx"]
    assert q["supported"] and not q["shippable"] and q["status"].startswith("below budget: character agreement")
    assert (v["fp32"]["accuracy"] - q["accuracy"]) * 100 > m["max_drop"]
    assert m["calibration"]["lines"] == 300 and m["calibration"]["widths"][0] >= 320
    files = {p.relative_to(art.path).as_posix() for p in art.path.rglob("*") if p.is_file()}
    assert files == {"manifest.json", "openvino-int8/model.xml", "openvino-int8/model.bin", "int8-onnx/model.onnx"}


@pytest.mark.slow
def test_package_ships_the_fastest_variant_within_budget_and_serves_it(runs, tmp_path):
    comp = artifacts.verify(runs / "compress", ("compress",))
    v = comp.manifest["metrics"]["variants"]
    assert main(["package", str(runs / "compress"), "--out", str(tmp_path / "package")]) == 0
    pkg = artifacts.verify(tmp_path / "package", ("package",))
    chosen = pkg.manifest["metrics"]["variant"]
    fp32 = v["fp32"]["accuracy"]
    within = {n: x for n, x in v.items() if x["supported"] and x["shippable"] and (fp32 - x["accuracy"]) * 100 <= 1.0}
    assert chosen in within and chosen == choose.pick(v, ref_accuracy=fp32, ref_name="fp32", max_drop=1.0).variant
    assert pkg.manifest["metrics"]["reference"]["agreement"] >= 0.99
    # the Triton repository never carries an int8 file below budget: the export's fp32 ONNX here
    if v[chosen]["precision"] == "int8":
        assert (pkg.path / "serving.yaml").read_text().count("onnx_source: compress:onnx-fp32") == 1
    # served: each line answered as the packaged engine answers it in-process
    art = artifacts.verify(runs / "export", ("export",))
    info = ocr_rec.info_of(art.manifest["interface"])
    test = ocr_rec.load_data(config_mod.from_dict(art.manifest["config"]).data, info).test
    files = [pkg.path / f for f in ("model.xml", "model.bin")] if v[chosen]["format"] == "ir" else None
    images = test.images[:6]
    srv = start_server(tmp_path / "package")
    try:
        r = httpx.post(srv.url + "/v1/predict", json={"images": [_png(im) for im in images]}, timeout=120)
    finally:
        assert srv.stop() == 0
    assert r.status_code == 200, r.text
    got = [line["text"] for line in r.json()["lines"]]
    if files is not None:
        eng = ov_engine.load(files, threads=1, precision="int8")
        run = engines.bind(eng, iospec.IO.from_interface(art.manifest["interface"]), "model.xml")
        assert got == [t for t, _ in ocr_rec.recognise(images, info, run, 1)]
    assert sum(ocr_rec.same_text(g, t, info) for g, t in zip(got, test.texts[:6])) >= 5


def test_the_int8_search_hardens_every_layer_where_int8_saturates(tmp_path):
    """Where int8 is not exact (no VNNI: pipeline/cpu.py), NNCF's overflow fix goes on every layer, not only the
    first: the branch an AVX2 machine takes, forced here on a tiny OpenVINO model."""
    import openvino as ov
    from openvino import opset13 as ops

    x = ops.parameter([-1, 16], np.float32, name="x")
    w = ops.constant(np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32))
    model = ov.Model([ops.matmul(x, w, False, False)], [x], "tiny")
    ov.save_model(model, str(tmp_path / "tiny.xml"))
    rng = np.random.default_rng(1)
    calib = [{"x": rng.normal(size=(4, 16)).astype(np.float32)} for _ in range(4)]
    val = [((0, 1, 2, 3), b) for b in calib]
    ref = {tuple(p): b["x"] @ w.get_data() for p, b in val}

    def score(run, items):  # closeness to fp32: 1.0 = the same
        err = [float(np.abs(run(b)[0] - ref[tuple(p)]).max()) for p, b in items]
        return 1.0 - max(err) / 100

    recs = {exact: quantize.int8_openvino([tmp_path / "tiny.xml", tmp_path / "tiny.bin"], calib, val, score, 0.01, exact,
                                          tmp_path / f"q-{exact}") for exact in (True, False)}
    assert recs[True]["overflow_fix"] == "first_layer_only" and recs[False]["overflow_fix"] == "enable"
    for exact, rec in recs.items():
        assert rec["layers_quantizable"] == 1 and math.isfinite(rec["score"])
        assert (tmp_path / f"q-{exact}" / "model.xml").is_file() and (tmp_path / f"q-{exact}" / "model.bin").is_file()


@pytest.mark.slow
def test_bf16_is_recorded_unsupported_where_the_cpu_has_none(compressed, monkeypatch):
    """The other CPU class's bf16 branch, forced (ONEDNN_MAX_CPU_ISA=AVX2 cannot force it here: OpenVINO 2026.4
    segfaults on this model under it): bf16 is a variant with the reason and no run, the fp32 engines still run."""
    from pipeline import runtime
    from pipeline.compress_owned import _fp32_variants

    monkeypatch.setattr(runtime, "bf16_unsupported", lambda: "this CPU has no avx512_bf16/amx_bf16: test")
    src = artifacts.verify(compressed[0] / "export", ("export",))  # the module's import: the same model
    desc = iospec.IO.from_interface(src.manifest["interface"])
    legacy = [src.file("legacy/model.pdmodel"), src.file("legacy/model.pdiparams")]
    got = _fp32_variants(src, desc, legacy, src.file("model.onnx"), threads=1)
    assert got["bf16"]["run"] is None and got["bf16"]["reason"] == "this CPU has no avx512_bf16/amx_bf16: test"
    assert got["bf16"]["precision"] == "bf16" and got["bf16"]["files"] == []
    for name in ("fp32", "openvino-fp32", "onnx-fp32"):
        assert callable(got[name]["run"]) and got[name]["precision"] == "fp32", name
