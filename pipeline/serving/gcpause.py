"""Python's cyclic garbage collector, kept off the request path of `pipe serve`'s processes.

A full (generation 2) collection walks every tracked object of the process. After start-up that is
every object Paddle, onnxruntime, FastAPI and pydantic created on import: in the HTTP process a
collection every few thousand requests paused the event loop for tens of milliseconds, which was the
server's p99 (issue 21: p99 36.2 ms with the collector against 7.3-8.3 ms with it disabled, same run).
So each process, once it has loaded and warmed up, collects once and freezes what survived
(`gc.freeze()`: moved to a permanent generation that collections never walk), and raises the
generation-0 threshold so the young collections that still run are rarer. Cyclic garbage made while
serving is still collected: the collector stays on, walking only what was allocated since the freeze.

`Pauses` times every collection (`gc.callbacks`) by generation: `/metrics` exposes the counts and the
seconds of the HTTP process and of each predictor process (which report theirs with every batch).
"""

from __future__ import annotations

import gc
import time

# gen0 after 10,000 net allocations instead of CPython's 700, gen1 and gen2 at its defaults (10, 10):
# ~14x fewer collections, each young one walking at most ~10,000 objects.
THRESHOLDS = (10_000, 10, 10)


def settle() -> None:
    """Collect what start-up left, freeze the survivors, set THRESHOLDS. Call once, after warm-up, before
    the first request is served."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


class Pauses:
    """Collections and their seconds per generation (0, 1, 2), timed by a gc callback in this process."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0

    def snapshot(self) -> list[list[float]]:
        """[[collections, seconds] per generation], for a predictor's reply frame."""
        return [[c, s] for c, s in zip(self.count, self.seconds)]

    def close(self) -> None:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)
