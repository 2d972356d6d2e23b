"""pipe package: a self-contained serving package, `<run>/package/`, from an export or compress artifact.

    pipe package runs/exp1/compress                       # the fastest measured variant+engine within budget
    pipe package runs/exp1/compress --engine openvino --optimize latency
    pipe package runs/exp1/compress --variant int8-paddle --max-batch-size 64
    pipe package runs/exp1/export                          # its fastest fp32 engine, measured here (once)

Reads a verified `export/` (fp32, or bf16: the same PIR program run with oneDNN bf16) or `compress/` artifact.
Which model ships is `pipeline/package_source.py`'s: from an export with `--engine auto` at fp32, the fp32
engines it has files for are measured here on the reference set and `pipeline/choose.py` picks among them as
after compress (`pipeline/export_engines.py`: the measurement is recorded in `metrics.engine_measurement` and
cached by the export's manifest sha256, so a second package of the same export measures nothing). From a
compress artifact the variant is `--variant`, or the one `pipeline/choose.py` picks from the manifest's
`metrics.variants` (measured on this machine, every engine) for `--engine auto|paddle|onnxruntime|openvino`,
`--precision` and `--optimize`; variants with `source: export` point back to the export through the manifest's
input lineage. Writes `package/`, copied from an allowlist (inference-format files only, never a pickle):

    model.json | model.pdmodel, model.pdiparams   the model the chosen engine runs (Paddle Inference: the
    | model.onnx                                  PIR or legacy program; onnxruntime: the ONNX; OpenVINO:
                                                  the ONNX or the legacy program)
    serving.yaml                                  engine, every input and output (`inputs:`, `outputs:`),
                                                  the task (`task:` name, spec, postprocessing settings),
                                                  preprocessing, labels, batching, limits
    serving_client_conf.prototxt                  Paddle Serving client config (a feed_var per input, a
                                                  fetch_var per output)
    triton/<name>/config.pbtxt, 1/model.onnx,     a Triton model repository (onnxruntime backend): the served
    triton/<name>/labels.txt                      ONNX itself, else compress's or paddle2onnx's, io renamed to
                                                  the public names; an entry per tensor, labels on the logits
                                                  (labels.txt: tasks with logits only; Triton serves the raw
                                                  outputs, the task's postprocessing runs in the client)
    vocab.json                                    text models only: the export's vocabulary
    reference.safetensors                         256 real inputs and their fp32 outputs, every tensor
                                                  (pipeline/reference.py), checked here on the chosen engine
                                                  (exit 4 below compress.min_agreement on the logits or
                                                  compress.min_sqnr_db on another float output: every float
                                                  output of a task without logits) and by serve
    README.md, manifest.json                      how to call it (`pipeline/serving/readme.py`); sha256 of every file

Every tensor of the model's interface (`pipeline/iospec.py`) is listed under its public name (`name`: the
model's own, e.g. the keys of a dict it returns), with the served program's name as `program_name` where it
differs (`fetch_name_0`; the legacy program names outputs after their ops): the engines' detail, never shown
to a client (serving.yaml, the client config, the Triton repository and every endpoint use the public
names). Tensors are read by name everywhere: the logits are the output with the logits role, for a task
that reads logits (the task is the interface's `task`, `pipeline/tasks/`; none recorded: classification).
A detection package serves the model's raw heads; `pipe serve` decodes them (`pipeline.tasks.detection`)
with serving.yaml's settings.
A text model (every input int64 ids [-1, -1]) gets a `text:` section in serving.yaml (char tokenizer,
max_len, pad/unk ids, vocabulary file), a client config with int64 feeds of variable length (`shape: -1`),
Triton inputs of dims [-1] (its ONNX parity-checked at max_len and at half that length), and a README
with a text example. The contract itself
(allowlist, dtypes, schema, `check_io`) is `pipeline/serving/spec.py`.

`pipe serve package/` needs nothing outside this directory. The paddle2onnx conversion is checked in
onnxruntime against the Paddle predictor on a fixed random batch, every output: max|diff| <=
`onnx_parity_tol` x that output's max|value| or the stage fails with exit 5, writing nothing.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pipeline import artifacts, choose, cpu, engines, iospec, package_source, reference, runtime, tasks, triton_repo
from pipeline.config import CompressConfig
from pipeline.engines import paddle as paddle_engine
from pipeline.errors import GateError, InputError, PipeError
from pipeline.serving import readme, spec as serving_spec

# The package contract lives with its reader (pipeline/serving/spec.py); re-exported for callers and tests.
PRECISIONS, DTYPES, MODEL_FILES = serving_spec.PRECISIONS, serving_spec.DTYPES, serving_spec.MODEL_FILES
PARAMS_FILE, SERVING_SCHEMA = serving_spec.PARAMS_FILE, serving_spec.SERVING_SCHEMA
SERVER_DEFAULTS = serving_spec.SERVER_DEFAULTS
allowlist = serving_spec.allowlist
_CHECK_BATCH = 8
DEFAULT_MAX_BATCH = 32  # PackageConfig.max_batch_size 0: the task's `max_batch`, else this
_CHECK_SEED = 0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
@dataclass(frozen=True)
class PackageConfig:
    """What `pipe package` was asked for (recorded in the manifest under `config.package`)."""

    precision: str = ""
    """fp32, bf16 or int8; '' = any measured one from a compress dir (`engine` auto), fp32 from an export."""
    engine: str = "auto"
    """auto (the fastest measured variant+engine within budget: pipeline/choose.py), paddle, onnxruntime, openvino."""
    optimize: str = "balanced"
    """auto's speed criterion: balanced (batch 1 and the throughput batch compress timed at: 32, ocr_det 4 pages),
    latency (batch 1) or throughput."""
    variant: str = ""
    """A compress variant by name (e.g. int8-onnx); '' = chosen by `engine`, `precision` and `optimize`."""
    name: str = ""
    """Model name in serving.yaml and the Triton repository; '' = the trained model's name, sanitised."""
    max_batch_size: int = 0
    """Most samples one predictor run takes (dynamic batching), also the per-request cap and Triton's; 0 = the
    task's default: 32, ocr_det's 4 pages (`max_batch`)."""
    max_wait_ms: float = 2.0
    """How long a batch waits for more requests after its first one arrived."""
    triton: bool = True
    """Write the Triton model repository (needs paddle2onnx + onnxruntime unless compress has an ONNX)."""
    onnx_parity_tol: float = 1e-4
    """paddle2onnx gate: ONNX vs Paddle max|diff| allowed, relative to max|logit|."""


def run(cfg: PackageConfig, in_dir: Path, out_dir: Path) -> Path:
    """Package the export or compress artifact `in_dir` into `out_dir`."""
    out_dir = Path(out_dir)
    _check_config(cfg)
    src = artifacts.verify(in_dir, ("export", "compress"))
    source = package_source.select(src, cfg)
    iface = source.interface
    desc, task, info = _io(src, iface)  # by the export's (PIR) program names
    if not cfg.max_batch_size:
        cfg = dataclasses.replace(cfg, max_batch_size=int(getattr(task, "max_batch", DEFAULT_MAX_BATCH)))
    text = _text(src, source, iface)
    name = cfg.name or _sanitise(str(iface.get("model") or "model"))
    checks = _check_batches(desc, iface["preprocessing"], text, task, info)
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)
    fp32 = _load(paddle_engine.NAME, [source.fp32_program, source.fp32_params], threads, "fp32")
    fp32_run = _runner(fp32, desc, source.fp32_program)
    if source.measure:
        source = package_source.measured(src, source, cfg, text, desc, task, info, threads)
    print(f"package: {source.variant} on {source.engine} ({source.why})")
    y_refs = [fp32_run(feeds) for feeds in checks]
    packaged = _packaged_engine(source, fp32, threads)
    names = packaged or _load(source.engine, source.files, threads, "fp32")  # bf16 this CPU cannot run: io names
    on = engines.names(names, desc, str(source.files[0]))  # the packaged file's own names
    served = _renamed(desc, on)
    checked = None if packaged is None else (packaged, _runner(packaged, desc, source.files[0]))
    ref_x, ref_y, ref_check, ref_digest = _reference(src, source, cfg, text, desc, fp32_run, checked, task, info)
    doc = {**src.manifest["config"], "package": dataclasses.asdict(cfg)}
    with artifacts.write_stage(out_dir, "package", doc, src) as w:
        model_files = MODEL_FILES[source.format]
        for f, dest in zip(source.files, model_files):
            _copy_model(f, w.dir / dest)
        if text is not None:
            shutil.copyfile(source.vocab, w.dir / text["vocab_file"])
        reference.save(w.dir / reference.FILE, desc, ref_x, ref_y, info.logits, ref_digest)
        metrics: dict[str, Any] = {"precision": source.precision, "variant": source.variant, "engine": source.engine,
                                   "reference": ref_check, "cpu": cpu.capability()}
        metrics.update({f"variant_{k}": v for k, v in source.variant_metrics.items()
                        if isinstance(v, (int, float, str)) and not isinstance(v, bool)})
        if source.measurement is not None:
            metrics["engine_measurement"] = source.measurement
        triton = None
        if cfg.triton:
            triton = triton_repo.write(w.dir / "triton" / name, name, source, desc, served, iface["labels"], cfg,
                                         checks, y_refs, threads, info.logits)
            metrics.update(triton.pop("metrics"))
        spec = _serving_spec(name, source, served, iface, cfg, triton, text, ref_check)
        (w.dir / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True),
                                            encoding="utf-8")
        (w.dir / "serving_client_conf.prototxt").write_text(_client_conf(served), encoding="utf-8")
        (w.dir / "README.md").write_text(readme.render(spec, readme.example_ids(source.vocab, text)),
                                             encoding="utf-8")
        _check_file_set(w.dir, allowlist(source.format, name if cfg.triton else None,
                                         text["vocab_file"] if text else None, reference=True,
                                         labels=bool(info.logits)))
        # the interface as the export recorded it, each tensor's program name the packaged file's
        w.interface = {**iface, **served.to_interface()}
        w.metrics = metrics
        w.extra = {"format": source.format, "precision": source.precision, "engine": source.engine, "name": name,
                   "serving": "serving.yaml", "chosen": {"engine": cfg.engine, "optimize": cfg.optimize, "why": source.why}}
    return out_dir


# ------------------------------------------------------------------ the request and the interface


def _check_config(cfg: PackageConfig) -> None:
    if cfg.precision and cfg.precision not in PRECISIONS:
        raise InputError(f"--precision: must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    if cfg.engine != "auto":
        engine = engines.resolve(cfg.engine)
        lib = engines.missing(engine)
        if lib:
            raise InputError(f"--engine {cfg.engine}: {lib}")
    if cfg.optimize not in choose.OPTIMIZE:
        raise InputError(f"--optimize: must be one of {', '.join(choose.OPTIMIZE)}, got {cfg.optimize!r}")
    if cfg.name and not _NAME_RE.match(cfg.name):
        raise InputError(f"--name: letters, digits, '_', '.', '-' (at most 64, starting with a letter or "
                         f"digit), got {cfg.name!r}")
    if not 0 <= cfg.max_batch_size <= 4096:
        raise InputError(f"--max-batch-size: must be 1..4096 (0: the task's default), got {cfg.max_batch_size}")
    if not 0 <= cfg.max_wait_ms <= 1000:
        raise InputError(f"--max-wait-ms: must be 0..1000, got {cfg.max_wait_ms:g}")


def _sanitise(name: str) -> str:
    """A model name usable as a Triton model directory: `pkg.mod:factory` -> `pkg.mod_factory`."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip("._-")[:64]
    return clean if clean and _NAME_RE.match(clean) else "model"


def _text(src: artifacts.Artifact, source: package_source.Source, iface: dict[str, Any]) -> dict[str, Any] | None:
    """A text model's `text:` section for serving.yaml (tokenizer, max_len, pad/unk ids, vocabulary),
    with the vocabulary file checked against it; None for other models."""
    pre = iface["preprocessing"]
    if pre.get("kind") != "text":
        return None
    text = serving_spec.text_section(pre, f"{src.path / artifacts.MANIFEST}: interface.preprocessing")
    if source.vocab is None:
        raise InputError(f"{src.path / artifacts.MANIFEST}: a text model without a vocabulary file")
    serving_spec.check_vocab(source.vocab, text)
    return {**text, "padding": "right, with pad_id, to max_len", "truncation": "max_len"}


def _io(src: artifacts.Artifact, iface: dict[str, Any]) -> tuple[iospec.IO, Any, tasks.Info]:
    """The interface's tensors and task, checked servable (`pipeline/serving/spec.py` check_io): dtypes pipe
    serves, dynamic batch, fixed input dims (text: int64 ids [-1, -1]), float32 [-1, K] logits for K labels
    (a task with logits)."""
    where = f"{src.path / artifacts.MANIFEST}: interface"
    try:
        ok = isinstance(iface["labels"], list) and isinstance(iface["preprocessing"], dict)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: needs inputs, outputs, labels and preprocessing")
    desc = iospec.IO.from_interface(iface, where)
    serving_spec.task_section(iface, where)  # the section serving.yaml gets, checked before anything runs
    try:
        task, info = tasks.from_interface(iface, desc)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    serving_spec.check_io(desc, iface["labels"], iface["preprocessing"].get("kind") == "text", where,
                          logits=bool(info.logits), limits=serving_spec.limits_of(task, info))
    return desc, task, info


def _renamed(desc: iospec.IO, on: dict[str, str]) -> iospec.IO:
    """`desc` under the packaged file's names (`engines.names`), each public name kept as alias."""
    return dataclasses.replace(desc, **{kind: tuple(dataclasses.replace(t, name=on[t.name], alias=t.public)
                                                    for t in getattr(desc, kind)) for kind in ("inputs", "outputs")})


def _check_batches(desc: iospec.IO, pre: dict[str, Any], text: dict[str, Any] | None, task: Any = None,
                   info: tasks.Info | None = None) -> list[dict[str, np.ndarray]]:
    """Fixed random batches in the model's input space, by input name (parity needs the same function, not
    real data): float inputs standard normal, integer ones 0 or 1. Text: ids of random lengths padded to
    max_len (what `pipe serve` feeds), made into every model input as the data module does
    (`data.text_inputs`), and the same cut to half that width, so the ONNX model is also checked on another
    sequence length (Triton takes any). A task with a dynamic input (ocr_rec): at the first and the last of
    its `example_shapes` (two line widths)."""
    rng = np.random.RandomState(_CHECK_SEED)
    if task is not None and tasks.dynamic(task):
        shapes = task.example_shapes(info)
        return [{desc.inputs[0].name: rng.standard_normal((_CHECK_BATCH, *shape)).astype(np.float32)}
                for shape in dict.fromkeys([tuple(shapes[0]), tuple(shapes[-1])])]
    if text is not None:
        from pipeline import data as data_mod

        width, pad = text["max_len"], text["pad_id"]
        ids = rng.randint(min(2, text["vocab_size"] - 1), text["vocab_size"], size=(_CHECK_BATCH, width))
        lengths = rng.randint(1, width + 1, size=_CHECK_BATCH)
        ids[np.arange(width)[None, :] >= lengths[:, None]] = pad
        ids = ids.astype(np.int64)
        widths = [ids] + ([np.ascontiguousarray(ids[:, :(width + 1) // 2])] if width > 1 else [])
        return [{desc.input(k).name: v for k, v in data_mod.text_inputs(w, pre).items()} for w in widths]
    feeds = {}
    for t in desc.inputs:
        shape = (_CHECK_BATCH, *t.shape[1:])
        feeds[t.name] = (rng.standard_normal(shape).astype(np.float32) if t.dtype == "float32"
                         else rng.randint(0, 2, size=shape).astype(t.dtype))
    return [feeds]


def _load(engine: str, files: list[Path], threads: int, precision: str) -> Any:
    """The files on `engine` as `pipe serve` runs them (`pipeline/engines/`); files it cannot load are bad
    input naming the file."""
    try:
        return engines.ENGINES[engine].load(files, threads=threads, precision=precision)
    except PipeError as e:
        raise InputError(f"{files[0]}: {engine} cannot load it ({str(e)[-200:]})") from None


def _runner(eng: Any, desc: iospec.IO, where: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """feeds -> every output on `eng`, both by `desc`'s names, mapped onto the engine's (`engines.names`)."""
    on = engines.names(eng, desc, str(where))

    def run_(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = eng.run({on[k]: v for k, v in feeds.items()})
        return {t.name: got[on[t.name]] for t in desc.outputs}

    return run_


def _packaged_engine(source: package_source.Source, fp32: Any, threads: int) -> Any | None:
    """The packaged files on their engine at their precision; None for bf16 on a CPU without bf16 kernels."""
    if source.files[0] == source.fp32_program and source.precision == "fp32" and source.engine == paddle_engine.NAME:
        return fp32
    if source.precision == "bf16" and runtime.bf16_unsupported():
        return None
    return _load(source.engine, source.files, threads, source.precision)


def _reference(src: artifacts.Artifact, source: package_source.Source, cfg: PackageConfig, text: dict[str, Any] | None,
               desc: iospec.IO, fp32: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
               packaged: tuple[Any, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] | None,
               task: Any, info: tasks.Info
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray] | None]:
    """The reference set (`pipeline/reference.py`): real inputs, the fp32 program's outputs (every one), and
    the packaged program's agreement with them here, through the engine `pipe serve` runs (`packaged`: the
    engine and its feeds -> outputs; None when this CPU cannot run it). Below the budget (top-1 agreement on
    the logits under compress.min_agreement, or another float output under compress.min_sqnr_db: every float
    output of a task without logits) nothing is written (exit 4): a package never ships what fails its own
    check. The task's metrics on the set's targets (fp32 and packaged) are recorded, not gated."""
    exp = src if src.stage == "export" else package_source.lineage_export(src)
    x, targets = source.reference_set or package_source.reference_set(exp, source, text, desc, task, info)
    ccfg = (src.manifest.get("config") or {}).get("compress") or {}
    # configs recorded before compress.min_sqnr_db existed get its default
    budget = float(ccfg.get("min_agreement", 0.99))
    min_db = float(ccfg.get("min_sqnr_db", CompressConfig().min_sqnr_db))
    y = reference.run(fp32, x, cfg.max_batch_size, desc)

    def scored(outputs: dict[str, np.ndarray]) -> dict[str, float]:
        return task.metrics_of({t.public: outputs[t.name] for t in desc.outputs}, targets, info)

    digest = None  # a task's compact form of the outputs (reference.py), stored and checked in their place
    if hasattr(task, "reference_digest"):
        digest = task.reference_digest({t.public: y[t.name] for t in desc.outputs}, info)

    out: dict[str, Any] = {"samples": int(iospec.num_rows(x)), "min_agreement": budget, "min_sqnr_db": min_db,
                           "cpu": cpu.summary(), "task_metrics": {"fp32": scored(y)}}
    if packaged is None:
        out["not_run_here"] = runtime.bf16_unsupported()
        print(f"package: reference check not run here ({out['not_run_here']}); pipe serve runs it where it serves")
        return x, y, out, digest
    eng, run_ = packaged
    got = reference.run(run_, x, cfg.max_batch_size, desc)
    ref = y if digest is None else {reference.DIGEST + k: v for k, v in digest.items()}
    result = reference.compare(got, ref, desc, min_db, logits=info.logits, task=task, info=info)
    out["task_metrics"]["packaged"] = scored(got)
    out.update(result, engine=eng.describe())
    print(f"package: {reference.describe(result, budget)} on {source.engine} {source.precision} here")
    if not reference.verdict(result, budget):
        raise GateError(f"package: {source.variant} fails its own {reference.describe(result, budget)} on this CPU "
                        f"({cpu.summary()}); nothing written. Package fp32: pipe package {src.path} --precision fp32")
    return x, y, out, digest


def _copy_model(src: Path, dest: Path) -> None:
    """Copy a model file, refusing anything that looks like a pickle (protocol 2+ starts with 0x80)."""
    with open(src, "rb") as f:
        head = f.read(2)
    if len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        raise InputError(f"{src}: looks like a pickle; a package holds inference-format files only")
    shutil.copyfile(src, dest)


# ------------------------------------------------------------------ documents


def _serving_spec(name: str, source: package_source.Source, served: iospec.IO,
                  iface: dict[str, Any], cfg: PackageConfig, triton: dict[str, Any] | None,
                  text: dict[str, Any] | None, ref_check: dict[str, Any]) -> dict[str, Any]:
    files = MODEL_FILES[source.format]
    model = {"format": source.format, "program": files[0], "params": files[1] if len(files) > 1 else None,
             "variant": source.variant, "engine": source.engine}
    doc = {
        "schema": SERVING_SCHEMA,
        "name": name,
        "precision": source.precision,
        "model": model,
        "engine": {"name": source.engine, "precision": source.precision, "chosen": cfg.engine,
                   "optimize": cfg.optimize, "why": source.why,
                   "measured": {k: source.variant_metrics.get(k) for k in
                                ("latency_ms_p50_bs1", "items_per_s_batch", "speedup_bs1", "speedup_batch")
                                if source.variant_metrics.get(k) is not None}},
        "inputs": serving_spec.entries(served.inputs),
        "outputs": serving_spec.entries(served.outputs),
        "labels": [str(lab) for lab in iface["labels"]],
        "task": serving_spec.task_section(iface, "interface"),
        "preprocessing": iface["preprocessing"],
        "batching": {"max_batch_size": cfg.max_batch_size, "max_wait_ms": cfg.max_wait_ms},
        "server": dict(SERVER_DEFAULTS),
        "triton": triton,
        "reference": {"file": reference.FILE, "samples": ref_check["samples"],
                      "min_agreement": ref_check["min_agreement"], "min_sqnr_db": ref_check["min_sqnr_db"],
                      "at_package": {k: ref_check.get(k) for k in ("top1_agreement", "agreement", "max_abs_diff", "cpu")
                                     if k in ref_check or k != "agreement"}},
    }
    if text is not None:
        doc["text"] = text
    return doc


def _client_conf(served: iospec.IO) -> str:
    """Paddle Serving's GeneralModelConfig text format: a feed_var per input, a fetch_var per output, by the
    public names (name and alias_name alike: `pipe serve` maps them onto the program's); shapes exclude the
    batch dim (-1: any length)."""
    def var(kind: str, t: iospec.Tensor) -> str:
        dims = "\n  ".join(f"shape: {d}" for d in t.shape[1:])
        return (f'{kind}_var {{\n  name: "{t.public}"\n  alias_name: "{t.public}"\n'
                f"  is_lod_tensor: false\n  {kind}_type: {DTYPES[t.dtype][0]}\n  {dims}\n}}\n")

    return "".join(var("feed", t) for t in served.inputs) + "".join(var("fetch", t) for t in served.outputs)


def _check_file_set(d: Path, want: set[str]) -> None:
    found = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} | {artifacts.MANIFEST}
    if found != want:
        extra, missing = sorted(found - want), sorted(want - found)
        raise PipeError(f"package wrote an unexpected file set (extra {extra}, missing {missing})")
