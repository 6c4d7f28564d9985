"""The sampling loops: one asyncio task per source, each on its own interval, each writing its own part
of the state and publishing a new frozen Snapshot. Nothing here blocks the event loop: HTTP is async,
NVML and psutil calls run in executors inside their collectors, with timeouts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine

import aiohttp

from rooflight.agent.sampling.clock import Clock, SystemClock
from rooflight.agent.sampling.config import AgentConfig, TargetConfig
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.sampling.engine_loop import EngineLoop
from rooflight.agent.sampling.health import SourceState
from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY, GpuProfile, get_profile, profile_for_nvml_name
from rooflight.agent.roofline.models import ModelSpec
from rooflight.agent.metrics.snapshot import EMPTY, Snapshot
from rooflight.agent.signals.headroom import ENERGY, gpu_energy_watts
from rooflight.agent.signals.windows import SeriesHistory, mean
from rooflight.collectors.gpu_map import GpuAssignment, assign_gpus
from rooflight.collectors.errors import SourceError
from rooflight.collectors.samples import GpuSample, ProcessSample

log = logging.getLogger("rooflight")

STOP_TIMEOUT_S = 5.0  # how long stop() waits for the sampling tasks before it leaves one behind
_RECANCEL_S = 0.05  # how often stop() cancels again a task that swallowed its cancellation


class Agent:
    """Owns the sources and the current Snapshot."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        models: dict[str, tuple[ModelSpec | None, str | None]] | None = None,
        clock: Clock | None = None,
        nvml_lib: Any = None,
        process_pids: dict[str, int] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self._nvml_lib = nvml_lib
        self._process_pids = process_pids or {}
        self._models = models or {}
        self._snapshot: Snapshot = EMPTY
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False  # set by stop(): every loop ends at its next step, even if a cancel was lost
        self._session: aiohttp.ClientSession | None = None
        self._gpu: GpuSample | None = None
        self._nvml_state = SourceState("nvml", "node")
        self._process_states: dict[str, SourceState] = {}
        self._processes: dict[str, ProcessSample] = {}
        self._warned_default_gpu = False
        self._gpu_history: dict[str, SeriesHistory] = {}  # by UUID: measured DRAM bandwidth over time
        self._nvml_collector: Any = None
        self._process_collectors: dict[str, Any] = {}
        self._target_gpus: dict[str, GpuAssignment] = {}
        self.engines: list[EngineLoop] = []

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def start(self, *, loops: bool = True) -> None:
        """Open the HTTP session and, unless `loops` is False (tests, benchmarks), start every loop."""
        self._stopping = False
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"},
        )
        for target in self.config.targets:
            model, source = self._models.get(target.name, (None, None))
            loop = EngineLoop(
                target, self.config, self._session, self.clock, model, source, self._constants_for, self.dram_utilization,
                self.energy_watts,
            )
            self.engines.append(loop)
            if loops:
                self._spawn(self._every(self.config.interval, loop.sample_once), f"engine:{target.name}")
        if not loops:
            self.publish()
            return
        if self.config.nvml:
            self._spawn(self._nvml_loop(), "nvml")
        if self.config.process:
            for target in self.config.targets:
                self._spawn(self._process_loop(target), f"process:{target.name}")
        self.publish()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"rooflight-{name}"))

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every loop and close the HTTP session, within `timeout` whatever a source is doing.

        A cancellation can be lost (Python 3.11's wait_for returns a result that lands with the cancel),
        so the loops also check a stop flag, and a task still running is cancelled again until the
        deadline; one that still refuses is logged and left behind rather than hanging the shutdown.
        """
        self._stopping = True
        stuck = await _cancel_until_done(self._tasks, timeout)
        for task in stuck:
            log.error("sampling task %s did not stop within %.1f s; leaving it behind", task.get_name(), timeout)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    async def sample_engines_once(self) -> None:
        """One sample of every engine, then publish: what each loop does per tick."""
        await asyncio.gather(*(e.sample_once() for e in self.engines))
        self.publish()

    def publish(self) -> None:
        """Swap in a new Snapshot built from each source's latest state (cheap: views are prebuilt)."""
        health = [e.state.view() for e in self.engines]
        if self.config.nvml:
            health.append(self._nvml_state.view())
        health += [s.view() for s in self._process_states.values()]
        self._snapshot = Snapshot(
            created=self.clock.time(),
            targets=tuple(e.view for e in self.engines),
            health=tuple(health),
            gpu=self._gpu,
            gpu_profiles=self._gpu_profiles(),
            processes=dict(self._processes),
        )

    async def _every(self, interval: float, step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` every `interval` seconds; a slow step delays the next one, never overlaps it."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self._stopping:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one source must not stop its loop, let alone the agent
                log.exception("sampling step failed")
            if _cancel_was_swallowed():
                if not self._stopping:
                    log.warning("sampling task %s was cancelled inside a step; it ends", _task_name())
                raise asyncio.CancelledError
            if self._stopping:
                return
            self.publish()
            due = max(due + interval, loop.time())
            await asyncio.sleep(due - loop.time())

    def _constants_for(self, target: TargetConfig, model: ModelSpec | None, engine_tp: float | None) -> TargetConstants:
        profile, source = self._profile_for(target)
        tp = self._tp_for(target, engine_tp)
        return TargetConstants(model=model, gpu=profile, gpu_source=source, tensor_parallel_size=tp)

    def _own_devices(self, target: TargetConfig) -> list[Any]:
        """The NVML devices serving this target: matched by process, else every GPU when it is the only target."""
        devices = list(self._gpu.devices) if self._gpu else []
        assignment = self._target_gpus.get(target.name)
        if assignment is not None and (assignment.source != "all_visible" or len(self.config.targets) == 1):
            return [d for d in devices if d.uuid in assignment.uuids]
        return devices if len(self.config.targets) == 1 else devices[:1]

    def _tp_for(self, target: TargetConfig, engine_tp: float | None) -> int:
        """--tp; else what the engine says (TRT-LLM metrics, SGLang /server_info); else the number of GPUs
        NVML shows the engine's own processes on; else 1."""
        if target.tp:
            return target.tp
        if engine_tp:
            return int(engine_tp)
        assignment = self._target_gpus.get(target.name)
        if assignment is not None and assignment.source == "nvml_pids" and assignment.uuids:
            return len(assignment.uuids)
        return 1

    def _profile_for(self, target: TargetConfig) -> tuple[GpuProfile, str]:
        if target.gpu:
            return get_profile(target.gpu), "flag"
        for device in self._own_devices(target):
            profile = profile_for_nvml_name(device.name, device.memory_total_bytes)
            if profile is not None:
                return profile, "nvml"
        if self.config.nvml and not self._nvml_state.sampled:
            return get_profile(DEFAULT_PROFILE_KEY), "default"  # NVML has not answered yet: no verdict
        if not self._warned_default_gpu:
            log.warning("no GPU detected and no --gpu given: using the %s profile's peaks", DEFAULT_PROFILE_KEY)
            self._warned_default_gpu = True
        return get_profile(DEFAULT_PROFILE_KEY), "default"

    def dram_utilization(self, target: TargetConfig, seconds: float) -> float | None:
        """Measured DRAM bandwidth utilization of the target's GPUs, time-averaged over the window."""
        means = []
        for device in self._own_devices(target):
            history = self._gpu_history.get(device.uuid)
            span = history.window(seconds) if history else None
            value = mean(*span, "dram") if span else None
            if value is not None:
                means.append(value)
        return sum(means) / len(means) if means else None

    def energy_watts(self, target: TargetConfig, seconds: float) -> float | None:
        """Mean power of the target's GPUs over the window, from NVML's energy counter; None unless every
        one of them reports it."""
        histories = [self._gpu_history.get(d.uuid) for d in self._own_devices(target)]
        if not histories or any(h is None for h in histories):
            return None
        return gpu_energy_watts(histories, seconds)  # type: ignore[arg-type]

    def _gpu_profiles(self) -> dict[int, str]:
        out = {}
        for device in self._gpu.devices if self._gpu else ():
            profile = profile_for_nvml_name(device.name, device.memory_total_bytes)
            out[device.index] = profile.key if profile else "unknown"
        return out

    async def sample_gpus_once(self, collector: Any) -> None:
        """One NVML sample through `collector`, then publish: what the NVML loop does per tick."""
        start = self.clock.monotonic()
        try:
            self._gpu = await collector.sample()
        except SourceError as exc:
            self._gpu = None
            self._nvml_state.fail(exc.reason, str(exc), self.clock.monotonic() - start)
        else:
            self._nvml_state.ok(self.clock.time(), self.clock.monotonic() - start)
            self._remember_gpus(self._gpu)
        self.publish()

    def _remember_gpus(self, sample: GpuSample) -> None:
        retention = max(self.config.windows.values()) + 2 * self.config.nvml_interval
        t = self.clock.monotonic()
        for device in sample.devices:
            history = self._gpu_history.setdefault(device.uuid, SeriesHistory(retention))
            history.append(t, {ENERGY: device.extra.get("energy_joules_total")},
                           {"dram": device.dram_bandwidth_utilization_ratio}, {})
        for uuid in set(self._gpu_history) - {d.uuid for d in sample.devices}:
            del self._gpu_history[uuid]

    async def _nvml_loop(self) -> None:
        from rooflight.collectors.nvml import NvmlCollector

        collector = self._nvml_collector = NvmlCollector(lib=self._nvml_lib, clock=self.clock.monotonic)
        try:
            await self._every(self.config.nvml_interval, lambda: self.sample_gpus_once(collector))
        finally:
            collector.close()

    def _gpu_pids(self) -> set[int]:
        processes = self._nvml_collector.processes if self._nvml_collector is not None else {}
        return {pid for procs in processes.values() for pid, _ in procs}

    def _assign_gpus(self, target: TargetConfig, tree_pids: tuple[int, ...]) -> None:
        if self._gpu is None or self._nvml_collector is None:
            return
        order = [d.uuid for d in self._gpu.devices]
        self._target_gpus[target.name] = assign_gpus(tree_pids, self._nvml_collector.processes, order)

    async def _process_loop(self, target: TargetConfig) -> None:
        from urllib.parse import urlsplit

        from rooflight.collectors.process import ProcessCollector

        pid = target.pid or self._process_pids.get(target.name)
        port = None if pid else urlsplit(target.url).port
        collector = ProcessCollector(pid=pid, port=port, gpu_pids_of=self._gpu_pids)
        state = self._process_states.setdefault(target.name, SourceState("process", target.name))

        async def step() -> None:
            start = self.clock.monotonic()
            try:
                self._processes[target.name] = await collector.sample()
            except SourceError as exc:
                self._processes.pop(target.name, None)
                state.fail(exc.reason, str(exc), self.clock.monotonic() - start)
                return
            state.ok(self.clock.time(), self.clock.monotonic() - start)
            self._assign_gpus(target, collector.tree_pids)

        await self._every(max(self.config.interval, 1.0), step)


def _cancel_was_swallowed() -> bool:
    """Whether this task was cancelled and a step returned instead of raising (Python 3.11+ counts the
    cancellations not yet delivered or undone; older Pythons rely on the stop flag alone)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return bool(cancelling is not None and cancelling())


def _task_name() -> str:
    task = asyncio.current_task()
    return task.get_name() if task is not None else "?"


async def _cancel_until_done(tasks: list[asyncio.Task[None]], timeout: float) -> list[asyncio.Task[None]]:
    """Cancel `tasks` (again every _RECANCEL_S, for one that swallowed it) until all end or `timeout`
    passes; returns those still running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(_RECANCEL_S, left))
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("sampling task %s ended with an error", task.get_name(), exc_info=task.exception())
    return sorted(pending, key=lambda t: t.get_name())
