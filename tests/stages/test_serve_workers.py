"""`pipe serve --http-workers N`: several HTTP processes on one port answer as one server
(`pipeline/serving/workers.py`): the shared board's sums, every process's answers equal to the model's,
Triton's statistics and /metrics the same whichever process answers, a dead process replaced, nothing left
behind by SIGTERM or by a SIGKILLed supervisor."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from pipeline import runtime
from pipeline.serving import spec as spec_mod, workers
from stages.serve import ServeConfig
from tests.serving_helpers import metric, start_server, until as _until
from tests.stages.test_serve import digits, predictor, run  # noqa: F401 (fixtures)


# ------------------------------------------------------------------ the settings and the board


@pytest.mark.parametrize("cores, given, predictors, want", [
    (1, None, None, (1, 1, 1)), (2, None, None, (2, 1, 1)), (3, None, None, (3, 1, 1)),
    (16, None, None, (4, 1, 3)), (16, None, 2, (4, 2, 1)), (16, 1, None, (1, 1, 15)), (2, 1, None, (1, 1, 1))])
def test_http_workers_and_threads_follow_the_cores_the_process_may_use(monkeypatch, cores, given, predictors, want):
    """0 (the default) = one HTTP process per core, at most 4; threads = the cores the HTTP processes leave,
    shared by every predictor; a flag overrides either."""
    monkeypatch.setattr(runtime, "available_cores", lambda: cores)
    package = SimpleNamespace(doc={}, engine="paddle_inference")  # what settings reads of a package
    s = spec_mod.settings(ServeConfig(http_workers=given, predictors=predictors), package)
    assert (s.http_workers, s.predictors, s.threads) == want


def test_http_workers_out_of_range_is_one_line(monkeypatch):
    from pipeline.errors import InputError

    with pytest.raises(InputError, match=r"--http-workers: must be 0\.\.64, got 65"):
        spec_mod.settings(ServeConfig(http_workers=65), SimpleNamespace(doc={}, engine="paddle_inference"))
    s = spec_mod.settings(ServeConfig(), SimpleNamespace(doc={"server": {"http_workers": 3}},
                                                          engine="paddle_inference"))
    assert s.http_workers == 3  # serving.yaml's server.http_workers, under the flag


def test_the_board_sums_every_workers_counters(tmp_path):
    """Each worker counts in its own row; any of them, and a second mapping of the file (another process),
    answers with the sum; readiness needs every row warm."""
    board = workers.Board.at(tmp_path, 2, 1, 8, create=True)
    a, b = board.stats(0), board.stats(1)
    a.request(True, 100)
    b.request(True, 50)
    b.request(False, 7)
    a.batch([10], 1, 1, 2, 3)
    b.batch([10, 20], 2, 4, 5, 6)
    other = workers.Board.at(tmp_path, 2, 1, 8).stats(0)
    for st in (a, b, other):
        m = st.doc("m", "1")["model_stats"][0]
        assert m["inference_stats"]["success"] == {"count": 2, "ns": 150}
        assert m["inference_stats"]["fail"] == {"count": 1, "ns": 7}
        assert m["inference_stats"]["queue"] == {"count": 3, "ns": 40}
        assert m["inference_stats"]["compute_infer"] == {"count": 3, "ns": 2 + 2 * 5}
        assert (m["inference_count"], m["execution_count"]) == (3, 2)
        assert [(x["batch_size"], x["compute_infer"]) for x in m["batch_stats"]] == \
            [(1, {"count": 1, "ns": 2}), (2, {"count": 1, "ns": 5})]
    assert not board.loaded() and not board.all_ready()
    board.set_state(0, workers.READY)
    board.set_state(1, workers.LOADED)
    assert board.loaded() and not board.all_ready()
    board.set_state(1, workers.READY)
    assert board.all_ready()
    board.publish(0, 2, 1, 10, [[[5, 0.5], [1, 0.25], [1, 1.0]], []])
    board.publish(1, 1, 0, 4, [[[3, 0.1], [0, 0.0], [1, 2.0]], [[7, 0.01], [0, 0.0], [0, 0.0]]])
    assert (board.total("inflight"), board.total("queue"), board.total("handled")) == (3, 1, 14)
    assert board.handled() == [10, 4]
    assert [(w, p, gens[0][0]) for w, p, gens in board.gc()] == [(0, "server", 5), (1, "server", 3),
                                                                  (1, "predictor-0", 7)]


def test_a_batch_larger_than_the_board_holds_is_counted_but_not_by_size(tmp_path):
    st = workers.Board.at(tmp_path, 1, 1, 4, create=True).stats(0)
    st.batch([1] * 9, 9, 1, 1, 1)
    m = st.doc("m", "1")["model_stats"][0]
    assert (m["inference_count"], m["execution_count"], m["batch_stats"]) == (9, 1, [])


# ------------------------------------------------------------------ real servers


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _tree(pid: int) -> list[int]:
    out = []
    for c in _children(pid):
        out += [c, *_tree(c)]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_several_http_processes_answer_as_one_server(run, digits, predictor):
    """Two HTTP processes, each with its own predictor: 48 requests on fresh connections are answered as the
    model answers; /metrics and Triton's statistics, asked on fresh connections (either process), count all 48;
    both processes served; SIGTERM drains both, exit 0, the summary counts all 48, no process left."""
    _, x = digits
    srv = start_server(run / "package", "--http-workers", "2")
    try:
        assert "2 HTTP processes, each 1 predictor(s) x 1 thread(s)" in "".join(srv.out)
        kids = _children(srv.proc.pid)
        assert len(kids) == 2
        tree = _tree(srv.proc.pid)
        assert len(tree) == 4  # two HTTP processes, a predictor each
        for w in kids:
            (pred,) = _children(w)
            Path(f"/proc/{pred}/cmdline").read_bytes().index(b"--predictor")

        def one(i: int) -> httpx.Response:
            return httpx.post(srv.url + "/v1/predict", json={"inputs": x[i:i + 1].tolist()}, timeout=30)

        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(48)))
        assert [r.status_code for r in answers] == [200] * 48
        got = np.concatenate([np.asarray(r.json()["logits"], np.float32) for r in answers])
        want = predictor(x[:48])
        assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())

        _counted(srv.url, 48)  # each is counted after its answer's last byte
        time.sleep(0.3)  # the gauges are published every 0.1 s
        model = httpx.get(srv.url + "/v1/model", timeout=10).json()
        for _ in range(6):  # fresh connections: either process answers, with the whole server's counts
            text = httpx.get(srv.url + "/metrics", timeout=10).text
            assert metric(text, 'pipe_requests_total{code="200",endpoint="/v1/predict"}') == 48
            assert metric(text, "pipe_batch_size_sum") == 48
            assert metric(text, "pipe_ready") == 1 and metric(text, "pipe_inflight_requests") == 0
            per = [metric(text, f'pipe_worker_inference_requests_total{{worker="{w}"}}') for w in "01"]
            assert sum(per) == 48 and min(per) > 0, per  # both processes served
            assert metric(text, 'pipe_gc_collections_total{generation="2",process="server",worker="1"}') >= 1
            stats = httpx.get(srv.url + f"/v2/models/{model['name']}/stats", timeout=10).json()["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] == 48 and stats["inference_count"] == 48
        assert model["batching"]["http_workers"] == 2
        assert model["reference_check"]["passed"] is True  # worker 0's check, reported by every process
    except BaseException:
        srv.kill()
        raise
    assert srv.stop() == 0, "".join(srv.err)[-2000:]
    assert "pipe serve: stopped (48 inference requests handled)" in "".join(srv.out)
    assert "Traceback" not in "".join(srv.err)
    assert not [p for p in tree if _alive(p)]


def _counted(url: str, want: int, seconds: float = 20) -> float:
    """The server's count of answered /v1/predict requests once it is `want` or `seconds` have passed. A request
    is counted after its answer's last byte is sent (pipeline/serving/server.py, Observe), so a client can read
    its answer a moment before the count includes it; the counts are then asserted exactly."""
    deadline = time.monotonic() + seconds
    while True:
        got = metric(httpx.get(url + "/metrics", timeout=10).text,
                     'pipe_requests_total{code="200",endpoint="/v1/predict"}', missing=0)
        if got == want or time.monotonic() > deadline:
            assert got == want, f"{got} requests counted, {want} answered"
            return got
        time.sleep(0.1)


@pytest.mark.slow
def test_a_dead_http_process_is_replaced_and_a_killed_supervisor_takes_all_down(run, digits):
    """SIGKILL one HTTP process (as the OOM killer would): the supervisor says so and starts another; /readyz
    is 200 again once it is warm, the counts never went back. Then SIGKILL the supervisor itself: every HTTP
    process and predictor exits (PR_SET_PDEATHSIG; a predictor's stdin closes with its HTTP process)."""
    _, x = digits
    srv = start_server(run / "package", "--http-workers", "2")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(4):
                assert c.post("/v1/predict", json={"inputs": x[i:i + 1].tolist()}).status_code == 200
        _counted(srv.url, 4)  # killed before its last answer is counted, a process would lose that count
        before = _tree(srv.proc.pid)
        victim = _children(srv.proc.pid)[1]
        os.kill(victim, signal.SIGKILL)
        _until(lambda: "HTTP worker 1 exited (-9); restarting it" in "".join(srv.err), 20)
        _until(lambda: len(_children(srv.proc.pid)) == 2 and victim not in _children(srv.proc.pid), 20)

        def ready() -> bool:
            try:
                return httpx.get(srv.url + "/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False
        _until(ready, 90)
        for i in range(6):
            assert httpx.post(srv.url + "/v1/predict", json={"inputs": x[i:i + 1].tolist()},
                              timeout=30).status_code == 200
        assert _counted(srv.url, 10) == 10  # the dead one's 4 kept
        after = _tree(srv.proc.pid)
        assert not [p for p in before if p not in after and _alive(p)]  # the dead one's predictor went with it
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(10)
        _until(lambda: not [p for p in after if _alive(p)], 30)
    finally:
        srv.kill()
