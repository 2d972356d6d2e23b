"""The `pipe` command line: thin Typer commands that build a config and call one stage's `run`.

No paddle import here: `pipe --help` stays fast. Errors print one line and exit with the error's code
(2 bad input, 3 diverged, 4 accuracy gate, 5 parity gate, 6 missing or
unverifiable artifact in `pipe all`); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from typer.exceptions import TyperException

from pipeline import __version__
from pipeline.errors import InputError, PipeError

app = typer.Typer(
    name="pipe",
    help="Train, export, compress, package and serve a PaddlePaddle model, one stage at a time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
out = Console(soft_wrap=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML run config (sections data, model, train, amp, dist, export, compress, distill, release).")
SetOpt = typer.Option(None, "--set", help="Override one key, e.g. --set train.lr=3e-3 (repeatable).")


def _version(value: bool) -> None:
    if value:
        out.print(f"pipe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors."),
) -> None:
    """`--debug` is read by `main` from the arguments (or PIPE_DEBUG=1), before Typer runs."""


def _cfg(config: Optional[Path], sets: Optional[list[str]], **flags: tuple[str, Any]) -> Any:
    from pipeline import config as config_mod  # lazy: keeps `pipe --help` fast

    return config_mod.load(config, sets or (), flags)


def _stage_out(inp: Path, out_dir: Optional[Path], stage: str) -> Path:
    return out_dir or Path(inp).parent / stage


@app.command()
def train(
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    run: Path = typer.Option(Path("runs/exp"), "--run", help="Run directory; writes RUN/train, RUN/checkpoints, RUN/logs."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write the train artifact here instead of RUN/train."),
    data: Optional[str] = typer.Option(None, "--data", help="digits, chinese_sentiment, an ImageFolder dir, an .npz, a .tsv/.csv/.jsonl of texts, or module:factory."),
    model: Optional[str] = typer.Option(None, "--model", help="digits_cnn, mlp, resnet18, mobilenet_v3_small; text: text_fasttext, text_cnn, bigru, transformer; or module:factory."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Total epochs (may be raised on resume)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Global batch size."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Processes on this node (CPU: gloo)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU ids, e.g. 0,1,2,3 (NCCL)."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="Number of nodes (with --master)."),
    master: Optional[str] = typer.Option(None, "--master", help="HOST:PORT rendezvous for multi-node runs."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", help="This node's rank (default: arrival order)."),
    amp: Optional[str] = typer.Option(None, "--amp", help="O0 (off), O1 or O2."),
    amp_dtype: Optional[str] = typer.Option(None, "--amp-dtype", help="float16 or bfloat16."),
    resume: Optional[str] = typer.Option(None, "--resume", help="'auto' (newest verified checkpoint) or a checkpoint dir."),
    init: Optional[str] = typer.Option(None, "--init", help="Fine-tune from these weights: a .pdparams or .safetensors state dict, or a train artifact dir (model.init)."),
) -> None:
    """Train data-parallel (in-process for one rank, else via paddle.distributed.launch)."""
    cfg = _cfg(config, set_, **{
        "data.source": ("--data", data), "model.name": ("--model", model), "train.epochs": ("--epochs", epochs),
        "train.batch_size": ("--batch-size", batch_size), "train.lr": ("--lr", lr),
        "dist.nproc_per_node": ("--nproc", nproc), "dist.gpus": ("--gpus", gpus), "dist.nnodes": ("--nnodes", nnodes),
        "dist.master": ("--master", master), "dist.node_rank": ("--node-rank", node_rank),
        "amp.level": ("--amp", amp), "amp.dtype": ("--amp-dtype", amp_dtype), "model.init": ("--init", init),
    })
    from stages import train as stage

    path = stage.run(cfg, out_dir or run / "train", resume=resume)
    _summary(path)


@app.command()
def export(
    train_dir: Path = typer.Argument(..., help="A train artifact directory, e.g. runs/exp/train."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write here instead of beside the input (RUN/export)."),
    onnx: bool = typer.Option(False, "--onnx", help="Also write model.onnx (paddle2onnx), parity-checked in onnxruntime."),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32 (default) or bf16: also measure oneDNN "
                                                                      "bf16 inference (fp16 on a GPU)."),
) -> None:
    """paddle.jit.save to the Paddle inference format, parity-checked against the trained model."""
    cfg = _cfg(config, set_, **{"export.precision": ("--precision", precision)})
    from stages import export as stage

    path = stage.run(cfg, train_dir, _stage_out(train_dir, out_dir, "export"), onnx=onnx)
    _summary(path)


@app.command(name="import")
def import_(
    src: Path = typer.Argument(..., help="An exported Paddle model: a directory with one <prefix>.pdmodel or <prefix>.json "
                                         "and its <prefix>.pdiparams (PaddleOCR, PaddleX), or the program file; or "
                                         "pretrained:ch_PP-OCRv4_rec_infer (the pinned wheel's, keys included)."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    run: Optional[Path] = typer.Option(None, "--run", help="Run directory; writes RUN/export (default runs/<SRC's name>)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write the export artifact here instead of RUN/export."),
    task: Optional[str] = typer.Option(None, "--task", help="What the model is: ocr_rec, ocr_det or ocr_cls (default: what inference.yml says)."),
    keys: Optional[str] = typer.Option(None, "--keys", help="ocr_rec: the character key file (default: inference.yml's character_dict)."),
    data: Optional[str] = typer.Option(None, "--data", help="Data to measure it on (default: the task's; ocr_rec: generated lines, ocr_det: pages), "
                                                           "or PaddleOCR label files: one (the test split), several comma-separated, "
                                                           "or a folder holding any of train.txt, val.txt, test.txt."),
    onnx: Optional[bool] = typer.Option(None, "--onnx/--no-onnx", help="Also convert to model.onnx, parity-checked (default on)."),
) -> None:
    """Bring someone else's exported Paddle model into the chain as an export artifact, measured and parity-checked."""
    cfg = _cfg(config, set_, **{"import.task": ("--task", task), "import.keys": ("--keys", keys),
                               "data.source": ("--data", data), "import.onnx": ("--onnx", onnx)})
    from stages import import_ as stage

    from pipeline import pretrained

    given = str(src)
    src = Path(given[len(pretrained.PREFIX):]) if given.startswith(pretrained.PREFIX) else Path(given)
    name = (src.name if given.startswith(pretrained.PREFIX) else
            (src if src.is_dir() else src.parent).resolve().name) or "import"
    path = stage.run(cfg, Path(given), out_dir or (run or Path("runs") / name) / "export")
    _summary(path)


@app.command()
def compress(
    export_dir: Path = typer.Argument(..., help="An export artifact directory, e.g. runs/exp/export."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write here instead of beside the input (RUN/compress)."),
    int8: bool = typer.Option(False, "--int8", help="Post-training int8 quantization (calibrated on the train split; without one, on the split the data has)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="paddle (PaddleSlim + oneDNN), onnxruntime, or both (default); openvino: only OpenVINO's own route (NNCF, ocr_rec)."),
    algo: Optional[str] = typer.Option(None, "--algo", help="Calibration: avg (default), KL, hist or mse."),
    calib_batches: Optional[int] = typer.Option(None, "--calib-batches", help="Calibration batches of 32 (default: up to 10, all of a smaller train split)."),
    max_drop: Optional[float] = typer.Option(None, "--max-drop", help="Gate: max int8 test accuracy drop in points (default 1.0; exit 4)."),
    distill: bool = typer.Option(False, "--distill", help="Distil the export's model into --student first (uses train.*, distill.*)."),
    student: Optional[str] = typer.Option(None, "--student", help="Student model for --distill, e.g. mlp."),
    baseline: bool = typer.Option(False, "--baseline", help="--distill: also train the student alone, to measure the gain."),
) -> None:
    """int8 post-training quantization (PaddleSlim and/or onnxruntime) and distillation, measured against fp32 and gated."""
    cfg = _cfg(config, set_, **{
        "compress.int8": ("--int8", True if int8 else None), "compress.backend": ("--backend", backend),
        "compress.algo": ("--algo", algo), "compress.calib_batches": ("--calib-batches", calib_batches),
        "compress.max_drop": ("--max-drop", max_drop), "compress.distill": ("--distill", True if distill else None),
        "compress.student": ("--student", student), "compress.baseline": ("--baseline", True if baseline else None),
    })
    from stages import compress as stage

    path = stage.run(cfg, export_dir, _stage_out(export_dir, out_dir, "compress"))
    _summary(path)


@app.command()
def package(
    model_dirs: list[Path] = typer.Argument(..., help="A compress or export artifact directory; or an OCR system's "
                                            "parts: an ocr_det, optionally an ocr_cls, and an ocr_rec artifact or "
                                            "package, in any order (one package serving /v1/ocr)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write here instead of beside the input (RUN/package; "
                                           "an OCR system: beside the first input, RUN/ocr_system)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32, bf16 or int8 (compress input); default: "
                                            "any measured (compress), fp32 (export)."),
    engine: str = typer.Option("auto", "--engine", help="auto (fastest measured within budget), paddle, onnxruntime "
                                                        "or openvino."),
    optimize: str = typer.Option("balanced", "--optimize", help="auto's criterion: balanced (batch 1 and the throughput "
                                                                "batch: 32, ocr_det 4 pages), latency (batch 1) or "
                                                                "throughput."),
    variant: Optional[str] = typer.Option(None, "--variant", help="A compress variant by name (e.g. int8-onnx)."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name (Triton repository); default: the model's."),
    max_batch_size: int = typer.Option(0, "--max-batch-size", help="Dynamic batching: samples per predictor run "
                                      "(0: the task's default, 32; ocr_det 4 pages)."),
    max_wait_ms: float = typer.Option(2.0, "--max-wait-ms", help="Dynamic batching: wait for more requests (ms)."),
    triton: bool = typer.Option(True, "--triton/--no-triton", help="Also write the Triton model repository (ONNX)."),
    drop_score: float = typer.Option(0.5, "--drop-score", help="OCR system: drop a line whose recognition score is "
                                                               "below this (PaddleOCR's drop_score)."),
) -> None:
    """Build a self-contained serving package: model, serving.yaml, Paddle Serving and Triton configs; or, given an
    OCR system's parts, one package of them all."""
    from stages import package as stage

    cfg = stage.PackageConfig(precision=precision or "", engine=engine, optimize=optimize, variant=variant or "",
                              name=name or "", max_batch_size=max_batch_size,
                              max_wait_ms=max_wait_ms, triton=triton)
    if len(model_dirs) > 1:
        from pipeline.ocr_system import package as ocr_package

        _summary(ocr_package.compose(cfg, model_dirs, _stage_out(model_dirs[0], out_dir, ocr_package.STAGE),
                                     stage.run, drop_score))
        return
    (model_dir,) = model_dirs
    _summary(stage.run(cfg, model_dir, _stage_out(model_dir, out_dir, "package")))


@app.command()
def serve(
    package_dir: Path = typer.Argument(..., help="A package directory (pipe package)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but 127.0.0.1 warns."),
    port: int = typer.Option(8000, "--port", help="TCP port (0 = any free port, printed at start)."),
    grpc_port: int = typer.Option(0, "--grpc-port", help="Also serve the Open Inference Protocol over gRPC "
                                                         "(tritonclient.grpc) on this port; 0 = off."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Run the package on this engine (paddle, onnxruntime, "
                                                                "openvino) if it holds files it runs; default: the package's."),
    device: str = typer.Option("cpu", "--device", help="cpu, or gpu / gpu:N (the same code path; not run on a GPU "
                                                       "by us)."),
    http_workers: Optional[int] = typer.Option(None, "--http-workers", help="HTTP processes on the one port, each with "
                                                                           "its own predictors (0 = one per core, at most 4)."),
    predictors: Optional[int] = typer.Option(None, "--predictors", help="Predictors in the pool (per HTTP process)."),
    predictor_mode: Optional[str] = typer.Option(None, "--predictor-mode", help="auto (onnxruntime and OpenVINO in the "
                                                 "HTTP process, Paddle Inference in child processes), process or in-process."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads per predictor (0 = the cores left by the "
                                                                   "HTTP processes, shared)."),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="Samples per run (package default)."),
    max_wait_ms: Optional[float] = typer.Option(None, "--max-wait-ms", help="Batching wait in ms (package default)."),
    queue_size: Optional[int] = typer.Option(None, "--queue-size", help="Waiting requests before 503."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout", help="Per-request timeout in s (504)."),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help="Request body cap (413)."),
    drain_s: Optional[float] = typer.Option(None, "--drain", help="SIGTERM: seconds to finish in-flight requests."),
) -> None:
    """Serve a package over HTTP (FastAPI + uvicorn) with dynamic batching; 127.0.0.1 unless --host."""
    from stages import serve as stage

    cfg = stage.ServeConfig(host=host, port=port, grpc_port=grpc_port, engine=engine or "", device=device, http_workers=http_workers,
                            predictors=predictors, predictor_mode=predictor_mode,
                            threads=threads,
                            max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, queue_size=queue_size,
                            timeout_s=timeout_s, max_body_bytes=max_body_bytes, drain_s=drain_s)
    stage.run(cfg, package_dir)


@app.command()
def predict(
    package_dir: Path = typer.Argument(..., help="A package directory (pipe package), or an OCR system package."),
    inputs: list[str] = typer.Argument(..., help="Files, folders (recursive), globs, @list.txt; PDFs page by page; "
                                                 "text packages: .txt, .tsv, .jsonl."),
    out_dir: Path = typer.Option(..., "--out", help="Where predictions.jsonl, errors.jsonl and summary.json go "
                                                    "(a rerun resumes)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Predictor processes (default: from the usable "
                                                                  "cores, at most 4)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Math threads per predictor (default: cores / "
                                                                  "workers)."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Items per run (OCR system: pages); default: the "
                                                              "package's max_batch_size."),
    dpi: float = typer.Option(144.0, "--dpi", help="PDF pages are rendered at this resolution."),
    draw: bool = typer.Option(False, "--draw", help="Draw boxes, polygons and texts on each image or page into "
                                                    "DIR/draw/."),
    field: str = typer.Option("text", "--field", help="Text packages: the .jsonl member or .tsv column of the text."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Run on this engine if it reads the package's files; "
                                                                "default: the package's."),
    device: str = typer.Option("cpu", "--device", help="cpu, or gpu / gpu:N."),
    predictor_mode: Optional[str] = typer.Option(None, "--predictor-mode", help="auto, process or in-process (as pipe "
                                                                               "serve's); default: the package's."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run on a Ray cluster: local, auto or HOST:PORT (pip "
                                                          "install 'paddle-pipe[ray]'); inputs must be readable on "
                                                          "every node."),
) -> None:
    """Run a package over files, folders, globs, lists, PDFs or text files into DIR: one row per item, resumable;
    exit 5 when some items failed (errors.jsonl)."""
    from stages import predict as stage

    cfg = stage.PredictConfig(workers=workers, threads=threads, batch=batch, dpi=dpi, draw=draw, field=field,
                              engine=engine or "", device=device, predictor_mode=predictor_mode or "", ray=ray or "")
    s = stage.run(cfg, package_dir, inputs, out_dir)
    if s["failed"] + s["previously_failed"]:
        raise stage.FailedItems(f"{s['failed'] + s['previously_failed']} of {s['items']} items failed; see "
                                f"{s['errors']}")


@app.command()
def bench(
    dirs: Optional[list[Path]] = typer.Argument(None, help="export, compress or package directories to measure; "
                                                           "none = the project's benchmark suite."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="With DIRs: also write the rows as JSON here."),
    out_file: Path = typer.Option(Path("bench/RESULTS.md"), "--out", help="The suite: where to write the table."),
    quick: bool = typer.Option(False, "--quick", help="Fewer timed runs (a smoke run)."),
) -> None:
    """Measure artifacts on this machine (format, status, size, accuracy, p50/p99, items/s; says which is
    fastest), or with no DIR run the benchmark suite into a Markdown table."""
    if dirs:
        from pipeline import artifacts
        from pipeline.bench import measure

        rows = measure.measure(dirs, quick=quick)
        print(measure.render_table(rows))  # plain print: statuses may contain [brackets]
        if json_file:
            artifacts.write_text_atomic(json_file, json.dumps(measure.to_json(rows), indent=2) + "\n")
            out.print(f"wrote {json_file}")
        return
    from pipeline import bench as bench_mod

    bench_mod.run(out_file, quick=quick)
    out.print(f"wrote {out_file}")


@app.command(name="all")
def all_(
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    run: Path = typer.Option(Path("runs/exp"), "--run", help="Run directory filled stage by stage."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Passed to the train stage (reruns training)."),
    init: Optional[str] = typer.Option(None, "--init", help="Fine-tune from these weights: a .pdparams or .safetensors state dict, or a train artifact dir (model.init)."),
    force: Optional[str] = typer.Option(None, "--force", help="Rerun this stage and every later one, cached or not: "
                                                              "train, export, compress or package (import: "
                                                              "the import that stands for train and export)."),
    pick: Optional[str] = typer.Option(None, "--pick", help="What to package: fastest (default), smallest or fp32 "
                                                            "(within compress.max_drop)."),
) -> None:
    """train -> export -> compress -> package -> report into one run directory; unchanged stages are cached.

    Exit codes: 2 bad input, 3 training diverged, 4 accuracy gate (int8 drop, release.min_accuracy),
    5 parity gate (export, ONNX), 6 missing or unverifiable artifact."""
    cfg = _cfg(config, set_, **{"release.pick": ("--pick", pick), "model.init": ("--init", init)})
    from stages import all_ as orchestrate

    t0 = time.perf_counter()
    results = orchestrate.run_all(cfg, run, resume=resume, force=force, say=out.print,
                                  on_stage=lambda r: _summary(r.path, prefix="cached " if r.status == "cached" else ""))
    ran = [f"{r.stage} {r.seconds:.1f} s" for r in results if r.status == "ran"]
    cached = [r.stage for r in results if r.status == "cached"]
    out.print(f"pipe all: done in {time.perf_counter() - t0:.1f} s  ran: {', '.join(ran) or 'nothing'}"
              f"  cached: {', '.join(cached) or 'nothing'}")


@app.command()
def inspect(
    artifact_dir: Path = typer.Argument(..., help="Any stage directory."),
    verify: bool = typer.Option(False, "--verify", help="Check every file's sha256 along the lineage; for a "
                                "package also run its reference set here, as pipe serve does (exit 4 below budget)."),
) -> None:
    """Print an artifact's manifest summary and its lineage back to training."""
    from rich.table import Table

    from pipeline import artifacts

    stages = ("train", "export", "compress", "package", "checkpoint", "ocr_system")
    art = artifacts.verify(artifact_dir, stages) if verify else artifacts._load_unchecked(Path(artifact_dir))
    table = Table(title=f"{art.path}", show_header=True)
    for col in ("stage", "path", "created", "key metrics", "status"):
        table.add_column(col, overflow="fold")
    chain = artifacts.lineage(art, check=verify)
    for item, note in chain:
        if item is None:
            table.add_row("?", "", "", "", f"[red]{note}[/red]")
            continue
        m = item.manifest
        metrics = m.get("metrics", {})
        shown = [f"{k}={_fmt(metrics[k])}" for k in _KEY_METRICS.get(m.get("stage"), ()) if k in metrics]
        status = note or ("verified" if verify else "")
        table.add_row(m.get("stage", "?"), _short(item.path), m.get("created", "").replace("T", " "),
                      "\n".join(shown), status)
    (out if out.is_terminal else Console(width=110)).print(table)  # logs and pipes: not 80 columns
    iface = art.manifest.get("interface") or {}
    for io in iface.get("inputs", []):
        out.print(f"input  {io['name']}: {io['dtype']} {io['shape']}")
    if iface.get("labels"):
        out.print(f"labels {len(iface['labels'])}: {', '.join(iface['labels'][:12])}")
    for item, _ in chain:  # a fine-tuned training's starting weights (model.init)
        if item is not None and item.manifest.get("init"):
            from pipeline.nets import weights

            print(weights.describe(item.manifest["init"], check=verify))  # plain print: [status] brackets
    if verify and art.manifest.get("stage") == "package":  # its numbers on this CPU, as pipe serve checks them
        from pipeline import reference

        reference.verify_here(art.path)
    if verify and art.manifest.get("stage") == "ocr_system":  # every part's, as pipe serve checks them
        from pipeline import reference
        from pipeline.ocr_system import package as ocr_package

        for role in ocr_package.load(art.path).parts:
            out.print(f"{role}:")
            reference.verify_here(art.path / role)


_KEY_METRICS = {
    "train": ("test_acc", "epochs_run", "world_size"),
    "export": ("test_acc", "parity_rel"),
    "compress": ("fp32_accuracy", "best_int8", "int8_drop_points"),
    "package": ("engine", "precision", "variant", "variant_accuracy"),
    "checkpoint": ("step", "epoch"),
    "ocr_system": ("e2e_acc", "det_hmean", "lines", "det_engine", "rec_engine"),
}


def _short(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _summary(path: Path, prefix: str = "") -> None:
    from pipeline import artifacts

    m = json.loads((Path(path) / "manifest.json").read_text())
    shown = {k: v for k, v in artifacts.current_names(m["metrics"]).items()
             if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    out.print(f"{prefix}[green]{m['stage']}[/green] -> {path}  " + "  ".join(f"{k}={_fmt(v)}" for k, v in list(shown.items())[:6]))


def _command_name(argv: list[str]) -> str:
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    return next((a for a in argv if a in names), "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = _command_name(argv)
    prefix = f"pipe {cmd}:" if cmd else "pipe:"
    debug = "--debug" in argv or os.environ.get("PIPE_DEBUG") == "1"
    try:
        app(args=argv or ["--help"], prog_name="pipe", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except TyperException as e:  # usage errors: unknown flag, missing argument, bad value
        print(f"{prefix} error: {e.format_message()}", file=sys.stderr)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        print(f"{prefix} interrupted", file=sys.stderr)
        return 130
    except PipeError as e:
        if debug:
            raise
        kind = "error: " if isinstance(e, InputError) else ""
        print(f"{prefix} {kind}{e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # an internal error: one line, the traceback with --debug
        if debug:
            raise
        print(f"{prefix} internal error: {e.__class__.__name__}: {e} (re-run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
