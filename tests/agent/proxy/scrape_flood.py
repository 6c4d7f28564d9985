"""`python scrape_flood.py URL CLIENTS`: CLIENTS concurrent clients GET URL's /api/v1/status (four in five
of them: the status page's pollers) or /metrics (one in five) back to back until killed, in a process of
their own (so their CPU is not the measuring test's). Prints `flooding` once every client has had an answer."""

from __future__ import annotations

import asyncio
import sys

import aiohttp


async def client(session: aiohttp.ClientSession, url: str, first: asyncio.Event, started: list[int]) -> None:
    i = 0
    while True:
        try:
            async with session.get(url) as r:
                await r.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)
        i += 1
        if i == 1:
            started[0] += 1
            if started[0] == started[1]:
                first.set()


async def main(base: str, clients: int) -> None:
    first, started = asyncio.Event(), [0, clients]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        paths = ("/metrics", "/api/v1/status", "/api/v1/status", "/api/v1/status", "/api/v1/status")
        tasks = [asyncio.create_task(client(session, base + paths[i % len(paths)], first, started))
                 for i in range(clients)]
        await first.wait()
        print("flooding", flush=True)
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
