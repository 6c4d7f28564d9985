"""Histogram history has a total memory bound whatever the page holds.

A legal page of 5 histograms of 255 buckets per model costs 10 KB a point; over a 5 m retention that was
3.3 MB a series, unbounded in the number of series. The histories now share a budget: each keeps fewer,
evenly spaced points past its share, the short window's dense span first kept whole, and windows still
rate and take percentiles.
"""

from __future__ import annotations

import gc
import math

import pytest

from rooflight.agent.signals import windows
from rooflight.agent.signals.windows import SeriesHistory, histogram_delta
from rooflight.collectors.samples import Histogram

BOUNDS = [0.001 * 1.03 ** i for i in range(254)] + [math.inf]  # 255 buckets


def _hist(n: float) -> Histogram:
    counts = [n * (i + 1) / len(BOUNDS) for i in range(len(BOUNDS))]
    return Histogram(buckets=tuple(zip(BOUNDS, counts)), count=counts[-1], sum=0.0)


def _fill(h: SeriesHistory, seconds: int) -> None:
    for t in range(seconds):
        h.append(float(t), {"tokens": 100.0 * t}, {"running": 4.0},
                 {f"h{k}": _hist(10.0 * t) for k in range(5)})


def test_one_series_of_big_histograms_keeps_within_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "HISTOGRAM_BYTES_PER_SERIES", 256 * 1024, raising=False)
    monkeypatch.setattr(windows, "HISTOGRAM_BYTES_TOTAL", 2**40, raising=False)  # other tests' histories aside
    h = SeriesHistory(retention=330, dense=15)
    _fill(h, 660)
    held = sum(8 * len(c.counts) for p in h.points() for c in p.histograms.values())
    assert held <= 256 * 1024, held  # before: 331 points x 10 KB = 3.3 MB
    short = h.window(10.0)
    assert short is not None and short[1].t - short[0].t == pytest.approx(10.0)  # the dense span is whole
    long = h.window(300.0)
    assert long is not None and 150 <= long[1].t - long[0].t <= 330
    delta = histogram_delta(*long, "h0")
    assert delta is not None and delta.counts[-1] == pytest.approx(10.0 * (long[1].t - long[0].t))


def test_many_series_share_the_total(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "HISTOGRAM_BYTES_TOTAL", 8 * 2**20, raising=False)
    gc.collect()
    histories = [SeriesHistory(retention=330, dense=15) for _ in range(40)]
    for t in range(400):
        for h in histories:
            h.append(float(t), {}, {}, {f"h{k}": _hist(10.0 * t) for k in range(5)})
    held = sum(8 * len(c.counts) for h in histories for p in h.points() for c in p.histograms.values())
    assert held <= 8 * 2**20, held / 2**20  # before: 40 x 3.3 MB = 132 MB
    assert all(h.window(300.0) is not None for h in histories)
