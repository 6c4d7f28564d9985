"""The shortest window's KV peak and queue floor carried from one sample to the next
(policy.kv_peak_and_queue_floor) are those of a read of every point of the window, whatever the history drops
(pruned, thinned to one point a second) and however the window's start moves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rooflight.agent.signals import derive, policy
from rooflight.agent.signals.policy import DetectorState
from rooflight.agent.signals.windows import SeriesHistory

GAUGE = st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 1.0]))
STEP = st.tuples(st.sampled_from([0.05, 0.1, 0.3, 1.2]), GAUGE, GAUGE, st.sampled_from([0.3, 0.5, 1.0, 2.0, 3.0]))


def _read_whole(history: SeriesHistory, first: object) -> tuple[float | None, float | None]:
    kv = [p.gauges[derive.KV_USAGE] for p in history.points_since(first) if derive.KV_USAGE in p.gauges]
    waiting = [p.gauges[derive.WAITING] for p in history.points_since(first) if derive.WAITING in p.gauges]
    return max(kv, default=None), min(waiting, default=None)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=80))
def test_the_carried_extremes_are_those_of_the_whole_window(steps: list[tuple[float, ...]]) -> None:
    history = SeriesHistory(4.0, dense=1.0)  # points older than a second thinned to one a second, inside the windows
    state, t = DetectorState(), 100.0
    for dt, kv, waiting, seconds in steps:
        t += dt
        history.append(t, {}, {derive.KV_USAGE: kv, derive.WAITING: waiting}, {})
        span = history.window(seconds, reach=None)
        if span is None:
            continue
        peak, low, state = policy.kv_peak_and_queue_floor(state, history, span[0])
        assert (peak, low) == _read_whole(history, span[0])


def test_a_window_moving_on_reads_only_the_new_points() -> None:
    history = SeriesHistory(60.0)
    state = DetectorState()
    for i in range(100):
        history.append(100.0 + 0.1 * i, {}, {derive.KV_USAGE: 0.5 + 0.001 * (i % 7), derive.WAITING: 3.0}, {})
    first = history.window(10.0)[0]  # type: ignore[index]
    _, _, state = policy.kv_peak_and_queue_floor(state, history, first)
    history.append(110.0, {}, {derive.KV_USAGE: 0.9, derive.WAITING: 1.0}, {})
    read: list[object] = []
    points_since = history.points_since
    history.points_since = lambda p: read.append(p) or points_since(p)  # type: ignore[method-assign]
    peak, low, _ = policy.kv_peak_and_queue_floor(state, history, history.window(10.0)[0])  # type: ignore[index]
    assert (peak, low) == (0.9, 1.0) and read == []  # the previous extremes, then the one new point


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(STEP, st.booleans()), min_size=1, max_size=80))
def test_samples_not_judged_in_between_leave_the_extremes_those_of_the_whole_window(
        steps: list[tuple[tuple[float, ...], bool]]) -> None:
    """Samples whose state was not kept (a derivation that raised) may leave the last span read far behind."""
    history = SeriesHistory(4.0, dense=1.0)
    state, t = DetectorState(), 100.0
    for (dt, kv, waiting, seconds), judged in steps:
        t += dt
        history.append(t, {}, {derive.KV_USAGE: kv, derive.WAITING: waiting}, {})
        span = history.window(seconds, reach=None)
        if span is None or not judged:
            continue
        peak, low, state = policy.kv_peak_and_queue_floor(state, history, span[0])
        assert (peak, low) == _read_whole(history, span[0])


def test_a_span_starting_after_the_last_one_read_is_read_whole() -> None:
    """The last span read had neither gauge, and the next starts after its newest point."""
    history = SeriesHistory(60.0)
    for t in (0.0, 1.0, 2.0):
        history.append(t, {}, {}, {})
    _, _, state = policy.kv_peak_and_queue_floor(DetectorState(), history, history.points()[0])
    for t, kv, waiting in ((3.0, 0.9, 1.0), (4.0, 0.1, 5.0), (5.0, 0.2, 6.0)):
        history.append(t, {}, {derive.KV_USAGE: kv, derive.WAITING: waiting}, {})
    peak, low, _ = policy.kv_peak_and_queue_floor(state, history, history.points()[4])
    assert (peak, low) == (0.2, 5.0)


def test_gauges_holding_still_are_never_read_whole_again() -> None:
    """An idle queue stays at 0 and a full pool at its occupancy for minutes: of equal values the newest point is
    carried, so the window moving on never leaves its extremes behind (the oldest was carried, and left the
    window with the next sample: the whole window was read on every sample)."""
    history = SeriesHistory(60.0)
    read: list[object] = []
    points_since = history.points_since
    history.points_since = lambda p: read.append(p) or points_since(p)  # type: ignore[method-assign]
    state = DetectorState()
    for i in range(300):  # 30 s at 10 Hz, a 10 s window
        history.append(100.0 + 0.1 * i, {}, {derive.KV_USAGE: 0.5, derive.WAITING: 0.0}, {})
        span = history.window(10.0, reach=None)
        if span is not None:
            peak, low, state = policy.kv_peak_and_queue_floor(state, history, span[0])
            assert (peak, low) == (0.5, 0.0)
    assert len(read) == 1  # the first span only
