"""Test-speed soak: the agent samples a changing demo engine for thousands of cycles of accelerated time
(one fake clock drives both, real HTTP on 127.0.0.1), and its memory must stay flat.

What "flat" means here: after a warm-up that fills the longest window (5 m at 1 s), the number of
live Python allocations in the process (sys.getallocatedblocks, after a full collection: agent, demo
engine and HTTP alike) grows by less than SOAK_GROWTH_BLOCKS over the rest of the run, and every
SeriesHistory holds at most what its retention needs. tracemalloc would name the lines, but it slows
this loop ~13x; run with ROOFLIGHT_SOAK_TRACEMALLOC=1 to get the top growing lines printed.
bench/soak.py is the long, real-time version (RSS over time, CPU per cycle).
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import tracemalloc

from prometheus_client import generate_latest

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.metrics.exposition import registry_for
from support import started_agent

CYCLES = int(os.environ.get("ROOFLIGHT_SOAK_CYCLES", "2000"))
WARMUP = 600  # > the 5 m window at 1 s, so every history is full before the baseline is taken
SOAK_GROWTH_BLOCKS = 5000  # ~0.3 MB of small objects; a leak of one object per cycle would pass 5000
TRACE = os.environ.get("ROOFLIGHT_SOAK_TRACEMALLOC") == "1"


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


async def test_thousands_of_cycles_keep_memory_and_windows_bounded() -> None:
    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario="steady", seed=7), clock=clock)
    await engine.start()
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "1",
                            "windows": "10s,1m,5m"})
    events = itertools.cycle(["long-prompt", "kv-wall", "clear"])
    lengths = []
    if TRACE:
        tracemalloc.start()
    try:
        async with started_agent(config, loops=False, clock=clock) as agent:
            registry = registry_for(lambda: agent.snapshot)
            for i in range(CYCLES):
                clock.advance(1.0)
                if i % 97 == 0:
                    engine.inject(next(events))  # a changing workload: stalls, the KV wall, recovery
                engine.tick()
                await agent.sample_engines_once()
                if i % 20 == 0:
                    generate_latest(registry)  # the scrape path too
                if i == WARMUP:
                    baseline = _blocks()
                    traced = tracemalloc.take_snapshot() if TRACE else None
                lengths.append(max(len(h) for h in agent.engines[0].histories().values()))
            end = _blocks()
            if traced is not None:
                for stat in tracemalloc.take_snapshot().compare_to(traced, "lineno")[:10]:
                    print(stat)
    finally:
        if TRACE:
            tracemalloc.stop()
        await engine.stop()

    assert agent.snapshot.health[0].up and agent.snapshot.health[0].errors["timeout"] == 0
    growth = end - baseline
    print(f"soak: {CYCLES} cycles, allocated blocks {baseline} -> {end} ({growth:+d})")
    assert growth < SOAK_GROWTH_BLOCKS, f"{growth} more live allocations after {CYCLES - WARMUP} cycles"
    retention = 300 + 2 * 1.0 + config.scrape_timeout  # longest window + 2 intervals + timeout
    assert max(lengths) <= 2 * retention + 2, f"a SeriesHistory held {max(lengths)} points"
    assert min(lengths[WARMUP:]) >= retention - 2  # and the 5 m window stays covered
    (view,) = agent.snapshot.targets[0].series
    assert [w.window for w in view.windows] == ["10s", "1m", "5m"]
