"""Client traffic for the dashboards' end-to-end test: a fake streaming server and clients, in one thread.

The client-side panels read the proxy's `rooflight_client_*` series, which only exist while requests flow
through a `rooflight proxy`. This owns that traffic: a fake OpenAI-compatible server on 127.0.0.1 that
streams every completion as TOKENS SSE chunks GAP_S apart (then usage and [DONE]) but answers every
UNAVAILABLE_EVERY-th request 503 (so the client availability SLO's error ratio has errors to count), and
one client loop per proxy that streams a request after another, both on an asyncio loop in a daemon thread, so the test
thread stays free to query Prometheus. Imported as a sibling module by test_dashboards_e2e.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from typing import Sequence

import aiohttp
from aiohttp import web

from support import serve_app

TOKENS = 8
TTFT_S = 0.02
GAP_S = 0.005
PAUSE_S = 0.1  # between one client's requests
UNAVAILABLE_EVERY = 10  # the upstream's share of 503s: one in ten
SERVED = web.AppKey("served", itertools.count)  # requests the fake upstream has answered


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _completion(request: web.Request) -> web.StreamResponse:
    await request.read()
    if next(request.app[SERVED]) % UNAVAILABLE_EVERY == UNAVAILABLE_EVERY - 1:
        return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.sleep(TTFT_S)
    for i in range(TOKENS):
        if i:
            await asyncio.sleep(GAP_S)
        finish = "length" if i == TOKENS - 1 else None
        await response.write(_event({"object": "text_completion", "model": "fake",
                                     "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": finish}]}))
    await response.write(_event({"object": "text_completion", "model": "fake", "choices": [],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 3 + TOKENS}}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


class ClientTraffic:
    """The fake upstream (`url`, once started) and, after `drive(proxies)`, streams through each proxy."""

    def __init__(self) -> None:
        self.url = ""
        self.completed = 0
        self.unavailable = 0  # answered 503: the upstream's, relayed by the proxy
        self.failed = 0  # answered with another status than 200 or 503
        self.refused = 0  # not answered: the proxy not listening yet
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._clients: list[asyncio.Future] = []
        self._stop = asyncio.Event()

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self.url

    async def _serve(self) -> str:
        app = web.Application()
        app[SERVED] = itertools.count()
        app.router.add_post("/v1/completions", _completion)
        self._runner, url = await serve_app(app, access_log=None)
        return url

    def drive(self, proxies: Sequence[str]) -> None:
        """Stream requests through each proxy URL, one after another, until stop()."""
        self._clients = [asyncio.run_coroutine_threadsafe(self._client(url), self._loop) for url in proxies]

    async def _client(self, url: str) -> None:
        body = {"model": "fake", "prompt": "p", "max_tokens": TOKENS, "stream": True}
        async with aiohttp.ClientSession() as http:
            while not self._stop.is_set():
                try:
                    async with http.post(url + "/v1/completions", json=body) as r:
                        await r.read()
                        self.completed += r.status == 200
                        self.unavailable += r.status == 503
                        self.failed += r.status not in (200, 503)
                except aiohttp.ClientError:
                    self.refused += 1
                await asyncio.sleep(PAUSE_S)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        for client in self._clients:
            client.result(timeout=10)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
