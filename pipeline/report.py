"""The run report: `report.md` and a self-contained `report.html` written into a run directory.

    python -c "from pipeline import report; print(report.write('runs/demo'))"

Reads manifests and `train/metrics.csv` (nothing is re-measured): training curves of every metric of the
run's task (`pipeline/tasks`: classification's accuracy, detection's COCO mAP, a user's `module:Task`'s own);
those metrics, size, p50/p99 latency and throughput of every model variant compress measured (fp32, bf16,
int8 Paddle Inference, onnxruntime fp32/int8, a distilled student and its teacher), as a table and a bar
chart; export/compress/package parity numbers; what was packaged and why; the lineage with each manifest's
sha256 and the one its successor recorded; versions and hardware. A detection run also gets a picture of
the export's detections on a few test images (`report-detections.png`, embedded in the HTML): the one part
that runs a model, on Paddle Inference, so only a detection report imports paddle; when it cannot be drawn
(no export, no engine, the data gone) the report says why instead. A partial run (no compress, no package,
a text model compress cannot take) gets the sections it can; missing numbers show as "-", unsupported
variants as "unsupported: reason". The HTML embeds its plots as base64 PNGs and has no external scripts,
styles, fonts or links. The files are replaced atomically.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import io
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pipeline import artifacts, choose, cpu, tasks
from pipeline.errors import InputError

STAGES = ("train", "export", "compress", "package")
_MB = 1e6
_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
_NA = "-"
_METRIC_NAMES = {"acc": "accuracy", "map": "mAP@[.5:.95]", "map50": "mAP@.5"}
_PERCENT = frozenset(("acc", "map", "map50"))  # shares, shown as % (COCO tables show AP x 100); others .4f
DETECTIONS_PNG = "report-detections.png"
_DET_IMAGES = 6  # test images in the detections picture
_DET_DRAWN = 10  # predicted boxes drawn per image at most (a barely trained model can pass the threshold often)


@dataclass
class Stage:
    """A stage directory as the report sees it: its manifest (possibly unverifiable) and status."""

    name: str
    path: Path
    manifest: dict[str, Any]
    sha256: str
    status: str
    """'verified' or the one-line reason it is not."""


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    title: str
    blocks: list[Any] = field(default_factory=list)
    """str (a paragraph), Table, or ("png", bytes, caption[, file name the PNG is also written to])."""


@dataclass(frozen=True)
class Task:
    """The run's task as the report shows it (the contract is pipeline/tasks/__init__.py)."""

    name: str
    spec: str
    metrics: tuple[str, ...]
    monitor: str
    maximize: bool | None
    """None: not known (the task did not import)."""
    agreement: bool
    """classification's top-1 agreement applies (a task reading logits)."""
    note: str = ""
    """why the task could not be imported here (its metrics are then read off the manifests)."""

    def label(self, metric: str) -> str:
        return _METRIC_NAMES.get(metric, metric)

    def fmt(self, metric: str, v: Any) -> str:
        return _num(v, ".2%" if metric in _PERCENT else ".4f")

    def better(self) -> str:
        return {True: "higher is better", False: "lower is better"}.get(self.maximize, "direction not known")


def write(run_dir: Path) -> tuple[Path, Path]:
    """Write `run_dir/report.md` and `run_dir/report.html`; returns their paths."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    stages = {s: st for s in STAGES if (st := _load(run_dir / s, s)) is not None}
    if not stages:
        raise InputError(f"{run_dir}: no stage directories (train/, export/, compress/, package/) to report on")
    chain = _chain(stages)
    task = _task(stages)
    sections = [
        _overview(run_dir, stages, task),
        _curves(run_dir, stages, chain, task),
        _variants(stages, task),
        *([_detections(stages)] if task.spec == "detection" else []),
        _parity(stages, task),
        _packaged(stages, _pick_record(run_dir), task),
        _lineage(run_dir, stages, chain),
        _environment(stages),
    ]
    title = f"pipe run report: {run_dir.resolve().name}"
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    pictures = {b[3]: b[1] for sec in sections for b in sec.blocks if isinstance(b, tuple) and len(b) > 3}
    for name, png in pictures.items():
        _write_bytes_atomic(run_dir / name, png)
    if DETECTIONS_PNG not in pictures:
        (run_dir / DETECTIONS_PNG).unlink(missing_ok=True)  # an earlier report's picture would read as this one's
    artifacts.write_text_atomic(md_path, _markdown(title, sections))
    artifacts.write_text_atomic(html_path, _html(title, sections))
    return md_path, html_path


# ------------------------------------------------------------------ reading the run


def _load(path: Path, stage: str) -> Stage | None:
    """The stage dir's manifest, verified when possible; an unreadable one is still listed."""
    if not path.is_dir():
        return None
    try:
        art = artifacts.verify(path, (stage,))
        return Stage(stage, path, art.manifest, art.manifest_sha256, "verified")
    except InputError as e:
        status = str(e)
    try:
        raw = (path / artifacts.MANIFEST).read_bytes()
        manifest = json.loads(raw)
        sha = hashlib.sha256(raw).hexdigest()
        if isinstance(manifest, dict) and "metrics" in manifest:
            manifest["metrics"] = artifacts.current_names(manifest["metrics"])
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        manifest, sha = {}, ""
    return Stage(stage, path, manifest if isinstance(manifest, dict) else {}, sha, status)


def _chain(stages: dict[str, Stage]) -> list[Stage]:
    """From the newest stage back through each manifest's `input` (a distilled student's export and
    train sit outside the run's own train/ and export/)."""
    newest = stages[next(s for s in reversed(STAGES) if s in stages)]
    out, cur, seen = [newest], newest, {newest.path.resolve()}
    while isinstance(cur.manifest.get("input"), dict):
        ref = cur.manifest["input"]
        if not isinstance(ref.get("path"), str) or not isinstance(ref.get("stage"), str):
            break
        path = (cur.path / ref["path"]).resolve()
        if path in seen:
            break
        nxt = _load(path, ref["stage"])
        if nxt is None:
            out.append(Stage(ref["stage"], path, {}, "", f"{path}: missing"))
            break
        out.append(nxt)
        seen.add(path)
        cur = nxt
    return out


def _task(stages: dict[str, Stage]) -> Task:
    """The task the manifests' interface names (`interface.task.spec`; none: classification, as every
    manifest before tasks existed), through `pipeline.tasks`."""
    iface = next((st.manifest["interface"] for st in stages.values()
                  if isinstance(st.manifest.get("interface"), dict)), {})
    rec = _get(iface, "task", default={})
    spec = rec.get("spec") if isinstance(rec.get("spec"), str) and rec.get("spec") else "classification"
    try:
        t = tasks.get(spec)
        return Task(str(t.name), spec, tuple(str(m) for m in t.metrics), str(t.monitor), bool(t.maximize),
                    bool(getattr(t, "logits", False)))
    except Exception as e:  # a user's module may fail to import here in any way: said in the report, not raised
        why = f"model.task {spec!r} does not import here ({e.__class__.__name__}: {_line(e)})"
    found: list[str] = []  # its metrics, as the manifests name them: test_<m>
    for st in stages.values():
        for k in _get(st.manifest, "metrics", default={}):
            m = k[5:] if isinstance(k, str) and k.startswith("test_") else ""
            if m and m not in ("loss", "samples") and m not in found:
                found.append(m)
    comp = _get(stages["compress"].manifest, "metrics", default={}) if "compress" in stages else {}
    monitor = comp.get("metric") if comp.get("metric") in found else (found[0] if found else "acc")
    name = rec.get("name") if isinstance(rec.get("name"), str) else spec
    return Task(name, spec, tuple(found) or (monitor,), monitor, None, False,
                why + "; its metrics are read off the manifests")


def _line(e: BaseException) -> str:
    """An exception's message on one line (its first non-empty line)."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    """As `artifacts.write_text_atomic`, for a PNG."""
    tmp = path.parent / f"{path.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    artifacts.fsync(path.parent)


def _get(d: Any, *keys: str, default: Any = None) -> Any:
    """d[k1][k2]... or `default`; with a dict default, also when the value found is not a dict."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    if isinstance(default, dict) and not isinstance(d, dict):
        return default
    return d


def _num(v: Any, spec: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _NA
    return format(v, spec)


def _rel(path: Path, run_dir: Path) -> str:
    try:
        return path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        return str(path)


# ------------------------------------------------------------------ sections


def _overview(run_dir: Path, stages: dict[str, Stage], task: Task) -> Section:
    first = next(iter(stages.values())).manifest
    model = _get(first, "config", "model", "name") or _get(first, "interface", "model") or "?"
    data = _get(first, "config", "data", "source") or "?"
    present = ", ".join(f"{s} ({st.status if st.status == 'verified' else 'NOT verified'})"
                        for s, st in stages.items())
    missing = [s for s in STAGES if s not in stages]
    text = [f"Model `{model}` on data `{data}`. Stages: {present}."]
    if task.spec != "classification":  # classification reports read as they did before tasks existed
        text.append(f"Task `{task.name}` (model.task {task.spec}): metrics "
                    f"{', '.join(task.label(m) for m in task.metrics)}; training and compress monitor "
                    f"{task.label(task.monitor)} ({task.better()}).")
    if task.note:
        text.append(task.note[0].upper() + task.note[1:] + ".")
    if missing:
        text.append(f"Not in this run: {', '.join(missing)}.")
    text.append(f"Written {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())} from the manifests in {run_dir}.")
    return Section("Overview", [" ".join(text)])


def _read_metrics_csv(path: Path) -> list[dict[str, float]]:
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            row = {}
            for k, v in rec.items():
                try:
                    row[k] = float(v)
                except (TypeError, ValueError):
                    pass
            rows.append(row)
    return rows


def _curves(run_dir: Path, stages: dict[str, Stage], chain: list[Stage], task: Task) -> Section:
    sec = Section("Training curves")
    trains = [st for st in [stages.get("train"), *[c for c in chain if c.name == "train"]] if st is not None]
    done: set[Path] = set()
    for st in trains:
        if st.path.resolve() in done:
            continue
        done.add(st.path.resolve())
        imported = _get(st.manifest, "init", "source", "path") if _get(st.manifest, "init", "kind") == "program" else None
        name = f"{Path(imported).name}, fine-tuned" if imported else _get(st.manifest, "config", "model", "name") or "?"
        who = f"{name} ({_rel(st.path, run_dir)})"
        csv_path = st.path / "metrics.csv"
        if not csv_path.is_file():
            sec.blocks.append(f"{who}: no metrics.csv.")
            continue
        try:
            rows = _read_metrics_csv(csv_path)
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            sec.blocks.append(f"{who}: metrics.csv unreadable ({e.__class__.__name__}).")
            continue
        if not rows or "epoch" not in rows[0]:
            sec.blocks.append(f"{who}: metrics.csv has no per-epoch rows.")
            continue
        m = _get(st.manifest, "metrics", default={})
        tests = "".join(f"test {task.label(k)} {task.fmt(k, m.get(f'test_{k}'))}, " for k in task.metrics)
        sec.blocks.append(f"{who}: {len(rows)} epochs; {tests}test loss {_num(m.get('test_loss'), '.4f')}, "
                          f"best checkpoint {m.get('best_checkpoint', _NA)}.")
        if guard := _guard_line(m, task):
            sec.blocks.append(guard)
        shown = " and ".join(task.label(k) for k in task.metrics)
        sec.blocks.append(("png", _plot_curves(rows, who, task), f"loss and validation {shown} per epoch: {who}"))
        vals = {f"{g}_{k}": k for g in ("val", "held_out", "general") for k in task.metrics}
        cols = [c for c in ("train_loss", "val_loss", *vals, "lr") if c in rows[0]]
        sec.blocks.append(Table(["epoch", *cols], [
            [_num(r.get("epoch"), ".0f"),
             *[task.fmt(vals[c], r.get(c)) if c in vals else _num(r.get(c), ".4g") for c in cols]] for r in rows]))
    if not sec.blocks:
        sec.blocks.append("No train stage in this run.")
    return sec


def _guard_line(m: dict[str, Any], task: Task) -> str:
    """A fine-tune's guard against forgetting, from its train manifest: each set before -> after, the one judged
    and its bound; '' for a run that is not a fine-tune of an imported program."""
    k = task.monitor
    sets = [(g, m[f"{g}_lines"], m[f"{g}_source"]) for g in ("held_out", "general") if f"{g}_{k}" in m]
    if not sets:
        return ""
    judged = m.get("guard_judged_by", "general")
    said = [f"{'held-out' if g == 'held_out' else 'general'} ({n} {src} lines"
            f"{', judged: within ' + _num(m.get('max_general_drop'), 'g') if g == judged else ''}) "
            f"{task.fmt(k, m.get(f'pretrained_{g}_{k}'))} -> {task.fmt(k, m.get(f'{g}_{k}'))}" for g, n, src in sets]
    return f"Forgetting, {task.label(k)} of the pretrained model -> the best checkpoint: {'; '.join(said)}."


def _variant_rows(stages: dict[str, Stage], task: Task) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """[(label, {status, accuracy, metrics, agreement, size_mb, p50, p99, items_s, engine, precision, note})],
    notes; `accuracy` is the monitored metric's value (compress's name for it), `metrics` every metric's."""
    rows: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    comp, exp = stages.get("compress"), stages.get("export")
    distill = _get(comp.manifest, "metrics", "distill") if comp else None
    if exp is not None and (comp is None or isinstance(distill, dict)):
        em = _get(exp.manifest, "metrics", default={})
        files = _get(exp.manifest, "files", default={})
        size = sum(b for f in ("model.json", "model.pdiparams")
                   if isinstance(b := _get(files, f, "bytes"), (int, float))) or None
        teacher = _get(exp.manifest, "config", "model", "name") or "?"
        label = "fp32 (export)" if comp is None else f"teacher {teacher} fp32 (export)"
        rows.append((label, {"status": "ok", "engine": "paddle_inference", "precision": "fp32",
                             "accuracy": em.get(f"test_{task.monitor}"), "agreement": None,
                             "metrics": {k: em.get(f"test_{k}") for k in task.metrics},
                             "size_mb": size / _MB if size else None, "p50": em.get("latency_ms_p50_bs1"),
                             "p99": None, "items_s": None, "note": "measured by export (batch-1 p50 only)"}))
    if comp is None:
        notes.append("No compress stage in this run: bf16, int8 (Paddle Inference and onnxruntime) and "
                     "onnx-fp32 were not measured.")
        return rows, notes
    variants = _get(comp.manifest, "metrics", "variants", default={})
    if not isinstance(variants, dict) or not variants:
        notes.append("The compress manifest records no variants.")
        return rows, notes
    from pipeline import fidelity

    # compress's one verdict per variant, as stored (a manifest from before it covered compress.max_drop: once, here)
    variants = fidelity.verdicts(_get(comp.manifest, "metrics", default={}),
                                 _get(comp.manifest, "config", "compress"), task.maximize is not False)
    prefix = f"student {distill.get('student') or '?'} " if isinstance(distill, dict) else ""
    if prefix:
        notes.append(f"Distilled: compress trained student `{distill.get('student')}` from teacher "
                     f"`{distill.get('teacher_model')}` (temperature {distill.get('temperature', _NA)}, alpha "
                     f"{distill.get('alpha', _NA)}); student test accuracy "
                     f"{_num(distill.get('student_test_acc'), '.2%')}"
                     f" vs teacher {_num(distill.get('teacher_test_acc'), '.2%')}"
                     + (f", student trained alone {_num(distill.get('baseline_test_acc'), '.2%')}"
                        if "baseline_test_acc" in distill else "") + ". The variants below are the student's.")
    for name, v in variants.items():
        if not isinstance(v, dict):
            continue
        supported = v.get("supported", True)
        status = (v.get("status") or "ok") if supported else \
            f"unsupported: {v.get('reason') or v.get('note') or 'no reason recorded'}"
        size = v.get("size_bytes")
        every = v.get("metrics") if isinstance(v.get("metrics"), dict) else {}
        rows.append((prefix + name, {
            "status": status, "engine": v.get("engine", _NA), "precision": v.get("precision", _NA),
            "accuracy": v.get("accuracy"), "agreement": v.get("top1_agreement") if v.get("top1_agreement") is not None
            else v.get("char_agreement"),  # ocr_rec: its answers' agreement with fp32's, per character
            "metrics": {k: v.get("accuracy") if k == task.monitor else every.get(k) for k in task.metrics},
            "size_mb": size / _MB if isinstance(size, (int, float)) else None,
            "p50": v.get("latency_ms_p50_bs1"), "p99": v.get("latency_ms_p99_bs1"),
            "items_s": v.get("items_per_s_batch"), "note": v.get("note", "") if supported else ""}))
    timing = _get(comp.manifest, "metrics", "timing", default={})
    cm = _get(comp.manifest, "metrics", default={})
    cap = cm.get("cpu")
    if isinstance(cap, dict) and task.agreement:
        notes.append(f"CPU where compress measured, and its int8 capability: {cpu.summary(cap)}. Top-1 agreement "
                     f"is over {cm.get('agreement_samples', _NA)} samples of all "
                     f"splits; budget compress.min_agreement {cm.get('min_agreement', _NA)}.")
    elif isinstance(cap, dict) and cm.get("agreement") == "char_agreement":  # a task that owns its data (ocr_rec)
        search = cm.get("openvino_search") or {}
        notes.append(f"CPU where compress measured, and its int8 capability: {cpu.summary(cap)}. Agreement is the "
                     f"answers' with fp32's, per character, over {cm.get('agreement_samples', _NA)} val and test "
                     f"lines; budget compress.min_agreement {cm.get('min_agreement', _NA)}."
                     + (f" openvino-int8: NNCF's per-layer search kept {len(search.get('fp32_layers') or [])} of "
                        f"{search.get('layers_quantizable', _NA)} layers in fp32 "
                        f"({', '.join(search.get('fp32_layers') or []) or 'none'})." if search else ""))
    elif isinstance(cap, dict):  # no logits: fidelity is each output's SQNR against fp32
        outs = cm.get("sqnr_budget_outputs")
        notes.append(f"CPU where compress measured, and its int8 capability: {cpu.summary(cap)}. Fidelity to fp32 "
                     f"(SQNR of output{'s' if isinstance(outs, list) and len(outs) != 1 else ''} "
                     f"{', '.join(map(str, outs)) if isinstance(outs, list) else _NA}) is over "
                     f"{cm.get('agreement_samples', _NA)} samples of all splits; budget compress.min_sqnr_db "
                     f"{cm.get('min_sqnr_db', _NA)} dB.")
    if task.spec != "classification":
        worse = {True: "fall", False: "rise"}.get(task.maximize, "worsening")
        notes.append(f"compress monitored {task.label(task.monitor)} ({task.better()}): budget compress.max_drop "
                     f"{cm.get('max_drop', _NA)} points (100 x its {worse}); the "
                     f"best int8 variant, {cm.get('best_int8') or _NA}, is {_num(cm.get('int8_drop_points'), '.3f')} "
                     "points worse than fp32.")
    samples, batches, size = (_get(cm, "calibration", k) for k in ("samples", "batches", "batch_size"))
    if samples is not None:
        thin = _get(cm, "calibration", "thin") is True
        notes.append(f"int8 was calibrated on {_num(samples, ',')} train samples ({_num(batches, ',')} batches of "
                     f"{_num(size, ',')}){': fewer than 100, so its ranges may be poor' if thin else ''}.")
    notes.append(f"Measured by compress on {_get(comp.manifest, 'metrics', 'test_samples', default=_NA)} test "
                 f"samples with {_get(comp.manifest, 'metrics', 'threads', default=_NA)} threads: "
                 f"{timing.get('latency_runs', _NA)} timed batch-1 runs and {timing.get('throughput_runs', _NA)} "
                 f"batch-{timing.get('batch') or 32} runs per variant, interleaved. Size in MB = 10^6 bytes.")
    return rows, notes


def _variants(stages: dict[str, Stage], task: Task) -> Section:
    monitored = task.label(task.monitor)
    sec = Section(f"Model variants: {monitored}, size, latency, throughput")
    rows, notes = _variant_rows(stages, task)
    batch = _throughput_batch(stages)
    sec.blocks += notes
    if not rows:
        sec.blocks.append("No model variants to show (no export or compress stage).")
        return sec
    agree = task.agreement or any(_num(r["agreement"], "g") != _NA for _, r in rows)
    sec.blocks.append(Table(
        ["variant", "engine", "precision", "status", *[task.label(k) for k in task.metrics],
         *(["top-1 agreement"] if agree else []), "size MB", "p50 ms bs1", "p99 ms bs1", f"items/s bs{batch}", "note"],
        [[label, str(r["engine"]), str(r["precision"]), r["status"],
          *[task.fmt(k, r["metrics"].get(k)) for k in task.metrics],
          *([_num(r["agreement"], ".3f")] if agree else []), _num(r["size_mb"], ".3f"), _num(r["p50"], ".3f"),
          _num(r["p99"], ".3f"), _num(r["items_s"], ",.0f"), str(r["note"] or "")] for label, r in rows]))
    sec.blocks.append(("png", _plot_variants(rows, task, batch),
                       f"{monitored}, size, p50/p99 latency and throughput per variant"))
    return sec


def _detections(stages: dict[str, Stage]) -> Section:
    """The export's fp32 program on a few test images (Paddle Inference), decoded with the task settings the
    interface records (what /v1 answers): predicted boxes with label and score over the ground truth."""
    sec = Section("Detections on test images")
    exp = stages.get("export")
    why = ("no export stage in this run" if exp is None else
           f"the export stage is not verified ({exp.status})" if exp.status != "verified" else "")
    if not why:
        from pipeline import engines

        why = engines.missing("paddle_inference")
    if not why:
        try:
            got = _detect(exp)
        except Exception as e:  # data gone, engine or program refused: said in the report, which never fails the run
            why = f"{e.__class__.__name__}: {_line(e)}"
    if why:
        sec.blocks.append(f"No picture of detections: {why}.")
        return sec
    thr, labels = got["settings"].get("score_threshold", _NA), got["labels"]
    name = lambda c: labels[int(c)] if 0 <= int(c) < len(labels) else str(int(c))  # noqa: E731
    sec.blocks.append(f"The export's fp32 program (`model.json`, Paddle Inference) on {len(got['pos'])} of "
                      f"{got['test_samples']} test images, decoded with the interface's settings (score_threshold "
                      f"{thr}, nms_iou {got['settings'].get('nms_iou', _NA)}, max_detections "
                      f"{got['settings'].get('max_detections', _NA)}). Boxes in model-input pixels.")
    sec.blocks.append(("png", _plot_detections(got, name),
                       f"predicted boxes (red: label and score, score >= {thr}; at most {_DET_DRAWN} per image) "
                       "and ground truth (green, dashed) on test images", DETECTIONS_PNG))
    sec.blocks.append(Table(["test image", "ground truth", "predicted (label score)"], [
        [str(p), ", ".join(name(g[4]) for g in gt) or "none",
         (", ".join(f"{name(d[5])} {d[4]:.2f}" for d in dets[:_DET_DRAWN]) or "none")
         + (f" (+{len(dets) - _DET_DRAWN} more)" if len(dets) > _DET_DRAWN else "")]
        for p, gt, dets in zip(got["pos"], got["truth"], got["dets"])]))
    return sec


def _detect(exp: Stage) -> dict[str, Any]:
    """Decoded detections of the export's program on `_DET_IMAGES` test images spread over the split, with
    those images (uint8 NCHW) and their ground-truth boxes (class -1 padding dropped)."""
    import numpy as np

    from pipeline import config as config_mod, data as data_mod, engines, iospec
    from pipeline.tasks import detection

    m = exp.manifest
    where = str(exp.path / artifacts.MANIFEST)
    ds = data_mod.load(config_mod.from_dict(m["config"]).data, "boxes")
    if ds.targets != "boxes":
        raise InputError(f"{where}: data.source {ds.targets!r} holds no boxes")
    desc = iospec.IO.from_interface(m["interface"], f"{where}: interface")
    _, info = tasks.from_interface(m["interface"], desc)
    pos = np.unique(np.linspace(0, len(ds.test) - 1, min(_DET_IMAGES, len(ds.test))).round().astype(np.int64))
    program = exp.path / "model.json"
    eng = engines.ENGINES["paddle_inference"].load([program, exp.path / "model.pdiparams"], threads=1)
    on = engines.names(eng, desc, str(program))  # by name, as every engine user does
    feeds = desc.feeds(ds.test.feeds(pos, m["interface"]["preprocessing"]), where)
    raw = eng.run({on[t.name]: feeds[t.name] for t in desc.inputs})
    dets = detection.decode({t.public: raw[on[t.name]] for t in desc.outputs}, info.settings)
    y = np.asarray(ds.test.y[ds.test.idx[pos]], np.float32).reshape(len(pos), -1, 5)
    return {"pos": [int(p) for p in pos], "images": ds.test.rows(pos)["image"], "truth": [t[t[:, 4] >= 0] for t in y],
            "dets": dets, "labels": list(info.labels), "settings": dict(info.settings),
            "test_samples": len(ds.test)}


def _parity(stages: dict[str, Stage], task: Task) -> Section:
    sec = Section("Parity")
    rows: list[list[str]] = []

    def add(check: str, diff: Any, peak: Any, tol: Any, samples: Any, gated: str = _NA) -> None:
        rel = diff / peak if isinstance(diff, (int, float)) and isinstance(peak, (int, float)) and peak else None
        bound = tol * peak if isinstance(tol, (int, float)) and isinstance(peak, (int, float)) else None
        verdict = gated
        if isinstance(diff, (int, float)) and bound is not None:
            verdict = "pass" if diff <= bound else "FAIL"
        rows.append([check, _num(diff, ".3g"), _num(peak, ".4g"), _num(rel, ".3g"), _num(tol, "g"),
                     _num(bound, ".3g"), str(samples if samples is not None else _NA), verdict])

    exp = stages.get("export")
    if exp is not None:
        m = _get(exp.manifest, "metrics", default={})
        peak, tol, n = m.get("parity_max_abs_logit"), m.get("parity_tol"), m.get("parity_samples")
        add("export: Paddle Inference (PIR) vs trained model", m.get("parity_max_abs_diff"), peak, tol, n)
        if m.get("legacy_parity_max_abs_diff") is not None:
            add("export: legacy program vs trained model", m.get("legacy_parity_max_abs_diff"), peak, tol, n)
        elif _get(exp.manifest, "legacy", "available") is False:
            rows.append(["export: legacy program", _NA, _NA, _NA, _NA, _NA, _NA,
                         f"unsupported: {_get(exp.manifest, 'legacy', 'reason', default='not written')}"])
        if m.get("onnx_parity_max_abs_diff") is not None:
            add("export: model.onnx (onnxruntime) vs trained model", m.get("onnx_parity_max_abs_diff"), peak, tol, n)
        said = ", ".join(f"{task.label(k)} {task.fmt(k, m.get(f'test_{k}'))} (predictor) vs "
                         f"{task.fmt(k, m.get(f'dygraph_test_{k}'))} (trained model)" for k in task.metrics)
        agree = (f", top-1 agreement {_num(m.get('top1_agreement'), '.4f')}"
                 if task.agreement or "top1_agreement" in m else "")
        sec.blocks.append(f"Export test {said}{agree} on {m.get('test_samples', _NA)} test samples.")
    comp = stages.get("compress")
    if comp is not None and _get(comp.manifest, "metrics", "onnx_parity_max_abs_diff") is not None:
        cm = comp.manifest["metrics"]
        fp32 = _get(cm, "variants", "fp32", default={})
        add("compress: onnx-fp32 vs Paddle fp32 (whole test split)", cm.get("onnx_parity_max_abs_diff"),
            fp32.get("max_abs_logit_fp32"), cm.get("onnx_parity_tol"), cm.get("test_samples"),
            # compress records no max|logit|; its gate held the diff to tol x max|logit| or wrote nothing
            "pass (compress gate)")
    pkg = stages.get("package")
    if pkg is not None and _get(pkg.manifest, "metrics", "onnx_max_abs_diff") is not None:
        pm = pkg.manifest["metrics"]
        add(f"package: Triton ONNX ({pm.get('onnx_source', '?')}) vs Paddle predictor", pm.get("onnx_max_abs_diff"),
            pm.get("onnx_max_abs_logit"), pm.get("onnx_parity_tol"), "fixed random batch")
    if rows:
        sec.blocks.insert(0, Table(["check", "max|diff|", "max|logit|" if task.agreement else "max|output|",
                                    "relative", "tolerance (relative)",
                                    "bound", "samples", "result"], rows))
    else:
        sec.blocks.append("No parity numbers in this run (no export stage).")
    return sec


def _throughput_batch(stages: dict[str, Stage]) -> int:
    """The batch the compress stage's items/s was timed at (its variants' `throughput_batch`: ocr_det 4 pages),
    32 without one (every other compress, manifests before the field, no compress stage)."""
    comp = stages.get("compress")
    variants = _get(comp.manifest, "metrics", "variants", default={}) if comp is not None else {}
    return choose.throughput_batch(variants if isinstance(variants, dict) else {})


def _packaged(stages: dict[str, Stage], picked: dict[str, Any], task: Task) -> Section:
    sec = Section("Packaged model")
    pkg = stages.get("package")
    if pkg is None:
        sec.blocks.append("No package stage in this run.")
        return sec
    m = pkg.manifest
    pm = _get(m, "metrics", default={})
    src = _get(m, "input", "stage", default="?")
    variant = pm.get("variant") or m.get("precision") or "?"
    sec.blocks.append(f"`{m.get('name', '?')}`: variant **{variant}** ({m.get('precision', '?')}, format "
                      f"{m.get('format', '?')}, engine {m.get('engine', 'paddle_inference')}) from the {src} stage; "
                      f"test {task.label(task.monitor)} "
                      f"{task.fmt(task.monitor, pm.get('variant_accuracy'))}, size "
                      f"{_num(_mb(pm.get('variant_size_bytes')), '.3f')} MB, "
                      f"p50 {_num(pm.get('variant_latency_ms_p50_bs1'), '.3f')} ms at batch 1, "
                      f"{_num(pm.get('variant_items_per_s_batch'), ',.0f')} items/s at batch "
                      f"{_throughput_batch(stages)}. "
                      + (f"Triton ONNX: {pm['onnx_source']} ({pm.get('onnx_precision', '?')})."
                         if pm.get("onnx_source") else ""))
    why = picked.get("why") if picked.get("variant") == _get(m, "metrics", "variant") else None
    sec.blocks.append(f"Why: {why or _why(stages, m, task)}")
    return sec


def _pick_record(run_dir: Path) -> dict[str, Any]:
    """What `pipe all` recorded about its choice (RUN/pipeline.json `packaged`), or {}."""
    try:
        doc = json.loads((run_dir / "pipeline.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    picked = doc.get("packaged") if isinstance(doc, dict) else None
    return picked if isinstance(picked, dict) else {}


def _mb(v: Any) -> float | None:
    return v / _MB if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _why(stages: dict[str, Stage], pkg: dict[str, Any], task: Task) -> str:
    """The reason recorded in the package manifest, else what the manifests say about the choice."""
    said = _get(pkg, "chosen", "why")  # pipe package's own reason (pipeline/choose.py)
    if isinstance(said, str) and said:
        return f"{_get(pkg, 'metrics', 'variant')} on {pkg.get('engine', 'paddle_inference')}: {said}"
    for key in ("pick_reason", "reason"):
        said = _get(pkg, "metrics", key)
        if isinstance(said, str) and said:
            return said
    asked = _get(pkg, "config", "package", "precision") or "fp32 (the default)"
    pick = _get(pkg, "config", "release", "pick")
    parts = [f"package.precision was {asked}" + (f", release.pick {pick}" if pick else "") + "."]
    comp = stages.get("compress")
    variants = _get(comp.manifest, "metrics", "variants", default={}) if comp else {}
    if not variants:
        parts.append(f"No compress stage measured alternatives: the export's program was packaged at "
                     f"{pkg.get('precision') or 'fp32'}.")
        return " ".join(parts)
    chosen = _get(variants, str(_get(pkg, "metrics", "variant", default="")), default={})
    int8 = _get(variants, "int8-paddle", default={})
    if int8:
        verdict = "faster" if int8.get("faster_than_fp32") else "not faster"
        said = int8.get("note") or int8.get("reason") or _NA
        parts.append(f"compress measured int8-paddle (what `pipe serve` runs for int8) {verdict} than fp32 "
                     f"here: {said}.")
    if chosen:
        parts.append(f"The packaged variant measured {task.fmt(task.monitor, chosen.get('accuracy'))} "
                     f"{task.label(task.monitor)}, "
                     f"p50 {_num(chosen.get('latency_ms_p50_bs1'), '.3f')} ms.")
    return " ".join(parts)


def _lineage(run_dir: Path, stages: dict[str, Stage], chain: list[Stage]) -> Section:
    sec = Section("Lineage and checksums")
    listed = list(chain) + [st for st in stages.values() if st.path.resolve() not in {c.path.resolve() for c in chain}]
    rows = []
    for st in listed:
        inp = _get(st.manifest, "input")
        if isinstance(inp, dict):
            actual = _stage_sha(st.path / str(inp.get("path", "")))
            rec = str(inp.get("manifest_sha256", ""))
            match = "matches" if actual and actual == rec else ("input missing" if not actual else "CHANGED since used")
            inp_cells = [f"{inp.get('stage', '?')} ({_rel((st.path / str(inp.get('path', ''))), run_dir)})", rec, match]
        else:
            inp_cells = ["none", _NA, _NA]
        rows.append([st.name, _rel(st.path, run_dir), str(st.manifest.get("created", _NA)), st.sha256 or _NA,
                     *inp_cells, st.status])
    sec.blocks.append("Newest first along the packaged model's inputs, then any other stage of the run. "
                      "\"manifest sha256\" is the sha256 of that stage's manifest.json, which lists the sha256 "
                      "of every file in it; \"recorded input sha256\" is what the stage recorded of its input's.")
    sec.blocks.append(Table(["stage", "dir", "created", "manifest sha256", "input", "recorded input sha256",
                             "input now", "verified"], rows))
    files = []
    for st in listed:
        for rel, info in sorted(_get(st.manifest, "files", default={}).items()):
            files.append([_rel(st.path, run_dir) + "/" + rel, _num(_get(info, "bytes"), ","),
                          str(_get(info, "sha256", default=_NA))])
    if files:
        sec.blocks.append(Table(["file", "bytes", "sha256"], files))
    return sec


def _stage_sha(path: Path) -> str:
    try:
        return hashlib.sha256((path / artifacts.MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return ""


def _environment(stages: dict[str, Stage]) -> Section:
    sec = Section("Versions and hardware")
    names = list(stages)
    keys: list[str] = []
    for st in stages.values():
        for k in _get(st.manifest, "versions", default={}) or {}:
            if k not in keys:
                keys.append(k)
    rows = [[k, *[str(_get(stages[s].manifest, "versions", k, default=_NA)) for s in names]] for k in keys]
    rows.append(["device", *[str(stages[s].manifest.get("device", _NA)) for s in names]])
    threads = [_get(stages[s].manifest, "metrics", "threads") for s in names]
    rows.append(["threads (measuring)", *[str(t) if t is not None else _NA for t in threads]])
    tools = _get(stages.get("compress").manifest, "tools", default={}) if "compress" in stages else {}
    for k, v in (tools or {}).items():
        rows.append([k, *[str(v) if s == "compress" else _NA for s in names]])
    sec.blocks.append(Table(["", *names], rows))
    cpu, flags = _cpu()
    mem = _mem_gb()
    sec.blocks.append(f"This machine (where the report was written): {cpu}, {os.cpu_count()} cores"
                      + (f", {mem:.1f} GB RAM" if mem else "") + f"; {platform.platform()}; CPU flags: "
                      + (", ".join(f for f in _CPU_FLAGS if f in flags) or "none of " + ", ".join(_CPU_FLAGS)) + ".")
    return sec


def _cpu() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU", set()
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
    flags = next((set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")), set())
    return name or platform.processor() or "unknown CPU", flags


def _mem_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ------------------------------------------------------------------ plots (Agg canvas, no pyplot state)


def _figure(w: float, h: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _plot_curves(rows: list[dict[str, float]], title: str, task: Task) -> bytes:
    """Loss, then one panel per metric of the task (`val_<m>`; shares in %)."""
    fig = _figure(4.5 * (1 + len(task.metrics)), 3.2)
    loss, *panels = fig.subplots(1, 1 + len(task.metrics))
    ep = [r.get("epoch", i) for i, r in enumerate(rows)]
    for col, style in (("train_loss", "-o"), ("val_loss", "-s")):
        pts = [(e, r[col]) for e, r in zip(ep, rows) if col in r]
        if pts:
            loss.plot(*zip(*pts), style, ms=3, label=col.replace("_", " "))
    loss.set(xlabel="epoch", ylabel="loss", title="loss")
    loss.legend()
    for ax, k in zip(panels, task.metrics):
        scale = 100.0 if k in _PERCENT else 1.0
        pts = [(e, r[f"val_{k}"] * scale) for e, r in zip(ep, rows) if f"val_{k}" in r]
        if pts:
            ax.plot(*zip(*pts), "-o", ms=3, color="tab:green")
        ax.set(xlabel="epoch", ylabel="%" if k in _PERCENT else k,
               # the contract gives the monitored metric's direction only
               title=f"validation {task.label(k)}"
               + (" (lower is better)" if k == task.monitor and task.maximize is False else ""))
    for ax in (loss, *panels):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    # fixed margins: tight_layout is a whole extra draw (~1 s of the report's budget on a busy 2-core box)
    fig.subplots_adjust(left=0.07 * 2 / (1 + len(task.metrics)), right=0.98, bottom=0.16, top=0.83, wspace=0.22)
    return _png(fig)


def _plot_variants(rows: list[tuple[str, dict[str, Any]]], task: Task, batch: int = 32) -> bytes:
    percent = task.monitor in _PERCENT
    lower = " (lower is better)" if task.maximize is False else ""
    first = f"{task.label(task.monitor)}{' %' if percent else ''}{lower}"
    panels = (("accuracy", first, 100.0 if percent else 1.0), ("size_mb", "size MB", 1.0),
              ("p50", "p50 ms (batch 1)", 1.0), ("p99", "p99 ms (batch 1)", 1.0),
              ("items_s", f"items/s (batch {batch})", 1.0))
    labels = [label for label, _ in rows]
    width, height = 15.0, 0.45 * len(rows) + 1.6
    fig = _figure(width, height)
    axes = fig.subplots(1, len(panels), sharey=True)
    ypos = list(range(len(rows)))
    for ax, (key, title, scale) in zip(axes, panels):
        vals = [r[key] * scale if isinstance(r[key], (int, float)) and not isinstance(r[key], bool) else None
                for _, r in rows]
        ax.barh(ypos, [v or 0 for v in vals], color=["tab:blue" if v is not None else "none" for v in vals])
        for y, v in zip(ypos, vals):
            text = _NA if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:.4g}"
            ax.annotate(text, (v or 0, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.margins(x=0.25)
        if key == "accuracy" and percent and any(v is not None for v in vals):
            lo, hi = min(v for v in vals if v is not None), max(v for v in vals if v is not None)
            # accuracy's axis ends at 100%; a metric far below it (mAP) would be a sliver there
            ax.set_xlim(max(0.0, lo - 5), 100 if task.monitor == "acc" else min(100.0, hi + 5))
    axes[0].set_yticks(ypos, labels)
    axes[0].invert_yaxis()
    # room for the longest label at 7 pt (~0.055 in per character) instead of tight_layout's extra draw
    left = min(0.45, (0.2 + 0.055 * max(len(label) for label in labels)) / width)
    fig.subplots_adjust(left=left, right=0.99, bottom=0.6 / height, top=1 - 0.45 / height, wspace=0.35)
    return _png(fig)


def _plot_detections(got: dict[str, Any], name: Any) -> bytes:
    from matplotlib.patches import Rectangle

    n = len(got["pos"])
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig = _figure(3.0 * cols, 3.0 * rows + 0.3)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, p, img, gt, dets in zip(axes, got["pos"], got["images"], got["truth"], got["dets"]):
        h, w = img.shape[1:]
        # extent: pixel edges at 0..w, so box corners (model-input pixels) sit where they belong
        ax.imshow(img.transpose(1, 2, 0) if img.shape[0] == 3 else img[0], cmap="gray", extent=(0, w, h, 0),
                  interpolation="nearest")
        for x1, y1, x2, y2, _ in gt:
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, ec="#00d000", lw=1.5, ls="--"))
        for x1, y1, x2, y2, score, c in dets[:_DET_DRAWN][::-1]:  # the best drawn last, on top
            ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, ec="red", lw=1.2))
            inside = y1 < 0.1 * h  # a label above a box at the top edge would be clipped: put it inside
            ax.text(x1, y1, f"{name(c)} {score:.2f}", color="white", fontsize=6, va="top" if inside else "bottom",
                    bbox={"facecolor": "red", "alpha": 0.75, "pad": 0.5, "lw": 0}, clip_on=True)
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)
        ax.set_title(f"test #{p}: {len(gt)} true, {len(dets)} predicted"
                     + (f" (top {_DET_DRAWN} drawn)" if len(dets) > _DET_DRAWN else ""), fontsize=8)
        ax.set_axis_off()
    for ax in axes[n:]:
        ax.set_axis_off()
    fig.suptitle(f"red: predicted (label score, score >= {got['settings'].get('score_threshold', _NA)});  "
                 "green dashed: ground truth", fontsize=8)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.55 / (3.0 * rows + 0.3), wspace=0.08,
                        hspace=0.18)
    return _png(fig)


# ------------------------------------------------------------------ rendering


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _markdown(title: str, sections: Sequence[Section]) -> str:
    out = [f"# {title}", "", "Plots are in report.html (self-contained); the tables here carry the same numbers.", ""]
    for sec in sections:
        out += [f"## {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, Table):
                out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
                out.append("|" + "|".join("---" for _ in b.headers) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            elif isinstance(b, tuple) and len(b) > 3:
                out.append(f"![{_md_cell(b[2])}]({b[3]})")
            elif isinstance(b, tuple):
                out.append(f"*Plot: {b[2]} (in report.html).*")
            else:
                out.append(str(b))
            out.append("")
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{background:#f4f4f4;padding:0 .2em}img{max-width:100%;height:auto}figure{margin:.8em 0}
figcaption{font-size:.8em;color:#555}.sha{font-family:monospace;font-size:.8em;word-break:break-all}
"""


def _inline(text: str) -> str:
    """Escape, then the two bits of Markdown the paragraphs use: `code` and **bold**."""
    parts = html.escape(str(text)).split("`")
    out = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    bold = out.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(bold))


def _td(cell: str) -> str:
    s = str(cell)
    cls = ""
    if len(s) == 64 and all(c in "0123456789abcdef" for c in s):
        cls = ' class="sha"'
    elif s.replace(",", "").replace(".", "").replace("%", "").replace("-", "").replace("e", "").isdigit():
        cls = ' class="num"'
    return f"<td{cls}>{html.escape(s)}</td>"


def _html(title: str, sections: Sequence[Section]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for sec in sections:
        out.append(f"<h2>{html.escape(sec.title)}</h2>")
        for b in sec.blocks:
            if isinstance(b, Table):
                out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
                           + "</tr></thead><tbody>")
                out += ["<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows]
                out.append("</tbody></table>")
            elif isinstance(b, tuple):
                data = base64.b64encode(b[1]).decode("ascii")
                out.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                           f"<figcaption>{html.escape(b[2])}</figcaption></figure>")
            else:
                out.append(f"<p>{_inline(b)}</p>")
    out.append("</body></html>\n")
    return "\n".join(out)
