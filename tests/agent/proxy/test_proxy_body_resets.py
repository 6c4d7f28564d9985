"""Clients that reset their connection in the middle of a request body are counted, not logged one by one.

A client sending `Content-Length: 100000`, one byte, then a TCP reset made aiohttp log a traceback of the
ConnectionResetError the body's read raised (two chained ones: 40 lines a client); 1,000 such clients wrote
40,668 ERROR lines in 2.2 s. A body too large to be read whole (streamed to the upstream as it comes) was
worse: its reset was taken for the upstream's and answered as an upstream `connect` error. Over real sockets on
127.0.0.1: the proxy (its defaults), a raw upstream, and clients that reset with SO_LINGER 0.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import AsyncIterator, Callable

import pytest

from raw_peers import RawUpstream, exchange, fixed
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy import limits
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer

CLIENTS = 300
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[RawUpstream, ProxyServer]]:
    up = RawUpstream([fixed(OK)])
    await up.start()
    server = ProxyServer(build(up.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    await server.start(refresh_loop=False)
    yield up, server
    await server.stop()
    await up.stop()


async def mid_body(port: int, length: int) -> asyncio.StreamWriter:
    """A request announcing `length` bytes of body, one of them sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{" % length)
    await writer.drain()
    return writer


def reset(writer: asyncio.StreamWriter) -> None:
    """A reset (RST, not FIN)."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def until(done: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not done():
        assert asyncio.get_running_loop().time() < deadline, f"not within {seconds:g} s: {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("length", [100_000, 100 * 1024 * 1024], ids=["read-whole", "streamed"])
async def test_bodies_reset_midway_are_counted_and_logged_as_one_line(
        proxy: tuple[RawUpstream, ProxyServer], length: int, caplog: pytest.LogCaptureFixture) -> None:
    up, server = proxy
    port = int(server.proxy_url.rsplit(":", 1)[1])
    with caplog.at_level(logging.DEBUG):
        for _ in range(CLIENTS // 100):  # (100 at a time: the listen backlog of a loaded machine)
            writers = await asyncio.gather(*(mid_body(port, length) for _ in range(100)))
            # reset once the proxy holds every request, waiting for its body (a fixed sleep missed a hundred of
            # them on a loaded machine: reset before their headers were read, they were never requests)
            await until(lambda: server.stats.in_flight >= len(writers), "the proxy reads the requests' headers")
            for writer in writers:
                reset(writer)
            await until(lambda: not server.stats.in_flight, "the proxy ends the reset requests", seconds=10.0)
        honest = await exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert honest.startswith(b"HTTP/1.1 200")  # the port serves on
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    tracebacks = [r for r in lines if r.exc_info or "Traceback" in r.getMessage()]
    print(f"{CLIENTS} resets mid-body: {len(lines)} log lines, {len(tracebacks)} tracebacks")
    assert not tracebacks, tracebacks[0].getMessage()  # before: 2 per client
    assert len(lines) <= 3, [r.getMessage() for r in lines]  # start, one refusal line (a minute's), maybe stop
    snap = server.refresh_now()
    refused = {labels[1]: v for name, labels, v in snap.counters if name == c.REFUSED}
    assert refused.get(limits.BODY_RESET) == CLIENTS, refused
    upstream = {labels[1]: v for name, labels, v in snap.counters if name == c.UPSTREAM_ERRORS}
    assert not upstream, upstream  # a client's reset is not the upstream's failure (streamed: 502 connect before)
    gone = sum(v for name, labels, v in snap.counters if name == c.REQUESTS and labels[4] == "client_disconnected")
    assert gone == CLIENTS  # each request ended by its client, as the request counter says
