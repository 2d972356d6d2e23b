"""`pipe predict`'s workers: a package (or an OCR system) run over items, as `pipe serve` runs it, without HTTP.

The models run in predictor processes (`pipeline/serving/predictor.py`: the package's engine, precision and
bucketed batches, each process `threads` math threads), `workers` of them (an OCR system: one det, cls and rec
predictor per worker). Each item is decoded and prepared by the functions /v1 uses (`pipeline/serving/validate.py`:
the same PNG/JPEG checks, resize and preprocessing; the task's `prepare_images`; the text encoder and text rule),
and answered by the task's /v1 answer (`validate.v1_answer`, `v1_answers`) or the OCR system's steps
(`ocr_system.read`: det, then every line of the batch's pages through cls and rec together). A row's answer is
/v1's answer to a request of that one item.

The flow, every queue bounded (memory flat whatever the number of items):

    feeder thread   items -> loader threads (read, hash, skip what DIR holds, check limits, decode or render)
                    -> batches of `batch` items -> work queue (2 per worker)
    worker threads  one per worker: a batch through its predictor(s) -> rows -> result queue
    main thread     result queue -> DIR (one fsynced write per batch) and the progress bar

Decoding and rendering overlap inference: the loaders work on the next batches while the workers wait on their
predictors (which run outside this process, so the GIL is free). A batch that fails in a predictor is run again
item by item, so one bad item becomes one error row; a predictor process that dies ends the job (exit 1).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from pipeline.errors import GateError, InputError, PipeError
from pipeline.predict import inputs as inputs_mod
from pipeline.predict.inputs import Item, Problem, Unreadable
from pipeline.runtime import available_cores  # noqa: F401  (the cores a job may use)

_SKIP = "skip"
_STOP = object()


def plan(cores: int, workers: int | None, threads: int | None) -> tuple[int, int]:
    """(workers, threads per worker's predictor): by default up to 4 workers, the cores shared among them."""
    w = workers if workers is not None else max(1, min(cores, 4))
    if not 1 <= w <= 64:
        raise InputError(f"--workers: must be 1..64, got {w}")
    t = threads if threads is not None else max(1, cores // w)
    if not 1 <= t <= 256:
        raise InputError(f"--threads: must be 1..256, got {t}")
    return w, t


def loaders_for(workers: int) -> int:
    """Loader threads: one per worker. Measured on 2 cores (2026-12-07, an Intel Xeon with AMX; 3 alternated runs
    each): the PP-LCNet classifier over 3,000 PNGs 1,075 items/s with 4 (two per worker, the earlier rule), 1,196
    with 2, 1,264 with 1 (a loader's ~0.2 ms of CPU an item costs less than the contention of more threads on the
    engine's cores); the OCR system over 300 mixed pages 4.45 / 4.45 / 4.53 pages/s, within the noise."""
    return max(1, workers)


MALLOC_ARENAS = 2


def few_malloc_arenas() -> bool:
    """glibc's malloc arenas capped at MALLOC_ARENAS for this process (from now on) and the predictor processes it
    starts (`MALLOC_ARENA_MAX`, inherited), unless the user set it. glibc gives each thread that allocates an
    arena of its own, up to 8 a core, and frees little back from them: the loader threads decoding pages of many
    sizes, and each predictor, kept growing. With the OpenVINO cache cap, the whole job grew +4-6% over 800 pages of
    interleaved sizes against +11% (docs/benchmarks.md), at 5.05 vs 5.14 pages/s over 3 alternated runs (within
    the noise). False where malloc is not glibc's."""
    import ctypes
    import ctypes.util

    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if libc.mallopt(-8, MALLOC_ARENAS) != 1:  # M_ARENA_MAX; 1 on success
            return False
    except (OSError, AttributeError):
        return False
    os.environ["MALLOC_ARENA_MAX"] = str(MALLOC_ARENAS)
    return True


def split(answer: dict[str, Any], i: int) -> dict[str, Any]:
    """Sample i of a batch's /v1 answer (every field a list of one value per sample; `outputs` a mapping of
    such lists): /v1's answer to a request of that one sample."""
    return {k: split(v, i) if isinstance(v, dict) else [v[i]] for k, v in answer.items()}


# ------------------------------------------------------------------ models


class Package:
    """One package's predictors (`workers` of them) and how its items are decoded and answered."""

    def __init__(self, spec: Any, settings: Any, engine: str, workers: int, threads: int, batch: int, device: str):
        from pipeline.serving import validate
        from pipeline.serving.predictor import start_predictors

        self.spec, self.s, self.batch = spec, settings, batch
        if spec.text is not None:
            validate.check_text_rule(spec)
            self.mode = "text"
        elif validate.task_images(spec):
            self.mode = "task_images"
        else:
            takes = validate.image_inputs(spec)
            if len(spec.io.inputs) != 1 or not takes:
                raise InputError(f"{spec.dir}: a model of inputs {validate.names(spec.io.inputs)}; pipe predict "
                                 "feeds one image or one text per item (serve it and send tensors instead)")
            self.mode = "images"
        self.text = self.mode == "text"
        self.max_pixels = settings.max_image_pixels
        self.preds = start_predictors(spec, workers, threads, batch, engine, device, settings.predictor_mode)
        self.engine = self.preds[0].engine

    def check(self) -> dict[str, Any] | None:
        return reference_check(self.spec, self.preds[0].run, self.batch)

    def decode(self, raw: bytes) -> Any:
        from pipeline.serving import validate

        try:
            if self.mode == "images":
                arr, sizes = validate._decode_images([raw], self.spec, self.s, self.spec.io.inputs[0])
                return arr[0], sizes[0]
            return validate._open_image(raw, 0, self.s, "RGB", None)[0]
        except validate.ApiError as e:
            raise Unreadable(e.message.split(": ", 1)[-1]) from None

    def page(self, image: np.ndarray) -> Any:
        return self.decode(inputs_mod.png_bytes(image)) if self.mode == "images" else image

    def text_item(self, text: str) -> str:
        limit = self.spec.text.max_len
        if not text.strip():
            raise Unreadable("empty (or only whitespace)")
        if len(text) > limit:
            raise Unreadable(f"{len(text)} characters, over the package's max_len of {limit}")
        return text

    def answer(self, worker: int, payloads: list[Any]) -> list[dict[str, Any]]:
        from pipeline.serving import validate

        spec, run = self.spec, self.preds[worker].run
        if self.mode == "text":
            outs = _finite(run(validate.text_feeds(spec.text.encode(list(payloads)), spec)), spec)
            ans = validate.v1_answer(outs, spec, None)
        elif self.mode == "images":
            x = np.stack([p[0] for p in payloads])
            ans = validate.v1_answer(_finite(run({spec.io.inputs[0].name: x}), spec), spec, [p[1] for p in payloads])
        else:
            name = spec.io.inputs[0].name
            groups = [(pos, {name: x}) for pos, x in spec.task.prepare_images(payloads, spec.info, self.batch)]
            outs = [_finite(run(feeds), spec) for _, feeds in groups]
            ans = validate.v1_answers(groups, outs, spec, [(int(p.shape[0]), int(p.shape[1])) for p in payloads])
        return [split(ans, i) for i in range(len(payloads))]

    def close(self) -> None:
        for p in self.preds:
            p.close()


class OcrSystem:
    """An OCR system package: per worker one predictor of each part; a batch of pages read by `ocr_system.read`
    (det, then all the batch's lines through cls and rec, at each part's own batch size)."""

    text = False

    def __init__(self, system: Any, settings: dict[str, Any], engines: dict[str, str], workers: int, threads: int,
                 batch: int, device: str):
        from pipeline.serving.predictor import start_predictors

        self.system, self.batch = system, batch
        self.s = settings["det"]
        self.max_pixels = self.s.max_image_pixels
        self.preds: dict[str, list[Any]] = {}
        try:
            for role, sp in system.parts.items():
                self.preds[role] = start_predictors(sp, workers, threads, settings[role].max_batch_size,
                                                    engines[role], device, settings[role].predictor_mode)
        except BaseException:
            self.close()
            raise
        self.engine = {role: ps[0].engine for role, ps in self.preds.items()}

    def check(self) -> dict[str, Any] | None:
        return {role: reference_check(sp, self.preds[role][0].run, _batch(sp)) for role, sp in
                self.system.parts.items()}

    def decode(self, raw: bytes) -> np.ndarray:
        from pipeline.serving import validate

        try:
            return validate._open_image(raw, 0, self.s, "RGB", None)[0]
        except validate.ApiError as e:
            raise Unreadable(e.message.split(": ", 1)[-1]) from None

    def page(self, image: np.ndarray) -> np.ndarray:
        return image

    def answer(self, worker: int, images: list[np.ndarray]) -> list[dict[str, Any]]:
        from pipeline import ocr_system

        models = {role: ocr_system.Model(sp.info, _public(sp, self.preds[role][worker].run), batch=_batch(sp))
                  for role, sp in self.system.parts.items()}
        pages, _ = ocr_system.read(ocr_system.System(models["det"], models["rec"], models.get("cls"),
                                                     self.system.drop_score), images)
        return [{"pages": [page]} for page in pages]

    def close(self) -> None:
        for ps in self.preds.values():
            for p in ps:
                p.close()


def _batch(spec: Any) -> int:
    return int((spec.doc.get("batching") or {}).get("max_batch_size") or 1)


def _public(spec: Any, run: Callable) -> Callable:
    """A predictor's run as `ocr_system.Model` takes it: one input (whatever its key) -> outputs by public name."""
    name = spec.io.inputs[0].name

    def run_(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (x,) = feeds.values()
        out = _finite(run({name: x}), spec)
        return {t.public: out[t.name] for t in spec.io.outputs}

    return run_


def _finite(outs: dict[str, np.ndarray], spec: Any) -> dict[str, np.ndarray]:
    """As /v1 refuses (422) an answer from non-finite outputs: this batch fails (then each item on its own)."""
    bad = next((n for n, y in outs.items() if y.dtype.kind == "f" and not np.isfinite(y).all()), None)
    if bad is not None:
        raise ValueError(f"the model's output {bad!r} is not finite for this input")
    return outs


def reference_check(spec: Any, run: Callable, batch: int) -> dict[str, Any] | None:
    """The package's reference set on one predictor, as `pipe serve` checks it before serving: below the
    package's budget, GateError (exit 4)."""
    from pipeline import cpu, reference

    worst, budget = reference.check(spec, [run], batch)
    if worst is None:
        print(f"pipe predict: warning: {spec.dir} has no reference set (made by an older pipe): its numbers on this "
              "CPU are not checked; re-package it to get one", file=sys.stderr)
        return None
    if not reference.verdict(worst, budget):
        raise GateError(reference.failure(worst, budget, f"{spec.engine} {spec.precision} on this CPU "
                                                         f"({cpu.summary()})", spec.dir))
    return {**worst, "min_agreement": budget, "passed": True}


# ------------------------------------------------------------------ the flow


@dataclass
class Counts:
    items: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    previously_failed: int = 0


@dataclass
class _Loaded:
    item: Item
    sha256: str
    payload: Any


def _row_id(x: Any, sha256: str | None) -> dict[str, Any]:
    out = inputs_mod.describe(x)
    if sha256:
        out["sha256"] = sha256
    return out


def load_item(model: Any, item: Item, dpi: float, held: Callable[[tuple], bool]) -> Any:
    """An item -> _Loaded, a Problem (an error row), or (_SKIP, its key) (`held(key)`: DIR holds it already).
    Local predict's loader threads and `--ray`'s actors (`pipeline/predict/ray_job.py`) both load items here."""
    if item.sha256 is not None and held(item.key()):
        return (_SKIP, item.key())
    sha = item.sha256
    try:
        if item.kind == "text":
            return _Loaded(item, sha, model.text_item(item.text))
        if item.kind == "page":
            return _Loaded(item, sha, model.page(inputs_mod.render_page(item, dpi, model.max_pixels)))
        raw = inputs_mod.read_bytes(item.source)
        sha = hashlib.sha256(raw).hexdigest()
        if held(item.key(sha)):
            return (_SKIP, item.key(sha))
        inputs_mod.declared_pixels(raw, model.max_pixels)
        return _Loaded(item, sha, model.decode(raw))
    except Unreadable as e:
        return Problem(item.source, str(e), item.page, item.line, sha)


def answer_batch(model: Any, worker: int, batch: list[_Loaded]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch of loaded items through `model`'s worker -> (prediction rows, error rows)."""
    rows, errors = [], []
    for loaded, answer in _answered(model, worker, batch):
        if isinstance(answer, str):
            errors.append({**_row_id(loaded.item, loaded.sha256), "error": answer})
        else:
            rows.append({**_row_id(loaded.item, loaded.sha256), "answer": answer})
    return rows, errors


def _answered(model: Any, i: int, batch: list[_Loaded]) -> Iterator[tuple[_Loaded, Any]]:
    """(item, answer or its error line) for each item: the batch at once, or item by item if it fails."""
    try:
        yield from zip(batch, model.answer(i, [b.payload for b in batch]), strict=True)
        return
    except (EOFError, BrokenPipeError, OSError) as e:
        raise PipeError(f"a predictor process ended ({e.__class__.__name__}); its stderr is above") from None
    except Exception as e:
        if len(batch) == 1:
            yield batch[0], f"the model failed on it ({str(e).splitlines()[0][:300] if str(e) else type(e).__name__})"
            return
    for b in batch:
        yield from _answered(model, i, [b])


class Job:
    """One run of `model` over `items` into `out` (`pipeline/predict/output.py`). `on_rows(rows)` is called
    with each batch's prediction rows once written (`--draw`); `progress(n)` as items end."""

    def __init__(self, model: Any, out: Any, workers: int, batch: int, dpi: float, loaders: int,
                 progress: Callable[[int], None],
                 on_rows: Callable[[list[dict[str, Any]]], None] | None = None):
        self.model, self.out, self.workers, self.batch, self.dpi = model, out, workers, batch, dpi
        self.loaders = loaders
        self.on_rows = on_rows
        self.progress = progress  # called from the feeder (skipped items) and the main thread: rich's is locked
        self.counts = Counts()
        self.work: queue.Queue = queue.Queue(maxsize=2 * workers)
        self.results: queue.Queue = queue.Queue(maxsize=2 * workers + 2)
        self.stop = threading.Event()
        self.seen: set[tuple] = set()  # keys of this run (an item listed twice runs once)

    def _held(self, key: tuple) -> bool:
        return key in self.out.done or key in self.out.failed

    # -- loader threads
    def _load(self, item: Item) -> Any:
        return load_item(self.model, item, self.dpi, self._held)

    # -- feeder thread
    def _feed(self, items: Iterable[Item | Problem]) -> None:
        try:
            with cf.ThreadPoolExecutor(self.loaders, thread_name_prefix="predict-load") as pool:
                window: collections.deque = collections.deque()
                batch: list[_Loaded] = []
                errors: list[dict[str, Any]] = []
                for x in items:
                    if self.stop.is_set():
                        return
                    window.append(pool.submit(self._load, x) if isinstance(x, Item) else _done_future(x))
                    while len(window) > self.loaders * 2 + self.batch or (window and window[0].done()):
                        batch, errors = self._route(window.popleft().result(), batch, errors)
                while window:
                    batch, errors = self._route(window.popleft().result(), batch, errors)
                if batch or errors:
                    self._put_batch(batch, errors)
        except BaseException as e:  # the job failed (an INPUT that vanished, a bug): the main thread reports it
            self.results.put(("fatal", e))
        finally:
            for _ in range(self.workers):
                self._put(self.work, _STOP)

    def _route(self, r: Any, batch: list[_Loaded], errors: list[dict[str, Any]]) -> tuple[list, list]:
        if isinstance(r, tuple):
            key = r[1]
        else:
            key = r.key() if isinstance(r, Problem) else r.item.key(r.sha256)
        if key in self.seen:  # listed twice (a folder and a glob): one item
            return batch, errors
        self.seen.add(key)
        c = self.counts
        c.items += 1
        if isinstance(r, tuple) or self._held(key):
            c.skipped += 1
            c.previously_failed += key in self.out.failed
            self.progress(1)
            return batch, errors
        if isinstance(r, Problem):
            errors.append({**_row_id(r, r.sha256), "error": r.error})
        else:
            batch.append(r)
        if len(batch) >= self.batch or len(errors) >= self.batch:
            self._put_batch(batch, errors)
            return [], []
        return batch, errors

    def _put_batch(self, batch: list[_Loaded], errors: list[dict[str, Any]]) -> None:
        if batch:
            self._put(self.work, (batch, errors))
        else:
            self._put(self.results, ("rows", [], errors))

    def _put(self, q: queue.Queue, x: Any) -> None:
        while not self.stop.is_set():
            try:
                q.put(x, timeout=0.2)
                return
            except queue.Full:
                continue

    # -- worker threads
    def _work(self, i: int) -> None:
        try:
            while not self.stop.is_set():
                got = self.work.get()
                if got is _STOP:
                    return
                batch, errors = got
                rows, failed = answer_batch(self.model, i, batch)
                errors += failed
                self._put(self.results, ("rows", rows, errors))
        except BaseException as e:
            self.results.put(("fatal", e))
        finally:
            self.results.put(("worker_done", i))

    # -- main thread
    def run(self, items: Iterable[Item | Problem]) -> Counts:
        threads = [threading.Thread(target=self._feed, args=(items,), name="predict-feed", daemon=True)]
        threads += [threading.Thread(target=self._work, args=(i,), name=f"predict-work-{i}", daemon=True)
                    for i in range(self.workers)]
        for t in threads:
            t.start()
        working = self.workers
        try:
            while working:
                msg = self.results.get()
                if msg[0] == "worker_done":
                    working -= 1
                elif msg[0] == "fatal":
                    raise msg[1]
                else:
                    _, rows, errors = msg
                    self.out.write(rows, errors)
                    self.counts.done += len(rows)
                    self.counts.failed += len(errors)
                    if self.on_rows is not None and rows:
                        self.on_rows(rows)
                    self.progress(len(rows) + len(errors))
        finally:
            self.stop.set()
        return self.counts


def _done_future(x: Any) -> cf.Future:
    f: cf.Future = cf.Future()
    f.set_result(x)
    return f
