"""Lingering close: a client that sends its whole body before reading still reads an early answer.

An early answer is one sent before the request body has all arrived: the 413 on Content-Length or while
reading, a 415, 400 or 503 refused before reading, a 408. uvicorn 0.54's httptools protocol closes the
connection as soon as it has written an answer carrying `Connection: close` (`RequestResponseCycle.send`),
and urllib sends that header on every request. Closing a socket with unread data makes the kernel answer
the data still arriving with a RST: a client still inside sendall() (urllib, requests, http.client: none
waits for `100 Continue`) gets ECONNRESET or EPIPE and never reads the 413; curl waits for `100 Continue`
and was not affected. On a keep-alive connection uvicorn instead parses and drops the rest of the body
with no bound on time or bytes (its keep-alive timer is disarmed by every read).

`LingeringHttpToolsProtocol` does what nginx does (`lingering_close`): an early answer gets `Connection:
close`; once it is written the server half-closes (FIN after the answer: the client reads it, then EOF)
and reads and drops whatever the client still sends, without buffering or parsing it, until the client
closes, LINGER_TIMEOUT_S pass without data, LINGER_TIME_S have passed in all or more than
LINGER_MAX_BYTES were dropped; then it closes. Answers to requests whose body was read are unchanged.

The same protocol holds an answer's head until its first body part and writes both in one send (uvicorn
writes each as it comes: two sends per answer; 35% fewer write calls in the serving process under load,
docs/benchmarks.md). An app that fails after its head but before any body thus still gets uvicorn's 500.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

LINGER_TIME_S = 30.0  # nginx lingering_time: the most time spent dropping a body after an early answer
LINGER_TIMEOUT_S = 5.0  # nginx lingering_timeout: the longest wait for more of it
# nginx bounds lingering by time only; Tomcat drops at most 2 MiB of an aborted upload (maxSwallowSize),
# less than a client that overshoots an 8 MiB cap still has in flight. 64 MiB is Triton's whole body cap
# (1 << 26); dropping costs reads only (measured: 300 MiB in 0.07 s of server CPU on loopback). A client
# still sending after that gets the RST.
LINGER_MAX_BYTES = 64 << 20


class _Transport:
    """The connection's transport as uvicorn's protocol and request cycles see it: `close()` lingers
    instead when the last request's body has not all arrived (the protocol decides)."""

    def __init__(self, real: asyncio.Transport, protocol: "LingeringHttpToolsProtocol"):
        self._real, self._protocol = real, protocol
        self._corked: list[bytes] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def write(self, data: bytes) -> None:
        if self._corked is not None:
            self._corked.append(data)
        else:
            self._real.write(data)

    def cork(self) -> None:
        """Hold writes until `uncork`, then write them as one: an answer's head and body in one send."""
        self._corked = []

    def uncork(self) -> None:
        held, self._corked = self._corked, None
        if held:
            self._real.write(b"".join(held))

    def close(self) -> None:
        self.uncork()
        self._protocol.close_or_linger()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._real.is_closing()


class LingeringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with nginx's lingering close after early answers (module docstring).
    The bounds are class attributes so that a test can shrink them in a subclass."""

    linger_time_s = LINGER_TIME_S
    linger_timeout_s = LINGER_TIMEOUT_S
    linger_max_bytes = LINGER_MAX_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.lingering = False
        self.discarded = 0
        self._real = transport
        self._lost = False
        self._last_data = self._linger_end = 0.0
        self._timer: asyncio.TimerHandle | None = None
        super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        transport = self.transport
        start: list[Any] = []  # the answer's head, held until its first body part

        async def close_after_early_answer(scope: Any, receive: Any, send: Any) -> None:
            async def send_(message: Any) -> None:
                if message["type"] == "http.response.start":
                    start.append(message)
                    return
                if start:  # head and first body part in one socket write: half the sends per answer
                    head = start.pop()
                    # `more_body` is uvicorn's own flag: True until the parser has seen the end of the body.
                    if cycle.more_body:
                        cycle.keep_alive = False  # uvicorn adds `connection: close` and closes after the answer
                    transport.cork()
                    try:
                        await send(head)
                        await send(message)
                    finally:
                        transport.uncork()
                    return
                await send(message)

            await app(scope, receive, send_)

        super()._start_asgi_task(cycle, close_after_early_answer)

    def close_or_linger(self) -> None:
        cycle = self.cycle
        if self.lingering or self._lost or self._real.is_closing() or cycle is None or not cycle.more_body:
            self._real.close()
            return
        self.lingering = True
        if self._real.can_write_eof():
            self._real.write_eof()  # sent once the answer is flushed
        now = self.loop.time()
        self._last_data, self._linger_end = now, now + self.linger_time_s
        self.flow.resume_reading()  # uvicorn paused reading at 64 KiB of unread body
        self._timer = self.loop.call_later(min(self.linger_timeout_s, self.linger_time_s), self._check)

    def _check(self) -> None:
        now = self.loop.time()
        wake = min(self._linger_end, self._last_data + self.linger_timeout_s)
        if now >= wake:
            self._real.close()
        else:
            self._timer = self.loop.call_later(wake - now, self._check)

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)
            return
        # [linger] dropped as it arrives: neither kept nor parsed
        self.discarded += len(data)
        self._last_data = self.loop.time()
        if self.discarded > self.linger_max_bytes:
            self._real.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)
