"""The process sources: one loop reads every target's tree, each target's failure and slowness its own."""

from __future__ import annotations

import asyncio
import os
import time

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors import process as process_module
from support import FakeEngine, free_port, resolve_models, sample_text, started_agent


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
    raises a bug's exception besides (counted as "other"). One loop reads them all (one task, not one per target); the third
    fails alone, with its reason, and the first two stay up."""
    from rooflight.collectors.process import ProcessCollector

    first, second = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom")), FakeEngine(status=500)
    await first.start()
    await second.start()
    nobody = f"http://127.0.0.1:{free_port()}"
    read = ProcessCollector.read

    def read_or_raise(self: ProcessCollector, **kwargs: bool) -> object:
        if self._port is not None and str(self._port) == nobody.rpartition(":")[2]:
            raise RuntimeError("a bug meeting an odd tree")
        return read(self, **kwargs)

    monkeypatch.setattr(ProcessCollector, "read", read_or_raise)
    try:
        config = build({}, {}, {"engine_url": [first.url, second.url, nobody], "nvml": False, "process": True,
                                "interval": "0.2", "scrape_timeout": "0.5", "model": "llama-3-8b"})
        async with started_agent(config) as agent:
            names = [t.name for t in config.targets]
            health = await _process_health(agent, names)
            tasks = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("rooflight-process")]
            assert tasks == ["rooflight-process"]  # and no search: the two engines' processes were found at once
            assert health[names[0]].up and health[names[1]].up
            assert not health[names[2]].up and health[names[2]].errors["other"] >= 2
            assert {p.pid for p in agent.snapshot.processes.values()} == {os.getpid()}
            assert set(agent.snapshot.processes) == set(names[:2])
    finally:
        await first.stop()
        await second.stop()


async def test_a_slow_search_for_one_targets_process_holds_up_no_other(monkeypatch) -> None:
    """One target is found by its port, and the search (every process's sockets) takes 5 s, as on a busy
    node whose engine is still loading; the other is known by its PID. The known one is read every second
    all along (8 in 8 s, at least 4 asked), and never published up with a sample 2.5 s old (a search
    inside the one loop's read would hold every target's tick up: 2 samples in 8 s, 5 s old)."""
    searches = []

    def slow_find_listener(port: int) -> int | None:
        searches.append(port)
        time.sleep(5.0)
        return None

    monkeypatch.setattr(process_module, "find_listener", slow_find_listener)
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    config = build({}, {}, {"engine_url": urls, "nvml": False, "process": True, "interval": "1",
                            "scrape_timeout": "0.5", "model": "llama-3-8b"})
    known, searched = (t.name for t in config.targets)
    agent = Agent(config, models=resolve_models(config), process_pids={known: os.getpid()})
    await agent.start()
    try:
        seen: set[float] = set()
        oldest = 0.0
        loop = asyncio.get_running_loop()
        end = loop.time() + 8.0
        while loop.time() < end:
            sample = agent.snapshot.processes.get(known)
            health = {h.target: h for h in agent.snapshot.health if h.source == "process"}
            if sample is not None:
                seen.add(sample.timestamp)
                if health[known].up:
                    oldest = max(oldest, time.time() - sample.timestamp)
            await asyncio.sleep(0.05)
        health = {h.target: h for h in agent.snapshot.health if h.source == "process"}
    finally:
        await agent.stop(timeout=5)
    assert len(seen) >= 4, f"{known}: {len(seen)} process samples in 8 s at 1 Hz"
    assert oldest < 2.5, f"{known}: published up with a {oldest:.1f} s old process sample"
    assert not health[searched].up and health[searched].errors["process"] >= 1
    # one search at a time: at 5 s each, at most two began in the 8 s (not one a tick on top of one running)
    assert 1 <= len(searches) <= 2, searches


async def test_an_engine_url_without_a_port_is_looked_for_on_its_schemes_port() -> None:
    """`http://127.0.0.1` is port 80: its process is looked for there (found by reading the code: the loop
    built a collector with no port, which raised, and the one loop ended for every target)."""
    engine = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom"))
    await engine.start()
    try:
        config = build({}, {}, {"engine_url": [engine.url, "http://127.0.0.1"], "nvml": False, "process": True,
                                "interval": "0.2", "scrape_timeout": "0.5", "model": "llama-3-8b"})
        async with started_agent(config) as agent:
            first, no_port = (t.name for t in config.targets)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15.0
            while True:
                health = {h.target: h for h in agent.snapshot.health if h.source == "process"}
                if first in health and health[first].up and no_port in health and \
                        (health[no_port].up or health[no_port].message):
                    break
                assert loop.time() < deadline, f"the process loop did not read both targets: {health}"
                await asyncio.sleep(0.05)
        # whatever this machine runs on port 80, that is where it was looked for
        assert health[no_port].up or "TCP port 80" in (health[no_port].message or ""), health[no_port]
    finally:
        await engine.stop()
