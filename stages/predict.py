"""pipe predict: run a package over the user's own files (a folder, globs, a list, PDFs, text files), resumably.

    pipe predict runs/exp1/package scans/ --out preds/
    pipe predict runs/ocr_system scans/ archive/*.pdf @more.txt --out preds/ --dpi 144 --draw
    pipe predict runs/reviews/package reviews.jsonl --field text --out preds/

Reads a `package/` artifact (or an OCR system package) and refuses it as `pipe serve` does (exit 2) unless every
file's sha256 matches its manifest. Runs it on its own engine, precision and batching (`--engine` another that
reads its files) in `--workers` predictor processes of `--threads` threads each, by default from the cores this
process may use (affinity and the cgroup quota; `pipeline/predict/run.py`). Each item's row holds /v1's answer to
a request of that item alone. Writes into `--out DIR` (`pipeline/predict/output.py`):

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
    out = output.Output(out_dir, fingerprint)
    model = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        workers, threads = run_mod.plan(run_mod.available_cores(), cfg.workers, cfg.threads)
        model = _start(cfg, loaded, workers, threads)
        model.check()
        on_rows = None
        if cfg.draw:
            from pipeline.predict import draw

            if loaded["task"] in draw.DRAWN:
                on_rows = draw.Drawer(out.dir / "draw", loaded["task"], cfg.dpi, model.max_pixels).rows
            else:
                print(f"pipe predict: note: --draw: a {loaded['task']} package's answers are no boxes; nothing is "
                      "drawn", file=sys.stderr)
        t0 = time.perf_counter()
        with _Progress(inputs, text, cfg.field) as progress:
            job = run_mod.Job(model, out, workers, model.batch, cfg.dpi, loaders=max(2, workers * 2),
                              progress=progress.advance, on_rows=on_rows)
            counts = job.run(items)
        seconds = time.perf_counter() - t0
        summary = {**asdict(counts), "seconds": round(seconds, 3),
                   "items_per_s": round(counts.done / seconds, 3) if seconds > 0 else 0.0,
                   "startup_seconds": round(t0 - t_start, 3),
                   "engine": loaded["engine"], "precision": loaded["precision"], "task": loaded["task"],
                   "package": str(package_dir), "package_sha256": loaded["sha256"], "pipe_version": __version__,
                   "workers": workers, "threads": threads, "batch": model.batch, "dpi": cfg.dpi,
                   "predictions": str(out.dir / output.PREDICTIONS), "errors": str(out.dir / output.ERRORS)}
        out.summary(summary)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if model is not None:
            model.close()
        out.close()
    bad = counts.failed + counts.previously_failed
    print(f"pipe predict: {counts.done} done, {counts.skipped} already in {out.dir}, {counts.failed} failed"
          + (f" ({counts.previously_failed} in an earlier run)" if counts.previously_failed else "")
          + f"; {summary['items_per_s']:g} items/s over {seconds:.1f} s ({workers} worker(s) x {threads} thread(s), "
          f"{loaded['engine']} {loaded['precision']})" + (f"; see {out.dir / output.ERRORS}" if bad else ""),
          flush=True)
    return summary


def _interrupt(sig: int, frame: Any) -> None:
    raise KeyboardInterrupt  # [signal] SIGTERM stops the job as Ctrl-C does: predictors closed, rows kept


def _load_package(cfg: PredictConfig, package_dir: Path) -> dict[str, Any]:
    """The package verified (as `pipe serve` verifies it), its engine resolved, what the fingerprint names."""
    from pipeline import ocr_package
    from pipeline.serving import spec as spec_mod
    from pipeline.serving.predictor import engine_for
    from pipeline.serving.system import part_settings

    if (package_dir / ocr_package.SYSTEM_FILE).is_file():
        system = ocr_package.load(package_dir)
        scfg = _serve_flags(cfg.engine)
        settings = {role: part_settings(scfg, sp, len(system.parts)) for role, sp in system.parts.items()}
        engines = {role: engine_for(sp, cfg.engine) for role, sp in system.parts.items()}
        return {"system": system, "settings": settings, "engines": engines, "text": False, "task": "ocr_system",
                "sha256": system.manifest_sha256, "engine": ",".join(f"{r}:{e}" for r, e in engines.items()),
                "precision": ",".join(f"{r}:{sp.precision}" for r, sp in system.parts.items())}
    spec = spec_mod.load_package(package_dir)
    engine = engine_for(spec, cfg.engine)
    settings = spec_mod.settings(_serve_flags(cfg.engine), spec)
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


def _serve_flags(engine: str) -> Any:
    """What `spec.settings` reads flags from (pipe serve's): none given but the engine, so serving.yaml's batching and
    limits hold; predict's own --workers and --threads replace the server's predictors and threads."""
    unset = ("max_batch_size", "max_wait_ms", "queue_size", "timeout_s", "max_body_bytes", "drain_s")
    return SimpleNamespace(**dict.fromkeys(unset), engine=engine, predictors=1, threads=1)


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

