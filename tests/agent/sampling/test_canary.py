"""The canary (`rooflight run --canary`): a 1-token request the agent sends an engine its stall detector calls
stalled, over real HTTP on 127.0.0.1. A hung engine leaves it unanswered (failed), an idle one whose gauges
stuck answers it (ok), an engine that makes progress never sees one, and an agent without --canary sends none
and exports no canary series (RooflightEngineStalled is then a warning: rules/health.py)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.clock import FakeClock
from support import exported, sample_text, serve_app, started_agent

CANARY = "rooflight_engine_canary_requests_total"
STALL_SECONDS = 1.0  # the detector's stall window, and the canary's cadence and timeout


class StalledEngine:
    """A vLLM page frozen at 16 running (no counter moves: the detector's stall), and /v1/completions that
    hangs (`answers` False) or answers one token."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.page = sample_text("vllm-cpu-load-c16.prom")
        self.asked = 0

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.Response:
        self.asked += 1
        body = await request.json()
        assert body["max_tokens"] == 1 and body["model"] == "tiny-llama"
        if not self.answers:
            await asyncio.sleep(3600)
        return web.json_response({"choices": [{"text": "!"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        return app


def _canary(metrics: dict) -> dict[str, float]:
    return {dict(labels)["result"]: value for (name, labels), value in metrics.items() if name == CANARY}


async def _sample(engine: StalledEngine, seconds: float, canary: bool) -> dict[str, float]:
    """The canary's counts after `seconds` of samples against `engine`, each canary given time to end."""
    runner, url = await serve_app(engine.app(), shutdown_timeout=0.1)
    config = build({}, {}, {"engine_url": [url], "process": False, "nvml": False, "interval": "0.5",
                            "windows": "5s", "model": "llama-3-8b", "canary": canary,
                            "detectors": {"stall_seconds": STALL_SECONDS}})
    clock = FakeClock()
    try:
        async with started_agent(config, loops=False, clock=clock) as agent:
            t = 0.0
            while t < seconds:
                clock.advance(0.5)
                t += 0.5
                await agent.sample_engines_once()
                await asyncio.sleep(0.05)
            await asyncio.sleep(2 * STALL_SECONDS)  # a canary in flight answers or times out (real time)
            await agent.sample_engines_once()
            return _canary(exported(agent))
    finally:
        await runner.cleanup()


async def test_a_hung_engine_leaves_the_canary_unanswered() -> None:
    engine = StalledEngine(answers=False)
    counts = await _sample(engine, 4.0, canary=True)
    assert engine.asked >= 1
    assert counts["failed"] >= 1 and counts["ok"] == 0, counts


async def test_an_idle_engine_behind_stuck_gauges_answers_it() -> None:
    engine = StalledEngine(answers=True)
    counts = await _sample(engine, 4.0, canary=True)
    assert counts["ok"] >= 1 and counts["failed"] == 0, counts
    # at most one a stall window: 4 s of samples every 0.5 s send a handful, not one a sample
    assert engine.asked <= 4.0 / STALL_SECONDS + 1


async def test_without_the_flag_no_canary_is_sent_nor_exported() -> None:
    engine = StalledEngine(answers=False)
    assert await _sample(engine, 3.0, canary=False) == {}
    assert engine.asked == 0
