"""`make bench`, compress part: int8 and bf16 against fp32 on real models, and the int8 accuracy drop on digits.

    python -c "from pipeline.bench import compress; [print(r) for r in compress.rows(quick=True)]"

For resnet18 and mobilenet_v3_small at 3x64x64 this runs the real stages as a user would, in
subprocesses, one model after the other: `pipe train` (one epoch of a seeded synthetic .npz, random
init: speed does not depend on the weights), `pipe export`, `pipe compress --int8 --backend both`
(three times on the same export unless quick). It reads the compress manifests: each ratio is timed
interleaved against Paddle fp32 (oneDNN, PIR) within one compress run; rows give the median over the
runs and their range. Every engine compress measures is a row: Paddle Inference (fp32, bf16, int8),
onnxruntime (fp32, int8) and OpenVINO (fp32 on the legacy program, int8 on the QDQ ONNX); then what
`pipe package --engine auto` picks from each run's manifest (`pipeline.choose.pick`, as `pipe package`
calls it) and why. Goals (issue 4) use throughput at batch 32, the measure of the prototype table
in the facts note: on resnet18 the best int8 engine >= 3.5x and bf16 >= 1.8x.
The accuracy goal (drop <= 0.3 point) comes from `pipe all --config examples/digits.yaml`, whose compress
manifest gives digits' rows of every engine too (one run), and whose package is checked against the pick.

Text (issue 7), `text_rows`: the built-in `chinese_sentiment` task (int64 ids padded to max_len 160),
`pipe train` of text_fasttext (the example's model) and, unless quick, text_cnn for a few epochs on the
real split, then the same export + compress runs: every engine's variants as ratios to Paddle fp32
side by side, the auto pick, plus the int8 accuracy drop against the issue's goal (<= 0.5 point).

    python -c "from pipeline.bench import compress; [print(r) for r in compress.text_rows(quick=True)]"

A stage that fails becomes a **failed** row with its one-line error; the other runs go on.
Nothing here imports paddle: the stages do, in their own processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import PipeError

Row = tuple[str, str, str, str]

_REPO = Path(__file__).parents[2]
_MODELS = ("resnet18", "mobilenet_v3_small")
_SHAPE = (3, 64, 64)
_CLASSES = 10
_SPLIT = (128, 32, 96)  # train, val, test samples; train = 4 calibration batches of 32
_BATCH = 32
_VARIANTS = (("bf16", "Paddle bf16"), ("int8-paddle", "Paddle int8"), ("onnx-fp32", "onnxruntime fp32"),
             ("int8-onnx", "onnxruntime int8"), ("openvino-fp32", "OpenVINO fp32"), ("openvino-int8", "OpenVINO int8"))
_INT8 = ("int8-paddle", "int8-onnx", "openvino-int8")
_ENGINE_OF = {"int8-paddle": "paddle_inference", "int8-onnx": "onnxruntime", "openvino-int8": "openvino"}
_GOAL_INT8, _GOAL_BF16, _GOAL_DROP = 3.5, 1.8, 0.3
_TEXT_MODELS = (("text_fasttext", 3), ("text_cnn", 2))  # (model, training epochs); quick: the first only
_GOAL_TEXT_DROP = 0.5  # points, issue 7
_MARGIN = 1.05  # as in pipeline/fidelity.py (SPEED_MARGIN): within 5% of fp32 is "no faster", below that "slower"
_TIMEOUT = 1800  # s per stage
QUICK_TIMING = ("compress.latency_runs=50", "compress.throughput_runs=10")
REPEATS = 3  # compress runs per model (same export) when not quick: runs differed by up to ~25%


class StageFailed(PipeError):
    """A `pipe` subprocess exited non-zero; the message is its last stderr line."""


def rows(quick: bool) -> list[Row]:
    """Speed rows for both models, goal rows for resnet18, accuracy rows for digits. `quick`: one
    compress run per model with fewer timed runs per variant; else `REPEATS` runs, medians and ranges."""
    timing, repeats = (QUICK_TIMING, 1) if quick else ((), REPEATS)
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-compress-"))
    try:
        data = synthetic(tmp / "synthetic.npz")
        out: list[Row] = []
        for model in _MODELS:
            name = f"compress {model} {'x'.join(map(str, _SHAPE))}"
            out += _model_rows(model, name, ["--data", str(data), "--epochs", "1"], tmp / model, timing, repeats,
                               goals=model == "resnet18", samples="synthetic test samples")
        out += _digits_rows(tmp / "digits", timing)
        out += _avx2_paddle_rows([("digits", tmp / "digits"), ("resnet18", tmp / "resnet18")], quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out + text_rows(quick)


def text_rows(quick: bool) -> list[Row]:
    """Speed and accuracy rows of int8 on the Chinese sentiment task, per model in `_TEXT_MODELS`."""
    timing, repeats = (QUICK_TIMING, 1) if quick else ((), REPEATS)
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-compress-text-"))
    try:
        out: list[Row] = []
        for model, epochs in _TEXT_MODELS[:1] if quick else _TEXT_MODELS:
            name = f"compress chinese_sentiment {model} ({epochs} epoch{'s' if epochs > 1 else ''})"
            rows_ = _model_rows(model, name, ["--data", "chinese_sentiment", "--epochs", str(epochs)],
                                tmp / model, timing, repeats, goals=False, samples="test texts", gated=True)
            out += (rows_[:-1] + text_accuracy_rows(name, tmp / model) + [_train_speed_row(name, tmp / model)]
                    + rows_[-1:])
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _train_speed_row(name: str, run: Path) -> Row:
    """Training samples/s from the train manifest (beside ernie_tiny's in `pipeline/bench/ernie.py`)."""
    path = run / "train" / "manifest.json"
    ips = json.loads(path.read_text())["metrics"]["img_per_s"] if path.is_file() else None
    return (f"{name}: training samples/s (median over epochs, 1 process, batch {_BATCH})",
            f"{ips:.0f}" if ips else "not measured (train failed)", "reported", "")


def synthetic(path: Path) -> Path:
    """10 classes told apart by a per-class colour shift under heavy per-pixel noise; seeded, fixed split."""
    rng = np.random.default_rng(0)
    n = sum(_SPLIT)
    y = np.arange(n) % _CLASSES  # every split holds every class
    shift = rng.uniform(-60, 60, (_CLASSES, 3))
    x = 128 + shift[y][:, :, None, None] + rng.normal(0, 40, (n, *_SHAPE))
    split = np.repeat(np.arange(3, dtype=np.uint8), _SPLIT)
    np.savez(path, x=np.clip(x, 0, 255).astype(np.uint8), y=y.astype(np.int64), split=split)
    return path


def pipe(*args: str, cwd: Path) -> None:
    """`cwd`: a scratch dir, not the checkout: onnxruntime's shape inference, run inside `pipe compress`,
    drops `sym_shape_infer_temp.onnx` into the working directory when it fails."""
    cmd = [sys.executable, "-m", "pipeline.cli", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(_REPO), os.environ.get("PYTHONPATH")))))
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise StageFailed(f"`pipe {args[0]}` did not finish within {_TIMEOUT} s") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raise StageFailed(f"`pipe {args[0]}` exit {proc.returncode}: {lines[-1] if lines else 'no output'}")


def sets(items: tuple[str, ...]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


# ------------------------------------------------------------------ speed: resnet18, mobilenet_v3_small


def _model_rows(model: str, name: str, train_args: list[str], run: Path, timing: tuple[str, ...], repeats: int,
                goals: bool, samples: str, gated: bool = False) -> list[Row]:
    """Train (`train_args`: data and epochs), export, and `repeats` compress runs; the last row is the wall
    time. `goals`: add issue 4's speed-goal rows; `samples` names the test samples in the rows; `gated`:
    compress keeps its accuracy and agreement gates (see `_compress`)."""
    t0 = time.perf_counter()
    lost: dict[str, str] = {}  # variant -> why it is missing
    try:
        pipe("train", *train_args, "--model", model, "--batch-size", str(_BATCH), "--run", str(run), cwd=run.parent)
        pipe("export", str(run / "train"), cwd=run.parent)
        backend = "both"
        try:
            runs = [compress_run(run, backend, timing, 0, gated)]
        except StageFailed as e:
            # The Paddle variants are still worth measuring; if this works too, the ONNX route failed.
            backend, runs = "paddle", [compress_run(run, "paddle", timing, 0, gated)]
            lost = {"onnx-fp32": f"failed with --backend both ({e})",
                    "int8-onnx": "the ONNX route failed, see onnxruntime fp32"}
        runs += [compress_run(run, backend, timing, i, gated) for i in range(1, repeats)]
    except StageFailed as e:
        out = [(name, f"failed: {e}", "every engine's variants measured", "**failed**")]
        if goals:
            out += [(f"{name} goal: {what}", "not measured (a stage failed)", goal, "**missed**")
                    for what, goal in _goal_names()]
        return out
    wall = time.perf_counter() - t0
    out = speed_rows(name, runs, lost, samples) + [pick_row(name, runs)]
    if goals:
        out += _goal_rows(name, runs)
    return out + [(f"{name}: wall time of train + export + {len(runs)} x compress", wall_time(wall), "", "")]


def compress_run(run: Path, backend: str, timing: tuple[str, ...], i: int, gated: bool) -> dict[str, Any]:
    """The compress manifest's metrics. Not `gated` (the synthetic image models): --max-drop 100 and
    compress.min_agreement=0: a one-epoch model is near chance on the synthetic test split, where one
    sample is ~1 point and near-tied logits flip under int8; the accuracy and agreement gates must not
    stop the timing (digits measures accuracy with the default gates; the agreement measured is still
    recorded in every row). `gated` (the text models, trained on real data): compress's own gates, so
    the auto pick refuses what `pipe package` would refuse (a bench run with the gates off picked an
    OpenVINO int8 text_fasttext at agreement 0.839, 7.5 points down)."""
    out = run / f"compress-{backend}-{i}"
    budget = () if gated else ("--max-drop", "100", *sets(("compress.min_agreement=0",)))
    pipe("compress", str(run / "export"), "--out", str(out), "--int8", "--backend", backend,
         "--calib-batches", str(_SPLIT[0] // _BATCH), *budget, *sets(timing), cwd=run.parent)
    return json.loads((out / "manifest.json").read_text())["metrics"]


def wall_time(seconds: float) -> str:
    """The machine may be shared: the load average says how much else ran meanwhile (a stage alone
    keeps all cores busy, so about the core count means nothing else ran)."""
    return f"{seconds:.0f} s (1-min load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"


def _median(runs: list[dict[str, Any]], key: str, field: str) -> tuple[float, str]:
    """Median over the compress runs, and its range when there are several."""
    vals = [m["variants"][key][field] for m in runs]
    spread = f", range {min(vals):.2f}-{max(vals):.2f} over {len(vals)} runs" if len(vals) > 1 else ""
    return float(np.median(vals)), spread


def speed_rows(name: str, runs: list[dict[str, Any]], lost: dict[str, str], samples: str) -> list[Row]:
    v = runs[0]["variants"]  # which variants ran, and their accuracy: the same in every run
    thr = {k: _median(runs, k, "items_per_s_batch")[0] for k, x in v.items() if x["supported"]}
    lat = {k: _median(runs, k, "latency_ms_p50_bs1")[0] for k in thr}
    out: list[Row] = [(f"{name}: Paddle fp32 (oneDNN), the baseline of every ratio",
                       f"{thr['fp32']:.0f} items/s bs32, {lat['fp32']:.2f} ms p50 bs1", "", "")]
    for key, label in _VARIANTS:
        x = v.get(key)
        if x is None or not x["supported"]:
            why = x["reason"] if x else lost.get(key, "not built")
            out.append((f"{name}: {label}", f"not measured: {why}", "", "**unsupported**" if x else "**failed**"))
            continue
        tag = f" [{int8_tag(runs[0], key)}]" if x["precision"] == "int8" or x["engine"] == "openvino" else ""
        out.append((f"{name}: {label} items/s bs32 vs Paddle fp32{tag}",
                    *_ratio(*_median(runs, key, "speedup_batch"), f"{thr[key]:.0f} items/s")))
        out.append((f"{name}: {label} speed-up at bs1 (fp32 p50 / its p50){tag}",
                    *_ratio(*_median(runs, key, "speedup_bs1"), f"{lat[key]:.2f} ms")))
        if x.get("status", "ok") != "ok":
            out.append((f"{name}: {label} status{tag}", x["status"], "", "**not shippable**"))
    int8 = [(k, v[k]) for k in _INT8 if v.get(k, {}).get("supported") and v[k].get("top1_agreement") is not None]
    agreed = runs[0].get("agreement_samples", runs[0]["test_samples"])
    if int8 or runs[0].get("task", "classification") == "classification":  # a task without logits has none
        out.append((f"{name}: int8 top-1 agreement with fp32 ({agreed} samples of all splits) "
                    f"[{int8_tag(runs[0])}]", ", ".join(f"{k} {x['top1_agreement']:.3f}" for k, x in int8) or "-",
                    "", ""))
    out.append((f"{name}: fastest variant at bs1 / at bs32 (medians)",
                f"{min(lat, key=lat.__getitem__)} / {max(thr, key=thr.__getitem__)}", "", ""))
    return out


def pick_row(name: str, runs: list[dict[str, Any]], packaged: str = "") -> Row:
    """What `pipe package --engine auto` ships from each compress run: `pipeline.choose.pick` on its
    `metrics.variants`, with the budget recorded in it, as `pipe package` calls it. `packaged`: the variant
    a real package of the first run shipped (said beside the pick, checked against it)."""
    from pipeline import choose
    from pipeline.errors import GateError

    picks: list[str] = []
    why = ""
    for m in runs:
        v = m["variants"]
        try:
            p = choose.pick(v, ref_accuracy=(v.get("fp32") or {}).get("accuracy"), ref_name="fp32",
                            max_drop=float(m.get("max_drop", 1.0)))
        except GateError as e:
            picks.append("nothing shippable")
            why = why or str(e)
            continue
        picks.append(f"{p.variant} ({p.engine} {p.precision})")
        why = why or p.why
    counts = {k: picks.count(k) for k in dict.fromkeys(picks)}
    said = "; ".join(f"{k} in {n} of {len(picks)} runs" if len(picks) > 1 else k for k, n in counts.items())
    status = ""
    if packaged:
        agrees = picks[0].split(" ", 1)[0] == packaged
        said += f"; the package made from run 1 shipped {packaged}" + ("" if agrees else " (DIFFERENT)")
        status = "" if agrees else "**mismatch**"
    return (f"{name}: `pipe package --engine auto` picks (pipeline/choose.py, balanced) [{int8_tag(runs[0])}]",
            f"{said}. Why (run 1): {why}", "", status)



def int8_tag(metrics: dict[str, Any], variant: str = "") -> str:
    """The CPU's int8 capability as compress recorded it, for the label of an int8 row: of the engine that
    runs `variant` (a compress variant or an engine name), or of every engine when `variant` is ''."""
    cap = metrics.get("cpu") or {}
    if not cap:
        return "int8 capability not recorded"
    engine = "openvino" if variant.startswith("openvino") else _ENGINE_OF.get(variant, variant)
    exact = cap["int8_exact"].get(engine, not cap["int8_saturates"])
    forced = f", forced {cap['forced']}" if cap.get("forced") else ""
    return f"int8 {'exact' if exact else 'saturating'} on this CPU ({'VNNI' if cap['vnni'] else 'no VNNI'}{forced})"


def _ratio(s: float, spread: str, absolute: str) -> tuple[str, str, str]:
    """(result, goal, status) of a reported ratio: a loss against fp32 is said in both columns."""
    text = f"{s:.2f}x ({absolute}{spread})"
    if s <= 1 / _MARGIN:
        return f"{text}: SLOWER than Paddle fp32", "", "**slower**"
    if s < _MARGIN:
        return f"{text}: no faster than Paddle fp32 (within 5%)", "", ""
    return text, "", ""


def _goal_names() -> list[tuple[str, str]]:
    return [("best int8 engine, items/s bs32 vs Paddle fp32", f">= {_GOAL_INT8}x"),
            ("Paddle bf16, items/s bs32 vs Paddle fp32", f">= {_GOAL_BF16}x")]


def _goal_rows(name: str, runs: list[dict[str, Any]]) -> list[Row]:
    (int8_what, int8_goal), (bf16_what, bf16_goal) = _goal_names()
    v = runs[0]["variants"]
    int8 = {k: _median(runs, k, "speedup_batch") for k in _INT8 if v.get(k, {}).get("supported")}
    out: list[Row] = []
    if int8:
        best = max(int8, key=lambda k: int8[k][0])
        s, spread = int8[best]
        out.append((f"{name} goal: {int8_what}", f"{s:.2f}x ({best}{spread})", int8_goal, _status(s >= _GOAL_INT8)))
    else:
        out.append((f"{name} goal: {int8_what}", "no int8 variant measured", int8_goal, "**missed**"))
    if v.get("bf16", {}).get("supported"):
        s, spread = _median(runs, "bf16", "speedup_batch")
        out.append((f"{name} goal: {bf16_what}", f"{s:.2f}x (bf16{spread})", bf16_goal,
                    _status(s >= _GOAL_BF16)))
    else:
        out.append((f"{name} goal: {bf16_what}", f"not measured: {v.get('bf16', {}).get('reason', 'not built')}",
                    bf16_goal, "**missed**"))
    return out


def _status(ok: bool) -> str:
    return "met" if ok else "**missed**"


# ------------------------------------------------------------------ accuracy: text


def text_accuracy_rows(name: str, run: Path) -> list[Row]:
    """From the first compress run (accuracy does not depend on timing): fp32 vs each int8 variant on
    the deduplicated test split, and the best int8 drop against issue 7's goal."""
    path = run / "compress-both-0" / "manifest.json"
    if not path.is_file():
        path = run / "compress-paddle-0" / "manifest.json"
    if not path.is_file():
        return [(f"{name} goal: int8 accuracy drop", "not measured (a stage failed)", f"<= {_GOAL_TEXT_DROP} point",
                 "**missed**")]
    m = json.loads(path.read_text())["metrics"]
    n, drop = m["test_samples"], m["int8_drop_points"]
    int8 = ", ".join(f"{k} {x['accuracy']:.2%}" if x["supported"] else f"{k} unsupported"
                     for k, x in m["variants"].items() if x["precision"] == "int8")
    if drop is None:
        return [(f"{name} goal: int8 accuracy drop", f"no int8 variant: {int8}", f"<= {_GOAL_TEXT_DROP} point",
                 "**missed**")]
    return [
        (f"{name}: test accuracy fp32 vs int8", f"fp32 {m['fp32_accuracy']:.2%}; {int8}; {n} test texts", "", ""),
        (f"{name} goal: int8 accuracy drop, best int8 ({m['best_int8']}) vs fp32 (1 text = {100 / n:.2f} points)",
         f"{drop:.2f} points", f"<= {_GOAL_TEXT_DROP} point", _status(drop <= _GOAL_TEXT_DROP)),
    ]


# ------------------------------------------------------------------ Paddle int8 on oneDNN's AVX2 kernels

_AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2"}  # oneDNN runs as on a CPU without VNNI (pipeline/cpu.py)


def _avx2_paddle_rows(runs: list[tuple[str, Path]], quick: bool) -> list[Row]:
    """Issue 12: Paddle int8 with and without fc/matmul in oneDNN's int8 op set, on oneDNN's AVX2 kernels
    (ONEDNN_MAX_CPU_ISA=AVX2: saturating u8 x s8), against Paddle fp32 on the same kernels, in one child
    process per model: agreement over all splits and the speed ratios, timed interleaved."""
    out: list[Row] = []
    for name, run in runs:
        comp = next((d for d in sorted(run.glob("compress*")) if (d / "int8-paddle/model.pdmodel").is_file()), None)
        label = f"Paddle int8 on oneDNN's AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2), {name}"
        if comp is None:
            out.append((label, "not measured: no int8-paddle variant was built", "", "**failed**"))
            continue
        env = {k: v for k, v in os.environ.items() if k != "PIPE_INT8_CAPABILITY"}
        proc = subprocess.run([sys.executable, "-m", "pipeline.bench.compress", "--avx2-paddle", str(comp),
                               "quick" if quick else "full"], capture_output=True, text=True, cwd=_REPO,
                              env={**env, **_AVX2_ENV, "PYTHONPATH": str(_REPO)}, timeout=_TIMEOUT)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            out.append((label, f"failed: {lines[-1] if lines else proc.returncode}", "", "**failed**"))
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        for key, what in (("all", "every quantized op in int8 (what a VNNI CPU runs)"),
                          ("no_matmul", "fc/matmul in fp32, convs in int8 (what pipe runs without VNNI)")):
            v = r[key]
            out.append((f"{label}: {what}", f"agreement {v['agreement']:.4f} over {r['samples']} samples, "
                        f"{v['s1']:.2f}x fp32 at bs1, {v['s32']:.2f}x at bs32 (fp32 on the same kernels)", "", ""))
    return out


def _avx2_paddle_main(comp_dir: str, mode: str) -> int:
    """Child (ONEDNN_MAX_CPU_ISA=AVX2): fp32 and both int8 op sets of one compress dir; one JSON line."""
    from pipeline import artifacts, config as config_mod, cpu, data as data_mod, engines as engines_mod, iospec, runtime
    from pipeline.engines import paddle as paddle_engine
    from stages import compress

    runtime.import_paddle(runtime.threads_per_process(1))
    threads = runtime.threads_per_process(1)
    comp = artifacts.verify(Path(comp_dir), ("compress",))
    exp = artifacts.verify((comp.path / comp.manifest["input"]["path"]).resolve(), ("export",))
    ds = data_mod.load(config_mod.from_dict(exp.manifest["config"]).data)
    prep = compress._preparer(ds, compress._read_export(exp))
    xs = list(compress.fidelity_batches(ds, prep))
    int8 = [comp.path / "int8-paddle/model.pdmodel", comp.path / "int8-paddle/model.pdiparams"]
    pir = [exp.file("model.json"), exp.file("model.pdiparams")]
    desc = iospec.IO.from_interface(exp.manifest["interface"])
    engines = {"fp32": (paddle_engine.load(pir, threads=threads), pir[0]),
               "all": (paddle_engine.load(int8, threads=threads, precision="int8", int8_ops=set()), int8[0]),
               "no_matmul": (paddle_engine.load(int8, threads=threads, precision="int8",
                                                int8_ops=set(cpu.ONEDNN_INT8_OPS_NO_VNNI)), int8[0])}
    runs = {k: engines_mod.bind(e, desc, str(where)) for k, (e, where) in engines.items()}  # feeds -> outputs, by name
    out = desc.logits().public
    logits = {k: np.concatenate([run(x)[out] for x in xs]) for k, run in runs.items()}
    head = xs[0]  # every input by name, as compress times them
    rows = np.arange(32) % iospec.num_rows(head)
    x1 = {k: np.ascontiguousarray(a[:1]) for k, a in head.items()}
    x32 = {k: np.ascontiguousarray(a[rows]) for k, a in head.items()}
    n1, n32 = (50, 10) if mode == "quick" else (200, 30)
    group = [runs]
    lat, thr = compress.interleaved(group, x1, n1), compress.interleaved(group, x32, n32)
    ref = logits["fp32"].argmax(1)
    doc = {"samples": int(len(ref)), **{k: {"agreement": float((logits[k].argmax(1) == ref).mean()),
                                            "s1": float(np.median(lat["fp32"]) / np.median(lat[k])),
                                            "s32": float(np.median(thr["fp32"]) / np.median(thr[k]))}
                                        for k in ("all", "no_matmul")}}
    print(json.dumps(doc))
    return 0


# ------------------------------------------------------------------ accuracy: digits


def _digits_rows(run: Path, timing: tuple[str, ...]) -> list[Row]:
    name = "compress digits (`pipe all --config examples/digits.yaml`)"
    t0 = time.perf_counter()
    try:
        # compress.max_drop=100: the numbers are recorded even when the drop is over the stage's 1.0 gate.
        pipe("all", "--config", str(_REPO / "examples/digits.yaml"), "--run", str(run),
              *sets(("compress.max_drop=100", *timing)), cwd=run.parent)
    except StageFailed as e:
        return [(f"{name}: int8 accuracy drop", f"failed: {e}", f"<= {_GOAL_DROP} point", "**failed**")]
    wall = time.perf_counter() - t0
    m = json.loads((run / "compress" / "manifest.json").read_text())["metrics"]
    n, drop = m["test_samples"], m["int8_drop_points"]
    int8 = ", ".join(f"{k} {x['accuracy']:.2%}" for k, x in m["variants"].items()
                     if x["precision"] == "int8" and x["supported"])
    packaged = json.loads((run / "package" / "manifest.json").read_text())["metrics"]["variant"]
    return speed_rows(name, [m], {}, "test samples") + [
        pick_row(name, [m], packaged),
        (f"{name}: test accuracy fp32 vs int8", f"fp32 {m['fp32_accuracy']:.2%}; {int8}; {n} test samples", "", ""),
        (f"{name} goal: accuracy drop, best int8 ({m['best_int8']}) vs fp32 (1 sample = {100 / n:.2f} points)",
         f"{drop:.2f} points", f"<= {_GOAL_DROP} point", _status(drop <= _GOAL_DROP)),
        (f"{name}: wall time of train + export + compress + package", wall_time(wall), "", ""),
    ]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--avx2-paddle":
        sys.exit(_avx2_paddle_main(sys.argv[2], sys.argv[3]))
    print("usage: python -m pipeline.bench.compress --avx2-paddle COMPRESS_DIR quick|full (internal; use make bench)",
          file=sys.stderr)
    sys.exit(2)
