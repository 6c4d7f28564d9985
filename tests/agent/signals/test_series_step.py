"""The derive step (signals/series.py) and the detector policy (signals/policy.py), called directly: pure
functions of (history, constants, settings, detector state, now) that return the series' view and the next
state, never changing the state they were given. The same behaviour through the agent over HTTP is in
test_head_of_line_source.py, test_windows_cadence.py and test_engine_stalled.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.signals import derive, policy
from rooflight.agent.signals.detectors import DetectorThresholds, Verdicts
from rooflight.agent.signals.headroom import ENERGY, SignalSettings
from rooflight.agent.signals.policy import DetectorState
from rooflight.agent.signals.series import (
    GPU_DRAM, INITIAL_STATE, NO_GPU, GpuMeasures, TargetInputs, derive_series, derive_settings,
)
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.samples import EngineSeries, Histogram

CONSTANTS = TargetConstants(model=preset("llama-3-8b"), gpu=get_profile("h100-sxm"), gpu_source="flag")
SETTINGS = derive_settings({"5s": 5.0, "30s": 30.0}, ("50", "99"), 1.0, DetectorThresholds())
TARGET = TargetInputs(constants=CONSTANTS, signal_settings=SignalSettings(), batch_max_flag=64.0)
ITL_EDGES = (0.01, 0.025, 0.05, 0.1, 0.25, float("inf"))


def _verdicts(**on: bool) -> Verdicts:
    fields = {"head_of_line": False, "itl_inflation": 1.0, "capacity_capped": False, "admission_bound": False,
              "at_configured_max": False}
    return Verdicts(**{**fields, **on})  # type: ignore[arg-type]


def _page(t: float, *, waiting: float = 0.0, stalled_itls: float = 0.0) -> EngineSeries:
    """A vLLM-like series at second `t` of a steady load: 100 steps and 1,000 generated and 500 prompt
    tokens a second, every ITL in (0.01, 0.025], plus `stalled_itls` in (0.1, 0.25] so far."""
    counts = (0.0, 1000 * t, 1000 * t, 1000 * t, 1000 * t + stalled_itls, 1000 * t + stalled_itls)
    itl = Histogram(buckets=tuple(zip(ITL_EDGES, counts)), count=counts[-1], sum=0.015 * counts[-1])
    return EngineSeries(model="m", running=16.0, waiting=waiting, kv_usage_ratio=0.3, kv_capacity_tokens=100_000.0,
                        prompt_tokens_total=500 * t, generation_tokens_total=1000 * t, steps_total=100 * t, itl=itl)


def _history(seconds: int, **page: float) -> tuple[SeriesHistory, EngineSeries]:
    history = SeriesHistory(60.0)
    for t in range(seconds + 1):
        series = _page(float(t), **page)
        history.append(float(t), *derive.history_inputs(series))
    return history, series


def test_the_step_is_pure_the_same_inputs_give_the_same_view_and_leave_the_state_as_it_was() -> None:
    history, series = _history(20, waiting=4.0)
    state, rising = INITIAL_STATE, []
    for _ in range(2):  # a second state, with baselines and windows in it, as well as the initial one
        before = state._replace()
        first = derive_series(series, history, TARGET, SETTINGS, state, 20.0)
        again = derive_series(series, history, TARGET, SETTINGS, state, 20.0)
        assert first == again and state == before
        state = first.state
        rising.append(first.rising)
    assert first.state.itl_engine is not None and first.state.windows is not None and first.state.work is not None
    view = first.view
    assert [w.window for w in view.windows] == ["5s", "30s"]
    assert view.windows[0].tokens_per_second["decode"] == pytest.approx(1000.0)
    assert view.verdicts is not None and view.verdicts.admission_bound is True  # 16 of 64 running, 4 waiting
    assert view.batch_max == 64.0 and len(view.signals) == 2
    assert rising == [("admission-bound batch",), ()]  # marked when it turned on, not again
    assert first.dropped == () and first.windows_failed is None


def test_a_series_without_history_has_no_windows_nor_verdicts_and_keeps_its_state() -> None:
    _, series = _history(1)
    derived = derive_series(series, None, TARGET, SETTINGS, INITIAL_STATE, 1.0)
    assert (derived.view.windows, derived.view.verdicts, derived.state) == ((), None, INITIAL_STATE)


def test_the_gpus_measures_are_an_input_read_over_each_window() -> None:
    history, series = _history(20)
    gpu = SeriesHistory(60.0)
    for t in range(21):
        gpu.append(float(t), {ENERGY: 500.0 * t}, {GPU_DRAM: 0.25}, {})
    measured = derive_series(series, history, replace(TARGET, gpu=GpuMeasures((gpu,))), SETTINGS, INITIAL_STATE, 20.0)
    blind = derive_series(series, history, replace(TARGET, gpu=NO_GPU), SETTINGS, INITIAL_STATE, 20.0)
    assert [(w.dram_utilization, w.energy_watts) for w in measured.view.windows] == [(0.25, 500.0)] * 2
    assert [(w.dram_utilization, w.energy_watts) for w in blind.view.windows] == [(None, None)] * 2
    unsampled = GpuMeasures((gpu, None))  # a GPU not sampled yet: no power (a partial sum would overstate tokens/J)
    assert unsampled.over(5.0) == (0.25, None)


def test_a_stall_is_held_for_hol_hold_seconds_then_let_go() -> None:
    state = DetectorState()
    held, state = policy.hold_head_of_line(state, _verdicts(head_of_line=True), 100.0, 30.0)
    assert held is not None and held.head_of_line and state.last_stall == 100.0
    for now, expected in ((110.0, True), (130.0, True), (130.5, False)):
        verdicts, after = policy.hold_head_of_line(state, _verdicts(), now, 30.0)
        assert verdicts is not None and verdicts.head_of_line is expected, now
        assert after == state  # no new stall: the state goes on as it was
    assert policy.hold_head_of_line(state, None, 110.0, 30.0) == (None, state)  # no verdicts: nothing to hold


def test_rising_edges_name_what_turned_on_once() -> None:
    edges, state = policy.rising_edges(DetectorState(), _verdicts(head_of_line=True, capacity_capped=True))
    assert edges == ("head-of-line stall", "capacity-capped batch")
    assert policy.rising_edges(state, _verdicts(head_of_line=True, capacity_capped=True))[0] == ()
    edges, kept = policy.rising_edges(state, None)
    assert edges == () and kept is state  # no verdicts: the previous ones still stand
    edges, _ = policy.rising_edges(policy.rising_edges(state, _verdicts())[1], _verdicts(admission_bound=True))
    assert edges == ("admission-bound batch",)


def test_each_window_stands_for_a_sixtieth_of_itself_unless_what_it_came_from_changed() -> None:
    assert policy.windows_every({"10s": 10.0, "1m": 60.0, "5m": 300.0}) == pytest.approx((1 / 6, 1.0, 5.0))
    at_10hz = [policy.window_kept(10.0, 10.0 + dt, 1.0, 0.1) for dt in (0.0, 0.9, 0.96)]
    assert at_10hz == [True, True, False]  # half an interval early
    assert not policy.window_kept(10.0, 11.0, 1.0, 1.0)  # a 1m window at 1 Hz: every sample
    at_1hz = [policy.window_kept(10.0, 10.0 + dt, 5.0, 1.0) for dt in (1.0, 4.0, 5.0)]
    assert at_1hz == [True, True, False]  # a 5m window at 1 Hz: every fifth sample
    assert not policy.window_kept(10.0, 9.0, 1.0, 0.1)  # the clock went back
    at_10hz_10s = [policy.window_kept(10.0, 10.0 + dt, 1 / 6, 0.1) for dt in (0.1, 0.2)]
    assert at_10hz_10s == [True, False]  # a 10s window at 10 Hz: every other sample
    kept = policy.KeptWindows(at=(10.0,), constants=CONSTANTS, kv_capacity_tokens=100.0, derived=(None,))
    assert policy.windows_basis_kept(kept, CONSTANTS, 100.0)
    assert not policy.windows_basis_kept(kept, CONSTANTS, 200.0)  # the KV pool changed
    assert not policy.windows_basis_kept(kept, replace(CONSTANTS, tensor_parallel_size=2), 100.0)
    assert not policy.windows_basis_kept(None, CONSTANTS, 100.0)


def test_the_itl_tail_judges_against_its_own_past_and_the_proxy_only_when_it_judges() -> None:
    history, _ = _history(40)
    span = policy.tail_span((5.0, 30.0))
    state = DetectorState()
    for now in range(20, 41):  # baselines of the steady seconds
        tail, state = policy.itl_tail(state, history, 1.0, span, float(now))
    assert (tail.worst, tail.baseline, tail.source) == (0.025, 0.025, "engine")
    assert state.itl_proxy is None  # no proxy judged: its baseline was never started
    proxied, after = policy.itl_tail(state, history, 1.0, span, 41.0, proxy_worst=0.06, proxy_judges=True)
    assert proxied.source == "engine"  # the proxy's baseline is empty yet: the engine's buckets judge
    assert after.itl_proxy is not None and len(after.itl_proxy) == 1 and len(state.itl_engine or ()) == 21


STEP_EDGES = (16.0, 512.0, 2048.0, float("inf"))


def _step_baselines(seconds: int, prefill: dict[int, tuple[float, float]]) -> dict[int, tuple[float | None, float | None]]:
    """Each second's (largest recent step, usual largest step) as the policy judges them at 1 Hz, of an engine
    running 100 steps a second, each of at most 16 tokens, except that second t of `prefill` computed its
    prompt tokens with its largest step in the bucket `prefill[t] = (prompt tokens, bucket bound)`; the other
    seconds decode only (no prompt token)."""
    history, span, state, judged = SeriesHistory(120.0), policy.tail_span((5.0, 60.0)), DetectorState(), {}
    prompt, larger = 0.0, {512.0: 0.0, 2048.0: 0.0}
    for t in range(seconds + 1):
        tokens, bound = prefill.get(t, (0.0, 16.0))
        prompt += tokens
        if bound > 16.0:
            larger[bound] += 1
        steps = 100.0 * (t + 1)
        counts = (steps - larger[512.0] - larger[2048.0], steps - larger[2048.0], steps, steps)
        histogram = Histogram(buckets=tuple(zip(STEP_EDGES, counts)), count=steps, sum=0.0)
        series = replace(_page(float(t)), prompt_tokens_total=prompt, steps_total=steps, step_tokens=histogram)
        history.append(float(t), *derive.history_inputs(series))
        tail, state = policy.itl_tail(state, history, 1.0, span, float(t))
        judged[t] = (tail.largest_step, tail.largest_step_baseline)
    return judged


def test_seconds_that_decode_only_join_no_step_baseline() -> None:
    """A wave of prompts (a step of up to 512 tokens) every 8th second, decode-only seconds (steps of 16)
    between: seven of eight seconds decode only. Were they in the baseline, its 0.8 quantile would be 16 and
    every wave would read 32x; the usual largest step is the waves' own, 512."""
    waves = {t: (400.0, 512.0) for t in range(8, 65, 8)}
    judged = _step_baselines(64, waves)
    assert judged[64] == (512.0, 512.0)  # a wave this second, against the waves before it
    assert judged[63][1] == 512.0 and judged[62][0] == 16.0  # decode only for 2 s: the largest step is 16


def test_the_stall_is_judged_against_the_steps_before_it_not_its_own() -> None:
    """Short prompts (steps of at most 16) every 2nd second to 17, then a long prompt run whole (a 2048-token
    step) every 5th second. The usual largest step is the 0.8 quantile (the lowest value with 80% at or under
    it) of the prefill seconds before the one judged: 16 of {16 x9}, {16 x9, 2048}, {16 x9, 2048 x2}, and
    2048 of {16 x9, 2048 x3}: three long prompts read 128x, the fourth, now usual, 1x. Had each long
    step joined before it was judged, the third would read 1x."""
    prefill = {t: (50.0, 16.0) for t in range(1, 18, 2)} | {t: (2000.0, 2048.0) for t in (20, 25, 30, 35)}
    judged = _step_baselines(35, prefill)
    assert [judged[t] for t in (20, 25, 30, 35)] == [(2048.0, 16.0)] * 3 + [(2048.0, 2048.0)]
    assert judged[18] == (16.0, 16.0)  # the short prompts' values span 16 s (over 3 x the 5 s window) once 17 joins
    assert judged[17][1] is None  # ... not before


def test_the_stall_s_step_is_seen_when_sampling_jitter_leaves_one_interval_in_the_look_back() -> None:
    """At 1 Hz the 2 s look back for the stall's step holds two intervals, or one where jitter puts the
    point before it just outside: 0.999 s is under half the look back, and SeriesHistory.window gives
    nothing. The last interval is what the stall came in, so it is read whatever the window says."""
    history, largest, prompt = SeriesHistory(120.0), 0.0, 0.0
    times = [0.0]
    while len(times) < 41:
        times.append(times[-1] + (1.002 if len(times) % 2 else 0.999))
    span, state = policy.tail_span((5.0, 60.0)), DetectorState()
    for i, t in enumerate(times):
        stall = i == len(times) - 1
        prompt += 2000.0 if stall else 50.0
        largest += 1 if stall else 0
        steps = 100.0 * (i + 1)
        counts = (steps - largest, steps - largest, steps, steps)  # every step <= 16 tokens, the stall's 2048
        step_tokens = Histogram(buckets=tuple(zip(STEP_EDGES, counts)), count=steps, sum=0.0)
        series = replace(_page(float(i)), prompt_tokens_total=prompt, steps_total=steps, step_tokens=step_tokens)
        history.append(t, *derive.history_inputs(series))
        tail, state = policy.itl_tail(state, history, 1.0, span, t)
    assert times[-1] - times[-2] < 1.0 and times[-1] - times[-3] > policy.STEP_LOOKBACK_SECONDS  # one interval in it
    assert history.window(policy.STEP_LOOKBACK_SECONDS, reach=None) is None
    assert (tail.largest_step, tail.largest_step_baseline) == (2048.0, 16.0)
