"""An engine loading its model is starting, not down: rooflight_source_starting is 1 while the engine's port has
refused every connection since the agent started (nothing listens yet: weights loading), then 0 for good. The
agent's own start earns nothing: an engine that answers 503, serves a page that is not an engine's, or has
answered once, is down from its first failed sample, so an agent restarted during an outage reports it down
(rules/outage.py pages on it). Over real HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from support import FakeEngine, exported, free_port, sample_text, started_agent

STARTING = ("rooflight_source_starting", (("source", "engine"),))
UP = ("rooflight_source_up", (("source", "engine"),))


def _engine_health(metrics: dict) -> tuple[float, float]:
    """(starting, up) of the one engine source."""
    pick = {name: value for (name, labels), value in metrics.items()
            if name in (STARTING[0], UP[0]) and dict(labels).get("source") == "engine"}
    return pick[STARTING[0]], pick[UP[0]]


async def test_a_loading_engine_is_starting_until_its_first_good_sample_then_down_when_it_goes() -> None:
    port = free_port()  # nothing listens yet: the engine is loading its weights
    config = build({}, {}, {"engine_url": [f"http://127.0.0.1:{port}"], "process": False, "nvml": False,
                            "interval": "0.5", "windows": "5s", "model": "llama-3-8b"})
    clock = FakeClock()
    engine = FakeEngine(body=sample_text("vllm-cpu-rest-fresh.prom"))
    async with started_agent(config, loops=False, clock=clock) as agent:
        for _ in range(3):  # refused, refused, refused: loading
            clock.advance(0.5)
            await agent.sample_engines_once()
            assert _engine_health(exported(agent)) == (1.0, 0.0)

        await engine.start(port)  # loaded: the first good sample ends "starting"
        try:
            clock.advance(0.5)
            await agent.sample_engines_once()
            assert _engine_health(exported(agent)) == (0.0, 1.0)
        finally:
            await engine.stop()

        for _ in range(2):  # gone after being up: down, and never starting again
            clock.advance(0.5)
            await agent.sample_engines_once()
            assert _engine_health(exported(agent)) == (0.0, 0.0)


async def _health_after(engine: FakeEngine, samples: int) -> tuple[float, float]:
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "nvml": False,
                            "interval": "0.5", "windows": "5s", "model": "llama-3-8b"})
    clock = FakeClock()
    async with started_agent(config, loops=False, clock=clock) as agent:
        for _ in range(samples):
            clock.advance(0.5)
            await agent.sample_engines_once()
        return _engine_health(exported(agent))


@pytest.mark.parametrize(("body", "status"), [
    ("engine is dead\n", 503),  # the agent restarted during an outage: the engine's core dead behind its API
    ("<html>hello</html>\n", 200),  # something else listens on the engine's port: the engine is not loading
], ids=["503", "not-an-engine-page"])
async def test_an_engine_that_answers_wrong_is_down_from_the_agents_first_sample(body: str, status: int) -> None:
    engine = FakeEngine(body=body, status=status)
    await engine.start()
    try:
        assert await _health_after(engine, 3) == (0.0, 0.0)
    finally:
        await engine.stop()


async def test_refused_after_any_other_failure_is_down() -> None:
    """A 503, then the port closes (the process exits): a crash, not a first load."""
    port = free_port()
    engine = FakeEngine(body="", status=503)
    config = build({}, {}, {"engine_url": [f"http://127.0.0.1:{port}"], "process": False, "nvml": False,
                            "interval": "0.5", "windows": "5s", "model": "llama-3-8b"})
    clock = FakeClock()
    async with started_agent(config, loops=False, clock=clock) as agent:
        clock.advance(0.5)
        await agent.sample_engines_once()
        assert _engine_health(exported(agent)) == (1.0, 0.0)  # refused: loading
        await engine.start(port)
        try:
            clock.advance(0.5)
            await agent.sample_engines_once()
            assert _engine_health(exported(agent)) == (0.0, 0.0)  # a 503: down
        finally:
            await engine.stop()
        clock.advance(0.5)
        await agent.sample_engines_once()
        assert _engine_health(exported(agent)) == (0.0, 0.0)  # refused again: still down
