"""Dynamic batching in front of the predictors: one bounded queue, one thread per predictor.

A thread takes the first waiting request, then whatever else is queued (waiting up to max_wait while
admitted requests are still on their way) until max_batch_size samples, and runs them as one batch over
its predictor's pipe (the GIL is released while it waits). A request is a dict of named arrays (every
input of the package, one batch size); a batch concatenates each input along axis 0 and splits every
output back by rows. Every sample of a batch has the package's per-sample shapes (text: ids padded to
max_len, see `validate.canonical_ids`), so requests of different text lengths batch together and get the
outputs they would get alone; a task with a dynamic input (ocr_rec's width buckets) sends requests of
different shapes, and a batch holds one shape: a thread forming a batch sets requests of another shape aside
(up to 64, in order) and keeps taking this shape behind them; the oldest set-aside request starts the next
batch, with every set-aside request of its shape. A predictor process that dies fails its batch (500) and is restarted;
an in-process predictor (`spec.mode_for`) is called on the thread itself, and its errors fail only their batch.

Test hook: while the file named by PIPE_FAULT_HOLD_PREDICTOR exists, each predictor thread waits before
its warm-up and, holding the request it just took, before forming a batch: tests can keep the server
unready, fill the queue behind it, or hold a request in flight.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import PipeError
from pipeline.serving.predictor import START_S, PredictorProcess
from pipeline.serving.spec import Settings, Spec

_HOLD_MAX = 64  # requests of other shapes a thread sets aside while it fills a batch of one shape
_EXIT_WAIT_S = 5.0  # how long a predictor whose pipe closed gets to finish exiting before it is judged alive

HOLD_ENV = "PIPE_FAULT_HOLD_PREDICTOR"
log = logging.getLogger("pipe.serve")


@dataclass(eq=False)  # compared by identity: its feeds are arrays (the held deque removes by ==)
class Job:
    feeds: dict[str, np.ndarray]  # the package's inputs by program name, checked: one batch size, `n`
    n: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued: float = 0.0  # time.perf_counter() when it entered the queue
    held: bool = False  # taken from the queue and set aside for a later batch (another shape)


def _same_shapes(a: Job, b: Job) -> bool:
    """Whether two requests' samples have the same shapes (only a task with a dynamic input, ocr_rec's line
    width, sends different ones: such requests are run in separate batches, never padded to each other)."""
    return all(x.shape[1:] == b.feeds[k].shape[1:] for k, x in a.feeds.items())


def settle(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.done():  # timed out (cancelled) while it ran
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class Batcher:
    """One queue, one thread per predictor process. A thread takes the first waiting request, then whatever
    else is queued (waiting up to max_wait while admitted requests are still on their way) until
    max_batch_size samples, and runs them as one batch; it waits on the pipe with the GIL released."""

    def __init__(self, preds: list[Any], spec: Spec, s: Settings, metrics: Any, inflight: Any,
                 on_ready: Any = None, stats: Any = None):
        self.preds, self.spec, self.s, self.metrics = preds, spec, s, metrics
        self.stats = stats  # pipeline.serving.stats.Stats: Triton's per-model statistics, or None
        self.on_ready = on_ready  # () -> None, run once every predictor is warm, before `ready` is set
        self.inflight = inflight  # () -> requests admitted and not answered (some still reading their body)
        self.taken = 0  # jobs out of the queue, in a batch being formed or run
        self.q: queue.Queue = queue.Queue(maxsize=s.queue_size)
        self.threads: list[threading.Thread] = []
        self.warm = 0
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._hold = os.environ.get(HOLD_ENV, "")

    def start(self) -> None:
        for i, pred in enumerate(self.preds):
            t = threading.Thread(target=self._worker, args=(pred,), name=f"predictor-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self, timeout: float) -> None:
        for _ in self.threads:
            try:
                self.q.put(None, timeout=timeout)
            except queue.Full:
                break
        for t in self.threads:
            t.join(timeout)

    def submit(self, job: Job) -> None:
        job.queued = time.perf_counter()
        self.q.put_nowait(job)  # raises queue.Full: the caller answers 503

    def _wait_hold(self) -> None:
        while self._hold and os.path.exists(self._hold):  # test hook (see module docstring)
            time.sleep(0.01)

    def _warm_up(self, pred: PredictorProcess) -> None:
        self._wait_hold()
        pred.warm_up()
        with self._lock:
            self.warm += 1
            if self.warm == len(self.preds):
                if self.on_ready is not None:
                    self.on_ready()
                self.ready.set()

    def _worker(self, pred: Any) -> None:
        try:
            self._warm_up(pred)
        except Exception:
            log.exception("pipe serve: warm-up failed; /readyz stays 503")
            return
        held: collections.deque[Job] = collections.deque()  # taken, of another shape: the next batches'
        stop = False
        while not stop or held:
            job = held.popleft() if held else self.q.get()
            if job is None:
                break
            self._wait_hold()  # test hook: the job is taken, the queue fills behind it
            batch, rows = [job], job.n
            if not job.held:  # a held job was counted when it was set aside
                self._take(1)
            for other in list(held):  # held requests of this shape first, oldest first
                if rows + other.n <= self.s.max_batch_size and _same_shapes(other, job):
                    held.remove(other)
                    batch.append(other)
                    rows += other.n
            deadline = time.monotonic() + self.s.max_wait_ms / 1000
            while rows < self.s.max_batch_size and not stop:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    # Wait only while more requests are on their way (admitted, not yet queued): a lone
                    # request at low load would otherwise pay max_wait for nothing.
                    if left <= 0 or self.inflight() <= self.taken:
                        break
                    try:
                        nxt = self.q.get(timeout=left)
                    except queue.Empty:
                        break
                if nxt is None:
                    stop = True
                    break
                if nxt.future.done():
                    continue
                self._take(1)
                if rows + nxt.n > self.s.max_batch_size or not _same_shapes(nxt, job):
                    # another shape (or too many rows): set aside for a later batch, and keep looking for
                    # this shape behind it, a bounded way ahead
                    nxt.held = True
                    held.append(nxt)
                    if len(held) >= _HOLD_MAX or rows + nxt.n > self.s.max_batch_size:
                        break
                    continue
                batch.append(nxt)
                rows += nxt.n
            try:
                self._run_batch(pred, [j for j in batch if not j.future.done()])
            finally:
                self._take(-len(batch))

    def _take(self, n: int) -> None:
        with self._lock:
            self.taken += n

    def _restart(self, pred: PredictorProcess) -> None:
        """A predictor process died (crash, OOM kill): start a new one, warm it, serve on."""
        log.error("pipe serve: predictor process exited with %s; restarting it", pred.proc.returncode)
        pred.close()
        try:
            pred.start()
            pred.hello(START_S)
            pred.warm_up()
        except (PipeError, RuntimeError, EOFError, OSError) as e:
            log.error("pipe serve: predictor restart failed: %s", e)

    def _run_batch(self, pred: PredictorProcess, batch: list[Job]) -> None:
        if not batch:
            return
        t_in = time.perf_counter()
        if len(batch) == 1:
            feeds, rows = batch[0].feeds, batch[0].n
        else:  # every input along axis 0, in the jobs' order
            feeds = {k: np.concatenate([j.feeds[k] for j in batch]) for k in batch[0].feeds}
            rows = sum(j.n for j in batch)
        t0 = time.perf_counter()
        try:
            ys = pred.run(feeds)
        except Exception as e:  # a 500 for this batch; the thread goes on (an in-process engine's own errors too)
            log.error("pipe serve: predictor run failed: %s: %s", e.__class__.__name__, e)
            for j in batch:
                j.loop.call_soon_threadsafe(settle, j.future, None, e)
            if pred.proc is None:  # in-process: nothing died
                return
            # The pipe closed: the child is exiting. A killed process closes its pipes before it can be reaped,
            # so poll() may still say "running" here, and without the wait the next batch failed too (a
            # fresh clone's make test: a second 500 after SIGKILL in test_a_dead_predictor_process_is_replaced).
            if isinstance(e, (EOFError, OSError)):
                try:
                    pred.proc.wait(_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
            if pred.proc.poll() is not None:
                self._restart(pred)
            return
        t1 = time.perf_counter()
        self.metrics.observe_batch(rows, len(batch), t1 - t0)
        if len(batch) == 1:
            batch[0].loop.call_soon_threadsafe(settle, batch[0].future, ys, None)
        else:
            at = 0
            for j in batch:  # every output split back, each request its own rows
                j.loop.call_soon_threadsafe(settle, j.future, {k: y[at:at + j.n] for k, y in ys.items()}, None)
                at += j.n
        if self.stats is not None:
            ns = 1e9  # per second
            self.stats.batch([int((t_in - j.queued) * ns) for j in batch], rows, int((t0 - t_in) * ns),
                             int((t1 - t0) * ns), int((time.perf_counter() - t1) * ns))
