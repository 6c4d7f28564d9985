"""A hostile or broken engine cannot grow the agent, crash its derivations, or vanish a target silently.

Without bounds, a histogram whose bucket layout moves a little on every page (30,000 `le`
values shifted by 1e-9 per scrape) grew the agent by 1.37 MB/s; `num_gpu_blocks="1e308"` made every
sampling step raise ZeroDivisionError and the target's series vanish with `rooflight_source_up` still 1.
"""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from rooflight.agent.roofline import physics, step
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.sampling.target_series import DERIVATION_FAILED
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.signals import derive
from rooflight.collectors.common import INFO_OUT_OF_RANGE
from rooflight.collectors.expfmt import HISTOGRAM_TOO_MANY_BUCKETS, MAX_HISTOGRAM_BUCKETS
from support import FakeEngine, Metrics, Rig, scripted_agent, started_agent

INTERVAL = 0.5
L = 'model_name="m",engine="0"'
TTFT = "vllm:time_to_first_token_seconds"


def _page(k: int, *, buckets: int = 20, shift: bool = False, cache_config: str = "") -> str:
    """A small vLLM page at scrape k; with `shift` the TTFT bucket bounds move by k x 1e-9."""
    off = k * 1e-9 if shift else 0.0
    lines = [
        f"vllm:num_requests_running{{{L}}} 1", f"vllm:num_requests_waiting{{{L}}} 0",
        f"vllm:kv_cache_usage_perc{{{L}}} 0.5", f"vllm:generation_tokens_total{{{L}}} {k * 10}",
        f"vllm:prompt_tokens_total{{{L}}} {k * 10}", f"# TYPE {TTFT} histogram",
        *(f'{TTFT}_bucket{{{L},le="{(i + 1) * 0.001 + off:.12g}"}} {k + i}' for i in range(buckets)),
        f'{TTFT}_bucket{{{L},le="+Inf"}} {k + buckets}', f"{TTFT}_count{{{L}}} {k + buckets}", f"{TTFT}_sum{{{L}}} {k}",
    ]
    if cache_config:
        lines.append(f"vllm:cache_config_info{{{L},{cache_config}}} 1")
    return "\n".join(lines) + "\n"


def _dropped(m: Metrics, reason: str) -> float:
    return sum(v for (n, lbl), v in m.items()
               if n == "rooflight_source_values_dropped_total" and ("reason", reason) in lbl)


def _has(m: Metrics, name: str) -> bool:
    return any(n == name for n, _ in m)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with scripted_agent(_page(0), INTERVAL) as rig:
        yield rig


def _held_layouts(agent: Agent) -> int:
    """Distinct TTFT bucket layouts (tuple objects) the target's histories hold over all their points."""
    loop = agent.engines[0]
    return len({id(p.histograms[derive.TTFT].bounds) for h in loop.histories().values() for p in h.points()
                if derive.TTFT in p.histograms})


async def test_a_bucket_layout_that_moves_every_page_does_not_pile_up_in_the_history(rig: Rig) -> None:
    for k in range(1, 80):  # 40 s: longer than the 30 s window's retention
        m = await rig.sample(_page(k, buckets=40, shift=True))
    assert _held_layouts(rig.agent) <= 5  # one tuple per point (~70) before
    assert _has(m, "rooflight_requests_running")  # the rest of the series is still read


async def test_a_steady_layout_is_one_tuple_for_every_point(rig: Rig) -> None:
    for k in range(1, 20):
        await rig.sample(_page(k, buckets=40))
    assert _held_layouts(rig.agent) == 1
    history = next(iter(rig.agent.engines[0].histories().values()))
    assert sum(derive.TTFT in p.histograms for p in history.points()) == len(history)


async def test_a_histogram_with_too_many_buckets_is_dropped_and_counted(rig: Rig) -> None:
    for k in range(1, 4):
        m = await rig.sample(_page(k, buckets=MAX_HISTOGRAM_BUCKETS + 1))
    assert _held_layouts(rig.agent) == 0
    assert _dropped(m, HISTOGRAM_TOO_MANY_BUCKETS) == 3  # one histogram on each of three pages
    assert _has(m, "rooflight_requests_running")
    m = await rig.sample(_page(4, buckets=MAX_HISTOGRAM_BUCKETS - 1))  # at the cap it is read
    assert _held_layouts(rig.agent) == 1
    assert _dropped(m, HISTOGRAM_TOO_MANY_BUCKETS) == 3


async def test_an_absurd_kv_pool_is_refused_and_the_target_keeps_its_series(rig: Rig) -> None:
    for k in range(1, 16):
        m = await rig.sample(_page(k, cache_config='block_size="16",num_gpu_blocks="1e308"'))
    assert _has(m, "rooflight_requests_running")
    assert _dropped(m, INFO_OUT_OF_RANGE) >= 1
    assert _dropped(m, DERIVATION_FAILED) == 0
    series = rig.agent.snapshot.targets[0].series
    assert series and series[0].series.kv_capacity_tokens is None
    assert series[0].windows and series[0].signals  # derived, where every step raised before


async def test_a_derivation_that_raises_is_counted_and_the_series_stay(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> float:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(step.StepCost, "seconds", broken)  # every capacity and headroom asks it
    for k in range(1, 16):
        m = await rig.sample(_page(k, cache_config='block_size="16",num_gpu_blocks="1000"'))
    assert _has(m, "rooflight_requests_running")
    assert _dropped(m, DERIVATION_FAILED) >= 1
    assert m[("rooflight_source_up", (("source", "engine"), ("target", rig.agent.engines[0].target.name)))] == 1.0


def test_the_decode_bandwidth_headroom_has_no_answer_without_a_finite_ceiling() -> None:
    assert physics.decode_bandwidth_headroom(8.0, 1e10, 0.0, 8e9, float("inf"), 3e12) is None
    assert physics.decode_bandwidth_headroom(8.0, 1e10, 1e6, 0.0, 1e15, 3e12) is None
    assert physics.decode_bandwidth_headroom(8.0, 1e10, float("inf"), 8e9, 1e15, 3e12) is None
    value = physics.decode_bandwidth_headroom(8.0, 1.6e10, 1e6, 8e9, 1e15, 3.35e12)
    assert value is not None and 0.0 < value < 1.0


async def test_a_model_path_with_a_newline_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    forged = "/models/x\n2026-01-01 00:00:00,000 ERROR rooflight: FORGED/Meta-Llama-3-8B"
    engine = FakeEngine(body=_page(0), json_routes={"/v1/models": {"data": [{"id": "m", "root": forged}]}})
    await engine.start()
    clock = FakeClock()
    config = build({}, {}, {"engine_url": [engine.url], "process": False, "nvml": False, "interval": str(INTERVAL),
                            "windows": "5s,30s"})
    try:
        with caplog.at_level("INFO", logger="rooflight"):
            async with started_agent(config, loops=False, clock=clock) as agent:
                for k in range(1, 3):
                    engine.body = _page(k)
                    clock.advance(INTERVAL)
                    await agent.sample_engines_once()
                assert agent.engines[0].model is not None  # the preset was still found from the path
    finally:
        await engine.stop()
    said = [r.getMessage() for r in caplog.records]
    assert any("FORGED" in m for m in said)  # the path was logged ...
    assert not any("\n" in m for m in said)  # ... on its own line, escaped
