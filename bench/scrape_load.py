"""/metrics under concurrent scrape load, and what that load does to the sampling cadence.

An engine serving the recorded vLLM page (it stamps the arrival of every scrape the agent makes), the
agent with its own loops and HTTP server, and N clients scraping /metrics back to back for a bounded
time, all on 127.0.0.1. Reports p50/p99/max scrape latency, scrapes per second, and the sampling
jitter: how far each interval between two engine scrapes is from the configured interval.

Everything runs in one process and one event loop, so the clients' own CPU competes with the agent:
a pessimistic setup (Prometheus scrapes from another process, usually another host).

    python bench/scrape_load.py --clients 50 --seconds 30 --interval 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from rooflight.agent.cli import resolve_models  # noqa: E402
from rooflight.agent.config.agent import build  # noqa: E402
from rooflight.agent.sampling.sampler import Agent  # noqa: E402
from rooflight.agent.serve.server import build_app  # noqa: E402
from support import free_port, sample_text  # noqa: E402


class HostStalls:
    """The longest a thread asleep for 10 ms woke late while the run lasted: the host's own stalls (another
    process on the cores, a paused VM), which delay the agent's loop as much and are not the agent's doing.
    A thread, not a task: a task on the loop would also count the loop's own blocking, which is what is measured."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "HostStalls":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while True:
            asked = time.monotonic()
            if self._done.wait(0.01):
                return
            self.longest = max(self.longest, time.monotonic() - asked - 0.01)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


async def _engine(arrivals: list[float]) -> tuple[web.AppRunner, str]:
    body = sample_text("vllm-cpu-load-c16.prom")

    async def metrics(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _client(session: aiohttp.ClientSession, url: str, until: float, latencies: list[float]) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        async with session.get(url) as r:
            await r.read()
            assert r.status == 200
        latencies.append(time.monotonic() - started)


async def run(clients: int = 50, seconds: float = 10.0, interval: float = 1.0) -> dict[str, Any]:
    arrivals: list[float] = []
    engine, engine_url = await _engine(arrivals)
    windows = f"{max(10 * interval, 1):g}s,{max(60 * interval, 2):g}s"
    config = build({}, {}, {"engine_url": [engine_url], "nvml": False, "process": False, "interval": f"{interval:g}",
                            "windows": windows, "model": "llama-3-8b", "gpu": "h100-sxm"})
    agent = Agent(config, models=resolve_models(config))
    runner = web.AppRunner(build_app(agent), shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    latencies: list[float] = []
    try:
        await asyncio.sleep(2 * interval)  # the agent's first samples, before the load
        start = len(arrivals)
        until = time.monotonic() + seconds
        connector = aiohttp.TCPConnector(limit=clients)
        with HostStalls() as stalls:
            async with aiohttp.ClientSession(connector=connector) as session:
                await asyncio.gather(*(_client(session, f"http://127.0.0.1:{port}/metrics", until, latencies)
                                       for _ in range(clients)))
        during = arrivals[start:]
    finally:
        await runner.cleanup()
        await engine.cleanup()
    gaps = [b - a for a, b in zip(during, during[1:])]
    jitter = [abs(g - interval) for g in gaps]
    return {
        "clients": clients, "seconds": seconds, "interval": interval,
        "scrapes": len(latencies), "scrapes_per_second": round(len(latencies) / seconds, 1),
        "latency_p50_ms": round(1000 * percentile(latencies, 50), 2),
        "latency_p99_ms": round(1000 * percentile(latencies, 99), 2),
        "latency_max_ms": round(1000 * max(latencies), 2) if latencies else None,
        "samples": len(during),
        "jitter_p50_ms": round(1000 * percentile(jitter, 50), 2),
        "jitter_p99_ms": round(1000 * percentile(jitter, 99), 2),
        "jitter_max_ms": round(1000 * max(jitter), 2) if jitter else None,
        "mean_interval_s": round(statistics.fmean(gaps), 4) if gaps else None,
        "host_stall_max_ms": round(1000 * stalls.longest, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.clients, a.seconds, a.interval)), indent=2))


if __name__ == "__main__":
    main()
