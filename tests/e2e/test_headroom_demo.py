"""Headroom and capacity on the demo, over real HTTP with one fake clock: each scenario drives the wall it is
about to 0 and leaves the others standing, and the predicted capacity matches what the saturated engine does."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator

import pytest
from prometheus_client import generate_latest

from rooflight.agent.demo import DemoConfig, DemoEngine
from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import SeriesView, TargetView
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.signals.headroom import SignalSettings, WindowSignals, series_signals
from support import started_agent


@pytest.fixture
async def demo() -> AsyncIterator:
    """run(scenario, seconds, **flags) -> the agent's TargetView after that long; engines stopped after."""
    engines: list[DemoEngine] = []
    agents: list = []

    async def run(scenario: str, seconds: float, **flags: object) -> tuple[TargetView, Agent]:
        clock = FakeClock()
        engine = DemoEngine(DemoConfig(scenario=scenario, seed=3), clock=clock)
        await engine.start()
        engines.append(engine)
        settings = {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "0.5",
                    "windows": "10s,1m", "gpu": "h100-sxm", **flags}
        context = started_agent(build({}, {}, settings), loops=False, clock=clock)
        agent = await context.__aenter__()
        agents.append(context)
        t = 0.0
        while t < seconds:
            clock.advance(0.5)
            t += 0.5
            engine.tick()
            await agent.sample_engines_once()
        (target,) = agent.snapshot.targets
        return target, agent

    yield run
    for context in agents:
        await context.__aexit__(None, None, None)
    for engine in engines:
        await engine.stop()


def _short(target: TargetView) -> tuple[SeriesView, WindowSignals]:
    (view,) = target.series
    return view, view.signals[0]


async def test_kv_wall_drives_kv_headroom_to_zero(demo) -> None:
    target, agent = await demo("kv-wall", 90.0)
    view, s = _short(target)
    assert view.windows[0].preemptions_per_second > 0
    assert s.headroom["kv"] == 0.0
    assert (s.saturation, s.binding) == (1.0, "kv")
    # at the KV wall the batch is as full as it gets: decode (with the re-prefills) fills the GPU's seconds
    assert s.headroom["decode_bandwidth"] < 0.1 and s.headroom["prefill_compute"] < 0.1
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    assert f'{n.HEADROOM}{{engine="vllm",model="llama-3-8b",rank="0",resource="kv",target="{target.name}",window="10s"}} 0.0' in text
    assert f'{n.SATURATION_BINDING}{{engine="vllm",model="llama-3-8b",rank="0",resource="kv",role="both",target="{target.name}",window="10s"}} 1.0' in text


async def test_queue_drives_batch_headroom_to_zero_with_kv_to_spare(demo) -> None:
    target, _ = await demo("queue", 40.0, batch_max=16)
    view, s = _short(target)
    assert view.series.running == 16
    assert s.headroom["batch"] == pytest.approx(0.0, abs=0.02)
    assert s.headroom["kv"] > 0.3
    assert s.binding == "batch" and s.saturation == pytest.approx(1.0, abs=0.02)
    # The queue behind the cap: the demand counts it past 1, saturation x (running + waiting) / running
    w = view.windows[0]
    assert w.mean_running and w.mean_waiting and w.mean_waiting > 1
    assert s.demand == pytest.approx(s.saturation * (w.mean_running + w.mean_waiting) / w.mean_running)
    assert s.demand > 2 and s.saturation <= 1.0  # 14 req/s offered to a cap of 16: ~180 wait, demand ~12


async def test_steady_stays_comfortably_away_from_every_wall(demo) -> None:
    target, _ = await demo("steady", 60.0, batch_max=256)
    view = target.series[0]
    for s in view.signals:
        assert set(s.headroom) == {"kv", "batch", "decode_bandwidth", "prefill_compute"}
        assert min(s.headroom.values()) > 0.5, s
        assert s.saturation is not None and s.saturation < 0.5
        assert s.capacity is not None and s.capacity.requests_per_second > 2 * view.windows[0].requests_per_second


async def test_predicted_capacity_is_what_the_saturated_engine_does(demo) -> None:
    # The queue scenario offers 14 req/s to a batch capped at 16: the engine runs flat out at the cap, so
    # the request rate it serves is its capacity. Predicted at the demo's own efficiencies (its decode
    # streams at 80% of the bandwidth peak, its prefill at 50% MFU), the two agree.
    target, _ = await demo("queue", 60.0, batch_max=16)
    view = target.series[0]
    w = view.windows[-1]  # 1m: the steadiest
    demo_efficiency = SignalSettings(decode_mbu=0.8, prefill_mfu=0.5)
    s = series_signals([w], target.constants, view.batch_max, view.series.kv_capacity_tokens, demo_efficiency)[0]
    assert s.capacity is not None and (s.capacity.wall, s.capacity.batch) == ("batch", 16)
    assert s.capacity.requests_per_second == pytest.approx(w.requests_per_second, rel=0.03)
    assert s.capacity.decode_tokens_per_second == pytest.approx(w.tokens_per_second["decode"], rel=0.03)
    # the exported default (a healthy 70% MBU) is the conservative side of it
    default = view.signals[-1].capacity
    assert default is not None and default.requests_per_second < s.capacity.requests_per_second



async def test_capacity_at_the_kv_wall_reads_the_fresh_request_mix(demo) -> None:
    # kv-wall: prompts of mean 1,500 and outputs of mean 3,500 at 6 req/s pin the cache; sequences are
    # preempted and re-prefilled. Over the 1 m window after 120 s, prefill tokens / first tokens read ~8,700
    # prompt and ~4,400 output tokens a request (re-prefills counted again, and first tokens lag the long
    # requests still decoding), so the capacity at that mix read 0.76 req/s while the engine finished ~1.45.
    # At the finished requests' means the capacity, at the demo's own efficiencies, is within 25% of the
    # rate the engine finishes requests at (it is run flat out at its KV wall, re-prefills and all).
    target, _ = await demo("kv-wall", 120.0)
    view = target.series[0]
    w = view.windows[-1]  # 1m
    assert w.preemptions_per_second > 0 and w.finished_requests_per_second
    assert w.finished_mean_prompt_tokens == pytest.approx(1500, rel=0.25)
    assert w.finished_mean_output_tokens == pytest.approx(3500, rel=0.25)
    demo_efficiency = SignalSettings(decode_mbu=0.8, prefill_mfu=0.5)
    fresh = series_signals([w], target.constants, view.batch_max, view.series.kv_capacity_tokens, demo_efficiency)[0]
    assert fresh.capacity is not None
    assert fresh.capacity.requests_per_second == pytest.approx(w.finished_requests_per_second, rel=0.25)
    # the token mix the capacity read before: far below what the engine does
    token_mix = replace(w, finished_mean_prompt_tokens=None, finished_mean_output_tokens=None)
    old = series_signals([token_mix], target.constants, view.batch_max, view.series.kv_capacity_tokens,
                         demo_efficiency)[0]
    assert old.capacity is not None and old.capacity.requests_per_second < 0.6 * w.finished_requests_per_second
