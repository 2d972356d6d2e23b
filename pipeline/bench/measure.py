"""`pipe bench DIR...`: every servable model in export/, compress/ or package/ artifacts, measured here.

    pipe bench runs/digits/export runs/digits/compress runs/digits/package --json bench.json

Each directory is verified (manifest, stage, every file's sha256) before anything is read. For each model
it holds (export: fp32 and bf16 Paddle Inference on the PIR program, `model.onnx` when exported with
`--onnx`; compress: every variant in `metrics.variants`, fp32/bf16 running the export it came from;
package: the packaged program at its precision and the Triton ONNX) a row gives format, status
(`ok`, `unsupported: reason`, `failed: reason`), size, the task's monitored test metric (`accuracy`:
classification's accuracy, detection's COCO mAP; `pipeline/tasks/`, the manifest's interface `task`) on the
data the model was trained on (the data config in the manifest; text is encoded with the artifact's own
`vocab.json`), p50/p99 ms at batch 1 and items/s at batch 32. Engines are `pipeline/engines/`, the
interleaved timing stages/compress.py's, so `pipe bench` and `pipe compress` measure alike. A model met twice (compress fp32 is the export's
program; a package copies its variant) is built and timed once and its numbers shared.

Nothing here imports paddle at module level; `measure` does, only if a row needs Paddle Inference.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pipeline import artifacts, config as config_mod, cpu, data as data_mod, iospec, runtime, tasks
from pipeline.engines import ENGINES, bind
from pipeline.serving.spec import MODEL_FILES
from pipeline.errors import InputError, PipeError

STAGES = ("export", "compress", "package")
_BS_THROUGHPUT = 32  # as stages/compress.py
_EVAL_BATCH = 256  # as stages/compress.py and export.py: the same batches give the same logits
Feeds = dict[str, np.ndarray]  # a batch of every input, by the interface's names
_RUNS = (200, 30)  # timed batch-1 and batch-32 runs per model: compress.latency_runs/throughput_runs defaults
_QUICK_RUNS = (30, 6)
_MB = 1e6


@dataclass
class BenchRow:
    """One servable model of one artifact directory, measured on this machine."""

    artifact: str
    """The artifact directory as given."""
    stage: str
    variant: str
    """fp32, bf16, int8-paddle, onnx-fp32, int8-onnx (compress's names); a package: the variant it copied
    (`metrics.variant`) and `onnx-<precision>` for its Triton model."""
    format: str
    """pir, legacy or onnx."""
    engine: str
    """paddle_inference, onnxruntime or openvino."""
    precision: str
    status: str
    """ok, unsupported: reason, failed: reason."""
    size_mb: float | None
    """Model files (program + params, or the .onnx), 10^6 bytes."""
    accuracy: float | None = None
    """The task's monitored test metric (`metric`): classification's accuracy, detection's mAP."""
    metric: str = ""
    test_samples: int | None = None
    p50_ms: float | None = None
    """Batch 1, copy-in + run + copy-out."""
    p99_ms: float | None = None
    items_per_s: float | None = None
    """Batch 32: 32 / median seconds per run."""
    shared_with: str = ""
    """Label of the row whose measurement this one reuses (the same model bytes, engine and precision)."""

    @property
    def label(self) -> str:
        return f"{self.artifact} {self.variant}"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class _TestData:
    key: str
    batches: Callable[[], Iterator[Feeds]]
    y: np.ndarray
    task: Any = None  # the artifact's task and its Info (`pipeline/tasks/`)
    info: tasks.Info = tasks.Info(())


@dataclass
class _Plan:
    """A row and how to build its engine; `key` identifies the model + engine + precision + test data."""

    row: BenchRow
    build: Callable[[], Callable[[Feeds], Feeds]] | None
    key: tuple[Any, ...]
    data: _TestData


def measure(dirs: Sequence[Path], quick: bool = False) -> list[BenchRow]:
    """Rows for every servable model in `dirs` (export, compress or package artifacts), in order.
    Raises InputError naming the first directory that is not a verifiable artifact of those stages.
    `quick`: fewer timed runs (tests, smoke runs); the numbers are noisier."""
    if not dirs:
        raise InputError("pipe bench: name at least one export, compress or package directory")
    arts = [(str(d), artifacts.verify(Path(d), STAGES)) for d in dirs]
    threads = runtime.threads_per_process(1)
    data_cache: dict[str, _TestData] = {}
    plans = [p for given, art in arts for p in _plans(given, art, threads, data_cache)]
    engines: dict[tuple[Any, ...], Callable[[Feeds], Feeds]] = {}
    first: dict[tuple[Any, ...], _Plan] = {}
    for p in plans:
        if p.build is None or not p.row.ok:
            continue
        if p.key in first:
            p.row.shared_with = first[p.key].row.label
            continue
        first[p.key] = p
        try:
            engines[p.key] = p.build()
            _accuracy(p, engines[p.key])
        except Exception as e:  # noqa: BLE001 - recorded in the row (failed: reason); the others are still measured
            engines.pop(p.key, None)
            p.row.status = f"failed: {_one_line(e)}"
    _time(first, engines, quick)
    for p in plans:
        if p.row.shared_with:
            src = first[p.key].row
            for f in ("status", "accuracy", "metric", "test_samples", "p50_ms", "p99_ms", "items_per_s"):
                setattr(p.row, f, getattr(src, f))
    return [p.row for p in plans]


def fastest(rows: Sequence[BenchRow], at: str = "bs1") -> BenchRow | None:
    """The ok row with the lowest p50 at batch 1 (`at="bs1"`) or the most items/s at batch 32 (`"bs32"`)."""
    ok = [r for r in rows if r.ok and r.p50_ms is not None]
    if not ok:
        return None
    if at == "bs1":
        return min(ok, key=lambda r: r.p50_ms)
    if at == "bs32":
        return max(ok, key=lambda r: r.items_per_s)
    raise ValueError(f"at: bs1 or bs32, got {at!r}")


def render_table(rows: Sequence[BenchRow]) -> str:
    """The terminal table (rich, no colour codes) with the fastest rows named under it."""
    from rich.console import Console
    from rich.table import Table

    here = machine()
    t = Table(title=f"pipe bench: {here['cpu']}, {here['threads']} threads")
    for col in ("artifact", "variant", "format", "engine", "status", "size MB", "accuracy", "p50 ms", "p99 ms",
                "items/s"):
        t.add_column(col, justify="right" if col in ("size MB", "accuracy", "p50 ms", "p99 ms", "items/s") else "left",
                     no_wrap=col != "status", overflow="fold")
    for r in rows:
        t.add_row(r.artifact, r.variant + (" (=)" if r.shared_with else ""), r.format, r.engine, r.status,
                  _num(r.size_mb, ".3f"), _num(r.accuracy, ".2%"), _num(r.p50_ms, ".3f"), _num(r.p99_ms, ".3f"),
                  _num(r.items_per_s, ",.0f"))
    buf = io.StringIO()
    # wide enough that paths are never folded; the table itself is only as wide as its content
    Console(file=buf, width=400, force_terminal=False, color_system=None, soft_wrap=False).print(t)
    lines = [ln.rstrip() for ln in buf.getvalue().rstrip("\n").splitlines()]
    lines.append(f"int8 on this CPU: {here['int8_summary']}")
    if any(r.shared_with for r in rows):
        lines.append("(=): the same model bytes, engine and precision as an earlier row: measured once")
    f1, f32 = fastest(rows, "bs1"), fastest(rows, "bs32")
    if f1 is None:
        lines.append("fastest on this machine: none (no row measured ok)")
    else:
        lines.append(f"fastest on this machine at batch 1: {f1.label} (p50 {f1.p50_ms:.3f} ms)")
        lines.append(f"fastest on this machine at batch 32: {f32.label} ({f32.items_per_s:,.0f} items/s)")
    return "\n".join(lines)


def to_json(rows: Sequence[BenchRow]) -> dict[str, Any]:
    """A JSON-ready document: machine, rows (every field), and the fastest rows' labels."""
    f1, f32 = fastest(rows, "bs1"), fastest(rows, "bs32")
    return {"machine": machine(), "rows": [{**dataclasses.asdict(r), "label": r.label} for r in rows],
            "fastest": {"bs1": f1.label if f1 else None, "bs32": f32.label if f32 else None}}


def machine() -> dict[str, Any]:
    """CPU model, its int8 capability (`pipeline/cpu.py`), cores and the threads each engine is given."""
    cap = cpu.capability()
    return {"cpu": cap["cpu"], "int8": cap, "int8_summary": cpu.summary(cap), "cores": os.cpu_count(),
            "threads": runtime.threads_per_process(1)}


# ------------------------------------------------------------------ what each artifact holds


def _plans(given: str, art: artifacts.Artifact, threads: int, cache: dict[str, _TestData]) -> list[_Plan]:
    m = art.manifest
    stage = m["stage"]
    data = _test_data(art, cache)
    out: list[_Plan] = []

    def add(variant: str, fmt: str, engine: str, precision: str, files: list[tuple[artifacts.Artifact, str]],
            status: str = "ok") -> None:
        paths = [a.file(f) for a, f in files]  # InputError naming the manifest if one is not listed
        size = sum(a.manifest["files"][f]["bytes"] for a, f in files) / _MB if files else None
        row = BenchRow(given, stage, variant, fmt, engine, precision, status, size)
        if (engine, len(paths)) in (("paddle_inference", 2), ("onnxruntime", 1), ("openvino", 1), ("openvino", 2)):
            def build() -> Callable[[Feeds], Feeds]:  # feeds -> every output by public name, fed and fetched by name
                eng = ENGINES[engine].load(paths, threads=threads, precision=precision)
                return bind(eng, iospec.IO.from_interface(m["interface"]), str(paths[0]))
        else:
            build = None
            if row.ok:
                row.status = "failed: model files not found in the manifest"
        key = (engine, precision, tuple(a.manifest["files"][f]["sha256"] for a, f in files), data.key)
        out.append(_Plan(row, build, key, data))

    def paddle_rows(src: artifacts.Artifact | None, model: str, precisions: Sequence[str], fmt: str,
                    names: Sequence[str], why_missing: str = "") -> None:
        for precision, name in zip(precisions, names):
            if src is None:
                add(name, fmt, "paddle_inference", precision, [], f"failed: {why_missing}")
                continue
            status = "ok"
            if precision == "bf16" and runtime.bf16_unsupported():
                status = f"unsupported: {runtime.bf16_unsupported()}"
            add(name, fmt, "paddle_inference", precision, [(src, model), (src, "model.pdiparams")], status)

    if stage == "export":
        paddle_rows(art, "model.json", ("fp32", "bf16"), "pir", ("fp32", "bf16"))
        if isinstance(m.get("onnx"), dict) and "model.onnx" in m["files"]:
            add("onnx-fp32", "onnx", "onnxruntime", "fp32", [(art, "model.onnx")])
    elif stage == "compress":
        export, why = _export_of(art)
        for name, v in (m["metrics"].get("variants") or {}).items():
            precision, engine, fmt = v.get("precision", "?"), v.get("engine", "?"), v.get("format", "?")
            if v.get("source") == "export" and not v.get("files"):  # fp32/bf16: the export's PIR program
                paddle_rows(export, "model.json", (precision,), fmt, (name,), why)
                continue
            if v.get("source") == "export":  # openvino-fp32: the export's legacy program
                if export is None:
                    add(name, fmt, engine, precision, [], f"failed: {why}")
                else:
                    add(name, fmt, engine, precision, [(export, f) for f in v["files"]],
                        "ok" if v.get("supported", True) else f"unsupported: {v.get('reason') or 'recorded as such'}")
                continue
            files = [(art, f) for f in v.get("files") or []]
            status = "ok" if v.get("supported", True) else f"unsupported: {v.get('reason') or 'recorded as such'}"
            add(name, fmt, engine, precision, files, status)
    else:  # package
        fmt, precision = m.get("format", "pir"), m.get("precision", "fp32")
        engine = str(m.get("engine") or "paddle_inference")  # packages before engines were chosen: Paddle
        variant = str(m["metrics"].get("variant") or precision)  # the compress variant it copied, if any
        if engine == "paddle_inference":
            paddle_rows(art, MODEL_FILES.get(fmt, MODEL_FILES["pir"])[0], (precision,), fmt, (variant,))
        else:
            add(variant, fmt, engine, precision, [(art, f) for f in MODEL_FILES.get(fmt, ())])
        for rel in sorted(f for f in m["files"] if f.startswith("triton/") and f.endswith("/model.onnx")):
            onnx_precision = m["metrics"].get("onnx_precision", "fp32")
            add(f"onnx-{onnx_precision}", "onnx", "onnxruntime", onnx_precision, [(art, rel)])
    return out


def _export_of(comp: artifacts.Artifact) -> tuple[artifacts.Artifact | None, str]:
    """The export a compress dir's fp32/bf16 variants run, verified and unchanged since it was used."""
    chain = artifacts.lineage(comp, check=True)
    if len(chain) < 2 or chain[1][0] is None:
        return None, (chain[1][1] if len(chain) > 1 else "no input export recorded")
    export, note = chain[1]
    if note:
        return None, f"{export.path}: {note}"
    return export, ""


# ------------------------------------------------------------------ test data


def _test_data(art: artifacts.Artifact, cache: dict[str, _TestData]) -> _TestData:
    """The test split of the data the artifact was trained on, prepared for its interface."""
    where = art.path / artifacts.MANIFEST
    m = art.manifest
    try:
        data_cfg = config_mod.from_dict({"data": m["config"]["data"]}).data
        iface = m["interface"]
        pre, labels = iface["preprocessing"], [str(s) for s in iface["labels"]]
    except (KeyError, TypeError):
        raise InputError(f"{where}: records no data config, labels or preprocessing to measure accuracy with") from None
    vocab = _vocab(art) if pre.get("kind") == "text" else None
    key = json.dumps([dataclasses.asdict(data_cfg), pre, labels, vocab], sort_keys=True, default=str)
    if key in cache:
        return cache[key]
    ds = data_mod.load(data_cfg)
    if list(ds.labels) != labels:
        raise InputError(f"{where}: trained with labels {labels[:5]}..., data.source {data_cfg.source!r} now gives "
                         f"{list(ds.labels)[:5]}...; the data changed")
    n_test = _recorded_test_samples(art)
    if n_test is not None and n_test != len(ds.test):
        raise InputError(f"{where}: the test split had {n_test} samples, data.source {data_cfg.source!r} now gives "
                         f"{len(ds.test)}; the data changed")
    split = ds.test
    if vocab is not None:
        ids = {ch: i for i, ch in enumerate(vocab)}
        texts = [ds.texts[i] for i in split.idx]
        max_len = int(pre.get("max_len") or ds.preprocessing["max_len"])

        def batches() -> Iterator[Feeds]:  # every input made from the ids by the recorded rule (text_inputs)
            for i in range(0, len(texts), _EVAL_BATCH):
                yield data_mod.text_inputs(data_mod.encode_texts(texts[i:i + _EVAL_BATCH], ids, max_len), pre)
    else:
        def batches() -> Iterator[Feeds]:
            for i in range(0, len(split), _EVAL_BATCH):
                yield split.feeds(np.arange(i, min(i + _EVAL_BATCH, len(split))), pre)
    desc = iospec.IO.from_interface(iface, str(where))
    task, info = tasks.from_interface(iface, desc)
    cache[key] = _TestData(key, batches, np.asarray(split.y[split.idx]), task, info)
    return cache[key]


def _vocab(art: artifacts.Artifact) -> list[str]:
    """The artifact's `vocab.json`, else the one up its lineage (a package does not carry it)."""
    for a, _ in artifacts.lineage(art, check=True):
        if a is not None and "vocab.json" in a.manifest["files"]:
            vocab = json.loads(a.file("vocab.json").read_text(encoding="utf-8"))
            if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
                raise InputError(f"{a.path / 'vocab.json'}: not a JSON list of strings")
            return vocab
    raise InputError(f"{art.path}: a text model, but no vocab.json in it or its lineage")


def _recorded_test_samples(art: artifacts.Artifact) -> int | None:
    for a, _ in artifacts.lineage(art, check=False):
        n = a.manifest.get("metrics", {}).get("test_samples") if a is not None else None
        if isinstance(n, int):
            return n
    return None


# ------------------------------------------------------------------ accuracy and timing


def _accuracy(p: _Plan, run: Callable[[Feeds], Feeds]) -> None:
    """The row's test metric: the task's monitored one over every output of the test split."""
    outs = tasks.concat([run({k: np.ascontiguousarray(v) for k, v in fb.items()}) for fb in p.data.batches()])
    rows = iospec.num_rows(outs)
    if rows != len(p.data.y):
        raise PipeError(f"returned {rows} rows for {len(p.data.y)} samples")
    task = p.data.task
    p.row.accuracy = float(task.metrics_of(outs, p.data.y, p.data.info)[task.monitor])
    p.row.metric = str(task.monitor)
    p.row.test_samples = int(len(p.data.y))


def _time(first: dict[tuple[Any, ...], _Plan], engines: dict[tuple[Any, ...], Callable[[Feeds], Feeds]],
          quick: bool) -> None:
    """compress's interleaved timing, once per test data set (inputs differ between data sets)."""
    from stages import compress as c

    n_lat, n_thr = _QUICK_RUNS if quick else _RUNS
    by_data: dict[str, list[_Plan]] = {}
    for key, p in first.items():
        if key in engines:
            by_data.setdefault(p.data.key, []).append(p)
    for plans in by_data.values():
        head = next(plans[0].data.batches())
        x1 = {k: np.ascontiguousarray(v[:1]) for k, v in head.items()}
        x32 = {k: np.ascontiguousarray(np.resize(v, (_BS_THROUGHPUT, *v.shape[1:]))) for k, v in head.items()}
        groups = [{p.row.label: engines[p.key] for p in plans if p.row.engine == e}
                  for e in ENGINES]
        groups = [g for g in groups if g]
        lat = c.interleaved(groups, x1, n_lat)
        thr = c.interleaved(groups, x32, n_thr)
        for p in plans:
            p.row.p50_ms = float(np.percentile(lat[p.row.label], 50) * 1e3)
            p.row.p99_ms = float(np.percentile(lat[p.row.label], 99) * 1e3)
            p.row.items_per_s = float(_BS_THROUGHPUT / np.median(thr[p.row.label]))


def _one_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[-1]
    return f"{e.__class__.__name__}: {text}"[:200] if not isinstance(e, PipeError) else text[:200]


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)
