"""Sliding windows over the agent's own samples: reset-safe rates, time-weighted means, percentiles.

Each appended sample becomes a `Point` holding *reset-corrected* cumulative values, so a window's rate is
one subtraction between its first and last point, whatever the window's length; this keeps a 5 m
window at 10 Hz as cheap as a 10 s one. Counter resets (an engine restart) are handled the way
Prometheus' `rate()` handles them: a value below its predecessor counts from zero, so no rate is
ever negative. Times are the samples' real (monotonic) timestamps, not the nominal interval.
Histogram counts are kept as packed doubles and bucket bounds shared between points: at 10 Hz a 5 m
window holds 3,000 points per series, and boxed floats would triple their memory.

A counter that jumps faster than MAX_PLAUSIBLE_RATE per second (a corrupted page, a counter
that overflowed or was set by a bug) is re-baselined: the jump is not counted, the next increase
is. The bound is 1e9/s for every counter we window (tokens, steps, preemptions, histogram
observations): ~10x what a node of eight B200s (8 x 4.5 PFLOP/s dense FP8) could prefill of a
100M-parameter model (2e8 FLOP per token), so no real engine is ever clipped, while one absurd
value cannot turn every window it sits in into a nonsense throughput or MBU.

A counter that goes backwards COUNTER_REGRESS_LIMIT times within the history's retention (the
longest window plus slack) is not an engine restarting: restarts are rare, and each one resets every
counter at once. Taking each of those small backward steps as a restart counts the whole value again
(measured: MBU 1189, MFU 30). Such a counter is unreliable: it is left out of every point until a
whole retention passes without a backward step, so no window rates it (and no window can span the
bad stretch: by then every point from before it has aged out).

A histogram whose bucket layout changes LAYOUT_CHANGE_LIMIT times within the retention is treated the
same way: a real engine's bounds are fixed at start, and a layout that moves on every page (30,000 `le`
values shifted by 1e-9 per scrape, measured: 84 -> 277 MB in 150 s) would keep a new bounds tuple per
point while no window can rate it (histogram_delta needs one layout). It is left out of every point
until a whole retention passes without a change, so the points hold at most a few layouts. (The adapters
also drop a histogram of over expfmt.MAX_HISTOGRAM_BUCKETS buckets.)

Histogram counts are the bulk of a point (5 histograms of 255 buckets: 10 KB a point, 3.3 MB a series over
a 5 m retention at 1 Hz; with 25 such models the agent grew from 80 to 157 MB). Their
memory is bounded in total: the histories holding histograms share HISTOGRAM_BYTES_TOTAL (32 MiB), each
at most HISTOGRAM_BYTES_PER_SERIES (4 MiB), and a history past its share keeps fewer, evenly spaced
points (those older than the dense span first), never fewer than MIN_POINTS (8). With at most
expfmt.MAX_HISTOGRAM_BUCKETS (256) buckets a histogram, that floor is 16 KiB a histogram a series, so the
total stays within HISTOGRAM_BYTES_TOTAL for the default 128 series of up to 16 histograms. An ordinary
vLLM page (~800 bytes of counts a point) never reaches the share; a page of huge histograms gets
coarser window edges, not more memory.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import weakref
from dataclasses import dataclass
from array import array
from typing import Iterator, Mapping, Sequence

from rooflight.collectors.samples import Histogram

MAX_PLAUSIBLE_RATE = 1e9  # per second, for any counter (see the module docstring)
COUNTER_REGRESS_LIMIT = 3  # backward steps of one counter within the retention that make it unreliable
LAYOUT_CHANGE_LIMIT = 3  # bucket layout changes of one histogram within the retention that make it unstable
HISTOGRAM_BYTES_TOTAL = 32 * 2**20  # bucket counts held by every history together ...
HISTOGRAM_BYTES_PER_SERIES = 4 * 2**20  # ... and by one (see the module docstring)
MIN_POINTS = 8  # a history keeps at least these, whatever its histograms cost
# A window's two points may span at most this many times its length (SeriesHistory.window): a late sample
# (one slow scrape) stays within it, a downtime longer than the window does not. An engine whose every answer
# takes over twice the shortest window has no such window: absent, not a rate over another span.
WINDOW_REACH = 2.0


@dataclass(frozen=True, slots=True)
class CorrectedHistogram:
    bounds: tuple[float, ...]  # shared by every point while the layout holds
    counts: Sequence[float]  # reset-corrected cumulative bucket counts, one per bound


@dataclass(frozen=True, slots=True)
class Point:
    t: float
    counters: Mapping[str, float]  # reset-corrected cumulative counters
    integrals: Mapping[str, float]  # running integral of each gauge over time (value x seconds)
    gauges: Mapping[str, float]  # the gauges as sampled
    # Each histogram's bounds (the tuple shared while the layout holds) and reset-corrected cumulative counts
    # packed as doubles, in two dicts of values Python's cycle collector never walks (bytes, and a tuple of
    # floats once it has seen it), so neither dict is walked either: a CorrectedHistogram and its array per
    # histogram were two objects it walked on every collection (measured at 64 targets x 1 Hz: 130,000 of
    # the agent's 213,000 tracked objects, a full collection of 117 ms every ~10 s, 9.6% of its CPU).
    histogram_bounds: Mapping[str, tuple[float, ...]]
    histogram_counts: Mapping[str, bytes]

    def histogram(self, name: str) -> CorrectedHistogram | None:
        counts = self.histogram_counts.get(name)
        return None if counts is None else CorrectedHistogram(self.histogram_bounds[name], memoryview(counts).cast("d"))

    @property
    def histograms(self) -> dict[str, CorrectedHistogram]:
        """Every histogram the point holds, by name (for tests and diagnostics: windows read `histogram`)."""
        return {name: h for name in self.histogram_counts if (h := self.histogram(name)) is not None}


def correct_counter(
    prev_raw: float | None, prev_corrected: float, raw: float, dt: float | None = None
) -> float:
    """The next reset-corrected value: a drop means the source restarted and counted from zero.

    With `dt` (seconds since the previous value), an increase beyond MAX_PLAUSIBLE_RATE x dt is not
    counted: the counter is re-baselined at `raw`.
    """
    if prev_raw is None:
        return prev_corrected
    step = raw - prev_raw if raw >= prev_raw else raw
    if dt is not None and step > MAX_PLAUSIBLE_RATE * dt:
        return prev_corrected
    return prev_corrected + step


def _corrected_counts(
    prev_raw: Sequence[float], prev_corrected: Sequence[float], raw: Sequence[float], dt: float | None
) -> list[float]:
    """correct_counter over every bucket of a histogram at once (a page holds a few hundred buckets)."""
    limit = math.inf if dt is None else MAX_PLAUSIBLE_RATE * dt
    return [c if (step := n - p if n >= p else n) > limit else c + step
            for p, c, n in zip(prev_raw, prev_corrected, raw)]


class SeriesHistory:
    """The bounded history of one engine series (one target, model and rank).

    Owned by one sampler task; readers get immutable Points. Points older than `retention`
    seconds before the newest are dropped, so memory stays bounded however long the agent runs.
    """

    def __init__(self, retention: float, *, dense: float | None = None, coarse_step: float = 1.0) -> None:
        """Points younger than `dense` seconds are all kept; older ones one per whole `coarse_step`.

        A long window needs no sub-second resolution (at 1 s its start moves by under 1% of a minute),
        so sampling at 10 Hz costs the short window ten times the points, not every window.
        """
        self.retention = retention
        self.dense = retention if dense is None else dense
        self.coarse_step = coarse_step
        self._points: list[Point] = []
        self._times: list[float] = []
        self._settled = 0  # points before this index are already thinned to coarse_step
        self._raw_counters: dict[str, float] = {}
        self._raw_histograms: dict[str, tuple[tuple[float, ...], list[float]]] = {}  # bounds, raw counts
        self._regressions: dict[str, list[float]] = {}  # the last COUNTER_REGRESS_LIMIT backward steps
        self._unreliable_until: dict[str, float] = {}
        self._layout_changes: dict[str, list[float]] = {}  # the last LAYOUT_CHANGE_LIMIT layout changes
        self._unstable_until: dict[str, float] = {}
        # Counters that went backwards in the last append while unreliable (the loop reports them).
        self.regressed_unreliable: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self._points)

    def points(self) -> tuple[Point, ...]:
        """The points held, oldest first (what memory the history costs, for tests and diagnostics)."""
        return tuple(self._points)

    @property
    def latest(self) -> Point | None:
        return self._points[-1] if self._points else None

    def append(
        self,
        t: float,
        counters: Mapping[str, float | None],
        gauges: Mapping[str, float | None],
        histograms: Mapping[str, Histogram | None],
    ) -> Point:
        prev = self.latest
        self.regressed_unreliable = ()
        if prev is not None and t <= prev.t:
            return prev  # a sample that is not newer adds nothing (and would divide by zero)
        point = Point(
            t,
            self._next_counters(prev, counters, t, t - prev.t if prev else None),
            _next_integrals(prev, t),
            {k: v for k, v in gauges.items() if v is not None and math.isfinite(v)},
            *self._next_histograms(prev, histograms, t, t - prev.t if prev else None),
        )
        self._points.append(point)
        self._times.append(t)
        self._prune(t)
        self._thin(t)
        self._fit_histograms(point)
        return point

    def _fit_histograms(self, point: Point) -> None:
        """Keep the points' histogram counts within this history's share of HISTOGRAM_BYTES_TOTAL."""
        per_point = sum(len(counts) for counts in point.histogram_counts.values())
        if not per_point:
            return
        _HISTOGRAM_HOLDERS.add(self)
        share = min(HISTOGRAM_BYTES_PER_SERIES, HISTOGRAM_BYTES_TOTAL // max(1, len(_HISTOGRAM_HOLDERS)))
        keep = max(MIN_POINTS, share // per_point)
        if len(self._points) <= keep:
            return
        target = max(2, keep * 3 // 4)  # room for a few appends before thinning again
        young = bisect.bisect_left(self._times, point.t - self.dense)
        old_room = target - (len(self._points) - young)
        if young >= 2 and old_room >= MIN_POINTS // 2:
            self._space(0, young, old_room)  # the dense span (the short window's edges) stays whole
        else:
            self._space(0, len(self._points), target)
        self._settled = 0

    def _space(self, start: int, end: int, count: int) -> None:
        """Thin points[start:end] to about `count`, evenly in time, keeping its first and last."""
        span = self._times[end - 1] - self._times[start]
        step = span / max(1, count - 1)
        kept = [start]
        for i in range(start + 1, end - 1):
            if self._times[i] - self._times[kept[-1]] >= step:
                kept.append(i)
        if end - 1 > start:
            kept.append(end - 1)
        self._points[start:end] = [self._points[i] for i in kept]
        self._times[start:end] = [self._times[i] for i in kept]

    def window(self, seconds: float, *, reach: float | None = WINDOW_REACH) -> tuple[Point, Point] | None:
        """First and last point inside the last `seconds` (the point before the last, where the last is the
        only one inside); None until the points span half of it, and None where they span more than `reach`
        times it (None: any span).

        The bound is for rates and means: after a downtime longer than a window (an engine restarting, a
        scrape failing for a minute), the first sample back pairs with the last one before it, and a 10 s
        window would rate half a minute of nothing under its name. The ITL tail asks for the pairing at any
        span (policy.itl_tail): a stall that delays the next scrape must still be seen."""
        if len(self._points) < 2:
            return None
        last = self._points[-1]
        i = bisect.bisect_left(self._times, last.t - seconds)
        first = self._points[min(i, len(self._points) - 2)]
        span = last.t - first.t
        if span < seconds / 2 or (reach is not None and span > reach * seconds):
            return None
        return first, last

    def last_interval(self) -> tuple[Point, Point] | None:
        """The last two points (the interval the latest sample added); None before the second."""
        return (self._points[-2], self._points[-1]) if len(self._points) >= 2 else None

    def points_since(self, first: Point) -> Iterator[Point]:
        i = bisect.bisect_left(self._times, first.t)
        return iter(self._points[i:])

    def points_after(self, point: Point) -> list[Point]:
        """The points newer than `point`, oldest first."""
        return self._points[bisect.bisect_right(self._times, point.t):]

    def holds(self, point: Point) -> bool:
        """Whether `point` is still one of the history's (not pruned nor thinned away)."""
        i = bisect.bisect_left(self._times, point.t)
        return i < len(self._points) and self._points[i] is point

    def unreliable(self, name: str) -> bool:
        """Whether this counter is left out of the points for going backwards repeatedly."""
        latest = self.latest
        return latest is not None and latest.t < self._unreliable_until.get(name, -math.inf)

    def _next_counters(
        self, prev: Point | None, counters: Mapping[str, float | None], t: float, dt: float | None
    ) -> dict[str, float]:
        out = dict(prev.counters) if prev else {}
        flagged = []
        for name, raw in counters.items():
            if raw is None or not math.isfinite(raw) or raw < 0:
                continue
            before = self._raw_counters.get(name)
            self._raw_counters[name] = raw
            if before is not None and raw < before and self._went_back(name, t):
                flagged.append(name)
            if t < self._unreliable_until.get(name, -math.inf):
                out.pop(name, None)
                continue
            out[name] = correct_counter(before, out.get(name, 0.0), raw, dt)
        self.regressed_unreliable = tuple(flagged)
        return out

    def _went_back(self, name: str, t: float) -> bool:
        """Note a backward step of a counter at `t`; True when it makes (or keeps) the counter unreliable."""
        times = [x for x in self._regressions.get(name, ()) if x > t - self.retention]
        times.append(t)
        self._regressions[name] = times[-COUNTER_REGRESS_LIMIT:]
        if len(times) >= COUNTER_REGRESS_LIMIT or t < self._unreliable_until.get(name, -math.inf):
            self._unreliable_until[name] = t + self.retention
            return True
        return False

    def unstable(self, name: str) -> bool:
        """Whether this histogram is left out of the points for changing its bucket layout repeatedly."""
        latest = self.latest
        return latest is not None and latest.t < self._unstable_until.get(name, -math.inf)

    def _next_histograms(
        self, prev: Point | None, histograms: Mapping[str, Histogram | None], t: float, dt: float | None
    ) -> tuple[dict[str, tuple[float, ...]], dict[str, bytes]]:
        """The point's histogram bounds and counts (Point.histogram_bounds, Point.histogram_counts)."""
        out_bounds = dict(prev.histogram_bounds) if prev else {}
        out_counts = dict(prev.histogram_counts) if prev else {}
        for name, hist in histograms.items():
            if hist is None:
                continue
            bounds = tuple([b for b, _ in hist.buckets])
            raw = [c for _, c in hist.buckets]
            raw_prev = self._raw_histograms.get(name)
            self._raw_histograms[name] = (bounds, raw)
            if raw_prev is not None and raw_prev[0] != bounds:
                self._layout_moved(name, t)
            if t < self._unstable_until.get(name, -math.inf):
                out_counts.pop(name, None)  # no window can rate it; each new layout would be held per point
                out_bounds.pop(name, None)
                continue
            before = out_counts.get(name)
            if raw_prev is None or before is None or out_bounds[name] != bounds:
                counts = bytes(8 * len(bounds))  # new layout: deltas start here
                out_bounds[name] = bounds
            else:
                counts = array("d", _corrected_counts(raw_prev[1], memoryview(before).cast("d"), raw, dt)).tobytes()
            out_counts[name] = counts
        return out_bounds, out_counts

    def _layout_moved(self, name: str, t: float) -> None:
        """Note a bucket layout change of a histogram at `t`; enough within the retention make it unstable."""
        times = [x for x in self._layout_changes.get(name, ()) if x > t - self.retention]
        times.append(t)
        self._layout_changes[name] = times[-LAYOUT_CHANGE_LIMIT:]
        if len(times) >= LAYOUT_CHANGE_LIMIT or t < self._unstable_until.get(name, -math.inf):
            self._unstable_until[name] = t + self.retention

    def _thin(self, now: float) -> None:
        """Thin the points that just left the dense span, keeping one per coarse_step."""
        aged = bisect.bisect_left(self._times, now - self.dense)
        i = max(self._settled, 1)
        step = self.coarse_step
        while i < aged:
            if self._times[i] // step == self._times[i - 1] // step:  # same whole step: one is enough
                del self._points[i]
                del self._times[i]
                aged -= 1
            else:
                i += 1
        self._settled = max(i, 1) if self._points else 0

    def _prune(self, now: float) -> None:
        # Every append: moving a few thousand pointers costs microseconds, and memory stays at the
        # retention, not twice it.
        cut = bisect.bisect_left(self._times, now - self.retention)
        if cut > 0:
            del self._points[:cut]
            del self._times[:cut]
            self._settled = max(0, self._settled - cut)


_HISTOGRAM_HOLDERS: "weakref.WeakSet[SeriesHistory]" = weakref.WeakSet()  # histories holding histograms


def _next_integrals(prev: Point | None, t: float) -> dict[str, float]:
    """Left Riemann sum: each gauge holds its sampled value until the next sample."""
    if prev is None:
        return {}
    out = dict(prev.integrals)
    dt = t - prev.t
    for name, value in prev.gauges.items():
        out[name] = out.get(name, 0.0) + value * dt
    return out


def rate(first: Point, last: Point, name: str) -> float | None:
    """Per-second increase of a counter between two points, reset-safe."""
    if name not in last.counters or name not in first.counters or last.t <= first.t:
        return None
    return (last.counters[name] - first.counters[name]) / (last.t - first.t)


def increase(first: Point, last: Point, name: str) -> float | None:
    if name not in last.counters or name not in first.counters:
        return None
    return last.counters[name] - first.counters[name]


def mean(first: Point, last: Point, name: str) -> float | None:
    """Time-weighted mean of a gauge over [first, last]."""
    if last.t <= first.t or name not in last.integrals:
        return None
    return (last.integrals[name] - first.integrals.get(name, 0.0)) / (last.t - first.t)


def histogram_delta(first: Point, last: Point, name: str) -> CorrectedHistogram | None:
    a, b = first.histogram_counts.get(name), last.histogram_counts.get(name)
    if a is None or b is None:
        return None
    bounds = last.histogram_bounds[name]
    if first.histogram_bounds[name] != bounds:
        return None
    return CorrectedHistogram(bounds, tuple(map(operator.sub, memoryview(b).cast("d"), memoryview(a).cast("d"))))


def histogram_quantile(q: float, hist: CorrectedHistogram) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated as Prometheus' histogram_quantile does.

    Linear interpolation inside the bucket that holds the rank, the first bucket starting at 0, and
    the upper bound of the last finite bucket when the rank falls in +Inf. None where Prometheus
    would return NaN (no observations, or no +Inf bucket).
    """
    return histogram_quantiles((q,), hist)[0]


def histogram_quantiles(qs: Sequence[float], hist: CorrectedHistogram) -> tuple[float | None, ...]:
    """histogram_quantile of each of `qs`, from one cumulative pass over the counts and a bisection per
    quantile: a window exports several percentiles of each of its histograms on every sample."""
    bounds = hist.bounds
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return (None,) * len(qs)
    counts = _monotonic(hist.counts)
    total = counts[-1]
    if total <= 0:
        return (None,) * len(qs)
    return tuple(_quantile_in(q, bounds, counts, total) if 0.0 <= q <= 1.0 else None for q in qs)


def _quantile_in(q: float, bounds: Sequence[float], counts: Sequence[float], total: float) -> float:
    """The q-quantile (0 <= q <= 1) of non-decreasing cumulative `counts` over `bounds`, the last +Inf."""
    rank = q * total
    b = bisect.bisect_left(counts, rank)  # the first bucket whose cumulative count reaches the rank
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


def _monotonic(counts: Sequence[float]) -> Sequence[float]:
    """Cumulative counts can dip by float error or a scrape race; Prometheus flattens such dips.

    Counts that already rise from zero or more, nearly always, are returned as they are: the check is
    three calls in C where the flattening is a Python-level max() per bucket, on every histogram of every
    window of every sample."""
    if counts and counts[0] >= 0.0 and sorted(counts) == list(counts) and not math.isnan(sum(counts)):
        return counts
    out = list(itertools.accumulate(counts, max, initial=0.0))  # max keeps the running top over a NaN
    del out[0]
    return out


def worst_bound(hist: CorrectedHistogram) -> float | None:
    """The upper bound of the highest bucket that gained observations: the worst value, to bucket resolution.

    An observation beyond the last finite bound reports that bound (the worst is at least that much).
    """
    counts = _monotonic(hist.counts)
    below = 0.0
    worst = None
    for bound, count in zip(hist.bounds, counts):
        if count > below:
            worst = bound
        below = count
    if worst is not None and math.isinf(worst):
        finite = [b for b in hist.bounds if not math.isinf(b)]
        return finite[-1] if finite else None
    return worst
