"""`pipe predict --ray` on a real 2-node Ray cluster started here (127.0.0.2 head, 127.0.0.3 worker, one CPU, its
own temp dir, memory and object store each; facts §18) with the session's digits package: rows from actors on both
nodes equal local predict's; an actor SIGKILLed mid-job and a driver SIGKILLed then rerun still give every item
exactly once; an unreachable address, a missing extra and an input no node can read are refused in one line with
nothing written; `--ray local`. The cluster is stopped by killing its own processes (never `ray stop`, which kills
every Ray process on the host); teardown checks that no process of it and nothing of its object stores in /dev/shm
(each node's own dir there, `--plasma-directory`) is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.bench.ray_cluster import HEAD, WORKER, LoopbackCluster, free_port
from pipeline.predict import output
from tests.conftest import main_in_fresh_process
from tests.serving_helpers import REPO
from tests.stages.test_predict import _images, make_pdf, package, rows  # noqa: F401 (the module's package fixture)

pytest.importorskip("ray.data", reason="the ray extra is not installed (pip install 'paddle-pipe[ray]')")
pytestmark = pytest.mark.slow(reason="a real 2-node Ray cluster (~10 s to start) and Paddle actors on it")

ENV = {"PYTHONPATH": str(REPO), "KMP_BLOCKTIME": "0"}


@pytest.fixture(scope="module")
def cluster():
    c = LoopbackCluster(env=ENV)
    try:
        c.start()
        yield c
    finally:
        left = c.stop()
    assert left == [], f"processes of the test's Ray cluster left: {left}"
    assert c.shm_left == [], f"left in /dev/shm by its object stores: {c.shm_left}"
    assert not any(os.path.exists(d) for d in (*c.dirs, *c.shm))


def _by_key(path: Path) -> dict:
    return {(r["source"], r["page"], r["sha256"]): r for r in rows(path)} if path.exists() else {}


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _job_processes_gone(cluster: LoopbackCluster, seconds: float = 30) -> bool:
    """No actor of ours and no predictor process (an actor's child) left on the cluster within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not cluster.pids(b"_Predict") and not cluster.pids(b"pipeline.serving.predictor"):
            return True
        time.sleep(0.5)
    return False


def _cmd(package: Path, inputs: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "predict", str(package), str(inputs), "--out", str(out), *extra]


def test_two_nodes_give_local_predicts_rows(package, cluster, tmp_path, cli):  # noqa: F811
    """Images, a PDF's pages and a corrupt file: the same rows and error rows as local predict (any order), from
    actors on both nodes; the summary says which node answered how many."""
    _images(tmp_path / "in", n=60)
    make_pdf(tmp_path / "in" / "doc.pdf", pages=3)
    (tmp_path / "in" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    code, _, err = cli("predict", package, tmp_path / "in", "--out", tmp_path / "local", "--workers", "1")
    assert code == 5, err
    code, stdout, err = cli("predict", package, tmp_path / "in", "--out", tmp_path / "ray", "--ray", cluster.address,
                            "--batch", "2")
    assert code == 5, err
    assert err.strip().splitlines()[-1] == f"pipe predict: 1 of 64 items failed; see {tmp_path / 'ray' / output.ERRORS}"
    local, ray = _by_key(tmp_path / "local" / output.PREDICTIONS), _by_key(tmp_path / "ray" / output.PREDICTIONS)
    assert len(ray) == 63 and ray == local
    assert _by_key(tmp_path / "ray" / output.ERRORS) == _by_key(tmp_path / "local" / output.ERRORS)
    s = json.loads((tmp_path / "ray" / output.SUMMARY).read_text())
    assert (s["items"], s["done"], s["failed"], s["workers"], s["threads"]) == (64, 63, 1, 2, 1)
    assert set(s["ray"]["items_by_node"]) == {HEAD, WORKER}, s["ray"]  # actors on both nodes answered
    assert s["ray"]["cpus_by_node"] == {HEAD: 1.0, WORKER: 1.0}
    assert json.loads((tmp_path / "ray" / output.FINGERPRINT).read_text()) == \
        json.loads((tmp_path / "local" / output.FINGERPRINT).read_text())
    # a rerun into the same DIR: nothing to do (the images are hashed by the actors, the pages by the driver)
    code, _, err = cli("predict", package, tmp_path / "in", "--out", tmp_path / "ray", "--ray", cluster.address)
    assert code == 5, err
    s = json.loads((tmp_path / "ray" / output.SUMMARY).read_text())
    assert (s["items"], s["done"], s["skipped"], s["previously_failed"]) == (64, 0, 64, 1)
    assert len(rows(tmp_path / "ray" / output.PREDICTIONS)) == 63


def test_actor_killed_mid_job_every_item_once(package, cluster, tmp_path):  # noqa: F811
    paths = _images(tmp_path / "in", n=400)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cmd(package, tmp_path / "in", out, "--ray", cluster.address, "--batch", "1"),
                            cwd=REPO, env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _lines(out / output.PREDICTIONS) < 20 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        actors = cluster.pids(b"_Predict")
        assert proc.poll() is None and len(actors) == 2, (actors, proc.poll())
        predictors = cluster.pids(b"pipeline.serving.predictor")
        assert predictors and all(b"MALLOC_ARENA_MAX=2" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
                                  for p in predictors)  # glibc's arenas capped on the actors' side too
        os.kill(actors[0], signal.SIGKILL)
        killed_at = _lines(out / output.PREDICTIONS)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert killed_at < len(paths)  # the kill was mid-job
    got = rows(out / output.PREDICTIONS)
    assert sorted(r["source"] for r in got) == sorted(map(str, paths))  # every item exactly once
    s = json.loads((out / output.SUMMARY).read_text())
    assert (s["items"], s["done"], s["failed"]) == (400, 400, 0)
    assert _job_processes_gone(cluster)  # the killed actor's predictor too


def test_driver_killed_then_rerun_resumes(package, cluster, tmp_path):  # noqa: F811
    paths = _images(tmp_path / "in", n=300)
    out = tmp_path / "out"
    cmd = _cmd(package, tmp_path / "in", out, "--ray", cluster.address, "--batch", "1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _lines(out / output.PREDICTIONS) < 10 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait(30)
    first = _lines(out / output.PREDICTIONS)
    assert 0 < first < len(paths)
    assert _job_processes_gone(cluster)  # the dead driver's job: Ray ends its actors, and they their predictors
    r = subprocess.run(cmd, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    raw = (out / output.PREDICTIONS).read_bytes()
    got = [json.loads(line) for line in raw.splitlines()]  # every line whole JSON
    assert sorted(g["source"] for g in got) == sorted(map(str, paths))  # each item exactly once
    s = json.loads((out / output.SUMMARY).read_text())
    assert s["skipped"] >= first and s["done"] + s["skipped"] == len(paths) and s["failed"] == 0
    assert _job_processes_gone(cluster)


def test_refusals_are_one_line_and_write_nothing(package, cluster, tmp_path, cli):  # noqa: F811
    """An address nobody listens on, a malformed address, Ray Client's, more actors than the cluster holds: one line
    each, nothing in DIR. (`auto` is not tried: it joins any Ray cluster running on the host, this test's too.)"""
    _images(tmp_path / "in", n=2)
    out = tmp_path / "out"
    closed = f"{HEAD}:{free_port(HEAD)}"
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--ray", closed)
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"pipe predict: --ray {closed}: cannot reach"), err
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--ray", "nonsense")
    assert code == 2 and err == ("pipe predict: error: --ray nonsense: expected local, auto or HOST:PORT (the head's "
                                 "GCS address)\n")
    # Ray Client: Ray Data 2.60's executor fails over it ('Worker' object has no attribute 'core_worker')
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--ray", cluster.client)
    assert code == 2 and err.count("\n") == 1 and "Ray Data does not run over Ray Client" in err, err
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--ray", cluster.address, "--workers", "3")
    assert code == 2 and "--workers 3 x --threads 1: the cluster holds 2 such actors" in err and err.count("\n") == 1
    assert not out.exists()


def test_an_input_no_node_can_read_is_refused_naming_it(package, cluster, tmp_path):  # noqa: F811
    """The driver alone sees the inputs (a tmpfs mounted in its own mount namespace, as a disk only the driver's
    machine has): refused before anything is written, naming the file and the node."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m (a mount namespace) is not permitted here")
    _images(tmp_path / "src", n=2)
    private, out = tmp_path / "private", tmp_path / "out"
    private.mkdir()
    cmd = " ".join(_cmd(package, private, out, "--ray", cluster.address))
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs none {private} && cp -r {tmp_path / 'src'}/. "
                        f"{private} && exec {cmd}"], cwd=REPO, env=cluster.env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith(f"pipe predict: error: {private / 'img0_00.png'}: not readable on the Ray node ")
    assert "every input must be readable on every node" in r.stderr
    assert not out.exists() and not any(private.iterdir())


_NO_RAY = """import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, _Block())
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_the_extra_one_line_says_how_to_install(package, tmp_path):  # noqa: F811
    _images(tmp_path / "in", n=2)
    r = subprocess.run([sys.executable, "-c", _NO_RAY, "predict", str(package), str(tmp_path / "in"), "--out",
                        str(tmp_path / "out"), "--ray", "auto"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("pipe predict: error: --ray: Ray Data does not import here (")
    assert r.stderr.endswith("; pip install 'paddle-pipe[ray]'\n")
    assert not (tmp_path / "out").exists()


def test_ray_local_gives_local_predicts_rows(package, tmp_path):  # noqa: F811
    """`--ray local`: a Ray instance in the pipe process itself, ended with it (no process left, its temp dir
    removed)."""
    _images(tmp_path / "in", n=12)
    code, err, left = main_in_fresh_process("predict", package, tmp_path / "in", "--out", tmp_path / "ray",
                                            "--ray", "local", "--batch", "4")
    assert code == 0 and left == [], err[-3000:]
    code, err, _ = main_in_fresh_process("predict", package, tmp_path / "in", "--out", tmp_path / "local")
    assert code == 0, err[-3000:]
    assert _by_key(tmp_path / "ray" / output.PREDICTIONS) == _by_key(tmp_path / "local" / output.PREDICTIONS)
    assert len(rows(tmp_path / "ray" / output.PREDICTIONS)) == 12
    tmp = Path(tempfile.gettempdir())
    assert [p.name for p in tmp.glob("pipe-ray-*") if not p.name.startswith("pipe-ray-test-")] in (
        [], ["pipe-ray-packages"])  # the local instance's temp dir removed
    assert not list((tmp / "pipe-ray-packages").glob("*"))  # each actor's copy of the package removed


def test_bench_rows_run_on_a_tiny_set(package, tmp_path):  # noqa: F811
    """pipeline/bench/predict.py's `--ray` rows (`make bench` runs them on the OCR pages) on 40 digits images: a row
    for `--ray local` and one for a 2-node cluster of its own, each with its ratio to local predict, its rows
    equal local predict's; the bench's cluster is gone afterwards."""
    from pipeline.bench import predict as bench

    _images(tmp_path / "in", n=40)
    clusters = set(Path(tempfile.gettempdir()).glob("pipe-ray-test-*"))
    local = bench.predict(package, [tmp_path / "in"], tmp_path / "local")
    assert "error" not in local, local
    got = bench.ray_rows(package, tmp_path / "in", tmp_path, float(local["summary"]["items_per_s"]), local["rows"],
                         "40 images")
    assert [r[0] for r in got] == [
        "`pipe predict --ray` local over 40 images vs local predict, items/s",
        "`pipe predict --ray` a 2-node cluster on this host (1 CPU each) over 40 images vs local predict, items/s"]
    for what, result, goal, verdict in got:
        assert goal == ">= 0.85x local predict" and verdict in ("met", "**missed**"), result
        assert result.endswith("rows equal local predict's)") and "x (" in result, result
    assert "127.0.0.2" in got[1][1]
    assert set(Path(tempfile.gettempdir()).glob("pipe-ray-test-*")) <= clusters  # its cluster stopped, dirs removed
