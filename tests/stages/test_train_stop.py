"""Stopping a training job (RELIABILITY §2b) and resuming a finished one (§2), with real processes:
`pipe train --nproc 2` through paddle.distributed.launch, stopped by SIGTERM, by SIGKILL of pipe alone and
of its process group; no process of the job may outlive the bound, and `--resume auto` then ends with the
uninterrupted run's weights. One writer per run directory; `--resume auto` on a finished run is done."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import artifacts, job
from tests.conftest import REPO, tree_hash

DIGITS = REPO / "examples" / "digits.yaml"
PIPE = [sys.executable, "-m", "pipeline.cli"]
# 2 ranks of the MLP, a checkpoint every 4 steps; each checkpoint write sleeps (a test hook) so that the
# job is still running, and often inside a checkpoint write, when the signal comes.
TWO_RANKS = ["--config", str(DIGITS), "--model", "mlp", "--epochs", "4", "--nproc", "2",
             "--set", "train.checkpoint_every=4"]
SLOW = {"PIPE_FAULT_SLOW_CHECKPOINT": "0.4"}


def _job_processes(run: Path) -> list[str]:
    """Every process whose command line names this run (pipe, the launcher, the ranks)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines()[1:] if str(run) in ln and "ps -ww" not in ln]


def _start(run: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`pipe train` in its own process group, as a shell or a CI runner would start it."""
    return subprocess.Popen([*PIPE, "train", "--run", str(run), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})),
                            start_new_session=True, cwd=REPO)


def _wait_for(pred, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _gone_within(run: Path, seconds: float) -> list[str]:
    """The job's processes still alive after `seconds` (empty when all exited in time)."""
    deadline = time.monotonic() + seconds
    while (left := _job_processes(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _reap(procs: list[subprocess.Popen], run: Path) -> None:
    """Never leave a process of the job behind, even when the test failed."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for line in _job_processes(run):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The same 2-rank job run to the end without a stop: the weights every resumed run must reach."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = subprocess.run([*PIPE, "train", "--run", str(run), *TWO_RANKS], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return run / "train" / "model.safetensors"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigkill-pipe", "sigkill-group"])
def test_a_stopped_job_leaves_no_process_and_resumes_to_the_same_weights(how, tmp_path, uninterrupted):
    run = tmp_path / "run"
    proc = _start(run, *TWO_RANKS, env=SLOW)
    try:
        # stop it while rank 0 is committing a checkpoint (after the first one, so there is one to resume)
        _wait_for(lambda: (run / "checkpoints" / "last").exists(), "the first checkpoint")
        _wait_for(lambda: any((run / "checkpoints").glob("step-*.tmp-*")), "a checkpoint being written")
        writing = next((run / "checkpoints").glob("step-*.tmp-*")).name.split(".tmp-")[0]
        assert len(_job_processes(run)) == 4  # pipe, the launcher, two ranks
        if how == "sigterm":
            os.kill(proc.pid, signal.SIGTERM)
        elif how == "sigkill-pipe":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        left = _gone_within(run, 30 if how == "sigterm" else 10)
        assert left == [], f"{how}: job processes survived: {left}"
        if how == "sigterm":
            assert proc.returncode == 128 + signal.SIGTERM
            lines = [ln for ln in err.splitlines() if ln.startswith("pipe train:")]
            assert len(lines) == 1 and "Traceback" not in err
            assert lines[0].startswith("pipe train: stopped by SIGTERM: every rank has exited; last checkpoint step-")
            # rank 0 finished the checkpoint it was writing when the stop came
            assert (run / "checkpoints" / "last").read_text().strip() == writing
            artifacts.verify(run / "checkpoints" / writing, ("checkpoint",))
            assert f"last checkpoint {writing} " in lines[0]
        else:
            assert proc.returncode == -signal.SIGKILL
        assert not (run / "train").exists()
        resumed = subprocess.run([*PIPE, "train", "--run", str(run), *TWO_RANKS, "--resume", "auto"],
                                 capture_output=True, text=True, timeout=600, cwd=REPO)
        assert resumed.returncode == 0, resumed.stderr
        assert "Resuming training from" in resumed.stderr
        assert (run / "train" / "model.safetensors").read_bytes() == uninterrupted.read_bytes()
        assert not (run / job.LOCK_NAME).exists()  # released at the end
    finally:
        _reap([proc], run)


def test_a_second_job_on_a_live_run_is_refused(tmp_path, cli):
    run = tmp_path / "run"
    first = _start(run, *TWO_RANKS, env=SLOW)
    try:
        _wait_for(lambda: (run / "checkpoints" / "last").exists(), "the first checkpoint")
        for cmd in (["train", "--run", run, *TWO_RANKS, "--resume", "auto"],
                    ["all", "--config", DIGITS, "--run", run]):
            code, _, err = cli(*cmd)
            assert code == 2, err
            assert err.strip() == (f"pipe {cmd[0]}: error: {run.resolve()}: another job is writing this run: "
                                   f"PID {first.pid} (pipe train), PID {_launcher_pid(run)} "
                                   "(paddle.distributed.launch); wait for it or stop it, or use another --run")
        _, err = first.communicate(timeout=600)
        assert first.returncode == 0, err  # the refused runs did not disturb it
        artifacts.verify(run / "train", ("train",))
        assert not (run / job.LOCK_NAME).exists()
    finally:
        _reap([first], run)


def _launcher_pid(run: Path) -> int:
    return next(int(ln.split()[0]) for ln in _job_processes(run) if "paddle.distributed.launch" in ln)


def test_the_lock_dies_with_its_holder(tmp_path):
    """A holder killed with SIGKILL leaves the lock file behind, but no lock: the next job takes it."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pipeline import job\n"
                               f"with job.run_lock({str(tmp_path)!r}, 'test holder'):\n"
                               "    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(job.InputError, match=f"PID {holder.pid} \\(test holder\\)"):
            with job.run_lock(tmp_path, "second"):
                pass
        holder.kill()
        holder.wait()
        assert (tmp_path / job.LOCK_NAME).exists()
        with job.run_lock(tmp_path, "third"):
            assert (tmp_path / job.LOCK_NAME).read_text() == f"{os.getpid()} third\n"
            with job.run_lock(tmp_path, "nested"):  # re-entrant: pipe all holds it around pipe train
                pass
        assert not (tmp_path / job.LOCK_NAME).exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_sigterm_stops_an_in_process_training_after_its_checkpoint(tmp_path):
    """World size 1 trains inside pipe: SIGTERM during a checkpoint write lets that checkpoint commit,
    then pipe exits 143 with one line; --resume auto finishes the run."""
    run = tmp_path / "run"
    args = ["--config", str(DIGITS), "--model", "mlp", "--epochs", "2", "--set", "train.checkpoint_every=4"]
    proc = _start(run, *args, env=SLOW)
    try:
        _wait_for(lambda: any((run / "checkpoints").glob("step-*.tmp-*")) if (run / "checkpoints").is_dir()
                  else False, "a checkpoint being written")
        writing = next((run / "checkpoints").glob("step-*.tmp-*")).name.split(".tmp-")[0]
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143 and "Traceback" not in err
        assert [ln for ln in err.splitlines() if ln.startswith("pipe train:")] == [
            f"pipe train: stopped by SIGTERM: every rank has exited; last checkpoint {writing} "
            "(continue with --resume auto)"]
        artifacts.verify(run / "checkpoints" / writing, ("checkpoint",))
        assert not list((run / "checkpoints").glob("*.tmp-*")) and not (run / job.LOCK_NAME).exists()
        resumed = subprocess.run([*PIPE, "train", "--run", str(run), *args, "--resume", "auto"],
                                 capture_output=True, text=True, timeout=600, cwd=REPO)
        assert resumed.returncode == 0, resumed.stderr
    finally:
        _reap([proc], run)


# ------------------------------------------------------------------ --resume auto on a finished run


def test_resume_auto_on_a_finished_run_is_done(tmp_path, cli):
    run = tmp_path / "run"
    args = ["train", "--config", DIGITS, "--model", "mlp", "--run", run, "--epochs", "1"]
    assert cli(*args)[0] == 0
    before = tree_hash(run)
    code, _, err = cli(*args, "--resume", "auto")
    assert code == 0, err
    assert f"note: {run / 'train'} is done and was made from this training config; nothing to resume" in err
    assert tree_hash(run) == before  # nothing trained, nothing rewritten
    # keys that cannot change a finished run's weights do not matter; a raised epoch count trains on
    code, _, err = cli(*args, "--set", "train.log_interval=3", "--set", "train.keep_last=5", "--resume", "auto")
    assert code == 0 and "nothing to resume" in err and tree_hash(run) == before
    # an explicit checkpoint that is finished keeps its error
    last = run / "checkpoints" / (run / "checkpoints" / "last").read_text().strip()
    code, _, err = cli(*args, "--resume", last)
    assert code == 2 and "nothing to resume, 1 of train.epochs=1 epochs are done" in err
    assert tree_hash(run) == before


def test_resume_auto_writes_train_from_finished_checkpoints(tmp_path, cli):
    """The job died after its last checkpoint, before train/: --resume auto writes train/ from them."""
    run = tmp_path / "run"
    args = ["train", "--config", DIGITS, "--model", "mlp", "--run", run, "--epochs", "1"]
    assert cli(*args)[0] == 0
    weights = (run / "train" / "model.safetensors").read_bytes()
    shutil.rmtree(run / "train")
    code, _, err = cli(*args, "--resume", "auto")
    assert code == 0, err
    assert (run / "train" / "model.safetensors").read_bytes() == weights
    assert artifacts.verify(run / "train", ("train",)).manifest["metrics"]["epochs_run"] == 1
    # a train/ made from another config is not "done": the changed key is named, as for any resume
    code, _, err = cli(*args, "--set", "train.lr=0.1", "--resume", "auto")
    assert code == 2 and "train.lr was 0.003, now 0.1" in err


@pytest.mark.slow
def test_pipe_all_resume_auto_on_a_finished_run_is_cached(tmp_path, cli):
    run = tmp_path / "run"
    args = ["all", "--config", DIGITS, "--run", run, "--set", "train.epochs=1", "--set", "compress.int8=false"]
    code, out, err = cli(*args)
    assert code == 0, err
    package = tree_hash(run / "package")
    code, out, err = cli(*args, "--resume", "auto")
    assert code == 0, err
    assert "nothing to resume" in err
    for stage in ("export", "package"):
        assert f"{stage}: cached" in out
    assert tree_hash(run / "package") == package
