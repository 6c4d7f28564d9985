"""The yardstick of bench/bench_process_cpu.py: the naive sidecar an agent must cost a fraction of.

Every `--interval` seconds it GETs each URL with one aiohttp ClientSession and parses the whole page
with prometheus_client's text_string_to_metric_families, touching every sample; nothing else (no
state, no export). It is scheduled like the agent's loops: a slow tick delays the next, never
overlaps it. On SIGTERM it prints the pages it read and exits.

usage: python bench/naive_scraper.py --interval 0.1 URL [URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def scrape(session: aiohttp.ClientSession, url: str) -> int:
    """One fetch and full parse; the number of samples."""
    async with session.get(url) as response:
        text = await response.text()
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


async def run(urls: list[str], interval: float) -> int:
    """Scrape every URL each `interval` until SIGTERM; the pages read."""
    loop = asyncio.get_running_loop()
    stopping: list[bool] = []
    loop.add_signal_handler(signal.SIGTERM, stopping.append, True)
    pages = 0
    async with aiohttp.ClientSession() as session:
        due = loop.time()
        while not stopping:
            for url in urls:
                try:
                    await scrape(session, url)
                    pages += 1
                except (aiohttp.ClientError, OSError, ValueError):
                    pass
            due = max(due + interval, loop.time())
            await asyncio.sleep(due - loop.time())
    return pages


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--interval", type=float, default=1.0)
    args.add_argument("urls", nargs="+")
    opts = args.parse_args()
    print(f"pages {asyncio.run(run(opts.urls, opts.interval))}", flush=True)


if __name__ == "__main__":
    main()
