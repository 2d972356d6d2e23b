"""pipe predict: run a package over the user's own files (a folder, globs, a list, PDFs, text files), resumably.

    pipe predict runs/exp1/package scans/ --out preds/
    pipe predict runs/ocr_system scans/ archive/*.pdf @more.txt --out preds/ --dpi 144 --draw
    pipe predict runs/reviews/package reviews.jsonl --field text --out preds/
    pipe predict runs/exp1/package /shared/scans --out /shared/preds --ray auto

Reads a `package/` artifact (or an OCR system package) and refuses it as `pipe serve` does (exit 2) unless every
file's sha256 matches its manifest. Runs it on its own engine, precision and batching (`--engine` another that
reads its files) in `--workers` predictor processes of `--threads` threads each, by default from the cores this
process may use (affinity and the cgroup quota; `pipeline/predict/run.py`). Each item's row holds /v1's answer to
a request of that item alone. `--ray ADDRESS`: the same job on Ray Data actors of a cluster, the same rows, DIR and
exit codes (`pipeline/predict/ray_job.py`). Writes into `--out DIR` (`pipeline/predict/output.py`):

    predictions.jsonl   {"source", "page", ["line",] "sha256", "answer"} per item, appended a batch at a time
    errors.jsonl        {"source", "page", ["line",] ["sha256",] "error"} per item that could not be read or run
    summary.json        items, done, skipped, failed, seconds, items_per_s, engine, precision, task, ...
    predict.json        the package and settings DIR belongs to (another package or settings: refused, exit 2)
    draw/               with --draw: each image or page with its boxes, polygons and texts (`pipeline/predict/draw.py`)

A second run into DIR skips every item already written (in either file); a run killed at any moment and run again
ends with each item exactly once. Exit codes: 0 every item done, 5 done but some items failed (errors.jsonl,
this run's or an earlier one's), 2 bad input (no items, a package that does not verify, a foreign DIR, a flag),
1 the job itself failed, 4 the package's reference set disagrees on this CPU (as `pipe serve`).
"""

from __future__ import annotations

import itertools
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipeline import __version__
from pipeline.errors import InputError, PipeError


class FailedItems(PipeError):
    """The job ran to its end, but some items are in errors.jsonl (this run's or an earlier one's)."""

    exit_code = 5  # a code of its own beside RELIABILITY.md's 0 ok, 1 internal, 2 input, 3 diverged, 4 gate


@dataclass(frozen=True)
class PredictConfig:
    """`pipe predict` flags."""

    workers: int | None = None
    """Predictor processes (an OCR system: sets of det, cls, rec); default: from the cores, at most 4."""
    threads: int | None = None
    """Math threads per predictor process; default: the cores / workers, at least 1."""
    batch: int | None = None
    """Items per predictor run (an OCR system: pages per batch); default: the package's max_batch_size."""
    dpi: float = 144.0
    """PDF pages are rendered at this resolution."""
    draw: bool = False
    """Also draw each image or page with its answer into DIR/draw/ (detection, ocr_det and the OCR system)."""
    field: str = "text"
    """The text of a .jsonl row (its member) or a .tsv row (its header's column); .txt: every line."""
    engine: str = ""
    """Run on this engine (paddle, onnxruntime, openvino) if it reads the package's files; '' = the package's."""
    device: str = "cpu"
    """cpu, or gpu / gpu:N (the same code path as pipe serve's; not run on a GPU by us)."""
    predictor_mode: str = ""
    """auto, process or in-process, as `pipe serve --predictor-mode`; '' = the package's serving.yaml (auto)."""
    ray: str = ""
    """Run the job on a Ray cluster: local, auto or HOST:PORT (`pipeline/predict/ray_job.py`)."""


def run(cfg: PredictConfig, package_dir: Path, inputs: list[str], out_dir: Path) -> dict[str, Any]:
    """Verify the package, expand the inputs, open DIR (resume), run, write the summary; returns the summary.
    Its `failed` + `previously_failed` > 0 is the CLI's exit 5."""
    from pipeline import runtime
    from pipeline.predict import inputs as inputs_mod, output, run as run_mod

    t_start = time.perf_counter()
    package_dir = Path(package_dir)
    if not 1 <= cfg.dpi <= 1200:
        raise InputError(f"--dpi: must be 1..1200, got {cfg.dpi:g}")
    if cfg.batch is not None and not 1 <= cfg.batch <= 4096:
        raise InputError(f"--batch: must be 1..4096, got {cfg.batch}")
    inputs_mod.check(inputs)
    loaded = _load_package(cfg, package_dir)
    runtime.device_index(cfg.device, "--device")
    text = loaded["text"]
    items = inputs_mod.expand(inputs, text, cfg.field)
    first = next(items, None)
    if first is None:
        kinds = "texts (.txt, .tsv, .jsonl)" if text else "images (.png, .jpg, .jpeg) or PDFs"
        raise InputError(f"INPUT: no {kinds} in {' '.join(inputs)}")
    items = itertools.chain([first], items)
    fingerprint = {"package_sha256": loaded["sha256"], "task": loaded["task"], "engine": loaded["engine"],
                   "precision": loaded["precision"], "dpi": cfg.dpi if not text else None,
                   "field": cfg.field if text else None}
    if cfg.ray:
        return _run_ray(cfg, loaded, package_dir, inputs, items, out_dir, fingerprint, t_start)
    out = output.Output(out_dir, fingerprint)
    model = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        workers, threads = run_mod.plan(run_mod.available_cores(), cfg.workers, cfg.threads)
        run_mod.few_malloc_arenas()
        model = _start(cfg, loaded, workers, threads)
        model.check()
        on_rows = _drawer(cfg, loaded, out, model.max_pixels)
        t0 = time.perf_counter()
        with _Progress(inputs, text, cfg.field) as progress:
            job = run_mod.Job(model, out, workers, model.batch, cfg.dpi, loaders=run_mod.loaders_for(workers),
                              progress=progress.advance, on_rows=on_rows)
            counts = job.run(items)
        summary = _summary(counts, t_start, t0, cfg, loaded, package_dir, out, workers, threads, model.batch)
        out.summary(summary)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if model is not None:
            model.close()
        out.close()
    _say(counts, summary, out, f"{workers} worker(s) x {threads} thread(s)")
    return summary


def _run_ray(cfg: PredictConfig, loaded: dict[str, Any], package_dir: Path, inputs: list[str], items: Any,
             out_dir: Path, fingerprint: dict[str, Any], t_start: float) -> dict[str, Any]:
    """`--ray ADDRESS`: the same job, its items run by Ray actors (`pipeline/predict/ray_job.py`); the same DIR,
    rows, summary and exit codes. The cluster is joined, and every input checked on every node, before DIR is
    touched."""
    import functools

    from pipeline.predict import inputs as inputs_mod, output, ray_job, run as run_mod

    settings = loaded["settings"]["det"] if "system" in loaded else loaded["settings"]
    batch = cfg.batch or settings.max_batch_size
    ray_job.connect(cfg.ray, run_mod.available_cores())
    out = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        workers, threads, nodes = ray_job.plan(cfg.workers, cfg.threads)
        listed = list(items)
        ray_job.check_reachable(sorted({x.source for x in listed if isinstance(x, inputs_mod.Item)}))
        out = output.Output(out_dir, fingerprint)
        docs, problems, counts = ray_job.todo(listed, out)
        del listed
        on_rows = _drawer(cfg, loaded, out, settings.max_image_pixels)
        t0 = time.perf_counter()
        if problems:
            out.write([], problems)
            counts.items += len(problems)
            counts.failed += len(problems)
        with _Progress(inputs, loaded["text"], cfg.field) as progress:
            by_node, began = ray_job.run(docs, out, counts, package_dir=package_dir, manifest_sha256=loaded["sha256"],
                                  make_model=functools.partial(_model_at, cfg), workers=workers, threads=threads,
                                  batch=batch, dpi=cfg.dpi, progress=progress.advance, on_rows=on_rows)
        summary = _summary(counts, t_start, began or t0, cfg, loaded, package_dir, out, workers, threads, batch)
        summary["ray"] = {"address": cfg.ray, "cpus_by_node": nodes, "items_by_node": by_node}
        out.summary(summary)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if out is not None:
            out.close()
        ray_job.disconnect()
    _say(counts, summary, out, f"on Ray {cfg.ray}: {workers} actor(s) x {threads} thread(s)")
    return summary


def _drawer(cfg: PredictConfig, loaded: dict[str, Any], out: Any, max_pixels: int) -> Any:
    """--draw's `on_rows` (None without it, or for a task whose answers are no boxes)."""
    if not cfg.draw:
        return None
    from pipeline.predict import draw

    if loaded["task"] in draw.DRAWN:
        return draw.Drawer(out.dir / "draw", loaded["task"], cfg.dpi, max_pixels).rows
    print(f"pipe predict: note: --draw: a {loaded['task']} package's answers are no boxes; nothing is drawn",
          file=sys.stderr)
    return None


def _summary(counts: Any, t_start: float, t0: float, cfg: PredictConfig, loaded: dict[str, Any], package_dir: Path,
             out: Any, workers: int, threads: int, batch: int) -> dict[str, Any]:
    """summary.json; the speed over the items done since `t0`."""
    from pipeline.predict import output

    seconds = time.perf_counter() - t0
    return {**asdict(counts), "seconds": round(seconds, 3),
            "items_per_s": round(counts.done / seconds, 3) if seconds > 0 else 0.0,
            "startup_seconds": round(t0 - t_start, 3),
            "engine": loaded["engine"], "precision": loaded["precision"], "task": loaded["task"],
            "package": str(package_dir), "package_sha256": loaded["sha256"], "pipe_version": __version__,
            "workers": workers, "threads": threads, "batch": batch, "dpi": cfg.dpi,
            "predictions": str(out.dir / output.PREDICTIONS), "errors": str(out.dir / output.ERRORS)}


def _say(counts: Any, summary: dict[str, Any], out: Any, how: str) -> None:
    """The job's one line on stdout."""
    from pipeline.predict import output

    bad = counts.failed + counts.previously_failed
    print(f"pipe predict: {counts.done} done, {counts.skipped} already in {out.dir}, {counts.failed} failed"
          + (f" ({counts.previously_failed} in an earlier run)" if counts.previously_failed else "")
          + f"; {summary['items_per_s']:g} items/s over {summary['seconds']:.1f} s ({how}, "
          f"{summary['engine']} {summary['precision']})" + (f"; see {out.dir / output.ERRORS}" if bad else ""),
          flush=True)


def _model_at(cfg: PredictConfig, package_dir: Path, threads: int) -> Any:
    """In a Ray actor: the travelled, verified package at `package_dir` loaded as local predict loads it, one
    worker of `threads` math threads."""
    return _start(cfg, _load_package(cfg, package_dir), 1, threads)


def _interrupt(sig: int, frame: Any) -> None:
    raise KeyboardInterrupt  # [signal] SIGTERM stops the job as Ctrl-C does: predictors closed, rows kept


def _load_package(cfg: PredictConfig, package_dir: Path) -> dict[str, Any]:
    """The package verified (as `pipe serve` verifies it), its engine resolved, what the fingerprint names."""
    from pipeline.ocr_system import package as ocr_package
    from pipeline.ocr_system.serving import part_settings
    from pipeline.serving import spec as spec_mod
    from pipeline.serving.spec import engine_for

    if (package_dir / ocr_package.SYSTEM_FILE).is_file():
        system = ocr_package.load(package_dir)
        scfg = _serve_flags(cfg.engine, cfg.predictor_mode)
        settings = {role: part_settings(scfg, sp, len(system.parts)) for role, sp in system.parts.items()}
        engines = {role: engine_for(sp, cfg.engine) for role, sp in system.parts.items()}
        return {"system": system, "settings": settings, "engines": engines, "text": False, "task": "ocr_system",
                "sha256": system.manifest_sha256, "engine": ",".join(f"{r}:{e}" for r, e in engines.items()),
                "precision": ",".join(f"{r}:{sp.precision}" for r, sp in system.parts.items())}
    spec = spec_mod.load_package(package_dir)
    engine = engine_for(spec, cfg.engine)
    settings = spec_mod.settings(_serve_flags(cfg.engine, cfg.predictor_mode), spec)
    return {"spec": spec, "settings": settings, "text": spec.text is not None, "task": str(spec.task.name),
            "sha256": spec.manifest_sha256, "engine": engine, "precision": spec.precision}


def _start(cfg: PredictConfig, loaded: dict[str, Any], workers: int, threads: int) -> Any:
    from pipeline.predict import run as run_mod

    if "system" in loaded:
        batch = cfg.batch or loaded["settings"]["det"].max_batch_size
        return run_mod.OcrSystem(loaded["system"], loaded["settings"], loaded["engines"], workers, threads, batch,
                                 cfg.device)
    batch = cfg.batch or loaded["settings"].max_batch_size
    return run_mod.Package(loaded["spec"], loaded["settings"], loaded["engine"], workers, threads, batch, cfg.device)


def _serve_flags(engine: str, predictor_mode: str = "") -> Any:
    """What `spec.settings` reads flags from (pipe serve's): none given but the engine, so serving.yaml's batching and
    limits hold; predict's own --workers and --threads replace the server's predictors and threads."""
    unset = ("max_batch_size", "max_wait_ms", "queue_size", "timeout_s", "max_body_bytes", "drain_s")
    return SimpleNamespace(**dict.fromkeys(unset), engine=engine, http_workers=1, predictors=1,
                           threads=1, predictor_mode=predictor_mode or None)


class _Progress:
    """A rich progress bar on stderr with items/s and the ETA when it is a terminal (its total counted by a
    first pass over the inputs); nothing otherwise (the summary line is printed either way)."""

    def __init__(self, inputs: list[str], text: bool, field: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.args = (inputs, text, field)
        self.bar = None

    def __enter__(self) -> "_Progress":
        if not self.console.is_terminal:
            return self
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, \
            TimeRemainingColumn

        from pipeline.predict import inputs as inputs_mod

        total = inputs_mod.count(*self.args)
        self.bar = Progress(TextColumn("[bold]predict[/bold]"), BarColumn(), MofNCompleteColumn(),
                            TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                            TimeRemainingColumn(), console=self.console, transient=True)
        self.task = self.bar.add_task("predict", total=total, rate="")
        self.t0 = time.perf_counter()
        self.n = 0
        self.bar.start()
        return self

    def advance(self, n: int) -> None:
        if self.bar is None:
            return
        self.n += n
        rate = self.n / max(1e-9, time.perf_counter() - self.t0)
        self.bar.update(self.task, advance=n, rate=f"{rate:.1f} items/s")

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

