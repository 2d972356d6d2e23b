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
"""

from __future__ import annotations

import threading
import time
from typing import Any

_KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


class Stats:
    """Counters of one model, updated by the event loop (requests) and the batcher threads (batches)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.d = {k: [0, 0] for k in _KINDS}  # [count, ns]
        self.inference_count = self.execution_count = 0
        self.last_inference = 0
        self.batches: dict[int, list[int]] = {}  # samples -> [count, input ns, infer ns, output ns]

    def request(self, ok: bool, ns: int) -> None:
        with self._lock:
            d = self.d["success" if ok else "fail"]
            d[0] += 1
            d[1] += ns

    def batch(self, queued_ns: list[int], samples: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One predictor run of len(queued_ns) requests (each waited queued_ns in the queue)."""
        n = len(queued_ns)
        with self._lock:
            self.d["queue"][0] += n
            self.d["queue"][1] += sum(queued_ns)
            for kind, ns in (("compute_input", input_ns), ("compute_infer", infer_ns), ("compute_output", output_ns)):
                self.d[kind][0] += n
                self.d[kind][1] += n * ns
            self.inference_count += samples
            self.execution_count += 1
            self.last_inference = time.time_ns() // 1_000_000
            b = self.batches.setdefault(samples, [0, 0, 0, 0])
            b[0] += 1
            b[1] += input_ns
            b[2] += infer_ns
            b[3] += output_ns

    def doc(self, name: str, version: str) -> dict[str, Any]:
        """Triton's JSON: {"model_stats": [one model]}."""
        with self._lock:
            stats = {k: {"count": c, "ns": ns} for k, (c, ns) in self.d.items()}
            batches = [{"batch_size": size, "compute_input": {"count": c, "ns": i},
                        "compute_infer": {"count": c, "ns": f}, "compute_output": {"count": c, "ns": o}}
                       for size, (c, i, f, o) in sorted(self.batches.items())]
            return {"model_stats": [{
                "name": name, "version": version, "last_inference": self.last_inference,
                "inference_count": self.inference_count, "execution_count": self.execution_count,
                "inference_stats": {**stats, "cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                "response_stats": {},
                "batch_stats": batches, "memory_usage": []}]}
