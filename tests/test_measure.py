"""`pipeline.bench.measure` (`pipe bench DIR...`) on real artifacts: the shared 2-epoch digits run taken through
export (--onnx), compress (both int8 backends, few timed runs) and package, and a tiny text model's export.

Accuracy tolerance against the manifests: bench runs the very model files, with the same engine, precision,
thread count and test batches (256 at a time, compress's own `_batches`) as the stage that recorded the
number, so it is expected to be equal; it is allowed to differ by one test sample (1/n), as oneDNN may pick
other kernels between processes and a near-tie logit may flip. Nothing here is timed against a fixed
number: latency is only required to be positive and ordered (p99 >= p50).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.bench import measure
from pipeline.cli import main
from pipeline.errors import InputError
from tests.conftest import reviews

FAST_COMPRESS = ("--set", "compress.latency_runs=20", "--set", "compress.throughput_runs=5")


def build_full_run(trained_digits: Path, tmp_path_factory) -> Path:
    """export --onnx, compress --int8 (both backends), package, into a copy of the shared run; built once per
    session (test_report uses it too) and only read afterwards."""
    run = tmp_path_factory.getbasetemp() / "measure-full-run" / "run"
    if (run / "package" / "manifest.json").is_file():
        return run
    shutil.rmtree(run.parent, ignore_errors=True)
    shutil.copytree(trained_digits, run)
    assert main(["export", str(run / "train"), "--onnx"]) == 0
    assert main(["compress", str(run / "export"), "--int8", *FAST_COMPRESS]) == 0
    assert main(["package", str(run / "compress")]) == 0
    return run



def build_text_run(tmp_path_factory) -> Path:
    """train (text_cnn, 2 epochs) + export of a text model: compress takes only NCHW images, so this run
    stops at export. Built once per session."""
    run = tmp_path_factory.getbasetemp() / "measure-text-run" / "run"
    if (run / "export" / "manifest.json").is_file():
        return run
    shutil.rmtree(run.parent, ignore_errors=True)
    run.parent.mkdir(parents=True)
    src = reviews(run.parent / "reviews.jsonl")
    assert main(["train", "--data", str(src), "--model", "text_cnn", "--run", str(run), "--epochs", "2",
                 "--batch-size", "32", "--set", "data.max_len=24", "--set", "data.min_count=1"]) == 0
    assert main(["export", str(run / "train")]) == 0
    return run


@pytest.fixture(scope="module")
def full_run(trained_digits, tmp_path_factory) -> Path:
    return build_full_run(trained_digits, tmp_path_factory)


@pytest.fixture(scope="module")
def benched(full_run) -> list[measure.BenchRow]:
    dirs = [full_run / "export", full_run / "compress", full_run / "package"]
    return measure.measure(dirs, quick=True)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _by(rows, artifact: Path) -> dict[str, measure.BenchRow]:
    return {r.variant: r for r in rows if r.artifact == str(artifact)}


def _sane(r: measure.BenchRow) -> None:
    assert r.status == "ok", (r.label, r.status)
    assert r.p50_ms > 0 and r.p99_ms >= r.p50_ms, r
    assert r.items_per_s > 0 and r.size_mb > 0, r
    assert r.test_samples > 0 and 0 <= r.accuracy <= 1, r


@pytest.mark.slow
def test_compress_rows_match_the_manifest(benched, full_run):
    m = _manifest(full_run / "compress")
    variants = m["metrics"]["variants"]
    rows = _by(benched, full_run / "compress")
    assert list(rows) == list(variants)  # one row per variant, in the manifest's order
    n = m["metrics"]["test_samples"]
    for name, v in variants.items():
        r = rows[name]
        assert (r.format, r.engine, r.precision, r.stage) == (v["format"], v["engine"], v["precision"], "compress")
        if not v["supported"]:
            assert r.status.startswith("unsupported: "), r
            continue
        _sane(r)
        assert r.test_samples == n
        assert r.accuracy == pytest.approx(v["accuracy"], abs=1 / n + 1e-12), name
        assert r.size_mb == pytest.approx(v["size_bytes"] / 1e6, rel=1e-12), name


@pytest.mark.slow
def test_export_rows_and_shared_measurements(benched, full_run):
    exp = _manifest(full_run / "export")
    rows = _by(benched, full_run / "export")
    assert list(rows) == ["fp32", "bf16", "onnx-fp32"]  # the PIR program twice, and model.onnx (--onnx)
    fp32 = rows["fp32"]
    _sane(fp32)
    n = exp["metrics"]["test_samples"]
    assert fp32.accuracy == pytest.approx(exp["metrics"]["test_acc"], abs=1 / n + 1e-12)
    files = exp["files"]
    assert fp32.size_mb == pytest.approx((files["model.json"]["bytes"] + files["model.pdiparams"]["bytes"]) / 1e6)
    _sane(rows["onnx-fp32"])
    assert rows["onnx-fp32"].size_mb == pytest.approx(exp["files"]["model.onnx"]["bytes"] / 1e6)
    # compress fp32 runs the export's program: measured once, numbers shared and said so
    comp = _by(benched, full_run / "compress")["fp32"]
    assert comp.shared_with == fp32.label
    assert (comp.p50_ms, comp.accuracy, comp.items_per_s) == (fp32.p50_ms, fp32.accuracy, fp32.items_per_s)


@pytest.mark.slow
def test_package_rows(benched, full_run):
    pkg = _manifest(full_run / "package")
    # a list, not _by's dict: when the auto pick is onnx-fp32 (machine-dependent), the packaged variant and
    # the Triton model share the name onnx-fp32, and both rows are measured
    listed = [r for r in benched if r.artifact == str(full_run / "package")]
    onnx = f"onnx-{pkg['metrics']['onnx_precision']}"
    variant = pkg["metrics"]["variant"]
    assert [r.variant for r in listed] == [variant, onnx]
    for r in listed:
        _sane(r)
    mine = listed[0]
    assert mine.precision == pkg["precision"]
    assert mine.accuracy == pytest.approx(pkg["metrics"]["variant_accuracy"], abs=1 / mine.test_samples + 1e-12)
    # the packaged files are byte copies of the compress variant's: measured once
    first = _by(benched, full_run / "export").get(variant) or _by(benched, full_run / "compress")[variant]
    assert mine.shared_with == first.label
    assert mine.engine == pkg["engine"]
    onnx_file = next(f for f in pkg["files"] if f.endswith("/1/model.onnx"))
    assert listed[1].size_mb == pytest.approx(pkg["files"][onnx_file]["bytes"] / 1e6)


@pytest.mark.slow
def test_fastest_table_and_json(benched):
    ok = [r for r in benched if r.ok]
    f1, f32 = measure.fastest(benched, "bs1"), measure.fastest(benched, "bs32")
    assert f1.p50_ms == min(r.p50_ms for r in ok)
    assert f32.items_per_s == max(r.items_per_s for r in ok)
    table = measure.render_table(benched)
    assert f"fastest on this machine at batch 1: {f1.label}" in table
    assert f"fastest on this machine at batch 32: {f32.label}" in table
    assert "\x1b[" not in table  # no colour codes in a string meant for logs and files
    from pipeline import cpu

    assert f"int8 on this CPU: {cpu.summary()}" in table
    for r in benched:
        assert r.artifact in table and r.status in table
    doc = json.loads(json.dumps(measure.to_json(benched)))  # JSON-serialisable as is
    assert doc["fastest"] == {"bs1": f1.label, "bs32": f32.label}
    assert doc["machine"]["int8"] == cpu.capability() and doc["machine"]["int8_summary"] == cpu.summary()
    assert [row["label"] for row in doc["rows"]] == [r.label for r in benched]
    assert doc["rows"][0]["p50_ms"] == benched[0].p50_ms
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["threads"] >= 1


@pytest.mark.slow
def test_text_export_is_measured_with_its_vocabulary(tmp_path_factory):
    run = build_text_run(tmp_path_factory)
    exp = _manifest(run / "export")
    rows = _by(measure.measure([run / "export"], quick=True), run / "export")
    assert list(rows) == ["fp32", "bf16"]
    _sane(rows["fp32"])
    n = exp["metrics"]["test_samples"]
    assert rows["fp32"].test_samples == n
    assert rows["fp32"].accuracy == pytest.approx(exp["metrics"]["test_acc"], abs=1 / n + 1e-12)


def test_not_an_artifact_is_input_error_naming_it(tmp_path, full_run):
    empty = tmp_path / "not-an-artifact"
    empty.mkdir()
    with pytest.raises(InputError, match=str(empty)):
        measure.measure([full_run / "export", empty], quick=True)
    with pytest.raises(InputError, match="stage is 'train', expected export or compress or package"):
        measure.measure([full_run / "train"], quick=True)
    with pytest.raises(InputError, match="no such artifact directory"):
        measure.measure([tmp_path / "missing"], quick=True)
    with pytest.raises(InputError, match="at least one"):
        measure.measure([], quick=True)


def test_tampered_artifact_is_refused_before_measuring(tmp_path, full_run):
    comp = tmp_path / "compress"
    shutil.copytree(full_run / "compress", comp)
    onnx = comp / "int8-onnx" / "model.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    with pytest.raises(InputError, match="sha256 mismatch for int8-onnx/model.onnx"):
        measure.measure([comp], quick=True)
