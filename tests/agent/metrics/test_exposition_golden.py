"""Golden exposition: what the agent serves for recorded engine output and fake GPUs, byte for byte.

Regenerate after an intended change with `python tests/regen_goldens.py` and read the diff. Every golden
file must also pass `promtool check metrics` (Debian's prometheus package; CI installs it).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest
from prometheus_client import generate_latest

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.signals.headroom import SignalSettings
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors.nvml_fake import a100_like, h100_like
from support import GOLDEN, FakeEngine, check_golden, promtool_clean, sample_text, started_agent, with_energy


@asynccontextmanager
async def _two_samples(engine: FakeEngine, clock: FakeClock, nvml: object = None,
                       **flags: object) -> AsyncIterator[Agent]:
    """An agent that sampled the two recorded pages 10 s apart; stopped on the way out."""
    settings = {"engine_url": [engine.url], "nvml": nvml is not None, "process": False, "interval": "1s",
                "windows": "10s,1m", "model": "llama-3-8b", **flags}
    async with started_agent(build({}, {}, settings), loops=False, clock=clock, nvml_lib=nvml) as agent:
        engine.body = sample_text("vllm-cpu-rest-fresh.prom")
        await agent.sample_engines_once()
        clock.advance(10.0)
        engine.body = sample_text("vllm-cpu-load-c16.prom")
        await agent.sample_engines_once()
        yield agent


def _render(agent: Agent) -> str:
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    port = agent.config.targets[0].name
    return text.replace(port, "ENGINE")  # the fake engine's port changes per run


async def test_golden_vllm_two_samples(fake_engine: FakeEngine) -> None:
    async with _two_samples(fake_engine, FakeClock(), gpu="h100-sxm") as agent:
        text = _render(agent)
    promtool_clean(text)
    check_golden(GOLDEN / "vllm-two-samples.prom", text)


async def test_golden_engine_down(fake_engine: FakeEngine) -> None:
    clock = FakeClock()
    async with _two_samples(fake_engine, clock, gpu="h100-sxm", scrape_timeout="1s") as agent:
        fake_engine.status = 503
        clock.advance(10.0)  # past staleness: the engine's numbers go, its health stays
        await agent.sample_engines_once()
        text = _render(agent)
    promtool_clean(text)
    check_golden(GOLDEN / "vllm-engine-down.prom", text)
    assert "rooflight_requests_running" not in text


@pytest.mark.parametrize(("name", "make"), [("gpu-h100-gpm.prom", h100_like), ("gpu-a100-no-gpm.prom", a100_like)])
async def test_golden_gpus(fake_engine: FakeEngine, name: str, make: object) -> None:
    from rooflight.collectors.nvml import NvmlCollector

    clock = FakeClock()
    nvml = make()  # type: ignore[operator]
    nvml.gpus[0].xid_events.append(13)  # an XID (graphics engine exception) shows as a counter and last code
    async with _two_samples(fake_engine, clock) as agent:
        collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
        try:
            await agent.sample_gpus_once(collector)
            clock.advance(1.0)
            await agent.sample_gpus_once(collector)  # GPM needs two samples more than 100 ms apart
            text = _render(agent)
        finally:
            collector.close()
    promtool_clean(text)
    check_golden(GOLDEN / name, text)


SPEC = (
    '# TYPE vllm:spec_decode_num_draft_tokens_total counter\n'
    'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny-llama"}} {draft}\n'
    '# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n'
    'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny-llama"}} {accepted}\n'
)


async def test_golden_vllm_spec_decode_acceptance(fake_engine: FakeEngine) -> None:
    clock = FakeClock()
    config = build({}, {}, {"engine_url": [fake_engine.url], "nvml": False, "process": False, "interval": "1s",
                            "windows": "10s", "model": "llama-3-8b", "gpu": "h100-sxm"})
    async with started_agent(config, loops=False, clock=clock) as agent:
        page = sample_text("vllm-cpu-load-c16.prom")
        fake_engine.body = page + SPEC.format(draft=400, accepted=100)
        await agent.sample_engines_once()
        clock.advance(10.0)
        fake_engine.body = page + SPEC.format(draft=1400, accepted=800)  # 700 of 1,000 proposed accepted
        await agent.sample_engines_once()
        (window,) = agent.snapshot.targets[0].series[0].windows
        assert window.spec_decode_acceptance == 0.7
        text = _render(agent)
    promtool_clean(text)
    check_golden(GOLDEN / "vllm-spec-decode.prom", text)


async def test_golden_vllm_capacity_signals(fake_engine: FakeEngine) -> None:
    """The recorded pages with what a target's config adds: a role, SLOs, a GPU price; and its GPUs' mean
    power over each window (550 W). The sampler passes these once wired; here they are set on the view,
    and its signals derived again from them as the derive step does (signals/series.py)."""
    from dataclasses import replace

    from rooflight.agent.signals.series import with_signals

    async with _two_samples(fake_engine, FakeClock(), gpu="h100-sxm", tp=2) as agent:
        (target,) = agent.snapshot.targets
        settings = SignalSettings(role="decode", ttft_slo=0.5, itl_slo=0.05, gpu_hour_cost=2.5)
        series = tuple(with_signals(replace(v, windows=with_energy(v.windows, lambda seconds: 550.0)),
                                    target.constants, settings) for v in target.series)
        target = replace(target, series=series, signal_settings=settings)
        (window,) = [s for s in target.series[0].signals if s.window == "10s"]
        decode = target.series[0].windows[0].tokens_per_second["decode"]
        share = window.gpu_time_share["decode"]  # the decode phase's share of the GPU time
        assert 0 < share < 1 and sum(window.gpu_time_share.values()) == pytest.approx(1.0)
        assert window.cost_per_million_tokens["decode"] == pytest.approx(2.5 * 2 * share / (decode * 3600 / 1e6))  # TP 2
        prefill = target.series[0].windows[0].tokens_per_second["prefill"]
        assert window.blended_cost_per_million_tokens == pytest.approx(2.5 * 2 / ((decode + prefill) * 3600 / 1e6))
        assert window.tokens_per_joule["decode"] == pytest.approx(decode / (550.0 * share))
        assert window.role == "decode" and "ttft_slo" in window.headroom and "itl_slo" in window.headroom
        snapshot = replace(agent.snapshot, targets=(target,))
        text = generate_latest(registry_for(lambda: snapshot)).decode().replace(target.name, "ENGINE")
    promtool_clean(text)
    check_golden(GOLDEN / "vllm-capacity-signals.prom", text)
