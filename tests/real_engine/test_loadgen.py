"""bench/loadgen.py against a scripted SSE server on 127.0.0.1: usage counting, TTFT/ITL, bounds.

The server streams a role-only chunk, then tokens in chunks of 1 and 2 (continuous usage), then
the usage-only chunk, with fixed sleeps, so the client's numbers are known in advance.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from bench.loadgen import LoadSpec, percentile, run_load

pytestmark = pytest.mark.real_engine

GAP_S = 0.05
HUNG_S = 30.0


async def _stream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("max_tokens") == 999:
        await asyncio.sleep(HUNG_S)  # a hung server: the total timeout must end the run
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(obj: str) -> None:
        await resp.write(f"data: {obj}\n\n".encode())

    usage = '"usage": {{"prompt_tokens": 7, "completion_tokens": {}}}'
    await send('{"choices": [{"delta": {"role": "assistant"}}], ' + usage.format(0) + "}")
    await asyncio.sleep(GAP_S)
    await send('{"choices": [{"text": "a"}], ' + usage.format(1) + "}")
    await asyncio.sleep(GAP_S)
    await send('{"choices": [{"text": "bc"}], ' + usage.format(3) + "}")
    await send('{"choices": [], ' + usage.format(3) + "}")
    await send("[DONE]")
    return resp


@pytest.fixture
async def server():
    app = web.Application()
    app.router.add_post("/v1/completions", _stream)
    app.router.add_post("/v1/chat/completions", _stream)
    runner = web.AppRunner(app, shutdown_timeout=0.5)  # the hung handler is cancelled, not waited for
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_counts_usage_and_latencies(server):
    report = await run_load(LoadSpec(url=server, requests=6, concurrency=3, max_tokens=3, chat_every=2))
    assert len(report.ok) == 6
    assert report.prompt_tokens == 42 and report.completion_tokens == 18
    for r in report.ok:
        # the server waits GAP_S before the first token and GAP_S before the last chunk: the clock can only
        # read more on a busy machine (0.099 s was seen on CI's shared cores), never less, and not 40x more (a
        # unit's error is 1000x). The gap alone can read less: a client that read "a" late (a stall of the host's
        # between the server's write and the read) sees the server's next write sooner after it; their sum cannot.
        assert GAP_S * 0.9 <= r.ttft_s < GAP_S * 40, r.ttft_s
        assert len(r.itl_s) == 2  # n - 1 gaps; the 2-token chunk's gap is split over its tokens
        assert r.itl_s[0] == pytest.approx(r.itl_s[1]) and r.itl_s[0] < GAP_S * 40, r.itl_s
        assert r.ttft_s + sum(r.itl_s) >= 2 * GAP_S * 0.9, (r.ttft_s, r.itl_s)


async def test_stops_by_itself_on_a_hung_server(server):
    report = await run_load(LoadSpec(url=server, requests=2, concurrency=2, max_tokens=999,
                                     total_timeout_s=1.0))
    assert report.ended - report.started < HUNG_S / 2  # its 1 s, not the server's 30
    assert report.ok == [] and len(report.results) == 2


def test_percentile_is_nearest_rank():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.9) == 4.0
    assert percentile([], 0.5) is None
