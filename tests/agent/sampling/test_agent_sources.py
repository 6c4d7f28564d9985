"""The agent against an engine over real HTTP: healthy, down, slow, garbage, failing, restarting."""

from __future__ import annotations

import asyncio
import math

import pytest

from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.sampling.sampler import Agent
from support import FakeEngine, sample_text, started_agent
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest
from rooflight.agent.metrics.exposition import registry_for


def _config(url: str, **flags: object) -> AgentConfig:
    settings = {"engine_url": [url], "nvml": False, "process": False, "interval": "0.1", "windows": "1s,2s",
                "scrape_timeout": "0.3", "model": "llama-3-8b", **flags}
    return build({}, {}, settings)


def _metrics(agent: Agent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(metrics: dict, name: str, **labels: str) -> float | None:
    for (n, lbl), v in metrics.items():
        if n == name and all(dict(lbl).get(k) == val for k, val in labels.items()):
            return v
    return None


async def test_healthy_engine_is_up_with_its_numbers(fake_engine: FakeEngine) -> None:
    async with started_agent(_config(fake_engine.url), loops=False) as agent:
        await agent.sample_engines_once()
        m = _metrics(agent)
        assert _value(m, "rooflight_source_up", source="engine") == 1.0
        assert _value(m, "rooflight_requests_running", model="tiny-llama") == 16.0
        assert _value(m, "rooflight_generation_tokens_total") == 8096.0


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ({"status": 500}, "http_status"),
        ({"body": "\x00\x01garbage{{{ not metrics"}, "parse"),
        ({"hang": True}, "timeout"),
        ({"delay": 3.0}, "timeout"),  # slower than the scrape timeout (0.3 s), 3x the bound below
    ],
)
async def test_failing_engine_is_down_counted_and_metrics_still_answer(
    fake_engine: FakeEngine, setup: dict, reason: str
) -> None:
    async with started_agent(_config(fake_engine.url), loops=False) as agent:
        await agent.sample_engines_once()
        for key, value in setup.items():
            setattr(fake_engine, key, value)
        started = asyncio.get_running_loop().time()
        await agent.sample_engines_once()
        assert asyncio.get_running_loop().time() - started < 1.0  # bounded by the scrape timeout, not the engine
        m = _metrics(agent)
        assert _value(m, "rooflight_source_up", source="engine") == 0.0
        assert _value(m, "rooflight_source_errors_total", source="engine", reason=reason) == 1.0
        # the scrape-time view must hold no negative or infinite number
        assert all(math.isfinite(v) and (v >= 0) for v in m.values())
        # and it heals on its own
        fake_engine.status, fake_engine.hang, fake_engine.delay = 200, False, 0.0
        fake_engine.body = sample_text("vllm-cpu-load-c16.prom")
        await agent.sample_engines_once()
        assert _value(_metrics(agent), "rooflight_source_up", source="engine") == 1.0


async def test_a_vllm_page_without_the_engine_label_keeps_histograms_with_the_gauges(fake_engine: FakeEngine) -> None:
    """vLLM before data parallelism writes no `engine` label: gauges, counters and histograms are all
    rank 0 of one series, never a second series holding only the histograms."""
    page = sample_text("vllm-cpu-load-c16.prom")
    fake_engine.body = page.replace('engine="0",', "")
    assert 'engine="' not in fake_engine.body
    async with started_agent(_config(fake_engine.url), loops=False) as agent:
        await agent.sample_engines_once()
        (target,) = agent.snapshot.targets
        (view,) = target.series
        series = view.series
        assert (series.model, series.rank, series.running) == ("tiny-llama", "0", 16.0)
        assert series.ttft is not None and series.itl is not None
        # the same histograms as on the labelled page, not empty ones
        fake_engine.body = page
        await agent.sample_engines_once()
        (labelled,) = agent.snapshot.targets[0].series
        assert (series.ttft, series.itl) == (labelled.series.ttft, labelled.series.itl)


async def test_refused_connection_is_reported_as_refused() -> None:
    from support import free_port

    async with started_agent(_config(f"http://127.0.0.1:{free_port()}"), loops=False) as agent:
        await agent.sample_engines_once()
        m = _metrics(agent)
        assert _value(m, "rooflight_source_up", source="engine") == 0.0
        assert _value(m, "rooflight_source_errors_total", reason="refused") == 1.0
        assert _value(m, "rooflight_requests_running") is None  # nothing made up


async def test_slow_engine_within_timeout_stays_up(fake_engine: FakeEngine) -> None:
    async with started_agent(_config(fake_engine.url, scrape_timeout="1.0"), loops=False) as agent:
        fake_engine.delay = 0.3  # longer than the 0.1 s interval, inside the timeout
        await agent.sample_engines_once()
        assert _value(_metrics(agent), "rooflight_source_up", source="engine") == 1.0


async def test_unknown_endpoint_names_what_it_found(fake_engine: FakeEngine) -> None:
    fake_engine.body = "# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu=\"0\"} 1\n"
    async with started_agent(_config(fake_engine.url), loops=False) as agent:
        await agent.sample_engines_once()
        health = agent.snapshot.health[0]
        assert not health.up
        assert "node" in (health.message or "")


async def test_engine_restart_gives_no_negative_rate(fake_engine: FakeEngine) -> None:
    """Counters drop to small values after a restart: rates stay >= 0 and recover."""
    load = sample_text("vllm-cpu-load-c16.prom")
    fresh = sample_text("vllm-cpu-rest-fresh.prom")
    async with started_agent(_config(fake_engine.url), loops=False) as agent:
        for body in (load, load, fresh, fresh, load):
            fake_engine.body = body
            await agent.sample_engines_once()
            await asyncio.sleep(0.3)
        m = _metrics(agent)
        rates = [v for (n, _), v in m.items() if n.endswith("_per_second") or n.endswith("_ratio")]
        assert rates and all(v >= 0 and math.isfinite(v) for v in rates)


async def test_loops_run_on_their_own_and_metrics_answer_while_engine_hangs(fake_engine: FakeEngine) -> None:
    from aiohttp import ClientSession, web

    from rooflight.agent.serve.server import build_app
    from support import free_port

    port = free_port()
    loop = asyncio.get_running_loop()
    # a 3 s scrape timeout: a /metrics that waited on the hung sample would take up to 3 s, 3x the bound below
    async with started_agent(_config(fake_engine.url, scrape_timeout="3")) as agent:
        runner = web.AppRunner(build_app(agent, manage_agent=False), shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await asyncio.sleep(0.5)
            fake_engine.hang = True
            async with ClientSession() as session:
                for _ in range(5):
                    started = loop.time()
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                        assert r.status == 200
                        text = await r.text()
                    assert loop.time() - started < 1.0
                    await asyncio.sleep(0.2)
            assert 'rooflight_source_up{source="engine"' in text
            deadline = loop.time() + 10.0
            while agent.snapshot.health[0].up is not False:  # the hung sample times out after 3 s
                assert loop.time() < deadline, "the hung engine was never reported down"
                await asyncio.sleep(0.05)
        finally:
            await runner.cleanup()


async def test_auto_detection_finds_trtllm_serve_behind_its_json_metrics() -> None:
    """trtllm-serve answers /metrics with JSON; its Prometheus page is /prometheus/metrics."""
    from aiohttp import web

    page = "# TYPE trtllm_num_requests_running gauge\ntrtllm_num_requests_running{model_name=\"m\"} 3\n"

    async def json_stats(request: web.Request) -> web.Response:
        return web.json_response([{"iter": 1}])

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", json_stats)
    app.router.add_get("/prometheus/metrics", prometheus)
    runner = web.AppRunner(app)
    await runner.setup()
    from support import free_port

    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with started_agent(_config(f"http://127.0.0.1:{port}"), loops=False) as agent:
            await agent.sample_engines_once()
            (target,) = agent.snapshot.targets
            assert target.engine == "trtllm"
            assert target.series[0].series.running == 3
    finally:
        await runner.cleanup()
