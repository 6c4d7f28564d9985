"""`rooflight demo`'s engine process: the simulator advanced in real time, served over HTTP like vLLM.

An asyncio task wakes every tick (~50 ms), converts elapsed wall time into simulated time
(x time_scale) and runs every engine step that fits, then refreshes the simulated GPU. It never
sleeps per step. Time comes from an injected clock (rooflight.agent.sampling.clock), so tests drive `tick()` with a
FakeClock and no wall time. Routes: /metrics (vLLM text format), /v1/models, /health, /version.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from rooflight.agent.sampling.clock import Clock, SystemClock
from rooflight.agent.demo import exposition, scenarios
from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.engine import Simulator
from rooflight.agent.demo.gpu import apply_reading, gpu_reading, make_fake_nvml
from rooflight.agent.demo.plant import make_plant
from rooflight.agent.demo.state import History, mark, predicted_state
from rooflight.agent.errors import ConfigError

VLLM_VERSION = "0.33.0"
EVENTS = ("long-prompt", "kv-wall", "clear")


class DemoEngine:
    """The simulated vLLM engine and its simulated GPU."""

    def __init__(self, config: DemoConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.plant = make_plant(config.gpu, config.model, bandwidth_efficiency=config.bandwidth_efficiency,
                                prefill_mfu=config.prefill_mfu, block_size=config.block_size,
                                gpu_memory_utilization=config.gpu_memory_utilization)
        self.sim = Simulator(config, self.plant, scenarios.workload_for(config.scenario))
        self.history = History()
        self.nvml = make_fake_nvml(self.plant)
        self.url = ""
        self._start_mono = self.clock.monotonic()
        self._created = self.clock.time()
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self.history.add(mark(self.sim))

    # -- time -------------------------------------------------------------------------------------
    def sim_time(self) -> float:
        """Simulated seconds corresponding to the clock's present."""
        return (self.clock.monotonic() - self._start_mono) * self.config.time_scale

    def tick(self) -> None:
        """Bring the simulation up to the clock's present and refresh the simulated GPU."""
        before = self.sim.now
        self.sim.advance_to(self.sim_time())
        self.history.add(mark(self.sim))
        gpu = self.nvml.gpus[0]
        gpu.run_for(self.sim.now - before)  # at the power of the last reading
        apply_reading(gpu, gpu_reading(self.plant, self.history, gpu.memory_total))

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.config.tick_seconds)

    # -- control ----------------------------------------------------------------------------------
    def inject(self, event: str) -> float:
        """Apply an event now; returns the clock's monotonic time at which it took effect.

        "long-prompt": one 8,000-token prompt arrives (prefilled whole unless chunked prefill is on);
        "kv-wall": a burst of 200 long-output requests arrives; "clear": every injected request is
        aborted. Arrivals join the simulation at the present simulated time.
        """
        self.tick()
        now = self.clock.monotonic()
        at = max(self.sim_time(), self.sim.now)
        if event == "long-prompt":
            self.sim.add_arrivals([scenarios.long_prompt(at, injected=True)])
        elif event == "kv-wall":
            self.sim.add_arrivals(scenarios.kv_wall_burst(at))
        elif event == "clear":
            self.sim.abort_injected()
        else:
            raise ConfigError(f"unknown demo event {event!r}; choose one of {', '.join(EVENTS)}")
        return now

    def state(self, window: float = 10.0) -> dict[str, Any]:
        """What docs/physics.md predicts for the current state (see rooflight.agent.demo.state)."""
        out = predicted_state(self.sim, self.history, window)
        out["scenario"] = self.config.scenario
        return out

    def metrics_text(self) -> str:
        return exposition.render(self.sim, self.config, self._created)

    # -- HTTP -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        return app

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics_text().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _models(self, _request: web.Request) -> web.Response:
        c = self.config
        return web.json_response({"object": "list", "data": [{
            "id": c.served_model_name, "object": "model", "created": int(self._created), "owned_by": "vllm",
            "root": c.model_root, "parent": None, "max_model_len": c.max_model_len,
            "permission": [],
        }]})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Serve on host:port (0 = any free port) and start advancing the simulation."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def start_demo_engine(config: DemoConfig, host: str = "127.0.0.1", port: int = 0,
                            clock: Clock | None = None) -> DemoEngine:
    """Build the demo engine for `config` and start serving it (ConfigError for a bad scenario/model/GPU)."""
    engine = DemoEngine(config, clock)
    await engine.start(host, port)
    return engine
