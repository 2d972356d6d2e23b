"""A compressed variant against fp32, for `pipe compress` (stages/compress.py): how close its outputs are
(`measure`: top-1, SQNR and max|diff| per output), whether it is within budget (`status`), how its speed
compares (`SPEED_MARGIN`, `speed_note`, `int8_vs_own_fp32`), and the table of every variant that compress
prints.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from pipeline import cpu, engines as engines_mod, iospec
from pipeline.config import CompressConfig
from pipeline.engines import paddle as paddle_engine
from pipeline.errors import Int8GateError, PipeError

SPEED_MARGIN = 1.05  # "faster" means at least 5% faster at batch 1 (p50) and at batch 32


def measure(got: Iterator[dict[str, np.ndarray]], ref: list[dict[str, np.ndarray]], logits: str | None,
            where: str) -> dict[str, Any]:
    """A variant's outputs batch by batch against fp32's (`ref`): the predicted classes (`top`, classification:
    the top-1 of the `logits` output; None for a task without logits), the samples compared, each output's
    fidelity (float: `sqnr_db` = 10 log10(sum ref^2 / sum (ref - got)^2), None when identical, and
    `max_abs_diff`; other dtypes: `equal`, the fraction of equal elements) and fp32's max|value| (`absmax`)."""
    acc: dict[str, list[float]] = {k: [0.0, 0.0, 0.0, 0.0] for k in ref[0]}  # sum ref^2, sum err^2 (or equal), max|err|, max|ref|
    sizes = dict.fromkeys(ref[0], 0)
    top, samples = [], 0
    for g, r in zip(got, ref):
        samples += iospec.num_rows(r)
        for k, s in acc.items():
            a, b = np.asarray(r[k]), np.asarray(g[k])
            if a.shape != b.shape:
                raise PipeError(f"{where}: output {k!r} has shape {list(b.shape)}, fp32's {list(a.shape)}")
            sizes[k] += a.size
            if a.dtype.kind != "f":
                s[1] += float(np.count_nonzero(a == b))
                continue
            a, d = a.astype(np.float64), b.astype(np.float64) - a
            s[0] += float(np.sum(a * a))
            s[1] += float(np.sum(d * d))
            s[2] = max(s[2], float(np.abs(d).max(initial=0.0)))
            s[3] = max(s[3], float(np.abs(a).max(initial=0.0)))
        if logits:
            top.append(np.asarray(g[logits]).argmax(axis=1))
    outputs: dict[str, dict[str, Any]] = {}
    for k, (sig, err, worst, _) in acc.items():
        if np.asarray(ref[0][k]).dtype.kind != "f":
            outputs[k] = {"equal": err / max(sizes[k], 1)}
        else:  # a zero signal with any error: the lowest float, below every budget
            outputs[k] = {"sqnr_db": None if err == 0 else float(10 * np.log10(max(sig, 1e-300) / err)),
                          "max_abs_diff": worst}
    return {"top": np.concatenate(top) if top else None, "samples": samples, "outputs": outputs,
            "absmax": {k: s[3] for k, s in acc.items()}}


def budgeted(desc: iospec.IO, logits: str | None) -> list[str]:
    """The outputs held to compress.min_sqnr_db: every float output but the logits (held to agreement), if
    the task reads logits (`logits`: their public name, or None)."""
    return [t.public for t in desc.outputs if t.public != logits and np.dtype(t.dtype).kind == "f"]


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


OVER = "over budget"  # the one verdict that only the monitored metric's drop gives (compress.max_drop)


def verdict(name: str, v: dict[str, Any], base: dict[str, Any], ccfg: CompressConfig, logits: str | None,
            maximize: bool = True, int8_exact: bool | None = None, unit: str = "lines") -> str:
    """A measured variant's one verdict against fp32 (`base`), made here once: compress stores it as the
    variant's `status` (and `shippable` = it is 'ok'), its table prints it, and package, choose and the report
    read it. 'ok', or why not:
    - 'below budget: ...': agreement with fp32 under compress.min_agreement (top-1 `top1_agreement`; a task
      that owns its data: `char_agreement` and the `reference_agreement` package checks), or a float output
      other than the logits under compress.min_sqnr_db;
    - 'unreliable on this CPU: ...': Paddle int8 where oneDNN has no exact int8 matmul (`int8_exact` False;
      None: this CPU) that is not both within compress.max_drop and faster than fp32;
    - 'over budget: ...': the task's monitored metric more than compress.max_drop points worse than fp32's."""
    if name == "fp32":
        return "ok"
    agree, budget = v.get("top1_agreement"), ccfg.min_agreement  # None: a task without logits
    if agree is not None and agree < budget:
        return f"below budget: top-1 agreement {agree:.4f} < compress.min_agreement {budget:g}"
    char, ref = v.get("char_agreement"), v.get("reference_agreement")
    if char is not None and char < budget:
        return f"below budget: character agreement {char:.4f} < compress.min_agreement {budget:g}"
    if ref is not None and ref < budget:
        return (f"below budget: agreement {ref:.4f} on the {v.get('reference_samples')} reference "
                f"{unit} pipe package checks < compress.min_agreement {budget:g}")
    for out, f in (v.get("fidelity") or {}).items():
        if out != logits and f.get("sqnr_db") is not None and f["sqnr_db"] < ccfg.min_sqnr_db:
            return (f"below budget: output {out!r} SQNR {f['sqnr_db']:.1f} dB < compress.min_sqnr_db "
                    f"{ccfg.min_sqnr_db:g}")
    drop = (base["accuracy"] - v["accuracy"]) * 100 * (1 if maximize else -1)
    over = drop > ccfg.max_drop + 1e-9
    paddle_int8 = v.get("engine") == paddle_engine.NAME and v.get("precision") == "int8"
    exact = cpu.int8_exact(paddle_engine.NAME) if int8_exact is None and paddle_int8 else int8_exact
    if paddle_int8 and exact is False and (over or not v["faster_than_fp32"]):
        return (f"unreliable on this CPU: oneDNN int8 matmul saturates without VNNI, so fc/matmul ran in fp32; "
                f"then {'agreement ' + _num(agree, '.4f') + ', ' if agree is not None else ''}drop {drop:.2f} points, "
                f"{v['speedup_bs1']:.2f}x fp32 at batch 1 and {v['speedup_batch']:.2f}x at batch 32: not both within "
                "budget and faster")
    if over:
        return f"{OVER}: {v.get('metric') or 'acc'} drop {drop:.2f} points > compress.max_drop {ccfg.max_drop:g}"
    return "ok"


def judge(variants: dict[str, dict[str, Any]], ccfg: CompressConfig, logits: str | None, maximize: bool,
          unit: str = "lines") -> None:
    """Store each measured variant's verdict (`status`, `shippable`) and the drop it was judged on
    (`drop_points`, vs fp32; its presence marks a manifest whose verdicts include compress.max_drop)."""
    base = variants["fp32"]
    for name, v in variants.items():
        if not v["supported"]:
            v.update(status=f"unsupported: {v['reason']}", shippable=False, drop_points=None)
            continue
        v["drop_points"] = (base["accuracy"] - v["accuracy"]) * 100 * (1 if maximize else -1)
        v["status"] = verdict(name, v, base, ccfg, logits, maximize, unit=unit)
        v["shippable"] = v["status"] == "ok"


def verdicts(metrics: dict[str, Any], compress_config: dict[str, Any] | None, maximize: bool
             ) -> dict[str, dict[str, Any]]:
    """A compress manifest's `metrics.variants` with their verdicts, as package, choose and the report read
    them: as stored; a manifest from before `drop_points` (its `status` left out compress.max_drop) gets
    `verdict` once here, on what it recorded (a stored refusal stands: the CPU checks ran where it was made)."""
    variants = metrics.get("variants")
    if not isinstance(variants, dict) or not isinstance(variants.get("fp32"), dict):
        return variants if isinstance(variants, dict) else {}
    live = [v for v in variants.values() if isinstance(v, dict) and v.get("supported") is not False]
    if all("drop_points" in v for v in live):
        return variants
    cc = compress_config if isinstance(compress_config, dict) else {}
    budget = {k: next((float(x) for x in (metrics.get(k), cc.get(k)) if isinstance(x, (int, float))),
                      getattr(CompressConfig, k)) for k in ("max_drop", "min_agreement", "min_sqnr_db")}
    ccfg, base, out = CompressConfig(**budget), variants["fp32"], dict(variants)
    numbers = ("accuracy", "top1_agreement", "char_agreement", "reference_agreement")
    for name, v in variants.items():
        if not (isinstance(v, dict) and v.get("supported") is not False and isinstance(v.get("accuracy"), float)
                and isinstance(base.get("accuracy"), float) and v.get("status", "ok") == "ok"
                and all(isinstance(v.get(k), (float, int, type(None))) for k in numbers)
                and isinstance(v.get("fidelity") or {}, dict)):
            continue  # a refusal stored (or junk a reader shows as it is)
        status = verdict(name, v, base, ccfg, metrics.get("logits_output"), maximize, int8_exact=True)
        out[name] = {**v, "status": status, "shippable": status == "ok",
                     "drop_points": (base["accuracy"] - v["accuracy"]) * 100 * (1 if maximize else -1)}
    return out


def timing_fields(lat: list[float], thr: list[float], batch: int) -> dict[str, float]:
    """A variant's p50/p99 ms at batch 1 and items/s at `batch` from its interleaved timings (seconds a call)."""
    return {"latency_ms_p50_bs1": float(np.percentile(lat, 50) * 1e3),
            "latency_ms_p99_bs1": float(np.percentile(lat, 99) * 1e3),
            "items_per_s_batch": float(batch / np.median(thr))}


def speed_fields(name: str, v: dict[str, Any], base: dict[str, Any], batch: int = 32) -> dict[str, Any]:
    """A measured variant's speed against fp32 (`base`): the two speedups, whether it is faster, the note
    (`batch`: the batch its items/s was timed at, 32 but for a task's own `timing_batch`)."""
    s1 = base["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
    s32 = v["items_per_s_batch"] / base["items_per_s_batch"]
    return {"speedup_bs1": s1, "speedup_batch": s32,
            "faster_than_fp32": None if name == "fp32" else bool(min(s1, s32) >= SPEED_MARGIN),
            "note": "" if name == "fp32" else speed_note(s1, s32, batch)}


def speed_note(s1: float, s32: float, batch: int = 32) -> str:
    def one(s: float, where: str) -> str:
        if s >= SPEED_MARGIN:
            return f"{s:.2f}x faster than fp32 at {where}"
        if s <= 1 / SPEED_MARGIN:
            return f"SLOWER than fp32 at {where} ({s:.2f}x)"
        return f"no faster than fp32 at {where} ({s:.2f}x, within 5%)"

    return f"{one(s1, 'batch 1')}; {one(s32, f'batch {batch}')}"


def best_int8(variants: dict[str, dict[str, Any]], maximize: bool) -> str | None:
    """The int8 variant the gate judges: the best by the monitored metric (then the quickest at batch 1) of those
    whose verdict is ok or only over the drop budget; None when every one is refused for agreement or this CPU."""
    ok = [n for n in int8_names(variants) if variants[n]["shippable"] or variants[n]["status"].startswith(OVER)]
    sign = 1 if maximize else -1
    return max(ok, key=lambda n: (sign * variants[n]["accuracy"], -variants[n]["latency_ms_p50_bs1"])) if ok else None


def int8_names(variants: dict[str, dict[str, Any]]) -> list[str]:
    """The int8 variants that were built and measured (an unsupported route has no numbers)."""
    return [n for n, v in variants.items() if v["precision"] == "int8" and v["supported"]]


def int8_vs_own_fp32(variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each int8 variant against fp32 on its own engine (int8-onnx vs onnx-fp32): whether int8 itself
    pays, apart from the engine's speed (onnxruntime fp32 alone may beat Paddle fp32)."""
    out = {}
    for name, own in (("int8-paddle", "fp32"), ("int8-onnx", "onnx-fp32"), ("openvino-int8", "openvino-fp32")):
        v, o = variants.get(name), variants.get(own)
        if not (v and o and v["supported"] and o["supported"]):
            continue
        s1 = o["latency_ms_p50_bs1"] / v["latency_ms_p50_bs1"]
        s32 = v["items_per_s_batch"] / o["items_per_s_batch"]
        out[name] = {"own_fp32": own, "speedup_bs1": s1, "speedup_batch": s32,
                     "faster": bool(min(s1, s32) >= SPEED_MARGIN)}
    return out


def print_table(variants: dict[str, dict[str, Any]], n: int, io: dict[str, Any], cap: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    if not console.is_terminal:  # logs and CI: no 80-column squeeze
        console = Console(soft_wrap=True, width=130)
    base = variants["fp32"]
    caption = "; ".join(f"{', '.join(k for k, v in variants.items() if v['engine'] == e)}: {label}"
                        for e, label in engines_mod.LABELS.items() if any(v["engine"] == e for v in variants.values()))
    what = (f"{n} test samples, texts as int64 ids padded to {io['pre']['max_len']}" if "vocab" in io
            else f"{n} test samples")
    agreed = variants["fp32"].get("agreement_samples")
    logits = io["info"].logits or None
    main, sqnr, metric = io["desc"].main().public, budgeted(io["desc"], logits), io["task"].monitor
    t = Table(title=f"fp32 vs each variant: {what} ({'agree, ' if logits else ''}max|diff| of {main}"
                    f"{', SQNR dB of ' + ', '.join(sqnr) if sqnr else ''}: {agreed} samples of all splits), timing "
                    "interleaved", caption=caption)
    for col in ("variant", metric, "drop pts", "agree", "max|diff|", *sqnr, "KB", "p50 ms bs1",
                "p99 ms bs1", "items/s bs32", "vs fp32 bs1 / bs32", "speed"):
        t.add_column(col, justify="left" if col in ("variant", "speed") else "right", no_wrap=col == "variant")
    for name, v in variants.items():
        size = "-" if v["size_bytes"] is None else f"{v['size_bytes'] / 1024:.0f}"
        if not v["supported"]:
            t.add_row(name, "-", "-", "-", "-", *("-" for _ in sqnr), size, "-", "-", "-", "-",
                      "[red]unsupported[/red] (below)")
            continue
        db = [v["fidelity"][o]["sqnr_db"] for o in sqnr]
        drop = (base["accuracy"] - v["accuracy"]) * 100 * (1 if io["task"].maximize else -1)
        t.add_row(name, f"{v['accuracy']:.2%}" if metric == "acc" else f"{v['accuracy']:.4f}", f"{drop:.2f}",
                  _num(v["top1_agreement"], ".3f"), f"{v['max_abs_diff']:.3g}",
                  *("exact" if d is None else f"{d:.1f}" for d in db), size, f"{v['latency_ms_p50_bs1']:.3f}",
                  f"{v['latency_ms_p99_bs1']:.3f}", f"{v['items_per_s_batch']:.0f}",
                  f"{v['speedup_bs1']:.2f}x / {v['speedup_batch']:.2f}x",
                  _verdict(name, v) if v["status"] == "ok" else f"[red]{v['status'].split(':')[0]}[/red] (below)")
    console.print(f"CPU: {cpu.summary(cap)}", markup=False)
    console.print(t)
    for name, v in variants.items():
        if v["supported"] and v["status"] != "ok":
            console.print(f"{name}: {v['status']}", markup=False)
        note = (v.get("engine_info") or {}).get("note")
        if note:
            console.print(f"{name}: {note}", markup=False)
    for name, v in variants.items():
        if name != "fp32" and v["note"]:
            console.print(f"{name}: {'unsupported: ' if not v['supported'] else ''}{v['note']}", markup=False)
    int8 = int8_names(variants)
    if int8 and not any(variants[k]["faster_than_fp32"] for k in int8):
        console.print(f"[bold yellow]int8 is not faster than fp32 here[/bold yellow] (faster = at least "
                      f"{SPEED_MARGIN:.2f}x at both batch 1 and batch 32): {', '.join(int8)}")
    own = int8_vs_own_fp32(variants)
    if own and not any(o["faster"] for o in own.values()):
        console.print("[bold yellow]int8 does not pay on this model[/bold yellow]: no int8 variant is faster than fp32 "
                      "on its own engine (" + "; ".join(f"{k} vs {o['own_fp32']}: {o['speedup_bs1']:.2f}x at batch 1, "
                                                        f"{o['speedup_batch']:.2f}x at batch 32" for k, o in own.items())
                      + ")")


def _verdict(name: str, v: dict[str, Any]) -> str:
    if name == "fp32":
        return "baseline"
    s1, s32 = v["speedup_bs1"] >= SPEED_MARGIN, v["speedup_batch"] >= SPEED_MARGIN
    if s1 and s32:
        return "faster"
    if s1 or s32:
        return f"faster at bs{1 if s1 else 32} only"
    slower = max(v["speedup_bs1"], v["speedup_batch"]) <= 1 / SPEED_MARGIN
    return "[red]SLOWER[/red]" if slower else "[yellow]not faster[/yellow]"


def gate(metrics: dict[str, Any], variants: dict[str, dict[str, Any]], ccfg: CompressConfig, n: int) -> None:
    """An int8 variant within budget, at most max_drop points below fp32, or exit 4 (nothing written)."""
    drop = metrics["int8_drop_points"]
    best = metrics["best_int8"]
    if not int8_names(variants):
        raise PipeError("int8: no int8 variant could be built (" + "; ".join(
            f"{k}: {why}" for k, why in metrics["int8_unsupported"].items()) + ")")
    if drop is None:
        raise Int8GateError("int8 gate: no int8 variant within budget on this CPU (" + "; ".join(
            f"{k}: {why}" for k, why in metrics["int8_not_shippable"].items()) + f"); CPU: {cpu.summary()}; "
            "nothing written")
    if not variants[best]["shippable"]:  # its verdict: over budget (compress.max_drop)
        others = ", ".join(f"{k} {variants[k]['accuracy']:.2%}" for k in int8_names(variants) if k != best)
        what = "" if metrics["metric"] == "acc" else f"{metrics['metric']} "  # classification: the accuracy
        raise Int8GateError(f"int8 gate: best int8 variant {best} {what}{variants[best]['accuracy']:.2%} vs fp32 "
                        f"{variants['fp32']['accuracy']:.2%} on {n} test samples: drop {drop:.2f} points > "
                        f"max_drop {ccfg.max_drop:g}" + (f" ({others})" if others else "") + "; nothing written")
