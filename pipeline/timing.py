"""Timing variants of a model against each other on one machine (`pipe compress`, `pipe bench`): interleaved,
so a noisy neighbour or a clock change hits every variant alike."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

Feeds = dict[str, np.ndarray]
WARMUP = 20  # runs per variant and batch size before anything is timed
_ROUNDS, _SEGMENTS, _BLOCK_WARMUP = 10, 2, 3  # see interleaved()
_SWITCH_PAUSE_S = 0.3  # > KMP_BLOCKTIME (200 ms): the other engine's threads have stopped spinning


def interleaved(groups: list[dict[str, Callable[[Feeds], Feeds]]], x: Feeds, n: int, warmup: int = WARMUP,
                block_warmup: int = _BLOCK_WARMUP) -> dict[str, list[float]]:
    """Seconds per call of each variant's `run` (`runner`) on `x`, one batch of every input by name; `n` per
    variant. Each group (one engine) is timed in `_SEGMENTS` turns, groups alternating; within a turn every
    variant runs a block of calls per round, the order rotating each round, so a noisy neighbour or a clock
    change hits fp32 and int8 alike. The first `block_warmup` calls of a block (threads waking up; 3 unless
    a caller with few, long calls says fewer) are not timed.

    Engines are not mixed call by call: Paddle's OpenMP threads spin ~200 ms after a call (KMP_BLOCKTIME)
    and onnxruntime's spin too, so alternating engines measured their fight for the 2 cores (fp32 p50
    13 ms instead of 0.5 ms), which no server running one engine sees. A pause lets them go idle."""
    for runs in groups:
        for fn in runs.values():
            for _ in range(warmup):
                fn(x)
    times: dict[str, list[float]] = {name: [] for runs in groups for name in runs}
    rounds = -(-_ROUNDS // _SEGMENTS)
    block = -(-n // (rounds * _SEGMENTS))
    for _ in range(_SEGMENTS):
        for runs in groups:
            time.sleep(_SWITCH_PAUSE_S)
            names = list(runs)
            for r in range(rounds):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    todo = min(block, n - len(times[name]))
                    for i in range(block_warmup + todo if todo > 0 else 0):
                        t0 = time.perf_counter()
                        runs[name](x)
                        if i >= block_warmup:
                            times[name].append(time.perf_counter() - t0)
    return times
