"""What one read of an engine's page costs the agent: PageClient against the aiohttp session it replaces.

The agent reads each plain-http engine page with `collectors.http.PageClient` (one kept-alive connection per
engine loop, at the stream level); https and user:password URLs go through the aiohttp session
(`collectors.http.fetch_text`). This reads the same page through both, interleaved round by round, and prints
the client process's CPU per read (user + system, the page's decode to text included), back to back and after
100 ms asleep before each read (as the agent is between ticks at 10 Hz, its caches refilled by others). The
page is served by a subprocess (an aiohttp server on 127.0.0.1), so its CPU is not counted.

Figures are printed, never asserted; the ratio, measured in the same run, is the steadier figure.

Run from the repository root:
    python bench/bench_fetch.py [--page tests/fixtures/engine-samples/vllm-cpu-load-c16.prom] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rooflight.collectors.http import PageClient, fetch_text  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_process_cpu import DEFAULT_PAGE, free_port  # noqa: E402

MAX_BYTES = 4 * 1024 * 1024
SERVE = """
import sys
from aiohttp import web
page = open(sys.argv[1]).read()
async def metrics(_): return web.Response(text=page, content_type="text/plain")
app = web.Application(); app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
"""

Read = Callable[[], Awaitable[str]]


async def cpu_per_read(read: Read, reads: int, asleep: float) -> float:
    """Microseconds of this process's CPU per read, `asleep` seconds idle before each one."""
    spent = 0.0
    for _ in range(reads):
        if asleep:
            await asyncio.sleep(asleep)
        start = time.process_time()
        await read()
        spent += time.process_time() - start
    return spent / reads * 1e6


async def run(url: str, rounds: int) -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(headers={"Accept": "text/plain;version=0.0.4"}) as session:
        pages = PageClient(session)

        async def through_session() -> str:
            return (await fetch_text(session, url, timeout=5, max_bytes=MAX_BYTES, monotonic=loop.time)).text

        async def through_page_client() -> str:
            return (await pages.fetch_text(url, timeout=5, max_bytes=MAX_BYTES, monotonic=loop.time)).text

        sides = {"aiohttp session": through_session, "PageClient": through_page_client}
        texts = {name: await read() for name, read in sides.items()}
        assert len(set(texts.values())) == 1, "the two clients read different pages"
        print(f"page: {len(texts['PageClient'])} characters from {url}; {rounds} rounds, interleaved")
        for asleep, reads in ((0.0, 200), (0.1, 40)):
            per: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(rounds):
                for name, read in sides.items():
                    per[name].append(await cpu_per_read(read, reads, asleep))
            label = "back to back" if not asleep else "after 100 ms asleep"
            medians = {name: statistics.median(v) for name, v in per.items()}
            print(f"{label:<20} " + "   ".join(f"{name} {m:6.0f} us a read" for name, m in medians.items())
                  + f"   PageClient/session {medians['PageClient'] / medians['aiohttp session']:.2f}")
        pages.close()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--page", type=Path, default=DEFAULT_PAGE)
    args.add_argument("--rounds", type=int, default=5)
    opts = args.parse_args()
    print(f"$ python bench/bench_fetch.py --page {opts.page.relative_to(ROOT) if opts.page.is_absolute() else opts.page}"
          f" --rounds {opts.rounds}")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(opts.page), str(port)])
    try:
        asyncio.run(_when_up(f"http://127.0.0.1:{port}/metrics", opts.rounds))
    finally:
        server.terminate()
        server.wait(10)


async def _when_up(url: str, rounds: int) -> None:
    """Wait for the server to answer, then run."""
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            try:
                async with session.get(url) as response:
                    await response.read()
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    await run(url, rounds)


if __name__ == "__main__":
    main()
