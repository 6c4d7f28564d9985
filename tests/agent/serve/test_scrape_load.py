"""/metrics under 50 concurrent clients scraping back to back on 127.0.0.1 for a bounded time (3 s):
every scrape answers, p99 latency stays under a second, and the sampling cadence holds: no interval
between two engine scrapes strays from the configured 0.5 s by as much as one interval (no sample is
skipped) and the mean interval stays within 20 %. The clients share the agent's process and event loop
(bench/scrape_load.py, which prints the figures), so this is pessimistic.
"""

from __future__ import annotations

import importlib.util

from support import ROOT

_spec = importlib.util.spec_from_file_location("scrape_load", ROOT / "bench" / "scrape_load.py")
scrape_load = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(scrape_load)  # type: ignore[union-attr]

INTERVAL = 0.5


async def test_fifty_concurrent_scrapers_keep_metrics_fast_and_sampling_on_time() -> None:
    result = await scrape_load.run(clients=50, seconds=3.0, interval=INTERVAL)
    print(result)
    assert result["scrapes"] >= 100  # the load was real
    assert result["latency_p99_ms"] < 1000
    assert result["samples"] >= 3.0 / INTERVAL - 1
    assert result["jitter_max_ms"] < 1000 * INTERVAL
    assert abs(result["mean_interval_s"] - INTERVAL) < 0.2 * INTERVAL
