"""PageClient: an engine loop's page reads over one kept-alive connection at the stream level, with fetch_text's
bounds, timestamp and errors, whatever way the engine frames its answer."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from rooflight.collectors import http
from rooflight.collectors.errors import SourceError
from rooflight.collectors.http import PageClient

PAGE = b"# TYPE x counter\nx_total 1\n"
VLLM_PAGE = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 1\n'
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
        version = b"HTTP/1.0" if framing == "http/1.0" else b"HTTP/1.1"
        w.write(version + b" 200 OK\r\nConnection: close\r\n\r\n" + PAGE)
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


async def test_the_request_line_is_the_urls_path_and_query_escaped_as_the_session_would(client: PageClient) -> None:
    async with RawEngine(_with_length()) as engine:
        base = engine.url.removesuffix("/metrics")
        assert await _read(client, f"{base}/a b/m%20x?token=a%2Fb&q=1#frag") == PAGE.decode()
    assert engine.heads[0].startswith(b"GET /a%20b/m%20x?token=a%2Fb&q=1 HTTP/1.1\r\n")


async def _session_read(url: str, max_bytes: int = 1 << 20) -> str:
    """What the reference, fetch_text through an aiohttp session, makes of the same answer."""
    from rooflight.collectors.http import fetch_text
    async with aiohttp.ClientSession() as session:
        return (await fetch_text(session, url, timeout=5, max_bytes=max_bytes, monotonic=time.monotonic)).text


async def test_bytes_past_the_content_length_are_never_read_as_the_next_page(client: PageClient) -> None:
    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        first = len(engine.heads) == 1  # a lying engine: a second, unasked answer after the first
        w.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n".encode() + PAGE
                + (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG" if first else b""))
        return True

    async with RawEngine(answer) as engine:
        for _ in range(3):
            assert await _read(client, engine.url) == PAGE.decode()
            await asyncio.sleep(0.05)
        assert await _session_read(engine.url) == PAGE.decode()


async def test_an_informational_answer_before_the_page_is_skipped_as_the_session_skips_it(client: PageClient) -> None:
    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        w.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n")
        return await _with_length()(r, w, head)

    async with RawEngine(answer) as engine:
        assert await _session_read(engine.url) == PAGE.decode()
        for _ in range(2):
            assert await _read(client, engine.url) == PAGE.decode()


@pytest.mark.parametrize("after_head", [
    b"1" * 70_000,  # a chunk size without end
    b"5\r\nhello\r\n0\r\nX-Trailer: " + b"t" * 70_000,  # a trailer without end
])
async def test_a_chunk_line_without_end_is_a_source_error_not_a_crash(client: PageClient, after_head: bytes) -> None:
    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + after_head)
        await w.drain()
        await asyncio.sleep(1)
        return False

    async with RawEngine(answer) as engine:
        with pytest.raises(SourceError) as caught:
            await _read(client, engine.url, timeout=10)
        assert caught.value.reason == "other"


async def test_an_idle_connection_the_engine_reset_is_opened_again_unseen(client: PageClient) -> None:
    import socket
    import struct

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        await _with_length()(r, w, head)
        await w.drain()
        await asyncio.sleep(0.05)
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()  # a reset, not a close (a proxy or a restarted engine's kernel)
        return False

    async with RawEngine(answer) as engine:
        for _ in range(3):
            assert await _read(client, engine.url) == PAGE.decode()
            await asyncio.sleep(0.2)  # the reset reaches the client's side
    assert client.connections == 3


_N = len(PAGE)
_DEFLATED = zlib.compress(PAGE * 200)
# mtime=0: these bytes are in test ids, which every xdist worker must collect alike (the gzip header holds
# the second it was written)
_GZIPPED = gzip.compress(PAGE, mtime=0)
_HALVES = (gzip.compress(PAGE[:10], mtime=0), gzip.compress(PAGE[10:], mtime=0))


@pytest.mark.parametrize(("raw", "expected"), [
    # framings two readers could read two ways (a smuggled page): refused, as the session refuses them
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (_N, PAGE),
     "other"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n%s" % (_N, _N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\nConnection: close\r\n\r\n" + PAGE, "other"),
    *((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n%s\r\n0\r\n\r\n" % PAGE, "other")
      for size in (b"0x%x" % _N, b"+%x" % _N, b"1_%x" % (_N - 16))),
    (b"HTTP/1.1 2000 OK\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200x OK\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    # a bare CR inside a line (a reader ending lines there sees a second Content-Length), a name that is no
    # token, a NUL in a value, a line over 8 KiB: refused, as the session refuses them
    (b"HTTP/1.1 200 OK\r\nX: a\rContent-Length: 3\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nContent Length: 3\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nX\x01: 3\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),
    (b"HTTP/1.1 200 OK\r\nX: a\r\n b\x00\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), "other"),  # folded
    (b"HTTP/1.1 200 OK\r\nX: %s\r\nContent-Length: %d\r\n\r\n%s" % (b"a" * 9000, _N, PAGE), "other"),
    # compressed anyway: a deflate body cut short, or bytes after the gzip body, is no whole page
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s"
     % (len(_DEFLATED) - 4, _DEFLATED[:-4]), "other"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%sjunk"
     % (len(_GZIPPED) + 4, _GZIPPED), "other"),
    # a gzip body of two members (RFC 1952): the whole page, as the session reads it
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
     % (len(b"".join(_HALVES)), b"".join(_HALVES)),
     PAGE.decode()),
    # odd but unambiguous: read, as the session reads them
    (b"HTTP/1.1 200 OK\r\nX-Note: one\r\n  folded\r\nContent-Length: %d\r\n\r\n%s" % (_N, PAGE), PAGE.decode()),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: notchunked\r\nConnection: close\r\n\r\n" + PAGE, PAGE.decode()),
    (b"HTTP/1.1 200 OK\nContent-Length: %d\n\n%s" % (_N, PAGE), PAGE.decode()),  # lines ended by LF alone
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\n\r\n%s" % (_N, PAGE), PAGE.decode()),
])
async def test_an_odd_head_or_chunk_size_reads_as_the_session_reads_it(
        client: PageClient, raw: bytes, expected: str) -> None:
    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(raw)
        return False

    async def outcome(read: Callable[[], Awaitable[str]]) -> str:
        try:
            return await read()
        except SourceError as exc:
            return exc.reason

    async with RawEngine(answer) as engine:
        assert await outcome(lambda: _session_read(engine.url)) == expected  # the reference
        assert await outcome(lambda: _read(client, engine.url)) == expected


async def test_a_query_token_escaped_otherwise_than_written_is_masked_in_an_error(client: PageClient) -> None:
    async def echo(_: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        w.write(b"HTTP/1.1 " + head.split(b"\r\n", 1)[0] + b"\r\n\r\n")  # a lying engine: the request line back
        return False

    async with RawEngine(echo) as engine:
        url = f"{engine.url}?token=s3%2fcr{{e|t"  # written with a lowercase escape and characters sent escaped
        for read in (lambda: _read(client, url),
                     lambda: _session_read(url)):
            with pytest.raises(SourceError) as caught:
                await read()
            message = str(caught.value).lower()
            assert caught.value.reason == "other" and "s3" in engine.heads[-1].decode().lower()
            assert "s3" not in message and "cr%7b" not in message, message


@pytest.mark.parametrize("where", ["status line", "header line"])
async def test_a_long_query_token_echoed_by_the_engine_is_masked_before_the_message_is_cut(
        client: PageClient, where: str) -> None:
    """The message cuts the engine's text to 80 characters: cut first, the whole token is no longer there to
    mask, and its first 60 characters were shown."""
    secret = "tok-" + "S3CRETabcdefghijklmnopqrstuvwxyz0123456789" * 2

    async def echo(_: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        line = head.split(b"\r\n", 1)[0]
        w.write((b"HTTP/1.1 " + line if where == "status line" else b"HTTP/1.1 200 OK\r\n" + line) + b"\r\n\r\n")
        return False

    async with RawEngine(echo) as engine:
        with pytest.raises(SourceError) as caught:
            await _read(client, f"{engine.url}?token={secret}")
    assert caught.value.reason == "other" and "bad " + where in str(caught.value)
    assert "S3CRET" not in str(caught.value), caught.value


async def test_port_0_is_port_0_not_the_default_port(client: PageClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """`http://127.0.0.1:0/` is refused, as the session refuses it: read from port 80 it would be another
    service's page."""
    asked: list[tuple[str, int]] = []

    async def connect(host: str, port: int) -> object:
        asked.append((host, port))
        raise ConnectionRefusedError(111, "refused")

    monkeypatch.setattr(asyncio, "open_connection", connect)
    with pytest.raises(SourceError) as caught:
        await _read(client, "http://127.0.0.1:0/metrics", timeout=2.0)
    assert caught.value.reason == "refused" and asked == [("127.0.0.1", 0)]


@pytest.mark.parametrize("framing", ["content-length", "one chunk"])
async def test_a_page_sent_in_one_piece_costs_about_twice_its_size_in_memory(client: PageClient, framing: str) -> None:
    """readexactly of the whole body held the reader's buffer, its copy and the body at once: 3x the page,
    where the session holds 2x (the text is the second)."""
    import tracemalloc
    body = b"x_total 1\n" * (400 * 1024)
    head = (b"Content-Length: %d\r\n\r\n" % len(body) if framing == "content-length"
            else b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body))
    raw = b"HTTP/1.1 200 OK\r\n" + head + body + (b"" if framing == "content-length" else b"\r\n0\r\n\r\n")

    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(raw)
        return True

    async with RawEngine(answer) as engine:
        tracemalloc.start()
        try:
            text = await _read(client, engine.url, max_bytes=len(body))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(text) == len(body)
    assert peak < 2.5 * len(body), peak / len(body)


async def test_a_percent_sign_that_is_no_escape_is_sent_escaped_as_the_session_sends_it(client: PageClient) -> None:
    async with RawEngine(_with_length()) as engine:
        url = engine.url.replace("/metrics", "/m%zz%4?a=%zz&b=c")
        assert await _session_read(url) == PAGE.decode()
        assert await _read(client, url) == PAGE.decode()
    expected = b"GET /m%25zz%254?a=%25zz&b=c HTTP/1.1\r\n"
    assert engine.heads[0].startswith(expected) and engine.heads[1].startswith(expected), engine.heads


async def test_a_page_in_a_myriad_of_one_byte_chunks_costs_about_its_size_in_memory(client: PageClient) -> None:
    import tracemalloc
    cap = 64 * 1024

    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * cap + b"0\r\n\r\n")
        return True

    async with RawEngine(answer) as engine:
        tracemalloc.start()
        try:
            text = await _read(client, engine.url, timeout=60, max_bytes=cap)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert text == "x" * cap
    # the page, its text and the socket's buffer are a few times the cap; a bytes object per chunk was 40x
    assert peak < 16 * cap, peak


async def test_an_http2_answer_on_a_kept_connection_is_refused_at_once_as_the_session_refuses_it(
        client: PageClient) -> None:
    async def h2(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(bytes.fromhex("000006040000000000000300000064"))  # a SETTINGS frame, and no line end ever
        return True  # kept open

    async with RawEngine(h2) as engine:
        for read in (lambda: _session_read(engine.url), lambda: _read(client, engine.url, timeout=3)):
            with pytest.raises(SourceError) as caught:
                await read()
            assert caught.value.reason == "other"  # not a timeout after the whole scrape timeout


async def test_a_kept_connection_reset_as_the_request_goes_out_is_opened_again_as_the_session_does(
        client: PageClient) -> None:
    import socket
    import struct

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, head: bytes) -> bool:
        if engine.peers.count(w.get_extra_info("peername")) == 2:  # a stale connection: the request meets a reset
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
            return False
        return await _with_length()(r, w, head)

    async with RawEngine(answer) as engine:
        async with aiohttp.ClientSession() as session:  # the reference: the session sends it again, anew
            from rooflight.collectors.http import fetch_text
            for _ in range(3):
                fetched = await fetch_text(session, engine.url, timeout=5, max_bytes=1 << 20, monotonic=time.monotonic)
                assert fetched.text == PAGE.decode()
        for _ in range(3):
            assert await _read(client, engine.url) == PAGE.decode()
    assert client.connections == 3  # each connection's second request met the reset, and went out again anew


async def test_the_agent_reads_its_engine_pages_with_its_own_user_agent() -> None:
    """aiohttp adds its User-Agent per request, so PageClient, which sends the session's headers, sent none."""
    from rooflight.agent import __version__
    from rooflight.agent.config.agent import build
    from support import started_agent

    async with RawEngine(_with_length(VLLM_PAGE)) as engine:
        config = build({}, {}, {"engine_url": [engine.url.removesuffix("/metrics")], "nvml": False,
                                "process": False, "model": "llama-3-8b"})
        async with started_agent(config, loops=False) as agent:
            await agent.sample_engines_once()
            assert agent.engines[0].state.up, agent.engines[0].state.message
    assert f"\r\nUser-Agent: rooflight/{__version__}\r\n".encode() in engine.heads[0], engine.heads[0]


def test_a_gzip_body_of_many_members_is_refused_before_its_cost_grows_with_its_square() -> None:
    """Each member leaves the rest of the body copied: 4 MiB of empty members held the event loop 10-12 s a page.
    Sixteen members are read; more are refused, in a bounded time."""
    member = gzip.compress(b"", mtime=0)
    assert http._inflated(gzip.compress(PAGE) + member * 15, "gzip", 1 << 22, "x") == PAGE
    started = time.process_time()
    with pytest.raises(http._Malformed, match="over 16 members"):
        http._inflated(gzip.compress(PAGE) + member * ((4 << 20) // len(member)), "gzip", 1 << 22, "x")
    assert time.process_time() - started < 2.0  # 10-12 s before the cap


_HEADS = [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(PAGE),
          b"HTTP/1.1 200 OK\nContent-Length: %d\n\n" % len(PAGE),  # lines ended by LF alone
          b"HTTP/1.1 200 OK\r\nContent-Length: %d\n\r\n" % len(PAGE)]


@pytest.mark.parametrize("head", _HEADS, ids=["crlf", "lf", "mixed"])
async def test_a_head_that_comes_in_pieces_reads_as_one_that_came_whole(client: PageClient, head: bytes) -> None:
    """A head cut anywhere, its first piece held while the rest is on its way (a slow or busy engine), reads as one
    that came whole: the same page, and the connection kept for the next."""
    for cut in (5, 6, 16, len(head) - 3, len(head) - 2, len(head) - 1, len(head)):
        async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes, cut: int = cut) -> bool:
            w.write(head[:cut])
            await w.drain()
            await asyncio.sleep(0.02)
            w.write(head[cut:] + PAGE)
            return True

        async with RawEngine(answer) as engine:
            assert await _read(client, engine.url) == PAGE.decode(), cut
            assert await _read(client, engine.url) == PAGE.decode(), cut
            assert len(set(engine.peers)) == 1
        client.close()


async def test_a_head_over_64_kib_held_whole_is_refused(client: PageClient) -> None:
    lines = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 700) for i in range(100))  # ~71 KiB, every line short

    async def answer(_: asyncio.StreamReader, w: asyncio.StreamWriter, __: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))
        return False

    async with RawEngine(answer) as engine:
        with pytest.raises(SourceError) as failed:
            await _read(client, engine.url)
    assert failed.value.reason == "other" and "64 KiB" in str(failed.value)
