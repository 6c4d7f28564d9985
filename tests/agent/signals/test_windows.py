"""Windows with a fake clock: rates, resets, means and histogram_quantile semantics."""

from __future__ import annotations

import math

import pytest

from rooflight.agent.signals.windows import (
    CorrectedHistogram,
    SeriesHistory,
    correct_counter,
    histogram_delta,
    histogram_quantile,
    mean,
    rate,
)
from rooflight.collectors.samples import Histogram

INF = math.inf


def _hist(*pairs: tuple[float, float]) -> Histogram:
    return Histogram(buckets=tuple(pairs), count=pairs[-1][1], sum=0.0)


def test_rate_uses_real_timestamps_not_the_nominal_interval() -> None:
    h = SeriesHistory(retention=600)
    h.append(0.0, {"c": 100.0}, {}, {})
    h.append(2.5, {"c": 125.0}, {}, {})  # a slow scrape: 2.5 s apart
    first, last = h.window(4.0)
    assert rate(first, last, "c") == pytest.approx(10.0)


def test_counter_reset_never_gives_a_negative_rate() -> None:
    h = SeriesHistory(retention=600)
    for t, v in [(0, 1000.0), (1, 1010.0), (2, 5.0), (3, 15.0)]:  # restart between t=1 and t=2
        h.append(float(t), {"c": v}, {}, {})
    first, last = h.window(3.0)
    # increase = 10 (before) + 5 (counted from zero after the reset) + 10 = 25 over 3 s
    assert rate(first, last, "c") == pytest.approx(25 / 3)


def test_correct_counter_first_sample_contributes_nothing() -> None:
    assert correct_counter(None, 0.0, 500.0) == 0.0
    assert correct_counter(500.0, 0.0, 510.0) == 10.0
    assert correct_counter(510.0, 10.0, 3.0) == 13.0


def test_window_picks_points_inside_it_and_needs_half_coverage() -> None:
    h = SeriesHistory(retention=600)
    for t in range(0, 31):
        h.append(float(t), {"c": float(t) * (2 if t > 20 else 1)}, {}, {})
    first, last = h.window(10.0)
    assert (first.t, last.t) == (20.0, 30.0)
    assert rate(first, last, "c") == pytest.approx((60 - 20) / 10)
    assert h.window(100.0) is None  # only 30 s of history: not half of 100 s
    assert h.window(60.0) is not None


def test_after_a_downtime_longer_than_a_window_it_waits_for_new_points_instead_of_rating_the_downtime() -> None:
    """An engine restarting for 31 s: its first sample back used to pair with the last one before the downtime,
    so the 10 s window rated 31 s (mostly of nothing) under its name, then vanished until 5 s of new points."""
    h = SeriesHistory(retention=600)
    for t in range(0, 61):  # 100 tokens/s
        h.append(float(t), {"c": 100.0 * t}, {}, {})
    h.append(92.0, {"c": 100.0}, {}, {})  # back after 31 s, counting from zero: 1 s of tokens
    assert h.window(10.0) is None
    assert h.window(60.0) is not None  # 32 s of a 60 s window: within its reach, and over half of it
    recent = h.window(0.15, reach=None)  # the ITL tail's lookback: since the previous sample, however late
    assert recent is not None and recent[0].t == 60.0
    for t in range(93, 98):
        h.append(float(t), {"c": 100.0 * (t - 91)}, {}, {})
    first, last = h.window(10.0)
    assert (first.t, last.t) == (92.0, 97.0)
    assert rate(first, last, "c") == pytest.approx(100.0)


def test_a_late_sample_still_makes_a_window_within_twice_its_length() -> None:
    """Samples late by a scrape timeout are not a downtime: a pair up to twice the window's length is read."""
    h = SeriesHistory(retention=600)
    h.append(0.0, {"c": 0.0}, {}, {})
    h.append(9.0, {"c": 90.0}, {}, {})  # one slow scrape, 9 s late, for a 5 s window
    first, last = h.window(5.0)
    assert rate(first, last, "c") == pytest.approx(10.0)
    assert h.window(4.0) is None  # 9 s for a 4 s window: more than twice it


def test_time_weighted_mean_of_a_gauge() -> None:
    h = SeriesHistory(retention=600)
    h.append(0.0, {}, {"kv": 0.2}, {})
    h.append(1.0, {}, {"kv": 1.0}, {})  # 0.2 held for 1 s
    h.append(4.0, {}, {"kv": 0.0}, {})  # 1.0 held for 3 s
    first, last = h.window(4.0)
    assert mean(first, last, "kv") == pytest.approx((0.2 * 1 + 1.0 * 3) / 4)


def test_history_is_bounded_by_retention() -> None:
    h = SeriesHistory(retention=10)
    for t in range(10_000):
        h.append(float(t) * 0.1, {"c": float(t)}, {"g": 1.0}, {})
    assert len(h) <= 10 / 0.1 + 2  # what the retention needs, not more


def test_a_sample_that_is_not_newer_is_ignored() -> None:
    h = SeriesHistory(retention=60)
    h.append(5.0, {"c": 1.0}, {}, {})
    h.append(5.0, {"c": 9.0}, {}, {})
    assert len(h) == 1


def test_histogram_delta_over_window_and_reset() -> None:
    h = SeriesHistory(retention=600)
    h.append(0.0, {}, {}, {"itl": _hist((0.1, 10), (1.0, 20), (INF, 20))})
    h.append(1.0, {}, {}, {"itl": _hist((0.1, 15), (1.0, 30), (INF, 31))})
    h.append(2.0, {}, {}, {"itl": _hist((0.1, 2), (1.0, 2), (INF, 2))})  # engine restarted
    first, last = h.window(2.0)
    d = histogram_delta(first, last, "itl")
    assert d is not None
    assert d.counts == (5 + 2, 10 + 2, 11 + 2)


def test_histogram_layout_change_restarts_deltas() -> None:
    h = SeriesHistory(retention=600)
    h.append(0.0, {}, {}, {"x": _hist((1.0, 5), (INF, 5))})
    h.append(1.0, {}, {}, {"x": _hist((2.0, 5), (INF, 9))})
    first, last = h.window(1.0)
    assert histogram_delta(first, last, "x") is None  # the two layouts cannot be subtracted


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 0.05),  # rank 50 of 100 in the first bucket [0, 0.1]: 0 + 0.1 * 50/100
        (0.0, 0.0),
        (1.0, 0.1),
    ],
)
def test_quantile_interpolates_in_the_first_bucket_from_zero(q: float, expected: float) -> None:
    hist = CorrectedHistogram((0.1, 1.0, INF), (100.0, 100.0, 100.0))
    assert histogram_quantile(q, hist) == pytest.approx(expected)


def test_quantile_interpolates_inside_the_bucket_that_holds_the_rank() -> None:
    hist = CorrectedHistogram((0.1, 0.5, 1.0, INF), (10.0, 50.0, 90.0, 100.0))
    # p50: rank 50 sits at the top of (0.1, 0.5]; p60: rank 60 is 10/40 into (0.5, 1.0]
    assert histogram_quantile(0.5, hist) == pytest.approx(0.5)
    assert histogram_quantile(0.6, hist) == pytest.approx(0.5 + 0.5 * 10 / 40)


def test_quantile_in_the_inf_bucket_returns_the_last_finite_bound() -> None:
    hist = CorrectedHistogram((0.1, 1.0, INF), (10.0, 20.0, 100.0))
    assert histogram_quantile(0.99, hist) == 1.0


def test_quantile_is_none_without_observations_or_inf_bucket() -> None:
    assert histogram_quantile(0.5, CorrectedHistogram((0.1, INF), (0.0, 0.0))) is None
    assert histogram_quantile(0.5, CorrectedHistogram((0.1, 1.0), (5.0, 10.0))) is None
    assert histogram_quantile(1.5, CorrectedHistogram((0.1, INF), (5.0, 10.0))) is None


def test_quantile_flattens_non_monotonic_buckets_like_prometheus() -> None:
    hist = CorrectedHistogram((0.1, 0.2, INF), (10.0, 9.0, 10.0))
    assert histogram_quantile(0.5, hist) == pytest.approx(0.05)


def test_old_points_thin_to_the_coarse_step_and_rates_stay_exact() -> None:
    h = SeriesHistory(retention=300, dense=15, coarse_step=1.0)
    for i in range(3001):  # 10 Hz for 300 s, a counter rising 7 per sample
        h.append(i * 0.1, {"c": 7.0 * i}, {"g": float(i % 10)}, {})
    assert len(h) <= 150 + 285 + 2  # 15 s at 10 Hz, then one a second
    first, last = h.window(300.0)
    assert rate(first, last, "c") == pytest.approx(70.0)
    first, last = h.window(10.0)
    assert last.t - first.t == pytest.approx(10.0)  # the short window keeps every sample
    assert rate(first, last, "c") == pytest.approx(70.0)
    first, last = h.window(60.0)
    assert abs((last.t - first.t) - 60.0) <= 1.0  # a long window's start moves by under a step
    assert mean(first, last, "g") == pytest.approx(4.5, abs=0.1)


def test_sampling_at_the_coarse_step_keeps_every_point() -> None:
    h = SeriesHistory(retention=120, dense=15, coarse_step=1.0)
    for i in range(121):  # 1 Hz with jitter: each sample in its own second
        h.append(i + 0.3 * ((i * 7) % 3) / 3, {"c": float(i)}, {}, {})
    assert len(h) >= 118
