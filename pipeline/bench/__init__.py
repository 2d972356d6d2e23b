"""`pipe bench` / `make bench`: side-by-side measurements written as a Markdown table.

    pipe bench --out bench/RESULTS.md

Every ratio compares runs made in this one process (or back to back), interleaved, because the
machine is shared and noisy: quote the ratios, not the absolute numbers.

    (here)     the suite's entry `run` (CLI start-up, training throughput, data parallel, `pipe all`)
    compress   int8 and bf16 against fp32 on every engine, the auto pick, the int8 accuracy drop (images, text)
    serving    `pipe serve` under load (HTTP, dynamic batching, /v1 and /v2), versus the engine alone
    perf       `pipe serve` against tritonserver on `pipe all`'s digits package, each at its defaults, by perf_analyzer
    peers      `pipe serve` against KServe's ModelServer and its own past, by the bench's Python client
    text       the text model against a TF-IDF + logistic regression baseline on the same split
    ernie      ernie_tiny (two inputs) through train, export, compress on 3 engines, package, served text
    detection  centernet_tiny on generated shapes: COCO mAP, int8 mAP drop per engine, auto pick, served PNGs
    ocr        the real PP-OCRv4 recognizer imported, every fp32 engine against RapidOCR's on the same lines
    ocr_system PP-OCRv4 det + cls + rec chained in-process (pipeline/ocr_system/__init__.py) against RapidOCR whole
    ocr_finetune PP-OCRv4 rec fine-tuned by pipe train on dot-matrix lines, 1 and 2 processes, with the guard; the
               levers against forgetting on a harsher setting
    ocr_served the same system as one package behind `pipe serve`'s /v1/ocr, concurrency 1 and 8, against RapidOCR
    predict    `pipe predict` over generated pages against PaddleOCR 3.7's pipeline and `pipe serve`; its memory; a classifier
    finetune   model.init from related data (digits 0-4) against from scratch, side by side
    measure    `pipe bench DIR...`: every servable model in export/compress/package artifacts, measured here
    loadgen    the serving benchmark's HTTP/1.1 load generator
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline import config as config_mod, cpu

_DIGITS = "examples/digits.yaml"


def run(out_file: Path, quick: bool = False) -> None:
    repeats = 1 if quick else 3
    rows: list[tuple[str, str, str, str]] = []
    rows += _cli_startup(repeats=3 if quick else 7)
    rows += _train_throughput(repeats)
    rows += _data_parallel(repeats=1)
    rows += _pipe_all()
    from pipeline.bench import (compress, detection, ernie, finetune, ocr, ocr_finetune, ocr_served, ocr_system,  # each in its own temp dirs
                                 peers, perf, predict, serving, text)

    rows += compress.rows(quick)
    rows += serving.rows(quick)
    rows += perf.rows(quick)
    rows += peers.rows(quick)
    rows += serving.text_rows(quick)
    rows += ernie.rows(quick)
    rows += detection.rows(quick)
    rows += ocr.rows(quick)
    rows += ocr_system.rows(quick)
    rows += ocr_served.rows(quick)
    rows += predict.rows(quick)
    rows += text.rows(1 if quick else 2)
    rows += finetune.rows()
    rows += ocr_finetune.rows(quick)
    _write(out_file, rows, quick)


# ------------------------------------------------------------------ pipe all: cold, then from the cache


def _pipe_all() -> list[tuple[str, str, str, str]]:
    """`make demo`'s command twice in a fresh run dir: the whole chain, then the cached rerun."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pipeline.cli", "all", "--config", _DIGITS, "--run", str(Path(tmp) / "demo")]
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if r.returncode != 0:
                return [("`pipe all` on digits", f"failed ({r.returncode}): {r.stderr.strip()[-200:]}", "", "**failed**")]
        cached = r.stdout.count(": cached (")
    load = os.getloadavg()[0]
    rows.append(("`pipe all --config examples/digits.yaml` (train, export, compress on 3 engines, package, report), "
                 "wall time",
                 f"{times[0]:.0f} s (1-min load average {load:.1f} on {os.cpu_count()} cores)", "<= 180 s",
                 "met" if times[0] <= 180 else "**missed**"))
    rows.append(("the same command again (`make demo` twice): served from the cache",
                 f"{times[1]:.1f} s, {cached} of 4 stages cached", "seconds",
                 "met" if times[1] <= 10 and cached == 4 else "**missed**"))
    return rows


# ------------------------------------------------------------------ CLI start-up


def _cli_startup(repeats: int) -> list[tuple[str, str, str, str]]:
    cmd = [sys.executable, "-c", "import sys; from pipeline.cli import main; main(['--help']); "
           "sys.stdout.flush(); print('PADDLE' if 'paddle' in sys.modules else 'NO-PADDLE', file=sys.stderr)"]
    times, imported = [], False
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
        imported |= "PADDLE" in r.stderr.replace("NO-PADDLE", "")
    med = statistics.median(times)
    return [("`pipe --help` wall time (median of %d)" % repeats, f"{med:.3f} s", "<= 0.3 s",
             "met" if med <= 0.3 else "**missed**"),
            ("`pipe --help` imports paddle", "yes" if imported else "no", "no", "met" if not imported else "**missed**")]


# ------------------------------------------------------------------ training throughput


def _train_throughput(repeats: int) -> list[tuple[str, str, str, str]]:
    from pipeline import batches, data as data_mod, runtime
    from pipeline.nets import models

    paddle = runtime.import_paddle()
    from stages import train as train_stage

    epochs = 3
    cfg = config_mod.load(Path(_DIGITS), [f"train.epochs={epochs}", "train.schedule=constant",
                                          "train.warmup_epochs=0"])
    ds = data_mod.load(cfg.data)
    tr, pre, batch = ds.train, ds.preprocessing, cfg.train.batch_size

    def pipe_run() -> float:
        with tempfile.TemporaryDirectory() as d:
            out = train_stage.run(cfg, Path(d) / "train", view=lambda ev: None)
            rows = json.loads((out / "manifest.json").read_text())
        return rows["metrics"]["img_per_s"]

    def bare(loader_fed: bool) -> Callable[[], float]:
        def go() -> float:
            paddle.seed(0)
            shapes = ds.input_shapes
            net = models.build(cfg.model.name, len(ds.labels), next(iter(shapes.values())), input_shapes=shapes)
            call = models.calling(net, ds.input_names, f"--model {cfg.model.name}")
            opt = paddle.optimizer.AdamW(learning_rate=cfg.train.lr, parameters=net.parameters(),
                                         weight_decay=cfg.train.weight_decay)
            F = paddle.nn.functional
            sampler = batches.GlobalBatchSampler(len(tr), batch, 0, 1, 0)
            if loader_fed:
                dset = batches.FeedDataset(tr, pre, lambda y, feeds: np.asarray(y, np.int64))
                loader = paddle.io.DataLoader(dset, batch_sampler=sampler, collate_fn=dset.collate)
            else:
                X = {name: paddle.to_tensor(v) for name, v in tr.feeds(np.arange(len(tr)), pre).items()}
                Y = paddle.to_tensor(np.asarray(tr.y[tr.idx]))
            per_epoch = []
            for ep in range(epochs):
                sampler.set_epoch(ep)
                t0, seen = time.perf_counter(), 0
                if loader_fed:
                    epoch_batches = iter(loader)
                else:
                    perm = paddle.to_tensor(np.random.RandomState([0, ep]).permutation(len(tr)))
                    # one shuffle per epoch
                    Xe, Ye = {name: paddle.gather(v, perm) for name, v in X.items()}, paddle.gather(Y, perm)
                    epoch_batches = (({name: v[k * batch:(k + 1) * batch] for name, v in Xe.items()},
                                      Ye[k * batch:(k + 1) * batch]) for k in range(len(sampler)))
                for feeds, y in epoch_batches:
                    loss = F.cross_entropy(call(net, feeds), y)
                    loss.backward()
                    opt.step()
                    opt.clear_grad()
                    seen += batch
                float(loss)  # [sync] once per epoch
                per_epoch.append(seen / (time.perf_counter() - t0))
            return float(statistics.median(per_epoch))
        return go

    runs: dict[str, list[float]] = {"pipe": [], "loader": [], "preloaded": []}
    fns = {"pipe": pipe_run, "loader": bare(True), "preloaded": bare(False)}
    for _ in range(repeats):  # interleaved: the machine's noise hits all three alike
        for name, fn in fns.items():
            runs[name].append(fn())
    med = {k: statistics.median(v) for k, v in runs.items()}
    r1 = med["pipe"] / med["loader"]
    r2 = med["loader"] / med["preloaded"]
    spread = {k: f"{min(v):.0f}-{max(v):.0f}" for k, v in runs.items()}
    note = f"digits_cnn, batch {batch}, {epochs} epochs x {repeats} interleaved repeats, img/s median (range)"
    return [
        (f"train: pipe (full stage, 1 process) — {note}", f"{med['pipe']:.0f} ({spread['pipe']})", "", ""),
        ("train: bare Paddle loop, same DataLoader", f"{med['loader']:.0f} ({spread['loader']})", "", ""),
        ("train: bare Paddle loop, preloaded tensors", f"{med['preloaded']:.0f} ({spread['preloaded']})", "", ""),
        ("ratio pipe / bare loop (same data path)", f"{r1:.3f}", ">= 0.97", "met" if r1 >= 0.97 else "**missed**"),
        ("ratio loader-fed / preloaded (bare loop)", f"{r2:.3f}", ">= 0.95", "met" if r2 >= 0.95 else "**missed**"),
    ]


# ------------------------------------------------------------------ 1 vs 2 processes


def _data_parallel(repeats: int) -> list[tuple[str, str, str, str]]:
    out: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for n in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, "-m", "pipeline.cli", "train", "--config", _DIGITS, "--run", d,
                       "--epochs", "4", "--nproc", str(n)]
                subprocess.run(cmd, check=True, capture_output=True)
                m = json.loads((Path(d) / "train" / "manifest.json").read_text())
                out[n].append(m["metrics"]["img_per_s"])
    one, two = statistics.median(out[1]), statistics.median(out[2])
    return [
        ("train: 1 process (2 threads), img/s", f"{one:.0f}", "", ""),
        ("train: 2 processes via paddle.distributed.launch (1 thread each, gloo), img/s", f"{two:.0f}", "", ""),
        ("ratio 2 processes / 1 process", f"{two / one:.2f}", "reported", ""),
    ]


def _engine_versions() -> str:
    from importlib import metadata

    from pipeline import engines

    out = []
    for engine, dist in (("paddle_inference", "paddlepaddle"), ("onnxruntime", "onnxruntime"),
                         ("openvino", "openvino")):
        try:
            out.append(f"{engines.LABELS[engine]} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{engines.LABELS[engine]}: not installed")
    return ", ".join(out)


def _write(out_file: Path, rows: list[tuple[str, str, str, str]], quick: bool) -> None:
    out_file.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# pipe benchmarks",
        "",
        f"Generated by `pipe bench{' --quick' if quick else ''}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        "Shared machine: trust the side-by-side ratios more than absolute numbers.",
        "",
        f"CPU and int8 capability (`pipeline/cpu.py`): {cpu.summary()}. flags: {', '.join(cpu.capability()['flags'])}.",
        "",
        f"Engines (`pipeline/engines/`): {_engine_versions()}.",
        "",
        "| measurement | result | goal | status |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        "",
    ]
    out_file.write_text("\n".join(lines))
    print("\n".join(lines))

