"""What each loop publishes: every source's health as its state says, though a step reads only its own again."""

from __future__ import annotations

import asyncio
import os

from rooflight.agent.config.agent import build
from support import FakeEngine, free_port, sample_text, started_agent


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
            while bad.requests < 5 or good.requests < 5:  # several steps of both loops
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


async def _process_health(agent: object, names: list[str]) -> dict[str, object]:
    """The published process-source health by target, once the first targets are up and the last has
    failed twice (two ticks of the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15.0
    while True:
        health = {h.target: h for h in agent.snapshot.health if h.source == "process"}  # type: ignore[attr-defined]
        if len(health) == len(names) and sum(health[names[-1]].errors.values()) >= 2 \
                and all(health[n].up for n in names[:-1]):
            return health
        assert loop.time() < deadline, f"the process loop did not sample every target: {health}"
        await asyncio.sleep(0.05)


async def test_one_process_loop_reads_every_target_each_failure_its_own(monkeypatch) -> None:
    """Three targets: two engines this test process serves, and a port nobody listens on, whose tree read
    raises a bug's exception besides. One loop reads them all (one task, not one per target); the third
    fails alone, with its reason, and the first two stay up."""
    from rooflight.collectors.process import ProcessCollector

    first, second = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom")), FakeEngine(status=500)
    await first.start()
    await second.start()
    nobody = f"http://127.0.0.1:{free_port()}"
    read = ProcessCollector.read

    def read_or_raise(self: ProcessCollector) -> object:
        if self._port is not None and str(self._port) == nobody.rpartition(":")[2]:
            raise RuntimeError("a bug meeting an odd tree")
        return read(self)

    monkeypatch.setattr(ProcessCollector, "read", read_or_raise)
    try:
        config = build({}, {}, {"engine_url": [first.url, second.url, nobody], "nvml": False, "process": True,
                                "interval": "0.2", "scrape_timeout": "0.5", "model": "llama-3-8b"})
        async with started_agent(config) as agent:
            names = [t.name for t in config.targets]
            health = await _process_health(agent, names)
            tasks = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("rooflight-process")]
            assert tasks == ["rooflight-process"]
            assert health[names[0]].up and health[names[1]].up
            assert not health[names[2]].up and health[names[2]].errors["process"] >= 2
            assert {p.pid for p in agent.snapshot.processes.values()} == {os.getpid()}
            assert set(agent.snapshot.processes) == set(names[:2])
    finally:
        await first.stop()
        await second.stop()
