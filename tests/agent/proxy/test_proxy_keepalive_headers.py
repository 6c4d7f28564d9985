"""The read-header timeout holds for every request of a keep-alive connection, not only its first (nothing
else guards the second request's headers). Real sockets on
127.0.0.1, the fake upstream."""

from __future__ import annotations

import asyncio

from fake_upstream import FakeUpstream
from test_proxy_hardening import closed_within, connect, port_of, start_proxy, upstream  # noqa: F401 (fixture)


async def test_a_second_requests_headers_trickled_on_a_kept_alive_connection_are_cut(upstream: FakeUpstream) -> None:  # noqa: F811
    # Headers have 1 s from their first byte; the connection may idle 60 s between requests. After one
    # answered request the client trickles the next request's headers a byte every 0.2 s, never ending
    # them: closed at ~1 s (5 s allowed), counted as a header timeout, not left to the 60 s idle bound.
    server = await start_proxy(upstream.url, replace={"read_header_timeout": 1.0, "idle_timeout": 60.0})
    stop = asyncio.Event()
    try:
        reader, writer = await connect(port_of(server))
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head  # kept alive
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        await asyncio.wait_for(reader.readexactly(length), 10)

        async def trickle() -> None:
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                writer.write(b"X")
                await asyncio.sleep(0.2)

        task = asyncio.create_task(trickle())
        assert await closed_within(reader, 5.0)
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        assert server.stats.refused == {"header_timeout": 1}
        writer.close()
    finally:
        stop.set()
        await server.stop()
