"""`pipe bench` serving rows: `pipe serve` under concurrent batch-1 load vs a bare predictor one by one.

    python -c "from pipeline import bench_serving; print(bench_serving.rows(quick=True))"
    python -c "from pipeline import bench_serving; print(bench_serving.text_rows(quick=True))"

`rows` builds a digits package in a temp dir, starts `pipe serve` on a free port on 127.0.0.1 and loads it
with keep-alive clients from this process (`pipeline/loadgen.py`: asyncio, 0.1-0.2 ms of CPU per request; a
fixed count, then a fixed time: every load stops by itself).
`text_rows` does the same for the built-in Chinese sentiment task (text_cnn): one review per request as
`{"text": [...]}`, tokenized in the server, against a bare predictor fed the same reviews encoded to
max_len one by one. On a 2-core machine the clients, the HTTP server and the predictor share the CPU:
quote the ratio with that.
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
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from pipeline import loadgen, runtime
from pipeline.errors import PipeError

_REPO = Path(__file__).resolve().parents[1]
_START_S = 180.0  # the server's paddle import and warm-up on a busy machine
_STOP_S = 40.0  # longer than the server's 30 s drain
_HTTP_TIMEOUT_S = 30.0


def rows(quick: bool) -> list[tuple[str, str, str, str]]:
    """Measurement rows (measurement, result, goal, status) for `pipe bench`'s table: digits (with the
    bounded load run), then mobilenet_v3_small at 3x64x64, where the model, not HTTP, is the cost."""
    return _image_rows(quick, "digits_cnn 1x8x8", _build_package, load=True) + \
        _image_rows(quick, "mobilenet_v3_small 3x64x64 PNG", _build_mobilenet_package, load=False, png=True)


def _image_rows(quick: bool, name: str, build: Callable[[Path, bool], Path],
                load: bool, png: bool = False) -> list[tuple[str, str, str, str]]:
    """`png`: requests carry base64 PNGs (decoded and normalised in the server) instead of JSON float
    tensors, whose parsing costs the server ~4 ms per 3x64x64 request; the bare predictor gets tensors."""
    clients, total = 16, 400 if quick else 2000
    load_clients, load_s = (8, 5.0) if quick else (32, 30.0)
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-serve-"))
    proc = None
    try:
        package = build(tmp, quick)
        proc, url, threads = _start_server(package, tmp / "serve.log")
        spec = yaml.safe_load((package / "serving.yaml").read_text())
        x = np.random.RandomState(0).standard_normal((64, *spec["input"]["shape"][1:])).astype(np.float32)
        bodies = [json.dumps({"inputs": x[i:i + 1].tolist()}).encode() for i in range(len(x))]
        if png:
            bodies = [json.dumps({"images": [b64]}).encode() for b64 in _pngs(x.shape[1:], len(x))]
        rss_ready = _usage(proc.pid)[0]

        n_bare = max(total, 2000) if load else total  # digits: ~1 s; shorter loops are all noise
        out = _side_by_side(proc, url, bodies, _bare_predictor(package, spec, threads), x, n_bare, clients, total,
                            name, "batch-1", "batch 1 (oneDNN)", threads)

        if load:
            rss_before = _usage(proc.pid)[0]
            loaded = loadgen.run(url, bodies, load_clients, seconds=load_s)
            rss_after = _usage(proc.pid)[0]
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    if load:
        out += [
            (f"serve load run: {load_clients} clients x {load_s:g} s on 127.0.0.1, requests (requests/s, p99 ms)",
             f"{loaded['done']} ({loaded['rate']:.0f}/s, {loaded['p99']:.1f})", "", ""),
            ("serve load run: errors (non-200 or transport)", str(loaded["errors"]), "0",
             "met" if loaded["errors"] == 0 else "**missed**"),
            ("serve RSS, server + predictor process(es): at ready / before / after the load run",
             f"{rss_ready:.0f} / {rss_before:.0f} / {rss_after:.0f} MB", "reported", ""),
        ]
    return out


def _side_by_side(proc: subprocess.Popen, url: str, bodies: list[bytes], bare_loop: Callable[..., float],
                  x: np.ndarray, n_bare: int, clients: int, total: int, name: str, request: str, bare_what: str,
                  threads: int) -> list[tuple[str, str, str, str]]:
    """Interleaved bare, served, bare (the machine's noise hits both sides), then the predictor's own
    cost by batch size: the rows of one served model against its bare predictor."""
    bare = [bare_loop(x, n_bare)]
    before, (_, cpu0) = _batches(url), _usage(proc.pid)
    served = loadgen.run(url, bodies, clients, count=total // clients)
    after, (_, cpu1) = _batches(url), _usage(proc.pid)
    bare.append(bare_loop(x, n_bare))
    bare_rate = float(np.mean(bare))
    ratio = served["rate"] / bare_rate
    samples, runs = after[0] - before[0], after[1] - before[1]
    cpu = [b - a for a, b in zip(cpu0, cpu1)]
    return [
        (f"serve {name}: {clients} keep-alive clients x {total // clients} {request} requests, requests/s "
         f"(p50/p99 ms)", f"{served['rate']:.0f} ({served['p50']:.1f}/{served['p99']:.1f})"
         + (f", {served['errors']} errors" if served["errors"] else ""), "", ""),
        (f"bare Paddle Inference predictor ({name}), {bare_what}, one by one ({threads} thread(s)), items/s "
         "(before/after the served run)", f"{bare_rate:.0f} ({bare[0]:.0f}/{bare[1]:.0f})", "", ""),
        (f"serve / bare predictor one by one, {name} ({os.cpu_count()} cores shared by clients, HTTP server, "
         "predictor)", f"{ratio:.2f}x", ">= 2x", "met" if ratio >= 2 and not served["errors"] else "**missed**"),
        (f"serve {name}: average batch size from /metrics (predictor runs)",
         f"{samples / max(runs, 1):.2f} ({runs:.0f})", "", ""),
        (f"serve {name}: CPU seconds in the served run: clients (this process) / HTTP server / predictor(s)",
         f"{cpu[0]:.2f} / {cpu[1]:.2f} / {cpu[2]:.2f} ({served['wall']:.2f} s wall)", "", ""),
        _batch_cost_row(name, bare_loop, x, threads),
    ]


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


def _build_mobilenet_package(tmp: Path, quick: bool) -> Path:
    """mobilenet_v3_small on the compress benchmark's seeded synthetic 3x64x64 data, one epoch (speed,
    not accuracy, is measured), exported and packaged fp32 without Triton."""
    from pipeline import bench_compress

    run = tmp / "run"
    data = bench_compress.synthetic(tmp / "synthetic.npz")
    return _train_export_package(run, ["--data", str(data), "--model", "mobilenet_v3_small", "--epochs", "1"])


def _build_package(tmp: Path, quick: bool) -> Path:
    """`pipe all` without int8: train, export, package (fp32). quick trains 1 epoch: same model, same cost
    per inference."""
    run = tmp / "run"
    sets = ["--set", "compress.int8=false"] + (["--set", "train.epochs=1"] if quick else [])
    cmd = [sys.executable, "-m", "pipeline.cli", "all", "--config", "examples/digits.yaml", "--run", str(run), *sets]
    r = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise PipeError(f"bench: `pipe all` failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return run / "package"


def _start_server(package: Path, log_path: Path) -> tuple[subprocess.Popen, str, int]:
    """`pipe serve PACKAGE --port 0` on 127.0.0.1; returns once /readyz is 200 (its URL, predictor threads)."""
    import httpx

    cmd = [sys.executable, "-m", "pipeline.cli", "serve", str(package), "--host", "127.0.0.1", "--port", "0"]
    with open(log_path, "wb") as log:  # a file, not a pipe: nothing to drain while the load runs
        proc = subprocess.Popen(cmd, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + _START_S
    try:
        with httpx.Client(timeout=5) as c:
            while True:
                text = log_path.read_text(errors="replace")
                m = re.search(r"x (\d+) thread\(s\).* listening on (http://127\.0\.0\.1:\d+)", text)
                if m:
                    try:
                        if c.get(m[2] + "/readyz").status_code == 200:
                            return proc, m[2], int(m[1])
                    except httpx.TransportError:
                        pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise PipeError(f"bench: `pipe serve` not ready (exit {proc.poll()}): {text.strip()[-500:]}")
                time.sleep(0.1)
    except BaseException:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen) -> None:
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
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _stat(d.name)[1:2] == [str(pid)]]


def _usage(pid: int) -> tuple[float, list[float]]:
    """VmRSS in MB of the server plus its predictor children, and CPU seconds (user + system) so far of
    [this process (the load generator), the server, its predictors]."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    rss, cpu = 0.0, [me.ru_utime + me.ru_stime, 0.0, 0.0]
    for i, p in enumerate((pid, *_children(pid))):
        with contextlib.suppress(OSError, TypeError):  # exited while we looked
            rss += int(re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text(), re.M)[1]) / 1024
        f = _stat(p)
        cpu[min(i, 1) + 1] += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else 0.0  # utime, stime
    return rss, cpu


def _batches(url: str) -> tuple[float, float]:
    """(samples, predictor runs) so far, from the pipe_batch_size histogram in /metrics."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=_HTTP_TIMEOUT_S).text
    found = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith("pipe_batch_size_"))
    return float(found["pipe_batch_size_sum"]), float(found["pipe_batch_size_count"])


def _bare_predictor(package: Path, spec: dict, threads: int) -> Callable[..., float]:
    """The package's model in Paddle Inference as the server configures it (oneDNN, same threads); the
    loop answers inputs one by one (copy in, run, copy out; `batch` samples per run) and returns items/s."""
    paddle = runtime.import_paddle(threads)
    c = paddle.inference.Config(str(package / spec["model"]["program"]), str(package / spec["model"]["params"]))
    if not c.onednn_enabled():
        c.enable_onednn()
    c.set_cpu_math_library_num_threads(threads)
    c.disable_glog_info()
    pred = paddle.inference.create_predictor(c)
    h_in = pred.get_input_handle(spec["input"]["name"])
    h_out = pred.get_output_handle(spec["output"]["name"])

    def loop(x: np.ndarray, total: int, batch: int = 1) -> float:
        runs = max(1, total // batch)
        t0 = time.perf_counter()
        for i in range(runs):
            j = (i * batch) % (len(x) - batch + 1)
            h_in.copy_from_cpu(x[j:j + batch])
            pred.run()
            h_out.copy_to_cpu()
        return runs * batch / (time.perf_counter() - t0)

    sample = [int(spec["text"]["max_len"])] if spec.get("text") else spec["input"]["shape"][1:]
    for batch in _COST_BATCHES:  # oneDNN builds kernels per shape once
        loop(np.zeros((batch, *sample), spec["input"]["dtype"]), 5 * batch, batch)
    return loop


_COST_BATCHES = (1, 8, 16)


def _batch_cost_row(name: str, loop: Callable[..., float], x: np.ndarray, threads: int) -> tuple[str, str, str, str]:
    """The predictor's cost per sample by batch size (what batching can save), then at batch 8 while
    another process keeps a core busy (what sharing the CPU with the HTTP server costs the predictor)."""
    ms = {b: 1000 / loop(x, 40 * b, b) for b in _COST_BATCHES}
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = 1000 / loop(x, 320, 8)
    finally:
        spin.kill()
        spin.wait()
    return (f"predictor alone ({name}, {threads} thread(s)): ms per sample at batch "
            f"{' / '.join(map(str, _COST_BATCHES))}; at batch 8 with a busy process beside it",
            f"{' / '.join(f'{ms[b]:.2f}' for b in _COST_BATCHES)}; {busy:.2f}", "", "")


def text_rows(quick: bool) -> list[tuple[str, str, str, str]]:
    """The serving rows for the text task: 16 keep-alive clients, one review per request, vs a bare
    predictor on the same reviews (encoded with the package's vocabulary, max_len) one by one."""
    from pipeline import data as data_mod
    from pipeline.config import DataConfig

    clients, total = 16, 400 if quick else 2000
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-serve-text-"))
    proc = None
    try:
        package = _build_text_package(tmp, quick)
        proc, url, threads = _start_server(package, tmp / "serve.log")
        spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
        ds = data_mod.load(DataConfig(source="chinese_sentiment"))
        texts = [ds.texts[i] for i in ds.test.idx[:256]]
        bodies = [json.dumps({"text": [t]}, ensure_ascii=False).encode() for t in texts]
        vocab = {t: i for i, t in enumerate(json.loads((package / "vocab.json").read_text(encoding="utf-8")))}
        x = data_mod.encode_texts(texts, vocab, int(spec["text"]["max_len"]))
        max_len = spec["text"]["max_len"]
        return _side_by_side(proc, url, bodies, _bare_predictor(package, spec, threads), x, max(total, 500),
                             clients, total, f"text_cnn text, max_len {max_len}", "one-review",
                             f"the same reviews as ids [1, {max_len}]", threads)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _build_text_package(tmp: Path, quick: bool) -> Path:
    """train (text_cnn on the built-in corpus; quick: 1 epoch), export, package without Triton."""
    run = tmp / "run"
    return _train_export_package(run, ["--data", "chinese_sentiment", "--model", "text_cnn",
                                       "--epochs", "1" if quick else "3"])


def _train_export_package(run: Path, train_args: list[str]) -> Path:
    """`pipe train ... --run RUN`, `pipe export`, `pipe package --no-triton`, each a child process."""
    steps = [["train", *train_args, "--run", str(run)], ["export", str(run / "train")],
             ["package", str(run / "export"), "--no-triton"]]
    for args in steps:
        r = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=_REPO, capture_output=True, text=True,
                           timeout=1800, check=False)
        if r.returncode != 0:
            raise PipeError(f"bench: `pipe {args[0]}` failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return run / "package"
