"""A ProxyServer on an event loop of its own, in a thread of its own (`rooflight proxy` with one process: its
/metrics on the main loop).

On the loop that serves /metrics, every scrape queued in front of the next token of every stream: with 50
scrapers a proxied stream's TTFT went from 128 to 540 ms. Here the proxy's loop runs only the
relay and its accounting; what the main loop reads from it crosses threads safely: the metrics snapshot is
an immutable object replaced whole (one reference read). The threads still share the GIL: Python work on
the main loop can delay the proxy's by a switch interval, which is why `rooflight run --proxy-listen`, whose
agent renders far more than the proxy's own /metrics, runs its relay in a process of its own instead
(agent/proxy/apart.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
from typing import Any

from rooflight.agent.proxy.server import ProxyServer

SWITCH_INTERVAL = 0.001  # seconds; Python's default is 0.005
log = logging.getLogger("rooflight.proxy")


class ProxyThread:
    """Starts `server` on a loop in a daemon thread; start() returns once it is bound (or raises the bind's
    OSError, everything released), stop() returns once it has stopped and released its ports."""

    def __init__(self, server: ProxyServer, name: str = "rooflight-proxy") -> None:
        self.server = server
        self._name = name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def start(self, **start_kwargs: Any) -> None:
        # A thread waiting for the GIL asks for it after the switch interval: 1 ms, not 5, so a token that
        # reaches the proxy while the agent renders a page waits for the GIL at most about that long.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started, start_kwargs), name=self._name, daemon=True)
        self._thread.start()
        await asyncio.wrap_future(started)

    async def stop(self) -> None:
        """Stop the proxy (in-flight streams are cut, as on SIGTERM) and wait for its thread."""
        loop, stop = self._loop, self._stop
        if self._thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed in between: the thread is ending anyway
                pass
        await asyncio.wrap_future(self._done)

    def _run(self, started: concurrent.futures.Future[None], start_kwargs: dict[str, Any]) -> None:
        try:
            asyncio.run(self._main(started, start_kwargs))
        except BaseException as exc:  # noqa: BLE001 (reported to start(), which re-raises it)
            if not started.done():
                started.set_exception(exc)
            else:  # it was serving: say so, the agent goes on without its proxy
                log.error("the proxy stopped: %s: %s", type(exc).__name__, exc)
        finally:
            if not started.done():
                started.set_exception(RuntimeError("the proxy's thread ended before it started"))
            self._done.set_result(None)

    async def _main(self, started: concurrent.futures.Future[None], start_kwargs: dict[str, Any]) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.server.start(**start_kwargs)
        except BaseException:
            await self.server.stop()
            raise
        started.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self.server.stop()
