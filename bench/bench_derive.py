"""What one agent tick costs in this process, split into its parts: the engine loop's remembering (history
append) and its derive step (signals/series.py: windows, verdicts and their policy, work counters,
capacity signals), and the whole tick (fetch over loopback, parse, both of those, publish, and the fake
engines' own serving, which share the process).

The agent runs on a FakeClock against in-process FakeEngines (tests/support.py) serving bench_sampling's
moving vLLM pages, one new page per tick, after a warm-up that fills its 5m window (the agent's default
windows, 10s,1m,5m). No NVML, no process source. CPU seconds (time.process_time), so a busy machine's other
work does not inflate them; printed, never asserted. bench/bench_process_cpu.py measures the whole
`rooflight run` process against the naive loop; this one isolates what the sampling loop and the derive
step cost, and runs in seconds.

Run from the repository root:
    python bench/bench_derive.py [--configs 1x10,64x1] [--ticks 1200] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_sampling import DEFAULT_PAGE, moving_pages  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from support import FakeEngine, started_agent  # noqa: E402

from rooflight.agent.metrics.exposition import registry_for  # noqa: E402
from rooflight.agent.sampling import engine_loop  # noqa: E402
from rooflight.agent.sampling.clock import FakeClock  # noqa: E402
from rooflight.agent.config.agent import build  # noqa: E402

PARTS = ("_remember", "_rebuild_view")  # the engine loop's methods timed: remembering, the derive step
SCRAPE_EVERY_S = 15.0  # a Prometheus scrape of /metrics this often (simulated seconds)


def _timing(spent: dict[str, float]) -> Callable[[], None]:
    """Time PARTS into `spent` (CPU seconds by name); returns what undoes it."""
    originals = {name: getattr(engine_loop.EngineLoop, name) for name in PARTS}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(self, *args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - start
        return wrapper

    def undo() -> None:
        for name, fn in originals.items():
            setattr(engine_loop.EngineLoop, name, fn)

    for name, fn in originals.items():
        setattr(engine_loop.EngineLoop, name, timed(name, fn))
    return undo


async def run(targets: int, hz: float, ticks: int) -> dict[str, float]:
    """CPU milliseconds per tick: the whole tick, and each of PARTS summed over the targets."""
    step = 1.0 / hz
    warm = int(300 / step)  # the 5m window's history full
    text = DEFAULT_PAGE.read_text().split("\n", 1)[1]
    pages = list(moving_pages(text, warm + ticks))
    engines = [FakeEngine() for _ in range(targets)]
    for engine in engines:
        await engine.start()
    config = build({}, {}, {"engine_url": [e.url for e in engines], "nvml": False, "process": False,
                            "interval": str(step), "model": "llama-3-8b", "gpu": "h100-sxm"})
    clock, spent = FakeClock(), {}
    undo = _timing(spent)
    try:
        async with started_agent(config, loops=False, clock=clock) as agent:
            for i in range(warm + ticks):
                if i == warm:
                    spent.clear()
                    start = time.process_time()
                for engine in engines:
                    engine.body = pages[i]
                clock.advance(step)
                await agent.sample_engines_once()
                if i % max(1, int(SCRAPE_EVERY_S / step)) == 0:
                    generate_latest(registry_for(lambda: agent.snapshot))
            total = time.process_time() - start
    finally:
        undo()
        for engine in engines:
            await engine.stop()
    return {"tick": total / ticks * 1e3, **{name: s / ticks * 1e3 for name, s in spent.items()}}


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--configs", default="1x10,64x1", help="targets x Hz, comma-separated")
    args.add_argument("--ticks", type=int, default=1200, help="ticks measured (at 1 Hz: a tenth of them)")
    args.add_argument("--runs", type=int, default=3)
    opts = args.parse_args(argv)
    logging.disable(logging.WARNING)  # the agent's "no GPU" notes
    configs = [(int(t), float(h)) for t, _, h in (c.partition("x") for c in opts.configs.split(","))]
    results: dict[tuple[int, float], list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(opts.runs):  # interleaved, so a change in the machine's load hits each configuration
        for targets, hz in configs:
            ticks = opts.ticks if hz >= 10 else max(30, opts.ticks // 10)
            results[(targets, hz)].append(asyncio.run(run(targets, hz, ticks)))
    print("CPU ms per tick, median of runs (min-max); % of a core = tick ms x Hz / 10")
    for (targets, hz), rows in results.items():
        cells = []
        for key in ("tick", *PARTS):
            values = [r[key] for r in rows]
            cells.append(f"{key.strip('_')} {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        core = statistics.median(r["tick"] for r in rows) * hz / 10
        print(f"{targets} target{'s' if targets > 1 else ''} @ {hz:g} Hz: {'; '.join(cells)}; {core:.2f}% of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
