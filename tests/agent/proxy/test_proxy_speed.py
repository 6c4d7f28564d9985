"""The proxy's clock and bytes: a client's TTFT starts at its request's first byte on the
proxy's socket, and the headers reach the other side byte for byte (names in the case they were sent)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from fake_upstream import FakeUpstream, Script
from test_proxy_relay import CHAT, chat, scrape, start_proxy
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy import relay as rl


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One chunked response, whole (the proxy keeps the connection open after it)."""
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        piece = await asyncio.wait_for(reader.read(65536), 10)
        if not piece:
            break
        data += piece
    return data


async def test_a_slowly_sent_requests_ttft_includes_its_send_time(upstream: FakeUpstream) -> None:
    upstream.scripts["s"] = Script(ttft=0.01, gaps=(0.005,) * 3)
    server = await start_proxy(upstream.url)
    try:
        body = chat("s")
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.6)  # the client takes 0.6 s to send the rest of its request
        writer.write(f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = await read_response(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and b"[DONE]" in answer
        async with aiohttp.ClientSession() as client:
            m = await scrape(server, client)
        ttft = m[c.TTFT][(("percentile", "50"), ("window", "10s"))]
        assert 0.6 <= ttft < 5.0  # the 0.6 s of sending included (it read ~0.01 s when timed from the last byte)
    finally:
        await server.stop()


async def test_each_request_on_a_kept_alive_connection_starts_its_own_clock(upstream: FakeUpstream) -> None:
    """A client that reuses its connection (every OpenAI SDK does) sends its second request 1.5 s after the
    first: that request's TTFT is its own ~0.01 s, not timed from the first request's first byte (>= 1.5 s)."""
    upstream.scripts["s"] = Script(ttft=0.01, gaps=(0.005,) * 3)
    server = await start_proxy(upstream.url)
    try:
        body = chat("s")
        request = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        for pause in (0.0, 1.5):
            await asyncio.sleep(pause)
            writer.write(request)
            answer = await read_response(reader)
            assert answer.startswith(b"HTTP/1.1 200") and b"[DONE]" in answer
        writer.close()
        async with aiohttp.ClientSession() as client:
            m = await scrape(server, client)
        assert m[c.TTFT_HISTOGRAM + "_count"][(("route", "chat"),)] == 2  # both requests, on one connection
        assert m[c.TTFT_HISTOGRAM + "_sum"][(("route", "chat"),)] < 0.75  # ~0.02 s; >= 1.5 s when timed from the first request
    finally:
        await server.stop()


async def raw_upstream(answer: bytes, seen: list[bytes]) -> asyncio.AbstractServer:
    """An upstream that records each request's head and answers `answer`, as bytes (lower-case names)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_an_interim_answer_is_not_taken_for_the_response() -> None:
    """An upstream that sends 103 Early Hints before its answer (RFC 9110 15.2): the client gets the final
    200 and its body, not the 1xx as its response and the 200 as garbage after it."""
    answer = (b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
              b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi")
    up = await raw_upstream(answer, [])
    server = await start_proxy("http://127.0.0.1:%d" % up.sockets[0].getsockname()[1])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        writer.write(b"GET /x HTTP/1.1\r\nhost: me\r\nConnection: close\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"\r\n\r\nhi")
        assert b"103" not in got
    finally:
        await server.stop()
        up.close()


async def test_headers_are_relayed_byte_for_byte_both_ways() -> None:
    """aiohttp wrote `date` as `Date` and `content-type` as `Content-Type` (and added its own `Server`): the
    relay now sends each header line as it came, minus the hop-by-hop ones."""
    answer = (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
              b"content-type: text/plain; charset=utf-8\r\nx-Odd-CASE: y\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi")
    seen: list[bytes] = []
    up = await raw_upstream(answer, seen)
    server = await start_proxy("http://127.0.0.1:%d" % up.sockets[0].getsockname()[1])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        writer.write(b"GET /x?a=%41 HTTP/1.1\r\nhost: me\r\nx-lower: 1\r\nX-UPPER: 2\r\nuser-agent: curl/8\r\n"
                     b"accept: */*\r\nConnection: close\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert got == (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
                       b"content-type: text/plain; charset=utf-8\r\nx-Odd-CASE: y\r\ncontent-length: 2\r\n"
                       b"Connection: close\r\n\r\nhi")  # the last line is the proxy's own hop (the client asked it)
        host = b"Host: 127.0.0.1:%d" % up.sockets[0].getsockname()[1]
        assert seen == [b"GET /x?a=%41 HTTP/1.1\r\n" + host + b"\r\nx-lower: 1\r\nX-UPPER: 2\r\n"
                        b"user-agent: curl/8\r\naccept: */*\r\n\r\n"]
    finally:
        await server.stop()
        up.close()


async def test_an_http_1_0_client_gets_a_chunked_stream_unframed(upstream: FakeUpstream) -> None:
    """The chunked framing goes to an HTTP/1.1 client as it came; an HTTP/1.0 client cannot read it: it
    gets the bytes the framing carried, and the end of the body is the close."""
    upstream.scripts["s"] = Script(ttft=0.0, gaps=(0.001,) * 5)
    server = await start_proxy(upstream.url)
    try:
        body = chat("s")
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        writer.write(f"POST {CHAT} HTTP/1.0\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
        assert rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n")
    finally:
        await server.stop()


# -- the relay's framing, piece by piece ------------------------------------------------------------------------

CHUNKED = (b"5\r\nhello\r\n1a;name=value\r\n" + b"x" * 26 + b"\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(CHUNKED)])
def test_the_chunked_framing_comes_off_however_the_reads_cut_it(step: int) -> None:
    reader = rl.ChunkedReader()
    payload = b""
    for i in range(0, len(CHUNKED), step):
        assert not reader.done
        payload += reader.feed(CHUNKED[i:i + step])
    assert payload == b"hello" + b"x" * 26 and reader.done


def test_the_chunked_framing_comes_off_wherever_one_cut_falls() -> None:
    """Two reads, cut at every byte: a cut right after a chunk's body (before its CRLF, or between CR and LF)
    is where the whole-chunks fast path must hand over to the careful one."""
    for cut in range(1, len(CHUNKED)):
        reader = rl.ChunkedReader()
        payload = reader.feed(CHUNKED[:cut]) + reader.feed(CHUNKED[cut:])
        assert (payload, reader.done) == (b"hello" + b"x" * 26, True), f"cut at {cut}"


@pytest.mark.parametrize("broken", [b"zz\r\nhello\r\n", b"-5\r\nhello\r\n", b"1" * 5000])
def test_a_broken_chunked_framing_is_an_error(broken: bytes) -> None:
    with pytest.raises(ValueError):
        rl.ChunkedReader().feed(broken)


def test_a_response_head_keeps_its_lines_and_says_how_the_body_ends() -> None:
    head = rl.parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nConnection: keep-alive, X-Hop\r\n"
                         b"x-hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\ncontent-length: 9\r\n"
                         b"set-cookie: a=1\r\nset-cookie: b=2", "POST")
    assert (head.status, head.framing, head.close, head.content_type) == (200, rl.CHUNKED, False, "text/event-stream")
    # hop-by-hop lines (and those Connection names) go; Content-Length goes with chunked (RFC 9112 6.3)
    assert head.lines == [b"content-type: text/event-stream", b"set-cookie: a=1", b"set-cookie: b=2"]
    assert head.framing_lines == [b"Transfer-Encoding: chunked"]
    assert rl.parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12", "HEAD").framing == rl.NONE
    assert rl.parse_head(b"HTTP/1.1 204 No Content", "GET").framing == rl.NONE
    assert rl.parse_head(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain", "GET").framing == rl.CLOSE
    length = rl.parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close", "GET")
    assert (length.framing, length.length, length.close) == (rl.LENGTH, 12, True)


@pytest.mark.parametrize("block, method, framing, close", [
    # RFC 9112 6.3: a 304 has no body, whatever Content-Length says (it is the representation's length)
    (b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 123", "GET", rl.NONE, False),
    # the final transfer coding decides: chunked last is chunked, across one line or several
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", "POST", rl.CHUNKED, False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked", "POST", rl.CHUNKED, False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip", "POST", rl.CLOSE, True),  # ends at the close
    # HTTP/1.0 closes after the response unless it says keep-alive
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2", "GET", rl.LENGTH, False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2", "GET", rl.LENGTH, True),
    (b"HTTP/1.0 200 OK\r\nConnection: x-trace\r\nContent-Length: 2", "GET", rl.LENGTH, True),  # no keep-alive
])
def test_how_a_response_body_ends(block: bytes, method: str, framing: str, close: bool) -> None:
    head = rl.parse_head(block, method)
    assert (head.framing, head.close) == (framing, close)


def test_hop_by_hop_lines_go_even_when_connection_does_not_name_them() -> None:
    """RFC 9110 7.6.1: Keep-Alive, Proxy-Connection and the rest are one connection's; an upstream that sends
    Keep-Alive without naming it in Connection must not hand its timeout to the client's hop."""
    head = rl.parse_head(b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nProxy-Connection: keep-alive\r\n"
                         b"Upgrade: h2c\r\nx-request-id: 7\r\nContent-Length: 2", "GET")
    assert head.lines == [b"x-request-id: 7", b"Content-Length: 2"]


@pytest.mark.parametrize("bad", [
    b"HTTP/2 200 OK", b"HTTP/1.1 20 OK", b"ICY 200 OK",
    b"HTTP/1.1 200 OK\r\n folded: value",  # obs-fold
    b"HTTP/1.1 200 OK\r\nno colon",
    b"HTTP/1.1 200 OK\r\nbad name: x",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nx: a\nb",
])
def test_a_response_head_that_cannot_be_relayed_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        rl.parse_head(bad, "GET")


async def test_a_client_that_stops_reading_holds_the_upstream_back_not_the_proxys_memory(
        upstream: FakeUpstream) -> None:
    """Flow control through the relay: 40 MiB offered to a client that reads nothing for a while; the proxy
    holds at most its transport's high-water mark plus a read or two for it, and the upstream waits."""
    upstream.scripts["big"] = Script(ttft=0.0, gaps=(0.0,) * 40, pad=1024 * 1024)
    server = await start_proxy(upstream.url)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server.proxy_url))
        body = chat("big")
        writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await reader.read(1024)  # the answer has begun; now the client stops reading
        held = 0
        for _ in range(20):
            await asyncio.sleep(0.05)
            assert server._pool is not None
            held = max([held] + [conn._client.get_write_buffer_size() for conn in server._pool._all
                                 if conn._client is not None])
        assert held <= 1024 * 1024  # 64 KiB high water + a read of at most 256 KiB, with room to spare
        assert "big" not in upstream.finished  # the upstream was held back instead
        got = 1024
        while True:  # and the whole stream arrives once the client reads again
            piece = await asyncio.wait_for(reader.read(1 << 20), 10)
            got += len(piece)
            if not piece or piece.endswith(b"0\r\n\r\n"):
                break
        writer.close()
        assert got > 40 * 1024 * 1024
    finally:
        await server.stop()


async def test_an_idle_upstream_connection_is_reused_then_closed_after_the_keepalive(upstream: FakeUpstream) -> None:
    upstream.scripts["s"] = Script(ttft=0.0, gaps=(0.001,) * 3)
    server = await start_proxy(upstream.url)
    assert server._pool is not None
    server._pool.keepalive = 0.5
    try:
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.post(server.proxy_url + CHAT, data=chat("s")) as r:
                    assert (await r.read()).endswith(b"data: [DONE]\n\n")
        assert len({seen.peer for seen in upstream.seen}) == 1  # one upstream connection carried all three
        assert len(server._pool._all) == 1
        for _ in range(50):  # closed at ~0.5 s idle; 5 s to spare
            await asyncio.sleep(0.1)
            if not server._pool._all:
                break
        assert not server._pool._all
    finally:
        await server.stop()


async def test_an_upstream_host_name_is_looked_up_once_not_per_connection(upstream: FakeUpstream,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's connector cached the upstream's address for 60 s; the relay's pool does too: five requests
    on five fresh upstream connections (each client cut its stream) make one lookup."""
    upstream.scripts["s"] = Script(ttft=0.0, gaps=(0.001,) * 3)
    server = await start_proxy(upstream.url.replace("127.0.0.1", "localhost"))
    loop = asyncio.get_running_loop()
    lookups: list[object] = []
    real = loop.getaddrinfo

    async def counted(host: object, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        return await real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "getaddrinfo", counted)
    try:
        for _ in range(5):
            async with aiohttp.ClientSession() as client:
                async with client.post(server.proxy_url + CHAT, data=chat("s")) as r:
                    assert (await r.read()).endswith(b"data: [DONE]\n\n")
            assert server._pool is not None
            for conn in list(server._pool._all):
                conn.close()  # the next request needs a new upstream connection
            await asyncio.sleep(0.05)
        assert lookups.count("localhost") == 1
    finally:
        await server.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key (PEM files under tmp)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upstream")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp / "up.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "up.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return tmp / "up.crt", tmp / "up.key"


async def test_an_https_upstream_is_relayed_over_verified_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    crt, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(crt), str(key))
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello"
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        writer.close()

    up = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    monkeypatch.setenv("SSL_CERT_FILE", str(crt))  # the proxy trusts the upstream's certificate, nothing else
    server = await start_proxy("https://127.0.0.1:%d" % up.sockets[0].getsockname()[1])
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(server.proxy_url + "/v1/models") as r:
                assert r.status == 200 and await r.read() == b"hello"
        assert len(seen) == 1 and seen[0].startswith(b"GET /v1/models HTTP/1.1\r\n")
    finally:
        await server.stop()
        up.close()
    # Without the certificate trusted, the upstream is refused (502), never relayed unverified.
    monkeypatch.delenv("SSL_CERT_FILE")
    up = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    server = await start_proxy("https://127.0.0.1:%d" % up.sockets[0].getsockname()[1])
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(server.proxy_url + "/v1/models") as r:
                assert r.status == 502
    finally:
        await server.stop()
        up.close()
