"""A package's reference set: real preprocessed inputs and their fp32 outputs, checked where the package runs.

    pipe inspect runs/digits/package --verify      # runs the check on this machine's engine and CPU

The same int8 file computes different numbers on CPUs with and without VNNI (`pipeline/cpu.py`), so a
package built on one machine says nothing about the numbers on another. `pipe package` draws `SAMPLES`
inputs (seeded, from all splits of the data the model was trained on, preprocessed as a client's request
would be: images normalised, texts encoded with the export's vocabulary), runs them through the fp32
program and stores both in `reference.safetensors` (tensors only: no pickle), with the agreement budget
in `serving.yaml`. `pipe serve` runs the inputs on its own predictors before `/readyz` turns 200 and
refuses to serve (exit 4) when top-1 agreement with the fp32 outputs is below the budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.errors import InputError
from pipeline.serving.spec import REFERENCE_FILE as FILE  # the package contract names its files

SAMPLES = 256
_SEED = 0


def draw(export_config: dict[str, Any], interface: dict[str, Any], vocab: dict[str, int] | None,
         n: int = SAMPLES) -> np.ndarray:
    """`n` inputs drawn (seeded) from train, val and test of the export's data, as the model takes them."""
    from pipeline import config as config_mod, data as data_mod

    cfg = config_mod.from_dict(export_config)
    try:
        ds = data_mod.load(cfg.data)
    except InputError as e:
        raise InputError(f"reference set: the data the model was trained on is needed to build it: {e}") from None
    pre = interface["preprocessing"]
    parts = []
    for sp, rows in data_mod.draw(ds, n, _SEED):
        if vocab is not None:  # texts as a client sends them, encoded with the export's vocabulary
            parts.append(data_mod.encode_texts([ds.texts[j] for j in sp.idx[rows]], vocab, int(pre["max_len"])))
        else:
            parts.append(data_mod.prepare(np.asarray(sp.x[sp.idx[rows]]), pre))
    x = np.ascontiguousarray(np.concatenate(parts))
    want = interface["inputs"][0]
    if str(x.dtype) != want["dtype"] or any(d != -1 and d != got for d, got in zip(want["shape"][1:], x.shape[1:])):
        raise InputError(f"reference set: data.source {cfg.data.source!r} now gives {x.dtype} {list(x.shape[1:])} "
                         f"inputs, the model takes {want['dtype']} {want['shape'][1:]}; the data changed")
    return x


def save(path: Path, inputs: np.ndarray, outputs: np.ndarray) -> None:
    from safetensors.numpy import save_file

    save_file({"inputs": np.ascontiguousarray(inputs), "outputs": np.ascontiguousarray(outputs, np.float32)},
              str(path))


def load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        t = load_file(str(path))
        x, y = t["inputs"], t["outputs"]
    except (SafetensorError, OSError, KeyError) as e:
        raise InputError(f"{path}: not a reference set (safetensors with inputs and outputs): "
                         f"{e.__class__.__name__}") from None
    if len(x) != len(y) or y.ndim != 2 or not len(x):
        raise InputError(f"{path}: {len(x)} inputs but outputs of shape {list(y.shape)}")
    return x, y


def run(run_batch: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([np.asarray(run_batch(inputs[i:i + batch])) for i in range(0, len(inputs), batch)])


def compare(got: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    if got.shape != ref.shape:
        return {"samples": int(len(ref)), "top1_agreement": 0.0, "max_abs_diff": float("inf"),
                "error": f"outputs of shape {list(got.shape)}, the reference has {list(ref.shape)}"}
    return {"samples": int(len(ref)), "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
            "max_abs_diff": float(np.abs(got.astype(np.float64) - ref).max())}


def verdict(result: dict[str, Any], budget: float) -> bool:
    return "error" not in result and result["top1_agreement"] >= budget


def check(spec: Any, runners: list[Callable[[np.ndarray], np.ndarray]], batch: int) -> tuple[dict[str, Any], float]:
    """Run a package's reference set (`spec`: a loaded `pipeline.serving.spec.Spec`) through each runner:
    (the worst result, the budget). None, None for a package made before reference sets existed."""
    ref = spec.doc.get("reference")
    if ref is None:
        return None, None
    path = spec.dir / ref["file"]
    x, y = load(path)
    if str(x.dtype) != spec.inp["dtype"] or tuple(x.shape[1:]) != spec.sample_shape or y.shape[1] != len(spec.labels):
        raise InputError(f"{path}: {x.dtype} inputs {list(x.shape[1:])} -> {list(y.shape[1:])}; the package takes "
                         f"{spec.inp['dtype']} {list(spec.sample_shape)} -> {len(spec.labels)} labels")
    results = [compare(run(fn, x, batch), y) for fn in runners]
    return min(results, key=lambda r: (r["top1_agreement"], -r["max_abs_diff"])), float(ref["min_agreement"])


def check_here(package: Path, engine: str = "") -> tuple[dict[str, Any] | None, float | None, dict[str, Any]]:
    """`pipe inspect --verify PACKAGE`: the reference check on this machine, through the engine and settings
    `pipe serve` would use (the package's engine or `engine`, one predictor's threads, batches of
    max_batch_size)."""
    from pipeline import runtime
    from pipeline.serving import predictor, spec as spec_mod

    sp = spec_mod.load_package(Path(package))
    settings = spec_mod.settings(_NoFlags(), sp)
    name = predictor.engine_for(sp, engine)
    if name == "paddle_inference":
        runtime.import_paddle(settings.threads)
    eng = predictor.load_engine(sp, name, settings.threads)
    feed, fetch = sp.inp["name"], sp.outp["name"]  # serving.yaml's names, checked against the engine's

    def logits(x: np.ndarray) -> np.ndarray:
        return eng.run({feed: x})[fetch]

    worst, budget = check(sp, [logits], settings.max_batch_size)
    return worst, budget, eng.describe()


class _NoFlags:
    """serving.yaml's own settings: every `pipe serve` flag unset."""

    def __getattr__(self, name: str) -> None:
        return None


def failure(result: dict[str, Any], budget: float, where: str, package: Path) -> str:
    """The one line a failed check exits with (4): engine, CPU, numbers, and the command that repackages fp32."""
    import json

    try:
        rel = json.loads((Path(package) / "manifest.json").read_text())["input"]["path"]
        src = str((Path(package) / rel).resolve())
    except (OSError, ValueError, KeyError, TypeError):
        src = "EXPORT_OR_COMPRESS_DIR"
    return (f"{describe(result, budget)} on {where}: below the budget. "
            f"Re-package fp32: pipe package {src} --precision fp32")


def verify_here(package: Path) -> None:
    """Print the reference check of `package` on this machine; GateError (exit 4) below its budget."""
    from pipeline import cpu
    from pipeline.errors import GateError

    worst, budget, eng = check_here(package)
    if worst is None:
        print("reference check: not run: this package has no reference set (made by an older pipe); re-package it")
        return
    where = f"{eng['engine']} {eng['precision']} on this CPU ({cpu.summary()})"
    if not verdict(worst, budget):
        raise GateError(failure(worst, budget, where, package))
    print(f"{describe(worst, budget)} on {where}")


def describe(result: dict[str, Any], budget: float) -> str:
    if "error" in result:
        return f"reference check: {result['error']}"
    return (f"reference check: {result['samples']} samples, top-1 agreement with fp32 {result['top1_agreement']:.4f} "
            f"(budget {budget:g}), max|diff| {result['max_abs_diff']:.3g}")
