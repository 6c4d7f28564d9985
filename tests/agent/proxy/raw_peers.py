"""Raw-socket peers for the proxy's hostile-peer tests: an upstream that answers scripted bytes (whatever
HTTP says) and records the exact bytes each of its connections received, and a client that sends raw bytes
and reads what comes back. On 127.0.0.1, real sockets, no HTTP library between the test and the proxy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

# An answer: called with (the connection's index, the request's raw bytes, the writer); it writes what it
# likes, sleeps as it likes, and may close the connection.
Answer = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[None]]


def fixed(*pieces: bytes, close: bool = False, pause: float = 0.0) -> Answer:
    """An answer that writes `pieces` (sleeping `pause` s between them), then closes if told to."""

    async def answer(index: int, request: bytes, writer: asyncio.StreamWriter) -> None:
        for i, piece in enumerate(pieces):
            if i and pause:
                await asyncio.sleep(pause)
            writer.write(piece)
            await writer.drain()
        if close:
            writer.close()

    return answer


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's bytes, head and body (by its Content-Length or its chunked framing); b"" at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    lower = head.lower()
    body = b""
    if b"\r\ntransfer-encoding: chunked" in lower:
        while True:
            line = await reader.readuntil(b"\r\n")
            body += line
            size = int(line.split(b";")[0], 16)
            body += await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        for line in lower.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                body = await reader.readexactly(int(line.split(b":")[1]))
    return head + body


@dataclass
class RawUpstream:
    """Answers each request with `answers[i]` (the i-th request it reads, over all connections; the last one
    again past the list), records every connection's received bytes in `received` (one bytes per
    connection) and each request in `requests` as (connection index, bytes)."""

    answers: list[Answer]
    received: list[bytearray] = field(default_factory=list)
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    url: str = ""
    _server: asyncio.AbstractServer | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()

    @property
    def connections(self) -> int:
        return len(self.received)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.received)
        got = bytearray()
        self.received.append(got)
        self._writers.append(writer)
        try:
            while not writer.is_closing():
                request = await read_request(reader)
                if not request:
                    return
                got += request
                n = len(self.requests)
                self.requests.append((index, request))
                await self.answers[min(n, len(self.answers) - 1)](index, request, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # the peer went away, or the test stopped this server
        finally:
            writer.close()


async def exchange(port: int, data: bytes, *, timeout: float = 5.0, until_close: bool = True,
                   expect: int = 0) -> bytes:
    """Send `data` on a new connection to 127.0.0.1:`port`; what comes back until the proxy closes (or, with
    until_close False, until `expect` bytes or `timeout` s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0 or (not until_close and expect and len(got) >= expect):
                break
            try:
                piece = await asyncio.wait_for(reader.read(65536), left)
            except asyncio.TimeoutError:
                break
            except ConnectionError:
                break
            if not piece:
                break
            got += piece
    finally:
        writer.close()
    return got
