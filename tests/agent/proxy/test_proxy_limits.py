"""The proxy's memory and error bounds, over real HTTP on 127.0.0.1, against hostile peers.

An upstream that never ends an SSE event must not grow the proxy, many large uploads at once must not
either, and requests or answers the proxy cannot relay get a clean status and one log line, no traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rooflight.agent.proxy import sse
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy import server as proxy_server
from rooflight.agent.proxy.server import ProxyServer
from support import serve_app

MiB = 1024 * 1024


async def start_proxy(upstream_url: str, **replace: object) -> ProxyServer:
    config = build(upstream_url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0")
    server = ProxyServer(dataclasses.replace(config, **replace))  # type: ignore[arg-type]
    await server.start(refresh_loop=False)
    return server


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


# -- an SSE event that never ends ------------------------------------------------------------------------------


class RecordingParser(sse.SSEParser):
    """The tracker's parser, watched: the most it ever held between reads, and whether it gave up."""

    instances: list["RecordingParser"] = []
    __slots__ = ("most", "gave_up")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.most, self.gave_up = 0, False
        RecordingParser.instances.append(self)

    def feed(self, chunk: bytes) -> list[sse.SSEEvent]:
        try:
            return super().feed(chunk)
        except sse.SSEError:
            self.gave_up = True
            raise
        finally:
            self.most = max(self.most, held(self))


def held(parser: sse.SSEParser) -> int:
    """What the parser holds between reads, counted from its buffers (not from its own `buffered`)."""
    return sum(map(len, parser._tail)) + sum(len(line) + 1 for line in parser._data) + len(parser._event)


async def endless_event_upstream(blocks: int) -> tuple[web.AppRunner, str, bytes]:
    """Streams `blocks` MiB of 64 KiB `data:` lines with no blank line (one event that never ends)."""
    line = b"data: " + b"x" * (64 * 1024 - 7) + b"\n"
    block = line * 16
    sent = hashlib.sha256()
    for _ in range(blocks):
        sent.update(block)

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(blocks):
            await response.write(block)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner, url = await serve_app(app, access_log=None)
    return runner, url, sent.digest()


async def test_an_event_that_never_ends_is_relayed_whole_with_the_parser_bounded(
        client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    RecordingParser.instances = []
    monkeypatch.setattr(sse, "SSEParser", RecordingParser)
    runner, url, digest = await endless_event_upstream(64)
    server = await start_proxy(url)
    try:
        got, size = hashlib.sha256(), 0
        async with asyncio.timeout(120):
            async with client.post(server.proxy_url + "/v1/completions", json={"stream": True}) as r:
                assert r.status == 200
                async for piece in r.content.iter_any():
                    got.update(piece)
                    size += len(piece)
        assert (size, got.digest()) == (64 * MiB, digest)  # every byte, unchanged
        [parser] = RecordingParser.instances
        assert parser.gave_up and parser.most <= sse.MAX_EVENT_BYTES
        assert held(parser) == parser.buffered == 0  # what it held was dropped
        assert server.stats.accounting_errors == 1  # that request went unaccounted, and is counted so
    finally:
        await server.stop()
        await runner.cleanup()


# -- many request bodies at once -------------------------------------------------------------------------------


async def slow_echo_upstream(delay: float) -> tuple[web.AppRunner, str]:
    """Answers after `delay` s with the sha256 of the body: the proxy's requests overlap that long."""

    async def echo(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        body = await request.read()
        return web.json_response({"sha256": hashlib.sha256(body).hexdigest(), "length": len(body)})

    app = web.Application(client_max_size=64 * MiB)
    app.router.add_post("/echo", echo)
    return await serve_app(app, access_log=None)


async def test_request_bodies_held_at_once_stay_under_the_budget(client: aiohttp.ClientSession) -> None:
    runner, url = await slow_echo_upstream(0.3)
    server = await start_proxy(url, max_buffered_body=1 * MiB, max_buffered_total=2 * MiB)
    bodies = [bytes([i]) * MiB for i in range(8)]  # 8 MiB offered at once against a 2 MiB budget

    async def send(body: bytes) -> dict[str, object]:
        async with client.post(server.proxy_url + "/echo", data=body) as r:
            assert r.status == 200
            return await r.json()

    try:
        async with asyncio.timeout(60):
            answers = await asyncio.gather(*(send(b) for b in bodies))
        assert [(a["sha256"], a["length"]) for a in answers] == \
            [(hashlib.sha256(b).hexdigest(), len(b)) for b in bodies]  # over the budget: streamed, not refused
        assert server.body_budget.peak == 2 * MiB  # two read whole at once, never more
        assert server.body_budget.held == 0  # every reservation given back
    finally:
        await server.stop()
        await runner.cleanup()


# -- what cannot be relayed ------------------------------------------------------------------------------------


async def raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


async def test_an_absolute_form_target_gets_400_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    hits: list[bytes] = []

    async def any_path(request: web.Request) -> web.Response:
        hits.append(request.raw_path.encode())
        return web.Response(text="upstream")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_path)
    runner, url = await serve_app(app, access_log=None)
    server = await start_proxy(url)
    port = int(server.proxy_url.rsplit(":", 1)[1])
    try:
        with caplog.at_level(logging.INFO):
            for target in (url.encode() + b"/x", b"@127.0.0.1:1/x"):  # absolute-form; one the parser rejects
                answer = await raw_exchange(port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert answer.split(b"\r\n")[0].split(b" ")[1] == b"400", answer[:200]
        assert hits == []  # nothing reached the upstream
        assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []  # no traceback
        # One line for both (a line a minute at most), and each counted by why.
        assert len([r for r in caplog.records if "400" in r.getMessage()]) == 1
        assert server.stats.bad_requests == {"target": 1, "malformed": 1}
    finally:
        await server.stop()
        await runner.cleanup()


async def raw_upstream(answer: bytes) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


async def test_a_reason_with_control_characters_is_relayed_without_them(
        client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    srv, url = await raw_upstream(b"HTTP/1.1 201 Made\x01 \x02it\r\nContent-Length: 2\r\nX-Keep: 1\r\n\r\nok")
    server = await start_proxy(url)
    try:
        with caplog.at_level(logging.INFO):
            async with client.get(server.proxy_url + "/x") as r:
                status, reason, body, header = r.status, r.reason, await r.read(), r.headers.get("X-Keep")
        assert (status, reason, body, header) == (201, "Made it", b"ok", "1")
        assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    finally:
        await server.stop()
        srv.close()
        await srv.wait_closed()


@pytest.mark.parametrize("reason, safe", [
    ("OK", "OK"), ("Not Found", "Not Found"), ("\x01\x02", ""), ("a\r\nSet-Cookie: x", "aSet-Cookie: x"),
    ("caf\u00e9", "caf"), (None, None),
])
def test_safe_reason_keeps_printable_ascii_only(reason: str | None, safe: str | None) -> None:
    assert proxy_server.safe_reason(reason) == safe
