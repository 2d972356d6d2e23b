"""Triton's statistics extension for the served model: `GET /v2/models/NAME[/versions/V]/stats` and gRPC's
ModelStatistics, in Triton's JSON (tritonclient's `get_inference_statistics`, perf_analyzer's server-side
numbers).

Counted as Triton counts them (server docs/protocol/extension_statistics.md): `success` and `fail`, each
inference request (any endpoint that runs the model: /v1, Paddle Serving's, /v2, gRPC) from admission to
its answer; `queue`, each request's wait in the batcher's queue; `compute_input` (the batch formed: inputs
concatenated), `compute_infer` (the predictor's run: the pipe both ways and the engine) and
`compute_output` (outputs split back to their requests), each request charged its batch's time;
`inference_count` samples and `execution_count` batches; `batch_stats` per batch size (samples), once per
batch. Durations in ns, `last_inference` in ms since the epoch. Cache counters are always 0 (no cache).

The counters are one int64 row (`size`); a server of several HTTP processes keeps one row per process in a file
all of them map (`pipeline/serving/workers.py`), and every process answers with the sum of the rows.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

_KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
_INFERENCES, _EXECUTIONS, _LAST = 2 * len(_KINDS), 2 * len(_KINDS) + 1, 2 * len(_KINDS) + 2
_BATCHES = _LAST + 1  # then per batch size 0..max_batch: [count, input ns, infer ns, output ns]


def size(max_batch: int) -> int:
    """The int64s of one row of counters for batches of at most `max_batch` samples."""
    return _BATCHES + 4 * (max_batch + 1)


class Stats:
    """Counters of one model, updated by the event loop (requests) and the batcher threads (batches), in `row`
    (this process's; default its own array); `rows` (default `row` alone) are every process's, summed by `doc`."""

    def __init__(self, max_batch: int = 4096, row: np.ndarray | None = None, rows: np.ndarray | None = None):
        self._lock = threading.Lock()
        self.row = np.zeros(size(max_batch), np.int64) if row is None else row
        self.rows = self.row[None] if rows is None else rows

    def request(self, ok: bool, ns: int) -> None:
        at = 0 if ok else 2
        with self._lock:
            self.row[at] += 1
            self.row[at + 1] += ns

    def batch(self, queued_ns: list[int], samples: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One predictor run of len(queued_ns) requests (each waited queued_ns in the queue)."""
        n = len(queued_ns)
        r = self.row
        with self._lock:
            r[4] += n
            r[5] += sum(queued_ns)
            for at, ns in ((6, input_ns), (8, infer_ns), (10, output_ns)):
                r[at] += n
                r[at + 1] += n * ns
            r[_INFERENCES] += samples
            r[_EXECUTIONS] += 1
            r[_LAST] = time.time_ns() // 1_000_000
            b = _BATCHES + 4 * samples
            if b + 4 > len(r):  # larger than any batch the batcher forms: not kept per size
                return
            r[b] += 1
            r[b + 1] += input_ns
            r[b + 2] += infer_ns
            r[b + 3] += output_ns

    def doc(self, name: str, version: str) -> dict[str, Any]:
        """Triton's JSON: {"model_stats": [one model]}, every process's counters summed."""
        with self._lock:
            rows = np.array(self.rows)  # a copy: other processes go on counting
        last = int(rows[:, _LAST].max())
        t = [int(v) for v in rows.sum(axis=0)]
        stats = {k: {"count": t[2 * i], "ns": t[2 * i + 1]} for i, k in enumerate(_KINDS)}
        batches = [{"batch_size": size_, "compute_input": {"count": c, "ns": i},
                    "compute_infer": {"count": c, "ns": f}, "compute_output": {"count": c, "ns": o}}
                   for size_, (c, i, f, o) in enumerate(zip(*[iter(t[_BATCHES:])] * 4)) if c]
        return {"model_stats": [{
            "name": name, "version": version, "last_inference": last,
            "inference_count": t[_INFERENCES], "execution_count": t[_EXECUTIONS],
            "inference_stats": {**stats, "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
            "response_stats": {},
            "batch_stats": batches, "memory_usage": []}]}
