"""An engine loading its model is starting, not down: rooflight_source_starting is 1 until the engine's first
good sample since the agent started, then 0 for good, so RooflightEngineDown (rules/alerts.py) pages only for
an engine that was up. Over real HTTP on 127.0.0.1: the engine's port refuses, then serves, then goes away."""

from __future__ import annotations

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
