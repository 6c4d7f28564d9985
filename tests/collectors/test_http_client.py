"""fetch_text over one session: one kept-alive connection across scrapes, and the timestamp of the render.

A new TCP connection per scrape would cost the agent (and the engine) a handshake and a socket every
cycle; at 10 Hz that is a visible share of the agent's CPU (bench/bench_process_cpu.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from rooflight.collectors.errors import SourceError
from rooflight.collectors.http import Fetched, fetch_text
from support import serve_app

PAGE = "# TYPE x counter\nx_total 1\n"


class Engine:
    """An engine on 127.0.0.1 that remembers each connection its requests came on."""

    def __init__(self) -> None:
        self.peers: list[object] = []
        self.status = 200
        self.stall_headers = 0.0  # seconds before the headers go out
        self.stall_body = 0.0  # seconds between the headers and the body
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        await asyncio.sleep(self.stall_headers)
        response = web.StreamResponse(status=self.status, headers={"Content-Type": "text/plain"})
        response.content_length = len(PAGE)
        await response.prepare(request)
        await asyncio.sleep(self.stall_body)
        await response.write(PAGE.encode())
        await response.write_eof()
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner, base = await serve_app(app, shutdown_timeout=0.1)
        self.url = f"{base}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = Engine()
    await e.start()
    yield e
    await e.stop()


async def _fetch(session: aiohttp.ClientSession, url: str, timeout: float = 5.0) -> Fetched:
    return await fetch_text(session, url, timeout=timeout, max_bytes=1 << 20, monotonic=time.monotonic)


async def test_scrapes_over_one_session_reuse_one_connection(engine: Engine) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            fetched = await _fetch(session, engine.url)
            assert fetched.text == PAGE
    assert len(engine.peers) == 20
    assert len(set(engine.peers)) == 1


async def test_a_timeout_costs_one_new_connection_then_keep_alive_resumes(engine: Engine) -> None:
    async with aiohttp.ClientSession() as session:
        await _fetch(session, engine.url)
        engine.stall_headers = 0.5
        with pytest.raises(SourceError) as err:
            await _fetch(session, engine.url, timeout=0.1)
        assert err.value.reason == "timeout"
        engine.stall_headers = 0.0
        for _ in range(5):
            await _fetch(session, engine.url)
    assert len(engine.peers) == 7
    first, timed_out, *after = engine.peers
    assert timed_out == first  # the stalled request went on the kept-alive connection
    assert len(set(after)) == 1 and after[0] != first  # the abandoned one is closed, its successor kept


async def test_the_timestamp_is_when_the_headers_came_not_the_last_byte(engine: Engine) -> None:
    engine.stall_headers, engine.stall_body = 0.2, 0.4
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        fetched = await _fetch(session, engine.url)
        end = time.monotonic()
    assert fetched.duration >= 0.6 - 0.02
    # the midpoint of sending and the headers: about start + 0.1, well before the body's end
    assert start + 0.08 <= fetched.timestamp <= start + 0.2 + 0.1 < end
