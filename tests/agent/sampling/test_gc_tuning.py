"""What Python's cycle collector walks in a long-running agent (agent/sampling/gc_tuning.py).

At 64 targets x 1 Hz the collector took 14% of the agent's CPU: every history point held a dozen objects
it walks on each full collection (130,000 of 213,000), and a page's parse set off young collections
mid-parse. These hold the two causes, each of which fails on the code before: a point's histograms are
nothing the collector walks, and `rooflight run` freezes what start-up made and raises the young threshold
before it samples. The collector's settings each test changes are put back by tests/conftest.py.
"""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest

from rooflight.agent import cli
from rooflight.agent.sampling import gc_tuning
from rooflight.agent.signals.windows import SeriesHistory, histogram_delta
from rooflight.collectors.samples import Histogram

BOUNDS = (0.01, 0.1, 1.0, 10.0, math.inf)
HISTOGRAMS = 6  # a vLLM page's: TTFT, ITL, step tokens, prompt and output length, queue time


def _hist(n: float) -> Histogram:
    return Histogram(buckets=tuple((b, n * (i + 1)) for i, b in enumerate(BOUNDS)), count=n * len(BOUNDS), sum=n)


def _dicts_stay_tracked() -> bool:
    """Whether this Python keeps a dict of floats in the collector's lists after a full collection."""
    d = {"x": 1.0}
    d["y"] = [2.0]  # tracked now, for a tracked value
    del d["y"]
    gc.collect()
    return gc.is_tracked(d)


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize("young", [700, 50], ids=["default", "collections-mid-build"])
def test_a_points_histograms_are_nothing_the_collector_walks(young: int) -> None:
    gc.set_threshold(young, 10, 10)
    before = _tracked()
    h = SeriesHistory(retention=1_000)
    for t in range(300):
        h.append(float(t), {"tokens": 10.0 * t}, {"running": 4.0}, {f"h{k}": _hist(t) for k in range(HISTOGRAMS)})
    walked = _tracked() - before
    # The points themselves (one each) and the history's own few: before, 13 a point (each histogram an
    # object and an array, and the dict holding them) — 3,900 here. A Python that no longer untracks dicts
    # of untracked values (CPython 3.14, gh-127010) walks a point's five dicts too: 6 a point, 17 before.
    per_point = 1 + (5 if _dicts_stay_tracked() else 0)
    assert walked <= 300 * per_point + 50, walked
    delta = histogram_delta(*h.window(100.0), "h3")  # and the windows still read them
    assert delta is not None and delta.bounds == BOUNDS
    assert list(delta.counts) == pytest.approx([100.0 * (i + 1) for i in range(len(BOUNDS))])


def test_tuning_freezes_start_up_and_raises_only_the_young_threshold() -> None:
    gc.set_threshold(700, 10, 10)  # Python 3.11's defaults
    gc.unfreeze()
    gc_tuning.tune_for_sampling()
    assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 1_000  # this test process's modules, classes and functions
    assert gc.get_count()[0] < 100  # start-up's garbage went first


def test_a_higher_threshold_is_kept() -> None:
    gc.set_threshold(50_000, 5, 7)
    gc_tuning.tune_for_sampling()
    assert gc.get_threshold() == (50_000, 5, 7)


def test_automatic_collection_switched_off_stays_off() -> None:
    gc.set_threshold(0, 10, 10)
    gc_tuning.tune_for_sampling()
    assert gc.get_threshold() == (0, 10, 10)


def test_run_tunes_the_collector_before_it_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(gc_tuning, "tune_for_sampling", lambda: order.append("tuned"))

    async def serve(agent: Any, *args: Any, **kwargs: Any) -> None:
        order.append("served")

    from rooflight.agent.serve import server

    monkeypatch.setattr(server, "serve", serve)
    args = cli.build_parser().parse_args(["run", "--engine-url", "http://127.0.0.1:9", "--model", "llama-3-8b"])
    assert cli.cmd_run(args) == 0
    assert order == ["tuned", "served"]
