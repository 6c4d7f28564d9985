"""PageClient: an engine loop's page reads over one kept-alive connection at the stream level, with fetch_text's
bounds, timestamp and errors, whatever way the engine frames its answer."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from rooflight.collectors.errors import SourceError
from rooflight.collectors.http import PageClient

PAGE = b"# TYPE x counter\nx_total 1\n"
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]  # False: close


class RawEngine:
    """A TCP server on 127.0.0.1 answering each request with `answer`; it remembers each request's
    connection and head."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.peers: list[object] = []
        self.heads: list[bytes] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.peers.append(writer.get_extra_info("peername"))
                self.heads.append(head)
                if not await self.answer(reader, writer, head):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test ended with the connection idle
        finally:
            writer.close()

    async def __aenter__(self) -> "RawEngine":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/metrics"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()


def _with_length(body: bytes = PAGE, status: str = "200 OK", extra: str = "") -> Answer:
    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
                + body)
        return "Connection: close" not in extra
    return answer


@pytest.fixture
async def client() -> AsyncIterator[PageClient]:
    async with aiohttp.ClientSession(headers={"Accept": "text/plain;version=0.0.4"}) as session:
        pages = PageClient(session)
        yield pages
        pages.close()


async def _read(pages: PageClient, url: str, timeout: float = 5.0, max_bytes: int = 1 << 20) -> str:
    return (await pages.fetch_text(url, timeout=timeout, max_bytes=max_bytes, monotonic=time.monotonic)).text


async def test_reads_reuse_one_connection_and_send_the_sessions_headers(client: PageClient) -> None:
    async with RawEngine(_with_length()) as engine:
        for _ in range(20):
            assert await _read(client, engine.url) == PAGE.decode()
    assert len(engine.peers) == 20 and len(set(engine.peers)) == 1 and client.connections == 1
    head = engine.heads[0].decode()
    assert head.startswith("GET /metrics HTTP/1.1\r\n")
    assert "\r\nAccept: text/plain;version=0.0.4\r\n" in head and "Accept-Encoding" not in head


@pytest.mark.parametrize("framing", ["chunked", "connection-close", "http/1.0", "gzip"])
async def test_every_framing_of_the_body_reads_the_same_page(client: PageClient, framing: str) -> None:
    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        if framing == "chunked":
            half = len(PAGE) // 2
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + b"".join(f"{len(p):x};x=1\r\n".encode() + p + b"\r\n" for p in (PAGE[:half], PAGE[half:]))
                    + b"0\r\nX-Trailer: 1\r\n\r\n")
            return True
        if framing == "gzip":
            body = gzip.compress(PAGE)
            w.write(f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            return True
        w.write((b"HTTP/1.0" if framing == "http/1.0" else b"HTTP/1.1") + b" 200 OK\r\nConnection: close\r\n\r\n" + PAGE)
        return False  # the body ends with the connection

    async with RawEngine(answer) as engine:
        for _ in range(3):
            assert await _read(client, engine.url) == PAGE.decode()
    expected = 3 if framing in ("connection-close", "http/1.0") else 1
    assert client.connections == expected == len(set(engine.peers))


async def test_an_idle_connection_the_engine_closed_is_opened_again_unseen(client: PageClient) -> None:
    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        await _with_length()(r, w, head)
        await w.drain()
        return False  # closes after each answer without saying so (an idle timeout)

    async with RawEngine(answer) as engine:
        for _ in range(3):
            assert await _read(client, engine.url) == PAGE.decode()
            await asyncio.sleep(0.05)  # the close reaches the client's side
    assert client.connections == 3


@pytest.mark.parametrize(("answer", "reason"), [
    (_with_length(status="500 Internal Server Error"), "http_status"),
    (_with_length(b"x" * 2048), "too_large"),  # over a 1 KiB cap, by its Content-Length
    (lambda r, w, h: _chunks_forever(w), "too_large"),  # chunked without end: read up to the cap only
    (lambda r, w, h: _garbage(w), "other"),
])
async def test_a_bad_answer_is_the_same_source_error_and_the_next_read_opens_anew(
        client: PageClient, answer: Answer, reason: str) -> None:
    async with RawEngine(answer) as engine:
        with pytest.raises(SourceError) as caught:
            await _read(client, engine.url, max_bytes=1024)
        assert caught.value.reason == reason
        assert engine.url.rsplit("/", 1)[0].removeprefix("http://") in str(caught.value)
        engine.answer = _with_length()
        assert await _read(client, engine.url, max_bytes=1024) == PAGE.decode()
    assert client.connections == 2


async def _chunks_forever(w: asyncio.StreamWriter) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(100):
        w.write(b"100\r\n" + b"y" * 256 + b"\r\n")
        await w.drain()
    return False


async def _garbage(w: asyncio.StreamWriter) -> bool:
    w.write(b"SSH-2.0-OpenSSH\r\n\r\n")
    return False


async def test_refused_and_timed_out_are_named_as_the_session_names_them(client: PageClient) -> None:
    async def stall(_: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        await asyncio.sleep(0.5)
        return await _with_length()(_, w, head)

    async with RawEngine(stall) as engine:
        with pytest.raises(SourceError) as caught:
            await _read(client, engine.url, timeout=0.1)
        assert caught.value.reason == "timeout"
        url = engine.url
    with pytest.raises(SourceError) as caught:
        await _read(client, url)
    assert caught.value.reason == "refused" and "cannot connect" in str(caught.value)


async def test_the_timestamp_is_when_the_headers_came_not_the_last_byte(client: PageClient) -> None:
    async def slow(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        await asyncio.sleep(0.2)
        w.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n".encode())
        await w.drain()
        await asyncio.sleep(0.4)
        w.write(PAGE)
        return True

    async with RawEngine(slow) as engine:
        start = time.monotonic()
        fetched = await client.fetch_text(engine.url, timeout=5, max_bytes=1 << 20, monotonic=time.monotonic)
        end = time.monotonic()
    assert fetched.duration >= 0.6 - 0.02
    # the midpoint of sending and the headers (start + 0.1 when quiet), well before the midpoint of the whole
    # read (start + 0.3): a busy machine stretches both
    assert start + 0.08 <= fetched.timestamp < start + (end - start) / 2 - 0.1


async def test_a_url_with_a_password_goes_through_the_session_with_its_basic_auth(client: PageClient) -> None:
    async with RawEngine(_with_length()) as engine:
        url = engine.url.replace("http://", "http://user:pw@")
        assert await _read(client, url) == PAGE.decode()
    assert b"\r\nAuthorization: Basic " in engine.heads[0] and client.connections == 0
