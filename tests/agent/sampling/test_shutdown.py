"""Agent.stop() always finishes, bounded, whatever a source is doing.

The hang this guards against: a sampling task is cancelled, but the cancellation is lost inside a
step (Python 3.11's asyncio.wait_for returns the NVML result that lands together with the cancel),
so the loop went back to its sleep and stop() waited on it forever. The ownership test hung that way
in about half the runs that followed a fault-matrix test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import urllib.request
from concurrent.futures import Future
from typing import Any, Callable

import pytest
from aiohttp import web

from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.sampling.engine_loop import EngineLoop
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve.server import build_app
from rooflight.collectors.daemon_executor import DaemonThreadExecutor
from rooflight.collectors.nvml_fake import FakeNvml, a100_like, h100_like
from support import FakeEngine, free_port, sample_text, started_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
STOP_BOUND = 3.0  # seconds: far above a healthy stop (milliseconds), far below a hang


def _config(url: str, **flags: object) -> AgentConfig:
    settings = {"engine_url": [url], "nvml": False, "process": False, "interval": "0.1", "windows": "1s,2s",
                "scrape_timeout": "0.3", "model": "llama-3-8b", **flags}
    return build({}, {}, settings)


async def _stop_within(agent: Agent, stopping: asyncio.Future[None] | None = None,
                       release: Callable[[], None] = lambda: None, seconds: float = STOP_BOUND) -> float:
    """Wait for the agent's stop (`stopping`, else a new agent.stop()); fail, not hang, past `seconds`.

    On a hang, `release` lets the test's misbehaving step end and the tasks are cancelled again, so a
    broken stop() fails this test and leaves an event loop that still closes. Returns the time taken.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    stopping = stopping or asyncio.ensure_future(agent.stop())
    done, _ = await asyncio.wait({stopping}, timeout=seconds)
    if not done:
        release()
        await _cancel_repeatedly(list(agent._tasks), seconds)
        await asyncio.wait({stopping}, timeout=seconds)
        pytest.fail(f"agent.stop() did not finish within {seconds} s: a sampling task kept running")
    stopping.result()
    return loop.time() - started


async def _cancel_repeatedly(tasks: list[asyncio.Task[None]], seconds: float) -> None:
    """Cleanup after a hang: cancel again and again (each try may land outside the lost-cancel window)."""
    deadline = asyncio.get_running_loop().time() + seconds
    pending = {t for t in tasks if not t.done()}
    while pending and asyncio.get_running_loop().time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.02)


async def _until(what: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not what():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


# -- a step that loses or refuses its cancellation ----------------------------------------------------
async def test_a_step_that_swallows_its_cancellation_still_stops(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, swallow = asyncio.Event(), [True]

    async def swallowing_step(self: EngineLoop) -> None:  # what wait_for's race does: returns when cancelled
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallow[0]:
                return
            raise

    monkeypatch.setattr(EngineLoop, "sample_once", swallowing_step)
    agent = Agent(_config(fake_engine.url))
    await agent.start()
    await asyncio.wait_for(entered.wait(), STOP_BOUND)
    tasks = list(agent._tasks)
    took = await _stop_within(agent, release=lambda: swallow.__setitem__(0, False))
    assert took < 1.0, f"stop took {took:.2f} s"
    assert tasks and all(t.done() for t in tasks)


async def test_a_task_that_refuses_to_stop_is_logged_and_left_behind(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    entered, released = asyncio.Event(), [False]

    async def stubborn_step(self: EngineLoop) -> None:  # ignores every cancel until the test lets go
        entered.set()
        while not released[0]:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    monkeypatch.setattr(EngineLoop, "sample_once", stubborn_step)
    agent = Agent(_config(fake_engine.url))
    await agent.start()
    await asyncio.wait_for(entered.wait(), STOP_BOUND)
    (task,) = agent._tasks
    try:
        with caplog.at_level(logging.ERROR, logger="rooflight"):
            took = await _stop_within(agent, asyncio.ensure_future(agent.stop(timeout=0.3)))
        assert 0.3 <= took < 1.5
        assert f"sampling task {task.get_name()} did not stop within 0.3 s" in caplog.text
        assert task.get_name() == "rooflight-engine:" + agent.config.targets[0].name
        assert not task.done(), "stop() claimed a task it could not end"
    finally:
        released[0] = True  # let it end, so the test's event loop closes cleanly
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_BOUND)


# -- each guard alone: a loop that does not end fails a test whichever guard breaks ------------------------
# Agent._every re-raises a cancel its step raised (1), ends when a step returned from a cancel it dropped
# (2, task.cancelling()), ends at its next step once stop() set the stop flag (3); stop() cancels again
# until every task ends (4). Each test below is a case only one of them ends.

# Python 3.10 has no task.cancelling()/uncancel(): there the loops rely on the stop flag alone (sampler.py).
NEEDS_CANCELLING = pytest.mark.skipif(sys.version_info < (3, 11), reason="task.cancelling() and uncancel() are 3.11's")


async def _engine_task(agent: Agent) -> asyncio.Task[None]:
    (task,) = agent._tasks  # nvml and process off: the engine loop alone
    return task


async def test_a_loop_cancelled_in_a_step_that_honours_it_ends_cancelled_and_quietly(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard 1: a cancel (from outside stop(): a task group, a shutdown) raised by the step ends the loop as
    a cancel, not as a dropped one it then had to notice (which logs a warning) or ignore."""
    entered = asyncio.Event()

    async def waiting_step(self: EngineLoop) -> None:
        entered.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(EngineLoop, "sample_once", waiting_step)
    agent = Agent(_config(fake_engine.url))
    await agent.start()
    try:
        await asyncio.wait_for(entered.wait(), STOP_BOUND)
        task = await _engine_task(agent)
        with caplog.at_level(logging.WARNING, logger="rooflight"):
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_BOUND)
        assert task.done(), "a loop whose step raised its cancel kept running"
        assert task.cancelled()
        assert "cancelled inside a step" not in caplog.text, "an honoured cancel was reported as a dropped one"
    finally:
        await _stop_within(agent)


@NEEDS_CANCELLING
async def test_a_loop_whose_step_drops_a_cancel_from_outside_stop_still_ends(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard 2: one cancel, not from stop() (no stop flag, no second cancel), that the step returned from
    (Python 3.11's wait_for race): the loop sees the task was cancelled and ends, saying so."""
    entered, swallow = asyncio.Event(), [True]

    async def swallowing_step(self: EngineLoop) -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallow[0]:
                return
            raise

    monkeypatch.setattr(EngineLoop, "sample_once", swallowing_step)
    agent = Agent(_config(fake_engine.url))
    await agent.start()
    try:
        await asyncio.wait_for(entered.wait(), STOP_BOUND)
        task = await _engine_task(agent)
        with caplog.at_level(logging.WARNING, logger="rooflight"):
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_BOUND)
        assert task.done(), "a loop whose step dropped its cancel went on sampling"
        assert f"sampling task {task.get_name()} was cancelled inside a step; it ends" in caplog.text
    finally:
        swallow[0] = False
        await _stop_within(agent)


@NEEDS_CANCELLING
async def test_stop_ends_a_loop_whose_step_drops_every_cancel_uncounted_until_its_work_is_done(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guard 3: a step that drops every cancel and takes it back (uncancel(), as asyncio.timeout does with its
    own), so the task does not look cancelled, and that returns only when its 0.3 s of work is done: every
    cancel stop() sends lands in it. The stop flag ends the loop when the step returns."""
    entered, drop = asyncio.Event(), [True]

    async def uncancelling_step(self: EngineLoop) -> None:
        entered.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.3
        while loop.time() < end:
            try:
                await asyncio.sleep(end - loop.time())
            except asyncio.CancelledError:
                if not drop[0]:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    monkeypatch.setattr(EngineLoop, "sample_once", uncancelling_step)
    agent = Agent(_config(fake_engine.url))  # interval 0.1 s: the step overruns it, the loop never sleeps
    await agent.start()
    try:
        await asyncio.wait_for(entered.wait(), STOP_BOUND)
        task = await _engine_task(agent)
        took = await _stop_within(agent, asyncio.ensure_future(agent.stop(timeout=STOP_BOUND)))
        assert task.done(), "stop() left behind a loop whose step had returned: the stop flag was not read"
        assert took < STOP_BOUND / 2, f"stop took {took:.2f} s"  # one step (0.3 s), far from the timeout
    finally:
        drop[0] = False
        await _cancel_repeatedly(list(agent._tasks), STOP_BOUND)


async def test_stop_cancels_again_a_step_that_swallowed_the_first_cancel_and_kept_waiting(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guard 4: a step that swallows one cancel and keeps waiting never returns to the loop (no flag or lost-
    cancel check runs): only a second cancel ends it, and stop() must send it."""
    entered, swallowed = asyncio.Event(), [0]

    async def swallow_once_step(self: EngineLoop) -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed[0] += 1
        await asyncio.sleep(3600)  # the second cancel ends it

    monkeypatch.setattr(EngineLoop, "sample_once", swallow_once_step)
    agent = Agent(_config(fake_engine.url))
    await agent.start()
    try:
        await asyncio.wait_for(entered.wait(), STOP_BOUND)
        task = await _engine_task(agent)
        took = await _stop_within(agent, asyncio.ensure_future(agent.stop(timeout=STOP_BOUND)))
        assert swallowed[0] == 1 and task.done(), "stop() cancelled once and left the task behind"
        assert took < STOP_BOUND / 2, f"stop took {took:.2f} s"
    finally:
        await _cancel_repeatedly(list(agent._tasks), STOP_BOUND)


# -- the real race: a stop that lands as an NVML answer arrives -------------------------------------------
class GatedExecutor:
    """Wraps DaemonThreadExecutor.submit: the `gate_at`-th NVML job waits on the worker thread until the
    test opens the gate, and its Future is kept so the test can act the instant it completes."""

    def __init__(self, gate_at: int) -> None:
        self.gate_at, self.calls = gate_at, 0
        self.running, self.gate = threading.Event(), threading.Event()
        self.future: Future[Any] | None = None
        self._submit = DaemonThreadExecutor.submit

    def submit(self, executor: DaemonThreadExecutor, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Future[Any]:
        self.calls += 1
        if self.calls != self.gate_at:
            return self._submit(executor, fn, *args, **kw)

        def gated() -> Any:
            self.running.set()
            self.gate.wait(10)
            return fn(*args, **kw)

        self.future = self._submit(executor, gated)
        return self.future


async def test_a_stop_that_lands_as_an_nvml_answer_arrives_still_finishes(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NVML result reaches the event loop together with stop()'s cancel: on Python 3.11 wait_for
    returns the result and drops the cancel. stop() must finish anyway."""
    gated = GatedExecutor(gate_at=2)  # the first sample initialises NVML; hold the second
    monkeypatch.setattr(DaemonThreadExecutor, "submit", lambda self, fn, *a, **k: gated.submit(self, fn, *a, **k))
    config = _config(fake_engine.url, nvml=True, nvml_interval="0.05", interval="5", windows="20s,40s")
    agent = Agent(config, nvml_lib=h100_like(1))
    await agent.start()
    try:
        nvml_task = next(t for t in agent._tasks if t.get_coro().__qualname__ == "Agent._nvml_loop")
        await _until(gated.running.is_set)
        await asyncio.sleep(0.05)  # the loop is now inside wait_for, awaiting this sample
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Future[None]] = []
        assert gated.future is not None
        # Runs on the worker thread right after the result is handed to the event loop (callbacks run in
        # the order they were added; asyncio's wrap_future added its own first): the stop's cancel then
        # reaches the task in the same few loop iterations as the result, before wait_for resumes.
        gated.future.add_done_callback(
            lambda _: loop.call_soon_threadsafe(lambda: stopping.append(asyncio.ensure_future(agent.stop()))))
        gated.gate.set()
        await _until(lambda: bool(stopping))
        await _stop_within(agent, stopping[0])
        assert nvml_task.done() and gated.future.done()
    finally:  # whatever failed above, leave no loop running (a lost cancel would hang the event loop's close)
        gated.gate.set()
        await _cancel_repeatedly(list(agent._tasks), STOP_BOUND)


# -- the pairing that hung: a fault-matrix agent, then the GPU-ownership agent, several times ---------------
async def _fault_phase(engine: FakeEngine) -> None:
    """An agent behind its own HTTP server (as the fault matrix runs it), an engine that fails then heals,
    /metrics scraped from another thread; then the server and the agent shut down, bounded."""
    agent = Agent(_config(engine.url))
    runner = web.AppRunner(build_app(agent), shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        engine.status = 500
        await _until(lambda: bool(agent.snapshot.health) and not agent.snapshot.health[0].up)
        engine.status = 200
        await _until(lambda: agent.snapshot.health[0].up)
        url = f"http://127.0.0.1:{port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        assert 'rooflight_source_up{source="engine"' in body
    finally:
        done, _ = await asyncio.wait({asyncio.ensure_future(runner.cleanup())}, timeout=STOP_BOUND)
        assert done, f"the server's shutdown (agent.stop() in its cleanup) took over {STOP_BOUND} s"


async def _ownership_phase(engines: list[FakeEngine], other_pid: int) -> None:
    """Two targets on a fake node (this process on two H100s, `other_pid` on an A100), NVML and process
    loops at 0.2 s, polled every 0.2 s as the ownership test does; then a bounded stop."""
    h100s, a100 = h100_like(2), a100_like(1)
    for gpu in h100s.gpus:
        gpu.processes = [(os.getpid(), 1 << 30)]
    a100.gpus[0].processes = [(other_pid, 1 << 30)]
    config = build({}, {}, {
        "targets": [{"url": engines[0].url, "name": "a", "pid": os.getpid()},
                    {"url": engines[1].url, "name": "b", "pid": other_pid}],
        "model": "llama-3-8b", "interval": "0.2", "windows": "1s,2s", "nvml_interval": "0.2",
    })
    async with started_agent(config, nvml_lib=FakeNvml(h100s.gpus + a100.gpus), stop_within=STOP_BOUND) as agent:
        def matched() -> bool:
            a = next((t.constants for t in agent.snapshot.targets if t.name == "a"), None)
            return a is not None and a.tensor_parallel_size == 2

        deadline = asyncio.get_running_loop().time() + 10
        while not matched():
            assert asyncio.get_running_loop().time() < deadline, "target a never matched its two GPUs"
            await asyncio.sleep(0.2)


async def test_fault_then_ownership_agents_stop_every_time() -> None:
    import subprocess

    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    other = int(out.stdout.strip())
    engines = [FakeEngine(body=PAGE) for _ in range(2)]
    for e in engines:
        await e.start()
    try:
        for _ in range(4):
            await _fault_phase(engines[0])
            await _ownership_phase(engines, other)
    finally:
        for e in engines:
            await e.stop()
        os.kill(other, 9)
