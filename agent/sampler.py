"""The sampling loops: one asyncio task per source, each on its own interval, each writing its own part
of the state and publishing a new frozen Snapshot. Nothing here blocks the event loop: HTTP is async,
NVML and psutil calls run in executors inside their collectors, with timeouts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import aiohttp

from agent.clock import Clock, SystemClock
from agent.config import AgentConfig, TargetConfig
from agent.constants import TargetConstants
from agent.engine_loop import EngineLoop, SourceState
from agent.gpus import DEFAULT_PROFILE_KEY, GpuProfile, get_profile, profile_for_nvml_name
from agent.models import ModelSpec
from agent.snapshot import EMPTY, Snapshot
from collectors.errors import SourceError
from collectors.samples import GpuSample, ProcessSample

log = logging.getLogger("rooflight")


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
        self._session: aiohttp.ClientSession | None = None
        self._gpu: GpuSample | None = None
        self._nvml_state = SourceState("nvml", "node")
        self._process_states: dict[str, SourceState] = {}
        self._processes: dict[str, ProcessSample] = {}
        self._warned_default_gpu = False
        self.engines: list[EngineLoop] = []

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def start(self, *, loops: bool = True) -> None:
        """Open the HTTP session and, unless `loops` is False (tests, benchmarks), start every loop."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"},
        )
        for target in self.config.targets:
            model, source = self._models.get(target.name, (None, None))
            loop = EngineLoop(target, self.config, self._session, self.clock, model, source, self._constants_for)
            self.engines.append(loop)
            if loops:
                self._tasks.append(asyncio.create_task(self._every(self.config.interval, loop.sample_once)))
        if not loops:
            self.publish()
            return
        if self.config.nvml:
            self._tasks.append(asyncio.create_task(self._nvml_loop()))
        if self.config.process:
            for target in self.config.targets:
                self._tasks.append(asyncio.create_task(self._process_loop(target)))
        self.publish()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one source must not stop its loop, let alone the agent
                log.exception("sampling step failed")
            self.publish()
            due = max(due + interval, loop.time())
            await asyncio.sleep(due - loop.time())

    def _constants_for(self, target: TargetConfig, model: ModelSpec | None) -> TargetConstants:
        profile, source = self._profile_for(target)
        return TargetConstants(model=model, gpu=profile, gpu_source=source, tensor_parallel_size=target.tp or 1)

    def _profile_for(self, target: TargetConfig) -> tuple[GpuProfile, str]:
        if target.gpu:
            return get_profile(target.gpu), "flag"
        for device in self._gpu.devices if self._gpu else ():
            profile = profile_for_nvml_name(device.name, device.memory_total_bytes)
            if profile is not None:
                return profile, "nvml"
        if not self._warned_default_gpu:
            log.warning("no GPU detected and no --gpu given: using the %s profile's peaks", DEFAULT_PROFILE_KEY)
            self._warned_default_gpu = True
        return get_profile(DEFAULT_PROFILE_KEY), "default"

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
        self.publish()

    async def _nvml_loop(self) -> None:
        from collectors.nvml import NvmlCollector

        collector = NvmlCollector(lib=self._nvml_lib, clock=self.clock.monotonic)
        try:
            await self._every(self.config.nvml_interval, lambda: self.sample_gpus_once(collector))
        finally:
            collector.close()

    async def _process_loop(self, target: TargetConfig) -> None:
        from urllib.parse import urlsplit

        from collectors.process import ProcessCollector

        pid = target.pid or self._process_pids.get(target.name)
        port = None if pid else urlsplit(target.url).port
        collector = ProcessCollector(pid=pid, port=port)
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

        await self._every(max(self.config.interval, 1.0), step)
