"""The proxy against hostile and careless peers, over real sockets on 127.0.0.1:
credentials in --upstream, bad requests, the accounting's memory budget, and connections that hold the
port (slow headers, idle sockets, one client taking every connection)."""

from __future__ import annotations

import asyncio
import contextlib
import base64
import dataclasses
import json
import logging
from typing import AsyncIterator

import aiohttp
import pytest

from fake_upstream import FakeUpstream
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def start_proxy(upstream_url: str, replace: dict[str, object] | None = None, **flags: object) -> ProxyServer:
    config = build(upstream_url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", **flags)  # type: ignore[arg-type]
    server = ProxyServer(dataclasses.replace(config, **(replace or {})))  # type: ignore[arg-type]
    await server.start(refresh_loop=False)
    return server


def with_credentials(url: str, user: str = "svc", password: str = "s3cret") -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


async def echo(client: aiohttp.ClientSession, server: ProxyServer, headers: dict[str, str]) -> tuple[int, list[str]]:
    """The status and the Authorization headers the upstream saw for one request."""
    async with client.post(server.proxy_url + "/echo", data=b"{}", headers=headers) as r:
        if r.status != 200:
            return r.status, []
        seen = await r.json()
    return r.status, [v for k, v in seen["headers"] if k.lower() == "authorization"]


# -- 7. credentials in --upstream ------------------------------------------------------------------------------


def test_credentials_in_the_upstream_are_refused_unless_lent_on_purpose(upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError, match="--upstream-credentials-for-anonymous") as info:
        build(with_credentials(upstream.url))
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="percent-encode") as info:  # '/' would end the authority early
        build("http://svc:s3/cret@127.0.0.1:8000", upstream_credentials_for_anonymous=True)
    assert "s3" not in str(info.value).replace("--upstream", "")


async def test_lent_credentials_go_to_anonymous_requests_only(upstream: FakeUpstream,
                                                              client: aiohttp.ClientSession) -> None:
    server = await start_proxy(with_credentials(upstream.url, "svc", "p%40ss"), upstream_credentials_for_anonymous=True)
    try:
        lent = "Basic " + base64.b64encode(b"svc:p@ss").decode()
        assert await echo(client, server, {}) == (200, [lent])
        # A client with its own credentials is relayed with its own, never the proxy's, and never refused.
        assert await echo(client, server, {"Authorization": "Bearer sk-client"}) == (200, ["Bearer sk-client"])
        assert await echo(client, server, {"Authorization": "Basic Zm9vOmJhcg=="}) == (200, ["Basic Zm9vOmJhcg=="])
        assert "s3cret" not in repr(server.config) and "p%40ss" not in server.config.upstream
    finally:
        await server.stop()


async def test_a_bearer_token_is_relayed_by_a_proxy_without_credentials(upstream: FakeUpstream,
                                                                       client: aiohttp.ClientSession) -> None:
    server = await start_proxy(upstream.url)
    try:
        assert await echo(client, server, {"Authorization": "Bearer sk-client"}) == (200, ["Bearer sk-client"])
        assert await echo(client, server, {}) == (200, [])  # the proxy adds no Authorization of its own
    finally:
        await server.stop()


# -- 6. the accounting's copies of answers, in total ---------------------------------------------------------

MiB = 1024 * 1024


class HeldCopies:
    """What every tracker holds between reads (its JSON body copy and its SSE parser), in total and at most."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def watch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rooflight.agent.proxy import tracker as tr

        held = self
        original = tr.RequestTracker.on_bytes

        def on_bytes(tracker: tr.RequestTracker, t: float, data: bytes) -> None:
            before = copies(tracker)
            try:
                original(tracker, t, data)
            finally:
                held.now += copies(tracker) - before
                held.peak = max(held.peak, held.now)

        monkeypatch.setattr(tr.RequestTracker, "on_bytes", on_bytes)


def copies(tracker: object) -> int:
    body = getattr(tracker, "_body", None)
    parser = getattr(tracker, "_parser", None)
    return (len(body) if body else 0) + (parser.buffered if parser is not None else 0)


async def held_answers_upstream(kind: str, size: int, hold: float) -> tuple[object, str]:
    """Answers `size` bytes at once, then holds the answer open `hold` s before ending it: a JSON answer
    (its last byte held back) or an SSE event that is not ended until then."""
    from aiohttp import web
    from support import serve_app

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        if kind == "json":
            body = json.dumps({"choices": [{"message": {"content": "x" * size}, "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 2}}).encode()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[:-1])
            await asyncio.sleep(hold)
            await response.write(body[-1:])
        else:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices":[{"delta":{"content":"' + b"x" * size)
            await asyncio.sleep(hold)
            await response.write(b'"}}]}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    return await serve_app(app, access_log=None)


@pytest.mark.parametrize("kind, stream", [("json", False), ("sse", True)])
async def test_answers_held_at_once_are_accounted_within_a_total_budget(
        kind: str, stream: bool, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCopies()
    held.watch(monkeypatch)
    runner, url = await held_answers_upstream(kind, MiB, hold=1.0)
    server = await start_proxy(url, replace={"max_accounting_total": 3 * MiB})

    async def ask() -> int:
        async with client.post(server.proxy_url + "/v1/completions", json={"stream": stream}) as r:
            assert r.status == 200
            return len(await r.read())

    try:
        sizes = await asyncio.wait_for(asyncio.gather(*(ask() for _ in range(8))), 60)  # 8 MiB offered at once
        assert len(set(sizes)) == 1 and sizes[0] > MiB  # every answer relayed whole
        assert held.peak <= 3 * MiB + 64 * 1024  # within the budget (and one read)
        assert server.accounting_budget.held == 0  # every reservation given back
        server.refresh_now()
        total = {name: sum(v for n, _, v in server.snapshot.counters if n == name) for name in (
            "rooflight_client_requests_total", "rooflight_client_accounting_over_budget_total",
            "rooflight_client_output_tokens_total")}
        skipped = total["rooflight_client_accounting_over_budget_total"]
        assert 4 <= skipped < 8 and total["rooflight_client_requests_total"] == 8  # every request is counted,
        per_answer = 2 if kind == "json" else 1  # `usage` says 2; a stream without usage counts its one chunk
        assert total["rooflight_client_output_tokens_total"] == per_answer * (8 - skipped)  # its tokens if read
    finally:
        await server.stop()
        await runner.cleanup()  # type: ignore[attr-defined]


# -- 5. what a connection can hold: headers in time, idle in bounds, a share of the port ------------------------


async def connect(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


def port_of(server: ProxyServer) -> int:
    return int(server.proxy_url.rsplit(":", 1)[1])


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the proxy closes the connection (EOF) within `seconds` (what it sent first is skipped)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
        return True
    except (asyncio.TimeoutError, ConnectionError):
        return False


async def test_header_tricklers_and_silent_sockets_are_closed(upstream: FakeUpstream) -> None:
    server = await start_proxy(upstream.url, replace={"read_header_timeout": 1.0})
    port = port_of(server)
    stop = asyncio.Event()

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():  # one header byte every 0.2 s, never the blank line
            writer.write(b"X")
            await asyncio.sleep(0.2)

    try:
        tricklers = [await connect(port) for _ in range(30)]
        silent = [await connect(port) for _ in range(30)]
        tasks = [asyncio.create_task(trickle(w)) for _, w in tricklers]
        start = asyncio.get_running_loop().time()
        closed = await asyncio.gather(*(closed_within(r, 4.0) for r, _ in tricklers + silent))
        took = asyncio.get_running_loop().time() - start
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert all(closed) and took < 4.0  # at ~1 s; 4x to spare
        assert server.stats.refused == {"header_timeout": 60}
        # A slow body is not a slow header: the upload takes 2.5 s and the request is relayed.
        reader, writer = await connect(port)
        body = b"x" * 5
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
        for byte in body:
            await asyncio.sleep(0.5)
            writer.write(bytes([byte]))
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.startswith(b"HTTP/1.1 200") and b'"length": 5' in answer
        writer.close()
    finally:
        await server.stop()


async def test_an_idle_keep_alive_connection_is_closed(upstream: FakeUpstream) -> None:
    server = await start_proxy(upstream.url, replace={"idle_timeout": 1.0, "read_header_timeout": 30.0})
    try:
        reader, writer = await connect(port_of(server))
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head  # kept alive
        assert await closed_within(reader, 4.0)  # then closed once idle ~1 s
        writer.close()
    finally:
        await server.stop()


async def test_one_client_holds_its_share_of_the_port_and_others_still_get_through(upstream: FakeUpstream) -> None:
    server = await start_proxy(upstream.url, replace={"max_connections": 12, "max_connections_per_client": 6,
                                                      "read_header_timeout": 30.0})
    port = port_of(server)
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(6):
            held.append((await connect(port, "127.0.0.1"))[1])
        reader, writer = await connect(port, "127.0.0.1")  # a 7th from the same client
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 503")
        writer.close()
        reader, writer = await connect(port, "127.0.0.2")  # another client is served meanwhile
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200")
        writer.close()
        for source in ("127.0.0.2",) * 6:
            held.append((await connect(port, source))[1])
        reader, writer = await connect(port, "127.0.0.3")  # 12 open: the port is full for everyone
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 503")
        writer.close()
        assert server.stats.refused == {"per_client": 1, "max_connections": 1}
    finally:
        for w in held:
            w.close()
        await asyncio.sleep(0.2)
        open_after = server.connections.total
        await server.stop()
    assert open_after == 0  # every closed connection left its count


# -- 8. bad requests: answered, counted, logged a line a minute at most, never their bytes ---------------------


async def test_a_flood_of_bad_requests_is_counted_not_logged_line_by_line(
        upstream: FakeUpstream, caplog: pytest.LogCaptureFixture) -> None:
    server = await start_proxy(upstream.url)
    port = port_of(server)
    bad = [
        b"\x1b[31mEVIL\x1b[0m / HTTP/1.1\r\nHost: x\r\n\r\n",  # not a method: escape sequences for a terminal
        b"GET / HTTP/1.1\r\nHost: x\r\nEVIL\x1b]0;owned\x07 no colon\r\n\r\n",  # a header without ':'
        b"GET http://EVIL.example/\x1b[2J HTTP/1.1\r\nHost: x\r\n\r\n",  # absolute-form
    ]

    async def send(request: bytes) -> bytes:
        reader, writer = await connect(port)
        writer.write(request)
        try:
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()

    try:
        with caplog.at_level(logging.DEBUG):
            answers = await asyncio.gather(*(send(bad[i % len(bad)]) for i in range(300)))
        assert all(a.split(b" ", 2)[1] == b"400" for a in answers), {a[:40] for a in answers}
        assert sum(server.stats.bad_requests.values()) == 300
        assert upstream.seen == []
        lines = [r for r in caplog.records if r.levelno >= logging.INFO]
        assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]  # not 300
        text = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
        assert "EVIL" not in text and "\x1b" not in text and "\\x1b" not in text  # no client bytes, escaped or not
    finally:
        await server.stop()


# -- 5b. a request whose body never comes -----------------------------------------------------------------------


async def test_a_body_that_stops_arriving_is_closed_and_counted(upstream: FakeUpstream) -> None:
    """Headers were timed, bodies were not: a request that announced a body and sent none (or a byte every
    5 s) held its connection, and an upstream connection, forever. Now no body byte for read_body_timeout
    closes it, counted as refused (body_timeout)."""
    server = await start_proxy(upstream.url, replace={"read_body_timeout": 1.0, "read_header_timeout": 30.0})
    port = port_of(server)
    heads = [
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nx",  # streamed, then nothing
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",  # buffered, never sent
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
    ]
    try:
        conns = [await connect(port) for _ in heads]
        for (_, writer), head in zip(conns, heads):
            writer.write(head)
        start = asyncio.get_running_loop().time()
        closed = await asyncio.gather(*(closed_within(r, 6.0) for r, _ in conns))
        took = asyncio.get_running_loop().time() - start
        assert all(closed) and took < 6.0  # at ~1 s; 6x to spare
        assert server.stats.refused == {"body_timeout": 3}
        assert server._pool is not None
        assert 0 < server._pool.limit <= server.config.max_connections  # upstream sockets bounded
        # A slow body that is in within the timeout is relayed: a byte every 0.1 s against 1 s in all.
        reader, writer = await connect(port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
        for byte in b"hello":
            await asyncio.sleep(0.1)
            writer.write(bytes([byte]))
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.startswith(b"HTTP/1.1 200") and b'"length": 5' in answer
        for _, w in conns + [(reader, writer)]:
            w.close()
    finally:
        await server.stop()


@pytest.mark.parametrize("length", [100, 100_000_000])  # read whole, then streamed
async def test_a_body_that_trickles_is_closed_at_its_total_deadline(upstream: FakeUpstream, length: int) -> None:
    """The body's timeout was per pause: a byte every 0.25 s against 1 s held the connection (and, for a body
    streamed through, an upstream one) for as long as the client liked (300 such at a byte every 8 s were all
    open at 64 s). Now the waits add up: the connection is closed once they pass 1 s."""
    server = await start_proxy(upstream.url, replace={"read_body_timeout": 1.0, "read_header_timeout": 30.0})
    reader, writer = await connect(port_of(server))
    try:
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length)
        start, closed = asyncio.get_running_loop().time(), False
        for _ in range(40):  # 10 s of a byte every 0.25 s
            await asyncio.sleep(0.25)
            if reader.at_eof() or writer.is_closing():
                closed = True
                break
            try:
                writer.write(b"x")
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            with contextlib.suppress(asyncio.TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.001) == b"":
                    closed = True
                    break
        took = asyncio.get_running_loop().time() - start
        assert closed and took < 5.0, took  # at ~1 s; 5x to spare
        assert server.stats.refused == {"body_timeout": 1}
    finally:
        writer.close()
        await server.stop()


# -- 7b. what an error message or --check-only shows of the upstream URL ------------------------------------------


@pytest.mark.parametrize("what", ["--upstream", "--proxy-upstream"])
def test_a_query_or_fragment_of_the_upstream_is_not_echoed(what: str) -> None:
    from rooflight.agent.config.urls import parse_upstream

    for url in ("http://127.0.0.1:8000/v1?token=sk-SECRET", "http://127.0.0.1:8000/v1#sk-SECRET",
                "http://127.0.0.1:8000/v1?a=1#sk-SECRET"):
        with pytest.raises(ConfigError, match="without .query or #fragment") as info:
            parse_upstream(url, what)
        assert "SECRET" not in str(info.value) and "127.0.0.1:8000/v1" in str(info.value)


def test_check_only_escapes_control_characters_in_the_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    from rooflight.agent.proxy import cli as proxy_cli
    from test_proxy_cli import parse

    assert proxy_cli.cmd_proxy(parse("--upstream", "http://127.0.0.1:8000/v1\x1b[2J\x07", "--check-only")) == 0
    out = capsys.readouterr().out
    assert "configuration ok" in out and "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out
