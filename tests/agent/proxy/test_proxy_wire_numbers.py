"""Numbers the upstream writes are bounded where the proxy reads them, and one value never stops /metrics.

An OpenAI answer's `usage` is the upstream's word: `"completion_tokens": 1` followed by 400 zeros is a valid
JSON integer that no float holds. Counted as it came, every snapshot of the proxy's metrics raised
OverflowError from then on: /metrics served its last page for good (requests_total stopped counting) and a
traceback was logged every refresh. Over real sockets on 127.0.0.1: a raw upstream answers such bodies
(streamed, whole, and past LARGE_JSON_BYTES, where the accounting scans instead of decoding), the proxy
relays them, and its /metrics is read back over HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterator

import aiohttp
import pytest

from raw_peers import RawUpstream, exchange, fixed
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.sse import LARGE_JSON_BYTES, MAX_USAGE_TOKENS
from rooflight.agent.proxy.stats import ClientStats, StatsConfig
from rooflight.agent.proxy.tracker import RequestRecord

HUGE = b"1" + b"0" * 400  # ~1e400 tokens: a JSON integer past any float


def _answer(body: bytes, content_type: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body)


def streamed(completion: bytes) -> bytes:
    token = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":' + completion + b"}}\n\n"
    return _answer(token + usage + b"data: [DONE]\n\n", b"text/event-stream")


def whole(completion: bytes, pad: int = 0) -> bytes:
    body = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"' + b"x" * pad
            + b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":' + completion + b"}}")
    return _answer(body, b"application/json")


def chat(stream: bool) -> bytes:
    body = b'{"model":"m","stream":%s,"messages":[{"role":"user","content":"hi"}]}' % (b"true" if stream else b"false")
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


@pytest.fixture
async def proxy(request: pytest.FixtureRequest) -> AsyncIterator[ProxyServer]:
    up = RawUpstream([fixed(answer) for answer in request.param])
    await up.start()
    config = dataclasses.replace(build(up.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"), refresh=0.05)
    server = ProxyServer(config)
    await server.start()
    yield server
    await server.stop()
    await up.stop()


async def _metrics(server: ProxyServer) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.metrics_url + "/metrics") as r:
            assert r.status == 200
            return await r.text()


def _requests(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(c.REQUESTS + "{"))


def _output_tokens(text: str, counted_by: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(c.OUTPUT_TOKENS + "{") and f'counted_by="{counted_by}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def _until_requests(server: ProxyServer, n: float, timeout: float = 10.0) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        text = await _metrics(server)
        if _requests(text) >= n or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(("proxy", "stream"), [
    ([streamed(HUGE), streamed(b"5")], True),
    ([whole(HUGE), whole(b"5")], False),
    # past LARGE_JSON_BYTES the accounting scans for at most 12 digits: 10^12 - 1 is past the bound too
    ([whole(b"9" * 12, pad=LARGE_JSON_BYTES), whole(b"5", pad=LARGE_JSON_BYTES)], False),
], indirect=["proxy"], ids=["streamed", "whole", "scanned"])
async def test_a_usage_count_past_any_float_leaves_metrics_counting(proxy: ProxyServer, stream: bool,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    port = int(proxy.proxy_url.rsplit(":", 1)[1])
    with caplog.at_level(logging.ERROR, logger="rooflight"):
        first = await exchange(port, chat(stream))
        assert first.startswith(b"HTTP/1.1 200")  # relayed as it came
        text = await _until_requests(proxy, 1)
        assert _requests(text) == 1.0  # before: absent for good (every snapshot raised OverflowError)
        second = await exchange(port, chat(stream))
        assert second.startswith(b"HTTP/1.1 200")
        text = await _until_requests(proxy, 2)
        assert _requests(text) == 2.0
    # The absurd count is not the upstream's usage: only the honest answer's 5 tokens are counted by usage.
    assert _output_tokens(text, "usage") == 5.0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def _record(output_tokens: int) -> RequestRecord:
    return RequestRecord(route="chat", tenant=None, start=0.0, end=1.0, status=200, outcome="complete", stream=True,
                         finish_reason="stop", ttft=0.1, prompt_tokens=3, output_tokens=output_tokens,
                         counted_by="usage", last_token=0.9)


def test_a_record_with_a_count_past_the_bound_is_counted_without_it() -> None:
    stats = ClientStats(StatsConfig(target="t"), started=0.0)
    stats.observe(_record(10 ** 400))  # (its TPOT alone, a float over that int, raised OverflowError)
    stats.observe(_record(5))
    snap = stats.snapshot(2.0)
    assert [v for name, _, v in snap.counters if name == c.REQUESTS] == [2.0]
    assert [v for name, _, v in snap.counters if name == c.OUTPUT_TOKENS] == [5.0]


def test_a_snapshot_leaves_out_a_value_no_float_holds_and_keeps_the_rest() -> None:
    """However an unrepresentable total got in, the snapshot drops that one series, counts it once, and
    freezes everything else."""
    stats = ClientStats(StatsConfig(target="t"), started=0.0)
    stats.observe(_record(5))
    stats._output[("none", "usage")] += 10 ** 400  # (no public way in: observe bounds what it adds)
    snap = stats.snapshot(2.0)
    names = {name for name, _, _ in snap.counters}
    assert c.REQUESTS in names and c.OUTPUT_TOKENS not in names
    assert [v for name, _, v in snap.counters if name == c.ACCOUNTING_ERRORS] == [1.0]
    assert snap.histograms and snap.gauges
    again = stats.snapshot(3.0)
    assert [v for name, _, v in again.counters if name == c.ACCOUNTING_ERRORS] == [1.0]  # counted once


def test_the_bound_is_past_any_real_answer() -> None:
    assert MAX_USAGE_TOKENS >= 10 ** 9  # 1,000 choices of a 1M-token answer
    assert float(MAX_USAGE_TOKENS) * 1e9 < 1e300  # a billion such requests still sum in a float
