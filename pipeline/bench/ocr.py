"""OCR text recognition rows: the real PP-OCRv4 recognizer imported (`pipe import`) and compressed (`pipe compress
--int8 --backend openvino`: NNCF with the per-layer search), then each fp32 engine and OpenVINO int8 on
the same generated lines against RapidOCR's own recognizer (rapidocr-onnxruntime 1.4.4: the same weights
converted to ONNX, on onnxruntime, in-process), side by side in this one run.

Per engine: line accuracy and 1 - normalised edit distance (the task's metric, spaces ignored as PaddleOCR's
RecMetric), and ms per line with every line alone (batch 1) and in the task's width-bucketed batches of 8,
timing the whole path (pre-processing, the engine, decode) as RapidOCR's figure includes its own.
RapidOCR runs its own pre-processing, batching (sorted by aspect ratio, its rec_batch_num of 6, width at
least 320) and decode on PNGs of the same lines, in its own venv (.venv/rapidocr, made by `make bench`).
Then served: the compress artifact packaged as `pipe package` picks (the fastest variant within budget; the
import on OpenVINO fp32 if compress refused) and run by `pipe serve --threads <cores>`, one line image (base64 PNG) per `/v1/predict` request from
1 and from 8 keep-alive clients in this process (`pipeline/bench/loadgen.py`), every test line once per
load after one untimed pass; against RapidOCR's recognizer in-process (no HTTP at all), same lines, this
run. On a 2-core machine the clients, the HTTP server and the predictor share the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, config as config_mod, engines as engines_mod, iospec, pretrained, runtime
from pipeline.errors import PipeError
from pipeline.tasks import ocr_rec
from pipeline.tasks.ocr_rec import data as ocr_data

Row = tuple[str, str, str, str]
_PEER = Path(__file__).resolve().parents[2] / ".venv" / "rapidocr" / "bin" / "python"
_BATCH = 8
_CLIENTS = 8


def rows(quick: bool) -> list[Row]:
    test_lines = 150 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="pipe-bench-ocr-") as tmp:
        out = Path(tmp) / "export"
        root = pretrained.ppocr()
        cmd = [sys.executable, "-m", "pipeline.cli", "import", str(root / pretrained.MODELS["rec"]), "--task", "ocr_rec",
               "--keys", str(root / pretrained.KEYS), "--out", str(out),
               "--set", f"data.ocr_lines={int(test_lines / 0.15) + 1}"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if r.returncode != 0:
            return [("`pipe import` PP-OCRv4 rec", f"failed ({r.returncode}): {r.stderr.strip()[-200:]}", "", "**failed**")]
        m = artifacts.verify(out, ("export",)).manifest
        rows_: list[Row] = [(f"`pipe import` PP-OCRv4 rec (convert to PIR and ONNX, parity, measure on "
                             f"{m['metrics']['samples']['val'] + m['metrics']['samples']['test']} lines), wall time",
                             f"{seconds:.0f} s", "", "")]
        comp, comp_row = _compress(out, Path(tmp))
        rows_.append(comp_row)
        measured = measure(out, m, comp)
        rows_ += [(f"PP-OCRv4 rec, {name}, {measured['lines']} generated test lines",
                   f"line accuracy {v['acc']:.1%}, 1 - NED {v['norm_edit_dis']:.4f}, "
                   f"{v['ms_bs1']:.1f} ms/line alone, {v['ms_bs8']:.1f} ms/line in batches of {_BATCH}",
                   "", "") for name, v in measured["engines"].items()]
        peer = measured.get("rapidocr")
        if peer is None:
            rows_.append(("RapidOCR rec (rapidocr-onnxruntime 1.4.4)", measured.get("rapidocr_error", "not run"), "", ""))
            return rows_
        rows_.append((f"RapidOCR rec (rapidocr-onnxruntime 1.4.4, same weights as ONNX, its own batches of "
                      f"{peer['rec_batch_num']})",
                      f"line accuracy {peer['acc']:.1%}, 1 - NED {peer['norm_edit_dis']:.4f}, {peer['ms_bs1']:.1f} "
                      f"ms/line alone, {peer['ms_batch']:.1f} ms/line batched", "", ""))
        best = min(measured["engines"].items(), key=lambda kv: kv[1]["ms_bs8"])
        ratio = min(peer["ms_batch"], peer["ms_bs1"]) / best[1]["ms_bs8"]
        same = abs(best[1]["acc"] - peer["acc"]) * 100 <= 1.0
        rows_.append((f"pipe's fastest engine ({best[0]}, batches of {_BATCH}) vs RapidOCR's recognizer (the faster "
                      f"of its two modes), lines/s, engine alone, same lines",
                      f"{ratio:.2f}x (accuracy {best[1]['acc']:.1%} vs {peer['acc']:.1%})", ">= 1.0x at equal accuracy",
                      "met" if ratio >= 1.0 and same else "**missed**"))
        rows_ += _served_rows(out, comp, measured, Path(tmp))
    return rows_


def _compress(export_dir: Path, tmp: Path) -> tuple[Path | None, Row]:
    """`pipe compress --int8 --backend openvino` of the import (NNCF with the per-layer search), timed; None
    when it is refused (its line says why)."""
    out = tmp / "compress"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "compress", str(export_dir), "--int8", "--backend",
                        "openvino", "--out", str(out)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        return None, ("`pipe compress --int8 --backend openvino`", f"exit {r.returncode}: {r.stderr.strip()[-300:]}",
                      "", "**refused**" if r.returncode == 4 else "**failed**")
    s = artifacts.verify(out, ("compress",)).manifest["metrics"]["openvino_search"]
    return out, ("`pipe compress --int8 --backend openvino` (NNCF, per-layer search on the val lines), wall time",
                 f"{seconds:.0f} s; int8 everywhere {s['score_int8_everywhere']:.1%} on val, "
                 f"{len(s['fp32_layers'])} of {s['layers_quantizable']} layers kept in fp32 -> {s['score']:.1%}",
                 "", "")


def _served_rows(export_dir: Path, comp: Path | None, measured: dict[str, Any], tmp: Path) -> list[Row]:
    """pipe serve at 1 and 8 clients (the package `pipe package` makes of the compress artifact, else the
    import's on OpenVINO fp32), against RapidOCR's in-process figures."""
    try:
        got = served(export_dir, tmp, comp)
    except PipeError as e:
        return [("pipe serve, PP-OCRv4 rec", f"failed: {str(e)[:500]}", "", "**failed**")]
    peer = measured["rapidocr"]
    one, eight = got["clients"][1], got["clients"][_CLIENTS]
    rows_: list[Row] = [
        (f"pipe serve, PP-OCRv4 rec, {got['variant']} on {got['engine']}, --threads {got['threads']}, one line per /v1 "
         f"request, {got['lines']} lines, {n} client(s)",
         f"{r['rate']:.1f} lines/s, p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, line accuracy {got['acc']:.1%}"
         + (f", {r['errors']} errors" if r["errors"] else ""), "", "")
        for n, r in sorted(got["clients"].items())]
    peer_rate = 1e3 / min(peer["ms_batch"], peer["ms_bs1"])
    ratio = eight["rate"] / peer_rate
    same = abs(got["acc"] - peer["acc"]) * 100 <= 1.0
    rows_.append((f"served lines/s at {_CLIENTS} clients vs RapidOCR's recognizer in-process (the faster of its two "
                  f"modes: {peer_rate:.1f} lines/s), same lines",
                  f"{ratio:.2f}x (accuracy {got['acc']:.1%} vs {peer['acc']:.1%})", ">= 1.0x at equal accuracy",
                  "met" if ratio >= 1.0 and same and not eight["errors"] else "**missed**"))
    p50 = one["p50"] / peer["ms_bs1"]
    rows_.append(("served p50 per line at 1 client vs RapidOCR's per line alone in-process "
                  f"({peer['ms_bs1']:.1f} ms)", f"{p50:.2f}x ({one['p50']:.1f} ms)", "<= 1.2x",
                  "met" if p50 <= 1.2 else "**missed**"))
    return rows_


def served(export_dir: Path, tmp: Path, comp: Path | None = None) -> dict[str, Any]:
    """Package the compress artifact `comp` (what `pipe package` picks: the fastest within budget), else
    `export_dir` on OpenVINO fp32, serve it in one HTTP process with one engine thread per core, and load it with one line per
    request from 1 and `_CLIENTS` clients (each line once per load, after one untimed pass)."""
    import base64
    import io
    import os

    from PIL import Image

    from pipeline.bench import loadgen, serving

    m = artifacts.verify(export_dir, ("export",)).manifest
    info = ocr_rec.info_of(m["interface"])
    test = ocr_rec.load_data(config_mod.from_dict(m["config"]).data, info).test
    package = tmp / "package-served"
    args = [str(comp)] if comp is not None else [str(export_dir), "--engine", "openvino"]
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "package", *args, "--no-triton", "--out", str(package)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [""])[-1]  # the one-line error, from its start (what failed)
        raise PipeError(f"pipe package {' '.join(args[1:])} exited {r.returncode}: {last[:400]}")
    pm = artifacts.verify(package, ("package",)).manifest["metrics"]

    def body(image: np.ndarray) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, "PNG")
        return json.dumps({"images": [base64.b64encode(buf.getvalue()).decode()]}).encode()

    bodies = [body(im) for im in test.images]
    threads = os.cpu_count() or 1
    server = serving.start_server("ocr", package, tmp / "serve-ocr.log", "--http-workers", "1", "--threads",
                                  str(threads))  # one process, one engine thread per core (not 2 x cores)
    try:
        loadgen.run(server.url, bodies, _CLIENTS, count=-(-len(bodies) // _CLIENTS))  # untimed: first sights
        out = {n: loadgen.run(server.url, bodies, n, count=len(bodies) // n) for n in (1, _CLIENTS)}
        import httpx

        answers = []
        for i in range(0, len(bodies), 32):  # the texts served, for the accuracy beside the rate
            chunk = [json.loads(b)["images"][0] for b in bodies[i:i + 32]]
            got = httpx.post(server.url + "/v1/predict", json={"images": chunk}, timeout=120).json()["lines"]
            answers += [(a["text"], a["score"]) for a in got]
    finally:
        serving.stop(server.proc)
    return {"clients": out, "threads": threads, "lines": len(bodies), "variant": pm["variant"], "engine": pm["engine"],
            "acc": ocr_rec.score(answers, test, info)["acc"]}


def measure(export_dir: Path, manifest: dict[str, Any], comp: Path | None = None) -> dict[str, Any]:
    """Every fp32 engine on the import artifact's test lines, OpenVINO int8 of the compress artifact `comp`
    (if given), then RapidOCR's recognizer on the same lines."""
    info = ocr_rec.info_of(manifest["interface"])
    data = ocr_rec.load_data(config_mod.from_dict(manifest["config"]).data, info)
    desc = iospec.IO.from_interface(manifest["interface"])
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)
    files = {"paddle_inference (PIR program)": ("paddle_inference", ["model.json", "model.pdiparams"]),
             "onnxruntime (model.onnx)": ("onnxruntime", ["model.onnx"]),
             "openvino (legacy program)": ("openvino", ["legacy/model.pdmodel", "legacy/model.pdiparams"]),
             "openvino (model.onnx)": ("openvino", ["model.onnx"])}
    paths = {name: (engine, [export_dir / f for f in rel], "fp32") for name, (engine, rel) in files.items()}
    if comp is not None:
        paths["openvino int8 (NNCF, per-layer search)"] = (
            "openvino", [comp / "openvino-int8/model.xml", comp / "openvino-int8/model.bin"], "int8")
    out: dict[str, Any] = {"lines": len(data.test), "engines": {}}
    for name, (engine, files_, precision) in paths.items():
        eng = engines_mod.ENGINES[engine].load(files_, threads=threads, precision=precision)
        run = engines_mod.bind(eng, desc, name)
        for size in (_BATCH, 1):  # warm-up: every width once (Paddle with oneDNN is slow at a width's first sight)
            ocr_rec.recognise(data.test.images, info, run, size)
        answers, t_batch = _timed(run, data.test.images, info, _BATCH)
        _, t_single = _timed(run, data.test.images, info, 1)
        out["engines"][name] = {**ocr_rec.score(answers, data.test, info),
                                "ms_bs1": t_single * 1e3 / len(data.test), "ms_bs8": t_batch * 1e3 / len(data.test)}
    if not _PEER.is_file():
        out["rapidocr_error"] = f"not run: {_PEER} missing (make bench creates it)"
        return out
    with tempfile.TemporaryDirectory(prefix="pipe-bench-rapidocr-") as tmp:
        paths = ocr_data.write_pngs(data.test, Path(tmp))
        (Path(tmp) / "list.json").write_text(json.dumps({"images": [str(p) for p in paths]}))
        r = subprocess.run([str(_PEER), str(Path(__file__).with_name("rapidocr_peer.py")), str(Path(tmp) / "list.json")],
                           capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        out["rapidocr_error"] = f"failed ({r.returncode}): {r.stderr.strip()[-200:]}"
        return out
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    answers = list(zip(peer["texts"], peer["scores"]))
    out["rapidocr"] = {**ocr_rec.score(answers, data.test, info), "rec_batch_num": peer["rec_batch_num"],
                       "ms_bs1": peer["single_s"] * 1e3 / len(data.test),
                       "ms_batch": peer["batch_s"] * 1e3 / len(data.test)}
    return out


def _timed(run: Any, images: list[np.ndarray], info: Any, size: int) -> tuple[list[Any], float]:
    """Answers in the images' order and the wall time of the whole path (pre-processing, batching, the
    engine, decode: `ocr_rec.recognise`), as RapidOCR's figure includes its own."""
    t0 = time.perf_counter()
    answers = ocr_rec.recognise(images, info, run, size)
    return answers, time.perf_counter() - t0

if __name__ == "__main__":  # the OCR rows alone: python -m pipeline.bench.ocr [--quick] bench/OCR.md
    from pipeline import bench

    quick = "--quick" in sys.argv
    out = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/OCR.md"))
    bench._write(out, rows(quick), quick)
