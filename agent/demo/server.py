"""`rooflight demo`'s engine process: the simulator advanced in real time, served over HTTP like vLLM.

An asyncio task wakes every tick (~50 ms), converts elapsed wall time into simulated time
(x time_scale) and runs every engine step that fits, then refreshes the simulated GPU. It never
sleeps per step. Time comes from an injected clock (rooflight.agent.sampling.clock), so tests drive `tick()` with a
FakeClock and no wall time. Routes: /metrics (vLLM text format), /v1/models, /health, /version, and
/v1/completions (a 1-token answer: what the agent's canary asks). Faults (`--fault`, agent/demo/faults.py)
hang it, freeze its gauges, answer 503, close its port or lose its GPU on a schedule, each tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Awaitable, Callable

from aiohttp import web

from rooflight.agent.sampling.clock import Clock, SystemClock
from rooflight.agent.demo import exposition, scenarios
from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.engine import Simulator
from rooflight.agent.demo.faults import Fault, active, listening
from rooflight.agent.demo.gpu import apply_reading, gpu_reading, make_fake_nvml
from rooflight.agent.demo.plant import make_plant
from rooflight.agent.demo.state import History, mark, predicted_state
from rooflight.agent.errors import ConfigError

VLLM_VERSION = "0.33.0"
EVENTS = ("long-prompt", "kv-wall", "clear")


class DemoEngine:
    """The simulated vLLM engine and its simulated GPU."""

    def __init__(self, config: DemoConfig, clock: Clock | None = None, faults: tuple[Fault, ...] = ()) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.plant = make_plant(config.gpu, config.model, bandwidth_efficiency=config.bandwidth_efficiency,
                                prefill_mfu=config.prefill_mfu, block_size=config.block_size,
                                gpu_memory_utilization=config.gpu_memory_utilization)
        self.nvml = make_fake_nvml(self.plant)
        self.faults = faults
        self.url = ""
        self._born = self.clock.monotonic()  # the faults' schedule counts from here
        self._host, self._port = "127.0.0.1", 0
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._stuck_running: int | None = None  # the running count a mass abort left on the page
        self._stuck_done = False  # a completion request refreshed the gauges
        self._gpu_lost = False
        self._finished_before_5xx: float | None = None  # requests finished when a 5xx fault began
        self._new_process()

    def _new_process(self) -> None:
        """A fresh engine process: a new simulator, its counters from 0 (at start, and after each crash)."""
        self.sim = Simulator(self.config, self.plant, scenarios.workload_for(self.config.scenario))
        self.history = History()
        self._start_mono = self.clock.monotonic()
        self._created = self.clock.time()
        self.history.add(mark(self.sim))

    def since_start(self) -> float:
        """Wall seconds since the demo started (the faults' clock)."""
        return self.clock.monotonic() - self._born

    # -- time -------------------------------------------------------------------------------------
    def sim_time(self) -> float:
        """Simulated seconds corresponding to the clock's present."""
        return (self.clock.monotonic() - self._start_mono) * self.config.time_scale

    def tick(self) -> None:
        """Bring the simulation up to the clock's present and refresh the simulated GPU."""
        before = self.sim.now
        t = self.since_start()
        if active(self.faults, "stuck-gauges", t) and self._stuck_running is None:
            self._stuck_running = self.sim.abort_all()  # every client gives up; none comes after
        if active(self.faults, "hang", t):
            return  # no step, no token: what the page says stays as it was
        self.sim.advance_to(self.sim_time())
        self.history.add(mark(self.sim))
        gpu = self.nvml.gpus[0]
        gpu.run_for(self.sim.now - before)  # at the power of the last reading
        apply_reading(gpu, gpu_reading(self.plant, self.history, gpu.memory_total))

    async def _run(self) -> None:
        while True:
            self.tick()
            await self._apply_faults()
            await asyncio.sleep(self.config.tick_seconds)

    async def _apply_faults(self) -> None:
        """Close or reopen the engine's port as the schedule says; lose the GPU once its time comes."""
        t = self.since_start()
        if not self._gpu_lost and any(f.kind == "gpu-lost" and t >= f.start for f in self.faults):
            self._gpu_lost = True
            self.nvml.gpu_lost(0)
        up = listening(self.faults, t)
        if up and self._runner is None:
            self._new_process()
            await self._listen()
        elif not up and self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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
        stuck = self._stuck_running if not self._stuck_done else None
        return exposition.render(self.sim, self.config, self._created, running=stuck,
                                 server_errors=self._server_errors())

    def _server_errors(self) -> int:
        """The finished requests answered 5xx: the fault's share of those finished since it began."""
        finished = sum(self.sim.tally.request_success.values())
        share = next((f.share for f in self.faults if f.kind == "5xx" and f.start <= self.since_start()), 0.0)
        if not share:
            return 0
        if self._finished_before_5xx is None:
            self._finished_before_5xx = finished
        return int((finished - self._finished_before_5xx) * share)

    # -- HTTP -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._unavailable])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_post("/v1/completions", self._completions)
        return app

    @web.middleware
    async def _unavailable(self, request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Every route answers 503 while a `503` fault holds (the engine core dead behind its API server)."""
        if active(self.faults, "503", self.since_start()):
            return web.Response(status=503, text="engine is dead\n")
        return await handler(request)

    async def _completions(self, _request: web.Request) -> web.Response:
        """One token, as vLLM answers a completion request with max_tokens 1; never, while the engine hangs.
        It runs a step: gauges stuck after a mass abort are refreshed by it."""
        while active(self.faults, "hang", self.since_start()):
            await asyncio.sleep(self.config.tick_seconds)
        self.sim.add_arrivals([scenarios.Arrival(max(self.sim_time(), self.sim.now), 1, 1)])
        self._stuck_done = self._stuck_running is not None
        c = self.config
        return web.json_response({"object": "text_completion", "model": c.served_model_name,
                                  "choices": [{"index": 0, "text": "!", "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

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
        """Serve on host:port (0 = any free port) and start advancing the simulation (a fault scheduled at the
        start, a model load, keeps the port closed until it ends: the port is chosen now all the same)."""
        self._host, self._port = host, port or _free_port(host)
        self.url = f"http://{host}:{self._port}"
        if listening(self.faults, 0.0):
            await self._listen()
        self._task = asyncio.create_task(self._run())

    async def _listen(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def start_demo_engine(config: DemoConfig, host: str = "127.0.0.1", port: int = 0,
                            clock: Clock | None = None, faults: tuple[Fault, ...] = ()) -> DemoEngine:
    """Build the demo engine for `config` and start serving it (ConfigError for a bad scenario/model/GPU)."""
    engine = DemoEngine(config, clock, faults)
    await engine.start(host, port)
    return engine
