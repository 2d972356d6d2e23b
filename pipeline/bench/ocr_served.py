"""The OCR system served: `pipe serve`'s /v1/ocr on one system package (`pipe package DET CLS REC`: the real PP-OCRv4
det, ch_ppocr_mobile_v2 cls and PP-OCRv4 rec, imported) against RapidOCR 1.4.4 whole (rapidocr-onnxruntime: the same
weights as ONNX, in-process at its defaults, page by page), on the same generated pages in this one run.

The int8 system (issue 49) is the one `pipe all --config examples/ppocr_system.yaml` builds (every part
compressed by OpenVINO + NNCF, each judged by its own metric on its own generated data, and packaged as its fastest
variant within budget: det and rec int8, cls its openvino-fp32, its int8 being no faster; every part on OpenVINO),
built in this run and served the same way on the same pages; its row is compared with the fp32 system on OpenVINO
(what examples/ppocr_system_fp32.yaml builds): pages/s at concurrency 8 and end-to-end accuracy.

Per system package (every part on one engine, `pipe package --engine E`): the server started as a user starts it
(`pipe serve PACKAGE`, its defaults: one predictor per part, threads (cores - 1) / predictors), every page sent once
untimed (a shape's first run), then each page alone, one client (concurrency 1: p50/p99 seconds per page,
pages/s), then all pages at once from 8 clients, each page twice (concurrency 8: pages/s over the wall time,
p50/p99 per request); the end-to-end accuracy (`ocr_system.end_to_end`: the share of ground-truth lines
matched at IoU 0.5 by a line that reads exactly their text) of the concurrency-1 answers. RapidOCR: every page
once untimed, then once timed alone (it has no server: in-process is its best case).

The parts run at the det settings the detector was imported with (PaddleOCR's side limit, 960 'max'; the system's
crops at `system_unclip_ratio` 2.0). RapidOCR runs twice: at its defaults (det limit 736 'min'), and at its
defaults but pipe's det side limit, the peer issue 32's goal rows compare against.

    python -m pipeline.bench.ocr_served [--quick] [--int8-run=RUN] bench/OCR_SERVED.md

`--int8-run=RUN`: the int8 system's pipe all run folder (pipe all reuses what it already built there; default: a
new one in the bench's temp dir).
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, ocr_system
from pipeline.bench import ocr_system as ocr_system_bench

Row = tuple[str, str, str, str]
_REPO = Path(__file__).resolve().parents[2]
_PEER = ocr_system_bench._PEER
ENGINES = ("onnxruntime", "openvino", "paddle")
CONCURRENCY = 8
INT8 = "int8"  # the int8 system's key among the systems: examples/ppocr_system.yaml through pipe all
FP32 = "openvino"  # the fp32 system it is compared with: every part on OpenVINO, examples/ppocr_system_fp32.yaml's


def rows(quick: bool, int8_run: Path | None = None) -> list[Row]:
    """The rows; `int8_run`: the int8 system's `pipe all` run folder (reused where pipe all's cache holds it),
    else one in this bench's temp dir, built from nothing."""
    pages = 12 if quick else 40
    with tempfile.TemporaryDirectory(prefix="pipe-bench-ocr-served-") as tmp:
        out = Path(tmp)
        failed = ocr_system_bench.import_parts(out, pages, "OCR system served")
        if failed:
            return [failed]
        measured = measure(out, ENGINES[:2] if quick else ENGINES, int8=True, int8_run=int8_run)
    return _rows(measured)


def measure(root: Path, engines: tuple[str, ...] = ENGINES, limit: int | None = None,
            int8: bool = False, int8_run: Path | None = None) -> dict[str, Any]:
    """Each engine's system package served (and, with `int8`, the int8 system `pipe all` of
    examples/ppocr_system.yaml builds), then RapidOCR, on the det import's test pages (the first `limit`)."""
    from pipeline.tasks import ocr_det

    _, test = ocr_system_bench._imports(root, limit)
    info = ocr_det.info_of(artifacts.verify(root / "det", ("export",)).manifest["interface"])
    bodies = [json.dumps({"images": [_png_b64(im)]}).encode() for im in test.images]
    out: dict[str, Any] = {"pages": len(test), "systems": {}, "cores": os.cpu_count()}
    int8_run = Path(int8_run or root / "int8")
    builds = {INT8: ["all", "--config", str(_REPO / "examples" / "ppocr_system.yaml"), "--run", str(int8_run)]} \
        if int8 else {}
    builds.update({engine: ["package", str(root / "det"), str(root / "cls"), str(root / "rec"), "--engine", engine,
                            "--no-triton", "--out", str(root / f"system-{engine}")] for engine in engines})
    for name, cmd in builds.items():
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pipeline.cli", *cmd], capture_output=True, text=True, cwd=_REPO)
        built = time.perf_counter() - t0
        if r.returncode != 0:
            out["systems"][name] = {"error": f"pipe {cmd[0]} failed ({r.returncode}): {r.stderr.strip()[-200:]}"}
            continue
        package = int8_run / "ocr_system" if name == INT8 else Path(cmd[-1])
        got = _served(package, bodies, root / f"serve-{name}.log")
        if "error" in got:
            out["systems"][name] = got
            continue
        answers = got.pop("answers")
        out["systems"][name] = {**ocr_system.end_to_end(answers, test.polys, test.texts), **got,
                                "parts": _parts(package), "build_s": built}
    out["lines"] = sum(len([t for t in page if t != "###"]) for page in test.texts)
    out["rapidocr"] = _rapidocr(test)
    out["rapidocr_same_limit"] = _rapidocr(test, {"det_limit_side_len": int(info.settings["limit_side_len"]),
                                                  "det_limit_type": str(info.settings["limit_type"])})
    out["det_limit"] = f"{info.settings['limit_side_len']} '{info.settings['limit_type']}'"
    return out


def _served(package: Path, bodies: list[bytes], log_path: Path) -> dict[str, Any]:
    """`pipe serve PACKAGE` started, warmed, driven at concurrency 1 then CONCURRENCY, stopped (SIGTERM)."""
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0"],
                            cwd=_REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    drained = threading.Thread()
    try:
        url, drained = _url(proc, log_path)
        if url is None:
            drained.join(10)
            return {"error": f"pipe serve did not start: {log_path.read_text()[-200:]}"}
        with httpx.Client(timeout=600) as c:
            while c.get(url + "/readyz").status_code != 200:
                time.sleep(0.2)
            post = _poster(c, url)
            for body in bodies:  # every page's shapes once, untimed
                post(body)
            one, answers = [], []
            for body in bodies:
                t0 = time.perf_counter()
                answers.append(post(body)[0])
                one.append(time.perf_counter() - t0)
        local = threading.local()

        def ask(body: bytes) -> float:
            if not hasattr(local, "client"):
                local.client = httpx.Client(timeout=600)
            t0 = time.perf_counter()
            _poster(local.client, url)(body)
            return time.perf_counter() - t0

        load = bodies * 2
        t0 = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            many = list(pool.map(ask, load))
        wall = time.perf_counter() - t0
        return {"answers": answers, "c1": _stats(one, sum(one)), f"c{CONCURRENCY}": _stats(many, wall)}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if drained.is_alive():
            drained.join(10)


def _parts(package: Path) -> str:
    """What the system package shipped per part (`ocr_package.describe`), e.g. `det int8 (openvino-int8 on openvino)`."""
    from pipeline.ocr_system import package as ocr_package

    return ocr_package.describe(ocr_package.load(package))


def _url(proc: subprocess.Popen, log_path: Path) -> tuple[str | None, threading.Thread]:
    """The server's URL from its output, and a thread copying the rest of its output into `log_path`."""
    log = open(log_path, "w")
    url = None
    for line in proc.stdout:
        log.write(line)
        if "listening on http://" in line:
            url = line.rsplit(" ", 1)[-1].strip()
            break

    def drain() -> None:
        with log:
            for rest in proc.stdout:
                log.write(rest)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return url, t


def _poster(client: Any, url: str) -> Any:
    def post(body: bytes) -> list[list[dict[str, Any]]]:
        r = client.post(url + "/v1/ocr", content=body, headers={"Content-Type": "application/json"})
        if r.status_code != 200:
            raise RuntimeError(f"/v1/ocr answered {r.status_code}: {r.text[:200]}")
        return r.json()["pages"]

    return post


def _rapidocr(test: Any, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """RapidOCR whole in-process, page by page (`ocr_system_bench.rapidocr`): its accuracy and speed, or its error."""
    peer = ocr_system_bench.rapidocr(test, settings)
    if "error" in peer:
        return peer
    return {**ocr_system.end_to_end(peer["answers"], test.polys, test.texts),
            "c1": _stats(peer["seconds"], sum(peer["seconds"]))}


def _stats(seconds: list[float], wall: float) -> dict[str, float]:
    s = np.asarray(seconds, float)
    return {"pages_s": float(len(s) / wall), "p50_s": float(np.percentile(s, 50)), "p99_s": float(np.percentile(s, 99))}


def _png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _speed(v: dict[str, float]) -> str:
    return f"{v['pages_s']:.2f} pages/s, p50 {v['p50_s'] * 1e3:.0f} ms, p99 {v['p99_s'] * 1e3:.0f} ms"


def _rows(m: dict[str, Any]) -> list[Row]:
    n, c = m["pages"], f"c{CONCURRENCY}"
    out: list[Row] = []
    for engine, v in sorted(m["systems"].items(), key=lambda kv: kv[0] == INT8):  # the int8 system after fp32's
        what = f"OCR system served (`pipe serve` /v1/ocr, one package, every part on {engine}), {n} generated pages"
        if engine == INT8:
            what = (f"int8 OCR system served (`pipe all` of examples/ppocr_system.yaml, then `pipe serve` /v1/ocr: "
                    f"{v.get('parts', 'not built')}; pipe all {v.get('build_s', 0):.0f} s), {n} generated pages")
        if "error" in v:
            out.append((what, v["error"], "", "**failed**"))
            continue
        out.append((what, f"end-to-end {v['e2e_acc']:.1%} of {v['lines']} lines exact (det hmean {v['hmean']:.4f}); "
                          f"concurrency 1: {_speed(v['c1'])}; concurrency {CONCURRENCY}: {_speed(v[c])}", "", ""))
    for key, what in (("rapidocr", "its defaults: det 736 'min'"),
                      ("rapidocr_same_limit", f"its defaults but pipe's det limit {m['det_limit']}")):
        peer = m[key]
        if "error" in peer:
            return out + [("OCR system served: RapidOCR 1.4.4", peer["error"], "", "")]
        out.append((f"RapidOCR 1.4.4 (rapidocr-onnxruntime, same weights, {what}), in-process, page by page, same "
                    f"{n} pages", f"end-to-end {peer['e2e_acc']:.1%} of lines exact (det hmean {peer['hmean']:.4f}); "
                                  f"{_speed(peer['c1'])}", "", ""))
    ok = {e: v for e, v in m["systems"].items() if "error" not in v}
    if not ok:
        return out
    if INT8 in ok and FP32 in ok:  # issue 49: the int8 system against the fp32 one, served alike, in this run
        q, f = ok[INT8], ok[FP32]
        ratio, points = q[c]["pages_s"] / f[c]["pages_s"], (q["e2e_acc"] - f["e2e_acc"]) * 100
        out.append((f"int8 OCR system vs the fp32 system on {FP32} (examples/ppocr_system_fp32.yaml's), `pipe serve` "
                    f"/v1/ocr at concurrency {CONCURRENCY}, pages/s", f"{ratio:.2f}x ({q[c]['pages_s']:.2f} vs "
                    f"{f[c]['pages_s']:.2f}); concurrency 1: {q['c1']['pages_s'] / f['c1']['pages_s']:.2f}x",
                    ">= 1.5x", "met" if ratio >= 1.5 else "**missed**"))
        out.append(("int8 OCR system vs the fp32 system, end-to-end share of lines read exactly, same pages",
                    f"{q['e2e_acc']:.1%} vs {f['e2e_acc']:.1%} ({points:+.1f} points); det hmean {q['hmean']:.4f} vs "
                    f"{f['hmean']:.4f}", "within 1 point", "met" if points >= -1.0 else "**missed**"))
    peer = m["rapidocr_same_limit"]  # issue 32: RapidOCR at its defaults and the same det side limit
    if INT8 in ok:
        q = ok[INT8]
        out.append((f"int8 OCR system, `pipe serve` /v1/ocr at concurrency {CONCURRENCY}, vs RapidOCR in-process at "
                    "the same det limit, pages/s", f"{q[c]['pages_s'] / peer['c1']['pages_s']:.2f}x; end-to-end "
                    f"{q['e2e_acc']:.1%} vs {peer['e2e_acc']:.1%} ({(q['e2e_acc'] - peer['e2e_acc']) * 100:+.1f} points)",
                    "", "reported"))
    fp32 = {e: v for e, v in ok.items() if e != INT8}  # issue 32's rows: the fp32 systems, as before
    if not fp32:
        return out
    engine, best = max(fp32.items(), key=lambda kv: kv[1][c]["pages_s"])
    ratio = best[c]["pages_s"] / peer["c1"]["pages_s"]
    points = (best["e2e_acc"] - peer["e2e_acc"]) * 100
    out.append((f"pipe serve /v1/ocr at concurrency {CONCURRENCY} ({engine}) vs RapidOCR in-process at the same det "
                "limit, pages/s", f"{ratio:.2f}x; end-to-end {best['e2e_acc']:.1%} vs {peer['e2e_acc']:.1%} "
                                  f"({points:+.1f} points)",
                ">= 1.0x, end-to-end within 1 point", "met" if ratio >= 1.0 and points >= -1.0 else "**missed**"))
    p50 = best["c1"]["p50_s"] / peer["c1"]["p50_s"]
    out.append((f"pipe serve /v1/ocr at concurrency 1 ({engine}) vs RapidOCR in-process at the same det limit, p50 "
                "per page", f"{p50:.2f}x ({best['c1']['p50_s'] * 1e3:.0f} vs {peer['c1']['p50_s'] * 1e3:.0f} ms)",
                "<= 1.2x", "met" if p50 <= 1.2 else "**missed**"))
    return out

if __name__ == "__main__":
    from pipeline import bench

    quick = "--quick" in sys.argv
    int8_run = next((Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--int8-run=")), None)
    out_file = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/OCR_SERVED.md"))
    bench._write(out_file, rows(quick, int8_run), quick)
