"""Several quantiles from one pass (histogram_quantiles) agree with Prometheus' one-at-a-time definition.

The reference below is the linear scan histogram_quantile used to be: flatten dips, find the first
bucket whose cumulative count reaches q x total, interpolate inside it.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rooflight.agent.signals import derive
from rooflight.agent.signals.windows import (
    CorrectedHistogram,
    SeriesHistory,
    histogram_delta,
    histogram_quantile,
    histogram_quantiles,
)
from rooflight.agent.signals.windows import _monotonic as flattened
from rooflight.collectors.samples import Histogram

INF = math.inf
QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0, 1.5, -0.1, math.nan)


def _reference(q: float, hist: CorrectedHistogram) -> float | None:
    counts, top = [], 0.0
    for c in hist.counts:
        top = max(top, c)
        counts.append(top)
    bounds = hist.bounds
    if len(bounds) < 2 or not math.isinf(bounds[-1]) or not 0.0 <= q <= 1.0:
        return None
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return bounds[b]
    return start + (bounds[b] - start) * (rank - below) / in_bucket


def _random_histogram(rng: random.Random) -> CorrectedHistogram:
    """Cumulative counts with empty buckets, plateaus, float dips and the odd negative first bound."""
    n = rng.randint(2, 30)
    bounds = sorted(rng.sample(range(-2, 200), n - 1))
    counts, total = [], 0.0
    for _ in range(n):
        total += rng.choice((0.0, 0.0, 1.0, rng.uniform(0, 50)))
        counts.append(total - (rng.uniform(0, 2) if rng.random() < 0.1 else 0.0))  # a dip now and then
    return CorrectedHistogram((*(b / 10 for b in bounds), INF), tuple(counts))


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_matches_the_one_at_a_time_definition(seed: int) -> None:
    hist = _random_histogram(random.Random(seed))
    got = histogram_quantiles(QS, hist)
    assert len(got) == len(QS)
    for q, value in zip(QS, got):
        assert value == _reference(q, hist), q
        assert histogram_quantile(q, hist) == value


@pytest.mark.parametrize(
    "hist",
    [
        CorrectedHistogram((0.1, INF), (0.0, 0.0)),  # no observations
        CorrectedHistogram((0.1, 1.0), (5.0, 10.0)),  # no +Inf bucket
        CorrectedHistogram((INF,), (3.0,)),  # one bucket
        CorrectedHistogram((0.1, 0.2, INF), (math.nan, 4.0, 8.0)),  # a NaN count is flattened away
    ],
)
def test_edge_histograms_agree_with_the_reference(hist: CorrectedHistogram) -> None:
    assert histogram_quantiles(QS, hist) == tuple(_reference(q, hist) for q in QS)


def _hist(*pairs: tuple[float, float]) -> Histogram:
    return Histogram(buckets=tuple(pairs), count=pairs[-1][1], sum=0.0)


def test_a_window_exports_its_percentiles_and_slo_tail_from_the_same_delta() -> None:
    h = SeriesHistory(retention=600)
    h.append(0.0, {}, {}, {derive.TTFT: _hist((0.1, 0), (0.5, 0), (1.0, 0), (INF, 0))})
    h.append(10.0, {}, {}, {derive.TTFT: _hist((0.1, 20), (0.5, 70), (1.0, 95), (INF, 100)),
                            derive.ITL: _hist((0.01, 0), (INF, 0))})
    values = derive.derive_window(h, "10s", 10.0, None, None, ("50", "90", "99.9"))
    assert values is not None
    delta = histogram_delta(*h.window(10.0), derive.TTFT)  # type: ignore[misc]
    assert delta is not None
    assert values.ttft == {p: _reference(float(p) / 100, delta) for p in ("50", "90", "99.9")}
    assert values.ttft["50"] == pytest.approx(0.1 + 0.4 * 30 / 50)
    assert values.slo_tail == {"ttft": _reference(derive.SLO_QUANTILE, delta)}  # ITL saw nothing: no tail
    assert values.itl == {}


@pytest.mark.parametrize("seed", range(20))
def test_counts_that_already_rise_are_kept_and_every_other_shape_is_flattened(seed: int) -> None:
    """The shortcut for counts that rise (returned as they are) gives what the flattening gives, on counts
    with dips, negatives, NaN and infinities (a NaN in sorted counts compares equal to itself in a list)."""
    rng, values = random.Random(seed), (0.0, 1.0, 2.0, 2.0, -1.0, math.nan, INF, -INF, 3.5, 1e300)
    for _ in range(5000):
        counts = tuple(rng.choice(values) for _ in range(rng.randint(0, 7)))
        expected = list(itertools.accumulate(counts, max, initial=0.0))[1:]
        assert repr(list(flattened(counts))) == repr(expected), counts
    rising = (0.0, 1.0, 1.0, 5.0)
    assert flattened(rising) is rising
