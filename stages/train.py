"""pipe train: data-parallel training, writing `<run>/train/` (best weights, metrics, curves, manifest).

    pipe train --config examples/digits.yaml --run runs/exp1
    pipe train --config examples/digits.yaml --run runs/exp1 --nproc 2     # 2 CPU processes (gloo)
    pipe train --config examples/digits.yaml --run runs/exp1 --resume auto

Reads: a dataset (`data.source`), no input artifact. Writes, beside `train/`:
`checkpoints/step-NNNNNN/` (model, optimizer, scheduler, scaler, RNG and sampler state; `last` and
`best` pointers; pipeline/checkpoint.py), `vdl/` (VisualDL scalars, pipeline/vdl.py) and `logs/train/`
(the launcher's logs, which hold a dump of the environment). `.lock` is held while the job runs
(pipeline/job.py: one writer, stopping on SIGTERM/SIGINT, ranks that die with their parent).
World size 1 runs in this process; more ranks run through `python -m paddle.distributed.launch`,
which also does multi-node (`--nnodes K --master HOST:PORT`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from pipeline import artifacts, checkpoint, config as config_mod, job, runtime, tasks, trainer
from pipeline.config import RunConfig
from pipeline.errors import DivergedError, InputError, PipeError
from pipeline.nets import weights
from pipeline.progress import Emit, Tail, View, file_emitter

# Keys that may change between a checkpoint and its resumption; any other change alters the model,
# the data or their order and is refused.
_RESUME_SAFE = {
    "train.epochs", "train.patience", "train.checkpoint_every", "train.keep_last", "train.log_interval",
    "train.max_nonfinite_steps", "data.num_workers", "data.persistent_workers", "data.cache_dir",
    "dist.nproc_per_node", "dist.gpus", "dist.nnodes", "dist.master", "dist.node_rank", "dist.peer_timeout",
}
# Keys that cannot change the weights of a finished run: with them alone changed, `--resume auto` on it is done.
_FINISHED_SAFE = _RESUME_SAFE - {"train.epochs", "train.patience"}
_TRAINING_SECTIONS = ("data", "model", "train", "amp", "dist", "distill", "finetune")  # later stages' keys don't matter
# Why a key other than the model's and the data's is refused on resume.
_RESUME_REFUSED_WHY = {"train.monitor": "it chose the best checkpoint and counted patience so far"}


# ------------------------------------------------------------------ parent side


@contextlib.contextmanager
def _paddle_sigchld_undone() -> Iterator[None]:
    """Training in this process: afterwards, SIGCHLD is handled as before it.

    A multi-process DataLoader (`data.num_workers` > 0) installs, once per process, a SIGCHLD handler that
    calls Paddle's C++ `_throw_error_if_process_failed()` on every child exit. Left in place, it ran on
    each later child of the process (git, the compress and paddle2onnx children, predictor processes)
    while the finished loader's threads were still alive: a long test process died with SIGSEGV or a
    corrupt heap right after a `subprocess.run`, 5 runs out of 5 once the suite started more children.
    Paddle's own flag is reset, so the next in-process training installs its handler again."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGCHLD) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)
            for name in ("paddle.io.multiprocess_utils", "paddle.base.multiprocess_utils"):
                mod = sys.modules.get(name)
                if mod is not None and hasattr(mod, "_SIGCHLD_handler_set"):
                    mod._SIGCHLD_handler_set = False


def run(cfg: RunConfig, out_dir: Path, resume: str | None = None, view: Emit | None = None) -> Path:
    """Train and write `out_dir`. Checkpoints and logs go beside it in the run directory.

    The run directory is locked for the job's life (one writer); SIGTERM/SIGINT stop every rank and
    raise `job.Stopped`."""
    out_dir = Path(out_dir)
    run_dir = out_dir.parent
    ckpt_dir = run_dir / "checkpoints"
    world, local = _preflight(cfg)
    if cfg.model.init:
        init = weights.source(cfg.model.init)  # a bad model.init fails here, before a lock, a log or a launcher
        if init.kind == "program":
            trainer.check_program_task(cfg, init)
    view = view or View()
    with job.run_lock(run_dir, "pipe train", job.lock_name(cfg.dist.nnodes, cfg.dist.node_rank)) as lock_fd, job.stop_on_signals():
        if resume == "auto" and _finished(out_dir, cfg):
            view({"event": "notice", "text": f"{out_dir} is done and was made from this training config; "
                                              "nothing to resume"})
            return out_dir
        resume_from = _resolve_resume(resume, ckpt_dir, cfg)
        try:
            if local == 1 and world == 1:
                with _paddle_sigchld_undone():
                    trainer.worker(cfg, out_dir, ckpt_dir, resume_from, emit=view)
            else:
                _launch(cfg, out_dir, ckpt_dir, resume_from, run_dir, view, local, lock_fd)
        except job.Stopped as e:
            last = checkpoint.read_pointer(ckpt_dir, "last")
            raise job.Stopped(e.signum, f"stopped by {signal.Signals(e.signum).name}: every rank has exited; "
                                        f"last checkpoint {last or 'none'} (continue with --resume auto)") from None
    return out_dir


def _preflight(cfg: RunConfig) -> tuple[int, int]:
    """Check what was asked against what is there; returns (world size, processes on this node)."""
    d = cfg.dist
    gpus = [g.strip() for g in d.gpus.split(",") if g.strip()]
    if gpus:
        try:
            metadata.version("paddlepaddle-gpu")
        except metadata.PackageNotFoundError:
            raise InputError(f"--gpus {d.gpus}: this Paddle is the CPU build (paddlepaddle); "
                             "install paddlepaddle-gpu, or use --nproc for CPU processes") from None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            have = [v for v in visible.split(",") if v.strip()]
            if len(have) < len(gpus):
                raise InputError(f"--gpus {d.gpus}: CUDA_VISIBLE_DEVICES={visible} shows {len(have)} device(s)")
        paddle = runtime.import_paddle()
        count = paddle.device.cuda.device_count()
        missing = [g for g in gpus if not g.isdigit() or int(g) >= count]
        if missing:
            raise InputError(f"--gpus {d.gpus}: device {missing[0]} not found ({count} visible GPU(s))")
        local = len(gpus)
        if d.nproc_per_node not in (1, local):
            raise InputError(f"--nproc {d.nproc_per_node}: with --gpus, one process per GPU ({local})")
    else:
        local = d.nproc_per_node
        cores = os.cpu_count() or 1
        if local > cores:
            print(f"warning: --nproc {local} is above this machine's {cores} cores; ranks will share cores",
                  file=sys.stderr)
    if d.nnodes > 1 and not d.master:
        raise InputError(f"--nnodes {d.nnodes}: multi-node runs need --master HOST:PORT")
    if d.master:
        host, _, port = d.master.rpartition(":")
        if not host or not port.isdigit():
            raise InputError(f"--master {d.master}: expected HOST:PORT")
        if _port_busy(host, int(port)):
            if d.nnodes == 1:
                raise InputError(f"--master {d.master}: port {port} is already in use")
            print(f"note: --master {d.master} is already listening; joining it as a peer", file=sys.stderr)
    task = tasks.get(cfg.model.task)
    allowed = [*(f"val_{m}" for m in task.metrics), "val_loss"]
    if cfg.train.monitor and cfg.train.monitor not in allowed:
        raise InputError(f"train.monitor: must be one of {', '.join(allowed)} for task {task.name}, "
                         f"got {cfg.train.monitor!r}")
    world = local * d.nnodes
    if cfg.train.batch_size % world:
        raise InputError(f"train.batch_size {cfg.train.batch_size}: must divide evenly over {world} ranks")
    return world, local


def _port_busy(host: str, port: int) -> bool:
    if host not in ("127.0.0.1", "localhost", "0.0.0.0", socket.gethostname()):
        return False  # only ports on this machine can be checked
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0  # a local listener on any address answers here


def _resolve_resume(resume: str | None, ckpt_dir: Path, cfg: RunConfig) -> Path | None:
    if resume is None:
        if checkpoint.step_dirs(ckpt_dir):
            raise InputError(f"{ckpt_dir}: holds checkpoints of an earlier run; "
                             "pass --resume auto to continue it, or use another --run")
        return None
    if resume == "auto":
        found = checkpoint.newest_verified(ckpt_dir)
        if found is None:
            return None
        path = found
    else:
        path = Path(resume)
    art = artifacts.verify(path, (checkpoint.STAGE,))
    state = json.loads(art.file("state.json").read_text())
    _check_resume_config(state["config"], cfg, path)
    done = state["batch"] == 0 and cfg.train.epochs <= state["epoch"]
    # --resume auto on checkpoints that finished this config's epochs (the job died before writing train/):
    # the loop is skipped and train/ is written from them
    if done and not (resume == "auto" and cfg.train.epochs == state["epoch"]):
        raise InputError(f"--resume {path}: nothing to resume, {state['epoch']} of train.epochs="
                         f"{cfg.train.epochs} epochs are done (raise train.epochs to train more)")
    return path


def _check_resume_config(saved: dict[str, Any], cfg: RunConfig, path: Path) -> None:
    for name, old, new in _config_changes(saved, cfg, _RESUME_SAFE):
        why = _RESUME_REFUSED_WHY.get(name, "it changes the model or the data")
        old, new = (f"{v!r} (the task's metric)" if name == "train.monitor" and v == "" else repr(v) for v in (old, new))
        raise InputError(f"--resume {path}: {name} was {old}, now {new}; {why}, start a new run instead")


def _config_changes(saved: dict[str, Any], cfg: RunConfig, ignore: set[str]) -> Iterator[tuple[str, Any, Any]]:
    """(key, old, new) for each training key outside `ignore` that differs from the saved config."""
    now, defaults = cfg.to_dict(), RunConfig().to_dict()
    for section in _TRAINING_SECTIONS:
        old_body, new_body = saved.get(section, {}), now[section]
        for key in {**old_body, **new_body}:
            name = f"{section}.{key}"
            old = old_body.get(key, defaults[section].get(key))  # a key newer than the checkpoint ran at its default
            new = new_body.get(key)
            if name not in ignore and old != new:
                yield name, old, new


def _finished(out_dir: Path, cfg: RunConfig) -> bool:
    """`--resume auto` on a done run: its train/ verifies and was made from this training config (keys that
    cannot change a finished run's weights aside; a raised train.epochs or patience trains on)."""
    if not (out_dir / "manifest.json").is_file():
        return False
    try:
        art = artifacts.verify(out_dir, ("train",))
    except InputError:
        return False  # damaged: the checkpoints rewrite it
    return next(_config_changes(art.manifest["config"], cfg, _FINISHED_SAFE), None) is None


def _launch(cfg: RunConfig, out_dir: Path, ckpt_dir: Path, resume_from: Path | None,
            run_dir: Path, view: Emit, local: int, lock_fd: int) -> None:
    """Run the ranks of this node through paddle.distributed.launch and wait for them.

    The launcher gets SIGTERM from the kernel when this process dies (even by SIGKILL), and holds the run
    lock until it has exited; its own SIGTERM handler stops the ranks, which also die with it."""
    d = cfg.dist
    node = "" if d.nnodes == 1 else f"node-{d.node_rank if d.node_rank >= 0 else os.getpid()}"
    log_dir = run_dir / "logs" / "train" / node if node else run_dir / "logs" / "train"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    spec = {"config": cfg.to_dict(), "out_dir": str(out_dir.resolve()), "ckpt_dir": str(ckpt_dir.resolve()),
            "resume_from": str(resume_from.resolve()) if resume_from else None, "log_dir": str(log_dir.resolve())}
    (log_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(log_dir), "--nnodes", str(d.nnodes)]
    if d.gpus:
        cmd += ["--gpus", d.gpus]
    else:
        cmd += ["--nproc_per_node", str(local)]
    if d.master:
        cmd += ["--master", d.master]
    if d.node_rank >= 0:
        cmd += ["--rank", str(d.node_rank)]
    cmd += [str(Path(__file__).resolve()), "--spec", str(log_dir / "spec.json")]
    env = dict(os.environ, OMP_NUM_THREADS=str(runtime.threads_per_process(local)), GLOG_minloglevel="2",
               PIPE_JOB_PID=str(os.getpid()))
    me = os.getpid()
    events = log_dir / "events.jsonl"
    events.touch()
    tail = Tail(events, view)
    tail.start()
    with open(log_dir / "launcher.log", "wb") as launcher_log:
        proc = subprocess.Popen(cmd, stdout=launcher_log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                pass_fds=(lock_fd,), preexec_fn=lambda: job.die_with_parent(signal.SIGTERM, me))
        job.note_launcher(lock_fd, proc.pid)
        try:
            code = _wait(proc, log_dir, d.peer_timeout)
        except BaseException:
            _kill(proc)
            raise
        finally:
            tail.stop()
    if code != 0:
        raise _worker_failure(log_dir, code)


def _wait(proc: subprocess.Popen, log_dir: Path, peer_timeout: int) -> int:
    """Wait for the launcher; the launcher waits for missing peers forever, so we bound that."""
    started = time.monotonic()
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if not any(log_dir.glob("workerlog.*")) and time.monotonic() - started > peer_timeout:
            _kill(proc)
            raise PipeError(f"the job did not start within dist.peer_timeout={peer_timeout} s "
                            f"(waiting for peers at --master?); see {log_dir / 'launcher.log'}")


def _kill(proc: subprocess.Popen) -> None:
    """Stop the launcher: SIGTERM (it stops the ranks: rank 0 finishes a checkpoint it is committing), then
    SIGKILL after 10 s; ranks die with it (`_worker_main`), so nothing of the job outlives this call."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _worker_failure(log_dir: Path, code: int) -> PipeError:
    statuses = sorted(log_dir.glob("status.*.json"), key=lambda p: int(p.stem.split(".")[1]))
    if statuses:
        st = json.loads(statuses[0].read_text())
        err = {2: InputError, 3: DivergedError}.get(st["exit_code"], PipeError)(st["message"])
        err.exit_code = st["exit_code"]
        return err
    logs = sorted(log_dir.glob("workerlog.*"))
    last = ""
    for log in logs:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if lines and ("Error" in lines[-1] or "Exception" in lines[-1]):
            last = f": {lines[-1].strip()[:200]}"
            break
    return PipeError(f"a worker failed (launcher exit {code}){last}; logs in {log_dir}")


# ------------------------------------------------------------------ a launched rank (pipeline/trainer.py trains)


def _worker_main(argv: list[str]) -> int:
    """Entry of a rank started by paddle.distributed.launch."""
    # The launcher starts each rank in a session of its own: the rank dies with the launcher (SIGKILL from the
    # kernel), and does not start at all when pipe, which started the launcher, is already gone.
    job.die_with_parent(signal.SIGKILL, os.getppid())
    if not job.alive(int(os.environ.get("PIPE_JOB_PID", os.getppid()))):
        return 143
    spec = json.loads(Path(argv[argv.index("--spec") + 1]).read_text())
    log_dir = Path(spec["log_dir"])
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    emit = file_emitter(log_dir / "events.jsonl") if rank == 0 else (lambda ev: None)
    try:
        cfg = config_mod.from_dict(spec["config"])
        resume = Path(spec["resume_from"]) if spec["resume_from"] else None
        trainer.worker(cfg, Path(spec["out_dir"]), Path(spec["ckpt_dir"]), resume, emit)
    except PipeError as e:
        (log_dir / f"status.{rank}.json").write_text(json.dumps({"exit_code": e.exit_code, "message": str(e)}))
        print(f"rank {rank}: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv))
