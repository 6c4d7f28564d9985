"""`rooflight run --proxy-listen`: the proxy's relay in a process of its own, its metrics on the agent's /metrics.

On a thread of the agent's process the relay shared the GIL with the agent's exposition: 50 clients scraping
the agent raised a proxied stream's TTFT p50 from 13.4-14.3 to 16.9-19.0 ms and its gap p99 from 14-20 to
31-205 ms, where the same scrapers against another process changed nothing. Here the relay is one worker of
agent/proxy/workers.py, the machinery of `rooflight proxy --workers N`: the agent's process holds the port, a
thread of it accepts each connection against the port's limits and hands it over (once per connection, never
per token), and the worker relays. Each finished request's record, the worker's counters and its gaps between
tokens come back (within workers.RECORDS_WITHIN_SECONDS and GAPS_EVERY_SECONDS), and this process observes
them into the ProxyServer whose snapshot the agent's /metrics serves (`ProxyServer.collector`) and whose
ClientGaps the fronted target's head-of-line detector reads. The relay and the agent read one clock, the
system's monotonic one. A worker that dies or hangs is replaced (rooflight_client_worker_restarts_total).
"""

from __future__ import annotations

import asyncio

from rooflight.agent.proxy.server import ProxyServer
from rooflight.agent.proxy.workers import Workers


class ProxyApart:
    """`server`'s relay in a worker process; `server` itself (in this process) only counts and exports."""

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.workers = Workers(server, 1, gaps=bool(server.config.name))  # it fronts a target: its detector reads the gaps
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind the port and start the relay; OSError when the port cannot be bound, RuntimeError when the
        relay's process could not start (everything released either way)."""
        await self.workers.start()
        self.server.refresh_now()
        self._refresher = asyncio.create_task(self._refresh())

    async def stop(self) -> None:
        """Stop the relay (its streams are cut, as on SIGTERM) and release the port."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        await self.workers.stop()

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.server.config.refresh)
            self.server.refresh_now()
