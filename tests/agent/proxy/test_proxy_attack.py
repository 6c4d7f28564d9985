"""The relay (agent/proxy/relay.py) against a hostile or broken upstream, over raw sockets on 127.0.0.1: what
the upstream sends past a response's end never reaches the client nor the next request on that connection,
its framing is read as strictly as a client behind the proxy would read it, and a request it began to answer
is never sent to it twice."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator

import pytest

from raw_peers import Answer, RawUpstream, fixed
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.server import ProxyServer

GOOD = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood"
EVIL = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nSet-Cookie: stolen=1\r\n\r\nEVIL"
GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


async def start(answers: list[Answer], **replace: object) -> tuple[RawUpstream, ProxyServer]:
    up = RawUpstream(answers)
    await up.start()
    config = build(up.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    server = ProxyServer(dataclasses.replace(config, **replace))  # type: ignore[arg-type]
    await server.start(refresh_loop=False)
    return up, server


@pytest.fixture
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RawUpstream, ProxyServer]]:
    up, server = await start(request.param)
    yield up, server
    await server.stop()
    await up.stop()


def port_of(server: ProxyServer) -> int:
    return int(server.proxy_url.rsplit(":", 1)[1])


async def read_for(reader: asyncio.StreamReader, seconds: float) -> tuple[bytes, bool]:
    """What arrives within `seconds`, and whether the proxy closed the connection by then."""
    got = b""
    try:
        async with asyncio.timeout(seconds):
            while piece := await reader.read(65536):
                got += piece
        return got, True
    except asyncio.TimeoutError:
        return got, False
    except ConnectionError:
        return got, True


async def two_requests(server: ProxyServer) -> tuple[bytes, bytes, bool]:
    """Two requests, one after the other, on one kept-alive client connection: what came back after each,
    and whether the proxy closed the connection after the first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    try:
        writer.write(GET)
        first, closed = await read_for(reader, 1.0)
        second = b""
        if not closed:
            writer.write(GET)
            second, _ = await read_for(reader, 1.0)
        return first, second, closed
    finally:
        writer.close()


async def one_request(server: ProxyServer) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    try:
        writer.write(GET)
        return (await read_for(reader, 1.0))[0]
    finally:
        writer.close()


# -- what follows a response's end -----------------------------------------------------------------------------

PAST_THE_END = [
    pytest.param([fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + EVIL),
                  fixed(GOOD)], id="chunked"),
    pytest.param([fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + EVIL), fixed(GOOD)], id="length"),
]


@pytest.mark.parametrize("stack", PAST_THE_END, indirect=True)
async def test_bytes_past_a_responses_end_reach_no_client_and_end_that_upstream_connection(
        stack: tuple[RawUpstream, ProxyServer]) -> None:
    """An upstream that sends a second answer in the same write as the first one's end: the client's kept-alive
    connection must not carry it (it would be the answer to the client's next request: response splitting),
    and the upstream connection it came on is out of step, so it is not reused for anyone."""
    up, server = stack
    first, second, closed = await two_requests(server)
    assert first.startswith(b"HTTP/1.1 200 OK") and b"ok" in first
    assert b"EVIL" not in first + second and b"stolen" not in first + second
    third = await one_request(server)  # another client, after: never the extra answer
    assert third.endswith(b"good") and b"EVIL" not in third
    assert up.connections >= 2  # the connection that sent the extra bytes carried nothing more


# -- framing as strict as the client's --------------------------------------------------------------------------

LENIENT_SIZES = [b"-0", b"0x0", b"+0", b" 0", b"0_0"]


@pytest.mark.parametrize("stack", [
    pytest.param([fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n" + size + b"\r\n\r\n"
                        + EVIL), fixed(GOOD)], id=size.decode())
    for size in LENIENT_SIZES], indirect=True)
async def test_a_chunk_size_a_strict_client_would_not_read_ends_the_response_as_broken(
        stack: tuple[RawUpstream, ProxyServer]) -> None:
    """'-0', '0x0', '+0', ' 0' and '0_0' are what Python's int(..., 16) reads as 0 and an HTTP client does not:
    the proxy must not take them for the last chunk (and then relay what follows, or reuse the connection)."""
    up, server = stack
    first, second, closed = await two_requests(server)
    assert closed  # the response is broken off, as a broken upstream's is
    assert b"EVIL" not in first + second
    assert (await one_request(server)).endswith(b"good")
    assert up.connections == 2


@pytest.mark.parametrize("stack", [
    pytest.param([fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXY0\r\n\r\n"), fixed(GOOD)],
                 id="no-crlf-after-data"),
    pytest.param([fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\n0\n\n"), fixed(GOOD)],
                 id="bare-lf"),
], indirect=True)
async def test_a_chunk_without_its_crlf_is_a_broken_upstream(stack: tuple[RawUpstream, ProxyServer]) -> None:
    up, server = stack
    first, second, closed = await two_requests(server)
    assert closed
    assert (await one_request(server)).endswith(b"good")
    assert up.connections == 2


@pytest.mark.parametrize("stack", [[fixed(b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 2"
                                          b"\r\n\r\nok"), fixed(GOOD)]], indirect=True)
async def test_a_connection_header_naming_content_length_does_not_take_the_framing_away(
        stack: tuple[RawUpstream, ProxyServer]) -> None:
    """Connection names hop-by-hop headers, which the proxy drops; dropping Content-Length left the client a
    kept-alive response with no framing at all: it read on, forever, into the next answer."""
    up, server = stack
    first, second, closed = await two_requests(server)
    assert b"\r\nContent-Length: 2\r\n" in first and first.endswith(b"\r\n\r\nok")
    assert second.endswith(b"good")


@pytest.mark.parametrize("stack", [
    pytest.param([fixed(b"HTTP/1.1 000 Nothing\r\nContent-Length: 2\r\n\r\nok"), fixed(GOOD)], id="000"),
    pytest.param([fixed(b"HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok"), fixed(GOOD)], id="099"),
    pytest.param([fixed(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n" + EVIL),
                  fixed(GOOD)], id="101"),
], indirect=True)
async def test_a_status_no_client_can_read_or_a_switch_nobody_asked_for_is_a_502(
        stack: tuple[RawUpstream, ProxyServer]) -> None:
    """A status under 100 was relayed as 'HTTP/1.1 0' (which no client parses); a 101 was taken for an
    interim answer and what followed it (another protocol's bytes, by then) relayed as the response."""
    up, server = stack
    answer = await one_request(server)
    assert answer.startswith(b"HTTP/1.1 502 ") and b"EVIL" not in answer
    assert (await one_request(server)).endswith(b"good")
    # counted as what it was, an answer no client could read, not an upstream that could not be reached
    errors = {labels[1]: v for name, labels, v in server.refresh_now().counters if name == c.UPSTREAM_ERRORS}
    assert errors == {"bad_response": 1.0}


@pytest.mark.parametrize("stack", [[fixed(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"),
                                    fixed(GOOD)]], indirect=True)
async def test_a_head_over_the_limit_is_refused_even_when_it_comes_in_one_read(
        stack: tuple[RawUpstream, ProxyServer]) -> None:
    up, server = stack
    answer = await one_request(server)
    assert answer.startswith(b"HTTP/1.1 502 ") and b"aaaa" not in answer


# -- a request is sent once --------------------------------------------------------------------------------------


async def test_a_request_the_upstream_began_to_answer_is_not_sent_again() -> None:
    """The retry on a fresh connection is for a kept-alive connection the upstream had closed before it read
    the request. Once the upstream has sent a byte of an answer, it has the request: a second copy of a
    POST would run the generation twice."""
    up, server = await start([fixed(GOOD), fixed(b"HTTP/1.1 200 OK\r\nContent-", close=True), fixed(GOOD)])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(GET)
        first = await reader.readuntil(b"good")
        assert first.startswith(b"HTTP/1.1 200")
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        second, _ = await read_for(reader, 2.0)
        writer.close()
        posts = [request for _, request in up.requests if request.startswith(b"POST")]
        assert len(posts) == 1
        assert second.startswith(b"HTTP/1.1 502 ")
    finally:
        await server.stop()
        await up.stop()


async def test_a_kept_alive_connection_closed_before_answering_is_retried_once() -> None:
    """What the retry is for still works: the upstream closes an idle kept-alive connection as the next
    request goes out on it (no byte answered); the request goes again on a new connection."""

    async def then_close(index: int, request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(GOOD)
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()

    up, server = await start([then_close, fixed(GOOD)])
    try:
        assert server._pool is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(GET)
        await reader.readuntil(b"good")
        conn = server._pool._idle[0]
        await asyncio.sleep(0.5)  # the upstream has closed it by now; make the pool hand it out anyway
        assert conn.transport is None
        writer.write(GET)
        second = await asyncio.wait_for(reader.readuntil(b"good"), 5)
        writer.close()
        assert second.startswith(b"HTTP/1.1 200")
    finally:
        await server.stop()
        await up.stop()


# -- the port's clock and deadlines ------------------------------------------------------------------------------


async def test_the_rest_of_an_unread_body_is_not_the_next_requests_first_byte() -> None:
    """A request answered before its body was read (here 400: an absolute-form target), whose body comes after
    the answer: aiohttp reads that body away, and its bytes armed the header deadline as if a new request had
    begun. The client's idle kept-alive connection was then closed and counted as a header timeout."""
    up, server = await start([fixed(GOOD)], read_header_timeout=1.0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(b"POST http://x/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        refused = await asyncio.wait_for(reader.readuntil(b"reverse proxy\n"), 5)
        assert refused.startswith(b"HTTP/1.1 400")
        await asyncio.sleep(0.2)
        writer.write(b"hello")  # the body, after the answer
        await asyncio.sleep(2.5)  # idle for more than the header timeout (not past the idle timeout)
        writer.write(GET)
        answer, _ = await read_for(reader, 2.0)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"good")
        assert server.stats.refused.get("header_timeout", 0) == 0
    finally:
        await server.stop()
        await up.stop()


# -- a client that asks and never reads ---------------------------------------------------------------------------

PIPELINED = 2000
ANSWER = b"y" * 20_000
ANSWER_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)


async def test_pipelined_requests_from_a_client_that_never_reads_are_held_back_not_buffered() -> None:
    """A response that ends within one upstream read never waited for the client's buffers, so a client that
    pipelined 20,000 small requests (580 KB sent) and read nothing had the proxy relay every one and hold
    ~400 MB of answers for it. Now each request waits until the client has read the last answer down to the
    transport's mark: what the proxy took on is bounded by the kernel's socket buffers, and every answer
    still arrives, in order, once the client reads."""
    up, server = await start([fixed(ANSWER_HEAD + ANSWER)])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(GET * PIPELINED)
        await asyncio.sleep(2.0)  # the client reads nothing meanwhile
        relayed = len(up.requests)
        # 40 MB of answers asked for; the kernel's buffers on loopback hold a few MB (a few hundred answers)
        assert relayed <= PIPELINED // 2, f"{relayed} requests relayed for a client that read nothing"
        got = 0
        async with asyncio.timeout(60):
            while got < PIPELINED * (len(ANSWER_HEAD) + len(ANSWER)):
                piece = await reader.read(1 << 20)
                assert piece
                got += len(piece)
        writer.close()
        assert len(up.requests) == PIPELINED and got == PIPELINED * (len(ANSWER_HEAD) + len(ANSWER))
    finally:
        await server.stop()
        await up.stop()


async def test_a_request_body_with_a_transfer_coding_other_than_chunked_is_refused_not_mislabelled() -> None:
    """The proxy takes the chunked framing off a request body and sends it on with its own framing; a coding
    under it (gzip) was dropped from the labels while its bytes went on: the upstream read gzip as JSON."""
    up, server = await start([fixed(GOOD)])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                     b"2\r\n\x1f\x8b\r\n0\r\n\r\n")
        answer, _ = await read_for(reader, 2.0)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400") and b"Transfer-Encoding" in answer
        assert not up.requests
        assert server.stats.bad_requests == {"unsendable": 1}
    finally:
        await server.stop()
        await up.stop()


@pytest.mark.parametrize("stack", [[fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked"
                                          b"\r\n\r\n2\r\nok\r\n0\r\n\r\n"), fixed(GOOD)]], indirect=True)
async def test_chunked_applied_twice_is_a_502(stack: tuple[RawUpstream, ProxyServer]) -> None:
    """RFC 9112 7: chunked is applied once. The proxy took one layer off and relayed both labels; a client
    that honours both reads the body differently from the proxy."""
    up, server = stack
    answer = await one_request(server)
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert (await one_request(server)).endswith(b"good")


@pytest.mark.parametrize("stack", [[fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8bzz", close=True),
                                    fixed(GOOD)]], indirect=True)
async def test_a_body_in_a_coding_to_the_close_keeps_its_label(stack: tuple[RawUpstream, ProxyServer]) -> None:
    """A body whose transfer coding is not chunked runs to the close (RFC 9112 6.3): relayed as such, but
    its Transfer-Encoding was dropped, so the client took gzip bytes for the body itself."""
    up, server = stack
    answer = await one_request(server)
    assert b"\r\nTransfer-Encoding: gzip\r\n" in answer and answer.endswith(b"\x1f\x8bzz")


async def test_a_client_that_never_reads_its_answer_is_closed_after_the_idle_timeout() -> None:
    """Held back (above), but not forever: a connection whose client reads nothing for --idle-timeout while
    an answer waits for it is closed, as an idle one is, and its place on the port given back."""
    up, server = await start([fixed(ANSWER_HEAD + ANSWER)], idle_timeout=1.0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.transport.pause_reading()  # (the kernel's buffers fill; nothing is read)
        writer.write(GET * PIPELINED)
        closed = False
        for _ in range(100):  # ~1 s idle, then closed; 10 s to spare
            await asyncio.sleep(0.1)
            if server.connections.total == 0:
                closed = True
                break
        writer.close()
        assert closed
    finally:
        await server.stop()
        await up.stop()


async def test_a_stream_whose_client_reads_nothing_is_cut_after_the_idle_timeout() -> None:
    """The same for one long answer: the relay waits for the client's buffers to drain (the upstream held back),
    but no longer than --idle-timeout without any progress; then both connections are closed."""
    piece = b"%x\r\n%s\r\n" % (1 << 20, b"z" * (1 << 20))
    stream = fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", *[piece] * 64, b"0\r\n\r\n")
    up, server = await start([stream], idle_timeout=1.0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.transport.pause_reading()
        writer.write(GET)
        closed = False
        for _ in range(100):  # ~1 s without progress, then cut; 10 s to spare
            await asyncio.sleep(0.1)
            if server.connections.total == 0 and server._pool is not None and not server._pool._all:
                closed = True
                break
        writer.close()
        assert closed
        server.refresh_now()
        outcomes = {labels for name, labels, _ in server.snapshot.counters if name == "rooflight_client_requests_total"}
        assert any("client_disconnected" in labels for labels in outcomes)
    finally:
        await server.stop()
        await up.stop()


NOT_MODIFIED = b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 123\r\n\r\n"


@pytest.mark.parametrize("stack", [[fixed(NOT_MODIFIED), fixed(GOOD)]], indirect=True)
async def test_a_304_ends_at_its_head_whatever_its_content_length_says(stack: tuple[RawUpstream, ProxyServer]) -> None:
    """RFC 9112 6.3: a 304 has no body; its Content-Length is the representation's. Read as a body's length,
    the relay would wait for 123 bytes that never come (the client's next request with it), and take the next
    answer's bytes for them. Both requests on one kept-alive connection get their own answer, over one
    upstream connection."""
    up, server = stack
    first, second, closed = await two_requests(server)
    assert first.startswith(b"HTTP/1.1 304") and first.endswith(b"\r\n\r\n") and not closed, first
    assert second.startswith(b"HTTP/1.1 200 OK") and second.endswith(b"good"), second
    assert up.connections == 1 and len(up.requests) == 2
