"""Long soak in real time: the agent against the demo engine (real HTTP, real clock), reporting the
agent's RSS over time and its CPU per sampling cycle. The demo's workload changes as it runs (a long
prompt, the KV wall, recovery, every `--event-every` seconds).

    python bench/soak.py --minutes 60 --interval 1 --report-every 60

RSS is the whole process (agent + demo engine: the demo's own state is bounded too); CPU per cycle
is process CPU time / samples taken, so it also includes the demo's simulation.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rooflight.agent.cli import resolve_models  # noqa: E402
from rooflight.agent.config.agent import build  # noqa: E402
from rooflight.agent.demo import DemoConfig, start_demo_engine  # noqa: E402
from rooflight.agent.sampling.sampler import Agent  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def soak(minutes: float, interval: float, report_every: float, event_every: float) -> None:
    engine = await start_demo_engine(DemoConfig(scenario="steady", seed=11))
    config = build({}, {}, {"engine_url": [engine.url], "nvml": False, "process": False,
                            "interval": f"{interval:g}"})
    agent = Agent(config, models=resolve_models(config))
    await agent.start(loops=False)
    events = itertools.cycle(["long-prompt", "kv-wall", "clear"])
    start, cpu0, samples = time.monotonic(), cpu_seconds(), 0
    next_report, next_event = start, start + event_every
    print("minute  rss_mib  cpu_ms_per_cycle  samples  history_points", flush=True)
    try:
        while (now := time.monotonic()) - start < minutes * 60:
            if now >= next_event:
                engine.inject(next(events))
                next_event += event_every
            await agent.sample_engines_once()
            samples += 1
            if now >= next_report:
                points = max((len(h) for h in agent.engines[0].histories().values()), default=0)
                per_cycle = 1000 * (cpu_seconds() - cpu0) / samples
                print(f"{(now - start) / 60:6.1f}  {rss_mib():7.1f}  {per_cycle:16.2f}  {samples:7d}  {points:14d}",
                      flush=True)
                next_report += report_every
            await asyncio.sleep(max(0.0, start + samples * interval - time.monotonic()))
    finally:
        await agent.stop()
        await engine.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--report-every", type=float, default=60.0, help="seconds between report lines")
    p.add_argument("--event-every", type=float, default=97.0, help="seconds between workload events")
    a = p.parse_args()
    asyncio.run(soak(a.minutes, a.interval, a.report_every, a.event_every))


if __name__ == "__main__":
    main()
