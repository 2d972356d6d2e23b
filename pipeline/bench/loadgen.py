"""A lean HTTP/1.1 load generator for the serving benchmark: asyncio, one keep-alive connection per client.

    python -c "from pipeline.bench import loadgen; print(loadgen.run('http://127.0.0.1:8000', [b'{...}'], 16, count=100))"

On a 2-core machine the load generator shares the CPU with the server it measures. One httpx.Client per
thread spent ~1.7 ms of CPU per request (3.4 s for 2,000 requests), more than the server's own HTTP work;
this generator writes each request as one pre-built byte string and reads the answer by Content-Length,
0.1-0.2 ms per request. It speaks only what `pipe serve` answers: HTTP/1.1 with a Content-Length. A
transport error or a non-200 answer counts as an error; after a transport error the client reconnects.
`headers` adds header lines to every request (the Open Inference Protocol's binary framing needs
`Inference-Header-Content-Length`); `content_type=""` sends none, as tritonclient does.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import numpy as np

_TIMEOUT_S = 30.0


def run(url: str, bodies: list[bytes], clients: int, count: int = 0, seconds: float = 0.0,
        path: str = "/v1/predict", content_type: str = "application/json",
        headers: dict[str, str] | None = None) -> dict:
    """`clients` connections POST `bodies` (client k starts at body k) until each sent `count` requests
    or `seconds` passed (with a count cap too, so the load always ends). Returns rate (requests/s over
    the wall time), wall, done, errors, p50 and p99 latency in ms."""
    extra = {**({"Content-Type": content_type} if content_type else {}), **(headers or {})}
    return asyncio.run(_run(url, bodies, clients, count or 1_000_000, seconds, path, extra))


async def _run(url: str, bodies: list[bytes], clients: int, cap: int, seconds: float, path: str,
               headers: dict[str, str]) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    requests = [(head + f"Content-Length: {len(b)}\r\n\r\n").encode() + b for b in bodies]
    conns = [await asyncio.wait_for(asyncio.open_connection(host, port), _TIMEOUT_S) for _ in range(clients)]
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    end = start + seconds if seconds else float("inf")

    async def client(k: int) -> None:
        reader, writer = conns[k]
        for i in range(cap):
            if time.perf_counter() > end:
                break
            t0 = time.perf_counter()
            try:
                writer.write(requests[(k + i) % len(requests)])
                ok = await asyncio.wait_for(_response(reader), _TIMEOUT_S) == 200
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                ok = False
                writer.close()
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), _TIMEOUT_S)
                except (OSError, asyncio.TimeoutError):
                    errors[0] += 1
                    return  # the server is gone: this client stops, its error counted
            latencies.append(time.perf_counter() - t0)
            errors[0] += not ok
        writer.close()

    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - start
    lat = np.asarray(latencies) * 1000
    return {"rate": len(lat) / wall, "wall": wall, "done": len(lat), "errors": errors[0],
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))}


async def _response(reader: asyncio.StreamReader) -> int:
    """Read one response; its status code. A body without Content-Length is a ValueError (an error)."""
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = [v for k, _, v in (line.partition(b":") for line in lines[1:]) if k.strip().lower() == b"content-length"]
    if len(length) != 1:
        raise ValueError("no Content-Length")
    await reader.readexactly(int(length[0]))
    return status
