"""The sampling loops: one asyncio task per engine target, one for NVML and one for every target's process
tree, each on its own interval, each writing its own part of the state and publishing a new frozen
Snapshot. Nothing here blocks the event loop: HTTP is async, NVML and psutil calls run in worker threads
(NVML's with timeouts).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable, Coroutine, Mapping

import aiohttp

from rooflight.agent import __version__
from rooflight.agent.sampling.clock import Clock, SystemClock
from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.config.urls import endpoint
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.sampling.canary import Canary, stalled_models
from rooflight.agent.sampling.engine_loop import EngineLoop
from rooflight.agent.sampling.gpu_assignment import TargetGpus, gpu_profiles
from rooflight.agent.sampling.health import SourceState
from rooflight.agent.roofline.models import ModelSpec
from rooflight.agent.metrics.history import Sparklines
from rooflight.agent.metrics.snapshot import EMPTY, Health, Snapshot
from rooflight.agent.signals.headroom import ENERGY
from rooflight.agent.signals.series import GPU_DRAM, NO_GPU, GpuMeasures
from rooflight.agent.signals.token_gaps import ClientGaps
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.errors import SourceError
from rooflight.collectors.nvml import GpuSource
from rooflight.collectors.process import NeedsSearch, ProcessCollector, ProcessSource
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
        self._health: dict[SourceState, Health] = {}  # each source's Health as last published (publish)
        self._stepped: dict[SourceState, None] = {}  # sources stepped since the last publish (_publish_soon)
        self._publish_due: asyncio.Handle | None = None
        self.sparklines = Sparklines()  # the status page's last five minutes, recorded as engines are sampled
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False  # set by stop(): every loop ends at its next step, even if a cancel was lost
        self._session: aiohttp.ClientSession | None = None
        self._nvml_state = SourceState("nvml", "node")
        self._process_states: dict[str, SourceState] = {}
        self._searches: dict[str, asyncio.Task[None]] = {}  # target -> the search for its process, while one runs
        self._processes: dict[str, ProcessSample] = {}
        self._drafts: dict[str, ModelSpec] = {}  # target -> its speculative-decoding draft model
        self._gpu_history: dict[str, SeriesHistory] = {}  # by UUID: measured DRAM bandwidth over time
        self._nvml_collector: GpuSource | None = None
        self.gpus = TargetGpus(config, lambda: self._nvml_state.sampled, self._dp_ranks)  # each target's GPUs, profile, TP
        self.engines: list[EngineLoop] = []
        self._engine_of: dict[str, EngineLoop] = {}  # by target name
        self._canaries: dict[EngineLoop, Canary] = {}  # with --canary: each engine's (agent/sampling/canary.py)
        self._client_gaps: dict[str, ClientGaps] = {}  # by target name: what a proxy in front of it saw

    def use_client_gaps(self, target: str, gaps: ClientGaps) -> None:
        """The client-side proxy relays `target`'s streams: its head-of-line detector judges by their gaps."""
        self._client_gaps[target] = gaps
        if target in self._engine_of:
            self._engine_of[target].client_gaps = gaps

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def start(self, *, loops: bool = True) -> None:
        """Open the HTTP session and, unless `loops` is False (tests, benchmarks), start every loop."""
        self._stopping = False
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            # One User-Agent whichever client reads (PageClient sends the session's headers): aiohttp's own is
            # added per request, so the engine pages would otherwise go without one.
            headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "User-Agent": f"rooflight/{__version__}"},
        )
        for target in self.config.targets:
            model, source = self._models.get(target.name, (None, None))
            loop = EngineLoop(
                target, self.config, self._session, self.clock, model, source, self._constants_for, self.gpu_measures,
                self._client_gaps.get(target.name),
            )
            self.engines.append(loop)
            self._engine_of[target.name] = loop
            if self.config.canary:  # its counts are the engine source's health (rooflight_engine_canary_requests_total)
                loop.state.canary = {}
                self._canaries[loop] = Canary(self._session, target.url, loop.series.thresholds.stall_seconds,
                                              loop.state.canary, self.clock.monotonic)
            if loops:
                self._spawn(self._every(self.config.interval, functools.partial(self._sample_engine, loop), loop.state),
                            f"engine:{target.name}")
        if not loops:
            self.publish()
            return
        if self.config.nvml:
            self._spawn(self._nvml_loop(), "nvml")
        if self.config.process and self.config.targets:
            self._spawn(self._process_loop(), "process")
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
        stuck = await _cancel_until_done([*self._tasks, *self._searches.values()], timeout)
        for task in stuck:
            log.error("sampling task %s did not stop within %.1f s; leaving it behind", task.get_name(), timeout)
        self._tasks.clear()
        for engine in self.engines:
            engine.close()
        for canary in self._canaries.values():
            canary.close()
        if self._session is not None:
            await self._session.close()

    async def sample_engines_once(self) -> None:
        """One sample of every engine, then publish: what each loop does per tick."""
        await asyncio.gather(*(self._sample_engine(e) for e in self.engines))
        self.publish()

    async def _sample_engine(self, loop: EngineLoop) -> None:
        """One sample of an engine; then, with --canary, a canary where that sample's detectors call it stalled."""
        await loop.sample_once()
        canary = self._canaries.get(loop)
        if canary is not None and loop.state.up:
            canary.consider(stalled_models(loop.view))

    def publish(self, *stepped: SourceState) -> None:
        """Swap in a new Snapshot built from each source's latest state (cheap: views are prebuilt).

        `stepped`: the sources a loop's step just sampled; only their health is read again, the others'
        is as last published (only a source's own loop changes its state). Without it, every source's is
        read again. Each loop publishes after each step: 64 targets with an engine and a process source
        each would otherwise read 129 states 128 times a second (measured: the publish was 28% of the
        agent's CPU at 64 targets x 1 Hz, bench/bench_process_cpu.py --profile 64x1)."""
        cache = self._health
        if not stepped:
            cache.clear()
        for state in stepped:
            cache[state] = state.view()
        sources = [e.state for e in self.engines]
        if self.config.nvml and not self._nvml_state.absent:  # absent: no NVML here, no GPU to be down
            sources.append(self._nvml_state)
        sources += self._process_states.values()
        health = [cache[s] if s in cache else cache.setdefault(s, s.view()) for s in sources]
        self._record_sparklines(stepped)
        target_gpus = {t.name: a for t in self.config.targets if (a := self.gpus.gpus_of(t)) is not None}
        exported = self.gpus.exported(target_gpus)
        profiles, notes = gpu_profiles(exported)
        self._snapshot = Snapshot(
            created=self.clock.time(),
            targets=tuple(e.view for e in self.engines),
            health=tuple(health),
            gpu=exported,
            gpu_profiles=profiles,
            gpu_notes=notes,
            target_gpus=target_gpus,
            processes=dict(self._processes),
        )

    def _record_sparklines(self, stepped: tuple[SourceState, ...]) -> None:
        """Each engine just sampled (every engine, without `stepped`) adds its series' numbers to the sparklines,
        at its last successful sample's time."""
        wanted = set(stepped)
        engines = [e for e in self.engines if not wanted or e.state in wanted]
        if engines:
            count = sum(len(e.view.series) for e in self.engines)
            for e in engines:
                self.sparklines.record(e.view, self._health[e.state].last_success, count)

    def _publish_soon(self, *stepped: SourceState) -> None:
        """Publish once, at the next turn of the event loop, for every loop whose step ended in this one.

        64 targets on one interval end their steps together, their pages arriving in one poll of the sockets:
        a publish per step built 64 snapshots of 64 targets a second, where one does (a publish reads every
        source and target: O(targets) each). The snapshot trails the step by one turn of the loop, no timer."""
        self._stepped.update(dict.fromkeys(stepped))
        if self._publish_due is None:
            self._publish_due = asyncio.get_running_loop().call_soon(self._publish_stepped)

    def _publish_stepped(self) -> None:
        self._publish_due = None
        stepped, self._stepped = tuple(self._stepped), {}
        self.publish(*stepped)

    async def _every(self, interval: float, step: Callable[[], Awaitable[None]], *sources: SourceState) -> None:
        """Run `step` every `interval` seconds, publishing after each with `sources`' health read again; a
        slow step delays the next one, never overlaps it."""
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
            self._publish_soon(*sources)
            due = max(due + interval, loop.time())
            await asyncio.sleep(due - loop.time())

    def _constants_for(self, target: TargetConfig, model: ModelSpec | None, engine_tp: float | None,
                       kv_pool_grouped: bool = False) -> TargetConstants:
        profile, source, note = self.gpus.profile_for(target)
        tp = self.gpus.tp_for(target, engine_tp)
        return TargetConstants(model=model, gpu=profile, gpu_source=source, tensor_parallel_size=tp, gpu_note=note,
                               expert_parallel_size=target.ep or 1, draft=self._draft_for(target),
                               kv_pool_grouped=kv_pool_grouped)

    def _draft_for(self, target: TargetConfig) -> ModelSpec | None:
        """The target's draft model, read once (checked at start by the CLI: a bad one exits 2)."""
        if not (target.draft_model or target.draft_model_config):
            return None
        if target.name not in self._drafts:
            from rooflight.agent.model_files import resolve_model

            self._drafts[target.name] = resolve_model(target.draft_model, target.draft_model_config, None, None)
        return self._drafts[target.name]

    def gpu_measures(self, target: TargetConfig) -> GpuMeasures:
        """The histories of the target's GPUs as NVML measured them (the derive step reads its windows'
        DRAM bandwidth and power from them); NO_GPU while NVML shows none."""
        devices = self.gpus.own_devices(target)
        if not devices:
            return NO_GPU
        return GpuMeasures(tuple(self._gpu_history.get(d.uuid) for d in devices))

    async def sample_gpus_once(self, collector: GpuSource) -> None:
        """One NVML sample through `collector`, then publish: what the NVML loop does per tick. The
        collector's process lists are the ones each target's GPUs are matched against."""
        await self._sample_gpus(collector)
        self.publish()

    async def _sample_gpus(self, collector: GpuSource) -> None:
        """One NVML sample, unpublished: the NVML loop's `_every` publishes after each step."""
        if self._nvml_collector is None:
            self._nvml_collector = collector
        start = self.clock.monotonic()
        try:
            self.gpus.sample = await collector.sample()
        except SourceError as exc:
            self.gpus.sample = None
            self._nvml_state.fail(exc.reason, str(exc), self.clock.monotonic() - start)
            self._nvml_state.absent = bool(getattr(collector, "absent", False))
        else:
            self._nvml_state.ok(self.clock.time(), self.clock.monotonic() - start)
            self._nvml_state.absent = False
            self._remember_gpus(self.gpus.sample)

    def _remember_gpus(self, sample: GpuSample) -> None:
        retention = max(self.config.windows.values()) + 2 * self.config.nvml_interval
        t = self.clock.monotonic()
        for device in sample.devices:
            history = self._gpu_history.setdefault(device.uuid, SeriesHistory(retention))
            history.append(t, {ENERGY: device.extra.get("energy_joules_total")},
                           {GPU_DRAM: device.dram_bandwidth_utilization_ratio}, {})
        for uuid in set(self._gpu_history) - {d.uuid for d in sample.devices}:
            del self._gpu_history[uuid]

    async def _nvml_loop(self) -> None:
        from rooflight.collectors.nvml import NvmlCollector

        collector = self._nvml_collector = NvmlCollector(lib=self._nvml_lib, clock=self.clock.monotonic)
        try:
            await self._every(self.config.nvml_interval, lambda: self._sample_gpus(collector), self._nvml_state)
        finally:
            collector.close()

    def _gpu_pids(self) -> set[int]:
        processes = self._nvml_collector.processes if self._nvml_collector is not None else {}
        return {pid for procs in processes.values() for pid, _ in procs}

    def _dp_ranks(self, target: str) -> int:
        """Data-parallel ranks on the target's latest page: each is a model copy on GPUs of its own."""
        loop = self._engine_of.get(target)
        latest = loop.latest if loop is not None else None
        return max(1, len({s.rank for s in latest.series})) if latest is not None else 1

    async def _process_loop(self) -> None:
        """Every target's process tree in one loop: one hop to a worker thread and one publish a tick,
        however many targets. A loop per target took a thread hop, a timer and a publish each (measured:
        a fifth of the agent's CPU at 64 targets x 1 Hz, bench/bench_process_cpu.py --profile 64x1). A
        target whose process must be looked for by its port is searched for in a thread of its own, off
        the tick (_search): that search reads every process's sockets, seconds on a busy node, and must
        not hold up the other targets' reads. A read that never returned (a /proc read stuck in the kernel,
        not seen in practice) would stop every target's process source: their last-success gauges would
        then age together, where each target's would have stopped alone with a loop each."""
        collectors: dict[str, ProcessCollector] = {}
        for target in self.config.targets:
            pid = target.pid or self._process_pids.get(target.name)
            port = None if pid else endpoint(target.url)[1]  # http://engine is port 80
            collectors[target.name] = ProcessCollector(pid=pid, port=port, gpu_pids_of=self._gpu_pids)
        states = [self._process_state(t) for t in self.config.targets]
        await self._every(max(self.config.interval, 1.0), lambda: self._sample_processes(collectors), *states)

    def _process_state(self, target: TargetConfig) -> SourceState:
        return self._process_states.setdefault(target.name, SourceState("process", target.name))

    async def sample_process_once(self, target: TargetConfig, collector: ProcessSource) -> None:
        """One sample of the target's process tree through `collector`, its GPUs matched against NVML's
        processes, then publish: what the process loop does per tick."""
        start = self.clock.monotonic()
        try:
            sample: ProcessSample | SourceError = await collector.sample()
        except SourceError as exc:
            sample = exc
        self._processes_read(target, collector, sample, self.clock.monotonic() - start)
        self.publish()

    async def _sample_processes(self, collectors: dict[str, ProcessCollector]) -> None:
        """Every target's tree whose process is known, read in one worker thread, each target's failure its
        own; a search started for each of the others (none twice at once)."""
        quick = {name: c for name, c in collectors.items() if name not in self._searches}
        read = await asyncio.to_thread(_read_trees, quick, self.clock.monotonic, False)
        for target in self.config.targets:
            if target.name not in read:
                continue
            collector, (sample, seconds) = collectors[target.name], read[target.name]
            if isinstance(sample, NeedsSearch):
                self._searches[target.name] = asyncio.create_task(
                    self._search(target, collector), name=f"rooflight-process-search:{target.name}")
                continue
            self._processes_read(target, collector, sample, seconds)

    async def _search(self, target: TargetConfig, collector: ProcessCollector) -> None:
        """Look for the target's process by its port and read its tree, then publish that source alone."""
        try:
            read = await asyncio.to_thread(_read_trees, {target.name: collector}, self.clock.monotonic, True)
        finally:
            self._searches.pop(target.name, None)
        if self._stopping:
            return
        sample, seconds = read[target.name]
        if not isinstance(sample, NeedsSearch):  # never with a search: for the type checker
            self._processes_read(target, collector, sample, seconds)
        self.publish(self._process_state(target))

    def _processes_read(self, target: TargetConfig, collector: ProcessSource,
                        sample: ProcessSample | SourceError, seconds: float) -> None:
        state = self._process_state(target)
        if isinstance(sample, SourceError):
            self._processes.pop(target.name, None)
            state.fail(sample.reason, str(sample), seconds)
            return
        self._processes[target.name] = sample
        state.ok(self.clock.time(), seconds)
        if self._nvml_collector is not None:
            self.gpus.assign(target, collector.tree_pids, self._nvml_collector.processes)


Read = tuple[ProcessSample | SourceError | NeedsSearch, float]  # a tree's sample, or why not; the seconds it took


def _read_trees(collectors: Mapping[str, ProcessCollector], monotonic: Callable[[], float],
                search: bool) -> dict[str, Read]:
    """Each collector's sample, or the SourceError it raised (NeedsSearch, without `search`), and the seconds
    it took (in a worker thread). A bug meeting one tree's odd state fails that target's source alone."""
    out: dict[str, Read] = {}
    for name, collector in collectors.items():
        start = monotonic()
        try:
            sample: ProcessSample | SourceError | NeedsSearch = collector.read(search=search)
        except (SourceError, NeedsSearch) as exc:
            sample = exc
        except Exception as exc:
            log.exception("reading the process tree of target %s failed", name)
            sample = SourceError("other", f"reading the process tree failed: {type(exc).__name__}")
        out[name] = (sample, monotonic() - start)
    return out


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
