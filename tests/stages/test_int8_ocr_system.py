"""The int8 OCR system (issue 49) on the real PP-OCRv4 models (the session's small imports): det and rec compressed
to int8 (OpenVINO + NNCF; det judged by hmean, rec by line accuracy, its budgets opened here: 18 test lines are too
few to judge a point, which `make bench` measures on 40 pages; one such run's rec agreed 0.9707 per character with
fp32, under the default min_agreement 0.99), each packaged as its openvino-int8 variant, the
fp32 cls beside them, composed by `pipe package`; the system's manifest, README and `pipe serve`'s startup line
say each part's precision, variant and engine; /v1/ocr answers as the same packages read pages in-process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from pipeline import artifacts, cpu, ocr_system
from pipeline.cli import main
from pipeline.engines import openvino as ov_engine
from pipeline.ocr_system import package as ocr_package
from tests.serving_helpers import png_b64 as _png, start_server
from tests.stages.test_serve_ocr_system import _same

pytestmark = [pytest.mark.slow(reason="compresses and serves the real PP-OCRv4 det + rec"), pytest.mark.timeout(1800)]
QUICK = ["--set", "compress.latency_runs=3", "--set", "compress.throughput_runs=2"]
WANT = {"det": ("int8", "openvino-int8"), "rec": ("int8", "openvino-int8"), "cls": ("fp32", "export-legacy")}


@pytest.fixture(scope="module")
def built(ppocr_det_int8, ppocr_cls_export, ppocr_rec_export, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ocr-int8-system")
    code = main(["compress", str(ppocr_rec_export), "--int8", "--backend", "openvino", "--out", str(d / "rec-int8"),
                 "--set", "compress.max_drop=20", "--set", "compress.min_agreement=0.9", *QUICK])
    # Where int8 saturates (no VNNI; forced here by PIPE_INT8_CAPABILITY=saturating), rec's int8 with 7-bit weights
    # read 55.6% of these 18 lines against fp32's 94.4% and compress refused it (exit 4): the system then ships rec
    # fp32, as pipe all does. Where int8 is exact it must pass.
    assert code == 0 or (code == 4 and not cpu.int8_exact(ov_engine.NAME)), code
    want = dict(WANT) if code == 0 else {**WANT, "rec": ("fp32", "export-legacy")}
    parts = {"det": ppocr_det_int8, "rec": d / "rec-int8" if code == 0 else ppocr_rec_export}
    for role, src in parts.items():
        pick = ["--variant", want[role][1]] if want[role][0] == "int8" else ["--engine", "openvino"]
        assert main(["package", str(src), *pick, "--no-triton", "--out", str(d / role)]) == 0
    assert main(["package", str(ppocr_cls_export), "--engine", "openvino", "--no-triton", "--out", str(d / "cls")]) == 0
    out = d / "ocr"
    assert main(["package", str(d / "det"), str(d / "cls"), str(d / "rec"), "--no-triton", "--out", str(out)]) == 0
    return out, want


@pytest.fixture(scope="module")
def package(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def want(built) -> dict[str, tuple[str, str]]:
    """Each part's (precision, variant) as shipped: rec fp32 where int8 saturates and compress refused it."""
    return built[1]


@pytest.fixture(scope="module")
def server(package):
    srv = start_server(package, timeout=240)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-2000:]


def test_the_manifest_and_readme_record_each_parts_precision_variant_and_engine(package, want):
    m = artifacts.verify(package, (ocr_package.STAGE,)).manifest
    for role, (precision, variant) in want.items():
        part = m["parts"][role]
        shipped = artifacts.verify(package / role, ("package",)).manifest
        assert (part["precision"], part["variant"], part["engine"]) == (precision, variant, "openvino"), part
        assert (shipped["precision"], shipped["metrics"]["variant"], shipped["engine"]) == \
            (part["precision"], part["variant"], part["engine"])  # what the part's own package says
        assert m["metrics"][f"{role}_variant"] == variant and m["metrics"][f"{role}_engine"] == "openvino"
    assert m["metrics"]["det_precision"] == yaml.safe_load((package / ocr_package.SYSTEM_FILE).read_text())[
        "measured"]["det_precision"]  # the detection's precision, a number, not the part's int8
    readme = (package / "README.md").read_text(encoding="utf-8")
    for role, (precision, variant) in want.items():
        assert f"| {role} | `{m['parts'][role]['name']}` | ocr_{role} | {precision} | {variant} | openvino |" in readme
    assert ocr_package.describe(ocr_package.load(package)) == ", ".join(
        f"{role} {want[role][0]} ({want[role][1]} on openvino)" for role in ("det", "cls", "rec"))


def test_serve_says_the_parts_and_v1_ocr_reads_pages_as_the_packages_in_process(package, want, server):
    said = next(line for line in server.out if "OCR system:" in line)
    for role, (precision, variant) in want.items():
        assert f"{role} " in said and f"({precision} {variant} on openvino, " in said, said
    spec = ocr_package.load(package)
    models = {role: ocr_system.Model(p.info, ocr_package._runner(p, 1), batch=ocr_package._batch(p))
              for role, p in spec.parts.items()}
    system = ocr_system.System(models["det"], models["rec"], models["cls"], spec.drop_score)
    test = _test_pages(spec)
    expect, _ = ocr_system.read(system, test.images[:3])
    r = httpx.post(server.url + "/v1/ocr", json={"images": [_png(im) for im in test.images[:3]]}, timeout=300)
    assert r.status_code == 200, r.text
    got = r.json()["pages"]
    _same(got, expect)
    scores = ocr_system.end_to_end(got, test.polys[:3], test.texts[:3])
    assert scores["hmean"] >= 0.95 and scores["e2e_acc"] >= 0.6, scores  # int8 det and rec still read the pages


def _test_pages(spec: ocr_package.SystemSpec):
    from pipeline import config as config_mod
    from pipeline.tasks import ocr_det

    det = spec.parts["det"]
    return ocr_det.load_data(config_mod.from_dict(ocr_package._config_of(det)).data, det.info).test
