"""`pipe bench` serving rows: `pipe serve` under concurrent batch-1 load, package against package, and against
the engine alone.

    python -c "from pipeline.bench import serving; print(serving.rows(quick=True))"
    python -c "from pipeline.bench import serving; print(serving.text_rows(quick=True))"

`rows` builds, for digits and for mobilenet_v3_small at 3x64x64 (PNG requests), a compress dir with every
engine measured and two packages of it: `pipe package --engine auto` (what ships: `pipeline/choose.py`) and
`pipe package --variant fp32` (Paddle Inference fp32, the baseline). Both are served at once by `pipe serve`
on free ports on 127.0.0.1 and loaded in turn (interleaved rounds: the machine's noise hits both) with
keep-alive clients from this process (`pipeline/bench/loadgen.py`: asyncio, 0.1-0.2 ms of CPU per request; a
fixed count, then a fixed time: every load stops by itself):
- per package: 16 clients x batch-1 requests against the engine alone one by one (the same engine,
  precision and threads as its predictor, loaded here through `pipeline/engines/`), the batch sizes the
  server formed (`/metrics`), the CPU seconds of clients / HTTP server / predictor(s), and the served rate
  as a fraction of the engine's own capacity at those batch sizes (the very runs the predictor made,
  replayed on the engine alone: what the HTTP layer, the queue and the pipe to the predictor cost);
- auto / Paddle fp32: requests/s at 16 clients and p50 latency at 1 client;
- on the auto package: `/v2/models/NAME/infer` with binary tensors (the body tritonclient.http sends:
  JSON header, then the raw bytes, `Inference-Header-Content-Length`) against `/v1/predict` with the
  same tensors as JSON.
`text_rows` does the per-package rows for the built-in Chinese sentiment task (text_cnn): one review per
request as `{"text": [...]}`, tokenized in the server, against the engine fed the same reviews encoded to
max_len one by one. On a 2-core machine the clients, the HTTP server and the predictor share the CPU:
quote the ratios with that. A model whose build or server fails becomes one **failed** row.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pipeline import cpu, runtime
from pipeline.bench import loadgen
from pipeline.errors import PipeError

Row = tuple[str, str, str, str]
Feeds = dict[str, np.ndarray]
"""A model's inputs by the served program's names, every array with the same leading sample axis."""

_REPO = Path(__file__).resolve().parents[2]
_START_S = 180.0  # the server's paddle import and warm-up on a busy machine
_STOP_S = 40.0  # longer than the server's 30 s drain
_HTTP_TIMEOUT_S = 30.0
_CLIENTS = 16
_GOAL_RATE, _GOAL_P50 = 1.5, 0.5  # issue 14, on mobilenet_v3_small PNG: auto / Paddle fp32
_SWITCH_PAUSE_S = 0.3  # > KMP_BLOCKTIME (200 ms): the other engine's threads have stopped spinning
_MIN_TIMED_S = 0.5  # an engine-alone loop runs at least this long: 2,000 digits samples take 0.1 s on onnxruntime


@dataclass
class _Server:
    """A running `pipe serve` of one package, as its start line describes it."""

    key: str
    """auto or fp32: which package of the pair."""
    package: Path
    proc: subprocess.Popen
    url: str
    engine: str
    precision: str
    threads: int
    max_batch: int
    spec: dict[str, Any]
    """serving.yaml."""

    @property
    def label(self) -> str:
        variant = self.spec["model"].get("variant", self.precision)
        return {"auto": f"`--engine auto`: {variant}", "fp32": "Paddle fp32 (`--variant fp32`)"}.get(
            self.key, f"the package ({variant})")


@dataclass
class _Served:
    """One package's served runs (all rounds) and its engine alone one by one before and after them."""

    rates: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    done: int = 0
    errors: int = 0
    wall: float = 0.0
    samples: float = 0.0
    runs: dict[int, float] = field(default_factory=dict)
    """Predictor runs by the bucket size they ran at (the batch padded up: `pipeline/serving/predictor.py`)."""
    cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    bare: list[float] = field(default_factory=list)


def rows(quick: bool) -> list[Row]:
    """Measurement rows (measurement, result, goal, status) for `pipe bench`'s table: digits (with the
    bounded load run), then mobilenet_v3_small at 3x64x64 PNG, where the model, not HTTP, is the cost."""
    out: list[Row] = []
    for name, build, load, png, goals in (("digits_cnn 1x8x8", _build_digits, True, False, False),
                                          ("mobilenet_v3_small 3x64x64 PNG", _build_mobilenet, False, True, True)):
        try:
            out += _image_rows(quick, name, build, load, png, goals)
        except PipeError as e:
            out.append((f"serve {name}", f"failed: {str(e)[-300:]}", "", "**failed**"))
    return out


def _image_rows(quick: bool, name: str, build: Callable[[Path, bool], dict[str, Path]], load: bool, png: bool,
                goals: bool) -> list[Row]:
    """`png`: requests carry base64 PNGs (decoded and normalised in the server) instead of JSON float
    tensors, whose parsing costs the server ~4 ms per 3x64x64 request; the engine alone gets tensors."""
    total, rounds = (400, 1) if quick else (2000, 2)
    load_clients, load_s = (8, 5.0) if quick else (32, 30.0)
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-serve-"))
    servers: list[_Server] = []
    try:
        for key, package in build(tmp, quick).items():
            servers.append(start_server(key, package, tmp / f"serve-{key}.log"))
        fp32, auto = sorted(servers, key=lambda s: s.key != "fp32")
        inp = auto.spec["inputs"][0]  # these image models take one input
        x = {inp["name"]: np.random.RandomState(0).standard_normal((64, *inp["shape"][1:])).astype(np.float32)}
        img = x[inp["name"]]
        tensors = [json.dumps({"inputs": img[i:i + 1].tolist()}).encode() for i in range(len(img))]
        bodies = [json.dumps({"images": [b64]}).encode() for b64 in _pngs(img.shape[1:], len(img))] if png else tensors
        rss_ready = _usage(auto.proc.pid)[0]
        engines = {s.key: _engine(s) for s in servers}
        served = _served(servers, bodies, engines, x, total, rounds)
        latency = _one_client(servers, bodies, 100 if quick else 500, rounds)
        protocols = _protocols(auto, x, tensors, total, rounds)
        out = [_picked_row(name, auto)]
        for s in servers:
            out += _package_rows(name, s, served[s.key], engines[s.key], x, "batch-1", "batch 1")
        out += _versus_rows(name, fp32, auto, served, latency, goals)
        out.append(_protocol_row(name, auto, protocols, served[auto.key] if png else None))
        if load:
            rss_before = _usage(auto.proc.pid)[0]
            loaded = loadgen.run(auto.url, bodies, load_clients, seconds=load_s)
            rss_after = _usage(auto.proc.pid)[0]
    finally:
        for s in servers:
            stop(s.proc)
        shutil.rmtree(tmp, ignore_errors=True)

    if load:
        what = f"{auto.label} on {auto.engine} {auto.precision}"
        out += [
            (f"serve load run ({what}): {load_clients} clients x {load_s:g} s on 127.0.0.1, requests (requests/s, "
             "p99 ms)", f"{loaded['done']} ({loaded['rate']:.0f}/s, {loaded['p99']:.1f})", "", ""),
            ("serve load run: errors (non-200 or transport)", str(loaded["errors"]), "0",
             "met" if loaded["errors"] == 0 else "**missed**"),
            (f"serve RSS ({what}), server + predictor process(es): at ready / before / after the load run",
             f"{rss_ready:.0f} / {rss_before:.0f} / {rss_after:.0f} MB", "reported", ""),
        ]
    return out


# ------------------------------------------------------------------ measurements


def _served(servers: list[_Server], bodies: list[bytes], engines: dict[str, Any], x: Feeds, total: int,
            rounds: int) -> dict[str, _Served]:
    """`rounds` x (per server, in alternating order: the engine alone one by one, then `_CLIENTS` clients x
    batch-1 requests), then the engine alone once more each: its rate before and after the served runs."""
    out = {s.key: _Served() for s in servers}
    for s in servers:  # not timed: the first requests on a fresh server (connections, decoders) pay set-up
        loadgen.run(s.url, bodies, _CLIENTS, count=4)
    for r in range(rounds):
        for s in servers if r % 2 == 0 else servers[::-1]:
            rec = out[s.key]
            rec.bare.append(_bare_rate(engines[s.key], x, total))
            before, (_, cpu0) = _batches(s.url), _usage(s.proc.pid)
            got = loadgen.run(s.url, bodies, _CLIENTS, count=total // _CLIENTS)
            after, (_, cpu1) = _batches(s.url), _usage(s.proc.pid)
            rec.rates.append(got["rate"])
            rec.p50.append(got["p50"])
            rec.p99.append(got["p99"])
            rec.done, rec.errors, rec.wall = rec.done + got["done"], rec.errors + got["errors"], rec.wall + got["wall"]
            rec.samples += after[0] - before[0]
            for size, n in _runs_by_bucket(before[1], after[1], s.max_batch).items():
                rec.runs[size] = rec.runs.get(size, 0.0) + n
            rec.cpu = [c + b - a for c, a, b in zip(rec.cpu, cpu0, cpu1)]
    for s in servers:
        out[s.key].bare.append(_bare_rate(engines[s.key], x, total))
    return out


def _one_client(servers: list[_Server], bodies: list[bytes], count: int, rounds: int) -> dict[str, list[float]]:
    """p50 ms of `count` batch-1 requests from one client, per server, interleaved over `rounds`."""
    out: dict[str, list[float]] = {s.key: [] for s in servers}
    for r in range(rounds):
        for s in servers if r % 2 == 0 else servers[::-1]:
            out[s.key].append(loadgen.run(s.url, bodies, 1, count=count)["p50"])
    return out


def v2_request(x: np.ndarray, name: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers tritonclient.http sends for `infer(model, [InferInput(name, shape, "FP32")
    .set_data_from_numpy(x)])`: its JSON header (compact, as rapidjson writes it; outputs binary), then the
    tensor's raw bytes."""
    x = np.ascontiguousarray(x, "<f4")
    head = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}, separators=(",", ":"))
    return head.encode() + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def _protocols(s: _Server, x: Feeds, tensors: list[bytes], total: int, rounds: int) -> dict[str, list[float]]:
    """Requests/s at `_CLIENTS` clients on one (one-input) package: /v1/predict with JSON tensors, /v2 infer
    with the same tensors binary, interleaved over `rounds`; a run with errors raises (its rate would mean
    nothing)."""
    (name, img), = x.items()
    v2 = [v2_request(img[i:i + 1], name) for i in range(len(img))]
    headers = v2[0][1]  # every body has the same shape, so the same JSON header length
    if any(h != headers for _, h in v2):
        raise PipeError("bench: the /v2 bodies' JSON headers differ in length")
    runs = {"v1": dict(bodies=tensors), "v2": dict(bodies=[b for b, _ in v2], content_type="", headers=headers,
                                                   path=f"/v2/models/{s.spec['name']}/infer")}
    out: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for k in runs if r % 2 == 0 else list(runs)[::-1]:
            got = loadgen.run(s.url, count=total // _CLIENTS, clients=_CLIENTS, **runs[k])
            if got["errors"]:
                raise PipeError(f"bench: {got['errors']} errors from {k} on {s.package}")
            out[k].append(got["rate"])
    return out


def _engine(s: _Server) -> Callable[[Feeds], Feeds]:
    """The package's model on its server's engine, precision and threads, loaded here as its predictor
    loads it (`pipeline.serving.predictor.load_engine`: one oneDNN kernel set per bucket), warmed up as the
    predictor warms up (zeros of every input at every bucket size): feeds -> every output, by name."""
    from pipeline.serving import predictor, spec as spec_mod
    from pipeline.serving.validate import sample_shape

    if s.engine == "paddle_inference":
        runtime.import_paddle(s.threads)
    buckets, spec = predictor.buckets(s.max_batch), spec_mod.load_package(s.package)
    eng = predictor.load_engine(spec, s.engine, s.threads, cache_capacity=len(buckets))
    for b in buckets:  # oneDNN builds kernels per shape once
        for _ in range(3):
            eng.run({t.name: np.zeros((b, *sample_shape(spec, t)), t.dtype) for t in spec.io.inputs})
    return eng.run


def _samples(x: Feeds) -> int:
    return len(next(iter(x.values())))


def _bare_rate(eng: Callable[[Feeds], Feeds], x: Feeds, total: int, batch: int = 1) -> float:
    """The engine alone answering inputs in `batch`es one run after the other (copy in, run, copy out), at
    least `total` samples and `_MIN_TIMED_S`: items/s."""
    time.sleep(_SWITCH_PAUSE_S)
    t0, i, n = time.perf_counter(), 0, _samples(x)
    while i * batch < total or time.perf_counter() - t0 < _MIN_TIMED_S:
        j = (i * batch) % (n - batch + 1)
        eng({k: v[j:j + batch] for k, v in x.items()})
        i += 1
    return i * batch / (time.perf_counter() - t0)


def _replay(eng: Callable[[Feeds], Feeds], x: Feeds, runs: dict[int, float]) -> tuple[float, float]:
    """The predictor's runs (bucket size -> count) on the engine alone, repeated for at least `_MIN_TIMED_S`:
    (wall s, CPU s of this process) per replay."""
    xs = {b: {k: np.ascontiguousarray(np.resize(v, (b, *v.shape[1:]))) for k, v in x.items()} for b in runs}
    time.sleep(_SWITCH_PAUSE_S)
    t0, c0, k = time.perf_counter(), time.process_time(), 0
    while k == 0 or time.perf_counter() - t0 < _MIN_TIMED_S:
        for b, n in runs.items():
            for _ in range(int(round(n))):
                eng(xs[b])
        k += 1
    return (time.perf_counter() - t0) / k, (time.process_time() - c0) / k


# ------------------------------------------------------------------ rows


def _int8(s: _Server) -> str:
    """This CPU's int8 capability for the server's engine, said as compress's int8 rows say it."""
    from pipeline.bench import compress as bench_compress

    return bench_compress.int8_tag({"cpu": cpu.capability()}, s.engine)


def _tag(s: _Server) -> str:
    """The engine, precision and this CPU's int8 capability, for a row's label."""
    return f"{s.engine} {s.precision}; {_int8(s)}"


def _picked_row(name: str, s: _Server) -> Row:
    why = (s.spec.get("engine") or {}).get("why", "not recorded in serving.yaml")
    return (f"serve {name}: what `pipe package --engine auto` packaged from its compress dir [{_tag(s)}]",
            f"{s.spec['model'].get('variant')} on {s.engine} {s.precision}: {why}", "", "")


def _package_rows(name: str, s: _Server, rec: _Served, eng: Any, x: Feeds, request: str,
                  bare_what: str) -> list[Row]:
    """One served package against its engine alone: the rows of the first serving benchmark (served
    requests/s, the engine one by one, their ratio, batch sizes, CPU seconds, cost by batch size) and the
    served rate as a fraction of the engine's capacity at the batches the server formed."""
    what, tag = f"{name}, {s.label}", _tag(s)
    n = rec.done // max(len(rec.rates), 1)
    rate, bare = float(np.median(rec.rates)), float(np.mean(rec.bare))
    ratio = rate / bare
    spread = f", range {min(rec.rates):.0f}-{max(rec.rates):.0f} over {len(rec.rates)} runs" \
        if len(rec.rates) > 1 else ""
    runs = sum(rec.runs.values())
    if not runs:
        raise PipeError(f"bench: {s.package}: the server made no predictor runs ({rec.errors} errors)")
    wall, engine_cpu = _replay(eng, x, rec.runs)
    capacity = rec.samples / wall
    served_rate = rec.done / rec.wall

    def per(cpu_s: float) -> str:  # CPU ms per request served
        return f"{1000 * cpu_s / max(rec.done, 1):.2f}"

    batches = ", ".join(f"{int(n)} x {b}" for b, n in sorted(rec.runs.items()) if n)
    return [
        (f"serve {what}: {_CLIENTS} keep-alive clients x {n // _CLIENTS} {request} requests, requests/s "
         f"(p50/p99 ms) [{tag}]", f"{rate:.0f} ({np.median(rec.p50):.1f}/{np.median(rec.p99):.1f}{spread})"
         + (f", {rec.errors} errors" if rec.errors else ""), "", ""),
        (f"bare {s.engine} {s.precision} engine ({what}), {bare_what}, one by one ({s.threads} thread(s)), items/s "
         f"(each run, the last after the served runs) [{tag}]",
         f"{bare:.0f} ({'/'.join(f'{b:.0f}' for b in rec.bare)})", "", ""),
        (f"serve / bare engine one by one, {what} ({os.cpu_count()} cores shared by clients, HTTP server, "
         f"predictor) [{tag}]", f"{ratio:.2f}x", ">= 2x", "met" if ratio >= 2 and not rec.errors else "**missed**"),
        (f"serve {what}: average batch size from /metrics (predictor runs) [{tag}]",
         f"{rec.samples / max(runs, 1):.2f} ({runs:.0f})", "", ""),
        (f"serve {what}: CPU seconds in the served runs: clients (this process) / HTTP server / predictor(s) [{tag}]",
         f"{rec.cpu[0]:.2f} / {rec.cpu[1]:.2f} / {rec.cpu[2]:.2f} ({rec.wall:.2f} s wall)", "", ""),
        (f"serve {what}: served requests/s as a fraction of the engine's own capacity at the batch sizes the server "
         f"formed (its {runs:.0f} predictor runs replayed on the engine alone, {s.threads} thread(s), same cores) "
         f"[{tag}]", f"{served_rate / capacity:.2f} (served {served_rate:.0f}/s, engine alone {capacity:.0f} items/s "
         f"on runs of {batches}); CPU ms per request served: clients {per(rec.cpu[0])} / HTTP server "
         f"{per(rec.cpu[1])} / predictor {per(rec.cpu[2])}, engine alone {per(engine_cpu)}", "reported", ""),
        _batch_cost_row(what, eng, x, s.threads, tag),
    ]


def _versus_rows(name: str, fp32: _Server, auto: _Server, served: dict[str, _Served],
                 latency: dict[str, list[float]], goals: bool) -> list[Row]:
    """auto / Paddle fp32: requests/s at `_CLIENTS` clients and p50 at 1 client (medians of the rounds;
    each round's own ratio beside them). `goals`: issue 14's goals, else reported."""
    tag = f"{auto.engine} {auto.precision} vs {fp32.engine} {fp32.precision}; {_int8(auto)}"
    a, f = served[auto.key], served[fp32.key]
    errors = a.errors + f.errors
    rate = float(np.median(a.rates) / np.median(f.rates))
    p50 = float(np.median(latency[auto.key]) / np.median(latency[fp32.key]))

    def rounds(xs: list[float], ys: list[float]) -> str:
        return f"; per round {'/'.join(f'{u / v:.2f}' for u, v in zip(xs, ys))}" if len(xs) > 1 else ""

    rate_ok, p50_ok = rate >= _GOAL_RATE and not errors, p50 <= _GOAL_P50
    return [
        (f"serve {name}: requests/s at {_CLIENTS} clients x batch-1 requests, {auto.label} / {fp32.label} [{tag}]",
         f"{rate:.2f}x ({np.median(a.rates):.0f}/s vs {np.median(f.rates):.0f}/s{rounds(a.rates, f.rates)})"
         + (f", {errors} errors" if errors else ""), f">= {_GOAL_RATE}x" if goals else "reported",
         ("met" if rate_ok else "**missed**") if goals else ""),
        (f"serve {name}: p50 latency at 1 client, {auto.label} / {fp32.label} [{tag}]",
         f"{p50:.2f}x ({np.median(latency[auto.key]):.2f} ms vs {np.median(latency[fp32.key]):.2f} ms"
         f"{rounds(latency[auto.key], latency[fp32.key])})", f"<= {_GOAL_P50}x" if goals else "reported",
         ("met" if p50_ok else "**missed**") if goals else ""),
    ]


def _protocol_row(name: str, s: _Server, rates: dict[str, list[float]], png: _Served | None) -> Row:
    v1, v2 = float(np.median(rates["v1"])), float(np.median(rates["v2"]))
    also = f"; /v1 with PNGs: {np.median(png.rates):.0f}/s (above)" if png else ""
    return (f"serve {name}, {s.label}: /v2 infer with binary tensors (tritonclient.http's body) / /v1/predict with "
            f"the same tensors as JSON, requests/s at {_CLIENTS} clients x batch-1 [{_tag(s)}]",
            f"{v2 / v1:.2f}x ({v2:.0f}/s vs {v1:.0f}/s{also})", "reported", "")


_COST_BATCHES = (1, 8, 16)


def _batch_cost_row(what: str, eng: Any, x: Feeds, threads: int, tag: str) -> Row:
    """The engine's cost per sample by batch size (what batching can save), then at batch 8 while
    another process keeps a core busy (what sharing the CPU with the HTTP server costs the predictor)."""
    ms = {b: 1000 / _bare_rate(eng, x, 40 * b, b) for b in _COST_BATCHES}
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = 1000 / _bare_rate(eng, x, 320, 8)
    finally:
        spin.kill()
        spin.wait()
    return (f"engine alone ({what}, {threads} thread(s)): ms per sample at batch "
            f"{' / '.join(map(str, _COST_BATCHES))}; at batch 8 with a busy process beside it [{tag}]",
            f"{' / '.join(f'{ms[b]:.2f}' for b in _COST_BATCHES)}; {busy:.2f}", "", "")


def text_rows(quick: bool) -> list[Row]:
    """The serving rows for the text task on text_cnn (`pipeline/bench/ernie.py` does ERNIE's)."""
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-serve-text-"))
    try:
        return served_text_rows("text_cnn text", _build_text_package(tmp, quick), quick)
    except PipeError as e:
        return [("serve text_cnn text", f"failed: {str(e)[-300:]}", "", "**failed**")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def served_text_rows(name: str, package: Path, quick: bool) -> list[Row]:
    """A text package served: 16 keep-alive clients, one review of the test split per request as
    `{"text": [...]}` (tokenized in the server, every model input made from it), against the engine alone
    fed the same reviews encoded as the server encodes them (`pipeline/serving/validate.py` text_feeds),
    one by one."""
    from pipeline import data as data_mod
    from pipeline.config import DataConfig
    from pipeline.serving import spec as spec_mod, validate

    total, rounds = (400, 1) if quick else (2000, 2)
    server = start_server("package", package, package.parent / f"serve-{package.name}.log")
    try:
        ds = data_mod.load(DataConfig(source="chinese_sentiment"))
        texts = [ds.texts[i] for i in ds.test.idx[:256]]
        bodies = [json.dumps({"text": [t]}, ensure_ascii=False).encode() for t in texts]
        spec = spec_mod.load_package(package)
        x = validate.text_feeds(spec.text.encode(texts), spec)
        eng = _engine(server)
        served = _served([server], bodies, {server.key: eng}, x, total, rounds)
        shapes = ", ".join(f"{k} {list(v.shape[1:])}" for k, v in x.items())
        return _package_rows(f"{name}, max_len {spec.text.max_len}", server, served[server.key], eng, x,
                             "one-review", f"the same reviews as {shapes}")
    finally:
        stop(server.proc)


def _pngs(chw: tuple[int, ...], n: int) -> list[str]:
    import base64
    import io

    from PIL import Image

    rng, out = np.random.default_rng(0), []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (chw[1], chw[2], chw[0]), dtype=np.uint8).squeeze()).save(buf, "PNG")
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


# ------------------------------------------------------------------ packages


def _build_mobilenet(tmp: Path, quick: bool) -> dict[str, Path]:
    """mobilenet_v3_small on the compress benchmark's seeded synthetic 3x64x64 data, one epoch (speed,
    not accuracy, is measured), exported, compressed on every engine with the compress benchmark's
    settings (its gates off: the model is near chance), and packaged twice without Triton."""
    from pipeline.bench import compress as bc

    run = tmp / "run"
    data = bc.synthetic(tmp / "synthetic.npz")
    timing = bc.QUICK_TIMING if quick else ()
    bc.pipe("train", "--data", str(data), "--model", "mobilenet_v3_small", "--epochs", "1", "--run", str(run), cwd=tmp)
    bc.pipe("export", str(run / "train"), cwd=tmp)
    bc.pipe("compress", str(run / "export"), "--int8", "--backend", "both", "--calib-batches", "4", "--max-drop", "100",
            *bc.sets(("compress.min_agreement=0", *timing)), cwd=tmp)
    return _package_pair(run / "compress")


def _build_digits(tmp: Path, quick: bool) -> dict[str, Path]:
    """`make demo`'s `pipe all --config examples/digits.yaml` (train, export, compress on every engine with
    the example's gates, package, report), then the pair of packages from its compress dir. quick trains 1
    epoch (same model, same cost per inference) and so turns the accuracy gates off."""
    from pipeline.bench import compress as bc

    run = tmp / "run"
    sets = ("train.epochs=1", "compress.max_drop=100", "compress.min_agreement=0", *bc.QUICK_TIMING) if quick else ()
    bc.pipe("all", "--config", str(_REPO / "examples/digits.yaml"), "--run", str(run), *bc.sets(sets), cwd=tmp)
    return _package_pair(run / "compress")


def _package_pair(comp: Path) -> dict[str, Path]:
    """`pipe package COMPRESS --engine auto` and `--variant fp32` (Paddle Inference fp32), without Triton."""
    from pipeline.bench import compress as bc

    out = {"auto": comp.parent / "package-auto", "fp32": comp.parent / "package-fp32"}
    bc.pipe("package", str(comp), "--engine", "auto", "--no-triton", "--out", str(out["auto"]), cwd=comp.parent)
    bc.pipe("package", str(comp), "--variant", "fp32", "--no-triton", "--out", str(out["fp32"]), cwd=comp.parent)
    return out


def _build_text_package(tmp: Path, quick: bool) -> Path:
    """train (text_cnn on the built-in corpus; quick: 1 epoch), export, package without Triton."""
    from pipeline.bench import compress as bc

    run = tmp / "run"
    bc.pipe("train", "--data", "chinese_sentiment", "--model", "text_cnn", "--epochs", "1" if quick else "3",
            "--run", str(run), cwd=tmp)
    bc.pipe("export", str(run / "train"), cwd=tmp)
    bc.pipe("package", str(run / "export"), "--no-triton", cwd=tmp)
    return run / "package"


# ------------------------------------------------------------------ servers


_READY = re.compile(r"\((\S+) (\S+), (?:\d+ HTTP processes, each )?\d+ predictor\(s\) x (\d+) thread\(s\), batch <= (\d+)[^\n]* "
                    r"listening on (http://127\.0\.0\.1:\d+)")


def start_server(key: str, package: Path, log_path: Path, *flags: str) -> _Server:
    """`pipe serve PACKAGE --port 0 FLAGS` on 127.0.0.1; returns once /readyz is 200."""
    import httpx

    cmd = [sys.executable, "-m", "pipeline.cli", "serve", str(Path(package).resolve()), "--host", "127.0.0.1",
           "--port", "0", *flags]
    with open(log_path, "wb") as log:  # a file, not a pipe: nothing to drain while the load runs
        proc = subprocess.Popen(cmd, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + _START_S
    try:
        with httpx.Client(timeout=5) as c:
            while True:
                text = log_path.read_text(errors="replace")
                m = _READY.search(text)
                if m:
                    try:
                        if c.get(m[5] + "/readyz").status_code == 200:
                            spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
                            return _Server(key, package, proc, m[5], m[1], m[2], int(m[3]), int(m[4]), spec)
                    except httpx.TransportError:
                        pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise PipeError(f"bench: `pipe serve` not ready (exit {proc.poll()}): {text.strip()[-500:]}")
                time.sleep(0.1)
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains, then closes its predictors), wait, else kill it and its predictors."""
    children = _children(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    for pid in children:  # they exit on their own when the server's pipe closes; this is the fallback
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (fields 3..); [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    """Every descendant of `pid`: a server's predictors, or its HTTP processes and theirs (`--http-workers`)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            f = _stat(d.name)
            if f:
                parents.setdefault(f[1], []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(str(todo.pop()), [])
        out += kids
        todo += kids
    return out


def _usage(pid: int) -> tuple[float, list[float]]:
    """VmRSS in MB of the server plus its descendants, and CPU seconds (user + system) so far of
    [this process (the load generator), the server, its descendants (predictors, HTTP processes)]."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    rss, cpu_s = 0.0, [me.ru_utime + me.ru_stime, 0.0, 0.0]
    for i, p in enumerate((pid, *_children(pid))):
        with contextlib.suppress(OSError, TypeError):  # exited while we looked
            rss += int(re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text(), re.M)[1]) / 1024
        f = _stat(p)
        cpu_s[min(i, 1) + 1] += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else 0.0  # utime, stime
    return rss, cpu_s


def _batches(url: str) -> tuple[float, dict[float, float]]:
    """Samples so far, and the pipe_batch_size histogram's cumulative counts (le -> predictor runs)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=_HTTP_TIMEOUT_S).text
    found = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("pipe_batch_size_"))
    le = {float(m[1]): float(v) for k, v in found.items()
          if (m := re.fullmatch(r'pipe_batch_size_bucket\{le="([0-9.]+)"\}', k))}
    return float(found["pipe_batch_size_sum"]), le


def _runs_by_bucket(before: dict[float, float], after: dict[float, float], max_batch: int) -> dict[int, float]:
    """Predictor runs between two histogram reads, by the bucket size the predictor ran them at. The
    histogram's edges are powers of two, as the predictor's buckets (1, 2, 4, ... below max_batch, and
    max_batch), so the runs in (2^(k-1), 2^k] ran at the first bucket >= 2^k, or at max_batch."""
    from pipeline.serving import predictor

    buckets = predictor.buckets(max_batch)
    out: dict[int, float] = {}
    below = 0.0
    for edge in sorted(after):
        n = (after[edge] - before.get(edge, 0.0)) - below
        below += n
        if n > 0:
            size = min([b for b in buckets if b >= edge] or [max_batch])
            out[size] = out.get(size, 0.0) + n
    return out
