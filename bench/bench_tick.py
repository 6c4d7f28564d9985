"""What one 10 Hz tick of the agent costs because it wakes to it: the wake itself, the fetch, the vLLM parse.

bench/bench_process_cpu.py measures the whole agent; this splits off the parts a tick pays after 100 ms asleep,
each as CPU time per tick (`time.process_time` over `--seconds`, or thread CPU time per call), in one process:

- the bare wake: a loop that only sleeps 100 ms, as `time.sleep`, as `await asyncio.sleep` (the stdlib loop),
  the same entering an `asyncio.timeout` as the agent's fetch does, and with uvloop where it is installed (it is
  not a dependency: the comparison says why);
- the fetch: the asyncio sleep plus one PageClient read of the vLLM page from bench_process_cpu.py's fake engine;
- the parse: `vllm.parse` of the moving vLLM pages after 100 ms asleep and back to back, with the page plan
  (`vllm._page_plan`) and grouped anew, interleaved page by page.

Figures are printed, never asserted; each line is measured in the same run as the lines it is compared with.

Run from the repository root:  python bench/bench_tick.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import aiohttp  # noqa: E402

from bench_process_cpu import DEFAULT_PAGE, start_server  # noqa: E402
from bench_sampling import moving_pages  # noqa: E402
from rooflight.collectors import expfmt, vllm  # noqa: E402
from rooflight.collectors.common import page_bounds, read_page  # noqa: E402
from rooflight.collectors.http import PageClient  # noqa: E402
from rooflight.collectors.samples import EngineSample  # noqa: E402

IDLE_S = 0.1


def per_tick(seconds: float, tick: Callable[[], None]) -> float:
    """Microseconds of this process's CPU per call of `tick` (which sleeps) over `seconds`."""
    t0, w0, n = time.process_time(), time.monotonic(), 0
    while time.monotonic() - w0 < seconds:
        tick()
        n += 1
    return (time.process_time() - t0) / n * 1e6


async def per_async_tick(seconds: float, work: Callable[[], Awaitable[None]] | None, timeout: bool) -> float:
    t0, w0, n = time.process_time(), time.monotonic(), 0
    while time.monotonic() - w0 < seconds:
        await asyncio.sleep(IDLE_S)
        if timeout:
            async with asyncio.timeout(5):
                pass
        if work is not None:
            await work()
        n += 1
    return (time.process_time() - t0) / n * 1e6


def wakes(seconds: float) -> None:
    print(f"the bare wake, CPU a tick at {1 / IDLE_S:g} Hz over {seconds:g} s:")
    print(f"  time.sleep                            {per_tick(seconds, lambda: time.sleep(IDLE_S)):6.0f} us")
    print(f"  asyncio.sleep (stdlib loop)           {asyncio.run(per_async_tick(seconds, None, False)):6.0f} us")
    print(f"  asyncio.sleep + asyncio.timeout       {asyncio.run(per_async_tick(seconds, None, True)):6.0f} us")
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        print("  uvloop                                not installed")
    else:
        print(f"  the same on uvloop                    {uvloop.run(per_async_tick(seconds, None, True)):6.0f} us")


async def fetches(seconds: float, port: int) -> None:
    async with aiohttp.ClientSession() as session:
        pages = PageClient(session)
        url = f"http://127.0.0.1:{port}/metrics"

        async def fetch() -> None:
            await pages.fetch_text(url, timeout=5, max_bytes=1 << 24, monotonic=time.monotonic)

        for _ in range(20):
            await fetch()
        bare = await per_async_tick(seconds, None, False)
        fetched = await per_async_tick(seconds, fetch, False)
        pages.close()
    print(f"the fetch (PageClient, the vLLM page): {fetched:6.0f} us a tick against {bare:.0f} bare"
          f" (+{fetched - bare:.0f})")


def parses(pages: list[str]) -> None:
    def planned(page: str) -> None:
        vllm.parse(page, target="t", timestamp=1.0, duration=0.1)

    def anew(page: str) -> None:
        exp = read_page(page, ("vllm:",), vllm.NAMES)
        series, info = vllm._read(exp)
        EngineSample(target="t", engine="vllm", timestamp=1.0, duration=0.1, series=series, info=info)

    for idle in (IDLE_S, 0.0):
        spent: dict[str, list[float]] = {"with the page plan": [], "grouped anew": []}
        for i, page in enumerate(pages * 2):
            order = ((planned, "with the page plan"), (anew, "grouped anew"))
            for read, name in order if i % 2 else order[::-1]:
                time.sleep(idle)
                t0 = time.thread_time()
                with expfmt.bounded(page_bounds(10_000)):
                    read(page)
                spent[name].append(time.thread_time() - t0)
        shown = ", ".join(f"{name} {statistics.median(times[10:]) * 1e6:.0f} us" for name, times in spent.items())
        when = "after 100 ms asleep" if idle else "back to back"
        print(f"vllm.parse, {when}: {shown} (median of {len(pages) * 2 - 10})")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--seconds", type=float, default=20.0, help="seconds each wake and fetch line is measured")
    opts = args.parse_args()
    print(f"$ python bench/bench_tick.py --seconds {opts.seconds:g}")
    wakes(opts.seconds)
    engine, ports = start_server(DEFAULT_PAGE, 8)
    try:
        asyncio.run(fetches(opts.seconds, ports[0]))
    finally:
        engine.kill()
    parses(list(moving_pages(DEFAULT_PAGE.read_text(), 60)))


if __name__ == "__main__":
    main()
