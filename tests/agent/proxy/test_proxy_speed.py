"""The proxy's clock and bytes, as issue 28 asks: a client's TTFT starts at its request's first byte on the
proxy's socket, and the headers reach the other side byte for byte (names in the case they were sent)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import aiohttp
import pytest

from fake_upstream import FakeUpstream, Script
from rooflight.agent.proxy.server import ProxyServer
from test_proxy_relay import CHAT, chat, scrape, start_proxy
from rooflight.agent.proxy import catalog as c


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
