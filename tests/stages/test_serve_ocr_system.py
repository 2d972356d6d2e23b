"""The OCR system as one package and one server, on the real PP-OCRv4 det, cls and rec (the session's imports):
`pipe package DET CLS REC` composes them (each packaged, the system measured end to end on the detector's test
pages: the figures recorded are what an in-process read of the exports gives); `pipe serve` answers /v1/ocr with
what the in-process system reads (`pipeline/ocr_system/__init__.py` on the exports themselves), alone and with several
clients at once; each part still answers on its own endpoints; per-stage metrics; bad input and bad
compositions get one line."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from pipeline import artifacts, config as config_mod, engines, iospec, ocr_system
from pipeline.cli import main
from pipeline.engines import paddle as paddle_engine
from pipeline.ocr_system import package as ocr_package
from pipeline.tasks import ocr_cls, ocr_det, ocr_rec
from tests.serving_helpers import metric, png_b64 as _png, start_server


pytestmark = pytest.mark.slow(reason="serves the real PP-OCRv4 det + cls + rec system")


@pytest.fixture(scope="module")
def package(ppocr_det_export, ppocr_cls_export, ppocr_rec_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ocr-system") / "ocr"
    # any order: each part's role is its task
    assert main(["package", str(ppocr_rec_export), str(ppocr_det_export), str(ppocr_cls_export), "--out", str(out),
                 "--no-triton", "--engine", "paddle"]) == 0  # what `system` (Paddle in-process) is compared with
    return out


@pytest.fixture(scope="module")
def system(ppocr_det_export, ppocr_cls_export, ppocr_rec_export):
    """The system in-process on the exports themselves (Paddle Inference, as the parts' packages), and the
    detector's test pages."""
    models = {}
    for role, path, task in (("det", ppocr_det_export, ocr_det), ("cls", ppocr_cls_export, ocr_cls),
                             ("rec", ppocr_rec_export, ocr_rec)):
        art = artifacts.verify(path, ("export",))
        iface = art.manifest["interface"]
        eng = paddle_engine.load([art.file("model.json"), art.file("model.pdiparams")], threads=1)
        models[role] = ocr_system.Model(task.info_of(iface), engines.bind(eng, iospec.IO.from_interface(iface),
                                                                          str(path)))
    art = artifacts.verify(ppocr_det_export, ("export",))
    test = ocr_det.load_data(config_mod.from_dict(art.manifest["config"]).data, models["det"].info).test
    return ocr_system.System(models["det"], models["rec"], models["cls"]), test


@pytest.fixture(scope="module")
def server(package):
    srv = start_server(package, timeout=240)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in "".join(srv.err), "".join(srv.err)[-2000:]


def _same(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert [[(line["points"], line["text"]) for line in page] for page in got] == \
        [[(line["points"], line["text"]) for line in page] for page in want]
    np.testing.assert_allclose([line["score"] for page in got for line in page],
                               [line["score"] for page in want for line in page], atol=1e-4)


def test_the_package_holds_each_part_and_what_the_system_measured(package, system):
    m = artifacts.verify(package, (ocr_package.STAGE,)).manifest
    doc = yaml.safe_load((package / ocr_package.SYSTEM_FILE).read_text(encoding="utf-8"))
    assert doc["parts"] == {"det": "det", "cls": "cls", "rec": "rec"} and doc["drop_score"] == 0.5
    spec = ocr_package.load(package)
    assert {role: p.task.name for role, p in spec.parts.items()} == {"det": "ocr_det", "cls": "ocr_cls",
                                                                      "rec": "ocr_rec"}
    for role in ("det", "cls", "rec"):  # each part a whole package, its own manifest covered by the system's
        assert f"{role}/manifest.json" in m["files"] and f"{role}/serving.yaml" in m["files"]
        assert m["parts"][role]["manifest_sha256"] == artifacts.verify(package / role, ("package",)).manifest_sha256
    # what was recorded is what the system reads in-process on the exports, on the same test pages
    sysm, test = system
    n = min(ocr_package.MEASURE_PAGES, len(test))
    answers, _ = ocr_system.read(sysm, test.images[:n])
    want = ocr_system.end_to_end(answers, test.polys[:n], test.texts[:n])
    measured = doc["measured"]
    assert measured["pages"] == n and measured["lines"] == want["lines"] == sum(len(t) for t in test.texts[:n])
    assert measured["e2e_acc"] == round(want["e2e_acc"], 4) and measured["det_hmean"] == round(want["hmean"], 4)
    assert m["metrics"]["e2e_acc"] == measured["e2e_acc"] and measured["e2e_acc"] >= 0.6
    assert f"{measured['e2e_acc']:.1%} of {measured['lines']} lines" in (package / "README.md").read_text()


def test_the_system_compares_lines_as_its_recognizer_does(package, system):
    """A recognizer imported with import.nfkc: the system's e2e_acc compares its lines after NFKC as well (the
    detector's pages hold the full-width and the ASCII forms of , ; ! which the font draws alike)."""
    spec = ocr_package.load(package)
    rec = spec.parts["rec"]
    assert rec.info.settings["nfkc"] is False  # the session's import: exact
    folding = dataclasses.replace(rec, info=dataclasses.replace(rec.info, settings={**rec.info.settings, "nfkc": True}))
    got = ocr_package.measure({**spec.parts, "rec": folding}, spec.drop_score)
    sysm, test = system
    n = got["pages"]
    answers, _ = ocr_system.read(sysm, test.images[:n])
    exact, folded = (ocr_system.end_to_end(answers, test.polys[:n], test.texts[:n], nfkc=on)["e2e_acc"]
                     for on in (False, True))
    assert folded > exact, "no line differs only in a full-width form: nothing tested"
    assert got["e2e_acc"] == round(folded, 4)


def test_v1_ocr_reads_pages_as_the_system_in_process(server, system):
    sysm, test = system
    images = test.images[:3]
    want, _ = ocr_system.read(sysm, images)
    r = httpx.post(server.url + "/v1/ocr", json={"images": [_png(im) for im in images]}, timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()["pages"]
    _same(got, want)
    assert sum(len(page) for page in got) >= 10
    for page, texts in zip(got, test.texts[:3]):  # most lines are read exactly as they were rendered
        assert len({line["text"] for line in page} & set(texts)) >= len(texts) // 2


def test_a_page_upside_down_reads_through_the_classifier(server, system):
    sysm, test = system
    page = np.ascontiguousarray(test.images[0][::-1, ::-1])
    r = httpx.post(server.url + "/v1/ocr", json={"images": [_png(page)]}, timeout=120)
    assert r.status_code == 200, r.text
    want, _ = ocr_system.read(sysm, [page])
    _same(r.json()["pages"], want)
    assert len({line["text"] for line in want[0]} & set(test.texts[0])) >= 2  # read only because cls turned them


def test_concurrent_clients_each_get_what_their_page_reads_alone(server, system):
    sysm, test = system
    images = test.images
    want = [ocr_system.read(sysm, [im])[0][0] for im in images]
    before = metric(httpx.get(server.url + "/metrics").text, 'pipe_batch_requests_count{model="rec"}', 0.0)

    def ask(i: int) -> list[dict]:
        r = httpx.post(server.url + "/v1/ocr", json={"images": [_png(images[i % len(images)])]}, timeout=180)
        assert r.status_code == 200, r.text
        return r.json()["pages"][0]

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, range(len(images))))
    _same(got, want)
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, 'pipe_batch_requests_count{model="rec"}', 0.0) > before
    for stage in ("det", "cls", "rec"):
        assert metric(text, f'pipe_ocr_stage_seconds_count{{stage="{stage}"}}') >= len(images)
    assert metric(text, "pipe_ocr_lines_per_page_sum") >= sum(len(p) for p in want)


def test_a_page_without_text_is_an_empty_list(server):
    r = httpx.post(server.url + "/v1/ocr", json={"images": [_png(np.full((120, 300, 3), 255, np.uint8))]},
                   timeout=60)
    assert r.status_code == 200 and r.json() == {"pages": [[]]}


@pytest.mark.parametrize("body, code, words", [
    ({"images": ["not base64!"]}, 422, "images[0]: not valid base64"),
    ({"images": [_png(np.zeros((8, 8), np.uint8))] * 5}, 422, "images: a list of 1..4 base64 strings"),
    ({"images": []}, 422, "images: a list of 1..4"),
    ({"inputs": [[1.0]]}, 422, "the body must be an object {\"images\""),
    ({"images": ["aGVsbG8="]}, 422, "images[0]: not a decodable PNG/JPEG"),
])
def test_bad_input_is_refused_in_one_line_naming_the_field(server, body, code, words):
    r = httpx.post(server.url + "/v1/ocr", json=body, timeout=30)
    assert r.status_code == code and words in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/ocr", content=b"{}", headers={"Content-Type": "text/plain"}, timeout=30)
    assert r.status_code == 415


def test_each_part_answers_on_its_own_endpoints(server, system):
    sysm, test = system
    model = httpx.get(server.url + "/v1/model").json()
    assert set(model["parts"]) == {"det", "cls", "rec"} and model["max_pages"] == 4
    assert model["measured"]["lines"] > 0 and model["drop_score"] == 0.5
    line = ocr_system.crop(test.images[0], np.asarray(test.polys[0][0], np.float32)[:4])
    r = httpx.post(server.url + "/v1/models/rec/predict", json={"images": [_png(line)]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["lines"][0]["text"] == ocr_system.answer_lines(ocr_rec, sysm.rec, [line])[0][0]
    r = httpx.post(server.url + "/v1/models/cls/predict", json={"images": [_png(line)]}, timeout=60)
    assert r.status_code == 200 and r.json()["lines"][0]["label"] == "0", r.text
    rec = model["parts"]["rec"]["name"]
    assert httpx.get(server.url + f"/v2/models/{rec}/ready").status_code == 200
    assert httpx.get(server.url + f"/v2/models/{rec}").json()["name"] == rec
    r = httpx.get(server.url + "/v2/models/nothing-here")
    assert r.status_code == 404 and "nothing-here" in r.json()["error"]
    assert httpx.get(server.url + "/readyz").json() == {"status": "ready"}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three imports when run alone (~4 min here), then each part's three engines measured
def test_the_documented_build_ships_each_part_on_its_measured_engine(ppocr_det_export, ppocr_cls_export,
                                                                     ppocr_rec_export, tmp_path, monkeypatch):
    """Issue 51 item 7: `pipe package DET CLS REC` of imports, as docs/ocr.md builds it (no --engine), measures each
    part's fp32 engines (Paddle, onnxruntime on the import's model.onnx, OpenVINO) and ships each on the engine
    choose.py picks from that measurement; the system's manifest says which."""
    from pipeline import choose

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))  # measured here, not reused from another test
    out = tmp_path / "ocr"
    assert main(["package", str(ppocr_det_export), str(ppocr_cls_export), str(ppocr_rec_export), "--out", str(out),
                 "--no-triton"]) == 0
    system = json.loads((out / "manifest.json").read_text())
    for role in ("det", "cls", "rec"):
        m = json.loads((out / role / "manifest.json").read_text())
        rec = m["metrics"]["engine_measurement"]
        v = rec["variants"]
        assert rec["measured_here"] is True and {"fp32", "onnx-fp32", "openvino-fp32"} <= set(v), (role, rec)
        want = choose.pick(v, ref_accuracy=v["fp32"]["accuracy"], ref_name="fp32", max_drop=1.0).variant
        assert rec["chosen"] == want and m["engine"] == v[want]["engine"] == system["metrics"][f"{role}_engine"], role


def test_compositions_that_are_no_system_are_refused_in_one_line(ppocr_det_export, ppocr_cls_export, tmp_path,
                                                                 capsys):
    out = tmp_path / "ocr"
    assert main(["package", str(ppocr_det_export), str(ppocr_det_export), "--out", str(out)]) == 2
    assert "a second det model" in capsys.readouterr().err
    assert main(["package", str(ppocr_det_export), str(ppocr_cls_export), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs a text detector (ocr_det) and a recognizer (ocr_rec); no rec" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_serve_refuses_a_tampered_system_or_a_batch_flag(package, tmp_path):
    import shutil
    import subprocess
    import sys

    from tests.serving_helpers import REPO

    def serve(path: Path, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "serve", str(path), "--port", "0", *flags],
                              capture_output=True, text=True, cwd=REPO, timeout=120)

    r = serve(package, "--max-batch-size", "8")
    assert r.returncode == 2 and "keeps each part's own" in r.stderr and "Traceback" not in r.stderr
    r = serve(package, "--http-workers", "2")
    assert r.returncode == 2 and "served by one HTTP process" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "ocr"
    shutil.copytree(package, bad)
    doc = yaml.safe_load((bad / ocr_package.SYSTEM_FILE).read_text())
    (bad / ocr_package.SYSTEM_FILE).write_text(yaml.safe_dump({**doc, "drop_score": 0.1}))
    r = serve(bad)
    assert r.returncode == 2 and "system.yaml" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    m = json.loads((package / artifacts.MANIFEST).read_text())
    assert m["stage"] == ocr_package.STAGE


def test_packages_compose_as_they_are_and_drop_score_is_the_systems(package, system, tmp_path, capsys):
    """Parts that are packages already are copied whole (their engines and manifests kept); --drop-score is
    recorded and applied: what the stricter system measured is the default one's lines kept at the higher bar."""
    out = tmp_path / "strict"
    parts = [str(package / role) for role in ("det", "cls", "rec")]
    assert main(["package", *parts, "--drop-score", "0.995", "--out", str(out)]) == 0
    for role in ("det", "cls", "rec"):
        assert artifacts.verify(out / role, ("package",)).manifest_sha256 == \
            artifacts.verify(package / role, ("package",)).manifest_sha256
    strict = ocr_package.load(out)
    assert strict.drop_score == 0.995
    sysm, test = system
    n = strict.doc["measured"]["pages"]
    answers, _ = ocr_system.read(sysm, test.images[:n])
    kept = [[line for line in page if line["score"] >= 0.995] for page in answers]
    assert sum(map(len, kept)) < sum(map(len, answers)), "no line scored between the two bars: nothing tested"
    want = ocr_system.end_to_end(kept, test.polys[:n], test.texts[:n])
    assert strict.doc["measured"]["e2e_acc"] == round(want["e2e_acc"], 4)
    assert strict.doc["measured"]["det_recall"] == round(want["recall"], 4)
    assert main(["package", *parts, "--drop-score", "1.5", "--out", str(tmp_path / "bad")]) == 2
    assert "--drop-score: must be 0..1, got 1.5" in capsys.readouterr().err


def test_inspect_verify_checks_every_part_on_this_cpu(package, capsys):
    assert main(["inspect", str(package), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "ocr_system" in out and "e2e_acc=" in out and "verified" in out
    for role in ("det", "cls", "rec"):
        assert f"{role}:\nreference check: " in out


def test_openapi_states_v1_ocr_and_the_answers_match_it(server, system):
    from tests.stages.test_serve_openapi import valid

    op = httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/ocr"]["post"]
    request = op["requestBody"]["content"]["application/json"]["schema"]
    answer = op["responses"]["200"]["content"]["application/json"]["schema"]
    _, test = system
    body = {"images": [_png(im) for im in test.images[:2]]}
    assert valid(request, body) and not valid(request, {"images": body["images"] * 3})  # 4 pages at most
    r = httpx.post(server.url + "/v1/ocr", json=body, timeout=120)
    assert r.status_code == 200 and valid(answer, r.json()), r.text[:300]
    assert not valid(answer, {"pages": [[{"points": [[0, 0]] * 4, "text": "x", "score": 0.1}]]})  # below drop_score
    bad = httpx.post(server.url + "/v1/ocr", json={"images": ["not base64!"]}, timeout=30)
    assert valid(op["responses"]["422"]["content"]["application/json"]["schema"], bad.json()), bad.text



def test_automatic_threads_share_the_cores_among_the_parts(package, monkeypatch):
    from pipeline.ocr_system import serving as system_mod
    from stages.serve import ServeConfig

    spec = ocr_package.load(package)
    monkeypatch.setattr("pipeline.runtime.available_cores", lambda: 16)
    got = {role: system_mod.part_settings(ServeConfig(), sp, 3).threads for role, sp in spec.parts.items()}
    assert got == {"det": 5, "cls": 5, "rec": 5}  # (16 - 1) // 3, not 15 each
    assert system_mod.part_settings(ServeConfig(predictors=2), spec.parts["det"], 3).threads == 2
    assert system_mod.part_settings(ServeConfig(threads=7), spec.parts["det"], 3).threads == 7  # --threads wins
    monkeypatch.setattr("pipeline.runtime.available_cores", lambda: 2)
    assert system_mod.part_settings(ServeConfig(), spec.parts["rec"], 3).threads == 1
    assert system_mod.part_settings(ServeConfig(), spec.parts["rec"], 3).http_workers == 1  # a system is one process
