"""The canary: a 1-token completion the agent sends an engine its own stall detector calls stalled (`--canary`).

A hang and an idle vLLM whose gauges stuck after a mass client abort read the same on the engine's counters:
requests running, no step, no token, for hours. One request tells them apart: a hung engine never answers
it; an idle one answers at once, and the step it runs refreshes its gauges, which ends the stall. The agent
(agent/sampling/sampler.py, after each sample of the engine) sends one only while its detector sees the
stall (agent/signals/detectors/engine_stalled.py), at most one per stall window and one at a time, so an
engine that makes progress never sees it. Its results are counted on the engine source's health
(`rooflight_engine_canary_requests_total{result="ok"|"failed"}`); RooflightEngineStalled pages only where it
went unanswered (rules/health.py). An answer is a 2xx within the stall window: a 503 (the engine core dead
behind its API server) is a failure, and so is a 401 from an engine that wants an API key the agent lacks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from rooflight.agent.metrics.snapshot import TargetView

log = logging.getLogger("rooflight")

RESULTS = ("ok", "failed")
PROMPT = "Hi"  # one token in, one out: the least work that still runs an engine step


def stalled_models(view: TargetView) -> list[str]:
    """The models of a target whose series the stall detector calls stalled in its latest sample."""
    return [v.series.model for v in view.series if v.verdicts and v.verdicts.engine_stalled]


class Canary:
    """Sends the canary for one engine target and counts its results into `counts` (the source's health)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout: float, counts: dict[str, int],
                 monotonic: Callable[[], float]) -> None:
        self._session, self._url, self._timeout = session, url.rstrip("/") + "/v1/completions", timeout
        self.counts = counts
        self.counts.update({result: self.counts.get(result, 0) for result in RESULTS})
        self._monotonic = monotonic
        self._sent_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def consider(self, stalled_models: list[str]) -> None:
        """Send one canary for the first of `stalled_models` (the models whose series the detector calls
        stalled this sample), unless one is in flight or the last was sent within the stall window."""
        if not stalled_models or (self._task is not None and not self._task.done()):
            return
        now = self._monotonic()
        if self._sent_at is not None and now - self._sent_at < self._timeout:
            return
        self._sent_at = now
        self._task = asyncio.create_task(self._ask(stalled_models[0]), name=f"rooflight-canary:{self._url}")

    async def _ask(self, model: str) -> None:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "stream": False}
        try:
            async with self._session.post(self._url, json=body,
                                          timeout=aiohttp.ClientTimeout(total=self._timeout)) as response:
                await response.read()
                ok = 200 <= response.status < 300
                why = f"answered {response.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        self.counts["ok" if ok else "failed"] += 1
        if ok:
            log.info("canary to %s %s: the engine is idle, not hung", self._url, why)
        else:
            log.warning("canary to %s unanswered within %.0f s (%s): the engine is hung", self._url, self._timeout, why)

    def close(self) -> None:
        """Cancel a canary in flight (the agent stops)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
