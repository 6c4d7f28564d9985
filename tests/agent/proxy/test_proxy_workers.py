"""`rooflight proxy --workers N`: N relay processes on one port (SO_REUSEPORT), one /metrics whose totals are
every request sent, whichever worker relayed it."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from demo_procs import async_child
from fake_upstream import FakeUpstream, Script
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.workers import parse_workers
from support import free_port

REQUESTS = 40
TOKENS = 4  # per request: one first token and three gaps


def totals(text: str) -> dict[str, float]:
    """Each sample name's value summed over its labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def wait_healthy(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(1200):  # the workers are spawned, import and bind: ~3 s here, 60 s allowed on a busy machine
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


async def one(port: int) -> bytes:
    """A streamed request on a connection of its own, so the kernel places each one afresh."""
    body = json.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True}}).encode()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body) as r:
            assert r.status == 200
            return await r.read()


async def test_two_workers_share_the_port_and_metrics_count_every_request() -> None:
    up = FakeUpstream(scripts={"m": Script(ttft=0.01, gaps=(0.01,) * (TOKENS - 1))})
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--slo", "ttft=5,tpot=5",
                "--log-level", "warning",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy")
                workers = psutil.Process(proc.pid).children()
                assert len(workers) >= 2  # the workers (and multiprocessing's resource tracker)
                bodies = await asyncio.gather(*(one(port) for _ in range(REQUESTS)))
                assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)
                # Both workers relayed some: each holds a kept-alive connection to the upstream now.
                up_port = int(up.url.rsplit(":", 1)[1])
                relaying = [w for w in workers
                            if any(conn.raddr and conn.raddr[1] == up_port for conn in w.net_connections("tcp"))]
                assert len(relaying) == 2, "the kernel gave every connection to one worker"
                m: dict[str, float] = {}
                for _ in range(100):  # records reach /metrics within a flush and a refresh (~1.1 s)
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        m = totals(await r.text())
                    if m.get(c.REQUESTS + "_total", m.get(c.REQUESTS, 0)) >= REQUESTS:
                        break
                    await asyncio.sleep(0.1)
            requests = m.get(c.REQUESTS + "_total", m.get(c.REQUESTS))
            assert requests == REQUESTS  # exactly: none lost, none twice
            assert m.get(c.OUTPUT_TOKENS + "_total", m.get(c.OUTPUT_TOKENS)) == REQUESTS * TOKENS
            assert m[c.TTFT_HISTOGRAM + "_count"] == REQUESTS
            assert m[c.ITL_HISTOGRAM + "_count"] == REQUESTS * (TOKENS - 1)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        _, alive = psutil.wait_procs(workers, timeout=10)  # the workers (and spawn's resource tracker) end too
        assert not alive
    finally:
        await up.stop()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "100000"])
def test_a_bad_worker_count_says_what_to_fix(value: str) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        parse_workers(value)


def test_the_ports_counters_are_the_sums_of_every_workers_latest() -> None:
    """/metrics over N workers shows one port: in flight now is what each worker holds now, added; refusals
    and bad requests are each worker's running totals, added by reason. Each worker's latest message replaces
    its previous one (they are totals, not increments)."""
    from types import SimpleNamespace

    from rooflight.agent.proxy.stats import ClientStats, StatsConfig
    from rooflight.agent.proxy.workers import Workers

    stats = ClientStats(StatsConfig(target="up:8000"), started=0.0)
    workers = Workers(SimpleNamespace(stats=stats), 3)
    workers._handle(0, ("stats", [], {"in_flight": 3, "over_budget": 1, "accounting_errors": 0,
                                      "refused": {"per_client": 2}, "bad_requests": {"malformed": 1}}))
    workers._handle(1, ("stats", [], {"in_flight": 4, "over_budget": 0, "accounting_errors": 2,
                                      "refused": {"per_client": 1, "max_connections": 5}, "bad_requests": {}}))
    workers._handle(0, ("stats", [], {"in_flight": 1, "over_budget": 1, "accounting_errors": 0,
                                      "refused": {"per_client": 6}, "bad_requests": {"malformed": 1, "target": 2}}))
    # worker 2 has sent nothing yet: it adds nothing
    assert stats.in_flight == 1 + 4
    assert stats.over_budget == 1 and stats.accounting_errors == 2
    assert dict(stats.refused) == {"per_client": 6 + 1, "max_connections": 5}
    assert dict(stats.bad_requests) == {"malformed": 1, "target": 2}


async def test_a_worker_that_dies_stops_the_proxy_with_exit_1() -> None:
    """A worker killed (OOM, a crash) must not leave the proxy serving on fewer cores than asked for: the
    whole exits 1, so its supervisor restarts it (exit 0 would read as a clean stop)."""
    up = FakeUpstream(scripts={"m": Script(ttft=0.01, gaps=(0.01,))})
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--log-level", "warning",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy")
            workers = [w for w in psutil.Process(proc.pid).children()
                       if "resource_tracker" not in " ".join(w.cmdline())]
            assert len(workers) == 2
            workers[0].kill()
            assert await asyncio.wait_for(proc.wait(), 60) == 1
            _, alive = psutil.wait_procs(workers[1:], timeout=10)
            assert not alive  # the other worker is stopped too
    finally:
        await up.stop()
