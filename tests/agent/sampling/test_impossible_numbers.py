"""Physically impossible numbers are withheld and counted, never exported.

A counter that creeps backwards every scrape is not an engine restarting: taken as restarts it gave MBU
1189 and MFU 30. KV occupancy 1e308 is not a ratio. MBU or MFU far above 1 says an input is wrong.
"""

from __future__ import annotations

import re
from typing import AsyncIterator

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals import derive
from rooflight.agent.signals.windows import COUNTER_REGRESS_LIMIT, SeriesHistory, rate
from support import Metrics, Rig, sample_text, scripted_agent

PAGE = sample_text("vllm-cpu-load-c16.prom")
STEPS = "vllm:iteration_tokens_total_count"
GENERATION = "vllm:generation_tokens_total"
KV = "vllm:kv_cache_usage_perc"
INTERVAL = 0.5



def _set(page: str, name: str, value: float) -> str:
    """The page with every sample of `name` set to `value`."""
    pattern = re.compile(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", re.M)
    assert pattern.search(page), name
    return pattern.sub(lambda m: f"{m.group(1)} {value!r}", page)


def _values(m: Metrics, name: str, **labels: str) -> list[float]:
    return [v for (n, lbl), v in m.items() if n == name and set(labels.items()) <= set(lbl)]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with scripted_agent(PAGE, INTERVAL) as rig:
        yield rig


# -- counters that keep going backwards ------------------------------------------------------------------


def _history() -> SeriesHistory:
    return SeriesHistory(retention=30.0)


def test_one_restart_is_still_a_restart() -> None:
    h = _history()
    for t, v in enumerate([1000.0, 1100.0, 1200.0, 50.0, 150.0, 250.0]):
        h.append(float(t), {derive.GENERATION: v}, {}, {})
    span = h.window(5.0)
    assert span is not None
    assert rate(*span, derive.GENERATION) == pytest.approx((100 + 100 + 50 + 100 + 100) / 5)
    assert not h.unreliable(derive.GENERATION)
    assert h.regressed_unreliable == ()


def test_a_counter_that_keeps_going_backwards_is_withheld_not_counted_again_each_time() -> None:
    h = _history()
    value = 1e6
    for t in range(COUNTER_REGRESS_LIMIT + 3):
        h.append(float(t), {derive.STEPS: value, derive.GENERATION: 100.0 * t}, {}, {})
        value -= 1.0  # a little down every sample: before, each step re-counted the whole 1e6
    assert h.unreliable(derive.STEPS)
    assert h.regressed_unreliable == (derive.STEPS,)
    span = h.window(5.0)
    assert span is not None
    assert rate(*span, derive.STEPS) is None  # withheld, where it was ~1e6 steps/s
    assert rate(*span, derive.GENERATION) == pytest.approx(100.0)  # the other counters are untouched
    assert not h.unreliable(derive.GENERATION)


def test_the_counter_comes_back_after_a_whole_retention_without_going_backwards() -> None:
    h = _history()
    t, value = 0.0, 5000.0
    for _ in range(COUNTER_REGRESS_LIMIT + 1):
        h.append(t, {derive.STEPS: value}, {}, {})
        t, value = t + 1.0, value - 1.0
    assert h.unreliable(derive.STEPS)
    last_back = t - 1.0
    while t < last_back + h.retention - 1.0:  # climbing steadily again, still withheld
        h.append(t, {derive.STEPS: value}, {}, {})
        t, value = t + 1.0, value + 10.0
    assert h.unreliable(derive.STEPS)
    recovered = last_back + h.retention
    while t < recovered + 15.0:
        h.append(t, {derive.STEPS: value}, {}, {})
        t, value = t + 1.0, value + 10.0
    assert not h.unreliable(derive.STEPS)
    span = h.window(10.0)
    assert span is not None and span[0].t >= recovered
    assert rate(*span, derive.STEPS) == pytest.approx(10.0)
    longest = h.window(h.retention)  # starts in the withheld stretch: no rate over the bad values
    assert longest is not None and longest[0].t < recovered
    assert rate(*longest, derive.STEPS) is None


async def test_the_engine_source_reports_counter_regress_and_rates_are_withheld(rig: Rig) -> None:
    page = PAGE
    for i in range(8):  # a healthy start: the counters climb
        page = _set(_set(PAGE, STEPS, 1e6 + 50 * i), GENERATION, 8096.0 + 1000 * i)
        m = await rig.sample(page)
    assert _values(m, "rooflight_steps_per_second") and _values(m, "rooflight_mbu_ratio")
    assert _values(m, "rooflight_source_errors_total", reason="counter_regress") == [0.0]
    beyond = 2
    for i in range(COUNTER_REGRESS_LIMIT + beyond):  # now the steps counter creeps down by one each scrape
        m = await rig.sample(_set(page, STEPS, 1e6 - i))
        # the first backward steps are restarts (each counts ~1e6 steps): the range check holds MBU back
        assert all(v <= derive.MAX_UTILIZATION for v in _values(m, "rooflight_mbu_ratio"))
    assert _values(m, "rooflight_source_up") == [1.0]  # the page is read: the source is up
    # one error per scrape from the one that made the counter unreliable on
    assert _values(m, "rooflight_source_errors_total", reason="counter_regress") == [float(beyond + 1)]
    assert _values(m, "rooflight_steps_per_second") == []  # before: ~2e6 steps/s, every window
    assert _values(m, "rooflight_mbu_ratio") == []
    assert _values(m, "rooflight_tokens_per_second", phase="decode")  # the other counters are still rated


# -- ratios outside their physical range ---------------------------------------------------------------------


def _constants(rig: Rig) -> TargetConstants:
    view = rig.agent.snapshot.targets[0]
    assert view.constants is not None and view.constants.model is not None
    return view.constants


async def test_kv_usage_outside_zero_to_one_is_dropped_and_counted(rig: Rig) -> None:
    m = await rig.sample(_set(PAGE, KV, 0.5))
    assert _values(m, "rooflight_kv_cache_usage_ratio") == [0.5]
    for bad in (1e308, 1.5):
        m = await rig.sample(_set(PAGE, KV, bad))
        assert _values(m, "rooflight_kv_cache_usage_ratio") == []
        assert _values(m, "rooflight_kv_cache_live_bytes") == []
    assert _values(m, "rooflight_source_values_dropped_total", reason="kv_usage_out_of_range") == [2.0]
    m = await rig.sample(_set(PAGE, KV, 1.0))  # a full cache is a ratio
    assert _values(m, "rooflight_kv_cache_usage_ratio") == [1.0]


async def test_mbu_and_mfu_above_their_physical_range_are_dropped_and_counted(rig: Rig) -> None:
    m = await rig.sample(PAGE)
    constants = _constants(rig)
    model = constants.model
    assert model is not None
    # Steps and tokens per second that would need several times the GPU: plausible as counters
    # (far under windows.MAX_PLAUSIBLE_RATE), impossible as physics.
    steps_per_s = 3 * constants.peak_bandwidth / model.weight_bytes
    tokens_per_s = 3 * constants.peak_flops / (2 * model.params_active)
    samples = 6
    for i in range(1, samples + 1):
        page = _set(PAGE, STEPS, 508.0 + steps_per_s * INTERVAL * i)
        page = _set(page, GENERATION, 8096.0 + tokens_per_s * INTERVAL * i)
        m = await rig.sample(page)
    # the rates go with them, and all that is derived from them (test_physical_bounds.py)
    assert _values(m, "rooflight_steps_per_second") == []
    assert _values(m, "rooflight_tokens_per_second", phase="decode") == []
    assert _values(m, "rooflight_mbu_ratio") == []
    assert _values(m, "rooflight_mfu_ratio", phase="decode") == []
    windows = len(rig.agent.config.windows)
    mbu_dropped = _values(m, "rooflight_source_values_dropped_total", reason="mbu_out_of_range")
    mfu_dropped = _values(m, "rooflight_source_values_dropped_total", reason="mfu_out_of_range")
    assert mbu_dropped and 1 <= mbu_dropped[0] <= samples * windows
    assert mfu_dropped and 1 <= mfu_dropped[0] <= samples * windows


async def test_a_busy_but_possible_engine_keeps_its_mbu(rig: Rig) -> None:
    await rig.sample(PAGE)
    constants = _constants(rig)
    model = constants.model
    assert model is not None
    steps_per_s = 0.5 * constants.peak_bandwidth / model.weight_bytes  # half the roof
    for i in range(1, 7):
        m = await rig.sample(_set(PAGE, STEPS, 508.0 + steps_per_s * INTERVAL * i))
    mbu = _values(m, "rooflight_mbu_ratio")
    assert mbu and all(0.4 < v < derive.MAX_UTILIZATION for v in mbu)
    assert _values(m, "rooflight_source_values_dropped_total", reason="mbu_out_of_range") == [0.0]


def test_derive_withholds_each_value_above_the_range_with_a_reason() -> None:
    mbu, mfu, dropped = derive._in_range(1189.0, {"prefill": 0.5, "decode": 30.0})
    assert (mbu, mfu, dropped) == (None, {"prefill": 0.5}, (derive.MBU_OUT_OF_RANGE, derive.MFU_OUT_OF_RANGE))
    assert derive._in_range(1.1, {"decode": 0.9}) == (1.1, {"decode": 0.9}, ())
    assert derive._in_range(None, {}) == (None, {}, ())


async def test_a_dynamo_frontends_impossible_inflight_count_is_withheld_and_counted() -> None:
    """`dynamo_frontend_inflight_requests 1e308` was exported as rooflight_requests_running 1e+308."""
    page = sample_text("dynamo-1.6.1-frontend-agg-load.prom")
    async with scripted_agent(page, INTERVAL, model=None, batch_max=None) as rig:
        m = await rig.sample(page)
        assert _values(m, "rooflight_requests_running") == [6.0]
        m = await rig.sample(_set(page, "dynamo_frontend_inflight_requests", 1e308))
        assert _values(m, "rooflight_requests_running") == []  # before: [1e308]
        assert _values(m, "rooflight_source_values_dropped_total", reason="gauge_out_of_range") == [1.0]
        assert _values(m, "rooflight_requests_waiting") == [0.0]  # the rest of the series is kept
