"""Several HTTP processes on one port: `pipe serve --http-workers N` (serving.yaml `server.http_workers`).

One Python event loop parses, checks and answers every request of a `pipe serve` process; at a few
thousand small requests a second that thread is the server's limit while the cores beside it idle
(docs/benchmarks.md). So, as uvicorn's and gunicorn's `--workers` do, `pipe serve` can run N worker
processes, each a whole server (its event loop, batcher and predictor processes, `server.py`), all
accepting on the one listening socket the first process bound and handed down (the kernel gives each new
connection to one of them). Batches form per worker. The first process stays as the supervisor: it
verifies the package and binds before any worker starts (so a bad flag or a taken port is one line, once),
prints the banner once every worker has loaded, forwards SIGTERM / Ctrl-C (a worker drains as a single
server does), restarts a worker that dies while serving, and prints the total when all have stopped.

What a client sees is one server:
- Triton's statistics (`stats.Stats`), the gauges and the garbage-collector counters live in one file
  every worker maps (`Board`: a row per worker); every worker answers with the sum of the rows;
- prometheus-client's counters and histograms use its multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`: a
  value file per process, summed at scrape time);
- `/readyz` is 200 only once every worker is warm (and this one is not draining);
- the reference check runs once, in worker 0, on the same engine, package and threads as every worker's;
  the others wait for its result and report it;
- gRPC (`--grpc-port`) is served by every worker on the one port (SO_REUSEPORT among them, `grpcv2.start`).
A worker dies with its supervisor (PR_SET_PDEATHSIG), its predictors with their worker (their stdin closes).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, errors
from pipeline.errors import PipeError
from pipeline.serving import stats as stats_mod

ENV = "PIPE_SERVE_WORKER"  # internal: a worker's place, set by `supervise` ({"index", "fd", "dir", "workers", "config"})
PROMETHEUS_ENV = "PROMETHEUS_MULTIPROC_DIR"
MAX_WORKERS = 4  # the auto choice's cap: 4 event loops serve more than any one model's predictors here

# A worker's row: its state, gauges and garbage-collector counters, then its statistics (`stats.size`).
STARTING, LOADED, READY = 0, 1, 2
_STATE, _INFLIGHT, _QUEUE, _HANDLED, _GC = 0, 1, 2, 3, 4  # _GC: [count, ns] x 3 generations per process
_POLL_S = 0.1
_RESTARTS = 5  # a worker that keeps dying is not restarted forever: the server stops (exit 1)


def auto(cores: int) -> int:
    """`http_workers: 0`: one HTTP process per core, at most MAX_WORKERS (docs/benchmarks.md: on 2 cores two
    served 1.45x one's requests/s on digits at concurrency 16; three were no faster than two)."""
    return max(1, min(cores, MAX_WORKERS))


@dataclass(frozen=True)
class Place:
    """What a worker process knows of the server it is part of."""
    index: int
    fd: int  # the listening socket, inherited
    dir: Path  # the board, the reference check's result, prometheus-client's files
    workers: int
    config: dict[str, Any]  # the supervisor's ServeConfig, as a dict


def current() -> Place | None:
    """This process's place in a server of several HTTP workers, or None (a server of one)."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    doc = json.loads(raw)
    return Place(int(doc["index"]), int(doc["fd"]), Path(doc["dir"]), int(doc["workers"]), doc["config"])


class Board:
    """One int64 row per worker in DIR/board.bin, mapped by every worker and the supervisor."""

    def __init__(self, path: Path, workers: int, predictors: int, max_batch: int, create: bool = False):
        self.gauges = _GC + 6 * (1 + predictors)  # [state, inflight, queue, handled, gc of the server and each predictor]
        self.predictors = predictors
        shape = (workers, self.gauges + stats_mod.size(max_batch))
        self.rows = np.memmap(path, np.int64, "w+" if create else "r+", shape=shape)

    @classmethod
    def at(cls, d: Path, workers: int, predictors: int, max_batch: int, create: bool = False) -> "Board":
        return cls(d / "board.bin", workers, predictors, max_batch, create)

    def stats(self, index: int) -> stats_mod.Stats:
        """Worker `index`'s statistics, answering with every worker's sum."""
        return stats_mod.Stats(row=self.rows[index, self.gauges:], rows=self.rows[:, self.gauges:])

    def set_state(self, index: int, state: int) -> None:
        self.rows[index, _STATE] = state

    def all_ready(self) -> bool:
        return bool((self.rows[:, _STATE] == READY).all())

    def loaded(self) -> bool:
        return bool((self.rows[:, _STATE] >= LOADED).all())

    def publish(self, index: int, inflight: int, queued: int, handled: int, gcs: list[list[list[float]]]) -> None:
        """A worker's gauges now; `gcs`: the server's and each predictor's [[collections, seconds] per generation]."""
        r = self.rows[index]
        r[_INFLIGHT], r[_QUEUE], r[_HANDLED] = inflight, queued, handled
        for p, gens in enumerate(gcs[:1 + self.predictors]):
            for g, (c, s) in enumerate(gens):
                r[_GC + 6 * p + 2 * g] = int(c)
                r[_GC + 6 * p + 2 * g + 1] = int(s * 1e9)

    def handled(self) -> list[int]:
        """Inference requests each worker has handled (as of its last publish)."""
        return [int(v) for v in self.rows[:, _HANDLED]]

    def total(self, field: str) -> int:
        at = {"inflight": _INFLIGHT, "queue": _QUEUE, "handled": _HANDLED}[field]
        return int(self.rows[:, at].sum())

    def gc(self) -> list[tuple[int, str, list[list[float]]]]:
        """(worker, process: "server" or "predictor-N", [[collections, seconds] per generation]) of every
        worker and its predictors (a predictor's as of its last batch: none before its first)."""
        out = []
        for w, r in enumerate(np.array(self.rows[:, :self.gauges])):
            for p in range(1 + self.predictors):
                gens = [[int(r[_GC + 6 * p + 2 * g]), r[_GC + 6 * p + 2 * g + 1] / 1e9] for g in range(3)]
                if p == 0 or any(c for c, _ in gens):
                    out.append((w, "server" if p == 0 else f"predictor-{p - 1}", gens))
        return out


def die_with_parent() -> None:
    """Linux: SIGTERM this process when the supervisor exits, however it exits (a worker then drains and stops);
    if the supervisor is already gone, stop now."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        raise SystemExit(0)


def write_failure(place: Place, e: PipeError) -> None:
    """A worker's error while loading, for the supervisor to say once (`failure`) instead of each worker."""
    artifacts.write_text_atomic(place.dir / f"failed-{place.index}.json",
                                json.dumps({"class": type(e).__name__, "message": str(e)}))


def failure(d: Path, index: int, code: int) -> PipeError:
    """The error worker `index` reported before it exited `code` while loading, as the error it was."""
    try:
        doc = json.loads((d / f"failed-{index}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return PipeError(f"HTTP worker {index} exited ({code}) while loading; its stderr is above")
    kind = getattr(errors, str(doc.get("class")), PipeError)
    return (kind if isinstance(kind, type) and issubclass(kind, PipeError) else PipeError)(doc["message"])


def write_reference(place: Place, checked: dict[str, Any] | None) -> None:
    """Worker 0's reference check result for the others (`read_reference`), written whole or not at all."""
    artifacts.write_text_atomic(place.dir / "reference.json", json.dumps({"checked": checked}))


def read_reference(place: Place, timeout: float) -> dict[str, Any] | None:
    """Worker 0's reference check result; a worker >0 waits for it (worker 0 failing stops the server)."""
    path = place.dir / "reference.json"
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise PipeError(f"pipe serve: HTTP worker {place.index}: worker 0's reference check did not finish "
                            f"within {timeout:g} s")
        time.sleep(_POLL_S)
    return json.loads(path.read_text(encoding="utf-8"))["checked"]


def supervise(sock: Any, n: int, predictors: int, max_batch: int, config: dict[str, Any], package: Path,
              banner: str, drain_s: float) -> tuple[int, int]:
    """Run `n` workers on the bound `sock` until they have all stopped (after SIGTERM / Ctrl-C and their drain).
    Returns (requests handled, still in flight when they stopped). A worker that fails while loading stops the
    server: its error is raised here, said once (`write_failure`)."""
    d = Path(tempfile.mkdtemp(prefix="pipe-serve-"))
    (d / "prometheus").mkdir()
    board = Board.at(d, n, predictors, max_batch, create=True)
    procs: list[subprocess.Popen] = []  # by worker index
    stopping = [0]

    def spawn(i: int) -> subprocess.Popen:
        place = {"index": i, "fd": sock.fileno(), "dir": str(d), "workers": n, "config": config}
        # UV_TCP_SINGLE_ACCEPT: libuv (uvloop's) accepts one connection per wake-up and yields, so a burst of
        # new connections spreads over the workers instead of going to whichever woke first
        env = dict(os.environ, **{ENV: json.dumps(place), PROMETHEUS_ENV: str(d / "prometheus"),
                                  "UV_TCP_SINGLE_ACCEPT": "1"})
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", str(package)], env=env,
                                pass_fds=[sock.fileno()], start_new_session=True,  # [signal] Ctrl-C reaches us alone
                                stdout=None if i == 0 else subprocess.DEVNULL)

    def forward(sig: int, frame: Any) -> None:  # [signal] the first drains every worker, a second stops them now
        stopping[0] += 1
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    restarts, announced = 0, False
    try:
        procs += [spawn(i) for i in range(n)]
        while True:
            if stopping[0] and all(p.poll() is not None for p in procs):
                break
            for i, p in enumerate(procs):
                if p.poll() is None or stopping[0]:
                    continue
                if not announced:  # failed while loading: stop the others, say why once
                    forward(signal.SIGTERM, None)
                    _wait_all(procs, 10.0)
                    raise failure(d, i, p.returncode)
                restarts += 1
                if restarts > _RESTARTS:
                    forward(signal.SIGTERM, None)
                    _wait_all(procs, drain_s + 10.0)
                    raise PipeError(f"HTTP worker {i} exited ({p.returncode}) after {_RESTARTS} restarts of workers: "
                                    "stopping the server (their stderr is above)")
                print(f"pipe serve: HTTP worker {i} exited ({p.returncode}); restarting it", file=sys.stderr,
                      flush=True)
                board.set_state(i, STARTING)
                procs[i] = spawn(i)
            if not announced and board.loaded():
                print(banner, flush=True)
                announced = True
            time.sleep(_POLL_S)
        return board.total("handled"), board.total("inflight")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        del board
        shutil.rmtree(d, ignore_errors=True)


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
