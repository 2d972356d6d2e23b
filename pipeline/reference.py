"""A package's reference set: real preprocessed inputs and their fp32 outputs, checked where the package runs.

    pipe inspect runs/digits/package --verify      # runs the check on this machine's engine and CPU

The same int8 file computes different numbers on CPUs with and without VNNI (`pipeline/cpu.py`), so a
package built on one machine says nothing about the numbers on another. `pipe package` draws `SAMPLES`
inputs (seeded, from all splits of the data the model was trained on, preprocessed as a client's request
would be: images normalised, texts encoded with the export's vocabulary), runs them through the fp32
program and stores every input and every output in `reference.safetensors` (tensors only: no pickle; keys
`input/<name>` and `output/<name>` by public name, the logits output named in the metadata, "" for a task
without logits), with the agreement budgets in `serving.yaml`. `pipe serve` runs the inputs on its own
predictors before `/readyz` turns 200 and refuses to serve (exit 4) when top-1 agreement on the logits with
the fp32 outputs is below `min_agreement` (tasks with logits: classification), or a float output other than
the logits (every float output, for a task without logits: detection's heads) is below `min_sqnr_db`
(compress's `compress.min_sqnr_db`, the same measure stages/compress.py gates variants on): SQNR in dB = 10
log10 of sum(ref^2) / sum((got - ref)^2), None when the outputs are identical. Every output's max|diff| is
reported; outputs of other dtypes report the fraction of equal elements (`equal`), not gated. `pipe package`
also records the task's metrics on the set's targets (`task_metrics`: fp32's and the packaged engine's), not
gated. Which output is the logits comes from the task (`logits`: its public name, `pipeline.tasks.Info`).

A task whose outputs are large and judged by a decoded answer (ocr_rec: [N, T, 6625] softmax, judged by the
text) gives a `reference_digest` (ocr_rec: per step the class and its probability): the set stores that
(`digest/<key>`, metadata `digest`), every check digests what the engine returned the same way, and the
task's `reference_agreement` (the share of lines decoding to the same text) is held to `min_agreement` as
top-1 agreement is; SQNR on the digest's float tensors as on any float output.

Sets made before every tensor was stored hold two keys, `inputs` (the only input) and `outputs` (the
logits); they still check, on the logits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from pipeline import iospec
from pipeline.errors import InputError
from pipeline.serving.spec import REFERENCE_FILE as FILE  # the package contract names its files

SAMPLES = 256
_SEED = 0
_FORMAT = "2"  # metadata "pipe.reference"; sets without it are the two-key format before it
DIGEST = "digest/"  # a task's compact form of the outputs, stored in their place (metadata "digest": "1")
# A runner: a batch of feeds by the served program's input names -> its outputs by output name (program or
# public name; a bare array is the logits, or the only output).
Runner = Callable[[dict[str, np.ndarray]], Any]


def draw(export_config: dict[str, Any], interface: dict[str, Any], vocab: dict[str, int] | None,
         n: int = SAMPLES) -> dict[str, np.ndarray]:
    """`n` inputs drawn (seeded) from train, val and test of the export's data, as the model takes them: one
    array per input, by the interface's input name."""
    return draw_set(export_config, interface, vocab, n)[0]


def draw_set(export_config: dict[str, Any], interface: dict[str, Any], vocab: dict[str, int] | None,
             n: int = SAMPLES) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`draw`'s inputs and their stored targets (`y`, in the same order: what the task's metrics read)."""
    from pipeline import config as config_mod, data as data_mod, tasks

    cfg = config_mod.from_dict(export_config)
    desc = iospec.IO.from_interface(interface)
    task, _ = tasks.from_interface(interface, desc)
    try:
        ds = data_mod.load(cfg.data, getattr(task, "data", None))  # the task picks the loader, as in train
    except InputError as e:
        raise InputError(f"reference set: the data the model was trained on is needed to build it: {e}") from None
    pre = interface["preprocessing"]
    parts, ys = [], []
    for sp, rows in data_mod.draw(ds, n, _SEED):
        ys.append(np.asarray(sp.y[sp.idx[rows]]))
        if vocab is not None:  # texts as a client sends them, encoded with the export's vocabulary
            ids = data_mod.encode_texts([ds.texts[j] for j in sp.idx[rows]], vocab, int(pre["max_len"]))
            parts.append(data_mod.text_inputs(ids, pre))
        else:
            parts.append(sp.feeds(rows, pre))
    have = sorted(parts[0])
    want = sorted(t.public for t in desc.inputs)
    if have != want:
        raise InputError(f"reference set: data.source {cfg.data.source!r} now gives inputs {', '.join(have)}, the "
                         f"model takes {', '.join(want)}; the data changed")
    feeds = {}
    for t in desc.inputs:
        x = np.ascontiguousarray(np.concatenate([p[t.public] for p in parts]))
        if str(x.dtype) != t.dtype or any(d != -1 and d != got for d, got in zip(t.shape[1:], x.shape[1:])):
            raise InputError(f"reference set: data.source {cfg.data.source!r} now gives {x.dtype} "
                             f"{list(x.shape[1:])} inputs {t.public!r}, the model takes {t.dtype} "
                             f"{list(t.shape[1:])}; the data changed")
        feeds[t.name] = x
    return feeds, np.concatenate(ys)


def save(path: Path, io_: iospec.IO, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
         logits: str, digest: Mapping[str, np.ndarray] | None = None) -> None:
    """Every input and output of `io_` (arrays by program name) under its public name; `logits`: the logits
    output's public name ("" for a task without logits), in the metadata. With `digest` (the task's
    `reference_digest` of the outputs), that is stored in place of the outputs (`digest/<key>`)."""
    from safetensors.numpy import save_file

    tensors = {f"input/{t.public}": np.ascontiguousarray(inputs[t.name]) for t in io_.inputs}
    if digest is None:
        tensors.update({f"output/{t.public}": np.ascontiguousarray(outputs[t.name]) for t in io_.outputs})
    else:
        tensors.update({f"{DIGEST}{k}": np.ascontiguousarray(v) for k, v in digest.items()})
    save_file(tensors, str(path), metadata={"pipe.reference": _FORMAT, "logits": logits,
                                            **({"digest": "1"} if digest is not None else {})})


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "numpy") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError) as e:
        raise InputError(f"{path}: not a reference set (safetensors of inputs and outputs): "
                         f"{e.__class__.__name__}") from None


def load_set(path: Path, io_: iospec.IO, text_len: int | None = None
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The set checked against a package's tensors: (inputs, outputs), each by the served program's name.
    Every input of `io_` with its dtype and fixed axes (text: ids of `text_len`), one row count throughout;
    every output (a two-key set: the logits only). InputError, one line naming the tensor, otherwise."""
    t, meta = _read(path)
    if meta.get("pipe.reference") != _FORMAT:  # the format before every tensor was stored
        if sorted(t) != ["inputs", "outputs"]:
            raise InputError(f"{path}: not a reference set (keys {', '.join(sorted(t))})")
        if len(io_.inputs) != 1:
            raise InputError(f"{path}: a one-input reference set, the package takes {len(io_.inputs)} inputs")
        got_in, got_out = {io_.inputs[0].public: t["inputs"]}, {io_.logits().public: t["outputs"]}
    else:
        got_in = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("input/")}
        got_out = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("output/")}
        known = {f"input/{x.public}" for x in io_.inputs} | {f"output/{x.public}" for x in io_.outputs}
        if meta.get("digest"):  # the task's compact form of the outputs (`save`)
            got_out = {k: v for k, v in t.items() if k.startswith(DIGEST)}
            known = {f"input/{x.public}" for x in io_.inputs} | set(got_out)
        if set(t) != known:
            raise InputError(f"{path}: holds {', '.join(sorted(t))}; the package's tensors are "
                             f"{', '.join(f'input/{x.public}' for x in io_.inputs)}, "
                             f"{', '.join(f'output/{x.public}' for x in io_.outputs)}")
    rows = {len(a) for a in (*got_in.values(), *got_out.values())}
    if len(rows) != 1 or not rows.pop():
        raise InputError(f"{path}: its tensors have different or no rows "
                         f"({', '.join(f'{k} {list(a.shape)}' for k, a in {**got_in, **got_out}.items())})")
    inputs, outputs = {}, {}
    for x in io_.inputs:
        a = got_in[x.public]
        want = (-1, text_len) if text_len is not None else x.shape
        fits = a.ndim == len(want) and all(d in (-1, g) for d, g in zip(want[1:], a.shape[1:]))
        if str(a.dtype) != x.dtype or not fits:
            raise InputError(f"{path}: input {x.public!r} is {a.dtype} {list(a.shape[1:])}; the package takes "
                             f"{x.dtype} {list(want[1:])}")
        inputs[x.name] = a
    if meta.get("digest"):
        return inputs, got_out
    for x in io_.outputs:
        if x.public in got_out:
            a = got_out[x.public]
            if a.ndim != len(x.shape) or any(d not in (-1, g) for d, g in zip(x.shape[1:], a.shape[1:])):
                raise InputError(f"{path}: output {x.public!r} is {list(a.shape[1:])}; the package gives "
                                 f"{list(x.shape[1:])}")
            outputs[x.name] = a
    return inputs, outputs


def run(run_batch: Runner, inputs: Mapping[str, np.ndarray], batch: int, io_: iospec.IO) -> dict[str, np.ndarray]:
    """Every output of `run_batch` over `inputs` in batches, by the program's output name (a runner answering
    a bare array: the logits, or the only output)."""
    n = iospec.num_rows(inputs)
    parts: list[dict[str, np.ndarray]] = []
    for i in range(0, n, batch):
        got = run_batch({k: v[i:i + batch] for k, v in inputs.items()})
        if not isinstance(got, Mapping):
            got = {io_.main().name: got}
        named: dict[str, np.ndarray] = {}
        for k, v in got.items():
            try:
                named[io_.output(k).name] = np.asarray(v)
            except InputError:
                pass  # not one of the package's outputs: nothing to compare
        parts.append(named)
    keys = set.intersection(*(set(p) for p in parts))
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}


def sqnr_db(got: np.ndarray, ref: np.ndarray) -> float | None:
    """10 log10(sum(ref^2) / sum((got - ref)^2)); None when they are identical (an infinite ratio)."""
    ref64 = ref.astype(np.float64)
    noise = float(np.square(got.astype(np.float64) - ref64).sum())
    signal = float(np.square(ref64).sum())
    if noise == 0:
        return None
    return 10 * math.log10(max(signal, np.finfo(np.float64).tiny) / noise)  # finite: manifests and /v1 are JSON


def _measure(got: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """One tensor against its reference: float max|diff| and SQNR, other dtypes the fraction equal."""
    if ref.dtype.kind == "f":
        return {"max_abs_diff": float(np.abs(got.astype(np.float64) - ref).max(initial=0.0)), "sqnr_db": sqnr_db(got, ref)}
    return {"equal": float(np.count_nonzero(got == ref)) / max(ref.size, 1)}


def compare_digest(got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], io_: iospec.IO,
                   task: Any, info: Any) -> dict[str, Any]:
    """`got` (every output by program name) against a set stored as the task's digest (`ref`: `digest/<key>`):
    the task's `reference_digest` of `got`, then per key max|diff| and SQNR (float) or the fraction equal,
    and `agreement`, the task's `reference_agreement` (how alike the answers are), which `verdict` holds to
    the budget as top-1 agreement. The digest's parts are all read from the output the agreement judges
    (ocr_rec: each step's class and its probability), as the logits are for a classifier: recorded, not held
    to min_sqnr_db (an int8 recognizer reading all 16 lines as fp32 does had its step probabilities at 24.6 dB
    against fp32's, max|diff| 0.48)."""
    want = {k[len(DIGEST):]: v for k, v in ref.items()}
    n = len(next(iter(want.values())))
    missing = next((t.public for t in io_.outputs if t.name not in got), None)
    if missing is not None:
        return {"samples": int(n), "top1_agreement": None, "agreement": 0.0, "max_abs_diff": float("inf"),
                "error": f"output {missing!r}: not returned"}
    have = task.reference_digest({t.public: np.asarray(got[t.name]) for t in io_.outputs}, info)
    per: dict[str, dict[str, Any]] = {}
    for k, r in want.items():
        g = have.get(k)
        if g is None or g.shape != r.shape:
            return {"samples": int(n), "top1_agreement": None, "agreement": 0.0, "max_abs_diff": float("inf"),
                    "error": f"reference {k!r}: " + ("not in the task's digest" if g is None else
                                                     f"shape {list(g.shape)}, the reference has {list(r.shape)}")}
        per[k] = _measure(g, r)
    first = next((v["max_abs_diff"] for v in per.values() if "max_abs_diff" in v), 0.0)
    return {"samples": int(n), "top1_agreement": None, "agreement": float(task.reference_agreement(have, want, info)),
            "max_abs_diff": first, "logits": None, "outputs": per, "min_sqnr_db": None}


def compare(got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], io_: iospec.IO,
            min_sqnr_db: float | None = None, *, logits: str, task: Any = None, info: Any = None) -> dict[str, Any]:
    """Top-1 agreement on the logits (`logits`: their public name, the task's `Info.logits`; "": a task
    without logits, whose agreement is None) and max|diff| of the logits (else of the first output, `IO.main`); per output
    (public name): float outputs max|diff| and SQNR in dB, others the fraction of equal elements.
    `min_sqnr_db` (None: no SQNR budget, as packages made before it) travels in the result for `verdict`.
    An output missing or of another shape is an `error`."""
    if any(k.startswith(DIGEST) for k in ref):
        return compare_digest(got, ref, io_, task, info)
    head = io_.output(logits) if logits else io_.main()
    n = len(ref[head.name])
    per: dict[str, dict[str, Any]] = {}
    for t in io_.outputs:
        if t.name not in ref:
            continue  # a set made before every output was stored
        r, g = ref[t.name], got.get(t.name)
        if g is None or g.shape != r.shape:
            return {"samples": int(n), "top1_agreement": 0.0 if logits else None, "max_abs_diff": float("inf"),
                    "error": f"output {t.public!r}: " + ("not returned" if g is None else
                                                         f"shape {list(g.shape)}, the reference has {list(r.shape)}")}
        per[t.public] = _measure(g, r)
    agree = None
    if logits:
        top = [np.asarray(d[head.name]).argmax(axis=1) for d in (got, ref)]
        agree = float((top[0] == top[1]).mean())
    out = {"samples": int(n), "top1_agreement": agree, "max_abs_diff": per[head.public].get("max_abs_diff", 0.0),
           "logits": head.public if logits else None, "outputs": per}
    return out if min_sqnr_db is None else {**out, "min_sqnr_db": float(min_sqnr_db)}


def below_sqnr(result: dict[str, Any]) -> list[str]:
    """The float outputs other than the logits (if any) whose SQNR is below the result's `min_sqnr_db`."""
    budget = result.get("min_sqnr_db")
    if budget is None:
        return []
    return [k for k, v in (result.get("outputs") or {}).items()
            if k != result.get("logits") and v.get("sqnr_db") is not None and v["sqnr_db"] < budget]


def verdict(result: dict[str, Any], budget: float) -> bool:
    """Top-1 agreement on the logits (or a digest's `agreement`) within `budget` (a task without either: none
    to hold) and every other float output within min_sqnr_db."""
    agree = result.get("top1_agreement")
    agree = result.get("agreement") if agree is None else agree
    return "error" not in result and (agree is None or agree >= budget) and not below_sqnr(result)


def check(spec: Any, runners: list[Runner], batch: int) -> tuple[dict[str, Any] | None, float | None]:
    """Run a package's reference set (`spec`: a loaded `pipeline.serving.spec.Spec`) through each runner (feeds
    by the served program's input names -> outputs by name; `Runner`): (the worst result, the budget). None,
    None for a package made before reference sets existed."""
    ref = spec.doc.get("reference")
    if ref is None:
        return None, None
    path = spec.dir / ref["file"]
    x, y = load_set(path, spec.io, spec.text.max_len if spec.text is not None else None)
    logits = spec.info.logits
    if logits and y[spec.io.output(logits).name].shape[1] != len(spec.labels):
        raise InputError(f"{path}: logits of {y[spec.io.output(logits).name].shape[1]} classes; the package has "
                         f"{len(spec.labels)} labels")
    budget, min_db = float(ref["min_agreement"]), ref.get("min_sqnr_db")
    results = [compare(run(fn, x, batch, spec.io), y, spec.io, min_db, logits=logits, task=spec.task, info=spec.info)
               for fn in runners]
    return min(results, key=lambda r: (verdict(r, budget), _agreement(r), -r["max_abs_diff"])), budget


def _agreement(result: dict[str, Any]) -> float:
    """The result's top-1 agreement for ranking runners; a task without logits ranks on the rest."""
    agree = result.get("top1_agreement")
    agree = result.get("agreement") if agree is None else agree
    return 1.0 if agree is None else agree


def check_here(package: Path, engine: str = "") -> tuple[dict[str, Any] | None, float | None, dict[str, Any]]:
    """`pipe inspect --verify PACKAGE`: the reference check on this machine, through the engine and settings
    `pipe serve` would use (the package's engine or `engine`, one predictor's threads, batches of
    max_batch_size), every tensor fed and fetched by name (`engines.names`)."""
    from pipeline import engines, runtime
    from pipeline.errors import PipeError
    from pipeline.serving import spec as spec_mod

    sp = spec_mod.load_package(Path(package))
    settings = spec_mod.settings(_NoFlags(), sp)
    name = spec_mod.engine_for(sp, engine)
    if sp.precision == "bf16" and runtime.bf16_unsupported():
        raise InputError(f"{sp.dir}: a bf16 package, but {runtime.bf16_unsupported()}; package the "
                         "model with --precision fp32")
    if name == "paddle_inference":
        runtime.import_paddle(settings.threads)
    try:
        eng = engines.ENGINES[name].load(list(sp.files), threads=settings.threads, precision=sp.precision)
    except InputError:
        raise
    except PipeError as e:  # the engine's C++ error: one line, naming the file
        raise PipeError(f"{sp.files[0]}: {name} cannot load it ({str(e)[-200:]})") from None
    on = engines.names(eng, sp.io, str(sp.files[0]))  # serving.yaml's names, checked against the engine's

    def outputs(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = eng.run({on[k]: v for k, v in feeds.items()})
        return {t.name: got[on[t.name]] for t in sp.io.outputs}

    worst, budget = check(sp, [outputs], settings.max_batch_size)
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
    """One line: the logits' agreement and max|diff|, then each other output's max|diff| and SQNR (a task
    without logits: every output's)."""
    if "error" in result:
        return f"reference check: {result['error']}"
    if result.get("agreement") is not None:
        line = (f"reference check: {result['samples']} samples, answers agreeing with fp32 "
                f"{result['agreement']:.4f} (budget {budget:g})")
    elif result.get("top1_agreement") is None:
        line = f"reference check: {result['samples']} samples against fp32"
    else:
        line = (f"reference check: {result['samples']} samples, top-1 agreement with fp32 "
                f"{result['top1_agreement']:.4f} (budget {budget:g}), max|diff| {result['max_abs_diff']:.3g}")
    low = below_sqnr(result)
    for name, one in (result.get("outputs") or {}).items():
        if name == result.get("logits"):
            continue
        if "equal" in one:
            line += f"; {name} {one['equal']:.4f} equal"
            continue
        db = one["sqnr_db"]
        line += (f"; {name} max|diff| {one['max_abs_diff']:.3g}, "
                 + ("identical" if db is None else f"SQNR {db:.1f} dB")
                 + (f" < min_sqnr_db {result['min_sqnr_db']:g}" if name in low else ""))
    return line
