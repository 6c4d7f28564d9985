"""What each loop publishes: every source's health as its state says, though a step reads only its own again."""

from __future__ import annotations

import asyncio

from rooflight.agent.config.agent import build
from support import FakeEngine, sample_text, started_agent


async def test_published_health_is_every_source_as_its_state_says_after_the_loops_ran() -> None:
    """Two engines (one answering, one failing with HTTP 500) and their process sources, each in its own
    loop: each step publishes with only its own source's health read again, so a health read from the
    wrong state, or kept from before the step, would differ from a full read of every state."""
    good, bad = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom")), FakeEngine(status=500)
    await good.start()
    await bad.start()
    try:
        config = build({}, {}, {"engine_url": [good.url, bad.url], "nvml": False, "process": True,
                                "interval": "0.1", "windows": "1s,2s", "scrape_timeout": "0.5",
                                "model": "llama-3-8b"})
        async with started_agent(config) as agent:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10.0
            # Several whole steps of both loops, as the agent counts them: the engine counts a request when it
            # arrives, before the agent has read its answer (a stop then cancels that step: 4 errors for 5 requests).
            while agent.engines[1].state.errors["http_status"] < 5 or good.requests < 5:
                assert loop.time() < deadline, "the loops did not sample"
                await asyncio.sleep(0.05)
            await agent.stop()  # every loop ends after a whole step: its last publish holds it
            published = agent.snapshot.health
            states = [e.state for e in agent.engines] + list(agent._process_states.values())
            assert published == tuple(s.view() for s in states)
        by_target = {(h.source, h.target): h for h in published}
        engine_good = by_target[("engine", agent.engines[0].target.name)]
        engine_bad = by_target[("engine", agent.engines[1].target.name)]
        assert engine_good.up and engine_good.errors["http_status"] == 0
        assert not engine_bad.up and engine_bad.errors["http_status"] >= 5
        assert len(published) == 4  # two engines, then two process sources
    finally:
        await good.stop()
        await bad.stop()



async def test_loops_whose_steps_end_in_one_turn_of_the_event_loop_publish_once() -> None:
    """64 targets on one interval end their steps together: one snapshot for all of them, with each stepped
    source's health read again, not one snapshot each; and a publish pending when the agent stops is made
    (stop() awaits its loops and its session: turns of the event loop)."""
    engines = [FakeEngine(body=sample_text("vllm-cpu-load-c16.prom")) for _ in range(3)]
    for engine in engines:
        await engine.start()
    try:
        config = build({}, {}, {"engine_url": [e.url for e in engines], "nvml": False, "process": False,
                                "model": "llama-3-8b"})
        async with started_agent(config, loops=False) as agent:
            published: list[tuple[object, ...]] = []
            publish = agent.publish
            agent.publish = lambda *stepped: (published.append(stepped), publish(*stepped))  # type: ignore[method-assign]
            states = [e.state for e in agent.engines]
            for e in agent.engines:
                await e.sample_once()
            for state in states:
                agent._publish_soon(state)
            assert published == []  # not within the turn the steps ended in
            await asyncio.sleep(0)
            assert published == [tuple(states)]
            assert agent.snapshot.health == tuple(s.view() for s in states)
            states[0].fail("timeout", "slow", 1.0)
            agent._publish_soon(states[0])
            await agent.stop()
            assert published[-1] == (states[0],)
            assert not agent.snapshot.health[0].up
    finally:
        for engine in engines:
            await engine.stop()
