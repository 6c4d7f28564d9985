"""Edges of the proxy's verdicts and of its relay, against hand-computed expectations: a latency exactly at its
SLO target meets it (docs/proxy.md, section Goodput: "a value equal to its target meets it"), for TPOT and
end-to-end as for TTFT; and a client that disconnects ends its handler cancelled, as aiohttp's
handler_cancellation expects, instead of the handler returning as if it had answered."""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import replace
from typing import AsyncIterator

import aiohttp
import pytest

from fake_upstream import FakeUpstream, Script
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.config import build
from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.slo import meets, parse_slo, parse_slos
from rooflight.agent.proxy.stats import ClientStats, StatsConfig
from rooflight.agent.proxy.tracker import COMPLETE, RequestRecord
from rooflight.agent.sampling.clock import FakeClock

# Binary fractions, so the edge is exact in floating point: TTFT 0.5 s, then two gaps of 1/16 s.
TTFT, TPOT, TOKENS = 0.5, 0.0625, 3
E2E = TTFT + (TOKENS - 1) * TPOT  # 0.625 s


def _stream(end: float = E2E) -> RequestRecord:
    """A finished 3-token stream started at 0 s: TTFT 0.5 s, TPOT (end - 0.5) / 2."""
    return RequestRecord(route="chat", tenant=None, start=0.0, end=end, status=200, outcome=COMPLETE, stream=True,
                         finish_reason="stop", ttft=TTFT, itl=array("d", [end - TTFT - TPOT, TPOT]), prompt_tokens=5,
                         output_tokens=TOKENS, counted_by="usage")


def test_the_edge_record_is_exactly_on_its_targets() -> None:
    r = _stream()
    assert (r.ttft, r.tpot, r.e2e) == (0.5, 0.0625, 0.625)  # exact: the tests below test the edge itself


@pytest.mark.parametrize("slo", ["tpot=0.0625", "ttft=0.5,tpot=0.0625", "e2e=0.625", "ttft=0.5,tpot=0.0625,e2e=0.625"])
def test_a_latency_equal_to_its_target_meets_it(slo: str) -> None:
    assert meets(parse_slo(slo), _stream())


@pytest.mark.parametrize("slo", ["tpot=0.0625", "e2e=0.625"])
def test_a_latency_just_over_its_target_misses_it(slo: str) -> None:
    late = _stream(end=E2E + 2 ** -10)  # TPOT 0.0625 + 2^-11 s, e2e 0.625 + 2^-10 s
    assert late.tpot > TPOT and not meets(parse_slo(slo), late)


def test_a_stream_at_its_tpot_target_is_counted_good() -> None:
    clock = FakeClock()
    slo = "ttft=0.5,tpot=0.0625"
    stats = ClientStats(StatsConfig(target="up:8000", slos=parse_slos([slo])), started=clock.monotonic())
    t0 = clock.monotonic()
    on_edge = replace(_stream(), start=t0, end=t0 + E2E)
    assert on_edge.tpot == TPOT  # still exact on the fake clock's time
    stats.observe(on_edge)
    clock.advance(10)
    snap = stats.snapshot(clock.monotonic())
    counters = {(name, labels): v for name, labels, v in snap.counters}
    assert counters[(c.SLO_REQUESTS, ("up:8000", slo, "none"))] == 1.0
    assert counters[(c.SLO_GOOD, ("up:8000", slo, "none"))] == 1.0


# -- a client that disconnects: its handler ends cancelled ------------------------------------------------------


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


async def test_a_client_disconnect_ends_the_handler_cancelled_not_answered(upstream: FakeUpstream) -> None:
    """aiohttp cancels the handler of a client that went away; a handler that swallowed that cancellation
    would return as if it had answered, and whoever cancelled it (aiohttp, a shutdown, a timeout) would be
    told it finished."""
    ended: list[str] = []
    server = ProxyServer(build(upstream.url, listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    handle = server.handle

    async def watched(request):  # type: ignore[no-untyped-def]
        try:
            response = await handle(request)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        except BaseException as exc:
            ended.append(type(exc).__name__)
            raise
        ended.append("returned")
        return response

    server.handle = watched  # type: ignore[method-assign]  # before start(): the route binds it
    await server.start(refresh_loop=False)
    try:
        upstream.scripts["long"] = Script(ttft=0.01, gaps=(0.05,) * 200)
        async with aiohttp.ClientSession() as client:
            r = await client.post(server.proxy_url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                  data=b'{"model": "long", "messages": [{"role": "user", "content": "hi"}], "stream": true}')
            assert (await r.content.readany()).startswith(b"data: ")
            r.close()  # the client goes away mid-stream
            await upstream.wait_cancelled(timeout=5.0)
            for _ in range(250):  # the handler ends right after the upstream sees the disconnect
                if ended:
                    break
                await asyncio.sleep(0.02)
        assert ended == ["cancelled"]
        assert server.stats.in_flight == 0
    finally:
        await server.stop()
