"""The agent's whole /metrics on every recorded engine page, as goldens: what a refactor of the sampling
and derivation must leave byte for byte the same (`/metrics` identical on the recorded pages).

Each page under tests/fixtures/engine-samples (recorded and synthetic) is served by a FakeEngine, read
by an auto-detecting agent on a FakeClock beside one fake H100 (NVML sampled between the engine's
samples, so the windows' measured DRAM bandwidth and power, and the headroom built on them, are in the
capture), then read again 10 s later after more of the same load (`grown`). A page no adapter reads is
captured too: its health is what the agent serves for it. One more capture drives a vLLM page through
sixteen samples a second apart whose load and queue change, so the detectors' state (tail baselines,
holds, the long windows' cadence) is in a golden as well.

The goldens under tests/golden/capture are written only by `python tests/regen_goldens.py`.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import FakeNvml, h100_like
from support import GOLDEN, SAMPLES, FakeEngine, check_golden, sample_text, started_agent
from test_engines_golden import grown

CAPTURE = GOLDEN / "capture"
SECONDS = 10.0  # between a page's two samples
PAGES = sorted(p.relative_to(SAMPLES).as_posix() for p in SAMPLES.rglob("*.prom"))


def _golden_name(page: str) -> str:
    return page.removesuffix(".prom").replace("/", "-") + ".prom"


def _settings(url: str, **flags: object) -> dict[str, object]:
    return {"engine_url": [url], "nvml": True, "process": False, "interval": "1s", "windows": "10s,1m",
            "model": "llama-3-8b", "metrics_path": "/metrics", **flags}


def _render(agent: Agent) -> str:
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    return text.replace(agent.config.targets[0].name, "ENGINE")  # the fake engine's port changes per run


async def _sample(agent: Agent, collector: NvmlCollector, nvml: FakeNvml, clock: FakeClock, engine: FakeEngine,
                  page: str, seconds: float) -> None:
    """`seconds` pass on the GPU and the clock, NVML is read, then the engine serving `page`."""
    clock.advance(seconds)
    for gpu in nvml.gpus:
        gpu.run_for(seconds)
    await agent.sample_gpus_once(collector)
    engine.body = page
    await agent.sample_engines_once()


@pytest.mark.parametrize("page", PAGES)
async def test_capture_recorded_page(fake_engine: FakeEngine, page: str) -> None:
    first = sample_text(page)
    clock, nvml = FakeClock(), h100_like()
    async with started_agent(build({}, {}, _settings(fake_engine.url)), loops=False, clock=clock,
                             nvml_lib=nvml) as agent:
        collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
        try:
            await _sample(agent, collector, nvml, clock, fake_engine, first, 1.0)
            await _sample(agent, collector, nvml, clock, fake_engine, grown(first), SECONDS)
            text = _render(agent)
        finally:
            collector.close()
    assert 'rooflight_source_up{source="nvml",target="node"} 1.0' in text
    check_golden(CAPTURE / _golden_name(page), text)


def _with_gauge(page: str, name: str, value: float) -> str:
    """`page` with every sample of the gauge `name` set to `value`."""
    out = []
    for line in page.splitlines():
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + f" {value!r}"
        out.append(line)
    return "\n".join(out) + "\n"


# (growth divisor, requests running, requests waiting) per one-second sample: steady load, a burst at the
# batch cap with a queue, a queue held while the batch sits at a quarter of its cap (admission-bound),
# then a quiet spell with nothing moving.
SEQUENCE = ([(10, 16.0, 0.0)] * 5 + [(2, 64.0, 12.0), (3, 64.0, 30.0), (2, 64.0, 30.0), (5, 40.0, 4.0)]
            + [(10, 16.0, 5.0)] * 7 + [(10**12, 16.0, 0.0)] * 4)
CAPTURED = (4, 7, 15, len(SEQUENCE) - 1)  # after these samples (from 0)


async def test_capture_vllm_sequence(fake_engine: FakeEngine) -> None:
    page = sample_text("vllm-cpu-load-c16.prom")
    clock, nvml = FakeClock(), h100_like()
    config = build({}, {}, _settings(fake_engine.url, windows="5s,30s", batch_max=64))
    async with started_agent(config, loops=False, clock=clock, nvml_lib=nvml) as agent:
        collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
        captures = []
        try:
            for i, (by, running, waiting) in enumerate(SEQUENCE):
                page = grown(page, by)
                served = _with_gauge(_with_gauge(page, "vllm:num_requests_running", running),
                                     "vllm:num_requests_waiting", waiting)
                await _sample(agent, collector, nvml, clock, fake_engine, served, 1.0)
                if i in CAPTURED:
                    captures.append(f"# after sample {i + 1} of {len(SEQUENCE)}\n" + _render(agent))
        finally:
            collector.close()
    print([("rooflight_mbu_ratio{" in text, len(text)) for text in captures]); print(captures[0][:3000])
    check_golden(CAPTURE / "vllm-sequence.prom", "".join(captures))


def test_every_recorded_page_is_captured() -> None:
    """A page added under engine-samples gets its golden by regenerating, never silently none."""
    assert len(PAGES) >= 20
    names = {_golden_name(p) for p in PAGES}
    assert len(names) == len(PAGES)
    stale = sorted(p.name for p in CAPTURE.glob("*.prom") if p.name not in names | {"vllm-sequence.prom"})
    assert not stale, f"goldens of pages no longer recorded: {stale}"
