"""The fault matrix: the running agent (its own loops, its own HTTP server) against an engine that
misbehaves at the socket, HTTP and exposition level, over real TCP on 127.0.0.1.

Every case checks the same four things: /metrics answers within its own deadline while the fault
lasts; the engine source's up/errors gauges say what happened; no negative or non-finite value is
exported; and the agent recovers on its own once the engine heals. (test_agent_sources.py covers the
single-sample versions of 500s, garbage text, hangs past the timeout and refused connections.)
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.config.agent import build
from rooflight.collectors.http import DEFAULT_MAX_BODY_BYTES
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve.server import build_app
from rooflight.agent.metrics.snapshot import Health
from support import free_port, sample_text, started_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
# Seconds a /metrics request may take while the engine misbehaves: ~10 ms when quiet, some hundreds now and
# then on a loaded 2-core machine (every scrape of every hold() is held to it); one that waited on the sample
# in flight would take up to the scrape timeout, 3 s where a case sets it so (the huge pages), 3x this.
METRICS_DEADLINE = 1.0
FAULT_WAIT = 4.0  # seconds to see the fault, then the recovery, reported
MB = 1024 * 1024


@dataclass
class RawEngine:
    """A TCP server that speaks HTTP/1.1 (or not) exactly as its `mode` says; one request per connection."""

    mode: str = "ok"
    body: str = PAGE
    delay: float = 0.0
    port: int = 0
    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    sent: int = 0  # body bytes written in the last "huge" answer
    _server: asyncio.base_events.Server | None = None
    _tasks: set = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self.requests += 1
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.mode != "silent":
                await reader.readuntil(b"\r\n\r\n")
            await getattr(self, "_" + self.mode.replace("-", "_"))(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.inflight -= 1
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    def _head(status: str, length: int | None) -> bytes:
        size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        return f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{size}\r\nConnection: close\r\n\r\n".encode()

    async def _ok(self, w: asyncio.StreamWriter) -> None:
        data = self.body.encode()
        w.write(self._head("200 OK", len(data)) + data)
        await w.drain()

    async def _slow(self, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.delay)
        await self._ok(w)

    async def _silent(self, w: asyncio.StreamWriter) -> None:  # accepts, reads nothing, says nothing
        await asyncio.sleep(3600)

    async def _status_500(self, w: asyncio.StreamWriter) -> None:
        w.write(self._head("500 Internal Server Error", 5) + b"oops\n")
        await w.drain()

    async def _cut(self, w: asyncio.StreamWriter) -> None:  # promises the page, sends half, hangs up
        data = self.body.encode()
        half = data[: len(data) // 2]
        assert not half.endswith(b"\n")
        w.write(self._head("200 OK", len(data)) + half)
        await w.drain()

    async def _garbage(self, w: asyncio.StreamWriter) -> None:
        w.write(os.urandom(4096))
        await w.drain()

    async def _huge(self, w: asyncio.StreamWriter) -> None:  # 50 MB, chunked: no length to refuse it by
        line = b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0\n' * 1000
        chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"
        self.sent = 0
        w.write(self._head("200 OK", None))
        while self.sent < 50 * MB:
            w.write(chunk)
            self.sent += len(line)
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()

    async def _huge_declared(self, w: asyncio.StreamWriter) -> None:
        w.write(self._head("200 OK", 50 * MB) + b"vllm:num_requests_running 1\n")
        await w.drain()
        await asyncio.sleep(3600)


# -- the harness ---------------------------------------------------------------------------------------
def _health(agent: Agent) -> Health:
    return next(h for h in agent.snapshot.health if h.source == "engine")


async def _until(what: Callable[[], bool], seconds: float = FAULT_WAIT) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not what():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


def _scrape_blocking(url: str) -> tuple[int, str, float]:
    """One scrape from a thread of its own: a stalled event loop shows in the time, as it would to Prometheus."""
    import time
    import urllib.request

    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
        status = r.status
    took = time.monotonic() - started
    if os.environ.get("FAULTS_DEBUG"):
        print(f"scrape {took:.3f}s")
    return status, text, took


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple], float]:
    status, text, took = await asyncio.to_thread(_scrape_blocking, url)
    assert status == 200
    assert took < METRICS_DEADLINE, f"/metrics took {took:.3f}s"
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sane(metrics: dict[tuple[str, tuple], float]) -> None:
    bad = {k: v for k, v in metrics.items() if not (math.isfinite(v) and v >= 0)}
    assert not bad, f"negative or non-finite values exported: {bad}"


def _values(metrics: dict, name: str) -> list[float]:
    return [v for (n, _), v in metrics.items() if n == name]


class Harness:
    def __init__(self, engine: RawEngine, agent: Agent, base: str, session: aiohttp.ClientSession) -> None:
        self.engine, self.agent, self.base, self.session = engine, agent, base, session

    async def metrics(self) -> dict[tuple[str, tuple], float]:
        m = await _scrape(self.session, self.base + "/metrics")
        _sane(m)
        return m

    async def hold(self, seconds: float) -> dict:
        """Scrape repeatedly for `seconds`: every answer in time and sane; returns the last."""
        end = asyncio.get_running_loop().time() + seconds
        m = await self.metrics()
        while asyncio.get_running_loop().time() < end:
            await asyncio.sleep(0.05)
            m = await self.metrics()
        return m


async def _with_agent(engine: RawEngine, body: Callable[[Harness], Awaitable[None]], *, up_within: float = FAULT_WAIT,
                      **flags: object) -> None:
    settings = {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "0.1",
                "windows": "1s,2s", "scrape_timeout": "0.3", "model": "llama-3-8b", **flags}
    async with started_agent(build({}, {}, settings)) as agent:
        runner = web.AppRunner(build_app(agent, manage_agent=False), shutdown_timeout=0.1)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:
                h = Harness(engine, agent, f"http://127.0.0.1:{port}", session)
                await _until(lambda: _health(agent).up, up_within)
                await body(h)
        finally:
            await runner.cleanup()


@pytest.fixture
async def engine() -> RawEngine:
    e = RawEngine()
    await e.start()
    yield e
    await e.stop()


async def _fault_then_heal(h: Harness, mode: str, reason: str, **setup: object) -> None:
    before = _health(h.agent).errors.get(reason, 0)
    h.engine.mode = mode
    for key, value in setup.items():
        setattr(h.engine, key, value)
    await _until(lambda: _health(h.agent).errors.get(reason, 0) > before and not _health(h.agent).up)
    m = await h.hold(0.5)
    assert _values(m, "rooflight_source_up") == [0.0]
    errors = {dict(k[1])["reason"]: v for k, v in m.items() if k[0] == "rooflight_source_errors_total"}
    assert errors[reason] > before
    # the last good state is kept until stale_after (scrape timeout + 2 intervals), then dropped
    await _until(lambda: not h.agent.snapshot.targets[0].series, h.agent.engines[0].stale_after + 1.0)
    assert not _values(await h.metrics(), "rooflight_requests_running"), "a down engine's state is not current"
    h.engine.mode = "ok"
    await _until(lambda: _health(h.agent).up)
    m = await h.metrics()
    assert _values(m, "rooflight_source_up") == [1.0] and _values(m, "rooflight_requests_running") == [16.0]


# -- socket and HTTP faults ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "reason", "flags"),
    [
        ("silent", "timeout", {}),  # accepts the connection, never reads or answers
        ("status-500", "http_status", {}),
        ("cut", "other", {}),  # Content-Length promised, body cut mid-line, connection closed
        ("garbage", "other", {}),  # random bytes where an HTTP response should be
        ("huge-declared", "too_large", {}),  # Content-Length: 50 MB, refused before reading
        ("huge", "too_large", {"scrape_timeout": "3"}),  # 50 MB chunked: read up to the body cap only
    ],
)
async def test_fault_is_reported_metrics_stay_fast_and_it_heals(
    engine: RawEngine, mode: str, reason: str, flags: dict
) -> None:
    async def body(h: Harness) -> None:
        await _fault_then_heal(h, mode, reason)
        if mode == "huge":  # the cap, plus what the sockets buffered, and far from the whole body
            assert DEFAULT_MAX_BODY_BYTES <= engine.sent < DEFAULT_MAX_BODY_BYTES + 16 * MB, (
                f"the agent read {engine.sent} bytes of a 50 MB body")

    await _with_agent(engine, body, **flags)


async def test_refused_then_the_engine_comes_back_on_the_same_port(engine: RawEngine) -> None:
    async def body(h: Harness) -> None:
        await engine.stop()
        await _until(lambda: _health(h.agent).errors["refused"] > 0)
        m = await h.hold(0.3)
        assert _values(m, "rooflight_source_up") == [0.0]
        await engine.start()  # same port
        await _until(lambda: _health(h.agent).up)
        assert _values(await h.metrics(), "rooflight_requests_running") == [16.0]

    await _with_agent(engine, body)


async def test_slower_than_the_interval_stays_up_and_never_overlaps(engine: RawEngine) -> None:
    """An engine that answers in 0.25 s, against a 0.1 s interval and a 1 s scrape timeout (4x the delay, so a
    loaded machine's late answer is still an answer, not a timeout whose successor overlaps it)."""
    async def body(h: Harness) -> None:
        engine.mode, engine.delay = "slow", 0.25
        loop = asyncio.get_running_loop()
        start, started = engine.requests, loop.time()
        m = await h.hold(1.5)
        took, requests = loop.time() - started, engine.requests - start
        assert _values(m, "rooflight_source_up") == [1.0]
        assert engine.max_inflight == 1, "a slow sample must delay the next one, not overlap it"
        # back to back at best: at most one sample per 0.25 s (one per 0.1 s would be 2.5x that), and it goes on
        assert 2 <= requests <= took / engine.delay + 1, (requests, took)
        assert _health(h.agent).errors["timeout"] == 0

    await _with_agent(engine, body, scrape_timeout="1")


# -- exposition-level faults -----------------------------------------------------------------------------
def _set(page: str, name: str, value: str) -> str:
    """The page with one vLLM sample's value replaced (the tiny-llama, engine 0 series)."""
    pattern = re.compile(rf'^({re.escape(name)}\{{engine="0",model_name="tiny-llama"\}}) \S+$', re.M)
    assert pattern.search(page), name
    return pattern.sub(lambda m: f"{m.group(1)} {value}", page)


async def test_duplicate_and_conflicting_series(engine: RawEngine) -> None:
    async def body(h: Harness) -> None:
        dup = 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 7.0\n'
        conflicting = "# TYPE vllm:num_requests_running counter\n" + dup.replace("7.0", "-3.0")
        engine.body = PAGE + dup
        await _until(lambda: _values_now(h) == 7.0)  # the last duplicate wins, as the adapter documents
        engine.body = PAGE + conflicting + "# TYPE vllm:generation_tokens_total gauge\n"
        m = await h.hold(0.5)  # a negative 'running' from a re-declared family is dropped, not exported
        assert _values(m, "rooflight_source_up") == [1.0]
        engine.body = PAGE
        await _until(lambda: _values_now(h) == 16.0)

    await _with_agent(engine, body)


def _values_now(h: Harness) -> float | None:
    targets = h.agent.snapshot.targets
    return targets[0].series[0].series.running if targets and targets[0].series else None


async def test_nan_and_inf_values_are_dropped_not_exported(engine: RawEngine) -> None:
    async def body(h: Harness) -> None:
        page = _set(PAGE, "vllm:num_requests_running", "NaN")
        page = _set(page, "vllm:kv_cache_usage_perc", "+Inf")
        page = _set(page, "vllm:generation_tokens_total", "+Inf")
        page = _set(page, "vllm:iteration_tokens_total_count", "-Inf")
        engine.body = page
        await _until(lambda: _values_now(h) is None)
        m = await h.hold(0.6)
        assert _values(m, "rooflight_source_up") == [1.0]
        assert not _values(m, "rooflight_requests_running") and not _values(m, "rooflight_generation_tokens_total")
        engine.body = PAGE
        await _until(lambda: _values_now(h) == 16.0)

    await _with_agent(engine, body)


async def _counter_walk(h: Harness, values: list[float], step: float = 0.15) -> dict:
    """Serve each value for at least `step` and until the agent has sampled it (a later request began, so
    the one that read the value was answered and taken in): on a busy machine a late sample must not skip
    a step of the walk."""
    for v in values:
        h.engine.body = _set(PAGE, "vllm:generation_tokens_total", f"{v:.1f}")
        served = h.engine.requests
        await asyncio.sleep(step)
        await _until(lambda: h.engine.requests >= served + 2)
        await h.metrics()
    return await h.metrics()


STEP_TOKENS, STEP_SECONDS = 100, 0.15  # the walk's counter steps: at most 100 tokens per 0.15 s


async def test_counters_going_backwards_are_a_restart(engine: RawEngine) -> None:
    """A restart counts as its new value (+50), never as the drop (negative) or its size (+8346).

    The walk starts at the page's own 8096 and adds 100 per step (each served until the agent sampled it,
    so a late sample on a busy machine skips none), restarts to 50 and takes one more step. Each window's
    rate is its increase over the time between its first and last sample (at least 0.8 s: the agent
    samples every 0.1 s and steps are at least STEP_SECONDS apart), so it is at most 100/0.15 + 100/0.8 =
    792/s; counting the drop's size instead would add 8346 tokens (over 4000/s), and the restart plus the
    step after it alone give 150 tokens inside the 1 s window. A window whose samples a stalled machine
    spread past its reach is not exported (windows.SeriesHistory.window): each rate is bounded where it is
    there, and one of the two must be. The re-exported counter is the engine's own: a reset stays a reset.
    """
    async def body(h: Harness) -> None:
        await h.hold(1.0)  # so the history covers the 2 s window by the walk's end
        m = await _counter_walk(h, [8096, 8196, 8296, 8396, 50, 150], step=STEP_SECONDS)
        assert _values(m, "rooflight_generation_tokens_total") == [150.0]
        decode = {dict(lbl)["window"]: v for (n, lbl), v in m.items()
                  if n == "rooflight_tokens_per_second" and ("phase", "decode") in lbl}
        assert decode and set(decode) <= {"1s", "2s"}, decode
        ceiling = STEP_TOKENS / STEP_SECONDS + STEP_TOKENS / 0.8
        assert all(0 < rate <= ceiling for rate in decode.values()), decode
        assert decode.get("1s", 150) >= 150, decode

    assert "vllm:generation_tokens_total{engine=\"0\",model_name=\"tiny-llama\"} 8096.0" in PAGE
    await _with_agent(engine, body)


async def test_an_absurd_counter_jump_is_not_a_throughput(engine: RawEngine) -> None:
    """An increase beyond 1e9/s re-baselines the counter instead of becoming a throughput, in the windows
    and in the counter the agent re-exports (which the recording rules rate): the next increases count."""
    async def body(h: Harness) -> None:
        m = await _counter_walk(h, [1000, 1100, 1e18, 1e18 + 4096, 1e18 + 8192, 1e18 + 12288])
        for name in ("rooflight_tokens_per_second", "rooflight_mbu_ratio", "rooflight_mfu_ratio"):
            values = _values(m, name)
            assert values and max(values) < 1e6, (name, values)
        assert _values(m, "rooflight_generation_tokens_total") == [1100.0 + 3 * 4096]  # before: 1e18 + 12288

    await _with_agent(engine, body)


def _exploded(models: int) -> str:
    lines = [l for l in PAGE.splitlines() if l.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{",
                                                           "vllm:generation_tokens_total{", "vllm:kv_cache_usage_perc{"))]
    return "\n".join(l.replace('model_name="tiny-llama"', f'model_name="lora-{i}"') for i in range(models) for l in lines) + "\n"


async def test_label_explosion_is_capped_and_reported(engine: RawEngine) -> None:
    """Past max_series (128) a target's series are dropped, and the drop is counted."""
    async def body(h: Harness) -> None:
        engine.body = _exploded(5000)
        await _until(lambda: (_health(h.agent).series_dropped or 0) > 0)
        m = await h.hold(0.5)
        assert len(_values(m, "rooflight_requests_running")) == 128  # the default max_series
        assert _values(m, "rooflight_source_series_dropped") == [5000 - 128]
        engine.body = PAGE
        await _until(lambda: _health(h.agent).series_dropped == 0)
        m = await h.metrics()
        assert _values(m, "rooflight_requests_running") == [16.0]

    await _with_agent(engine, body)


async def test_a_big_valid_page_does_not_stall_metrics(engine: RawEngine) -> None:
    """~14 MB of real vLLM series (450 models, every family), under a 16 MiB cap (the default is 4 MiB):
    parsing takes ~1 s of CPU.

    Measured worst scrape here: 0.27 s with parsing on the event loop, 0.14 s with pages over 512 KiB
    parsed in a worker thread (as the engine loop does).
    """
    full = [l for l in PAGE.splitlines() if l.startswith("vllm:") and 'model_name="tiny-llama"' in l]
    engine.body = "\n".join(l.replace("tiny-llama", f"m-{i}") for i in range(450) for l in full) + "\n"

    async def body(h: Harness) -> None:
        m = await h.hold(2.0)  # every scrape within METRICS_DEADLINE while big pages are parsed
        assert _values(m, "rooflight_source_up") == [1.0]

    # the first sample parses ~14 MB (~1 s of CPU idle, several on a loaded 2-core box): a generous timeout and
    # wait for it, so the test judges the scrapes while big pages are parsed, not how fast the machine is
    await _with_agent(engine, body, up_within=60, scrape_timeout="20", interval="0.5", windows="2s,4s",
                      max_body_bytes=16 * MB)
