"""The body cap as clients that send their whole body before reading see it (urllib, requests, http.client,
a raw socket that sendall()s then reads): they read the 413, not a connection reset, with and without
Content-Length, on both inference endpoints, several at once beside normal requests; the server drops the
rest of the body without keeping it (its RSS stays flat) and answers the next request.

`pipeline/serving/lingering.py` does this (nginx's lingering close); its bounds (idle timeout, total time,
bytes dropped) are tested on an in-process uvicorn with a tiny app and shrunken bounds. Every connection
targets 127.0.0.1 on a server the test started, and is bounded in count, bytes and time.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import requests

from pipeline.serving import lingering
from tests.stages.test_serve import CAP, JSON_HDR, _error, digits, run, server  # noqa: F401 (fixtures)

OVER = 12_000_000  # the body: 12 MB against the 8 MiB cap
PATHS = ("/v1/predict", "/GeneralModelService/inference")


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _body(path: str, x: np.ndarray, size: int) -> bytes:
    """A valid JSON request for `path` of exactly `size` bytes (padded with trailing whitespace)."""
    if path == "/v1/predict":
        doc: dict[str, Any] = {"inputs": x[:1].tolist()}
    else:
        doc = {"tensor": [{"float_data": x[:1].ravel().tolist(), "shape": [1, *x.shape[1:]], "elem_type": 1,
                           "name": "x", "alias_name": "x"}]}
    body = json.dumps(doc).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def _pieces(body: bytes, step: int = 1 << 20) -> Iterator[bytes]:
    for i in range(0, len(body), step):
        yield body[i:i + step]


def _chunked(body: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in _pieces(body)) + b"0\r\n\r\n"


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status_code, self.headers, self.content = status, headers, body
        self.text = body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def _urllib(url: str, path: str, body: bytes, ctype: str, chunked: bool) -> _Answer:
    """urllib sends `Connection: close` and the whole body before reading; an iterable body without
    Content-Length goes chunked."""
    req = urllib.request.Request(url + path, data=_pieces(body) if chunked else body,
                                 headers={"content-type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return _Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return _Answer(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def _requests(url: str, path: str, body: bytes, ctype: str, chunked: bool) -> _Answer:
    """requests keeps the connection alive and sends no `Expect: 100-continue`."""
    r = requests.post(url + path, data=_pieces(body) if chunked else body, headers={"content-type": ctype},
                      timeout=30)
    return _Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)


def _http_client(url: str, path: str, body: bytes, ctype: str, chunked: bool) -> _Answer:
    c = http.client.HTTPConnection(*_host_port(url), timeout=30)
    try:
        c.request("POST", path, body=_pieces(body) if chunked else body, headers={"content-type": ctype},
                  encode_chunked=chunked)
        r = c.getresponse()
        return _Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        c.close()


def _socket(url: str, path: str, body: bytes, ctype: str, chunked: bool) -> _Answer:
    """sendall() of the whole request, then read."""
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n%s\r\n\r\n" % (path.encode(), ctype.encode(), framing)
    with socket.create_connection(_host_port(url), timeout=30) as s:
        s.sendall(head + (_chunked(body) if chunked else body))
        r = http.client.HTTPResponse(s)
        r.begin()
        return _Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())


CLIENTS = {"urllib": _urllib, "requests": _requests, "http.client": _http_client, "socket": _socket}


def _is_413(r: Any) -> None:
    _error(r, 413, "body_too_large")
    assert r.headers["connection"] == "close"  # the server closes after lingering


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("path", PATHS)
def test_whole_body_first_clients_read_the_413(server, digits, path, client, chunked):
    """12 MB sent in full before reading: the 413, on Content-Length (before the server reads any body) or
    while reading (chunked); a JSON body and, on the Paddle Serving endpoint, a protobuf one."""
    _, x = digits
    ctype = "application/json"
    body = _body(path, x, OVER)
    if path != "/v1/predict" and client == "socket":
        ctype, body = "application/proto", b"\x0a" * OVER  # never parsed: refused on size
    _is_413(CLIENTS[client](server.url, path, body, ctype, chunked))
    assert httpx.post(server.url + path, content=_body(path, x, 4000), headers=JSON_HDR,
                      timeout=30).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", PATHS)
def test_at_the_cap_whole_body_first(server, digits, path, chunked):
    """One byte under and exactly at the cap pass, one byte over is the 413, sent by urllib and by a raw
    socket (the whole body first)."""
    _, x = digits
    for client in (_urllib, _socket):
        for size, code in ((CAP - 1, 200), (CAP, 200), (CAP + 1, 413)):
            r = client(server.url, path, _body(path, x, size), "application/json", chunked)
            if code == 413:  # the whole body may have arrived by then: the connection may stay open
                _error(r, 413, "body_too_large")
            else:
                assert r.status_code == 200, (client.__name__, size, r.status_code, r.text[:200])


@pytest.mark.slow
def test_oversized_and_normal_requests_at_once(server, digits):
    """6 oversized bodies (urllib and a raw socket, both endpoints, with and without Content-Length) in
    parallel with 12 normal requests: every oversized one reads its 413, every normal one its 200; then
    the server answers at once."""
    _, x = digits
    jobs = [(c, p, ch) for c in (_urllib, _socket) for p, ch in ((PATHS[0], False), (PATHS[0], True),
                                                                   (PATHS[1], False))]

    def oversized(job: tuple) -> Any:
        client, path, chunked = job
        return client(server.url, path, _body(path, x, OVER), "application/json", chunked)

    def normal(i: int) -> int:
        path = PATHS[i % 2]
        return httpx.post(server.url + path, content=_body(path, x, 4000), headers=JSON_HDR,
                          timeout=30).status_code

    with cf.ThreadPoolExecutor(8) as pool:
        big = [pool.submit(oversized, j) for j in jobs]
        small = [pool.submit(normal, i) for i in range(12)]
        for f in big:
            _is_413(f.result(timeout=60))
        assert [f.result(timeout=60) for f in small] == [200] * 12
    t0 = time.monotonic()
    assert httpx.post(server.url + PATHS[0], content=_body(PATHS[0], x, 4000), headers=JSON_HDR,
                      timeout=30).status_code == 200
    assert time.monotonic() - t0 < 2


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_the_dropped_body_is_not_kept(server):
    """60 MiB sent after the 413 (Content-Length announces 100 MB): the client then reads the 413 and the
    server's RSS, sampled every 5 ms meanwhile, never grows by a quarter of that."""
    pid = server.proc.pid
    base, peak, done = _rss(pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with socket.create_connection(_host_port(server.url), timeout=30) as s:
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000000\r\n\r\n")
            block = b" " * (1 << 20)
            for _ in range(60):
                s.sendall(block)
            r = http.client.HTTPResponse(s)
            r.begin()
            assert r.status == 413 and json.loads(r.read())["error"]["type"] == "body_too_large"
    finally:
        done.set()
        sampler.join(5)
    assert peak[0] - base < 15 << 20, (base, peak[0])


# ------------------------------------------------------------------ the bounds, on an in-process uvicorn


class _Small(lingering.LingeringHttpToolsProtocol):
    linger_time_s = 2.0
    linger_timeout_s = 0.5
    linger_max_bytes = 4 << 20


async def _app(scope: dict, receive: Any, send: Any) -> None:
    """POST /early answers 413 without reading; anything else reads the whole body, then answers 200."""
    if scope["type"] != "http":
        return
    if scope["path"] != "/early":
        more = True
        while more:
            more = (await receive()).get("more_body", False)
    status = 413 if scope["path"] == "/early" else 200
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def small_server() -> Iterator[tuple[str, int]]:
    yield from _in_process(_app, _Small)


def _in_process(app: Any, protocol: type) -> Iterator[tuple[str, int]]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    srv = uvicorn.Server(uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning", loop="asyncio"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    yield sock.getsockname()[:2]
    srv.should_exit = True
    thread.join(10)
    sock.close()


def _early(addr: tuple[str, int], first: bytes) -> socket.socket:
    """A connection whose request (Content-Length 1 GB) got the early answer; `first` body bytes sent."""
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n" + first)
    r = http.client.HTTPResponse(s)
    r.begin()
    assert r.status == 413 and r.getheader("connection") == "close" and r.read() == b"ok"
    assert s.recv(1) == b""  # half-closed after the answer: the client sees EOF and may keep sending
    return s


def _closed_after(s: socket.socket, feed: bytes, pause: float, limit: float) -> float:
    """Send `feed` every `pause` s until the server has closed (the send fails); seconds until then."""
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < limit:
            s.sendall(feed)
            time.sleep(pause)
    except OSError:
        return time.monotonic() - t0
    raise AssertionError(f"still open after {limit} s")


def test_lingering_stops_after_the_idle_timeout(small_server):
    with _early(small_server, b" " * 1000) as s:
        time.sleep(_Small.linger_timeout_s + 0.3)
        assert _closed_after(s, b" ", 0.05, 2) < 0.5  # closed while the client was idle


def test_lingering_stops_after_the_total_time(small_server):
    """A client trickling bytes (never idle for the timeout) is cut off at linger_time_s."""
    t0 = time.monotonic()
    with _early(small_server, b" ") as s:
        _closed_after(s, b" " * 100, 0.1, 5)
    assert _Small.linger_time_s <= time.monotonic() - t0 < _Small.linger_time_s + 1.0


def test_lingering_stops_after_the_byte_bound(small_server):
    with _early(small_server, b"") as s:
        t = _closed_after(s, b" " * (1 << 20), 0, 5)
    assert t < 1.5  # at linger_max_bytes (4 MiB here), long before the time bound


def test_answers_after_a_read_body_keep_the_connection(small_server):
    """Keep-alive is unchanged for requests whose body was read: two on one connection."""
    with httpx.Client(base_url=f"http://{small_server[0]}:{small_server[1]}", timeout=10) as c:
        for _ in range(2):
            r = c.post("/read", content=b"x" * 200_000)
            assert r.status_code == 200 and r.headers.get("connection") != "close"
        assert c.get("/read").status_code == 200


def test_early_answers_on_keep_alive_close_too(small_server):
    """uvicorn alone parsed and dropped such a body without bound on a keep-alive connection; now the early
    answer says `Connection: close` and the same bounds apply."""
    c = http.client.HTTPConnection(*small_server, timeout=10)
    try:
        c.request("POST", "/early", body=b" " * (2 << 20))
        r = c.getresponse()
        assert r.status == 413 and r.getheader("connection") == "close" and r.read() == b"ok"
    finally:
        c.close()



# ------------------------------------------------------------------ one socket write per answer


class _Counted(lingering.LingeringHttpToolsProtocol):
    """Records every write that reaches the connection's real transport (asyncio's, whose write can be
    replaced on the instance)."""
    writes: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        real = transport.write

        def write(data: bytes) -> None:
            _Counted.writes.append(bytes(data))
            real(data)

        transport.write = write
        super().connection_made(transport)


async def _answers(scope: dict, receive: Any, send: Any) -> None:
    """/one: head + body; /stream: head, then two body parts; /fail: head, then an error."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [] if path == "/stream" else [(b"content-length", b"2")]})
    if path == "/fail":
        raise RuntimeError("after the head")
    await send({"type": "http.response.body", "body": b"ok", "more_body": path == "/stream"})
    if path == "/stream":
        await send({"type": "http.response.body", "body": b"!"})


@pytest.fixture(scope="module")
def counted_server() -> Iterator[tuple[str, int]]:
    yield from _in_process(_answers, _Counted)


def test_an_answer_is_one_socket_write(counted_server):
    """Head and body leave in one send (uvicorn alone makes two): measured under perf_analyzer, 35% fewer
    write calls in the serving process (docs/benchmarks.md)."""
    with httpx.Client(base_url=f"http://{counted_server[0]}:{counted_server[1]}", timeout=10) as c:
        _Counted.writes.clear()
        r = c.get("/one")
        assert r.status_code == 200 and r.text == "ok"
        assert len(_Counted.writes) == 1 and _Counted.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert _Counted.writes[0].endswith(b"\r\n\r\nok")
        _Counted.writes.clear()
        r = c.get("/stream")  # a streamed answer: the head goes with its first part, the rest as it comes
        assert r.status_code == 200 and r.text == "ok!" and r.headers["transfer-encoding"] == "chunked"
        assert len(_Counted.writes) == 2 and _Counted.writes[0].endswith(b"\r\n\r\n2\r\nok\r\n"), _Counted.writes
        assert _Counted.writes[1] == b"1\r\n!\r\n0\r\n\r\n"


def test_an_app_failing_after_its_head_answers_500(counted_server):
    """The held head was never written, so uvicorn still answers its own 500 (not a cut connection), and
    the next request on the connection is served."""
    with httpx.Client(base_url=f"http://{counted_server[0]}:{counted_server[1]}", timeout=10) as c:
        r = c.get("/fail")
        assert r.status_code == 500 and r.text == "Internal Server Error"
    with httpx.Client(base_url=f"http://{counted_server[0]}:{counted_server[1]}", timeout=10) as c:
        assert c.get("/one").text == "ok"
