"""Which measured variant, on which engine, a package ships: one rule for `pipe package` and `pipe all`.

    pick(variants, ref_accuracy=0.9963, ref_name="fp32", max_drop=1.0)            # --engine auto
    pick(variants, ..., engine="openvino")                                           # the best OpenVINO one

`variants` is compress's `metrics.variants` (measured on this machine: accuracy, agreement, p50 at batch 1,
items/s at batch 32, each against Paddle fp32 as `speedup_bs1` / `speedup_batch`, and `shippable`; a task
that times another throughput batch, e.g. ocr_det's 4 pages, keeps these names and says the batch in each
variant's `throughput_batch`, and the reasons below say it too). A
candidate is shippable and runnable here (its engine's library imports). Shippable is compress's one
verdict on the variant (`pipeline/fidelity.py` `verdict`, stored as `status`; read through
`fidelity.verdicts` for manifests made before it covered compress.max_drop): agreement, SQNR, this CPU
and the drop against fp32 within compress.max_drop, judged there and not again here. Only a reference
other than the variants' own fp32 (`ref_name`: a distilled student's teacher) adds a budget here: within
`max_drop` points of it.

`optimize` says which speed counts, as the server will run it:
- `balanced` (default): the geometric mean of the speedups at batch 1 and batch 32. `pipe serve` runs
  batch 1 when one client waits and batches of up to max_batch_size under load; neither may be slower
  than fp32 (by more than 5%).
- `latency`: p50 at batch 1 (the batch-32 speed may not be slower than fp32).
- `throughput`: items/s at batch 32 (the batch-1 p50 may not be slower than fp32).

With neither an engine nor a precision asked for, a candidate must beat Paddle fp32 by 5% on that score,
else Paddle fp32 ships (the simplest package). Asked for an engine or a precision, the best candidate
among those ships, faster or not, and the reason says how it compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline import engines
from pipeline.errors import GateError, InputError

OPTIMIZE = ("balanced", "latency", "throughput")
RULES = ("fastest", "smallest", "fp32")
FASTER = 1.05  # "faster" means at least 5% faster on the score
_BASELINE = "fp32"  # Paddle Inference fp32 on the export's PIR program


@dataclass(frozen=True)
class Pick:
    variant: str
    engine: str
    precision: str
    accuracy: float | None
    why: str


def score(v: dict[str, Any], optimize: str) -> float:
    s1, s32 = float(v.get("speedup_bs1") or 0), float(v.get("speedup_batch") or 0)
    return {"balanced": math.sqrt(s1 * s32), "latency": s1, "throughput": s32}[optimize]


def _not_slower(v: dict[str, Any], optimize: str) -> bool:
    s1, s32 = float(v.get("speedup_bs1") or 0), float(v.get("speedup_batch") or 0)
    need = {"balanced": (s1, s32), "latency": (s32,), "throughput": (s1,)}[optimize]
    return all(s >= 1 / FASTER for s in need)


def criterion(optimize: str, batch: int = 32) -> str:
    return {"balanced": f"the geometric mean of the speedups over Paddle fp32 at batch 1 (p50) and batch {batch} "
                        "(items/s)",
            "latency": "p50 latency at batch 1", "throughput": f"items/s at batch {batch}"}[optimize]


def throughput_batch(variants: dict[str, Any]) -> int:
    """The batch the variants' `items_per_s_batch` / `speedup_batch` were measured at: their `throughput_batch`
    (compress of a task that owns its data), else 32 (every other compress, and manifests before the field)."""
    return next((int(v["throughput_batch"]) for v in variants.values()
                 if isinstance(v, dict) and v.get("throughput_batch")), 32)


def pick(variants: dict[str, Any], *, ref_accuracy: float | None, ref_name: str, max_drop: float,
         optimize: str = "balanced", rule: str = "fastest", engine: str = "", precision: str = "",
         where: str = "compress", maximize: bool = True) -> Pick:
    """The variant to ship (see the module docstring); GateError when nothing is within budget. `accuracy`
    is the task's monitored metric; `maximize` False (e.g. an error) makes a rise of it the drop."""
    if optimize not in OPTIMIZE:
        raise InputError(f"--optimize: expected one of {', '.join(OPTIMIZE)}, got {optimize!r}")
    within: dict[str, tuple[dict[str, Any], float]] = {}
    refused: list[str] = []
    matched, could_not = 0, []
    for name, v in variants.items():
        if not isinstance(v, dict):
            continue
        if (engine and v.get("engine") != engine) or (precision and v.get("precision") != precision):
            continue
        if v.get("supported") is False or not isinstance(v.get("accuracy"), float):
            could_not.append(f"{name} could not run where it was made ({v.get('reason') or 'unsupported'})")
            continue
        matched += 1
        if v.get("shippable") is False:
            refused.append(f"{name} ({v.get('status')})")
            continue
        lib = engines.missing(v.get("engine", "")) if v.get("engine") in engines.ENGINES else "unknown engine"
        if lib:
            refused.append(f"{name} ({lib})")
            continue
        drop = (ref_accuracy - v["accuracy"]) * 100 * (1 if maximize else -1) if ref_accuracy is not None else 0.0
        if ref_name != _BASELINE and drop > max_drop + 1e-9:  # a distilled student, against its teacher
            refused.append(f"{name} (drop {drop:.2f} points > {max_drop:g})")
            continue
        within[name] = (v, drop)
    asked = " ".join(x for x in (f"engine {engine}" if engine else "", f"precision {precision}" if precision else "")
                     if x)
    if not matched:  # nothing of that kind was measured: the flags ask for what is not there
        have = ", ".join(f"{n} ({v.get('engine')} {v.get('precision')})" for n, v in variants.items()
                         if isinstance(v, dict) and v.get("supported") is not False) or "none"
        why = "; ".join(could_not) or f"it has {have}"
        raise InputError(f"{where}: no variant{' with ' + asked if asked else ''} was measured ({why})")
    if not within:
        raise GateError(f"{where}: no variant{' with ' + asked if asked else ''} within {max_drop:g} points of "
                        f"{ref_name} is shippable here ({', '.join(refused) or 'none measured'})")
    if rule == "fp32" and _BASELINE in within:
        name, why = _BASELINE, "release.pick=fp32"
    elif rule == "smallest":
        name = min(within, key=lambda n: (within[n][0].get("size_bytes") or float("inf"), n))
        why = f"smallest within {max_drop:.2f} points of {ref_name}: {(within[name][0].get('size_bytes') or 0) / 1e6:.2f} MB"
    else:
        name, why = _fastest(within, optimize, bool(asked), max_drop, ref_name, throughput_batch(variants))
    v, drop = within[name]
    metric = next((x.get("metric") for x in variants.values() if isinstance(x, dict) and x.get("metric")), "acc")
    shown = f"accuracy {v['accuracy']:.2%}" if metric == "acc" else f"{metric} {v['accuracy']:.4f}"
    why += f"; {shown} (drop {drop:.2f} points)"
    if refused:
        why += "; not considered: " + ", ".join(refused)
    return Pick(name, str(v["engine"]), str(v["precision"]), v["accuracy"], why)


def _fastest(within: dict[str, tuple[dict[str, Any], float]], optimize: str, asked: bool, max_drop: float,
             ref_name: str, batch: int) -> tuple[str, str]:
    ranked = sorted(within, key=lambda n: -score(within[n][0], optimize))
    by = f"by {optimize} ({criterion(optimize, batch)})"

    def said(n: str) -> str:
        v = within[n][0]
        rest = ", ".join(f"{m} {score(within[m][0], optimize):.2f}" for m in ranked if m != n)
        return (f"{v.get('speedup_bs1', 0):.2f}x at batch 1, {v.get('speedup_batch', 0):.2f}x at batch {batch} "
                f"(score {score(v, optimize):.2f}" + (f"; others {rest})" if rest else ")"))

    if asked:
        return ranked[0], f"fastest of those asked for {by}: {said(ranked[0])}"
    faster = [n for n in ranked if n != _BASELINE and score(within[n][0], optimize) >= FASTER
              and _not_slower(within[n][0], optimize)]
    if faster:
        return faster[0], f"fastest here within {max_drop:.2f} points of {ref_name} {by}: {said(faster[0])}"
    if _BASELINE in within:
        return _BASELINE, (f"no variant within {max_drop:.2f} points was >= {FASTER:.2f}x Paddle fp32 {by} without "
                           f"being slower at the other batch size: {said(_BASELINE)}")
    return ranked[0], f"{ref_name}'s fp32 is not within budget; the fastest that is {by}: {said(ranked[0])}"
