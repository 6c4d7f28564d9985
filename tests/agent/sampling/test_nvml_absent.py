"""A source that keeps failing is down, or absent where its hardware is not there; never starting. Next to an
engine on a machine without NVML's library (no NVIDIA driver: a CPU node), the agent exports no nvml source at
all, so RooflightGPUDown has nothing to page on; a driver that will not load on a GPU node is down."""

from __future__ import annotations

import pynvml
import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.clock import FakeClock
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import FakeNvml
from support import FakeEngine, exported, sample_text, started_agent


def _nvml_health(metrics: dict) -> dict[str, float]:
    return {name: value for (name, labels), value in metrics.items()
            if name.startswith("rooflight_source_") and dict(labels).get("source") == "nvml"
            and name in ("rooflight_source_up", "rooflight_source_starting")}


@pytest.mark.parametrize(("code", "want"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, {}),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, {"rooflight_source_up": 0.0, "rooflight_source_starting": 0.0}),
])
async def test_nvml_that_keeps_failing_is_absent_or_down_never_starting(code: int, want: dict[str, float]) -> None:
    engine = FakeEngine(body=sample_text("vllm-cpu-rest-fresh.prom"))
    await engine.start()
    fake = FakeNvml([], init_error=code)
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "interval": "0.5", "windows": "5s",
                            "model": "llama-3-8b"})
    clock = FakeClock()
    try:
        async with started_agent(config, loops=False, clock=clock, nvml_lib=fake) as agent:
            collector = NvmlCollector(lib=fake, clock=clock.monotonic, init_retry_s=0.5)
            try:
                for _ in range(43):  # the number of failures the status page once called "starting" after
                    clock.advance(1.0)
                    await agent.sample_engines_once()
                    await agent.sample_gpus_once(collector)
                assert _nvml_health(exported(agent)) == want
            finally:
                collector.close()
    finally:
        await engine.stop()
