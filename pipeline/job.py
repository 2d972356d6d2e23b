"""The life of a training job: one writer per run directory, stopping on a signal, dying with the parent.

- `run_lock(run_dir)`: an advisory `fcntl.flock` on `RUN/.lock`, held for the job's life (re-entrant in one
  process, so `pipe all` holds it around the `pipe train` it runs). The kernel drops it when its holder
  dies, so a crash never leaves a stale lock. The launcher of a multi-process job inherits the locked file,
  so the run stays locked until the launcher, which outlives its ranks, has exited.
- `stop_on_signals()`: SIGTERM/SIGINT raise `Stopped` in the main thread (the CLI prints one line and exits
  128 + signal number); inside `critical()` the signal waits until the block ends, so a checkpoint being
  written is finished, never cut.
- `die_with_parent(sig)`: `prctl(PR_SET_PDEATHSIG)`: the kernel sends `sig` to this process when its parent
  exits, whatever killed the parent (SIGKILL included). Paddle's launcher starts every rank in a session of
  its own and never does this, so SIGKILL of `pipe` (or of its process group) used to leave the launcher and
  the ranks training, parent 1.

No paddle import here.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Iterator

from pipeline.errors import InputError, PipeError

LOCK_NAME = ".lock"
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_held: dict[Path, tuple[int, int]] = {}  # resolved lock file -> (fd, depth): the locks this process holds
_deferred: list[int] = []  # signals received inside critical(), delivered when it ends
_critical_depth = 0


class Stopped(PipeError):
    """The job was stopped by a signal; exit 128 + its number, as a shell reports it."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")


# ------------------------------------------------------------------ one writer per run


@contextlib.contextmanager
def run_lock(run_dir: Path, what: str, name: str = LOCK_NAME) -> Iterator[int]:
    """Hold RUN/`name` for the block; yields its fd (to hand to child processes). A run another live job
    holds is refused at once with the holder's PID (InputError, exit 2)."""
    run_dir = Path(run_dir)
    key = run_dir.resolve() / name
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
        try:
            yield fd
        finally:
            fd, depth = _held[key]
            _held[key] = (fd, depth - 1)
        return
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = _acquire(key)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
    _held[key] = (fd, 1)
    try:
        yield fd
    finally:
        del _held[key]
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(key).st_ino:
                os.unlink(key)  # still locked by us: nobody can be between open and flock on it
        os.close(fd)  # the kernel drops the lock with the last fd of it (a launcher may still hold one)
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # a job that failed before writing anything leaves no run directory


def _acquire(path: Path) -> int:
    """flock the file at `path`; the file a holder unlinked on release is retried, so two jobs never both
    hold a lock (one on the unlinked file, one on its successor)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise InputError(f"{path.parent}: another job is writing this run: {holder(path)}; "
                             "wait for it or stop it, or use another --run") from None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def lock_name(nnodes: int, node_rank: int = -1) -> str:
    """`.lock`; a multi-node job, whose nodes may share the run directory, locks one file per node
    (`.lock.node-R`, or `.lock.HOST` when the rank is given by arrival order)."""
    if nnodes == 1:
        return LOCK_NAME
    return f"{LOCK_NAME}.node-{node_rank}" if node_rank >= 0 else f"{LOCK_NAME}.{socket.gethostname()}"


def note_launcher(fd: int, pid: int) -> None:
    """Record the launcher's PID in the lock file beside ours (it holds the lock after we are gone)."""
    line = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()[:1]
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("\n".join(line + [f"{pid} paddle.distributed.launch"]) + "\n").encode(), 0)


def holder(lock: Path) -> str:
    """Who holds a lock file, from what the holder wrote: 'PID 123 (pipe train)'."""
    try:
        lines = Path(lock).read_text().splitlines()
    except OSError:
        return "PID unknown"
    rows = [ln.split(" ", 1) for ln in lines if ln.split(" ", 1)[0].isdigit()]
    picked = [r for r in rows if alive(int(r[0]))] or rows[:1]
    return ", ".join(f"PID {p[0]} ({p[1] if len(p) > 1 else '?'})" for p in picked) or "PID unknown"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------ stopping


def _on_signal(signum: int, frame: object) -> None:
    if _critical_depth:
        _deferred.append(signum)
        return
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """In the main thread: SIGTERM and SIGINT raise `Stopped` for the block (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    for s in _STOP_SIGNALS:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """A block a stop signal must not cut (committing a checkpoint): the signal is held until it ends, then
    delivered to whatever handled it before (`Stopped`, or the default action that ends a rank)."""
    global _critical_depth
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS} if main and not _critical_depth else None
    if previous:
        for s in _STOP_SIGNALS:
            signal.signal(s, _on_signal)
    _critical_depth += 1
    try:
        yield
    finally:
        _critical_depth -= 1
        if previous:
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            if _deferred:
                signum = _deferred[0]
                _deferred.clear()
                signal.raise_signal(signum)  # the handler before us acts on it now


# ------------------------------------------------------------------ dying with the parent


def die_with_parent(sig: int, parent: int) -> None:
    """Ask the kernel for `sig` when our parent exits; if `parent` is already gone (we were re-parented
    before asking), act on it now. Safe in a `preexec_fn` (no allocation beyond ctypes' call)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
