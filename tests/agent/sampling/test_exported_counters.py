"""The engine counters the agent re-exports never grow faster than the physics the gauges are held to.

`rooflight_generation_tokens_total` and its siblings are what the recording rules rate across replicas. A
generation counter climbing 5e8 tokens/s (under windows.MAX_PLAUSIBLE_RATE, far past an H100) had its
tokens/s withheld from the gauges (signals/bounds.py) while the counter went out as the engine wrote it, so
the shipped rule reported 5e8 tokens/s. Now a re-exported counter grows at most the bound the gauges use
x the seconds since the last sample, a jump past MAX_PLAUSIBLE_RATE is withheld whole (as the windows
re-baseline it), an honest burst past the bound (an engine that counts a request's tokens at its end) is
exported over the next samples instead of lost, and a reset stays a reset.

A FakeEngine serves a recorded vLLM page over HTTP; the agent samples it on a fake clock; its exposition is
read back.
"""

from __future__ import annotations

import re

import pytest

from rooflight.agent.signals.bounds import tokens_per_second_bound
from rooflight.agent.signals.exported import CARRY_SECONDS, exported_step
from rooflight.agent.signals.windows import MAX_PLAUSIBLE_RATE
from support import Metrics, Rig, sample_text, scripted_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
GENERATION = "vllm:generation_tokens_total"
EXPORTED = "rooflight_generation_tokens_total"
INTERVAL = 0.5


def _set(page: str, name: str, value: float) -> str:
    pattern = re.compile(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", re.M)
    assert pattern.search(page), name
    return pattern.sub(lambda m: f"{m.group(1)} {value!r}", page)


def _exported(m: Metrics) -> float:
    (value,) = [v for (n, _), v in m.items() if n == EXPORTED]
    return value


async def _healthy_start(rig: Rig, value: float, samples: int = 6) -> tuple[float, Metrics]:
    m: Metrics = {}
    for _ in range(samples):  # 2,000 decode tokens/s
        value += 1000.0
        m = await rig.sample(_set(PAGE, GENERATION, value))
    return value, m


async def test_a_counter_climbing_past_the_gpus_physics_is_not_exported_at_that_rate() -> None:
    async with scripted_agent(PAGE, INTERVAL, gpu="h100-sxm") as rig:
        value, m = await _healthy_start(rig, 8096.0)
        assert _exported(m) == value  # an honest counter is the engine's own, value for value
        bound = tokens_per_second_bound(rig.agent.snapshot.targets[0].constants)
        assert bound is not None and 2000 < bound < 5e8 / 4
        before = _exported(m)
        samples = 14
        for _ in range(samples):  # 5e8 tokens/s: under the counter cut, far past the GPU
            value += 5e8 * INTERVAL
            m = await rig.sample(_set(PAGE, GENERATION, value))
        grown = _exported(m) - before
        print(f"engine +{value - before:.3g} tokens in {samples * INTERVAL:g} s; exported +{grown:.3g} (bound {bound:.3g}/s)")
        assert grown <= bound * samples * INTERVAL * 1.001  # before: +3.5e9, all of it (what the rule rated)
        # The engine restarts: the exported counter drops too (Prometheus' rate() reads a reset), and counts on.
        m = await rig.sample(_set(PAGE, GENERATION, 100.0))
        assert _exported(m) == pytest.approx(100.0) and _exported(m) < before
        m = await rig.sample(_set(PAGE, GENERATION, 600.0))
        assert _exported(m) == pytest.approx(600.0)


async def test_a_jump_past_the_plausible_rate_is_withheld_whole_where_no_physics_is_known() -> None:
    async with scripted_agent(PAGE, INTERVAL, model=None) as rig:
        value, m = await _healthy_start(rig, 8096.0)
        before = _exported(m)
        m = await rig.sample(_set(PAGE, GENERATION, value + 1e18))
        assert _exported(m) == before  # before: 1e18
        m = await rig.sample(_set(PAGE, GENERATION, value + 1e18 + 4096))
        assert _exported(m) == before + 4096  # the next increase counts


def test_an_honest_burst_past_the_bound_is_exported_over_the_next_samples() -> None:
    """An engine that counts a request's tokens when it ends (TGI, TensorRT-LLM) may add more in one sample
    than its GPUs compute in that second; those tokens are late, not lost."""
    limit, dt = 1000.0, 1.0
    state = exported_step(None, 0.0, dt, limit)
    state = exported_step(state, 3500.0, dt, limit)  # 3.5 s of work counted at once
    assert state.exported == 1000.0
    for expected in (2000.0, 3000.0, 3500.0, 3500.0):
        state = exported_step(state, 3500.0, dt, limit)
        assert state.exported == expected


def test_what_is_owed_is_bounded_and_a_reset_clears_it() -> None:
    limit, dt = 1000.0, 1.0
    state = exported_step(exported_step(None, 0.0, dt, limit), MAX_PLAUSIBLE_RATE * 0.5, dt, limit)
    assert state.exported == limit and state.owed == limit * CARRY_SECONDS  # the rest is not counted
    state = exported_step(state, 10.0, dt, limit)  # a restart
    assert state.exported == 10.0 and state.owed == 0.0
