"""/metrics renders off the event loop: a slow render delays that scrape, not the agent's other answers."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from typing import Any, Iterator

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from rooflight.agent.metrics.http import metrics_handler, render_metrics
from support import serve_app


class SlowCollector(Collector):
    """A collector standing in for a huge page: each render takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.threads: list[str] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)
        yield GaugeMetricFamily("rooflight_test_value", "A value.", value=1.0)


async def _healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def _serve(registry: CollectorRegistry) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry))
    app.router.add_get("/-/healthy", _healthy)
    return await serve_app(app)


async def test_a_slow_render_does_not_block_the_loop() -> None:
    registry = CollectorRegistry()
    slow = SlowCollector(1.5)  # a health check that waited on it would take 1.4 s, 3.5x the bound below
    registry.register(slow)
    runner, base = await _serve(registry)
    try:
        async with aiohttp.ClientSession() as session:
            scrape = asyncio.create_task(session.get(f"{base}/metrics"))
            await asyncio.sleep(0.1)  # the render is under way
            started = time.perf_counter()
            async with session.get(f"{base}/-/healthy") as health:
                assert health.status == 200
            assert time.perf_counter() - started < 0.4  # answered while the render still sleeps
            response = await scrape
            assert "rooflight_test_value 1.0" in await response.text()
    finally:
        await runner.cleanup()
    assert slow.threads == ["rooflight-render"]


async def test_gzip_openmetrics_and_name_filter_as_prometheus_client_serves_them() -> None:
    registry = CollectorRegistry()
    registry.register(SlowCollector(0.0))
    runner, base = await _serve(registry)
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(f"{base}/metrics", headers={"Accept-Encoding": "gzip"}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert b"rooflight_test_value 1.0" in gzip.decompress(await r.read())
            om = "application/openmetrics-text; version=1.0.0"
            async with session.get(f"{base}/metrics", headers={"Accept": om, "Accept-Encoding": "identity"}) as r:
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await r.text()).endswith("# EOF\n")
            async with session.get(f"{base}/metrics?name[]=nothing_here", headers={"Accept-Encoding": "identity"}) as r:
                assert "rooflight_test_value" not in await r.text()
    finally:
        await runner.cleanup()


class SnapshotLikeCollector(Collector):
    """Describes nothing, as the agent's collectors do (their families depend on the snapshot)."""

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("rooflight_source_up", "Up.", value=1.0)
        yield GaugeMetricFamily("rooflight_other", "Other.", value=2.0)
        hist = HistogramMetricFamily("rooflight_latency_seconds", "Latency.", buckets=[("1.0", 3.0), ("+Inf", 4.0)],
                                     sum_value=5.0)
        yield hist


def test_name_filter_keeps_the_named_families_of_a_collector_that_describes_nothing() -> None:
    registry = CollectorRegistry()
    registry.register(SnapshotLikeCollector())
    body, _ = render_metrics(registry, "", ["rooflight_source_up"])
    text = body.decode()
    assert "rooflight_source_up 1.0" in text and "rooflight_other" not in text  # before: an empty body
    body, _ = render_metrics(registry, "", ["rooflight_latency_seconds_count", "rooflight_other"])
    text = body.decode()
    assert "rooflight_latency_seconds_count 4.0" in text and "rooflight_other 2.0" in text
    assert "rooflight_latency_seconds_bucket" not in text and "rooflight_source_up" not in text
    whole, _ = render_metrics(registry, "", ["rooflight_latency_seconds"])
    assert b"rooflight_latency_seconds_bucket" in whole and b"rooflight_latency_seconds_sum 5.0" in whole
